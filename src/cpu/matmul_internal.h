// Internal to src/cpu: the interface between the matmul driver (matmul.cc: threads, task
// split) and the per-weight-type SIMD translation units (matmul_{f32,f16,bf16}.cc).
#pragma once
#include <cstdint>

namespace tinyloop::cpu::detail {

// One matmul call: y[T, N] = x[T, K] @ W[N, K]^T (+ bias[N]).
struct MatmulArgs {
  const float* x;  // [T, K] (int4: [T, ldx], the columns permuted, see below)
  int64_t T;
  const void* w;  // [N, K] in the weight dtype (int4: [N, K / 2] bytes)
  int64_t N, K;
  const float* bias;  // [N] or null
  float* y;  // [T, N]
  // Quantized weights only (ops::WeightView has the formulas).
  int64_t group = 0;
  bool scale_f16 = false;
  const void* scales = nullptr;  // [N, K / group]
  const void* offsets = nullptr;  // [N, K / group], int4
  int64_t ldx = 0;  // int4: row stride of the permuted x
};

// int4 kernels read a block of B bytes of a weight row (2B columns) as B low nibbles (the
// even columns) and B high nibbles (the odd columns), B = the target's float lane count.
// So the driver hands them x with each block of 2B columns permuted to [the B even
// columns, the B odd columns], zero-padded to whole blocks: x_perm [T, ceil(K / 2B) * 2B].
// The permutation is the same for every row and call, so batch invariance is kept.
int64_t int4_block_bytes();  // B of the target the dispatcher picks now

// Calls with T <= kFusedMaxRows widen the weights in registers as they stream past (one
// pass over W for all rows: decode, speculative verify); T > kDirectMaxRows first widens a
// tile of weight rows into a per-thread float buffer and reuses it for every row (prefill). All
// paths give bit-identical results (same per-element arithmetic), so this is only speed.
constexpr int64_t kFusedMaxRows = 4;
// Calls with kFusedMaxRows < T <= kDirectMaxRows (a batched decode: B rows of B sequences)
// run the 4 x 4 tile straight on the 16-bit weight rows, widened in registers, the next rows
// prefetched: widening a tile into memory first only pays off once many more rows reuse it
// (EPYC Zen 4, 768 x 2048 F16 from memory, one thread: 1.1-2.2x faster for T = 5 .. 64,
// bench/batched_decode.py and docs/benchmarks.md).
// F32 weights, which need no widening, keep the tiled path.
constexpr int64_t kDirectMaxRows = 64;
// Bytes of the widened weight tile of the prefill path: fits the 1-2 MiB L2 of a core with
// room for the x rows streaming past it.
constexpr int64_t kTileBytes = 128 << 10;
constexpr int64_t kTileMaxRows = 60;  // a multiple of 12 (tiled_task_rows)
// Weight rows per task of the tiled path for this K, on the target the dispatcher picks now
// (matmul-inl.h TiledTaskRows; float_tile: F32 / F16 / BF16 weights, false for int8 / int4).
int64_t tiled_task_rows(int64_t K, bool float_tile);

// Computes output columns [n0, n1) of every row (a task of the driver).
using MatmulRangeFn = void (*)(const MatmulArgs& a, int64_t n0, int64_t n1);
// The best compiled target's kernel for the CPU (resolved per call, so a test that forces a
// target gets that target).
MatmulRangeFn matmul_range_f32();
MatmulRangeFn matmul_range_f16();
MatmulRangeFn matmul_range_bf16();
MatmulRangeFn matmul_range_i8();
MatmulRangeFn matmul_range_u4();

}  // namespace tinyloop::cpu::detail
