// KV slot writes and the scalar reference causal attention, for every storage dtype and
// both addressings (contiguous ring, paged blocks: ops.h KvView).
//
// The storage dtype is only a row loader (FloatRows: F32 / F16 decoded to float; I8Rows:
// int8 values widened and scaled inside the dot product and the weight, never dequantized
// into a buffer), and the addressing only decides where a position's row is read from
// (KvView::block_of), so the loop below is the one reference for every KV mode, and a paged
// slot gives exactly the bits of a contiguous one holding the same rows.
//
// Per query row t and kv head g the loop walks the window k_lo[t] .. q_pos[t] once, each K
// and V row decoded once and used by every query head of the GQA group. Softmax: scores of
// the whole window, the max subtracted before exp (so exp never overflows and the largest
// weight is exactly 1), the sum and the weighted V accumulated in position order, in float.
// (Not an online-softmax merge over blocks: its rescaling rounds differently, so paged and
// contiguous slots would only be close.)
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "base/convert_inl.h"
#include "ops/kv_quant.h"
#include "ops/reference.h"

namespace tinyloop::ops::ref {
namespace {

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
  const KvView& kv;
  std::vector<float> ktmp, vtmp;  // [hd] each: decoded K / V row (F16)
  FloatRows(const KvView& v, int64_t hd) : kv(v), ktmp(size_t(hd)), vtmp(size_t(hd)) {}
  // K row (keys) or V row of kv head g at absolute position p.
  Row row(bool keys, int64_t p, int64_t g) {
    int64_t r;
    const KvBlock b = kv.block_of(p % kv.capacity, &r);
    const void* base = keys ? b.k : b.v;  // the unit's rows (KvView::index orders them)
    const int64_t off = kv.index(r, g) * kv.head_dim;
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
    float scale;  // the row's dequantization scale
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
  const KvView& kv;
  I8Rows(const KvView& v, int64_t) : kv(v) {}
  Row row(bool keys, int64_t p, int64_t g) {
    int64_t r;
    const KvBlock b = kv.block_of(p % kv.capacity, &r);
    assert(b.k_scale && b.v_scale);
    const int64_t i = kv.index(r, g);  // (row, kv head)
    const auto* base = static_cast<const int8_t*>(keys ? b.k : b.v);  // the unit's rows
    return {base + i * kv.head_dim, (keys ? b.k_scale : b.v_scale)[i]};
  }
};

// The reference loop over rows t0 .. t0 + T - 1 of q / out, all reading slot kv.
template <class Rows>
void attend(const float* q, int64_t T, int64_t n_heads, const KvView& kv, const int64_t* q_pos, const int64_t* k_lo,
            float* out) {
  const int64_t hd = kv.head_dim;
  const int64_t n_kv = kv.n_kv_heads;
  assert(n_kv > 0 && n_heads % n_kv == 0);
  const int64_t group = n_heads / n_kv;  // query heads per kv head
  const float scale = float(1.0 / std::sqrt(double(hd)));

  Rows rows(kv, hd);
  std::vector<float> scores;  // [group, n] logits, then weights
  std::vector<float> inv_sum(static_cast<size_t>(group));  // [group]

  for (int64_t t = 0; t < T; ++t) {
    const int64_t lo = k_lo[t], hi = q_pos[t];
    const int64_t n = hi - lo + 1;  // window length
    if (n <= 0) {
      std::fill(out + t * n_heads * hd, out + (t + 1) * n_heads * hd, 0.f);
      continue;
    }
    assert(lo >= 0 && n <= kv.capacity);  // no wrapped-away rows
    scores.resize(size_t(group * n));

    for (int64_t g = 0; g < n_kv; ++g) {
      const float* qg = q + (t * n_heads + g * group) * hd;  // [group, hd]
      float* og = out + (t * n_heads + g * group) * hd;  // [group, hd]
      for (int64_t p = lo; p <= hi; ++p) {
        const auto kr = rows.row(true, p, g);
        for (int64_t j = 0; j < group; ++j) scores[size_t(j * n + (p - lo))] = kr.score(qg + j * hd, hd, scale);
      }
      // Softmax against the max of the whole window.
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
        for (int64_t j = 0; j < group; ++j) vr.add(scores[size_t(j * n + (p - lo))], og + j * hd, hd);
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

// k_rows, v_rows [T, n_kv_heads, head_dim] float; pos [T] absolute positions (>= 0): ring
// row pos[t] % capacity of dst is overwritten.
void kv_write(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T) {
  if (dst.dtype == KvDType::I8) return kv_write_i8(dst, k_rows, v_rows, pos, T);
  if (is_store_h(dst.dtype)) throw std::logic_error("kv_write on a store-h slot");
  const int64_t hd = dst.head_dim, row = dst.n_kv_heads * hd;  // elements per position
  for (int64_t t = 0; t < T; ++t) {
    assert(pos[t] >= 0);
    int64_t r;
    const KvBlock b = dst.block_of(pos[t] % dst.capacity, &r);
    for (int64_t g = 0; g < dst.n_kv_heads; ++g) {
      const float* ks = k_rows + t * row + g * hd;  // [head_dim]
      const float* vs = v_rows + t * row + g * hd;  // [head_dim]
      const int64_t off = dst.index(r, g) * hd;
      if (dst.dtype == KvDType::F32) {
        std::memcpy(static_cast<float*>(b.k) + off, ks, size_t(hd) * sizeof(float));
        std::memcpy(static_cast<float*>(b.v) + off, vs, size_t(hd) * sizeof(float));
      } else {
        uint16_t* kd = static_cast<uint16_t*>(b.k) + off;  // [head_dim]
        uint16_t* vd = static_cast<uint16_t*>(b.v) + off;  // [head_dim]
        for (int64_t i = 0; i < hd; ++i) {
          kd[i] = detail::float_to_half(ks[i]);
          vd[i] = detail::float_to_half(vs[i]);
        }
      }
    }
  }
}

// q [T, n_heads, head_dim], q_pos [T], k_lo [T], out [T, n_heads, head_dim].
// The window must lie in the slot: 0 <= k_lo[t], and q_pos[t] - k_lo[t] < capacity (older
// rows of a ring are overwritten). An empty window (k_lo > q_pos) gives a zero output row.
void attention(const float* q, int64_t T, int64_t n_heads, const KvView& kv, const int64_t* q_pos, const int64_t* k_lo,
               float* out) {
  if (kv.dtype == KvDType::I8) attend<I8Rows>(q, T, n_heads, kv, q_pos, k_lo, out);
  else attend<FloatRows>(q, T, n_heads, kv, q_pos, k_lo, out);
}

void attention_batch(const float* q, int64_t T, int64_t n_heads, const KvRowGroup* groups, int64_t n_groups,
                     const int64_t* q_pos, const int64_t* k_lo, float* out) {
  for (int64_t i = 0; i < n_groups; ++i) {
    const KvRowGroup& g = groups[i];
    const int64_t w = n_heads * g.kv.head_dim, b = g.begin;
    ref::attention(q + b * w, g.rows, n_heads, g.kv, q_pos + b, k_lo + b, out + b * w);
  }
  (void)T;
}

}  // namespace tinyloop::ops::ref
