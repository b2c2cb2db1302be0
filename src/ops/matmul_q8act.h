// llama.cpp-compatible activation quantization for int8 / int4 weights ("q8" activations,
// docs/model-format.md): every row of x is cut into blocks of 32 columns and each block is
// quantized to int8 exactly as ggml's x86 CPU backend quantizes the activations of a
// quantized matmul (quantize_row_q8_0 / quantize_row_q8_1, AVX2 path):
//   amax = max |x_j|;  d = fp16(amax / 127);  q_j = round_half_even(x_j * (127 / amax))
//   s    = fp16(d_f32 * sum_j q_j)   (Q8_1's block sum; d_f32 is amax / 127 before rounding)
// (amax == 0, or so small that 127 / amax overflows: q = 0; an inf or NaN lane gives the x86
// integer indefinite, q = 0 and INT32_MIN in the sum, so the row's output is not finite). The product is then integer per block:
//   y[t, n] = sum_b (d_w * d_x) * isum_b  +  sum_b o_w * s_x      (o_w = 0 for int8)
//   isum_b  = sum_{j in block b} q_w[j] * q_x[j]   (int8 x int8, or int4 0..15 x int8)
// the first sum accumulated in float in block order, the second apart (as ggml's
// vec_dot_q4_1_q8_1 keeps `summs`), added at the end (+ bias).
// Each row is quantized on its own, so a row's bits never depend on T or threads.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "base/q8act_format.h"  // kQ8Block, q8act_applies, the block quantizer
#include "ops/ops.h"

namespace tinyloop::ops {

namespace ref {
// Scalar reference of the q8-activation matmul: x [T, K], w [N, K] (q8act_applies(w)),
// bias [N] or null, y [T, N]. Throws std::invalid_argument when the weight does not apply.
void matmul_q8act(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);
}  // namespace ref

// A copy of w repacked for the packed kernels (cpu/matmul_q8act_packed.h): its size in
// bytes, 0 when w does not apply or the CPU runs neither (AVX512-VNNI, AVX2),
// and pack_q8act writes it to out (64-byte aligned). Point w.q8packed at it: matmul_q8act
// then gives the same bits, faster.
int64_t q8act_packed_bytes(const WeightView& w);
void pack_q8act(const WeightView& w, void* out);

// The dispatched op (SIMD unless TINYLOOP_FORCE_SCALAR), same contract as ref::matmul_q8act.
// ops::matmul calls it for views with q8act set.
void matmul_q8act(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);

}  // namespace tinyloop::ops
