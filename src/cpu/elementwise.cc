// SIMD RMSNorm, SiLU-gate and residual add. A big call (a prefill piece, a big batch) is split
// across the pool in row / whole-vector chunks; small ones (decode) run on the calling thread,
// where waking the workers would cost more.
//
// Tails go through the same vector code as full vectors (zero-padded load, partial store),
// so element i gets the same arithmetic wherever it falls: a flattened [T * F] call treats a
// row exactly as a [F] call would (batch invariance). RMSNorm reduces each row on its own.
#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"
#include "cpu/matmul_split.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x [T, D], w [D], y [T, D] (y == x allowed: a row's sum is complete before it is written).
void RmsNorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * D;  // [D]
    float* yr = y + t * D;  // [D]
    V ss = hn::Zero(df);
    int64_t i = 0;
    for (; i + L <= D; i += L) {
      const V v = hn::LoadU(df, xr + i);
      ss = hn::MulAdd(v, v, ss);
    }
    if (i < D) {
      const V v = LoadF32Tail(df, xr + i, size_t(D - i));
      ss = hn::MulAdd(v, v, ss);
    }
    // As the reference (HF LlamaRMSNorm): (x * rsqrt(mean + eps)) * w, in float.
    const V inv = hn::Set(df, 1.f / std::sqrt(ReduceSumF32(df, ss) / float(D) + eps));
    for (i = 0; i + L <= D; i += L)
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, xr + i), inv), hn::LoadU(df, w + i)), df, yr + i);
    if (i < D) {
      const size_t rem = size_t(D - i);
      const V v = hn::Mul(hn::Mul(LoadF32Tail(df, xr + i, rem), inv), LoadF32Tail(df, w + i, rem));
      StoreTail(df, v, yr + i, rem);
    }
  }
}

// silu(g) * u = g / (1 + e^-g) * u, lane-wise. e^-g is clamped at e^88 (below FLT_MAX, and
// inside the vector Exp's range): for g < -88 the exact result is below 1e-36 in magnitude,
// and the clamped one is too, so nothing visible changes while inf never reaches Exp.
template <class DF>
HWY_INLINE hn::Vec<DF> SiluMul(DF df, hn::Vec<DF> g, hn::Vec<DF> u) {
  const auto e = hn::Exp(df, hn::Min(hn::Neg(g), hn::Set(df, 88.f)));
  return hn::Mul(hn::Div(g, hn::Add(hn::Set(df, 1.f), e)), u);
}

// gate [n], up [n], out [n] (out may be gate or up: each element is read before written).
void SiluMulN(const float* gate, const float* up, int64_t n, float* out) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(SiluMul(df, hn::LoadU(df, gate + i), hn::LoadU(df, up + i)), df, out + i);
  if (i < n) {
    const size_t rem = size_t(n - i);
    StoreTail(df, SiluMul(df, LoadF32Tail(df, gate + i, rem), LoadF32Tail(df, up + i, rem)), out + i, rem);
  }
}

// a [n], b [n], y [n] (y may be a or b).
void AddN(const float* a, const float* b, int64_t n, float* y) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(df, a + i), hn::LoadU(df, b + i)), df, y + i);
  for (; i < n; ++i) y[i] = a[i] + b[i];  // one correctly rounded add: same bits as a lane
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(RmsNorm);
HWY_EXPORT(SiluMulN);
HWY_EXPORT(AddN);

namespace {
// Elements of a task: a multiple of every vector width, so that only the last chunk of a flat
// call has a tail, and each element's arithmetic is the same whatever the split. Splitting
// is the matmul driver's (for_row_chunks: one task below kMinParallelMacs elements, decode).
// In a 2-thread prefill of the benchmark model these ops ran on one thread while the other
// waited (~3 % of the wall time, perf on the EPYC Zen 3, 2026-12-07).
constexpr int64_t kChunkElems = 1 << 14;
}  // namespace

void rmsnorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y) {
  const auto fn = HWY_DYNAMIC_DISPATCH(RmsNorm);
  const int64_t rows = std::max<int64_t>(1, kChunkElems / std::max<int64_t>(D, 1));  // rows a task
  detail::for_row_chunks(1, T, D, rows, [&](int64_t t0, int64_t t1) {
    fn(x + t0 * D, t1 - t0, D, w, eps, y + t0 * D);  // each row is normalized on its own
  });
}
void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const auto fn = HWY_DYNAMIC_DISPATCH(SiluMulN);
  detail::for_row_chunks(1, n, 1, kChunkElems,
                         [&](int64_t i0, int64_t i1) { fn(gate + i0, up + i0, i1 - i0, out + i0); });
}
void add(const float* a, const float* b, int64_t n, float* y) {
  const auto fn = HWY_DYNAMIC_DISPATCH(AddN);
  detail::for_row_chunks(1, n, 1, kChunkElems, [&](int64_t i0, int64_t i1) { fn(a + i0, b + i0, i1 - i0, y + i0); });
}
}  // namespace tinyloop::cpu
#endif
