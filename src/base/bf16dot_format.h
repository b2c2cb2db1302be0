// The packed weight layout and the input rounding of the reduced-precision matmul
// (ops/matmul_bf16dot.h has the arithmetic and the layout's description). Inline and in the
// bottom layer so the packer, the scalar reference (src/ops) and the SIMD kernels (src/cpu)
// share one definition.
#pragma once
#include <bit>
#include <cstdint>

namespace tinyloop::ops {

constexpr int64_t kBf16DotPanel = 64;  // output columns per packed panel

// uint32 words of a packed [N, K] weight.
inline int64_t bf16dot_packed_words(int64_t N, int64_t K) {
  return (N + kBf16DotPanel - 1) / kBf16DotPanel * kBf16DotPanel * ((K + 1) / 2);
}

// float -> bf16 as the spec rounds x and the weights: a subnormal (|f| < 2^-126) becomes a
// signed zero, then round to nearest even by the bias trick (base/convert_inl.h); nan stays a
// quiet nan, overflow rounds to inf. Selects instead of branches so a row loop vectorizes
// (x is rounded on every call: T * K values).
inline uint16_t round_bf16_ftz(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f), a = u & 0x7fffffffu;
  const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t r = a > 0x7f800000u ? (u >> 16) | 0x0040u : rne;
  return uint16_t(a < 0x00800000u ? (u >> 16) & 0x8000u : r);
}

// x[T, K] -> xp[T, ceil(K / 2)]: each row rounded by round_bf16_ftz and paired as the packed
// weights are (even column in the low half; past an odd K the high half is zero).
inline void round_rows_bf16dot(const float* x, int64_t T, int64_t K, uint32_t* xp) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * K;  // [K]
    uint32_t* out = xp + t * K2;  // [K2]
#pragma omp simd
    for (int64_t i = 0; i < K / 2; ++i)
      out[i] = uint32_t(round_bf16_ftz(xr[2 * i])) | uint32_t(round_bf16_ftz(xr[2 * i + 1])) << 16;
    if (K % 2) out[K2 - 1] = round_bf16_ftz(xr[K - 1]);
  }
}

constexpr int64_t kBf16DotAmxPairs = 16;  // pairs per TDPBF16PS step (one 64-byte tile row)

}  // namespace tinyloop::ops
