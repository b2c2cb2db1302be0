// Conversions: f16 against GCC's _Float16 casts (an independent implementation: libgcc's
// soft-fp __extendhfsf2 / __truncsfhf2, or F16C instructions), exhaustively for half ->
// float and on a large sweep plus every rounding boundary for float -> half. bf16 against a
// long-hand round-to-nearest-even written here and against "nearest value" in double.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "base/dtype.h"

namespace tinyloop::ops {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_STREQ(dtype_name(DType::F32), "F32");
  EXPECT_STREQ(dtype_name(DType::F16), "F16");
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
}

#if defined(__FLT16_MAX__)
#define TINYLOOP_HAVE_FLOAT16 1
// noinline + volatile-free runtime values keep GCC from constant-folding the oracle with
// its own (host, MPFR) arithmetic; either way it is independent of our code.
[[gnu::noinline]] float oracle_h2f(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
[[gnu::noinline]] uint16_t oracle_f2h(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }
#endif

TEST(F16, HalfToFloatAllPatterns) {
#ifndef TINYLOOP_HAVE_FLOAT16
  GTEST_SKIP() << "no _Float16 oracle on this compiler/target";
#else
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float ours = f16_to_f32(uint16_t(h));
    const float ref = oracle_h2f(uint16_t(h));
    // Bit-exact, nans included (both quiet a signalling nan and keep the payload).
    if (bits(ours) != bits(ref) && ++bad <= 10)
      ADD_FAILURE() << std::hex << "h=0x" << h << " ours=0x" << bits(ours) << " ref=0x" << bits(ref);
  }
  EXPECT_EQ(bad, 0);
#endif
}

TEST(F16, RoundTripEveryHalf) {
  // float -> half of an exactly representable value must give it back; a nan stays a nan
  // of the same sign (quieted).
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
    const uint16_t back = f32_to_f16(f16_to_f32(uint16_t(h)));
    if (nan) {
      EXPECT_EQ(back, uint16_t(h | 0x0200u)) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

#ifdef TINYLOOP_HAVE_FLOAT16
// Compare one float pattern; count and report the first few mismatches.
void check_f2h(uint32_t u, int& bad) {
  const float f = from_bits(u);
  const uint16_t ours = f32_to_f16(f);
  const uint16_t ref = oracle_f2h(f);
  if (ours != ref && ++bad <= 10)
    ADD_FAILURE() << std::hex << "f=0x" << u << " (" << f << ") ours=0x" << ours << " ref=0x" << ref;
}
#endif

TEST(F16, FloatToHalfSweep) {
#ifndef TINYLOOP_HAVE_FLOAT16
  GTEST_SKIP() << "no _Float16 oracle on this compiler/target";
#else
  int bad = 0;
  // Every 2^9-th pattern (8M: all exponents and signs, high mantissa bits) ...
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 1u << 9) check_f2h(uint32_t(u), bad);
  // ... and a prime stride, so the low (rounded-away) mantissa bits take varied values too.
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 509) check_f2h(uint32_t(u), bad);
  EXPECT_EQ(bad, 0);
#endif
}

TEST(F16, FloatToHalfAllHalfwayCases) {
#ifndef TINYLOOP_HAVE_FLOAT16
  GTEST_SKIP() << "no _Float16 oracle on this compiler/target";
#else
  int bad = 0;
  // For every pair of adjacent non-negative halves (subnormals, normals, and the last
  // finite 65504 vs the overflow threshold 65536), the exact midpoint is a float (12
  // significant bits); check it and the float patterns 1..3 ulps either side, both signs.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double a = f16_to_f32(uint16_t(h));
    const double b = h + 1 == 0x7c00u ? 65536.0 : double(f16_to_f32(uint16_t(h + 1)));
    const float mid = float((a + b) / 2);
    ASSERT_EQ(double(mid), (a + b) / 2);  // exact
    for (int d = -3; d <= 3; ++d) {
      const uint32_t u = bits(mid) + uint32_t(d);
      check_f2h(u, bad);
      check_f2h(u | 0x80000000u, bad);
    }
  }
  // The underflow edge: 2^-25 (tie between 0 and the smallest subnormal) and around it,
  // f32 subnormals, and the largest floats.
  for (uint32_t u : {0x33000000u, 0x32ffffffu, 0x33000001u, 0x00000001u, 0x007fffffu, 0x7f7fffffu, 0x477fefffu,
                     0x477ff000u, 0x477ff001u})
    for (uint32_t s : {0u, 0x80000000u}) check_f2h(u | s, bad);
  EXPECT_EQ(bad, 0);
#endif
}

TEST(F16, Specials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(0.f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // tie rounds to even = inf
  EXPECT_EQ(f32_to_f16(1e-8f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);  // tie to even 0
  EXPECT_EQ(f32_to_f16(std::ldexp(3.f, -25)), 0x0002);  // tie to even 2
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.f, -24));
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.f, -24));
  EXPECT_EQ(f16_to_f32(0x3c00), 1.f);
  EXPECT_EQ(f16_to_f32(0xfc00), -inf);
  // nan -> nan with sign kept, quiet, payload top bits kept.
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0xffc12345u}) {
    const uint16_t h = f32_to_f16(from_bits(u));
    EXPECT_EQ(h & 0x7e00u, 0x7e00u) << std::hex << u;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
    EXPECT_TRUE(std::isnan(f16_to_f32(h)));
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xfe00)));
}

// ---- bf16 ----

// Long-hand round to nearest even on the dropped 16 bits (no bias trick).
uint16_t longhand_bf16(uint32_t x) {
  uint32_t hi = x >> 16;
  const uint32_t lo = x & 0xffffu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi += 1;  // may carry into the exponent
  return uint16_t(hi);
}

void check_bf16(uint32_t x) {
  const float f = from_bits(x);
  const uint16_t ours = f32_to_bf16(f);
  if (std::isnan(f)) {
    // A nan stays a nan (the long-hand rounding could carry it to inf or zero payload).
    ASSERT_TRUE(std::isnan(bf16_to_f32(ours))) << std::hex << x;
    ASSERT_EQ(ours & 0x8000u, (x >> 16) & 0x8000u) << std::hex << x;
    return;
  }
  ASSERT_EQ(ours, longhand_bf16(x)) << std::hex << x;
  // And by value: no bf16 neighbour is closer (in double), ties have an even mantissa.
  if (std::isinf(bf16_to_f32(ours))) {
    // IEEE overflow: round as if the exponent were unbounded; 2^128 is the next "value"
    // after the largest finite bf16 (0x7f7f), so the tie 0x7f7f8000 and above go to inf.
    ASSERT_GE(std::fabs(f), from_bits(0x7f7f8000u)) << std::hex << x;
    return;
  }
  const double r = bf16_to_f32(ours);
  const double err = std::fabs(r - double(f));
  for (int d : {-1, 1}) {
    const uint16_t nb = uint16_t(ours + d);
    const float nv = bf16_to_f32(nb);
    if (std::isnan(nv) || (nb & 0x7fffu) == 0 || ((nb ^ ours) & 0x8000u)) continue;
    const double nerr = std::isinf(nv) ? INFINITY : std::fabs(double(nv) - double(f));
    ASSERT_LE(err, nerr) << std::hex << x;
    if (err == nerr) {
      ASSERT_EQ(ours & 1u, 0u) << std::hex << x;
    }
  }
}

TEST(BF16, WidenIsExactShift) {
  for (uint32_t h = 0; h < 65536; ++h) ASSERT_EQ(bits(bf16_to_f32(uint16_t(h))), h << 16);
}

TEST(BF16, NarrowEveryUpperHalfWithBoundaryLowHalves) {
  // The result depends on the upper 16 bits and on how the lower 16 compare with 0x8000
  // (and on the lsb of the upper half), so all upper halves x these low halves cover every
  // case, including every exact tie and the overflow to inf from the largest floats.
  std::mt19937 rng(7);
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, uint32_t(rng() & 0xffffu)})
      check_bf16((hi << 16) | lo);
  }
}

TEST(BF16, NarrowStrideSweep) {
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) check_bf16(uint32_t(u));
}

TEST(BF16, Specials) {
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  // A nan whose payload lives only in the low 16 bits must not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xffffffffu)))));
  EXPECT_EQ(f32_to_bf16(1.f), 0x3f80);
}

}  // namespace
}  // namespace tinyloop::ops
