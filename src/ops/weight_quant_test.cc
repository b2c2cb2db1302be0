// The scalar reference on int8 / int4 weights: dequantization against the format's
// formula written out independently, matmul against a double loop over the dequantized
// weights, batch invariance, and the view checks.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "ops/ops.h"
#include "ops/reference.h"
#include "ops/test_util.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::name_of;
using testing::QCase;
using testing::random_floats;
using testing::store_quant;

// Odd K and G where the format allows (int4 needs both even); G = K (one scale a row) and
// the GGUF G = 32; F16 and F32 scales.
const QCase kCases[] = {
    {DType::I8, 67, 67, DType::F32}, {DType::I8, 129, 43, DType::F16}, {DType::I8, 96, 32, DType::F16},
    {DType::I8, 5, 1, DType::F32},   {DType::U4, 66, 66, DType::F32},  {DType::U4, 130, 26, DType::F16},
    {DType::U4, 96, 32, DType::F16}, {DType::U4, 2, 2, DType::F32},    {DType::U4, 160, 32, DType::F32},
};

class RefQuant : public ::testing::TestWithParam<QCase> {};

TEST_P(RefQuant, DequantizeIsTheFormula) {
  const QCase c = GetParam();
  const int64_t N = 5;
  const auto sq = store_quant(random_floats(size_t(N * c.K), 3), N, c.K, c.dtype, c.G, c.scale_dtype);
  std::vector<float> row(static_cast<size_t>(c.K));
  for (int64_t n = 0; n < N; ++n) {
    weight_row_to_f32(sq.view(), n, row.data());
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t g = n * (c.K / c.G) + k / c.G;
      const bool f16 = c.scale_dtype == DType::F16;
      const float s = f16 ? f16_to_f32(sq.s16[size_t(g)]) : sq.s32[size_t(g)];
      float want;
      if (c.dtype == DType::I8) {
        want = s * float(int8_t(sq.q[size_t(n * c.K + k)]));
      } else {
        const uint8_t byte = sq.q[size_t(n * c.K / 2 + k / 2)];
        const float q = float(k % 2 ? byte >> 4 : byte & 15);
        const float o = f16 ? f16_to_f32(sq.o16[size_t(g)]) : sq.o32[size_t(g)];
        const float p = s * q;
        want = p + o;
      }
      ASSERT_EQ(row[size_t(k)], want) << "n=" << n << " k=" << k;
    }
  }
}

TEST_P(RefQuant, QuantizationErrorIsHalfAStep) {
  // The test quantizer is round to nearest: a sanity check of the stored data itself.
  const QCase c = GetParam();
  const int64_t N = 4;
  const auto src = random_floats(size_t(N * c.K), 4);
  const auto sq = store_quant(src, N, c.K, c.dtype, c.G, c.scale_dtype);
  for (int64_t i = 0; i < N * c.K; ++i) {
    const int64_t g = (i / c.K) * (c.K / c.G) + (i % c.K) / c.G;
    const double s = c.scale_dtype == DType::F16 ? f16_to_f32(sq.s16[size_t(g)]) : sq.s32[size_t(g)];
    ASSERT_LE(std::fabs(sq.decoded[size_t(i)] - src[size_t(i)]), 0.5 * s + 2e-3) << i;
  }
}

TEST_P(RefQuant, MatmulAgainstDouble) {
  const QCase c = GetParam();
  uint32_t seed = 10;
  for (int64_t T : {1, 3, 7})
    for (int64_t N : {1, 3, 67})
      for (bool with_bias : {false, true}) {
        const auto x = random_floats(size_t(T * c.K), seed++);
        const auto sq = store_quant(random_floats(size_t(N * c.K), seed++), N, c.K, c.dtype, c.G, c.scale_dtype);
        const auto b = random_floats(size_t(N), seed++);
        const float* bias = with_bias ? b.data() : nullptr;
        std::vector<float> y(size_t(T * N), NAN);
        ref::matmul(x.data(), T, sq.view(), bias, y.data());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < N; ++n) {
            double want = bias ? bias[n] : 0.0, mag = bias ? std::fabs(bias[n]) : 0.0;
            for (int64_t k = 0; k < c.K; ++k) {
              const double p = double(x[size_t(t * c.K + k)]) * sq.decoded[size_t(n * c.K + k)];
              want += p, mag += std::fabs(p);
            }
            // The float dot product bound of matmul_test.cc, on the exactly decoded weights.
            ASSERT_NEAR(y[size_t(t * N + n)], want, 1.01 * double(c.K + 2) * kU * mag)
                << name_of(c) << " T=" << T << " N=" << N << " t=" << t << " n=" << n;
          }
      }
}

TEST_P(RefQuant, RowResultIndependentOfBatch) {
  const QCase c = GetParam();
  const int64_t T = 6, N = 67;
  const auto x = random_floats(size_t(T * c.K), 5);
  const auto sq = store_quant(random_floats(size_t(N * c.K), 6), N, c.K, c.dtype, c.G, c.scale_dtype);
  std::vector<float> y(static_cast<size_t>(T * N)), y1(static_cast<size_t>(N));
  ref::matmul(x.data(), T, sq.view(), nullptr, y.data());
  for (int64_t t = 0; t < T; ++t) {
    ref::matmul(x.data() + t * c.K, 1, sq.view(), nullptr, y1.data());
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(y[size_t(t * N + n)], y1[size_t(n)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, RefQuant, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return name_of(info.param); });

TEST(RefQuantView, BadLayoutThrows) {
  const auto sq = store_quant(random_floats(40, 1), 2, 20, DType::U4, 10);
  float x[20] = {}, y[2];
  WeightView w = sq.view();
  w.group = 3;  // does not divide 20
  EXPECT_THROW(matmul(x, 1, w, nullptr, y), std::invalid_argument);
  w = sq.view();
  w.group = 5;  // odd for int4
  EXPECT_THROW(matmul(x, 1, w, nullptr, y), std::invalid_argument);
  w = sq.view();
  w.offsets = nullptr;
  EXPECT_THROW(matmul(x, 1, w, nullptr, y), std::invalid_argument);
  set_force_scalar(true);
  EXPECT_THROW(matmul(x, 1, w, nullptr, y), std::invalid_argument);
  set_force_scalar(false);
}

}  // namespace
}  // namespace tinyloop::ops
