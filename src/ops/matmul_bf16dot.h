// Reduced-precision matmul (the loop body of TINYLOOP_EXPERIMENTAL_FP16_BODY, docs/benchmarks.md
// "Reduced-precision loop body"): y[T, N] = bf16(x)[T, K] @ Wb[N, K]^T (+ bias[N]), with Wb a
// BF16 copy of the weight, packed at load time into the layout the AVX512-BF16 dot-product
// instruction (vdpbf16ps) consumes, and every product accumulated in float32.
//
// The arithmetic of one output element (the spec; the SIMD kernels of cpu/matmul_bf16dot*.cc
// give these bits exactly, see "Exactness" below):
//   xb[k]  = bf16(x[t, k])  round to nearest even, a subnormal x read as zero; xb[k] = 0 for k >= K
//   wb[k]  = Wb[n, k]                                                      wb[k] = 0 for k >= K
//   acc    = +0
//   for i = 0 .. ceil(K / 2) - 1:      (pairs of columns, in order)
//     acc = acc + xb[2i + 1] * wb[2i + 1]      (the odd column first: vdpbf16ps does)
//     acc = acc + xb[2i] * wb[2i]
//   y[t, n] = acc (+ bias[n])
// Each product of two bf16 values is exact in float32, so every step rounds once (round to
// nearest even). This order is what vdpbf16ps computes per lane on Zen 4 (checked on
// 3.2 million random lanes: all equal to it, ~7 % differ from the even-first order) and on
// Intel (the SDM's pseudo-code). It is one sequential chain per element: nothing depends on
// T, N, the tile or the thread (batch invariance, cpu/kernels.h).
//
// Exactness: vdpbf16ps also treats subnormal inputs as zero (none occur: x and Wb are both
// flushed when rounded, below) and flushes subnormal results to zero, which the float
// arithmetic of the reference and of the portable kernel does not; an element can differ
// only where a running sum falls below 2^-126 (~1.2e-38) in magnitude. Otherwise all three
// agree bit for bit (the tests check it on random data).
//
// Packed weight layout (kBf16DotPanel = 64 output columns per panel, K2 = ceil(K / 2)):
//   packed[(p * K2 + i) * 64 + c] = wb[p * 64 + c][2i] | wb[p * 64 + c][2i + 1] << 16   (uint32)
// for p < ceil(N / 64): one panel is [K2, 64] pairs, contiguous, so a decode streams the
// matrix front to back once and a prefill tile loads one 64-byte vector of 16 columns' pairs
// per step. Columns n >= N of the last panel and k >= K are zero. Bytes:
// ceil(N / 64) * 64 * K2 * 4 (= 2 N K bytes when 64 divides N and K is even).
#pragma once
#include <cstdint>

#include "base/bf16dot_format.h"  // kBf16DotPanel, round_bf16_ftz, round_rows_bf16dot
#include "ops/ops.h"

namespace tinyloop::ops {

// Packs a F32 / F16 / BF16 weight view [N, K] into out[bf16dot_packed_words(N, K)], each
// value rounded by round_bf16_ftz (exact for BF16 weights except subnormals). Throws
// std::invalid_argument for a quantized or empty view.
void pack_bf16dot(const WeightView& w, uint32_t* out);

// The AMX chain (CPUs with AMX-BF16, cpu/amx.h): TDPBF16PS does NOT sum in the order above.
// Measured on the AMX Xeon of docs/benchmarks.md (2026-12-02: 40 000 single-instruction elements
// with random accumulators, all equal, none matching any one-chain order; and every call of
// cpu/matmul_amx_bf16_test.cc; the SDM's newer pseudo-code says the same): one instruction
// takes 16 pairs (32 columns) of a row and a column, sums the even products and the odd
// products in two separate chains from +0, adds the two, and only then adds that to the
// accumulator tile:
//   acc = +0
//   for b = 0 .. ceil(K2 / 16) - 1:    (blocks of 16 pairs, in order; pairs past K2 are 0)
//     e = +0, o = +0
//     for i = 16 b .. 16 b + 15:  e = e + xb[2i] * wb[2i];  o = o + xb[2i + 1] * wb[2i + 1]
//     acc = acc + (e + o)
//   y[t, n] = acc (+ bias[n])
// Same rounding (each step once, to nearest even), same flushing of subnormals; a different
// association, so most elements differ from vdpbf16ps's chain in the last bits (77 % at
// K = 768 on random data). Within one CPU the mode stays batch invariant: on an AMX CPU
// every call (any T, decode included) runs this chain, so a row's bits never depend on the
// batch; across CPUs (AMX or not) the mode's outputs differ in the last bits.
// Between the two chains (sums of the same exact products; first-order error bounds of K
// and 17 + ceil(K2 / 16) roundings): |y_amx - y| <= (K + 17 + ceil(K2 / 16)) * 2^-24 *
// sum_k |xb[k] wb[k]|, the tolerance cpu/matmul_amx_bf16_test.cc checks.

namespace ref {
// The spec above, as plain loops: x [T, K], w a view with bf16dot set ([N, K], the packed
// copy), bias [N] or null, y [T, N]. Throws std::invalid_argument when w.bf16dot is null.
void matmul_bf16dot(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);
// The AMX chain above, same contract.
void matmul_bf16dot_amx(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);
}  // namespace ref

// The dispatched op, same contract: on an AMX-BF16 CPU (unless TINYLOOP_DISABLE_AMX=1) the
// AMX chain, else the vdpbf16ps chain; TINYLOOP_FORCE_SCALAR runs the reference of the chain
// in use. ops::matmul calls it for views with bf16dot set.
void matmul_bf16dot(const float* x, int64_t T, const WeightView& w, const float* bias, float* y);

}  // namespace tinyloop::ops
