// The scalar reference kernels: plain C++ (GCC auto-vectorizes some loops for the build's
// baseline ISA), single-threaded, the oracle the SIMD kernels in src/cpu are tested against.
// The public ops (ops.h) run these when TINYLOOP_FORCE_SCALAR=1 or ops::set_force_scalar(true);
// shapes, aliasing and numerics are documented on the same-named functions in ops.h.
#pragma once
#include "ops/ops.h"

namespace tinyloop::ops::ref {

void matmul(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);
void weight_row_to_f32(const WeightView& w, int64_t row, float* out);
void rmsnorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y);
void layernorm(const float* x, int64_t T, int64_t D, const float* w, const float* b, float eps, float* y);
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos, float theta, RopeLayout layout);
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu(float* x, int64_t n, bool tanh_approx);
void relu_square(float* x, int64_t n);
void add(const float* a, const float* b, int64_t n, float* y);
void kv_write(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T);
void attention(const float* q, int64_t T, int64_t n_heads, const KvView& kv, const int64_t* q_pos, const int64_t* k_lo,
               float* out);
void attention_batch(const float* q, int64_t T, int64_t n_heads, const KvRowGroup* groups, int64_t n_groups,
                     const int64_t* q_pos, const int64_t* k_lo, float* out);

}  // namespace tinyloop::ops::ref
