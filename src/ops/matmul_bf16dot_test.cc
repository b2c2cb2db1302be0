// The reduced-precision matmul's scalar reference (ops/matmul_bf16dot.h): its rounding of x
// and of the weights, the packed layout, and the sums against a double oracle over the
// rounded values (within float summation error) and against the spec's loop written out
// literally, one element at a time (bit-exact: the reference's panel-wide loop must not
// reorder anything).
#include "ops/matmul_bf16dot.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "ops/reference.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::random_floats;
using testing::store_weight;
using testing::StoredWeight;

float bf(uint16_t h) { return bf16_to_f32(h); }

TEST(Bf16DotRounding, NearestEvenSubnormalsFlushedNanKept) {
  EXPECT_EQ(round_bf16_ftz(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even one (1); 1 + 3 * 2^-8 is
  // halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(round_bf16_ftz(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(round_bf16_ftz(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(round_bf16_ftz(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above halfway
  EXPECT_EQ(round_bf16_ftz(-2.5f), 0xc020);
  EXPECT_EQ(round_bf16_ftz(std::numeric_limits<float>::max()), 0x7f80);  // overflow -> inf
  EXPECT_EQ(round_bf16_ftz(-INFINITY), 0xff80);
  EXPECT_EQ(round_bf16_ftz(0x1p-126f), 0x0080);  // smallest normal kept
  EXPECT_EQ(round_bf16_ftz(0x1p-127f), 0x0000);  // subnormal -> +0
  EXPECT_EQ(round_bf16_ftz(-1e-40f), 0x8000);  // -> -0
  EXPECT_EQ(round_bf16_ftz(-0.0f), 0x8000);
  const uint16_t q = round_bf16_ftz(std::bit_cast<float>(0x7f800001u));  // signalling nan
  EXPECT_TRUE(std::isnan(bf(q)));
  EXPECT_EQ(q & 0x0040, 0x0040);  // quiet
  // Normal values: the same as the plain converter of dtype.h.
  for (float v : random_floats(10000, 7, -1e3f, 1e3f)) ASSERT_EQ(round_bf16_ftz(v), f32_to_bf16(v)) << v;
}

TEST(Bf16DotRounding, RowsPairedEvenLowOddHigh) {
  const std::vector<float> x = {1.f, 2.f, 3.f, -1.f, 0.5f, 7.f, 1e-40f};  // [1, 7]
  std::vector<uint32_t> xp(4, 0xdeadbeefu);
  round_rows_bf16dot(x.data(), 1, 7, xp.data());
  EXPECT_EQ(xp[0], 0x3f80u | 0x4000u << 16);
  EXPECT_EQ(xp[1], 0x4040u | 0xbf80u << 16);
  EXPECT_EQ(xp[2], 0x3f00u | 0x40e0u << 16);
  EXPECT_EQ(xp[3], 0u);  // odd K: subnormal flushed, high half zero
}

TEST(Bf16DotPack, LayoutPaddingAndDtypes) {
  const int64_t N = 67, K = 5, K2 = 3;
  const auto src = random_floats(size_t(N * K), 11);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const StoredWeight w = store_weight(src, N, K, dt);
    ASSERT_EQ(bf16dot_packed_words(N, K), 128 * K2);
    std::vector<uint32_t> p(size_t(bf16dot_packed_words(N, K)), 0xdeadbeefu);
    pack_bf16dot(w.view(), p.data());
    for (int64_t n = 0; n < 128; ++n)
      for (int64_t i = 0; i < K2; ++i) {
        const uint32_t got = p[size_t((n / 64 * K2 + i) * 64 + n % 64)];
        uint32_t want = 0;
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t k = 2 * i + h;
          if (n < N && k < K) want |= uint32_t(round_bf16_ftz(float(w.decoded[size_t(n * K + k)]))) << (16 * h);
        }
        ASSERT_EQ(got, want) << "n=" << n << " i=" << i;
      }
  }
  // BF16 weights are copied bit for bit.
  const StoredWeight b = store_weight(src, N, K, DType::BF16);
  std::vector<uint32_t> p(size_t(bf16dot_packed_words(N, K)));
  pack_bf16dot(b.view(), p.data());
  EXPECT_EQ(uint16_t(p[0]), b.u16[0]);
  EXPECT_EQ(uint16_t(p[0] >> 16), b.u16[1]);
}

TEST(Bf16DotPack, RejectsQuantizedAndEmpty) {
  std::vector<int8_t> q(64, 1);
  std::vector<float> s(2, 1.f);
  WeightView w;
  w.dtype = DType::I8;
  w.data = q.data();
  w.rows = 2;
  w.cols = 32;
  w.group = 32;
  w.scales = s.data();
  std::vector<uint32_t> out(size_t(bf16dot_packed_words(2, 32)));
  EXPECT_THROW(pack_bf16dot(w, out.data()), std::invalid_argument);
  WeightView e;
  EXPECT_THROW(pack_bf16dot(e, out.data()), std::invalid_argument);
  std::vector<float> x(32), y(2);
  EXPECT_THROW(ref::matmul_bf16dot(x.data(), 1, w, nullptr, y.data()), std::invalid_argument);
}

// The packed copy of a random weight and its view.
struct Case {
  std::vector<float> x;  // [T, K]
  StoredWeight w;  // [N, K]
  std::vector<uint32_t> packed;  // [ceil(N / 64), K2, 64]
  std::vector<float> b;  // [N]
  int64_t T, K, N;
  WeightView view() const {
    WeightView v = w.view();
    v.bf16dot = packed.data();
    return v;
  }
};

Case make_case(int64_t T, int64_t K, int64_t N, DType dt, uint32_t seed) {
  Case c{random_floats(size_t(T * K), seed),
         store_weight(random_floats(size_t(N * K), seed + 1), N, K, dt),
         {},
         random_floats(size_t(N), seed + 2),
         T,
         K,
         N};
  c.packed.resize(size_t(bf16dot_packed_words(N, K)));
  pack_bf16dot(c.w.view(), c.packed.data());
  return c;
}

// The spec, literally: one element, pairs in order, the odd column first.
float spec_element(const Case& c, int64_t t, int64_t n, const float* bias) {
  auto xb = [&](int64_t k) { return k < c.K ? bf(round_bf16_ftz(c.x[size_t(t * c.K + k)])) : 0.f; };
  auto wb = [&](int64_t k) { return k < c.K ? bf(round_bf16_ftz(float(c.w.decoded[size_t(n * c.K + k)]))) : 0.f; };
  float acc = 0.f;
  for (int64_t i = 0; i < (c.K + 1) / 2; ++i) {
    acc = acc + xb(2 * i + 1) * wb(2 * i + 1);
    acc = acc + xb(2 * i) * wb(2 * i);
  }
  return bias ? acc + bias[n] : acc;
}

TEST(Bf16DotReference, MatchesTheSpecBitForBitAndTheDoubleOracle) {
  uint32_t seed = 1;
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t T : {1, 2, 5})
      for (int64_t K : {1, 2, 3, 31, 32, 33, 130, 769})
        for (int64_t N : {1, 5, 64, 67, 130})
          for (bool bias : {false, true}) {
            const Case c = make_case(T, K, N, dt, seed += 3);
            const float* b = bias ? c.b.data() : nullptr;
            std::vector<float> y(size_t(T * N), NAN);
            ref::matmul_bf16dot(c.x.data(), T, c.view(), b, y.data());
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = 0; n < N; ++n) {
                const float got = y[size_t(t * N + n)];
                ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(spec_element(c, t, n, b)))
                    << dtype_name(dt) << " T=" << T << " K=" << K << " N=" << N << " t=" << t << " n=" << n;
                // Exact products of the rounded values, summed in double: the float chain of
                // K + 1 additions is within gamma_{K+1} * sum |terms| of it.
                double s = bias ? double(b[n]) : 0.0, mag = bias ? std::fabs(double(b[n])) : 0.0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = double(bf(round_bf16_ftz(c.x[size_t(t * K + k)]))) *
                                   double(bf(round_bf16_ftz(float(c.w.decoded[size_t(n * K + k)]))));
                  s += p;
                  mag += std::fabs(p);
                }
                ASSERT_NEAR(got, s, 1.01 * double(K + 1) * kU * mag) << "t=" << t << " n=" << n;
              }
          }
}

// Rounding x and W to bf16 costs about 2^-9 relative per product: against the float32
// matmul the result stays within a few 2^-9 of sum |x w| (a loose check that the rounding is
// to nearest and nothing else is lost).
TEST(Bf16DotReference, CloseToTheFloatMatmul) {
  const Case c = make_case(3, 768, 70, DType::F32, 99);
  std::vector<float> y(3 * 70), y32(3 * 70);
  ref::matmul_bf16dot(c.x.data(), 3, c.view(), c.b.data(), y.data());
  ref::matmul(c.x.data(), 3, c.w.view(), c.b.data(), y32.data());
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t n = 0; n < 70; ++n) {
      double mag = std::fabs(c.b[size_t(n)]);
      for (int64_t k = 0; k < 768; ++k)
        mag += std::fabs(double(c.x[size_t(t * 768 + k)]) * c.w.decoded[size_t(n * 768 + k)]);
      ASSERT_NEAR(y[size_t(t * 70 + n)], y32[size_t(t * 70 + n)], 2.0 * 0x1p-8 * mag);
    }
}

}  // namespace
}  // namespace tinyloop::ops
