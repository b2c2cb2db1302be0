// The public ops (ops.h): each runs the SIMD + threaded kernel of src/cpu when there is one,
// or the scalar reference (ops/reference.h) when forced, or when it is the only version.
// The model layer calls only these, so it never knows which ISA or how many threads ran.
#include <stdexcept>

#include "cpu/kernels.h"
#include "ops/backend.h"
#include "ops/matmul_bf16dot.h"
#include "ops/matmul_q8act.h"
#include "ops/ops.h"
#include "ops/reference.h"

namespace tinyloop::ops {
namespace {

// Every op asks this first: the scalar reference (forced, ops/backend.h) or the CPU kernels.
// The first call anywhere applies the backend's defaults (ops/backend.cc).
inline bool scalar() { return force_scalar(); }

}  // namespace

void matmul(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  if (w.bf16dot) return matmul_bf16dot(x, T, w, bias, y);
  if (w.q8act && q8act_applies(w)) return matmul_q8act(x, T, w, bias, y);
  if (scalar()) return ref::matmul(x, T, w, bias, y);
  cpu::matmul(x, T, w, bias, y);
}

// The packed layout depends on the kernel the settings pick (VNNI or not): defaults first.
int64_t q8act_packed_bytes(const WeightView& w) {
  ensure_backend_defaults();
  return cpu::q8act_packed_bytes(w);
}
void pack_q8act(const WeightView& w, void* out) {
  ensure_backend_defaults();
  cpu::pack_q8act(w, out);
}

void matmul_q8act(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  if (scalar()) return ref::matmul_q8act(x, T, w, bias, y);
  cpu::matmul_q8act(x, T, w, bias, y);
}

void matmul_bf16dot(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  // The reference of the chain the CPU kernel runs (AMX's or vdpbf16ps's), so forcing the
  // scalar path never changes this mode's bits on one machine.
  if (scalar())
    return cpu::bf16dot_uses_amx() ? ref::matmul_bf16dot_amx(x, T, w, bias, y) : ref::matmul_bf16dot(x, T, w, bias, y);
  cpu::matmul_bf16dot(x, T, w, bias, y);
}

void weight_row_to_f32(const WeightView& w, int64_t row, float* out) { ref::weight_row_to_f32(w, row, out); }

void rmsnorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y) {
  if (scalar()) return ref::rmsnorm(x, T, D, w, eps, y);
  cpu::rmsnorm(x, T, D, w, eps, y);
}

void layernorm(const float* x, int64_t T, int64_t D, const float* w, const float* b, float eps, float* y) {
  ref::layernorm(x, T, D, w, b, eps, y);
}

void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos, float theta, RopeLayout layout) {
  if (scalar()) return ref::rope(x, T, n_heads, head_dim, pos, theta, layout);
  cpu::rope(x, T, n_heads, head_dim, pos, theta, layout);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (scalar()) return ref::silu_mul(gate, up, n, out);
  cpu::silu_mul(gate, up, n, out);
}

void gelu(float* x, int64_t n, bool tanh_approx) { ref::gelu(x, n, tanh_approx); }

void relu_square(float* x, int64_t n) { ref::relu_square(x, n); }

void add(const float* a, const float* b, int64_t n, float* y) {
  if (scalar()) return ref::add(a, b, n, y);
  cpu::add(a, b, n, y);
}

void kv_write(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T) {
  // I8: one quantizer for both paths (ops/kv_quant.h), so the stored bytes never differ.
  if (scalar() || dst.dtype == KvDType::I8) return ref::kv_write(dst, k_rows, v_rows, pos, T);
  cpu::kv_write(dst, k_rows, v_rows, pos, T);
}

void kv_write(KvDType dtype, void* k, void* v, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
              const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T, float* k_scale, float* v_scale) {
  KvView dst;
  dst.dtype = dtype;
  dst.k = k;
  dst.v = v;
  dst.capacity = capacity;
  dst.n_kv_heads = n_kv_heads;
  dst.head_dim = head_dim;
  dst.k_scale = k_scale;
  dst.v_scale = v_scale;
  kv_write(dst, k_rows, v_rows, pos, T);
}

void attention(const float* q, int64_t T, int64_t n_heads, const KvView& kv, const int64_t* q_pos, const int64_t* k_lo,
               float* out) {
  if (is_store_h(kv.dtype)) throw std::logic_error("attention on a store-h slot: rebuild K/V first");
  if (scalar()) return ref::attention(q, T, n_heads, kv, q_pos, k_lo, out);
  cpu::attention(q, T, n_heads, kv, q_pos, k_lo, out);
}

void attention_batch(const float* q, int64_t T, int64_t n_heads, const KvRowGroup* groups, int64_t n_groups,
                     const int64_t* q_pos, const int64_t* k_lo, float* out) {
  for (int64_t i = 0; i < n_groups; ++i)
    if (is_store_h(groups[i].kv.dtype)) throw std::logic_error("attention on a store-h slot: rebuild K/V first");
  if (scalar()) return ref::attention_batch(q, T, n_heads, groups, n_groups, q_pos, k_lo, out);
  cpu::attention_batch(q, T, n_heads, groups, n_groups, q_pos, k_lo, out);
}

}  // namespace tinyloop::ops
