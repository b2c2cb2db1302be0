// The q8-activation matmul kernels against ops::ref::matmul_q8act: the Highway one on every
// compiled target and the AVX512-VNNI one (skipped on CPUs without it): int8 / int4 weights,
// odd N, K odd multiples of 32, G = 32 and larger, F32 / F16 scales, 1 to 9 rows and a large
// T, every int8 / int4 weight value; and batch invariance bit for bit (a row alone = the row
// in a batch, a weight row alone = the row among others).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/matmul_q8act_vnni.h"
#include "cpu/test_util.h"
#include "ops/matmul_q8act.h"
#include "ops/test_util.h"
#include "base/weight_quant_inl.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::random_floats;
using ops::testing::store_quant;

using Case = ops::testing::Q8Case;

// |simd - ref| bound: both sum the same exact per-block products (float(isum) is exact for
// |isum| < 2^24) in a different order (lanes, FMA): a few ulp of the sum of |terms|.
float bound(const std::vector<float>& x, int64_t t, const ops::WeightView& w, int64_t n) {
  const int64_t K = w.cols, nb = K / 32, ng = K / w.group;
  std::vector<int8_t> q(static_cast<size_t>(K));
  std::vector<float> d(static_cast<size_t>(nb)), s(static_cast<size_t>(nb));
  ops::detail::quantize_row_q8(x.data() + t * K, K, q.data(), d.data(), s.data());
  double mag = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t g = n * ng + b * 32 / w.group;
    double isum = 0;
    for (int64_t j = b * 32; j < b * 32 + 32; ++j)
      isum += std::fabs(double(ops::detail::quant_q(w, n, j) * q[size_t(j)]));
    mag += std::fabs(ops::detail::quant_param(w.scales, w.scale_dtype, g) * d[size_t(b)]) * isum;
  }
  return float(mag * 1e-6 + 1e-6);
}

TEST(CpuQ8Act, MatchesReferenceOnEveryTarget) {
  const Case cases[] = {{DType::I8, 32, 32, DType::F32},  {DType::I8, 96, 32, DType::F16},
                        {DType::I8, 736, 32, DType::F16}, {DType::I8, 160, 160, DType::F32},
                        {DType::U4, 32, 32, DType::F32},  {DType::U4, 224, 32, DType::F16},
                        {DType::U4, 576, 64, DType::F16}, {DType::U4, 480, 96, DType::F32}};
  testing::for_each_target([&] {
    for (const Case& c : cases) {
      for (int64_t T : {1, 3, 7}) {
        SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " K=" + std::to_string(c.K) + " G=" + std::to_string(c.G) +
                     " T=" + std::to_string(T));
        const int64_t N = 67;
        const auto x = random_floats(size_t(T * c.K), uint32_t(c.K + T), -2.f, 2.f);
        const auto st = store_quant(random_floats(size_t(N * c.K), 9), N, c.K, c.dtype, c.G, c.sd);
        const auto bias = random_floats(size_t(N), 11);
        std::vector<float> got(size_t(T * N)), want(size_t(T * N)), one(static_cast<size_t>(N));
        detail::matmul_q8act_hwy(x.data(), T, st.view(), bias.data(), got.data());
        ops::ref::matmul_q8act(x.data(), T, st.view(), bias.data(), want.data());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < N; ++n)
            ASSERT_NEAR(got[size_t(t * N + n)], want[size_t(t * N + n)], bound(x, t, st.view(), n))
                << "t=" << t << " n=" << n;
        // Batch invariance: the first row (in a 4-row tile when T >= 4) and the last alone
        // give the same bits.
        for (int64_t t : {int64_t(0), T - 1}) {
          detail::matmul_q8act_hwy(x.data() + t * c.K, 1, st.view(), bias.data(), one.data());
          for (int64_t n = 0; n < N; ++n) ASSERT_EQ(one[size_t(n)], got[size_t(t * N + n)]) << t << " " << n;
        }
      }
    }
  });
}

TEST(CpuQ8Act, RefusesAGroupOffTheBlocks) {
  const auto st = store_quant(random_floats(3 * 48, 1), 3, 48, DType::I8, 48, DType::F32);
  const auto x = random_floats(48, 2);
  float y[3];
  EXPECT_THROW(cpu::matmul_q8act(x.data(), 1, st.view(), nullptr, y), std::invalid_argument);
  EXPECT_THROW(detail::matmul_q8act_hwy(x.data(), 1, st.view(), nullptr, y), std::invalid_argument);
  if (detail::vnni_supported()) {  // braces: EXPECT_THROW expands to an if/else
    EXPECT_THROW(detail::matmul_q8act_vnni(x.data(), 1, st.view(), nullptr, y), std::invalid_argument);
  }
}

// VNNI vs reference (tolerance `bound`) and vs the Highway kernel, then batch invariance:
// every row alone, and a 5-row slice of the weight, give the bits of the full call.
void check_vnni(const ops::testing::StoredQuant& st, const std::vector<float>& x, int64_t T,
                const std::vector<float>& bias) {
  const int64_t N = st.N, K = st.K;
  const ops::WeightView w = st.view();
  std::vector<float> got(size_t(T * N)), want(size_t(T * N)), hwy(size_t(T * N)), one(static_cast<size_t>(N));
  detail::matmul_q8act_vnni(x.data(), T, w, bias.data(), got.data());
  ops::ref::matmul_q8act(x.data(), T, w, bias.data(), want.data());
  detail::matmul_q8act_hwy(x.data(), T, w, bias.data(), hwy.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      const float b = bound(x, t, w, n);
      ASSERT_NEAR(got[size_t(t * N + n)], want[size_t(t * N + n)], b)
          << "ref t=" << t << " n=" << n << " hwy=" << hwy[size_t(t * N + n)];
      ASSERT_NEAR(got[size_t(t * N + n)], hwy[size_t(t * N + n)], 2 * b) << "hwy t=" << t << " n=" << n;
    }
  for (int64_t t = 0; t < T; ++t) {
    detail::matmul_q8act_vnni(x.data() + t * K, 1, w, bias.data(), one.data());
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(one[size_t(n)], got[size_t(t * N + n)]) << "alone t=" << t << " n=" << n;
  }
  if (N > 6) {
    const int64_t n0 = N / 2 - 1, rows = 5;  // starts off the 2- and 4-row tile grid
    std::vector<float> part(size_t(T * rows));
    detail::matmul_q8act_vnni(x.data(), T, st.rows_view(n0, rows), bias.data() + n0, part.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(part[size_t(t * rows + r)], got[size_t(t * N + n0 + r)]) << "slice t=" << t << " r=" << r;
  }
}

TEST(CpuQ8ActVnni, MatchesReferenceAndHighway) {
  if (!detail::vnni_supported()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  const std::vector<Case> cases = ops::testing::q8_kernel_cases();
  for (const Case& c : cases)
    for (int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 70}) {
      SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " K=" + std::to_string(c.K) + " G=" + std::to_string(c.G) + " " +
                   dtype_name(c.sd) + " T=" + std::to_string(T));
      for (int64_t N : {1, 3, 67}) {
        const auto x = random_floats(size_t(T * c.K), uint32_t(c.K + T), -2.f, 2.f);
        const auto st = store_quant(random_floats(size_t(N * c.K), uint32_t(9 + N)), N, c.K, c.dtype, c.G, c.sd);
        check_vnni(st, x, T, random_floats(size_t(N), 11));
        if (HasFatalFailure()) return;
      }
    }
}

// A weight of 16389 rows (4 MiB + 1280 bytes of int8; not a multiple of 3 or 4, the prefill
// tile, nor of the 32-row pool task) and slices of it at odd offsets: decode (one row at a
// time, prefetching ahead, past the slice's end too) and prefill (4 rows) tiles, every T
// 1..9 and every slice must give the bits of the full T = 9 call.
TEST(CpuQ8ActVnni, BigWeightSlicesAgreeForEveryT) {
  if (!detail::vnni_supported()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  const int64_t N = 16389, Tmax = 9;
  for (const Case& c : {Case{DType::I8, 256, 32, DType::F16}, Case{DType::U4, 512, 64, DType::F32},
                        Case{DType::U4, 288, 32, DType::F16}}) {
    SCOPED_TRACE(dtype_name(c.dtype));
    const int64_t K = c.K;
    const auto st = store_quant(random_floats(size_t(N * K), 5), N, K, c.dtype, c.G, c.sd);
    const auto x = random_floats(size_t(Tmax * K), 6, -2.f, 2.f);
    const auto bias = random_floats(size_t(N), 7);
    check_vnni(st, x, 3, bias);  // against the reference and Highway (decode, one row at a time)
    if (HasFatalFailure()) return;
    std::vector<float> full(size_t(Tmax * N));  // [Tmax, N]
    detail::matmul_q8act_vnni(x.data(), Tmax, st.view(), bias.data(), full.data());
    // (first row, rows): all, most, 4 MiB - 256 bytes, small, one row.
    const std::pair<int64_t, int64_t> slices[] = {{0, N}, {1, N - 2}, {3, 16383}, {N - 4099, 4099}, {7, 1}};
    for (const auto& [n0, rows] : slices)
      for (int64_t T = 1; T <= Tmax; ++T) {
        std::vector<float> part(size_t(T * rows));  // [T, rows]
        detail::matmul_q8act_vnni(x.data(), T, st.rows_view(n0, rows), bias.data() + n0, part.data());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(part[size_t(t * rows + r)], full[size_t(t * N + n0 + r)])
                << "n0=" << n0 << " rows=" << rows << " T=" << T << " t=" << t << " r=" << r;
      }
  }
}

// Every int8 value -128..127 (the +128 flip must be exact at both ends) and every nibble,
// against x rows with full-scale +-127 entries, zeros and an all-zero block.
TEST(CpuQ8ActVnni, ExactOnExtremeValues) {
  if (!detail::vnni_supported()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  const int64_t K = 288, N = 9, T = 6;
  std::vector<float> x(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t v = (k * 7 + t * 13) % 5;  // -2 .. 2: quantizes to -127, -64, 0, 64, 127
      x[size_t(t * K + k)] = (k / 32 == 3) ? 0.f : float(v - 2) * (t % 2 ? 1.f : -3.5f);
    }
  for (DType dt : {DType::I8, DType::U4})
    for (DType sd : {DType::F32, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(sd));
      auto st = store_quant(random_floats(size_t(N * K), 3), N, K, dt, 32, sd);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = n * K + k;
          if (dt == DType::I8) {
            // Row 0: -128 everywhere, row 1: 127 everywhere, others: every value in turn.
            const int v = n == 0 ? -128 : n == 1 ? 127 : int((i * 37) % 256) - 128;
            st.q[size_t(i)] = uint8_t(int8_t(v));
          } else if (k % 2 == 0) {
            const int lo = n == 0 ? 15 : int(i % 16), hi = n == 0 ? 15 : int((i / 16 + n) % 16);
            st.q[size_t(i / 2)] = uint8_t(lo | (hi << 4));
          }
        }
      check_vnni(st, x, T, std::vector<float>(size_t(N), 0.25f));
      if (HasFatalFailure()) return;
    }
}

// The VNNI kernel quantizes x in vectors: its q and d must be the reference's bit for bit.
// One-hot int8 rows with scale 1 make y[t, n] = d_x * q[t, n] with a single rounding in both
// kernels, so any rounding flip (x * id landing on .5) or scale difference shows as unequal
// bits. x holds many exact halves (amax * (m + 0.5) / 127), randoms, zeros and a zero block.
TEST(CpuQ8ActVnni, QuantizesLikeTheReference) {
  if (!detail::vnni_supported()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  const int64_t K = 224, N = K, T = 9;
  auto x = random_floats(size_t(T * K), 8, -3.f, 3.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      float& v = x[size_t(t * K + k)];
      if (k % 32 == 0) v = 2.5f + float(t);  // the block's amax
      else if (k % 3 == 0) v = (2.5f + float(t)) * (float(k % 127) + 0.5f) / 127.f * (k % 2 ? -1.f : 1.f);
      else if (k % 7 == 0) v = 0.f;
      if (t == 4 && k >= 64 && k < 96) v = 0.f;  // all-zero block
    }
  auto st = store_quant(std::vector<float>(size_t(N * K), 0.f), N, K, DType::I8, 32, DType::F32);
  std::fill(st.q.begin(), st.q.end(), uint8_t(0));
  std::fill(st.s32.begin(), st.s32.end(), 1.f);
  for (int64_t n = 0; n < N; ++n) st.q[size_t(n * K + n)] = 1;
  std::vector<float> got(size_t(T * N)), want(size_t(T * N));
  detail::matmul_q8act_vnni(x.data(), T, st.view(), nullptr, got.data());
  ops::ref::matmul_q8act(x.data(), T, st.view(), nullptr, want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "t=" << i / size_t(N) << " k=" << i % size_t(N);
}

// cpu::matmul_q8act runs the VNNI kernel when the CPU has it (nothing here turns it off):
// its bits are the VNNI kernel's then, the Highway kernel's otherwise.
TEST(CpuQ8ActVnni, DispatchPicksVnniWhenSupported) {
  const int64_t K = 160, N = 21, T = 5;
  const auto x = random_floats(size_t(T * K), 4, -2.f, 2.f);
  const auto st = store_quant(random_floats(size_t(N * K), 5), N, K, DType::U4, 32, DType::F16);
  std::vector<float> got(size_t(T * N)), want(size_t(T * N));
  cpu::matmul_q8act(x.data(), T, st.view(), nullptr, got.data());
  if (detail::vnni_supported()) detail::matmul_q8act_vnni(x.data(), T, st.view(), nullptr, want.data());
  else detail::matmul_q8act_hwy(x.data(), T, st.view(), nullptr, want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
}

}  // namespace
}  // namespace tinyloop::cpu
