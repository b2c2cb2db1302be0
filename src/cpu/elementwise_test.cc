// cpu::rmsnorm / silu_mul / add against the scalar reference on every compiled target, odd
// sizes (vector tails), aliasing, and batch invariance bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "cpu/thread_pool.h"
#include "ops/reference.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::kU;
using ops::testing::random_floats;

TEST(CpuRmsNorm, OddSizesAgainstReferenceAndBatchInvariant) {
  testing::for_each_target([] {
    for (int64_t D : {1, 3, 15, 16, 17, 100, 768}) {
      const int64_t T = 5;
      const auto x = random_floats(size_t(T * D), uint32_t(D), -3.f, 3.f);
      const auto w = random_floats(size_t(D), uint32_t(D) + 1, 0.5f, 1.5f);
      std::vector<float> y(x.size()), ref(x.size());
      rmsnorm(x.data(), T, D, w.data(), 1e-5f, y.data());
      ops::ref::rmsnorm(x.data(), T, D, w.data(), 1e-5f, ref.data());
      for (size_t i = 0; i < y.size(); ++i) {
        // The sum of squares (D terms, any order) is within gamma_D relative of exact, so
        // 1/sqrt(mean + eps) within ~(D/2 + 3) u; then two multiplies. Each kernel is within
        // (D/2 + 6) u |y| of exact: 2x between them, 2x margin.
        ASSERT_NEAR(y[i], ref[i], 4 * (double(D) / 2 + 6) * kU * std::fabs(ref[i])) << "D=" << D << " i=" << i;
      }
      for (int64_t t = 0; t < T; ++t) {  // a row alone == that row in the batch
        std::vector<float> one(static_cast<size_t>(D));
        rmsnorm(x.data() + t * D, 1, D, w.data(), 1e-5f, one.data());
        for (int64_t i = 0; i < D; ++i) ASSERT_EQ(one[size_t(i)], y[size_t(t * D + i)]);
      }
      auto z = x;  // y == x
      rmsnorm(z.data(), T, D, w.data(), 1e-5f, z.data());
      ASSERT_EQ(z, y);
    }
  });
}

TEST(CpuSiluMul, AgainstReferenceAliasingAndBatchInvariant) {
  testing::for_each_target([] {
    for (int64_t F : {1, 7, 16, 33, 1001}) {
      const int64_t T = 3;
      // Saturated both sides, and far past the e^88 clamp on the negative one.
      auto g = random_floats(size_t(T * F), uint32_t(F), -20.f, 20.f);
      g[0] = -150.f;
      g[size_t(T * F - 1)] = 95.f;
      const auto u = random_floats(size_t(T * F), uint32_t(F) + 1, -3.f, 3.f);
      std::vector<float> out(g.size()), ref(g.size());
      silu_mul(g.data(), u.data(), T * F, out.data());
      ops::ref::silu_mul(g.data(), u.data(), T * F, ref.data());
      for (size_t i = 0; i < out.size(); ++i) {
        // exp (libm or Highway's, <= ~1 ulp), add, divide, multiply without cancellation:
        // each a few u relative (8u, as ops' own test); 2x between the two. Results below
        // 1e-30 in magnitude (g < -70) only need to be tiny: the clamp is documented there.
        ASSERT_NEAR(out[i], ref[i], 16 * kU * std::fabs(ref[i]) + 1e-30) << "F=" << F << " i=" << i;
      }
      for (int64_t t = 0; t < T; ++t) {  // a [F] row alone == that row of the [T * F] call
        std::vector<float> one(static_cast<size_t>(F));
        silu_mul(g.data() + t * F, u.data() + t * F, F, one.data());
        for (int64_t i = 0; i < F; ++i) ASSERT_EQ(one[size_t(i)], out[size_t(t * F + i)]);
      }
      auto a = g, b = u;
      silu_mul(a.data(), u.data(), T * F, a.data());
      silu_mul(g.data(), b.data(), T * F, b.data());
      ASSERT_EQ(a, out);
      ASSERT_EQ(b, out);
    }
  });
}

TEST(CpuAdd, ExactAndAliases) {
  testing::for_each_target([] {
    for (int64_t n : {1, 5, 16, 17, 1001}) {
      const auto a = random_floats(size_t(n), 1);
      const auto b = random_floats(size_t(n), 2);
      std::vector<float> y(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
      add(a.data(), b.data(), n, y.data());
      ops::ref::add(a.data(), b.data(), n, ref.data());
      ASSERT_EQ(y, ref);  // one correctly rounded add either way
      auto a2 = a;
      add(a2.data(), b.data(), n, a2.data());
      ASSERT_EQ(a2, ref);
    }
  });
}

// Calls big enough to be split across the pool (a prefill piece: 512 x 2051, odd so that
// chunks and rows end mid-vector) give the bits of one thread, and of rows / halves alone.
TEST(CpuElementwise, SplitAcrossThreadsBitIdentical) {
  const int before = num_threads();
  const int64_t T = 512, D = 2051, n = T * D;
  const auto x = random_floats(size_t(n), 41, -20.f, 20.f);
  const auto u = random_floats(size_t(n), 42, -3.f, 3.f);
  const auto w = random_floats(size_t(D), 43, 0.5f, 1.5f);
  const size_t sn = static_cast<size_t>(n);
  std::vector<float> norm1(sn), silu1(sn), add1(sn);
  set_num_threads(1);
  rmsnorm(x.data(), T, D, w.data(), 1e-5f, norm1.data());
  silu_mul(x.data(), u.data(), n, silu1.data());
  add(x.data(), u.data(), n, add1.data());
  for (int th : {2, 3}) {
    set_num_threads(th);
    std::vector<float> norm(sn), silu(sn), sum(sn);
    rmsnorm(x.data(), T, D, w.data(), 1e-5f, norm.data());
    silu_mul(x.data(), u.data(), n, silu.data());
    add(x.data(), u.data(), n, sum.data());
    EXPECT_EQ(norm, norm1) << th << " threads";
    EXPECT_EQ(silu, silu1) << th << " threads";
    EXPECT_EQ(sum, add1) << th << " threads";
  }
  set_num_threads(before);
  // Against calls too small to split: rows alone (a row of silu / add starting mid-chunk),
  // and the exact reference add.
  for (int64_t t : {0, 77, 511}) {
    std::vector<float> nr(static_cast<size_t>(D)), sr(static_cast<size_t>(D));
    rmsnorm(x.data() + t * D, 1, D, w.data(), 1e-5f, nr.data());
    silu_mul(x.data() + t * D, u.data() + t * D, D, sr.data());
    for (int64_t i = 0; i < D; ++i) {
      ASSERT_EQ(nr[size_t(i)], norm1[size_t(t * D + i)]) << "t=" << t << " i=" << i;
      ASSERT_EQ(sr[size_t(i)], silu1[size_t(t * D + i)]) << "t=" << t << " i=" << i;
    }
  }
  std::vector<float> ref(sn);
  ops::ref::add(x.data(), u.data(), n, ref.data());
  EXPECT_EQ(add1, ref);
}

}  // namespace
}  // namespace tinyloop::cpu

namespace tinyloop::cpu {
namespace {
TEST(CpuTargets, CompiledAndChosen) {
  // Prints what this build holds; the dispatcher must pick one of them.
  std::string names;
  for (int64_t t : compiled_targets()) names += std::string(hwy::TargetName(t)) + " ";
  std::printf("compiled targets: %s; chosen: %s\n", names.c_str(), simd_target_name().c_str());
  EXPECT_NE(names.find(simd_target_name()), std::string::npos);
}
}  // namespace
}  // namespace tinyloop::cpu
