// SIMD attention over an INT8 KV slot (ops/kv_quant.h), same contract as ops::attention.
//
// A task is one (query row t, kv head g) pair, as in cpu/attention.cc: the query heads of
// g's group attend to the keys k_lo[t] .. q_pos[t]. The int8 values are widened to float
// in registers (int8 -> int32 -> float, exact) and scaled inside the dot products:
//   score[p] = SumOfLanes(sum over head_dim chunks of MulAdd(q, float(k8[p]))) * (k_scale[p] * scale)
//   w[p] = Exp(score[p] - max), sum = lane-wise sum then SumOfLanes
//   out = (sum over p in order of MulAdd(w[p] * v_scale[p], float(v8[p]))) * (1 / sum)
// A row's result depends only on its own window (batch invariance); tasks run on any thread.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention_int8.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/simd-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#ifndef TINYLOOP_CPU_ATTENTION_INT8_ARGS_
#define TINYLOOP_CPU_ATTENTION_INT8_ARGS_
namespace tinyloop::cpu::detail {
struct AttnI8Args {
  const float* q;  // [T, n_heads, head_dim]
  int64_t T, n_heads;
  ops::KvView kv;        // k, v: [capacity, n_kv_heads, head_dim] int8; scales [capacity, n_kv_heads]
  const int64_t* q_pos;  // [T]
  const int64_t* k_lo;   // [T]
  float* out;            // [T, n_heads, head_dim]
};
}  // namespace tinyloop::cpu::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes(df) int8 values at p + c widened to float; the row's tail chunk (hd - c < Lanes) is
// zero-padded through a stack copy, never reading past the row.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadI8Chunk(DF df, const int8_t* HWY_RESTRICT row, int64_t c, int64_t hd) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int32_t, DF> di;
  const int64_t L = int64_t(hn::Lanes(df));
  if (c + L <= hd) return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, row + c)));
  constexpr size_t kMax = hn::MaxLanes(DF());
  alignas(64) int8_t pad[kMax];  // [Lanes]
  std::memset(pad, 0, sizeof(pad));
  std::memcpy(pad, row + c, HWY_MIN(size_t(hd - c), kMax));
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, pad)));
}

HWY_NOINLINE void AttendGroupI8(const detail::AttnI8Args& a, int64_t t, int64_t g) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const ops::KvView& kv = a.kv;
  const int64_t hd = kv.head_dim, n_kv = kv.n_kv_heads, cap = kv.capacity;
  const int64_t group = a.n_heads / n_kv;
  float* og = a.out + (t * a.n_heads + g * group) * hd;  // [group, hd]
  const int64_t lo = a.k_lo[t], n = a.q_pos[t] - lo + 1;
  if (n <= 0) {
    std::fill(og, og + group * hd, 0.f);
    return;
  }
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

  // Scores: one pass over the window's K rows, each used by every head of the group.
  const auto* K = static_cast<const int8_t*>(kv.k);
  int64_t r = lo % cap;  // ring row of position lo + p, advanced without a division
  for (int64_t p = 0; p < n; ++p) {
    const int8_t* kr = K + (r * n_kv + g) * hd;  // [hd]
    const float ks = kv.k_scale[r * n_kv + g] * scale;
    for (int64_t j = 0; j < group; ++j) {
      const float* qj = qp + j * hdp;  // [hdp]
      V acc = hn::Zero(df);
      for (int64_t c = 0; c < hd; c += L)
        acc = hn::MulAdd(hn::LoadU(df, qj + c), LoadI8Chunk(df, kr, c, hd), acc);
      sc[j * np + p] = ReduceSumF32(df, acc) * ks;
    }
    if (++r == cap) r = 0;
  }

  // Softmax numerators per head (the -inf padding exps to exactly 0), then weighted V.
  const auto* Vb = static_cast<const int8_t*>(kv.v);
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
    const V inv = hn::Set(df, 1.f / ReduceSumF32(df, sum));  // sum >= 1: max term is exp(0)
    float* o = og + j * hd;  // [hd]
    for (int64_t c = 0; c < hd; c += L) {
      V acc = hn::Zero(df);
      int64_t rr = lo % cap;
      for (int64_t p = 0; p < n; ++p) {
        const int64_t idx = rr * n_kv + g;  // (row, kv head)
        const V wv = hn::Set(df, s[p] * kv.v_scale[idx]);
        acc = hn::MulAdd(wv, LoadI8Chunk(df, Vb + idx * hd, c, hd), acc);
        if (++rr == cap) rr = 0;
      }
      acc = hn::Mul(acc, inv);
      if (c + L <= hd)
        hn::StoreU(acc, df, o + c);
      else
        StoreTail(df, acc, o + c, size_t(hd - c));
    }
  }
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(AttendGroupI8);

// q [T, n_heads, head_dim], q_pos [T], k_lo [T], out [T, n_heads, head_dim].
void attention_int8(const float* q, int64_t T, int64_t n_heads, const ops::KvView& kv,
                    const int64_t* q_pos, const int64_t* k_lo, float* out) {
  if (T <= 0) return;
  const detail::AttnI8Args a{q, T, n_heads, kv, q_pos, k_lo, out};
  const auto fn = HWY_DYNAMIC_DISPATCH(AttendGroupI8);
  const int64_t n_kv = kv.n_kv_heads;
  parallel_for(T * n_kv, [&](int64_t i) { fn(a, i / n_kv, i % n_kv); });
}
}  // namespace tinyloop::cpu
#endif
