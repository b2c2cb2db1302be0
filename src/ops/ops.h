// The compute ops of the model layer. Every op is a plain function over row-major float32
// buffers; shapes are in the comments.
// Each call runs the SIMD + threaded kernel of src/cpu (Highway, ISA picked at run time) when
// the op has one, else the scalar reference (ops/reference.h). The two agree within float
// rounding, and both are batch-invariant: row t of a T-row call is bit-identical to that row
// computed alone. TINYLOOP_FORCE_SCALAR=1 (or set_force_scalar) selects the reference.
#pragma once
#include <cstdint>
#include "base/dtype.h"
#include "base/views.h"  // WeightView, KvView, KvRowGroup, RopeLayout: the arguments below

namespace tinyloop::ops {

// Kernel choice for every later call in the process: true = the scalar reference (slow;
// for A/B benchmarks and debugging). Defaults to env TINYLOOP_FORCE_SCALAR=1 (ops/backend.h,
// which holds the other backend settings too).
void set_force_scalar(bool scalar);
bool force_scalar();

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
void layernorm(const float* x, int64_t T, int64_t D, const float* w, const float* b, float eps, float* y);

// In place on x[T, n_heads, head_dim]: rotate pairs by angle pos[t] * theta^(-2i/head_dim).
// Half: pairs (i, i + head_dim/2) as HF rotate_half; Interleaved: pairs (2i, 2i+1).
// Angles are computed in double and rounded to float once.
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos, float theta, RopeLayout layout);

// out[n] = silu(gate[n]) * up[n]. out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// In place x[n] = gelu(x): exact erf form, or the tanh approximation.
void gelu(float* x, int64_t n, bool tanh_approx);
// In place x[n] = max(x, 0)^2 (the "relu2" MLP).
void relu_square(float* x, int64_t n);

// y[n] = a[n] + b[n]. y may alias a or b.
void add(const float* a, const float* b, int64_t n, float* y);

// Write k_rows/v_rows [T, n_kv_heads, head_dim] (float) for absolute positions pos[T] into
// the slot `dst` names (its buffers are written through; I8 rows with their scales),
// converting to its storage dtype. I8 rounds each (position, kv head) row on its own, so a
// row's bytes never depend on T (batch invariance). A missing I8 scale buffer is a
// std::logic_error.
void kv_write(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T);
// The same for a contiguous slot: k/v [capacity, n_kv_heads, head_dim] and (I8) k_scale /
// v_scale [capacity, n_kv_heads].
void kv_write(KvDType dtype, void* k, void* v, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
              const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T, float* k_scale = nullptr,
              float* v_scale = nullptr);

// Causal attention of T query rows against one KV slot.
//   q   [T, n_heads, head_dim]   (RoPE already applied)
//   out [T, n_heads, head_dim]
// Query t attends to key positions k_lo[t] .. q_pos[t] inclusive (all already written to the
// slot); query head h uses kv head h / (n_heads / n_kv_heads); scale 1/sqrt(head_dim);
// softmax with the max subtracted, accumulated in float. I8 slots are dequantized inside
// the dot products: score = dot(q, k8) * k_scale, out += (w * v_scale) * v8.
void attention(const float* q, int64_t T, int64_t n_heads, const KvView& kv, const int64_t* q_pos, const int64_t* k_lo,
               float* out);

// Causal attention of T query rows of many sequences in one call (the serving engine's
// batched forward): row t reads the slot of the group holding it; groups cover 0 .. T-1 in
// order, without gaps. Row t's output is bit-identical to ops::attention of that row alone
// against its group's slot (the kernels never mix rows). Same shapes as ops::attention.
void attention_batch(const float* q, int64_t T, int64_t n_heads, const KvRowGroup* groups, int64_t n_groups,
                     const int64_t* q_pos, const int64_t* k_lo, float* out);

}  // namespace tinyloop::ops
