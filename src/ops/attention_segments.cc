// Two-segment causal attention (see attention_segments.h): the dispatch, and the scalar
// reference loop, which also serves one-slot attention (ref::attention and ref::attention_i8
// are this with split = 0) for every storage dtype. The SIMD one is cpu::attention_segments
// in src/cpu/attention.cc, built the same way.
//
// Why not an online-softmax merge (max/sum per segment, rescaled at the join)? The rescale
// multiplies the first segment's partial sums by exp(m1 - m), which rounds differently from
// computing every weight against the global max, so its outputs would only be close to
// single-segment attention. Here the segment boundary only decides which buffer a row is
// read from: scores of the whole window go into one [group, n] buffer, then the global max,
// the exp-sum and the weighted V are accumulated in position order.
//
// The storage dtype is only a row loader (FloatRows: F32 / F16 decoded to float; I8Rows:
// int8 values widened and scaled inside the dot product and the weight, never dequantized
// into a buffer), so the loop below is the one reference for every KV mode.
#include "ops/attention_segments.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu/kernels.h"
#include "ops/convert_inl.h"
#include "ops/kv_quant.h"

namespace tinyloop::ops {
namespace {

// The two views of one sequence and where the second begins (split 0: all in tail).
struct Segments {
  const KvView& prefix;
  int64_t split;
  const KvView& tail;
  const KvView& at(int64_t p) const { return p < split ? prefix : tail; }
};

// a [n], b [n]
inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// F32 / F16 rows: a row is a float row (the stored one, or decoded from F16 into a scratch).
struct FloatRows {
  struct Row {
    const float* x;  // [hd]
    float score(const float* qj, int64_t hd, float scale) const { return dot(qj, x, hd) * scale; }
    // o [hd] += w * row
    void add(float w, float* o, int64_t hd) const {
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) o[i] += w * x[i];
    }
  };
  const Segments& s;
  std::vector<float> ktmp, vtmp;  // [hd] each: decoded K / V row (F16)
  FloatRows(const Segments& seg, int64_t hd) : s(seg), ktmp(size_t(hd)), vtmp(size_t(hd)) {}
  // K row (keys) or V row of kv head g at absolute position p.
  Row row(bool keys, int64_t p, int64_t g) {
    const KvView& kv = s.at(p);
    const void* base = keys ? kv.k : kv.v;  // [capacity, n_kv_heads, head_dim]
    const int64_t off = ((p % kv.capacity) * kv.n_kv_heads + g) * kv.head_dim;
    if (kv.dtype == KvDType::F32) return {static_cast<const float*>(base) + off};
    float* tmp = keys ? ktmp.data() : vtmp.data();
    detail::half_row_to_float(static_cast<const uint16_t*>(base) + off, kv.head_dim, tmp);
    return {tmp};
  }
};

// I8 rows: int8 values with one scale per (row, kv head), applied to the dot product's
// result (K) or to the softmax weight (V).
struct I8Rows {
  struct Row {
    const int8_t* x;  // [hd]
    float scale;      // the row's dequantization scale
    float score(const float* qj, int64_t hd, float s) const {
      float acc = 0.f;
      for (int64_t i = 0; i < hd; ++i) acc += qj[i] * float(x[i]);
      return acc * (scale * s);
    }
    // o [hd] += w * scale * row
    void add(float w, float* o, int64_t hd) const {
      const float wgt = w * scale;
      for (int64_t i = 0; i < hd; ++i) o[i] += wgt * float(x[i]);
    }
  };
  const Segments& s;
  I8Rows(const Segments& seg, int64_t) : s(seg) {}
  Row row(bool keys, int64_t p, int64_t g) {
    const KvView& kv = s.at(p);
    assert(kv.k_scale && kv.v_scale);
    const int64_t r = (p % kv.capacity) * kv.n_kv_heads + g;  // (row, kv head)
    const auto* base = static_cast<const int8_t*>(keys ? kv.k : kv.v);  // [capacity, n_kv, hd]
    return {base + r * kv.head_dim, (keys ? kv.k_scale : kv.v_scale)[r]};
  }
};

// The reference loop: per query row and kv head, scores of the whole window (each K row
// loaded once for every query head of the GQA group), stable softmax against the window's
// max, then the weighted V in position order, all in float.
template <class Rows>
void attend(const float* q, int64_t T, int64_t n_heads, const Segments& seg,
            const int64_t* q_pos, const int64_t* k_lo, float* out) {
  const KvView& prefix = seg.prefix;
  const KvView& tail = seg.tail;
  const int64_t split = seg.split;
  const int64_t hd = tail.head_dim;
  const int64_t n_kv = tail.n_kv_heads;
  assert(n_kv > 0 && n_heads % n_kv == 0);
  const int64_t group = n_heads / n_kv;  // query heads per kv head
  const float scale = float(1.0 / std::sqrt(double(hd)));

  Rows rows(seg, hd);
  std::vector<float> scores;                               // [group, n] logits, then weights
  std::vector<float> inv_sum(static_cast<size_t>(group));  // [group]

  for (int64_t t = 0; t < T; ++t) {
    const int64_t lo = k_lo[t], hi = q_pos[t];
    const int64_t n = hi - lo + 1;  // window length, across both segments
    if (n <= 0) {
      std::fill(out + t * n_heads * hd, out + (t + 1) * n_heads * hd, 0.f);
      continue;
    }
    // Each segment's part of the window must fit its slot (no wrapped-away rows).
    assert(lo >= 0 && std::min(hi, split - 1) - lo < prefix.capacity);
    assert(hi - std::max(lo, split) < tail.capacity);
    (void)prefix, (void)split;
    scores.resize(size_t(group * n));

    for (int64_t g = 0; g < n_kv; ++g) {
      const float* qg = q + (t * n_heads + g * group) * hd;  // [group, hd]
      float* og = out + (t * n_heads + g * group) * hd;      // [group, hd]
      for (int64_t p = lo; p <= hi; ++p) {
        const auto kr = rows.row(true, p, g);
        for (int64_t j = 0; j < group; ++j)
          scores[size_t(j * n + (p - lo))] = kr.score(qg + j * hd, hd, scale);
      }
      // Softmax against the max of the whole window (both segments).
      for (int64_t j = 0; j < group; ++j) {
        float* s = scores.data() + j * n;  // [n]
        const float m = *std::max_element(s, s + n);
        float sum = 0.f;
        for (int64_t i = 0; i < n; ++i) {
          s[i] = std::exp(s[i] - m);
          sum += s[i];
        }
        inv_sum[size_t(j)] = 1.f / sum;  // sum >= 1: the max term is exp(0)
      }
      std::fill(og, og + group * hd, 0.f);
      for (int64_t p = lo; p <= hi; ++p) {
        const auto vr = rows.row(false, p, g);
        for (int64_t j = 0; j < group; ++j)
          vr.add(scores[size_t(j * n + (p - lo))], og + j * hd, hd);
      }
      for (int64_t j = 0; j < group; ++j) {
        float* o = og + j * hd;  // [hd]
        const float is = inv_sum[size_t(j)];
#pragma omp simd
        for (int64_t i = 0; i < hd; ++i) o[i] *= is;
      }
    }
  }
}

}  // namespace

// q [T, n_heads, head_dim], q_pos [T], k_lo [T], out [T, n_heads, head_dim].
void ref::attention_segments(const float* q, int64_t T, int64_t n_heads, const KvView& prefix,
                             int64_t split, const KvView& tail, const int64_t* q_pos,
                             const int64_t* k_lo, float* out) {
  assert(prefix.dtype == tail.dtype && prefix.n_kv_heads == tail.n_kv_heads &&
         prefix.head_dim == tail.head_dim);
  const Segments seg{prefix, split, tail};
  if (tail.dtype == KvDType::I8)
    attend<I8Rows>(q, T, n_heads, seg, q_pos, k_lo, out);
  else
    attend<FloatRows>(q, T, n_heads, seg, q_pos, k_lo, out);
}

void attention_segments(const float* q, int64_t T, int64_t n_heads, const KvView& prefix,
                        int64_t split, const KvView& tail, const int64_t* q_pos,
                        const int64_t* k_lo, float* out) {
  assert(prefix.dtype == tail.dtype && prefix.n_kv_heads == tail.n_kv_heads &&
         prefix.head_dim == tail.head_dim);
  // The prefix cache shares F32 / F16 slots only: both versions could read I8 rows too, but
  // that pairing is untested, and the store-h modes have no loader here (never misread them).
  if (tail.dtype != KvDType::F32 && tail.dtype != KvDType::F16)
    throw std::invalid_argument("attention_segments (prefix cache): this KV storage mode is not supported yet");
  if (force_scalar())
    return ref::attention_segments(q, T, n_heads, prefix, split, tail, q_pos, k_lo, out);
  cpu::attention_segments(q, T, n_heads, prefix, split, tail, q_pos, k_lo, out);
}

}  // namespace tinyloop::ops
