// cpu::rope against the scalar reference (ops::ref::rope), bit for bit on every compiled
// target: both layouts, odd half sizes (vector tails), odd head counts, several thetas,
// positions 0 .. 2^20 and negative ones, repeated positions; the per-thread cos/sin cache
// (hits, collisions of positions kRopeSlots apart, a theta / head_dim change) gives the same
// bits as a fresh computation; the dispatch routes to it; an odd head_dim throws.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "ops/ops.h"
#include "ops/reference.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::RopeLayout;
using ops::testing::random_floats;

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << what << " i=" << i;
}

TEST(CpuRope, BitIdenticalToReference) {
  const std::vector<int64_t> pos = {0, 1, 2, 17, 17, 4095, 4096, 4097, 8192 + 5, 100000, 1 << 20, -3};
  const int64_t T = int64_t(pos.size());
  testing::for_each_target([&] {
    for (RopeLayout layout : {RopeLayout::Half, RopeLayout::Interleaved})
      for (float theta : {10000.f, 500000.f, 1e6f})
        for (int64_t hd : {2, 6, 10, 34, 64, 66, 128, 130})
          for (int64_t H : {1, 3, 7}) {
            const auto x0 = random_floats(size_t(T * H * hd), uint32_t(hd * 7 + H), -3.f, 3.f);
            auto got = x0, want = x0;
            cpu::rope(got.data(), T, H, hd, pos.data(), theta, layout);
            ops::ref::rope(want.data(), T, H, hd, pos.data(), theta, layout);
            SCOPED_TRACE(::testing::Message() << "hd=" << hd << " H=" << H << " theta=" << theta
                                              << " interleaved=" << (layout == RopeLayout::Interleaved));
            expect_bits_equal(got, want, "first call");
            // Again: every row now comes from the cache (and 4096 / 8197 collided with
            // 0 / 5 on the way in).
            got = x0;
            cpu::rope(got.data(), T, H, hd, pos.data(), theta, layout);
            expect_bits_equal(got, want, "cached");
            if (HasFatalFailure()) return;
          }
  });
}

// Rows one at a time (decode) == all rows at once (prefill), whatever the cache holds.
TEST(CpuRope, RowByRowEqualsBatch) {
  const int64_t T = 40, H = 5, hd = 48;
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = 3 * t + 1;
  const auto x0 = random_floats(size_t(T * H * hd), 5);
  auto all = x0, one = x0;
  cpu::rope(all.data(), T, H, hd, pos.data(), 10000.f, RopeLayout::Half);
  cpu::rope(one.data(), 1, H, 18, pos.data(), 10000.f, RopeLayout::Half);  // rekeys the cache
  one = x0;
  for (int64_t t = T - 1; t >= 0; --t)
    cpu::rope(one.data() + t * H * hd, 1, H, hd, &pos[size_t(t)], 10000.f, RopeLayout::Half);
  expect_bits_equal(one, all, "row by row");
}

TEST(CpuRope, DispatchUsesItAndOddHeadDimThrows) {
  const int64_t pos[2] = {5, 9};
  const auto x0 = random_floats(2 * 2 * 8, 6);
  auto a = x0, b = x0;
  ops::rope(a.data(), 2, 2, 8, pos, 10000.f, RopeLayout::Interleaved);
  cpu::rope(b.data(), 2, 2, 8, pos, 10000.f, RopeLayout::Interleaved);
  expect_bits_equal(a, b, "dispatch");
  EXPECT_NE(a, x0);
  std::vector<float> odd(2 * 7);
  EXPECT_THROW(cpu::rope(odd.data(), 1, 2, 7, pos, 10000.f, RopeLayout::Half), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::cpu
