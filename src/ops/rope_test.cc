// RoPE against a double rotation using the same double angle formula, both layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::random_floats;

// Reference pair index of element j for each layout: (lo, hi) indices of pair i.
std::pair<int64_t, int64_t> pair_of(RopeLayout l, int64_t i, int64_t hd) {
  return l == RopeLayout::Half ? std::pair{i, i + hd / 2} : std::pair{2 * i, 2 * i + 1};
}

TEST(Rope, AgainstDouble) {
  const std::vector<int64_t> pos = {0, 1, 17, 4095, 100000, 1 << 20};
  const int64_t T = int64_t(pos.size());
  for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved})
    for (float theta : {10000.f, 500000.f})
      for (int64_t hd : {2, 6, 64})
        for (int64_t H : {1, 3}) {
          const auto x0 = random_floats(size_t(T * H * hd), uint32_t(hd * 7 + H));
          auto x = x0;
          rope(x.data(), T, H, hd, pos.data(), theta, layout);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < hd / 2; ++i) {
                const double a = std::pow(double(theta), -2.0 * double(i) / double(hd)) * double(pos[t]);
                const auto [j0, j1] = pair_of(layout, i, hd);
                const int64_t base = (t * H + h) * hd;
                const double u = x0[base + j0], v = x0[base + j1];
                const double r0 = u * std::cos(a) - v * std::sin(a);
                const double r1 = v * std::cos(a) + u * std::sin(a);
                // cos and sin each rounded to float (u relative), two float products and a
                // float add: |err| <= ~3u (|u| + |v|); 4u for margin.
                const double tol = 4 * kU * (std::fabs(u) + std::fabs(v));
                ASSERT_NEAR(x[base + j0], r0, tol) << "t=" << t << " i=" << i << " hd=" << hd;
                ASSERT_NEAR(x[base + j1], r1, tol) << "t=" << t << " i=" << i << " hd=" << hd;
              }
        }
}

TEST(Rope, PositionZeroIsIdentity) {
  const auto x0 = random_floats(2 * 8, 3);
  auto x = x0;
  const int64_t pos = 0;
  rope(x.data(), 1, 2, 8, &pos, 10000.f, RopeLayout::Half);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], x0[i]);
}

TEST(Rope, LayoutsArePermutationsOfEachOther) {
  // Interleaved on a vector whose pairs were moved to (2i, 2i+1) equals Half, bit for bit.
  const int64_t hd = 10, half = hd / 2;
  const auto a0 = random_floats(size_t(hd), 4);
  std::vector<float> a = a0, b(static_cast<size_t>(hd));
  for (int64_t i = 0; i < half; ++i) b[2 * i] = a0[i], b[2 * i + 1] = a0[i + half];
  const int64_t pos = 123;
  rope(a.data(), 1, 1, hd, &pos, 10000.f, RopeLayout::Half);
  rope(b.data(), 1, 1, hd, &pos, 10000.f, RopeLayout::Interleaved);
  for (int64_t i = 0; i < half; ++i) {
    EXPECT_EQ(a[i], b[2 * i]);
    EXPECT_EQ(a[i + half], b[2 * i + 1]);
  }
}

}  // namespace
}  // namespace tinyloop::ops
