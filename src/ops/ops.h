// The compute ops of the model layer. Every op is a plain function over row-major float32
// buffers; shapes are in the comments.
// Each call runs the SIMD + threaded kernel of src/cpu (Highway, ISA picked at run time) when
// the op has one, else the scalar reference (ops/reference.h). The two agree within float
// rounding, and both are batch-invariant: row t of a T-row call is bit-identical to that row
// computed alone. TINYLOOP_FORCE_SCALAR=1 (or set_force_scalar) selects the reference.
#pragma once
#include <cstdint>
#include "ops/dtype.h"

namespace tinyloop::ops {

// Kernel choice for every later call in the process: true = the scalar reference (slow;
// for A/B benchmarks and debugging). Defaults to env TINYLOOP_FORCE_SCALAR=1, read once.
void set_force_scalar(bool scalar);
bool force_scalar();

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
  int64_t group = 0;                // quantized only: columns per scale, divides K (even for U4)
  DType scale_dtype = DType::F32;   // quantized only: F32 or F16 scales / offsets
  const void* scales = nullptr;     // quantized only: [N, K / group]
  const void* offsets = nullptr;    // U4 only: [N, K / group]
  // I8 / U4 only: matmul quantizes x per 32 columns as llama.cpp does (ops/matmul_q8act.h)
  // when the group allows it (a multiple of 32); set per Model (quant_activations="q8"; default "f32").
  bool act_q8 = false;
  // Optional copy of an act_q8 weight repacked for the VNNI kernel (cpu/matmul_q8act_packed.h):
  // when set, the q8 matmul reads it instead of data / scales / offsets, same bits.
  const uint8_t* q8packed = nullptr;
  // Optional BF16 copy of W packed for the reduced-precision matmul (ops/matmul_bf16dot.h,
  // TINYLOOP_EXPERIMENTAL_FP16_BODY): when set, matmul rounds x to bf16 and multiplies it by
  // this copy instead of `data`. [ceil(N / 64), ceil(K / 2), 64] uint32 (pairs of bf16).
  const uint32_t* bf16dot = nullptr;
};

// y[T, N] = x[T, K] @ W[N, K]^T (+ bias[N] when bias != nullptr). Accumulates in float.
// Quantized weights are dequantized inside the product (never materialised whole).
// x and y must not alias.
void matmul(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);

// Copy row `row` of W (any dtype, quantized ones dequantized as the scalar reference does)
// into out[cols] as float (embedding lookup).
void weight_row_to_f32(const WeightView& w, int64_t row, float* out);

// y[T, D] = x / sqrt(mean(x^2) + eps) * w[D]. y may alias x.
void rmsnorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y);

// y[T, D] = (x - mean) / sqrt(var + eps) * w[D] (+ b[D] when b != nullptr). y may alias x.
void layernorm(const float* x, int64_t T, int64_t D, const float* w, const float* b, float eps,
               float* y);

enum class RopeLayout { Half, Interleaved };
// In place on x[T, n_heads, head_dim]: rotate pairs by angle pos[t] * theta^(-2i/head_dim).
// Half: pairs (i, i + head_dim/2) as HF rotate_half; Interleaved: pairs (2i, 2i+1).
// Angles are computed in double and rounded to float once.
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos,
          float theta, RopeLayout layout);

// out[n] = silu(gate[n]) * up[n]. out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// In place x[n] = gelu(x): exact erf form, or the tanh approximation.
void gelu(float* x, int64_t n, bool tanh_approx);
// In place x[n] = max(x, 0)^2 (the "relu2" MLP).
void relu_square(float* x, int64_t n);

// y[n] = a[n] + b[n]. y may alias a or b.
void add(const float* a, const float* b, int64_t n, float* y);

// Storage of K/V rows: float32, IEEE half, or int8 with one float32 scale per
// (position, kv head) (docs/kv-cache.md): value = int8 * scale, scale = max|x| / 127.
// H16 / H8 / H4 are the store-h modes: a slot keeps the attention layer's normalised input
// h [dim] per position (half; int8 + one scale; int4 + one scale per 32 values) and the
// model layer rebuilds K/V from it into a float32 view; kv_write / attention never see them.
enum class KvDType { F32, F16, I8, H16, H8, H4 };
inline bool is_store_h(KvDType t) { return t == KvDType::H16 || t == KvDType::H8 || t == KvDType::H4; }

// Where one run of KV rows lives: K and V values [rows, n_kv_heads, head_dim] in the slot's
// dtype, and (I8 only) their scales [rows, n_kv_heads]. Store-h slots keep h rows in `k`
// ([rows, h_row_bytes]) and their scales in `k_scale`.
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
// The arithmetic of attention never depends on the addressing: a paged slot gives exactly
// the bits of a contiguous one holding the same rows.
struct KvView {
  KvDType dtype = KvDType::F16;
  const void* k = nullptr;  // contiguous: [capacity, n_kv_heads, head_dim]
  const void* v = nullptr;  // contiguous: [capacity, n_kv_heads, head_dim]
  int64_t capacity = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  const float* k_scale = nullptr;  // contiguous: [capacity, n_kv_heads], I8 only
  const float* v_scale = nullptr;  // contiguous: [capacity, n_kv_heads], I8 only
  int64_t block_rows = 0;          // paged: rows per block
  const KvBlock* blocks = nullptr; // paged: [capacity / block_rows] block table

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
};

// Write k_rows/v_rows [T, n_kv_heads, head_dim] (float) for absolute positions pos[T] into
// the slot `dst` names (its buffers are written through; I8 rows with their scales),
// converting to its storage dtype. I8 rounds each (position, kv head) row on its own, so a
// row's bytes never depend on T (batch invariance). A missing I8 scale buffer is a
// std::logic_error.
void kv_write(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos,
              int64_t T);
// The same for a contiguous slot: k/v [capacity, n_kv_heads, head_dim] and (I8) k_scale /
// v_scale [capacity, n_kv_heads].
void kv_write(KvDType dtype, void* k, void* v, int64_t capacity, int64_t n_kv_heads,
              int64_t head_dim, const float* k_rows, const float* v_rows, const int64_t* pos,
              int64_t T, float* k_scale = nullptr, float* v_scale = nullptr);

// Causal attention of T query rows against one KV slot.
//   q   [T, n_heads, head_dim]   (RoPE already applied)
//   out [T, n_heads, head_dim]
// Query t attends to key positions k_lo[t] .. q_pos[t] inclusive (all already written to the
// slot); query head h uses kv head h / (n_heads / n_kv_heads); scale 1/sqrt(head_dim);
// softmax with the max subtracted, accumulated in float. I8 slots are dequantized inside
// the dot products: score = dot(q, k8) * k_scale, out += (w * v_scale) * v8.
void attention(const float* q, int64_t T, int64_t n_heads, const KvView& kv,
               const int64_t* q_pos, const int64_t* k_lo, float* out);

// Rows [begin, begin + rows) of a batched attention call, all reading one slot.
struct KvRowGroup {
  KvView kv;
  int64_t begin = 0, rows = 0;
};
// Causal attention of T query rows of many sequences in one call (the serving engine's
// batched forward): row t reads the slot of the group holding it; groups cover 0 .. T-1 in
// order, without gaps. Row t's output is bit-identical to ops::attention of that row alone
// against its group's slot (the kernels never mix rows). Same shapes as ops::attention.
void attention_batch(const float* q, int64_t T, int64_t n_heads, const KvRowGroup* groups,
                     int64_t n_groups, const int64_t* q_pos, const int64_t* k_lo, float* out);

}  // namespace tinyloop::ops
