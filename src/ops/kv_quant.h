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

// kv_write for KvDType::I8: each (position, kv head) row of k_rows / v_rows
// [T, n_kv_heads, head_dim] quantized on its own into dst's int8 rows and scales.
void kv_write_i8(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T);

}  // namespace tinyloop::ops

namespace tinyloop::ops {

// Store-h rows (KvDType::H16 / H8 / H4, docs/kv-cache.md). One row is the [n] floats of a
// layer's normalised input at one position:
//   H16: n halves;   H8: n int8 + 1 float scale (as quantize_row_i8);
//   H4:  ceil(n / 2) bytes, value i in the low nibble of byte i / 2 when i is even, else the
//        high one, stored as q + 8 with q in [-7, 7]; one float scale per group of
//        kH4Group values (the last group may be shorter), scale = max|x| / 7.
inline constexpr int64_t kH4Group = 32;
// Bytes of one row's values, and float scales per row.
int64_t h_row_bytes(KvDType t, int64_t n);
int64_t h_row_scales(KvDType t, int64_t n);
// Store x[n] as one row (values at `row`, scales at `scales`).
void h_row_store(KvDType t, const float* x, int64_t n, void* row, float* scales);
// out[n] = the stored row, decoded to float.
void h_row_load(KvDType t, const void* row, const float* scales, int64_t n, float* out);

}  // namespace tinyloop::ops
