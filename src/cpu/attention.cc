// SIMD attention over one KV slot, or over two (a shared prefix slot for positions < split,
// a tail slot for the rest: the prefix cache), F32, F16 or INT8 storage (ops/kv_quant.h);
// same contracts as ops::attention and ops::attention_segments. The storage type is only a
// row loader (LoadChunk widens a chunk; an int8 row also carries a per-(row, kv head) scale,
// applied to the score and to the softmax weight), so every dtype runs the same loops. One
// routine serves one and two slots: the one-slot call is the two-slot call with split = 0,
// and the segment boundary only decides which slot a position's row is read from, so a
// window split across two slots gets exactly the arithmetic of the same window in one slot
// (bit-identical, which the prefix cache needs).
//
// A task is one (query row t, kv head g) pair: the query heads of g's group attend to the
// keys k_lo[t] .. q_pos[t]. Per query head the arithmetic is fixed by its own window:
//   score[p] = SumOfLanes(sum over head_dim chunks of MulAdd(q, widen(K[p]))) * scale
//   w[p] = Exp(score[p] - max) (vector exp, ~1 ulp), sum = lane-wise sum then SumOfLanes
//   out = (sum over p in order of MulAdd(w[p], widen(V[p]))) * (1 / sum)
// so a row's result does not depend on T or on the other rows (batch invariance), nor on
// where the window is split between slots, and tasks may run on any thread. INT8 rows
// (int8 -> int32 -> float, exact) are scaled inside those sums, never dequantized into a
// buffer: score[p] uses k_scale[p] * scale, and V[p]'s weight is w[p] * v_scale[p].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#ifndef TINYLOOP_CPU_ATTENTION_ARGS_
#define TINYLOOP_CPU_ATTENTION_ARGS_
namespace tinyloop::cpu::detail {
struct AttnArgs {
  const float* q;  // [T, n_heads, head_dim]
  int64_t T, n_heads;
  ops::KvView prefix;  // k, v: [capacity, n_kv_heads, head_dim]; positions < split
  int64_t split;       // 0: every position is in `tail` (one-slot attention)
  ops::KvView tail;    // k, v: [capacity, n_kv_heads, head_dim]; positions >= split
  const int64_t* q_pos;  // [T]
  const int64_t* k_lo;   // [T]
  float* out;            // [T, n_heads, head_dim]
};
}  // namespace tinyloop::cpu::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// INT8 rows carry a scale per (row, kv head); F32 / F16 rows do not.
template <typename KT>
inline constexpr bool kScaled = std::is_same_v<KT, int8_t>;

// One chunk (Lanes elements starting at c) of a [hd] row, widened to float (int8: via int32,
// exact); the row's tail chunk is zero-padded without reading past the row.
template <class DF, typename KT>
HWY_INLINE hn::Vec<DF> LoadChunk(DF df, const KT* HWY_RESTRICT row, int64_t c, int64_t hd) {
  const int64_t L = int64_t(hn::Lanes(df));
  if constexpr (kScaled<KT>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> di;
    if (c + L <= hd) return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, row + c)));
    constexpr size_t kMax = hn::MaxLanes(DF());
    alignas(64) int8_t pad[kMax];  // [Lanes] the tail chunk, zero-padded through a stack copy
    std::memset(pad, 0, sizeof(pad));
    std::memcpy(pad, row + c, HWY_MIN(size_t(hd - c), kMax));
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, pad)));
  } else {
    return c + L <= hd ? LoadF32(df, row + c) : LoadF32Tail(df, row + c, size_t(hd - c));
  }
}

// The part of a window that lies in one slot: positions lo .. lo + n - 1, row p % cap.
template <typename KT>
struct Seg {
  const KT* k;         // [cap, n_kv, hd]
  const KT* v;         // [cap, n_kv, hd]
  const float* ks;     // [cap, n_kv] K row scales (INT8 only, else null)
  const float* vs;     // [cap, n_kv] V row scales (INT8 only, else null)
  int64_t cap, lo, n;
};

// o[c0 .. c0 + NV*L) of one query head = inv * sum_p w[p] * V[p] (the valid part only), p
// over the window's segments in position order, one set of accumulators throughout.
//   seg    [n_seg] window parts, each V row r of kv head g at v + (r * n_kv + g) * hd
//   w      [sum of seg n] softmax numerators in window order (INT8: times the V row scale)
//   o      [hd] output row
template <int NV, typename KT>
HWY_INLINE void WeightedV(const Seg<KT>* seg, int n_seg, int64_t n_kv, int64_t g, int64_t hd,
                          const float* w, float inv, int64_t c0, float* o) {
  static_assert(NV >= 1 && NV <= 4, "up to 4 vectors per pass");
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  // Named accumulators, not an array: GCC 12 keeps an array of vectors in memory.
  V acc0 = hn::Zero(df), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int s = 0; s < n_seg; ++s) {
    const KT* vbase = seg[s].v;
    const int64_t cap = seg[s].cap, n = seg[s].n;
    int64_t r = seg[s].lo % cap;  // ring row of position lo + p, advanced without a division
    for (int64_t p = 0; p < n; ++p) {
      const KT* vr = vbase + (r * n_kv + g) * hd + c0;  // [hd - c0] from chunk c0 on
      V wv;
      if constexpr (kScaled<KT>)
        wv = hn::Set(df, w[p] * seg[s].vs[r * n_kv + g]);
      else
        wv = hn::Set(df, w[p]);
      acc0 = hn::MulAdd(wv, LoadChunk(df, vr, 0, hd - c0), acc0);
      if constexpr (NV > 1) acc1 = hn::MulAdd(wv, LoadChunk(df, vr, L, hd - c0), acc1);
      if constexpr (NV > 2) acc2 = hn::MulAdd(wv, LoadChunk(df, vr, 2 * L, hd - c0), acc2);
      if constexpr (NV > 3) acc3 = hn::MulAdd(wv, LoadChunk(df, vr, 3 * L, hd - c0), acc3);
      if (++r == cap) r = 0;
    }
    w += n;
  }
  const V iv = hn::Set(df, inv);
  const V res[4] = {hn::Mul(acc0, iv), hn::Mul(acc1, iv), hn::Mul(acc2, iv), hn::Mul(acc3, iv)};
  for (int v = 0; v < NV; ++v) {
    const int64_t c = c0 + v * L;
    if (c + L <= hd)
      hn::StoreU(res[v], df, o + c);
    else
      StoreTail(df, res[v], o + c, size_t(hd - c));
  }
}

// sc[j * np + p] = dot(q_j, K[lo + p]) * scale (INT8: * (k_scale[lo + p] * scale)) for every
// head j of the group, p < n. The dot is acc = MulAdd(q chunk c, K chunk c, acc) over the chunks in order, then SumOfLanes:
// NC > 0 unrolls rows of exactly NC chunks (K chunks kept in registers across the group's
// heads), NC == 0 loops; both do the same arithmetic.
//   kbase  [capacity, n_kv, hd] of KT
//   kscale [capacity, n_kv] K row scales (INT8 only)
//   qp     [group, hdp] zero-padded query rows
template <int NC, typename KT>
HWY_INLINE void QkScores(const KT* kbase, const float* kscale, int64_t cap, int64_t n_kv,
                         int64_t g, int64_t hd, int64_t hdp, int64_t lo, int64_t n, const float* qp, int64_t group,
                         float scale, float* sc, int64_t np) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  int64_t r = lo % cap;
  for (int64_t p = 0; p < n; ++p) {
    const KT* kr = kbase + (r * n_kv + g) * hd;  // [hd]
    float f = scale;  // the score's factor
    if constexpr (kScaled<KT>) f = kscale[r * n_kv + g] * scale;
    if constexpr (NC == 0) {
      for (int64_t j = 0; j < group; ++j) {
        const float* qj = qp + j * hdp;  // [hdp]
        V acc = hn::Zero(df);
        for (int64_t c = 0; c < hd; c += L) acc = hn::MulAdd(hn::LoadU(df, qj + c), LoadChunk(df, kr, c, hd), acc);
        sc[j * np + p] = ReduceSumF32(df, acc) * f;
      }
    } else {
      const V k0 = LoadChunk(df, kr, 0, hd);
      const V k1 = NC > 1 ? LoadChunk(df, kr, L, hd) : k0;
      const V k2 = NC > 2 ? LoadChunk(df, kr, 2 * L, hd) : k0;
      const V k3 = NC > 3 ? LoadChunk(df, kr, 3 * L, hd) : k0;
      for (int64_t j = 0; j < group; ++j) {
        const float* qj = qp + j * hdp;  // [hdp]
        V acc = hn::MulAdd(hn::LoadU(df, qj), k0, hn::Zero(df));
        if constexpr (NC > 1) acc = hn::MulAdd(hn::LoadU(df, qj + L), k1, acc);
        if constexpr (NC > 2) acc = hn::MulAdd(hn::LoadU(df, qj + 2 * L), k2, acc);
        if constexpr (NC > 3) acc = hn::MulAdd(hn::LoadU(df, qj + 3 * L), k3, acc);
        sc[j * np + p] = ReduceSumF32(df, acc) * f;
      }
    }
    if (++r == cap) r = 0;
  }
}

template <typename KT>
HWY_NOINLINE void AttendGroupT(const detail::AttnArgs& a, int64_t t, int64_t g) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t hd = a.tail.head_dim, n_kv = a.tail.n_kv_heads;
  const int64_t group = a.n_heads / n_kv;
  float* og = a.out + (t * a.n_heads + g * group) * hd;  // [group, hd]
  const int64_t lo = a.k_lo[t], hi = a.q_pos[t], n = hi - lo + 1;
  if (n <= 0) {
    std::fill(og, og + group * hd, 0.f);
    return;
  }
  // The window lo .. hi split at a.split: [lo, split) from the prefix slot, the rest from
  // the tail slot. Each part must fit its slot (no wrapped-away rows).
  Seg<KT> seg[2];
  int n_seg = 0;
  const int64_t n_pre = std::clamp<int64_t>(a.split - lo, 0, n);
  if (n_pre > 0)
    seg[n_seg++] = {static_cast<const KT*>(a.prefix.k), static_cast<const KT*>(a.prefix.v),
                    a.prefix.k_scale, a.prefix.v_scale, a.prefix.capacity, lo, n_pre};
  if (n_pre < n)
    seg[n_seg++] = {static_cast<const KT*>(a.tail.k), static_cast<const KT*>(a.tail.v),
                    a.tail.k_scale, a.tail.v_scale, a.tail.capacity, lo + n_pre, n - n_pre};

  const float scale = float(1.0 / std::sqrt(double(hd)));
  const int64_t hdp = (hd + L - 1) / L * L;  // hd padded to whole vectors
  const int64_t np = (n + L - 1) / L * L;    // window padded to whole vectors
  thread_local std::vector<float> qbuf, sbuf;
  if (qbuf.size() < size_t(group * hdp)) qbuf.resize(size_t(group * hdp));
  if (sbuf.size() < size_t(group * np)) sbuf.resize(size_t(group * np));
  float* qp = qbuf.data();  // [group, hdp] query rows, zero-padded
  float* sc = sbuf.data();  // [group, np] scores, then softmax numerators (pad: -inf, then 0)

  const float* qg = a.q + (t * a.n_heads + g * group) * hd;  // [group, hd]
  for (int64_t j = 0; j < group; ++j) {
    std::copy(qg + j * hd, qg + (j + 1) * hd, qp + j * hdp);
    std::fill(qp + j * hdp + hd, qp + (j + 1) * hdp, 0.f);
    std::fill(sc + j * np + n, sc + (j + 1) * np, -std::numeric_limits<float>::infinity());
  }

  // Scores: one pass over each segment's K rows, each row used by every head of the group;
  // a score depends only on its own q and K row, so the segments just fill their columns.
  for (int s = 0, off = 0; s < n_seg; off += int(seg[s].n), ++s) {
    const KT* kbase = seg[s].k;
    const float* ks = seg[s].ks;  // [cap, n_kv] or null
    const int64_t cap = seg[s].cap, slo = seg[s].lo, sn = seg[s].n;
    float* ss = sc + off;  // [group, np] from column off
    switch (hdp / L) {  // unrolled for rows of up to 4 vectors (head_dim 64 on AVX-512)
      case 1: QkScores<1>(kbase, ks, cap, n_kv, g, hd, hdp, slo, sn, qp, group, scale, ss, np); break;
      case 2: QkScores<2>(kbase, ks, cap, n_kv, g, hd, hdp, slo, sn, qp, group, scale, ss, np); break;
      case 3: QkScores<3>(kbase, ks, cap, n_kv, g, hd, hdp, slo, sn, qp, group, scale, ss, np); break;
      case 4: QkScores<4>(kbase, ks, cap, n_kv, g, hd, hdp, slo, sn, qp, group, scale, ss, np); break;
      default: QkScores<0>(kbase, ks, cap, n_kv, g, hd, hdp, slo, sn, qp, group, scale, ss, np); break;
    }
  }

  // Softmax numerators per head over the whole window; the -inf padding exps to exactly 0.
  for (int64_t j = 0; j < group; ++j) {
    float* s = sc + j * np;  // [np]
    V mx = hn::LoadU(df, s);
    for (int64_t i = L; i < np; i += L) mx = hn::Max(mx, hn::LoadU(df, s + i));
    const V m = hn::MaxOfLanes(df, mx);
    V sum = hn::Zero(df);
    for (int64_t i = 0; i < np; i += L) {
      const V e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), m));
      hn::StoreU(e, df, s + i);
      sum = hn::Add(sum, e);
    }
    const float inv = 1.f / ReduceSumF32(df, sum);  // sum >= 1: the max term is exp(0)
    float* o = og + j * hd;  // [hd]
    for (int64_t c0 = 0; c0 < hd; c0 += 4 * L) {
      switch (std::min<int64_t>(4, (hd - c0 + L - 1) / L)) {
        case 1: WeightedV<1>(seg, n_seg, n_kv, g, hd, s, inv, c0, o); break;
        case 2: WeightedV<2>(seg, n_seg, n_kv, g, hd, s, inv, c0, o); break;
        case 3: WeightedV<3>(seg, n_seg, n_kv, g, hd, s, inv, c0, o); break;
        default: WeightedV<4>(seg, n_seg, n_kv, g, hd, s, inv, c0, o); break;
      }
    }
  }
}

// dst[n] = f16(src[n]), round to nearest even. With a conversion instruction (F16C,
// AVX-512) that is the hardware's exact IEEE conversion, which rounds, saturates to inf and
// quiets nan exactly as the scalar reference's float_to_half (the tests check every class of
// value bit for bit); without one, the scalar reference's conversion itself.
void FloatToHalfN(const float* HWY_RESTRICT src, int64_t n, uint16_t* HWY_RESTRICT dst) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t L = int64_t(hn::Lanes(df));
  auto* out = reinterpret_cast<hwy::float16_t*>(dst);
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
  for (; i < n; ++i) dst[i] = ops::detail::float_to_half(src[i]);
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = ops::detail::float_to_half(src[i]);
#endif
}

void AttendGroup(const detail::AttnArgs& a, int64_t t, int64_t g) {
  if (a.tail.dtype == ops::KvDType::F16)
    AttendGroupT<hwy::float16_t>(a, t, g);
  else if (a.tail.dtype == ops::KvDType::I8)
    AttendGroupT<int8_t>(a, t, g);
  else
    AttendGroupT<float>(a, t, g);
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(AttendGroup);
HWY_EXPORT(FloatToHalfN);

// k, v [capacity, n_kv_heads, head_dim]; k_rows, v_rows [T, n_kv_heads, head_dim]; pos [T].
void kv_write(ops::KvDType dtype, void* k, void* v, int64_t capacity, int64_t n_kv_heads,
              int64_t head_dim, const float* k_rows, const float* v_rows, const int64_t* pos,
              int64_t T) {
  const int64_t row = n_kv_heads * head_dim;  // elements per position
  const auto to_half = HWY_DYNAMIC_DISPATCH(FloatToHalfN);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = pos[t] % capacity;
    if (dtype == ops::KvDType::F32) {
      std::memcpy(static_cast<float*>(k) + r * row, k_rows + t * row, size_t(row) * sizeof(float));
      std::memcpy(static_cast<float*>(v) + r * row, v_rows + t * row, size_t(row) * sizeof(float));
    } else {
      to_half(k_rows + t * row, row, static_cast<uint16_t*>(k) + r * row);
      to_half(v_rows + t * row, row, static_cast<uint16_t*>(v) + r * row);
    }
  }
}

// q [T, n_heads, head_dim], q_pos [T], k_lo [T], out [T, n_heads, head_dim].
void attention_segments(const float* q, int64_t T, int64_t n_heads, const ops::KvView& prefix,
                        int64_t split, const ops::KvView& tail, const int64_t* q_pos,
                        const int64_t* k_lo, float* out) {
  if (T <= 0) return;
  const detail::AttnArgs a{q, T, n_heads, prefix, split, tail, q_pos, k_lo, out};
  const auto fn = HWY_DYNAMIC_DISPATCH(AttendGroup);
  const int64_t n_kv = tail.n_kv_heads;
  parallel_for(T * n_kv, [&](int64_t i) { fn(a, i / n_kv, i % n_kv); });
}

void attention(const float* q, int64_t T, int64_t n_heads, const ops::KvView& kv,
               const int64_t* q_pos, const int64_t* k_lo, float* out) {
  attention_segments(q, T, n_heads, kv, 0, kv, q_pos, k_lo, out);  // split 0: all in kv
}

// The INT8 entry point of dispatch: the same routine (kv.dtype == I8 picks the int8 loader).
void attention_int8(const float* q, int64_t T, int64_t n_heads, const ops::KvView& kv,
                    const int64_t* q_pos, const int64_t* k_lo, float* out) {
  attention_segments(q, T, n_heads, kv, 0, kv, q_pos, k_lo, out);
}
}  // namespace tinyloop::cpu
#endif
