// silu_mul, gelu (both forms), relu_square and add against double formulas, including aliasing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::random_floats;

// Inputs span the interesting range of the activations (saturated both sides).
constexpr int64_t kN = 1001;

TEST(Activations, SiluMul) {
  const auto g = random_floats(kN, 1, -20.f, 20.f);
  const auto u = random_floats(kN, 2, -3.f, 3.f);
  std::vector<float> out(kN);
  silu_mul(g.data(), u.data(), kN, out.data());
  for (int64_t i = 0; i < kN; ++i) {
    const double ref = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
    // exp (libm, <= ~1 ulp) then an add, a divide and a multiply with no cancellation
    // (1 + e^-g > 0): a few u relative; 8u for margin.
    ASSERT_NEAR(out[i], ref, 8 * kU * std::fabs(ref) + 1e-38) << i;
  }
  // out aliasing either input.
  auto a = g;
  silu_mul(a.data(), u.data(), kN, a.data());
  auto b = u;
  silu_mul(g.data(), b.data(), kN, b.data());
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(a[i], out[i]);
    ASSERT_EQ(b[i], out[i]);
  }
}

TEST(Activations, GeluErfAndTanh) {
  const auto x0 = random_floats(kN, 3, -8.f, 8.f);
  for (bool approx : {false, true}) {
    auto x = x0;
    gelu(x.data(), kN, approx);
    for (int64_t i = 0; i < kN; ++i) {
      const double v = x0[i];
      const double ref = approx ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                                : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      // 1 + erf / 1 + tanh cancels for negative v (erf -> -1): the float erf/tanh error,
      // a few u absolute on a value near 1, is then absolute, not relative, so it scales
      // with 0.5 |v|. |err| <= ~4u (|ref| + |v|); 8u for margin.
      ASSERT_NEAR(x[i], ref, 8 * kU * (std::fabs(ref) + std::fabs(v))) << i << " " << approx;
    }
  }
  float z[3] = {0.f, -0.f, 1.f};
  gelu(z, 3, false);
  EXPECT_EQ(z[0], 0.f);
  EXPECT_NEAR(z[2], 0.8413447460685429, 1e-6);
}

TEST(Activations, ReluSquareIsOneRoundedProduct) {
  const auto x0 = random_floats(kN, 6, -8.f, 8.f);
  auto x = x0;
  relu_square(x.data(), kN);
  // max(v, 0) is exact, then one float multiply: the double square rounded to float.
  for (int64_t i = 0; i < kN; ++i) {
    const double r = x0[i] > 0 ? double(x0[i]) : 0.0;
    ASSERT_EQ(x[i], float(r * r)) << i;
  }
}

TEST(Activations, AddIsExactAndAliases) {
  const auto a = random_floats(kN, 4);
  const auto b = random_floats(kN, 5);
  std::vector<float> y(kN);
  add(a.data(), b.data(), kN, y.data());
  // One correctly rounded float add: equal to the double sum rounded to float.
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(y[i], float(double(a[i]) + double(b[i])));
  auto a2 = a, b2 = b;
  add(a2.data(), b.data(), kN, a2.data());
  add(a.data(), b2.data(), kN, b2.data());
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(a2[i], y[i]);
    ASSERT_EQ(b2[i], y[i]);
  }
}

}  // namespace
}  // namespace tinyloop::ops
