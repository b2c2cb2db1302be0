// The q8-activation matmul (ops/matmul_q8act.h) on a repacked copy of the weight: 16 output
// rows interleaved by 4 columns per block of 32, so AVX512-VNNI's vpdpbusd yields 16 rows'
// exact block sums at once (matmul_q8act_packed.cc has the layout). Bit for bit
// ops::ref::matmul_q8act, and 1.5-2.5x the unpacked VNNI kernel (docs/benchmarks.md).
// The model packs every q8 weight once at load (model/weights.h set_q8act_packs) and points
// ops::WeightView::q8packed at the copy; cpu::matmul_q8act then runs this kernel.
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace tinyloop::cpu::detail {

// Bytes of w's packed copy; 0 when it cannot be packed (not ops::q8act_applies, or this CPU
// has no AVX512-VNNI: the copy is only for this kernel).
int64_t q8act_packed_bytes(const ops::WeightView& w);

// Writes w's packed copy into out [q8act_packed_bytes(w)] (64-byte aligned for speed).
// Throws std::invalid_argument when q8act_packed_bytes(w) is 0.
void pack_q8act(const ops::WeightView& w, void* out);

// x [T, K], w [N, K] with w.q8packed = its packed copy, bias [N] or null, y [T, N].
void matmul_q8act_packed(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

}  // namespace tinyloop::cpu::detail
