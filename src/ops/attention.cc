// KV slot writes and causal attention against one slot (F32 or F16 storage, ring rows).
//
// attention() walks, for each query row t and kv head g, the key positions of the window
// k_lo[t] .. q_pos[t] once: each K row and V row is decoded (F16) once and used by every
// query head of the GQA group that reads kv head g, instead of once per query head.
// Softmax: scores for the whole window, the max subtracted before exp (so exp never
// overflows and the largest weight is exactly 1), the sum and the weighted V all in float.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/convert_inl.h"
#include "ops/kv_quant.h"
#include "ops/reference.h"

namespace tinyloop::ops::ref {
namespace {

// One [head_dim] row of kv head g for absolute position p, as float. For F32 storage the
// stored row itself is returned; for F16 it is decoded into tmp.
//   base  [capacity, n_kv_heads, head_dim] (storage dtype)
//   tmp   [head_dim]
const float* kv_row(const KvView& kv, const void* base, int64_t p, int64_t g, float* tmp) {
  const int64_t off = ((p % kv.capacity) * kv.n_kv_heads + g) * kv.head_dim;
  if (kv.dtype == KvDType::F32) return static_cast<const float*>(base) + off;
  detail::half_row_to_float(static_cast<const uint16_t*>(base) + off, kv.head_dim, tmp);
  return tmp;
}

// a [n], b [n]
inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

// k, v       [capacity, n_kv_heads, head_dim] in `dtype` (written)
// k_rows     [T, n_kv_heads, head_dim] float
// v_rows     [T, n_kv_heads, head_dim] float
// pos        [T] absolute positions (>= 0); row pos[t] % capacity is overwritten
void kv_write(KvDType dtype, void* k, void* v, int64_t capacity, int64_t n_kv_heads,
              int64_t head_dim, const float* k_rows, const float* v_rows, const int64_t* pos,
              int64_t T, float* k_scale, float* v_scale) {
  if (dtype == KvDType::I8)
    return kv_write_i8(static_cast<int8_t*>(k), static_cast<int8_t*>(v), k_scale, v_scale,
                       capacity, n_kv_heads, head_dim, k_rows, v_rows, pos, T);
  const int64_t row = n_kv_heads * head_dim;  // elements per position
  for (int64_t t = 0; t < T; ++t) {
    assert(pos[t] >= 0);
    const int64_t r = pos[t] % capacity;
    const float* ks = k_rows + t * row;  // [n_kv_heads, head_dim]
    const float* vs = v_rows + t * row;  // [n_kv_heads, head_dim]
    if (dtype == KvDType::F32) {
      std::memcpy(static_cast<float*>(k) + r * row, ks, size_t(row) * sizeof(float));
      std::memcpy(static_cast<float*>(v) + r * row, vs, size_t(row) * sizeof(float));
    } else {
      uint16_t* kd = static_cast<uint16_t*>(k) + r * row;  // [n_kv_heads, head_dim]
      uint16_t* vd = static_cast<uint16_t*>(v) + r * row;  // [n_kv_heads, head_dim]
      for (int64_t i = 0; i < row; ++i) {
        kd[i] = detail::float_to_half(ks[i]);
        vd[i] = detail::float_to_half(vs[i]);
      }
    }
  }
}

// q      [T, n_heads, head_dim]
// q_pos  [T]  absolute position of each query row (last key it may see)
// k_lo   [T]  first key position it may see
// out    [T, n_heads, head_dim]
// The window must lie in the slot: 0 <= k_lo[t], and q_pos[t] - k_lo[t] < capacity (older
// rows of a ring are overwritten). An empty window (k_lo > q_pos) gives a zero output row.
void attention(const float* q, int64_t T, int64_t n_heads, const KvView& kv,
               const int64_t* q_pos, const int64_t* k_lo, float* out) {
  if (kv.dtype == KvDType::I8) return attention_i8(q, T, n_heads, kv, q_pos, k_lo, out);
  const int64_t hd = kv.head_dim;
  const int64_t n_kv = kv.n_kv_heads;
  assert(n_kv > 0 && n_heads % n_kv == 0);
  const int64_t group = n_heads / n_kv;  // query heads per kv head
  const float scale = float(1.0 / std::sqrt(double(hd)));

  std::vector<float> scores;                // [group, n]: logits, then exp weights
  std::vector<float> ktmp(static_cast<size_t>(hd));    // [hd] decoded K row (F16 storage)
  std::vector<float> vtmp(static_cast<size_t>(hd));    // [hd] decoded V row (F16 storage)
  std::vector<float> inv_sum(static_cast<size_t>(group));  // [group]

  for (int64_t t = 0; t < T; ++t) {
    const int64_t lo = k_lo[t], hi = q_pos[t];
    const int64_t n = hi - lo + 1;  // window length
    if (n <= 0) {
      std::fill(out + t * n_heads * hd, out + (t + 1) * n_heads * hd, 0.f);
      continue;
    }
    assert(lo >= 0 && n <= kv.capacity);
    scores.resize(size_t(group * n));

    for (int64_t g = 0; g < n_kv; ++g) {
      const float* qg = q + (t * n_heads + g * group) * hd;  // [group, hd]
      float* og = out + (t * n_heads + g * group) * hd;      // [group, hd]

      // Logits.
      for (int64_t p = lo; p <= hi; ++p) {
        const float* kr = kv_row(kv, kv.k, p, g, ktmp.data());  // [hd]
        for (int64_t j = 0; j < group; ++j)
          scores[size_t(j * n + (p - lo))] = dot(qg + j * hd, kr, hd) * scale;
      }
      // Stable softmax numerators and 1/sum per head.
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
      // Weighted sum of V.
      std::fill(og, og + group * hd, 0.f);
      for (int64_t p = lo; p <= hi; ++p) {
        const float* vr = kv_row(kv, kv.v, p, g, vtmp.data());  // [hd]
        for (int64_t j = 0; j < group; ++j) {
          const float wgt = scores[size_t(j * n + (p - lo))];
          float* o = og + j * hd;  // [hd]
#pragma omp simd
          for (int64_t i = 0; i < hd; ++i) o[i] += wgt * vr[i];
        }
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

}  // namespace tinyloop::ops::ref
