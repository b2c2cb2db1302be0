// cpu::matmul_bf16dot (AVX512-BF16 and the portable kernel on every compiled Highway target)
// against the scalar reference ops::ref::matmul_bf16dot, bit for bit (ops/matmul_bf16dot.h:
// the spec's chain is exact up to results below 2^-126, which this data never reaches), on
// odd sizes: K not a multiple of 2 / 32, N not a multiple of the 64-column panel, T across
// the 6-row tile; and batch, slice and thread invariance. The AVX512-BF16 cases skip on a
// CPU without it. AMX is turned off here (set_amx_enabled(false)): on an AMX CPU the dispatch
// would otherwise take the AMX chain, tested in matmul_amx_bf16_test.cc.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "cpu/thread_pool.h"
#include "ops/matmul_bf16dot.h"
#include "cpu/bf16dot_test_case.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::random_floats;
using ops::testing::store_weight;
using ops::testing::StoredWeight;

class NoAmx : public ::testing::Environment {
 public:
  void SetUp() override { set_amx_enabled(false); }
};
[[maybe_unused]] ::testing::Environment* const g_no_amx = ::testing::AddGlobalTestEnvironment(new NoAmx);

using Case = testing::Bf16dotCase;
constexpr auto make_case = testing::make_bf16dot_case;

// Runs the check with the AVX512-BF16 kernel (when the CPU has it), then with the portable
// kernel on every compiled target this CPU runs.
template <class F>
void for_each_kernel(const F& f) {
  set_bf16dot_portable(false);
  if (bf16dot_kernel_name() == "avx512bf16") {
    SCOPED_TRACE("avx512bf16");
    f();
    if (::testing::Test::HasFatalFailure()) return;
  }
  set_bf16dot_portable(true);
  testing::for_each_target([&] {
    ASSERT_EQ(bf16dot_kernel_name(), "portable-" + simd_target_name());
    f();
  });
  set_bf16dot_portable(false);
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
}

void expect_equal_to_reference(const Case& c, bool bias) {
  const float* b = bias ? c.b.data() : nullptr;
  std::vector<float> y(size_t(c.T * c.N), NAN), ref(size_t(c.T * c.N), NAN);
  cpu::matmul_bf16dot(c.x.data(), c.T, c.view(), b, y.data());
  ops::ref::matmul_bf16dot(c.x.data(), c.T, c.view(), b, ref.data());
  expect_bits_equal(y, ref,
                    "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N) + " " +
                        dtype_name(c.w.dtype) + (bias ? " bias" : ""));
}

TEST(CpuMatmulBf16Dot, AvxKernelAvailableWhereTheCpuHasIt) {
  set_bf16dot_portable(false);
  if (bf16dot_kernel_name() != "avx512bf16") GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  set_bf16dot_portable(true);
  EXPECT_NE(bf16dot_kernel_name(), "avx512bf16");
  set_bf16dot_portable(false);
}

TEST(CpuMatmulBf16Dot, OddSizesEqualTheReference) {
  for_each_kernel([&] {
    uint32_t seed = 1;
    for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9})
      for (int64_t K : {1, 2, 3, 31, 32, 33, 65})
        for (int64_t N : {1, 5, 63, 64, 65, 130})
          for (bool bias : {false, true}) {
            expect_equal_to_reference(make_case(T, K, N, DType::BF16, seed += 3), bias);
            if (::testing::Test::HasFatalFailure()) return;
          }
    // Model-sized rows, the other weight dtypes, several panels on the pool, long prefill.
    expect_equal_to_reference(make_case(1, 768, 2048, DType::F32, 100), true);
    expect_equal_to_reference(make_case(13, 2051, 77, DType::F16, 101), false);
    expect_equal_to_reference(make_case(100, 769, 200, DType::BF16, 102), true);
  });
}

// Row t of a T-row call == the same row alone (decode == prefill == speculative verify), and
// the same at 1, 2 and 3 threads: the chain of an element depends on K only. Bit-exact.
TEST(CpuMatmulBf16Dot, BatchAndThreadInvariant) {
  const int threads0 = num_threads();
  for_each_kernel([&] {
    for (int64_t T : {2, 5, 7, 9, 17, 64}) {
      const Case c = make_case(T, 777, 131, DType::BF16, uint32_t(200 + T));
      std::vector<float> all(size_t(T * c.N)), row(size_t(c.N));
      set_num_threads(2);
      cpu::matmul_bf16dot(c.x.data(), T, c.view(), c.b.data(), all.data());
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        for (int64_t t = 0; t < T; ++t) {
          cpu::matmul_bf16dot(c.x.data() + t * c.K, 1, c.view(), c.b.data(), row.data());
          expect_bits_equal(
              row, std::vector<float>(all.begin() + t * c.N, all.begin() + (t + 1) * c.N),
              "T=" + std::to_string(T) + " t=" + std::to_string(t) + " threads=" + std::to_string(threads));
          if (::testing::Test::HasFatalFailure()) return;
        }
        std::vector<float> again(all.size());
        cpu::matmul_bf16dot(c.x.data(), T, c.view(), c.b.data(), again.data());
        expect_bits_equal(again, all, "whole call at " + std::to_string(threads) + " threads");
      }
    }
  });
  set_num_threads(threads0);
}

// Both kernels give the same bits (each equals the reference above; this checks it directly
// on a prefill-sized call where the tiles differ most).
TEST(CpuMatmulBf16Dot, AvxAndPortableAgree) {
  set_bf16dot_portable(false);
  if (bf16dot_kernel_name() != "avx512bf16") GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const Case c = make_case(37, 1001, 300, DType::F32, 300);
  std::vector<float> a(size_t(37 * 300)), p(a.size());
  cpu::matmul_bf16dot(c.x.data(), 37, c.view(), c.b.data(), a.data());
  set_bf16dot_portable(true);
  cpu::matmul_bf16dot(c.x.data(), 37, c.view(), c.b.data(), p.data());
  set_bf16dot_portable(false);
  expect_bits_equal(a, p, "avx512bf16 vs portable");
}

// A nan or inf in one x row poisons that row only.
TEST(CpuMatmulBf16Dot, NonFiniteStaysInItsRow) {
  for_each_kernel([&] {
    Case c = make_case(8, 70, 9, DType::BF16, 400);
    c.x[3 * 70 + 5] = NAN;
    c.x[6 * 70 + 69] = INFINITY;
    std::vector<float> y(8 * 9);
    cpu::matmul_bf16dot(c.x.data(), 8, c.view(), nullptr, y.data());
    for (int64_t t = 0; t < 8; ++t)
      for (int64_t n = 0; n < 9; ++n) {
        const float v = y[size_t(t * 9 + n)];
        if (t == 3) EXPECT_TRUE(std::isnan(v));
        else if (t == 6) EXPECT_FALSE(std::isfinite(v));
        else EXPECT_TRUE(std::isfinite(v));
      }
  });
}

TEST(CpuMatmulBf16Dot, MissingCopyThrows) {
  const Case c = make_case(1, 8, 3, DType::F32, 500);
  std::vector<float> y(3);
  EXPECT_THROW(cpu::matmul_bf16dot(c.x.data(), 1, c.w.view(), nullptr, y.data()), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::cpu
