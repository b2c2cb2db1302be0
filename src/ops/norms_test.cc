// rmsnorm / layernorm against double loops, with and without bias, and in place (y == x).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::random_floats;

// Inputs are O(1) with a nonzero mean (offset 0.5) so layernorm's centring matters.
// Error model (float, D terms): the sum of squares / deviations is off by <= gamma_D
// relative, sqrt halves that, and a handful of roundings follow (mean, divide, eps add,
// two or three multiplies, the bias add); layernorm's mean error moves every element by
// about D u max|x| * inv. So |err| <= (D + 8) u (|ref| + max|x| inv |w| + |b|), used with a
// factor 2 margin.
constexpr float kEps = 1e-5f;

TEST(Norms, RmsNormAgainstDouble) {
  for (int64_t T : {1, 3})
    for (int64_t D : {1, 5, 64, 129}) {
      const auto x = random_floats(size_t(T * D), uint32_t(D), -1.5f, 2.5f);
      const auto w = random_floats(size_t(D), uint32_t(D + 100), -2.f, 2.f);
      std::vector<float> y(x.size());
      rmsnorm(x.data(), T, D, w.data(), kEps, y.data());
      for (int64_t t = 0; t < T; ++t) {
        double ss = 0;
        for (int64_t i = 0; i < D; ++i) ss += double(x[t * D + i]) * x[t * D + i];
        const double inv = 1.0 / std::sqrt(ss / double(D) + kEps);
        for (int64_t i = 0; i < D; ++i) {
          const double ref = double(x[t * D + i]) * inv * w[i];
          const double tol = 2.0 * double(D + 8) * kU * std::fabs(ref);
          ASSERT_NEAR(y[t * D + i], ref, tol) << "T=" << T << " D=" << D << " i=" << i;
        }
      }
      // In place gives the same bits.
      auto z = x;
      rmsnorm(z.data(), T, D, w.data(), kEps, z.data());
      for (size_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], y[i]);
    }
}

TEST(Norms, LayerNormAgainstDouble) {
  for (bool with_bias : {false, true})
    for (int64_t T : {1, 3})
      for (int64_t D : {1, 5, 64, 129}) {
        const auto x = random_floats(size_t(T * D), uint32_t(D + 1), -1.5f, 2.5f);
        const auto w = random_floats(size_t(D), uint32_t(D + 200), -2.f, 2.f);
        const auto bv = random_floats(size_t(D), uint32_t(D + 300), -1.f, 1.f);
        const float* b = with_bias ? bv.data() : nullptr;
        std::vector<float> y(x.size());
        layernorm(x.data(), T, D, w.data(), b, kEps, y.data());
        for (int64_t t = 0; t < T; ++t) {
          double s = 0, mx = 0;
          for (int64_t i = 0; i < D; ++i) {
            s += x[t * D + i];
            mx = std::max(mx, std::fabs(double(x[t * D + i])));
          }
          const double mean = s / double(D);
          double v = 0;
          for (int64_t i = 0; i < D; ++i) v += (x[t * D + i] - mean) * (x[t * D + i] - mean);
          const double inv = 1.0 / std::sqrt(v / double(D) + kEps);
          for (int64_t i = 0; i < D; ++i) {
            const double bi = b ? b[i] : 0.0;
            const double ref = (x[t * D + i] - mean) * inv * w[i] + bi;
            const double tol = 2.0 * double(D + 8) * kU * (std::fabs(ref) + mx * inv * std::fabs(w[i]) + std::fabs(bi));
            ASSERT_NEAR(y[t * D + i], ref, tol) << "T=" << T << " D=" << D << " i=" << i << " bias=" << with_bias;
          }
        }
        auto z = x;
        layernorm(z.data(), T, D, w.data(), b, kEps, z.data());
        for (size_t i = 0; i < z.size(); ++i) ASSERT_EQ(z[i], y[i]);
      }
}

TEST(Norms, LayerNormLargeMeanIsStable) {
  // |mean| >> std: a one-pass E[x^2] - mean^2 would lose every digit here.
  const int64_t D = 64;
  std::vector<float> x(D), w(D, 1.f), y(D);
  for (int64_t i = 0; i < D; ++i) x[i] = 1000.f + ((i % 2) ? 0.01f : -0.01f);
  layernorm(x.data(), 1, D, w.data(), nullptr, 0.f, y.data());
  for (int64_t i = 0; i < D; ++i) EXPECT_NEAR(std::fabs(y[i]), 1.0, 1e-3) << i;
}

}  // namespace
}  // namespace tinyloop::ops
