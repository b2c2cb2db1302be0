// The argument types of the ops (ops/ops.h) and of the CPU kernels (cpu/kernels.h): views
// of weights and KV slots that point into memory someone else owns. They sit in the bottom
// layer (src/base) so that the kernels (src/cpu) need nothing from the ops layer above them.
// Namespace tinyloop::ops, the layer whose contract they describe.
#pragma once
#include <cstdint>

#include "base/dtype.h"

namespace tinyloop::ops {

// A weight matrix as stored in the model file: [rows = out, cols = in], row-major.
// Quantized (docs/model-format.md, version 2), K split into groups of `group` columns:
//   I8: data int8 [N, K];        W[n, k] = scales[n, k / group] * q[n, k]
//   U4: data uint8 [N, K / 2];   W[n, k] = scales[n, g] * q[n, k] + offsets[n, g], g = k / group
//       (q in 0..15; column 2b in the low nibble of byte b, 2b + 1 in the high nibble).
// The dequantized weight is formed in float32: the scalar reference rounds the product and
// the sum separately, the SIMD kernels may fuse them (one rounding): at most 1 ulp of W apart.
struct WeightView {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;  // output features N
  int64_t cols = 0;  // input features K (logical: a U4 row holds K / 2 bytes)
  int64_t group = 0;  // quantized only: columns per scale, divides K (even for U4)
  DType scale_dtype = DType::F32;  // quantized only: F32 or F16 scales / offsets
  const void* scales = nullptr;  // quantized only: [N, K / group]
  const void* offsets = nullptr;  // U4 only: [N, K / group]
  // I8 / U4 only: matmul quantizes x per 32 columns as llama.cpp does (ops/matmul_q8act.h)
  // when the group allows it (a multiple of 32); set per Model (quant_activations="q8"; default "f32").
  bool q8act = false;
  // The two copies below belong to the backend: ops/backend.h makes them (make_q8act_copies,
  // make_bf16dot_copies) in memory it owns and points the view at them.
  // Optional copy of a q8act weight in the packed kernels' layout (cpu/matmul_q8act_packed.h):
  // when set, the q8 matmul reads it instead of data / scales / offsets, same bits.
  const uint8_t* q8packed = nullptr;
  // Optional BF16 copy of W packed for the reduced-precision matmul (ops/matmul_bf16dot.h,
  // fp16_body): when set, matmul rounds x to bf16 and multiplies it by this copy instead of
  // `data`. [ceil(N / 64), ceil(K / 2), 64] uint32 (pairs of bf16).
  const uint32_t* bf16dot = nullptr;
};

// Pair order of a rotary embedding (ops::rope).
enum class RopeLayout { Half, Interleaved };

// Storage of K/V rows: float32, IEEE half, or int8 with one float32 scale per
// (position, kv head) (docs/kv-cache.md): value = int8 * scale, scale = max|x| / 127.
// H16 / H8 / H4 are the store-h modes: a slot keeps the attention layer's normalised input
// h [dim] per position (half; int8 + one scale; int4 + one scale per 32 values) and the
// model layer rebuilds K/V from it into a float32 view; kv_write / attention never see them.
enum class KvDType { F32, F16, I8, H16, H8, H4 };
inline bool is_store_h(KvDType t) { return t == KvDType::H16 || t == KvDType::H8 || t == KvDType::H4; }

// Where one run of KV rows lives: K and V values in the slot's dtype, and (I8 only) their
// scales, in the order the view's `head_major` names (KvView::index): [rows, n_kv_heads,
// head_dim] / [rows, n_kv_heads] position-major, [n_kv_heads, rows, head_dim] /
// [n_kv_heads, rows] head-major. Store-h slots keep h rows in `k` ([rows, h_row_bytes]) and
// their scales in `k_scale`.
struct KvBlock {
  void* k = nullptr;
  void* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};

// One KV slot's keys and values. The key of absolute position p lives in ring row
// r = p % capacity (a ring when capacity < sequence length).
//   Contiguous (blocks == nullptr): rows [capacity, n_kv_heads, head_dim] at k / v (and
//     k_scale / v_scale [capacity, n_kv_heads] for I8).
//   Paged (blocks != nullptr): row r is row r % block_rows of blocks[r / block_rows]
//     (vLLM's PagedAttention block table); capacity is a multiple of block_rows. A block a
//     window can no longer see may be null; it is never read.
//   head_major: inside each unit (a block, or the whole contiguous ring) the rows of one kv
//     head are consecutive, [n_kv_heads, unit rows, head_dim], so attention, which walks one
//     kv head over many positions, reads K and V as contiguous streams (the KV cache's
//     blocks); otherwise a position's kv heads are consecutive, [unit rows, n_kv_heads,
//     head_dim], the order a projection writes (scratch views, store-h rebuilds).
//   head_rows (paged head-major only; 0: unit_rows()): rows from one kv head's run of a
//     block to the next head's. A pool that lays E blocks out as one extent
//     ([n_kv_heads, E * block_rows, head_dim], model/kv_pool.h) sets E * block_rows, so
//     a head's runs in blocks next to each other in their extent are one stream.
// The arithmetic of attention never depends on the addressing: a paged or head-major slot
// gives exactly the bits of a contiguous position-major one holding the same rows.
struct KvView {
  KvDType dtype = KvDType::F16;
  const void* k = nullptr;  // contiguous: [capacity, n_kv_heads, head_dim]
  const void* v = nullptr;  // contiguous: [capacity, n_kv_heads, head_dim]
  int64_t capacity = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  const float* k_scale = nullptr;  // contiguous: [capacity, n_kv_heads], I8 only
  const float* v_scale = nullptr;  // contiguous: [capacity, n_kv_heads], I8 only
  int64_t block_rows = 0;  // paged: rows per block
  const KvBlock* blocks = nullptr;  // paged: [capacity / block_rows] block table
  bool head_major = false;  // the order inside a unit (above)
  int64_t head_rows = 0;  // paged head-major: rows between two kv heads' runs (above), 0: unit_rows()

  // Rows per addressing unit: block_rows when paged, the whole ring otherwise.
  int64_t unit_rows() const { return blocks ? block_rows : capacity; }
  // The block holding ring row r; *row receives r's row inside it.
  KvBlock block_of(int64_t r, int64_t* row) const {
    if (!blocks) {
      *row = r;
      return KvBlock{const_cast<void*>(k), const_cast<void*>(v), const_cast<float*>(k_scale),
                     const_cast<float*>(v_scale)};
    }
    *row = r % block_rows;
    return blocks[r / block_rows];
  }
  // The (row, kv head) pair's index inside its unit (row: block_of's *row): its values start
  // at element index * head_dim of the unit's K / V, its I8 scale is element index of the
  // unit's scales.
  int64_t index(int64_t row, int64_t g) const {
    return head_major ? g * (head_rows > 0 ? head_rows : unit_rows()) + row : row * n_kv_heads + g;
  }
  // How far apart in index units two consecutive rows of one kv head are.
  int64_t row_step() const { return head_major ? 1 : n_kv_heads; }
};

// Rows [begin, begin + rows) of a batched attention call, all reading one slot.
struct KvRowGroup {
  KvView kv;
  int64_t begin = 0, rows = 0;
};

}  // namespace tinyloop::ops
