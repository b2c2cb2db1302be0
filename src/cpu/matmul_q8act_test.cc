// cpu::matmul_q8act (SIMD, threaded) against ops::ref::matmul_q8act on every compiled
// target: int8 / int4 weights, odd N, K odd multiples of 32, G = 32 and larger, F32 / F16
// scales, 1 to 7 rows; and batch invariance bit for bit (a row alone = the row in a batch).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "ops/matmul_q8act.h"
#include "ops/test_util.h"
#include "ops/weight_quant_inl.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::random_floats;
using ops::testing::store_quant;

struct Case { DType dtype; int64_t K, G; DType sd; };

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
    for (int64_t j = b * 32; j < b * 32 + 32; ++j) isum += std::fabs(double(ops::detail::quant_q(w, n, j) * q[size_t(j)]));
    mag += std::fabs(ops::detail::quant_param(w.scales, w.scale_dtype, g) * d[size_t(b)]) * isum;
  }
  return float(mag * 1e-6 + 1e-6);
}

TEST(CpuQ8Act, MatchesReferenceOnEveryTarget) {
  const Case cases[] = {{DType::I8, 32, 32, DType::F32}, {DType::I8, 96, 32, DType::F16},
                        {DType::I8, 736, 32, DType::F16}, {DType::I8, 160, 160, DType::F32},
                        {DType::U4, 32, 32, DType::F32},  {DType::U4, 224, 32, DType::F16},
                        {DType::U4, 576, 64, DType::F16}, {DType::U4, 480, 96, DType::F32}};
  testing::for_each_target([&] {
    for (const Case& c : cases) {
      for (int64_t T : {1, 3, 7}) {
        SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " K=" + std::to_string(c.K) + " G=" +
                     std::to_string(c.G) + " T=" + std::to_string(T));
        const int64_t N = 67;
        const auto x = random_floats(size_t(T * c.K), uint32_t(c.K + T), -2.f, 2.f);
        const auto st = store_quant(random_floats(size_t(N * c.K), 9), N, c.K, c.dtype, c.G, c.sd);
        const auto bias = random_floats(size_t(N), 11);
        std::vector<float> got(size_t(T * N)), want(size_t(T * N)), one(static_cast<size_t>(N));
        cpu::matmul_q8act(x.data(), T, st.view(), bias.data(), got.data());
        ops::ref::matmul_q8act(x.data(), T, st.view(), bias.data(), want.data());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < N; ++n)
            ASSERT_NEAR(got[size_t(t * N + n)], want[size_t(t * N + n)], bound(x, t, st.view(), n))
                << "t=" << t << " n=" << n;
        // Batch invariance: the first row (in a 4-row tile when T >= 4) and the last alone
        // give the same bits.
        for (int64_t t : {int64_t(0), T - 1}) {
          cpu::matmul_q8act(x.data() + t * c.K, 1, st.view(), bias.data(), one.data());
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
}

}  // namespace
}  // namespace tinyloop::cpu
