// INT8 KV storage (kv_mode "int8", docs/kv-cache.md): each (position, kv head) row of K or V
// is stored as head_dim int8 values plus one float32 scale, value = int8 * scale with
// scale = max|x| / 127 (symmetric, round to nearest even, clamped to [-127, 127]). A row is
// quantized on its own, so its bytes never depend on which rows share a call (batch
// invariance) or on the kernel path: the SIMD path uses this same quantizer.
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace tinyloop::ops {

// q[n] = round(x[n] / scale); returns scale (0 for an all-zero row, whose q are all 0).
float quantize_row_i8(const float* x, int64_t n, int8_t* q);

// kv_write for KvDType::I8: k, v [capacity, n_kv_heads, head_dim] int8; k_scale, v_scale
// [capacity, n_kv_heads]; k_rows, v_rows [T, n_kv_heads, head_dim]; row pos[t] % capacity.
void kv_write_i8(int8_t* k, int8_t* v, float* k_scale, float* v_scale, int64_t capacity,
                 int64_t n_kv_heads, int64_t head_dim, const float* k_rows, const float* v_rows,
                 const int64_t* pos, int64_t T);

namespace ref {
// The scalar reference attention over an I8 slot (contract of ops::attention):
//   score[p] = dot(q, float(k8[p])) * k_scale[p] * (1 / sqrt(head_dim))
//   out      = sum_p (w[p] * v_scale[p]) * float(v8[p]) / sum_p w[p]
void attention_i8(const float* q, int64_t T, int64_t n_heads, const KvView& kv,
                  const int64_t* q_pos, const int64_t* k_lo, float* out);
}  // namespace ref

}  // namespace tinyloop::ops
