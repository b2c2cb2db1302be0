// What the packed q8 kernels share (matmul_q8act_packed.cc: AVX512-VNNI and AVX2 tiles;
// matmul_amx_int8.cc: AMX-INT8 tiles): the packed cell layout and the quantized x of a call.
// The layout itself is described at the top of matmul_q8act_packed.cc.
#pragma once
#include <cstdint>

namespace tinyloop::cpu::detail {

constexpr int64_t kGroupRows = 16;  // output rows interleaved in one cell
constexpr int64_t kQuadBytes = 64;  // one quad of 16 rows: one zmm, one AMX "B" tile row

// A cell: the weight bytes, then d_w [16] (and o_w [16] for int4) in the weight's own param
// dtype (F16 stays F16: decode is bound by the bytes it streams, and the tile converts them
// exactly in a register).
constexpr int64_t weight_bytes(bool int4) { return int4 ? 4 * kQuadBytes : 8 * kQuadBytes; }
constexpr int64_t param_bytes(bool f16) { return f16 ? 2 * kGroupRows : 4 * kGroupRows; }
constexpr int64_t cell_bytes(bool int4, bool f16) { return weight_bytes(int4) + (int4 ? 2 : 1) * param_bytes(f16); }

// Decode prefetches this many bytes ahead in each group's run (into the next groups' runs
// near its end). Engine tg128 int4, 1 thread, Xeon (2026-12-01): none 175-198 t/s, 4 cells
// (1-2 KiB) 197-215, 8-32 cells no better: decode streamed the weights at that core's
// bandwidth (~22 GB/s). A core of the EPYC Zen 5 reads ~40 GB/s from memory and more from
// the L3 (the loop block's weights), and there 4 cells left it short: engine tg64, bench
// model, 1 thread (2026-12-03), 4 cells / 8 / 16 / 24 / 32 KiB: int8 227-248 / 193-200 /
// 260-269 / 245-262 / 243-250 t/s, int4 295-305 / 317-321 / 359-367 / 383-387 / 365-377.
// At 2 threads the two were within the noise (int4, d0 and d4096, 4 alternating runs),
// though near a task's end the prefetch reaches the next task, often the other thread's.
// 16 KiB is the F16 fused path's distance too (matmul-inl.h kFusedPrefetchBytes). Past the
// packed copy's end the addresses are only prefetched, never read (no fault on x86).
// Into L2 (_MM_HINT_T1), as matmul-inl.h explains: EPYC Zen 4, engine tg64, bench model
// (2026-12-04), L1 / L2: int4 1 thread 357 / 374 t/s, 2 threads 496 / 559, int8 about even.
constexpr int64_t kPrefetchBytes = 16384;

// Everything the tiles read. x side per call: xq [Tp, K] int8 in column order, dx / sx /
// corr [Tp, nb] (d_x, the Q8_1 sums s_x for int4, -128 * the integer block sums for int8),
// where Tp >= T: the AMX kernel's tiles load 16 x rows at a time, so its calls pad x to a
// multiple of 16 rows (zeros, never stored); the vector kernels read only the T rows.
struct Q8PackedCtx {
  bool int4, pf16;  // int4 weight; F16 params
  int64_t T, N, K, nb;
  const int8_t* xq;
  const float* dx;
  const float* sx;
  const int32_t* corr;
  const uint8_t* packed;  // [ceil(N / 16), nb, cell]
  int64_t cb, wb;  // cell bytes, weight bytes of a cell
  const float* bias;  // [N] or null
  float* y;  // [T, N]
};

// One x row x [K] (K a multiple of 32) quantized bit for bit as ops::detail::quantize_row_q8
// (q [K] in column order, d / s [K / 32]) with AVX2: the AVX2 tiles' quantizer. Needs
// packed_avx2_supported(); x86-64 only.
void quantize_row_q8_avx2(const float* x, int64_t K, int8_t* q, float* d, float* s);

// The AMX-INT8 kernel (matmul_amx_int8.cc) on weight rows [n0, n1) (n0 a multiple of 16),
// every x row. Needs cpu::amx_status().int8 (the caller checks) and c.xq / dx / sx / corr
// padded to ceil(T / 16) * 16 rows.
void amx_int8_range(const Q8PackedCtx& c, int64_t n0, int64_t n1);

}  // namespace tinyloop::cpu::detail
