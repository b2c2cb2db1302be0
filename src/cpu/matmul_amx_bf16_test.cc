// The AMX-BF16 matmul (cpu/amx.h) against its scalar reference ops::ref::matmul_bf16dot_amx,
// bit for bit, on every tile edge (T across the 16-row tile, K across the 32-column step and
// odd, N across the 16-column tile and 64-column panel), batch / thread invariance, the
// dispatch (cpu::matmul_bf16dot takes it on an AMX CPU; TINYLOOP_DISABLE_AMX's setter turns it
// off; the forced-scalar path follows it), and the two chains' documented tolerance against
// each other. The AMX cases GTEST_SKIP with the reason when this CPU or kernel has no AMX, and
// the run ends with a line naming what went untested.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "base/convert_inl.h"
#include "ops/matmul_bf16dot.h"
#include "cpu/bf16dot_test_case.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::random_floats;
using ops::testing::store_weight;
using ops::testing::StoredWeight;

// Prints, after all tests, whether the AMX kernel was exercised (GTEST_SKIP lines scroll by).
class AmxSummary : public ::testing::Environment {
 public:
  void TearDown() override {
    if (amx_status().bf16) std::printf("[ AMX      ] AMX-BF16 kernel tested on this CPU\n");
    else
      std::printf("[ AMX      ] NOT TESTED: the AMX-BF16 kernel (%s); only the reference chains ran\n",
                  amx_status().reason.c_str());
  }
};
[[maybe_unused]] ::testing::Environment* const g_summary = ::testing::AddGlobalTestEnvironment(new AmxSummary);

#define SKIP_WITHOUT_AMX()                                                 \
  do {                                                                     \
    if (!amx_status().bf16) {                                              \
      GTEST_SKIP() << "AMX-BF16 kernel untested: " << amx_status().reason; \
    }                                                                      \
  } while (0)

using Case = testing::Bf16dotCase;
constexpr auto make_case = testing::make_bf16dot_case;

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
}

std::string name(const Case& c, bool bias) {
  return "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N) + (bias ? " bias" : "");
}

void expect_amx_equals_reference(const Case& c, bool bias) {
  const float* b = bias ? c.b.data() : nullptr;
  std::vector<float> y(size_t(c.T * c.N), NAN), ref(size_t(c.T * c.N), NAN);
  matmul_bf16dot_amx(c.x.data(), c.T, c.view(), b, y.data());
  ops::ref::matmul_bf16dot_amx(c.x.data(), c.T, c.view(), b, ref.data());
  expect_bits_equal(y, ref, name(c, bias));
}

TEST(AmxStatus, ReportsAReasonWhenUnavailable) {
  const AmxStatus& s = amx_status();
  std::printf("amx: tile=%d bf16=%d int8=%d reason=\"%s\"\n", s.tile, s.bf16, s.int8, s.reason.c_str());
  if (!s.tile) {
    EXPECT_FALSE(s.reason.empty());
  }
  EXPECT_EQ(&amx_status(), &s);  // one answer per process
  // The switch: off names itself, on restores what the hardware allows.
  set_amx_enabled(false);
  EXPECT_FALSE(amx_bf16_active());
  EXPECT_FALSE(amx_inactive_reason().empty());
  set_amx_enabled(true);
  EXPECT_EQ(amx_bf16_active(), s.bf16);
  EXPECT_EQ(amx_inactive_reason().empty(), s.bf16);
}

// Runs everywhere: the two references are different sums of the same products, within the
// header's bound, and do differ on some elements (or the AMX reference would be pointless).
TEST(AmxReference, WithinTheDocumentedToleranceOfTheVdpbf16psChain) {
  int64_t differ = 0, total = 0;
  for (int64_t K : {5, 64, 100, 768, 2049}) {
    const Case c = make_case(9, K, 70, DType::F32, uint32_t(10 + K));
    std::vector<float> a(size_t(c.T * c.N)), v(a.size());
    ops::ref::matmul_bf16dot_amx(c.x.data(), c.T, c.view(), nullptr, a.data());
    ops::ref::matmul_bf16dot(c.x.data(), c.T, c.view(), nullptr, v.data());
    const int64_t K2 = (K + 1) / 2;
    const double factor = double(K + 17 + (K2 + 15) / 16) * ops::testing::kU;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t n = 0; n < c.N; ++n) {
        double s = 0;  // sum_k |xb[k] wb[k]|
        for (int64_t k = 0; k < K; ++k)
          s += std::fabs(double(ops::detail::bf16_to_float(ops::round_bf16_ftz(c.x[size_t(t * K + k)]))) *
                         ops::detail::bf16_to_float(ops::round_bf16_ftz(c.w.f32[size_t(n * K + k)])));
        const size_t i = size_t(t * c.N + n);
        ASSERT_LE(std::fabs(double(a[i]) - v[i]), factor * s) << "K=" << K << " t=" << t << " n=" << n;
        differ += a[i] != v[i];
        ++total;
      }
  }
  std::printf("AMX chain vs vdpbf16ps chain: %lld of %lld elements differ\n", (long long)differ, (long long)total);
  EXPECT_GT(differ, 0);
}

// TDPBF16PS really computes the AMX reference's chain, and it is not vdpbf16ps's: on random
// model-sized data, how many elements the two chains give differently.
TEST(CpuMatmulAmxBf16, HardwareChainIsTheAmxReferenceNotVdpbf16ps) {
  SKIP_WITHOUT_AMX();
  const Case c = make_case(64, 768, 256, DType::BF16, 7);
  std::vector<float> y(size_t(64 * 256)), amx_ref(y.size()), vdp_ref(y.size());
  matmul_bf16dot_amx(c.x.data(), c.T, c.view(), nullptr, y.data());
  ops::ref::matmul_bf16dot_amx(c.x.data(), c.T, c.view(), nullptr, amx_ref.data());
  ops::ref::matmul_bf16dot(c.x.data(), c.T, c.view(), nullptr, vdp_ref.data());
  expect_bits_equal(y, amx_ref, "AMX kernel vs AMX reference");
  int64_t differ = 0;
  for (size_t i = 0; i < y.size(); ++i) differ += std::bit_cast<uint32_t>(y[i]) != std::bit_cast<uint32_t>(vdp_ref[i]);
  std::printf("TDPBF16PS vs the vdpbf16ps chain: %lld of %zu elements differ (K = 768)\n", (long long)differ, y.size());
  EXPECT_GT(differ, 0);
}

// Every tile edge: T around the 16-row tile, K odd / around the 32-column step, N around
// the 16-column tile and the 64-column panel; model-sized calls on the pool.
TEST(CpuMatmulAmxBf16, TileEdgesEqualTheReference) {
  SKIP_WITHOUT_AMX();
  uint32_t seed = 1;
  for (int64_t T : {1, 2, 15, 16, 17, 33, 64, 100})
    for (int64_t K : {1, 2, 3, 31, 32, 33, 63, 64, 65, 100, 769})
      for (int64_t N : {1, 15, 16, 17, 63, 64, 65, 130})
        for (bool bias : {false, true}) {
          expect_amx_equals_reference(make_case(T, K, N, DType::BF16, seed += 3), bias);
          if (HasFatalFailure()) return;
        }
  expect_amx_equals_reference(make_case(1, 768, 2048, DType::F32, 100), true);
  expect_amx_equals_reference(make_case(13, 2051, 77, DType::F16, 101), false);
  expect_amx_equals_reference(make_case(100, 2048, 768, DType::BF16, 102), true);
}

// Row t of a T-row call == the same row alone, at 1, 2 and 3 threads: bit-exact.
TEST(CpuMatmulAmxBf16, BatchAndThreadInvariant) {
  SKIP_WITHOUT_AMX();
  const int threads0 = num_threads();
  for (int64_t T : {2, 15, 17, 33, 64}) {
    const Case c = make_case(T, 777, 300, DType::BF16, uint32_t(200 + T));
    std::vector<float> all(size_t(T * c.N)), row(size_t(c.N));
    set_num_threads(2);
    matmul_bf16dot_amx(c.x.data(), T, c.view(), c.b.data(), all.data());
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      for (int64_t t = 0; t < T; ++t) {
        matmul_bf16dot_amx(c.x.data() + t * c.K, 1, c.view(), c.b.data(), row.data());
        expect_bits_equal(row, std::vector<float>(all.begin() + t * c.N, all.begin() + (t + 1) * c.N),
                          "T=" + std::to_string(T) + " t=" + std::to_string(t) + " threads=" + std::to_string(threads));
        if (HasFatalFailure()) return set_num_threads(threads0);
      }
      std::vector<float> again(all.size());
      matmul_bf16dot_amx(c.x.data(), T, c.view(), c.b.data(), again.data());
      expect_bits_equal(again, all, "whole call at " + std::to_string(threads) + " threads");
    }
  }
  set_num_threads(threads0);
}

// The dispatched op takes AMX on this CPU for every T, the setter turns it off (back to the
// vdpbf16ps chain), and TINYLOOP_FORCE_SCALAR's path runs the reference of the chain in use.
TEST(CpuMatmulAmxBf16, DispatchUsesAmxAndCanBeTurnedOff) {
  SKIP_WITHOUT_AMX();
  const Case c = make_case(20, 300, 100, DType::BF16, 600);
  std::vector<float> y(size_t(20 * 100)), ref(y.size());
  set_amx_enabled(true);
  ASSERT_EQ(bf16dot_kernel_name(), "amx");
  ASSERT_TRUE(bf16dot_uses_amx());
  for (int64_t T : {1, 20}) {
    cpu::matmul_bf16dot(c.x.data(), T, c.view(), c.b.data(), y.data());
    ops::ref::matmul_bf16dot_amx(c.x.data(), T, c.view(), c.b.data(), ref.data());
    expect_bits_equal(std::vector<float>(y.begin(), y.begin() + T * 100),
                      std::vector<float>(ref.begin(), ref.begin() + T * 100), "dispatched, T=" + std::to_string(T));
  }
  ops::set_force_scalar(true);
  ops::matmul_bf16dot(c.x.data(), 20, c.view(), c.b.data(), y.data());
  ops::set_force_scalar(false);
  expect_bits_equal(y, ref, "forced scalar on an AMX CPU");

  set_amx_enabled(false);
  EXPECT_NE(bf16dot_kernel_name(), "amx");
  EXPECT_EQ(amx_inactive_reason(), "disabled by set_amx_enabled(false)");
  cpu::matmul_bf16dot(c.x.data(), 20, c.view(), c.b.data(), y.data());
  ops::ref::matmul_bf16dot(c.x.data(), 20, c.view(), c.b.data(), ref.data());
  expect_bits_equal(y, ref, "AMX off: the vdpbf16ps chain");
  set_amx_enabled(true);
}

// A nan or inf in one x row poisons that row only (tiles share no rows' sums).
TEST(CpuMatmulAmxBf16, NonFiniteStaysInItsRow) {
  SKIP_WITHOUT_AMX();
  Case c = make_case(18, 70, 9, DType::BF16, 400);
  c.x[3 * 70 + 5] = NAN;
  c.x[17 * 70 + 69] = INFINITY;
  std::vector<float> y(18 * 9);
  matmul_bf16dot_amx(c.x.data(), 18, c.view(), nullptr, y.data());
  for (int64_t t = 0; t < 18; ++t)
    for (int64_t n = 0; n < 9; ++n) {
      const float v = y[size_t(t * 9 + n)];
      if (t == 3) EXPECT_TRUE(std::isnan(v));
      else if (t == 17) EXPECT_FALSE(std::isfinite(v));
      else EXPECT_TRUE(std::isfinite(v)) << "row " << t;
    }
}

TEST(CpuMatmulAmxBf16, MissingCopyThrows) {
  const Case c = make_case(1, 8, 3, DType::F32, 500);
  std::vector<float> y(3);
  EXPECT_THROW(matmul_bf16dot_amx(c.x.data(), 1, c.w.view(), nullptr, y.data()), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::cpu
