// Internal to the ops and the CPU kernels (bottom layer, src/base): inline, branch-free
// scalar conversions and row converters.
// The public out-of-line functions in dtype.h wrap these; the kernels (matmul, attention)
// include this header instead so the per-element conversion inlines into their row loops
// and GCC can vectorize it (a call per element into dtype.cc could not be).
#pragma once
#include <bit>
#include <cstdint>

namespace tinyloop::ops::detail {

// IEEE binary16 -> binary32, exact for every bit pattern. Written with masks rather than
// branches or ?: (GCC does not if-convert a chain of them here) so that a loop over a row
// vectorizes; the compares are on values < 2^31 written as signed, which SSE2 has natively.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const int32_t em = int32_t(uint32_t(h & 0x7fffu) << 13);  // exponent + mantissa at f32 places
  // Normal: rebias the exponent 15 -> 127. Inf / nan (half exponent 31): rebias by the same
  // amount once more, so 31 lands on 255 with the payload kept; a nan is made quiet (as the
  // F16C instruction and libgcc's __extendhfsf2 both do).
  const uint32_t m_infnan = 0u - uint32_t(em >= 0x0f800000);
  uint32_t r = uint32_t(em) + (112u << 23) + (m_infnan & (112u << 23));
  r |= uint32_t(em > 0x0f800000) << 22;
  // Zero / subnormal (half exponent 0): value = mant * 2^-24. Build 2^-14 * (1 + mant/1024)
  // and subtract 2^-14; the difference is exactly representable (a small f32 normal), so
  // nothing rounds, no clz is needed, and no f32 subnormal is touched (DAZ/FTZ-safe).
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(uint32_t(em) + (113u << 23)) - std::bit_cast<float>(113u << 23));
  const uint32_t m_sub = 0u - uint32_t(em < 0x00800000);
  r = (sub & m_sub) | (r & ~m_sub);
  return std::bit_cast<float>(r | sign);
}

// binary32 -> binary16, round to nearest, ties to even; overflow -> inf; tiny -> signed zero;
// nan -> quiet nan keeping the top payload bits and the sign.
inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) {  // inf or nan
    if (a == 0x7f800000u) return sign | 0x7c00u;
    return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  }
  const int32_t exp = int32_t(a >> 23);  // biased f32 exponent, 0..254
  const int32_t e16 = exp - 127 + 15;  // biased half exponent if the value were normal
  if (e16 >= 31) return sign | 0x7c00u;  // >= 65536: past every finite half, even rounded
  if (e16 <= 0) {
    // Half subnormal (or zero) result: mant16 = m * 2^(exp - 150 + 24) = m >> (126 - exp).
    // shift is 14 (exp 112) .. 24 (exp 102, values in [2^-25, 2^-24), which round to 0 or
    // to the smallest subnormal); below that everything (f32 subnormals too) rounds to 0.
    const int32_t shift = 126 - exp;
    if (shift > 24) return sign;
    const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;  // a carry into 0x400 is the
    return uint16_t(sign | r);  // smallest normal: correct
  }
  uint32_t r = (uint32_t(e16) << 10) | ((a >> 13) & 0x03ffu);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // carry may bump the exponent,
  return uint16_t(sign | r);  // up to 0x7c00 = inf: correct
}

// bfloat16 is the top half of a float.
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// float -> bfloat16, round to nearest even by the bias trick: adding 0x7fff plus the lsb of
// the kept half carries into the kept half exactly when the dropped half is above halfway,
// or exactly halfway with an odd kept half. Overflow rounds to inf as it should. A nan is
// handled first (the bias could carry a nan's payload into the exponent... or to inf) and
// kept a quiet nan with its sign.
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// out[n] = decode(in[n]) for a row of stored weights / KV.
inline void half_row_to_float(const uint16_t* in, int64_t n, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}
inline void bf16_row_to_float(const uint16_t* in, int64_t n, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}

}  // namespace tinyloop::ops::detail
