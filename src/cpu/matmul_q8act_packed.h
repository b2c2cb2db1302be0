// The q8-activation matmul (ops/matmul_q8act.h) on a repacked copy of the weight: 16 output
// rows interleaved by 4 columns per block of 32, so AVX512-VNNI's vpdpbusd yields 16 rows'
// exact block sums at once (matmul_q8act_packed.cc has the layout), and AVX2's vpmaddubsw +
// vpmaddwd 8 rows' at a time. Both bit for bit ops::ref::matmul_q8act; the VNNI one is
// 1.5-2.5x the unpacked VNNI kernel, the AVX2 one 2-7x the portable Highway kernel
// (docs/benchmarks.md).
// The model packs every q8 weight once at load (model/weights.h set_q8act_packs) and points
// ops::WeightView::q8packed at the copy; cpu::matmul_q8act then runs this kernel.
#pragma once
#include <cstdint>

#include "base/views.h"

namespace tinyloop::cpu::detail {

// The kernels on the packed copy: AVX512-VNNI (vpdpbusd), AVX2 + FMA + F16C (vpmaddubsw +
// vpmaddwd) for CPUs without it, and AMX-INT8 tiles (TDPBSUD, matmul_amx_int8.cc) for many
// x rows on CPUs with them (cpu::matmul_q8act picks it from amx_int8_min_rows rows; it takes
// any T). All give the reference's bits.
enum class PackedIsa { Avx512Vnni, Avx2, AmxInt8 };
bool packed_amx_int8_supported();  // this CPU and process run the AMX-INT8 kernel now (amx_int8_active)
bool packed_avx2_supported();  // this CPU runs the AVX2 kernel (and the kernel is compiled)

// Bytes of w's packed copy; 0 when it cannot be packed (not ops::q8act_applies, or this CPU
// runs neither kernel).
int64_t q8act_packed_bytes(const ops::WeightView& w);

// Writes w's packed copy into out [q8act_packed_bytes(w)] (64-byte aligned for speed).
// Throws std::invalid_argument when q8act_packed_bytes(w) is 0.
void pack_q8act(const ops::WeightView& w, void* out);

// Rows from which cpu::matmul_q8act runs the AMX-INT8 kernel where it can (below them the
// VNNI kernel: a batched decode of a few rows streams the weights, a 16-row tile spends most
// of its rows on padding, and int4 unpacks each group's cells per call). q8act_bench, Intel
// Xeon family 6 model 207, 1 thread, 768 x 2048 / 768 x 32000, VNNI vs AMX GFLOP/s
// (2026-12-05): int8 T=4 365/260, 251/209; T=8 384/412, 320/360; T=16 396/526, 345/549;
// int4 T=8 309/256, 284/201; T=16 318/326, 305/317; T=64 320/421, 327/417.
constexpr int64_t amx_int8_min_rows(bool int4) { return int4 ? 16 : 8; }

// x [T, K], w [N, K] with w.q8packed = its packed copy, bias [N] or null, y [T, N], on the
// kernel `isa` (std::runtime_error when this CPU lacks it).
void matmul_q8act_packed(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y,
                         PackedIsa isa);

}  // namespace tinyloop::cpu::detail
