// Internal to src/cpu: the interface between the reduced-precision matmul driver
// (matmul_bf16dot.cc: x rounding, threads, the AVX512-BF16 kernel) and its portable Highway
// kernel (matmul_bf16dot_hwy.cc). ops/matmul_bf16dot.h has the arithmetic and the layout.
#pragma once
#include <cstdint>

namespace tinyloop::cpu::detail {

// x rows per register tile: 6 rows x 64 columns = 24 accumulators of 16 floats, plus the 4
// weight vectors of a step and a broadcast x pair, fit AVX-512's 32 registers.
constexpr int64_t kBf16DotMaxRows = 6;

// One tile: out[r * 64 + c] = the spec's sum for x row r and column c of one panel, for
// r < mt (1 .. kBf16DotMaxRows), every column of the panel (padding columns give 0).
//   xp    rounded, paired x rows: row r at xp + r * ldx, K2 pairs each
//   panel [K2, 64] pairs of the packed weight
//   out   [mt, 64]
using Bf16DotTileFn = void (*)(const uint32_t* xp, int64_t ldx, int64_t mt, int64_t K2, const uint32_t* panel,
                               float* out);

// The portable kernel for the best Highway target of this CPU (resolved per call, so a test
// that forces a target gets that target).
Bf16DotTileFn bf16dot_tile_portable();

}  // namespace tinyloop::cpu::detail
