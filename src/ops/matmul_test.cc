// matmul / weight_row_to_f32 against a naive double loop over the same (decoded) weights.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "ops/ops.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::random_floats;
using testing::store_weight;

// Naive y = x W^T + b in double, and sum |x_k w_k| + |b| per output for the error bound.
//   x [T, K], w [N, K] (decoded), bias [N] or null, y / mag [T, N]
void oracle(const std::vector<float>& x, int64_t T, const std::vector<double>& w, int64_t N, int64_t K,
            const float* bias, std::vector<double>& y, std::vector<double>& mag) {
  y.assign(size_t(T * N), 0.0);
  mag.assign(size_t(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(x[size_t(t * K + k)]) * w[size_t(n * K + k)];
        s += p;
        m += std::fabs(p);
      }
      if (bias) {
        s += bias[n];
        m += std::fabs(bias[n]);
      }
      y[size_t(t * N + n)] = s;
      mag[size_t(t * N + n)] = m;
    }
}

void run_case(int64_t T, int64_t K, int64_t N, DType dt, bool with_bias, uint32_t seed) {
  const auto x = random_floats(size_t(T * K), seed);
  const auto sw = store_weight(random_floats(size_t(N * K), seed + 1), N, K, dt);
  const auto b = random_floats(size_t(N), seed + 2);
  const float* bias = with_bias ? b.data() : nullptr;
  std::vector<float> y(size_t(T * N), NAN);
  matmul(x.data(), T, sw.view(), bias, y.data());
  std::vector<double> ref, mag;
  oracle(x, T, sw.decoded, N, K, bias, ref, mag);
  for (int64_t i = 0; i < T * N; ++i) {
    // Float dot product of K terms, in any summation order (the kernel's vector lanes
    // reorder it), plus the bias add: |error| <= gamma_{K+2} * (sum |x_k w_k| + |b|), with
    // gamma_n ~= n u (Higham, Accuracy and Stability, 3.1). The decoded weights are exact
    // in float, so F16/BF16 add nothing. A 1% margin for the gamma_n higher-order term.
    const double tol = 1.01 * double(K + 2) * kU * mag[size_t(i)];
    ASSERT_NEAR(y[size_t(i)], ref[size_t(i)], tol)
        << "T=" << T << " K=" << K << " N=" << N << " dtype=" << dtype_name(dt) << " bias=" << with_bias << " i=" << i;
  }
}

class MatmulShapes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulShapes, OddSizesAgainstDouble) {
  uint32_t seed = 1;
  for (int64_t T : {1, 3, 7})
    for (int64_t K : {1, 5, 63, 129})
      for (int64_t N : {1, 3, 67})
        for (bool b : {false, true}) run_case(T, K, N, GetParam(), b, seed += 3);
}

TEST_P(MatmulShapes, BlockingEdges) {
  // x split into two row blocks (256 KiB / (4 * 768) = 85 rows), several weight blocks with
  // a ragged last one; and K so large the weight block is one micro-kernel group.
  run_case(90, 768, 70, GetParam(), true, 11);
  run_case(5, 5000, 9, GetParam(), false, 12);
}

TEST_P(MatmulShapes, RowResultIndependentOfBatch) {
  // Each output element comes from the same kernel code whatever T and N are, so a batch
  // row equals that row computed alone, bit for bit (prefill == decode).
  const int64_t T = 7, K = 129, N = 67;
  const auto x = random_floats(size_t(T * K), 5);
  const auto sw = store_weight(random_floats(size_t(N * K), 6), N, K, GetParam());
  const auto b = random_floats(size_t(N), 7);
  std::vector<float> y(static_cast<size_t>(T * N)), y1(static_cast<size_t>(N));
  matmul(x.data(), T, sw.view(), b.data(), y.data());
  for (int64_t t = 0; t < T; ++t) {
    matmul(x.data() + t * K, 1, sw.view(), b.data(), y1.data());
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(y[size_t(t * N + n)], y1[size_t(n)]);
  }
}

TEST_P(MatmulShapes, WeightRowToF32) {
  const int64_t N = 5, K = 67;
  const auto sw = store_weight(random_floats(size_t(N * K), 9), N, K, GetParam());
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    weight_row_to_f32(sw.view(), n, row.data());
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(double(row[size_t(k)]), sw.decoded[size_t(n * K + k)]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, MatmulShapes, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Matmul, EmptyK) {
  WeightView w;
  w.rows = 3;
  w.cols = 0;
  const float b[3] = {1, 2, 3};
  float y[6];
  matmul(nullptr, 2, w, b, y);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], b[i % 3]);
}

}  // namespace
}  // namespace tinyloop::ops
