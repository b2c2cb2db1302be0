// Per-target SIMD helpers shared by the kernels: loading F32 / F16 / BF16 data as float
// vectors (full or a zero-padded tail), and a horizontal sum. Included once per Highway
// target (toggle guard), inside the kernels' own foreach_target translation units.
#if defined(TINYLOOP_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TINYLOOP_CPU_SIMD_INL_H_
#undef TINYLOOP_CPU_SIMD_INL_H_
#else
#define TINYLOOP_CPU_SIMD_INL_H_
#endif

#include <cstddef>
#include <cstring>

#include "hwy/highway.h"
#include "base/convert_inl.h"  // exact scalar F16 decode for targets without F16C

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) consecutive elements at p, widened to float. F16 uses the hardware conversion
// where the target has one (F16C on AVX2, AVX-512), BF16 a shift; both are exact.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const float* HWY_RESTRICT p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const hwy::float16_t* HWY_RESTRICT p) {
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || (HWY_ARCH_ARM && HWY_TARGET == HWY_NEON)
  const hn::Rebind<hwy::float16_t, DF> dh;  // half the bytes of a float vector
  return hn::PromoteTo(df, hn::LoadU(dh, p));
#else
  // No conversion instruction: Highway 1.0's software PromoteTo turns half inf / nan into
  // finite numbers, so use the exact branch-free decoder of the scalar reference instead.
  constexpr size_t kMax = hn::MaxLanes(DF());
  alignas(64) float tmp[kMax];  // [Lanes]
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(p);
  for (size_t i = 0; i < hn::Lanes(df); ++i) tmp[i] = ops::detail::half_to_float(bits[i]);
  return hn::Load(df, tmp);
#endif
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const hwy::bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::bfloat16_t, DF> db;
  return hn::PromoteTo(df, hn::LoadU(db, p));
}

// The first `rem` (< Lanes) elements at p widened to float, the other lanes 0. Goes through
// a zeroed stack copy, so it never reads past p + rem (the end of a row may be the end of
// the buffer). Every kernel loads its tails this way, so a tail element meets the same
// arithmetic as a full-vector one would: 0 * 0 terms add exactly +0 to an accumulator.
template <class DF, typename T>
HWY_INLINE hn::Vec<DF> LoadF32Tail(DF df, const T* HWY_RESTRICT p, size_t rem) {
  constexpr size_t kMax = hn::MaxLanes(DF());
  alignas(64) T pad[kMax];  // [Lanes]
  std::memset(static_cast<void*>(pad), 0, sizeof(pad));
  // rem < Lanes always; the clamp only tells the compiler (else -Wstringop-overflow).
  std::memcpy(static_cast<void*>(pad), p, HWY_MIN(rem, kMax) * sizeof(T));
  return LoadF32(df, pad);
}

// Sum of all lanes. The order is fixed per target (a tree), so equal inputs give equal sums.
template <class DF>
HWY_INLINE float ReduceSumF32(DF df, hn::Vec<DF> v) {
  return hn::GetLane(hn::SumOfLanes(df, v));
}

// out[0..3] = ReduceSumF32 of a, b, c, d, the same bits: on AVX-512 the four trees of
// _mm512_reduce_add_ps (what Highway's SumOfLanes is there: fold the 256-bit halves, then the
// 128-bit ones, then lanes 2 apart, then neighbours) run side by side in one register, 13
// instructions for the four instead of ~32; elsewhere four ReduceSumF32 calls. A matmul
// tile's outputs use it, a single output ReduceSumF32: batch invariance needs them equal
// (matmul_test checks every path against the others bit for bit).
template <class DF>
HWY_INLINE void ReduceSum4F32(DF df, hn::Vec<DF> a, hn::Vec<DF> b, hn::Vec<DF> c, hn::Vec<DF> d,
                              float* HWY_RESTRICT out) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(DF()) == 16) {
    // 128-bit blocks: a = [a0 a1 a2 a3]. ab = [a0+a2, a1+a3, b0+b2, b1+b3], likewise cd.
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a.raw, b.raw, 0x44), _mm512_shuffle_f32x4(a.raw, b.raw, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c.raw, d.raw, 0x44), _mm512_shuffle_f32x4(c.raw, d.raw, 0xEE));
    // One block per input: (x0+x2) + (x1+x3), as the 256 -> 128 fold.
    const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    const __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));  // lanes [0+2, 1+3, ..] per block
    const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));  // lane 0 of each block: its sum
    const __m512 sums = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u);
    _mm_storeu_ps(out, _mm512_castps512_ps128(sums));
    return;
  }
#endif
  out[0] = ReduceSumF32(df, a);
  out[1] = ReduceSumF32(df, b);
  out[2] = ReduceSumF32(df, c);
  out[3] = ReduceSumF32(df, d);
}

// Stores the first `rem` lanes of v to p (a row tail), touching nothing past p + rem.
template <class DF>
HWY_INLINE void StoreTail(DF df, hn::Vec<DF> v, float* HWY_RESTRICT p, size_t rem) {
  constexpr size_t kMax = hn::MaxLanes(DF());
  alignas(64) float pad[kMax];  // [Lanes]
  hn::Store(v, df, pad);
  std::memcpy(p, pad, HWY_MIN(rem, kMax) * sizeof(float));
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TINYLOOP_CPU_SIMD_INL_H_ toggle
