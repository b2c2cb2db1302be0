// KV slot writes and causal attention against one slot (F32, F16 or I8 storage, ring rows).
//
// attention() is the reference loop of ops/attention_segments.cc with split 0: for each
// query row t and kv head g it walks the window k_lo[t] .. q_pos[t] once, each K and V row
// decoded once and used by every query head of the GQA group. Softmax: scores for the whole
// window, the max subtracted before exp (so exp never overflows and the largest weight is
// exactly 1), the sum and the weighted V all in float.
#include <cassert>
#include <cstring>

#include "ops/attention_segments.h"
#include "ops/convert_inl.h"
#include "ops/kv_quant.h"
#include "ops/reference.h"

namespace tinyloop::ops::ref {

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
  // One slot is the two-segment loop with split 0 (every position in kv), any dtype.
  ref::attention_segments(q, T, n_heads, kv, 0, kv, q_pos, k_lo, out);
}

}  // namespace tinyloop::ops::ref
