// The q8-activation scalar reference (ops/matmul_q8act.h): the block quantizer against
// hand-computed ggml x86 values (127 / amax, half-to-even, fp16 d and s), the matmul against
// a double/int64 oracle of the same formula on odd N and odd multiples of 32 for K, the
// refusals, and the dispatch (q8act takes the path only where the group allows it).
#include "ops/matmul_q8act.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "ops/reference.h"
#include "ops/test_util.h"
#include "base/weight_quant_inl.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::ops {
namespace {

using testing::random_floats;
using testing::store_quant;

TEST(Q8ActQuantize, TiesRoundToEvenWithScale127OverAmax) {
  float x[32] = {};  // amax 127 -> id = 1, d = 1: q = round_half_even(x)
  const float v[] = {127.f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, -3.5f, 0.49f, -126.6f};
  for (int i = 0; i < 9; ++i) x[i] = v[i];
  int8_t q[32];
  float d, s;
  detail::quantize_block_q8(x, q, &d, &s);
  const int8_t want[] = {127, 0, 2, 2, 0, -2, -4, 0, -127};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(q[i], want[i]) << i;
  for (int i = 9; i < 32; ++i) EXPECT_EQ(q[i], 0);
  EXPECT_EQ(d, 1.f);
  EXPECT_EQ(s, float(127 + 2 + 2 - 2 - 4 - 127));
}

TEST(Q8ActQuantize, ScaleAndSumAreRoundedThroughHalf) {
  std::vector<float> x = random_floats(32, 7);
  float amax = 0.f;
  for (float v : x) amax = std::fmax(amax, std::fabs(v));
  int8_t q[32];
  float d, s;
  detail::quantize_block_q8(x.data(), q, &d, &s);
  const float df = amax / 127.f;
  EXPECT_EQ(d, detail::half_to_float(detail::float_to_half(df)));
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q[j], int(std::nearbyint(x[j] * (127.f / amax)))) << j;
    sum += q[j];
  }
  // s uses the unrounded d (ggml: GGML_FP32_TO_FP16(d * sum)).
  EXPECT_EQ(s, detail::half_to_float(detail::float_to_half(df * float(sum))));
}

TEST(Q8ActQuantize, ZeroBlockIsAllZero) {
  float x[32] = {};
  int8_t q[32];
  float d = 1.f, s = 1.f;
  detail::quantize_block_q8(x, q, &d, &s);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[j], 0);
  EXPECT_EQ(d, 0.f);
  EXPECT_EQ(s, 0.f);
}

// Oracle: the formula in double with exact integer block sums.
std::vector<double> oracle(const std::vector<float>& x, int64_t T, const WeightView& w, const std::vector<float>& bias,
                           std::vector<double>* bound) {
  const int64_t N = w.rows, K = w.cols, nb = K / 32, ng = K / w.group;
  std::vector<double> y(size_t(T * N));
  bound->assign(size_t(T * N), 0.0);
  std::vector<int8_t> q(static_cast<size_t>(K));
  std::vector<float> d(static_cast<size_t>(nb)), s(static_cast<size_t>(nb));
  for (int64_t t = 0; t < T; ++t) {
    detail::quantize_row_q8(x.data() + t * K, K, q.data(), d.data(), s.data());
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias[size_t(n)], mag = std::fabs(bias[size_t(n)]);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t g = n * ng + b * 32 / w.group;
        int64_t isum = 0;
        for (int64_t j = b * 32; j < b * 32 + 32; ++j) isum += detail::quant_q(w, n, j) * q[size_t(j)];
        const double term = double(detail::quant_param(w.scales, w.scale_dtype, g)) * d[size_t(b)] * double(isum);
        const double o =
            w.dtype == DType::U4 ? double(detail::quant_param(w.offsets, w.scale_dtype, g)) * s[size_t(b)] : 0.0;
        acc += term + o;
        mag += std::fabs(term) + std::fabs(o);
      }
      y[size_t(t * N + n)] = acc;
      (*bound)[size_t(t * N + n)] = mag;
    }
  }
  return y;
}

using Case = testing::Q8Case;

TEST(Q8ActRef, MatchesOracleOnOddShapes) {
  const Case cases[] = {{DType::I8, 32, 32, DType::F32},   {DType::I8, 96, 32, DType::F16},
                        {DType::I8, 160, 160, DType::F32}, {DType::U4, 32, 32, DType::F16},
                        {DType::U4, 224, 32, DType::F32},  {DType::U4, 192, 64, DType::F16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " K=" + std::to_string(c.K) + " G=" + std::to_string(c.G));
    const int64_t T = 3, N = 7;
    const auto x = random_floats(size_t(T * c.K), 1, -3.f, 3.f);
    const auto st = store_quant(random_floats(size_t(N * c.K), 2), N, c.K, c.dtype, c.G, c.sd);
    const auto bias = random_floats(size_t(N), 3);
    std::vector<float> y(size_t(T * N));
    ref::matmul_q8act(x.data(), T, st.view(), bias.data(), y.data());
    std::vector<double> bound;
    const auto want = oracle(x, T, st.view(), bias, &bound);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 4e-6 * bound[i] + 1e-7) << i;
  }
}

TEST(Q8ActRef, RefusesWeightsOffThePath) {
  const auto x = random_floats(64, 1);
  float y[4];
  const auto st16 = store_quant(random_floats(2 * 64, 2), 2, 64, DType::I8, 16, DType::F32);
  EXPECT_THROW(ref::matmul_q8act(x.data(), 1, st16.view(), nullptr, y), std::invalid_argument);
  WeightView f;
  f.dtype = DType::F32, f.data = x.data(), f.rows = 1, f.cols = 64;
  EXPECT_THROW(ref::matmul_q8act(x.data(), 1, f, nullptr, y), std::invalid_argument);
}

TEST(Q8ActDispatch, FlagSelectsThePathOnlyWhereTheGroupAllows) {
  const int64_t K = 96, N = 5;
  const auto x = random_floats(size_t(K), 4);
  for (int64_t G : {32, 16}) {
    SCOPED_TRACE("G=" + std::to_string(G));
    const auto st = store_quant(random_floats(size_t(N * K), 5), N, K, DType::U4, G, DType::F16);
    WeightView w = st.view();
    std::vector<float> exact(static_cast<size_t>(N)), flagged(exact), q8(exact);
    matmul(x.data(), 1, w, nullptr, exact.data());
    w.q8act = true;
    matmul(x.data(), 1, w, nullptr, flagged.data());
    if (G % 32 == 0) {
      matmul_q8act(x.data(), 1, w, nullptr, q8.data());
      EXPECT_EQ(flagged, q8);
      EXPECT_NE(flagged, exact);  // the activation rounding shows
    } else {
      EXPECT_EQ(flagged, exact);
    }
  }
}

}  // namespace
}  // namespace tinyloop::ops
