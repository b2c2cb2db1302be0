// SIMD + threaded CPU kernels (Google Highway, ISA chosen at run time), the fast versions of
// the scalar reference ops in src/ops. Each function has exactly the contract of the op of
// the same name in ops/ops.h (shapes, aliasing, NaN/inf behaviour within float rounding);
// ops/dispatch.cc calls these unless TINYLOOP_FORCE_SCALAR=1.
//
// Batch invariance (what speculative decoding relies on): every output element is computed
// by code that depends only on its own inputs and the sizes that define it (K for matmul,
// head_dim and the key window for attention, D for a norm row) - never on T, on N, on the
// thread that runs it or on where it falls in a block. So row t of a T-row call is
// bit-identical to the same row computed alone. The tests check this bit-exactly.
//
// The weight / KV view structs are the ones of ops/ops.h (types only: this library does not
// call into tinyloop_ops).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/views.h"

namespace tinyloop::cpu {

// y[T, N] = x[T, K] @ W[N, K]^T (+ bias[N]). F16/BF16 weights are widened in registers
// (fused dequant-in-dot). Output features are split across the thread pool.
void matmul(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

// y[T, N] with x quantized per 32 as llama.cpp does (ops/matmul_q8act.h), int8 / int4 weights.
// Runs a packed kernel when w.q8packed is set (cpu/matmul_q8act_packed.h: AVX512-VNNI, else
// AVX2), else the row-major VNNI kernel, or the Highway one (no VNNI, or TINYLOOP_DISABLE_VNNI).
void matmul_q8act(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);
// The packed copy for matmul_q8act: its bytes (0 when w does not apply, or VNNI is off) and
// the packer (throws std::invalid_argument when the bytes are 0).
int64_t q8act_packed_bytes(const ops::WeightView& w);
void pack_q8act(const ops::WeightView& w, void* out);
// Which kernel matmul_q8act runs on packed copies: "amx-int8" (AMX-INT8 tiles from
// detail::amx_int8_min_rows x rows, AVX512-VNNI below), "avx512vnni", "avx2", or (no copies made)
// "portable-<Highway target>".
std::string q8act_kernel_name();
// true when matmul_q8act has a packed kernel here (AVX512-VNNI or AVX2): copies are made and
// q8 activations are the fast path; false: only the portable kernel (slower than exact f32).
bool q8act_packed_available();
// false: the q8 matmul never runs the AVX512-VNNI kernels (A/B runs; ops/backend.h applies
// TINYLOOP_DISABLE_VNNI through it). Takes effect only before the first q8 kernel or packing.
void set_vnni_enabled(bool on);

// The reduced-precision matmul of ops/matmul_bf16dot.h (x rounded to bf16, the packed BF16
// copy w.bf16dot, float32 sums): on a CPU with AMX-BF16 the AMX chain by AMX tiles
// (cpu/amx.h; off with TINYLOOP_DISABLE_AMX=1), else the spec's bits by vdpbf16ps when the
// CPU has AVX512-BF16, else by a portable Highway kernel. Packed panels of 64 columns are
// split across the pool. Throws std::invalid_argument when w.bf16dot is null.
void matmul_bf16dot(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);
// Which kernel matmul_bf16dot runs now: "amx", "avx512bf16" or "portable-<Highway target>".
std::string bf16dot_kernel_name();
// true when matmul_bf16dot runs the AMX chain now (ops::ref::matmul_bf16dot_amx's bits).
bool bf16dot_uses_amx();
// true: run the portable kernel even on an AVX512-BF16 or AMX CPU (tests, benchmarks).
void set_bf16dot_portable(bool on);

// Causal attention, same contract as ops::attention, over an F32, F16 or INT8 slot (INT8:
// ops/kv_quant.h, int8 values with a float scale per (position, kv head), widened and scaled
// inside the dot products), contiguous or paged. Tiles of query rows x kv heads are split
// across the thread pool.
void attention(const float* q, int64_t T, int64_t n_heads, const ops::KvView& kv, const int64_t* q_pos,
               const int64_t* k_lo, float* out);
// The same over the row groups of many sequences (ops::attention_batch): one parallel loop
// over (group, tile, kv head), every row bit-identical to cpu::attention of that row alone.
void attention_batch(const float* q, int64_t T, int64_t n_heads, const ops::KvRowGroup* groups, int64_t n_groups,
                     const int64_t* q_pos, const int64_t* k_lo, float* out);

// Writes K/V rows into an F32 or F16 slot (F16: hardware conversion), same contract as
// ops::kv_write.
void kv_write(const ops::KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T);

// y[T, D] = x / sqrt(mean(x^2) + eps) * w[D]; y may alias x.
void rmsnorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y);
// out[n] = silu(gate[n]) * up[n]; out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// y[n] = a[n] + b[n]; y may alias a or b.
void add(const float* a, const float* b, int64_t n, float* y);
// In place on x[T, n_heads, head_dim], same contract and bits as ops::ref::rope (cpu/rope.cc);
// cos / sin rows are cached per thread by position. Throws std::invalid_argument on an odd
// head_dim.
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos, float theta,
          ops::RopeLayout layout);

// Name of the Highway target the dispatcher picks now ("AVX3", "AVX2", "EMU128", ...).
std::string simd_target_name();
// Every Highway target compiled into this library (HWY_* bits), best first.
std::vector<int64_t> compiled_targets();
// Their names, in the same order.
std::vector<std::string> compiled_target_names();

}  // namespace tinyloop::cpu
