// Per-target matmul kernels, templated on the weight element type; included once per
// Highway target by matmul_{f32,f16,bf16}.cc (one translation unit per weight type, as
// gemma.cpp does, so the three compile in parallel).
//
// The arithmetic of one output element y[t, n] (what batch invariance rests on):
//   acc = 0 (a float vector of Lanes lanes)
//   for each full vector k:   acc = MulAdd(x[t, k:k+L], widen(W[n, k:k+L]), acc)
//   tail (K % L elements):    acc = MulAdd(zero-padded x tail, zero-padded W tail, acc)
//   y = SumOfLanes(acc) (+ bias[n])
// Each element has its own accumulator and nothing else enters it, so the micro-kernel
// shape (how many rows and columns share a loop), the path (fused, direct or tiled: by T,
// matmul_internal.h) and the thread do not change the bits. Every path widens F16/BF16
// exactly, so they agree too.
#if defined(TINYLOOP_CPU_MATMUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TINYLOOP_CPU_MATMUL_INL_H_
#undef TINYLOOP_CPU_MATMUL_INL_H_
#else
#define TINYLOOP_CPU_MATMUL_INL_H_
#endif

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/matmul_internal.h"
#include "cpu/simd-inl.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Micro-kernel shapes (x rows x weight rows) per register file: MR * NR accumulators + MR x
// vectors + 1 weight vector must fit. AVX-512 has 32 vector registers, AVX2 and SSE 16.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kTileMR = 4, kTileNR = 4;  // 16 + 4 + 1 = 21 of 32
// The prefill path's 8 x 3 tile (DotTile83Part: 24 + 3 + 1 of 32) runs in one pass over K
// where its 8 x rows take less than this (K < 1024), so they stay in L1 while the weight
// rows stream from L2. EPYC Zen 5, one thread, F16, T = 512 (`TINYLOOP_BENCH_PREFILL_SHAPES=1
// cpu_kernels_bench`, the two tiles alternating in one binary, 2026-12-07), GFLOP/s 4 x 4 /
// 8 x 3: K = 256 144-150 / 159-169, K = 768 N = 768 165-169 / 180-182, K = 768 N = 2048
// 141-163 / 164-176.
constexpr int64_t kWideTileXBytes = 32 << 10;
HWY_INLINE constexpr bool OnePass83(int64_t K) { return K * 8 * int64_t(sizeof(float)) < kWideTileXBytes; }
// From K = 1024 on, the 8 x rows go in K chunks of kChunkFloats, each copied into one
// contiguous 16 KiB block first, where a task has kChunkedMinRows weight rows or more to share
// the copy (else the 4 x 4 tile runs). Why the copy: rows of a K that is a multiple of 1024
// floats lie a multiple of 4 KiB apart, so the 8 rows' lines at one k all fall in one L1 set
// (48 KiB, 12 ways of 4 KiB) beside the 3 weight rows': chunking alone measured no faster
// than the 4 x 4 tile, and one pass at K = 1024 no faster either. Why the task size: the copy
// costs about a sixth of a 4-group (12-row) pass over it. A scratch A/B calling cpu::matmul
// with the variants alternating call by call (30-40 calls each), one thread, F16, T = 512,
// EPYC Zen 5, 2026-12-07, GFLOP/s p25 (best): K = 2048 N = 768 4 x 4 118-132 (131-142),
// chunks of 512 copied 136-172 (179-181), of 1024 copied 133 (175), of 512 not copied 101
// (140); K = 2048 N = 2048 114-138 / 139-166, N = 5632 140 / 168; K = 1024 N = 1024 one pass
// 150 / chunked 177, N = 2816 123 / 165; K = 768 N = 2048 one pass 166 / chunked 162 (so
// one pass stays below 1024); 2 threads K = 2048 N = 768 219 / 284. K = 5632 N = 2048 on
// tasks of 12 rows: 4 x 4 98 / chunked 76, so larger K get tasks of kChunkedMinRows rows
// and a widened tile of column spans (ChunkedRange): 126-136 -> 148-159
// (`TINYLOOP_BENCH_PREFILL_SHAPES=ouro cpu_kernels_bench`, best of 4-5 alternating runs).
constexpr int64_t kChunkFloats = 512, kChunkedMinRows = 36;
// The widened weight tile's bytes on the chunked path, a third of a 1 MiB L2 (kTileBytes
// elsewhere): all of K up to 2730 on tasks of 36 rows (K = 2048: 48 rows, not 12), spans of
// 2560 columns at K = 5632 (spans of 1024 measured the same there, of 512 slower).
constexpr int64_t kChunkedTileBytes = 384 << 10;
#else
constexpr int kTileMR = 3, kTileNR = 4;  // 12 + 3 + 1 = 16 of 16
#endif

// One weight vector (column J of the tile) into the accumulators of every x row. Written
// out with named accumulators rather than arrays: GCC 12 kept an array of 16 accumulator
// vectors in memory (a store of each per iteration: 2.5x slower), named ones stay in
// registers.
// Macro-generated registers, one statement a line: left as written.
// clang-format off
#define TINYLOOP_TILE_COLUMN(J, LOAD)                                   \
  if constexpr (NR > J) {                                               \
    const V wv = LOAD;                                                  \
    a0##J = hn::MulAdd(x0, wv, a0##J);                                  \
    if constexpr (MR > 1) a1##J = hn::MulAdd(x1, wv, a1##J);            \
    if constexpr (MR > 2) a2##J = hn::MulAdd(x2, wv, a2##J);            \
    if constexpr (MR > 3) a3##J = hn::MulAdd(x3, wv, a3##J);            \
  }
#define TINYLOOP_TILE_OUT(I, J) \
  if constexpr (MR > I && NR > J) out[I * NR + J] = ReduceSumF32(df, a##I##J);

// out[i * NR + j] = dot(x_i[K], W_j[K]) for i < MR, j < NR (both <= 4), with the
// per-element arithmetic described at the top. kPrefetch: also prefetches into L2 a line of
// each of pf's 4 rows every 64 bytes of w (the batched decode's next weight group).
//   x   MR row pointers, each [K] float (pointers may repeat: padding rows)
//   w   NR row pointers, each [K] of WT
//   out [MR * NR]
//   pf  4 row pointers, each [K] of WT (kPrefetch only)
template <int MR, int NR, typename WT, bool kPrefetch = false>
HWY_INLINE void DotTile(const float* const* HWY_RESTRICT x, const WT* const* HWY_RESTRICT w,
                        size_t K, float* HWY_RESTRICT out, const WT* const* HWY_RESTRICT pf = nullptr) {
  static_assert(MR >= 1 && MR <= 4 && NR >= 1 && NR <= 4, "tile up to 4 x 4");
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const size_t L = hn::Lanes(df);
  // Unused accumulators are dead code the compiler drops.
  V a00 = hn::Zero(df), a01 = a00, a02 = a00, a03 = a00;
  V a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  V a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  V a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  size_t k = 0;
  for (; k + L <= K; k += L) {
    const V x0 = hn::LoadU(df, x[0] + k);
    const V x1 = MR > 1 ? hn::LoadU(df, x[1] + k) : x0;
    const V x2 = MR > 2 ? hn::LoadU(df, x[2] + k) : x0;
    const V x3 = MR > 3 ? hn::LoadU(df, x[3] + k) : x0;
    TINYLOOP_TILE_COLUMN(0, LoadF32(df, w[0] + k))
    TINYLOOP_TILE_COLUMN(1, LoadF32(df, w[1] + k))
    TINYLOOP_TILE_COLUMN(2, LoadF32(df, w[2] + k))
    TINYLOOP_TILE_COLUMN(3, LoadF32(df, w[3] + k))
    if constexpr (kPrefetch) {
      if ((k * sizeof(WT)) % 64 == 0) {
        __builtin_prefetch(pf[0] + k, 0, 2);
        __builtin_prefetch(pf[1] + k, 0, 2);
        __builtin_prefetch(pf[2] + k, 0, 2);
        __builtin_prefetch(pf[3] + k, 0, 2);
      }
    }
  }
  if (k < K) {
    const size_t rem = K - k;
    const V x0 = LoadF32Tail(df, x[0] + k, rem);
    const V x1 = MR > 1 ? LoadF32Tail(df, x[1] + k, rem) : x0;
    const V x2 = MR > 2 ? LoadF32Tail(df, x[2] + k, rem) : x0;
    const V x3 = MR > 3 ? LoadF32Tail(df, x[3] + k, rem) : x0;
    TINYLOOP_TILE_COLUMN(0, LoadF32Tail(df, w[0] + k, rem))
    TINYLOOP_TILE_COLUMN(1, LoadF32Tail(df, w[1] + k, rem))
    TINYLOOP_TILE_COLUMN(2, LoadF32Tail(df, w[2] + k, rem))
    TINYLOOP_TILE_COLUMN(3, LoadF32Tail(df, w[3] + k, rem))
  }
  if constexpr (NR == 4) {  // a row's four outputs reduced together (same bits, fewer shuffles)
    ReduceSum4F32(df, a00, a01, a02, a03, out);
    if constexpr (MR > 1) ReduceSum4F32(df, a10, a11, a12, a13, out + 4);
    if constexpr (MR > 2) ReduceSum4F32(df, a20, a21, a22, a23, out + 8);
    if constexpr (MR > 3) ReduceSum4F32(df, a30, a31, a32, a33, out + 12);
  } else {
    TINYLOOP_TILE_OUT(0, 0) TINYLOOP_TILE_OUT(0, 1) TINYLOOP_TILE_OUT(0, 2) TINYLOOP_TILE_OUT(0, 3)
    TINYLOOP_TILE_OUT(1, 0) TINYLOOP_TILE_OUT(1, 1) TINYLOOP_TILE_OUT(1, 2) TINYLOOP_TILE_OUT(1, 3)
    TINYLOOP_TILE_OUT(2, 0) TINYLOOP_TILE_OUT(2, 1) TINYLOOP_TILE_OUT(2, 2) TINYLOOP_TILE_OUT(2, 3)
    TINYLOOP_TILE_OUT(3, 0) TINYLOOP_TILE_OUT(3, 1) TINYLOOP_TILE_OUT(3, 2) TINYLOOP_TILE_OUT(3, 3)
  }
}
#undef TINYLOOP_TILE_COLUMN
#undef TINYLOOP_TILE_OUT
// clang-format on

// The 8 x 3 tile of the prefill path (8 x rows, 3 weight rows: 24 accumulators + 3 weight
// vectors + 1 x vector of AVX-512's 32 registers), with DotTile's per-element arithmetic
// (each output one vector chain over k, the zero-padded tail, then ReduceSumF32's tree), so
// its bits are DotTile's. Per k step 11 loads feed 24 FMAs (DotTile 4 x 4: 8 for 16), and the
// weight rows, the stream from L2, are read once for 8 x rows instead of 4.
//   x   8 row pointers, each [K] float (pointers may repeat: padding rows)
//   w   3 row pointers, each [K] float
//   out [8 * 3]
// GCC folds a vector loaded once and used three times into three FMA memory operands (three
// loads); an empty asm that claims to change the register keeps it one load. AVX-512 only:
// narrower targets have 16 registers.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define TINYLOOP_IN_REGISTER(v) asm("" : "+v"(v.raw));
// Macro-generated registers, one statement a line: left as written.
// clang-format off
#define TINYLOOP_TILE83_ROW(I, LOADX)                   \
  {                                                    \
    V xv = LOADX;                                      \
    TINYLOOP_IN_REGISTER(xv)                           \
    r##I##0 = hn::MulAdd(xv, w0, r##I##0);             \
    r##I##1 = hn::MulAdd(xv, w1, r##I##1);             \
    r##I##2 = hn::MulAdd(xv, w2, r##I##2);             \
  }
#define TINYLOOP_TILE83_STEP(LOAD)                                                  \
  const V w0 = LOAD(w[0]), w1 = LOAD(w[1]), w2 = LOAD(w[2]);                        \
  TINYLOOP_TILE83_ROW(0, LOAD(x[0])) TINYLOOP_TILE83_ROW(1, LOAD(x[1]))             \
  TINYLOOP_TILE83_ROW(2, LOAD(x[2])) TINYLOOP_TILE83_ROW(3, LOAD(x[3]))             \
  TINYLOOP_TILE83_ROW(4, LOAD(x[4])) TINYLOOP_TILE83_ROW(5, LOAD(x[5]))             \
  TINYLOOP_TILE83_ROW(6, LOAD(x[6])) TINYLOOP_TILE83_ROW(7, LOAD(x[7]))
// One K chunk of n elements of the tile (x and w point at the chunk's first element):
// kFirst starts the 24 accumulators at zero, otherwise they are loaded from acc; kLast runs
// the zero-padded tail (the chunk ends at K) and reduces into out, otherwise the
// accumulators are stored back to acc. Every chunk but the last is whole vectors, so the
// chunks together run exactly the vector steps of one pass over K, and storing a vector and
// loading it back is exact: the bits do not depend on the chunking.
//   x   8 row pointers, each [n] float (pointers may repeat: padding rows)
//   w   3 row pointers, each [n] float
//   acc [24, L] float accumulators between chunks, 64-byte aligned (unused when kFirst && kLast)
//   out [8 * 3] (kLast only)
template <bool kFirst, bool kLast>
HWY_INLINE void DotTile83Part(const float* const* HWY_RESTRICT x, const float* const* HWY_RESTRICT w, size_t n,
                              float* HWY_RESTRICT acc, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const size_t L = hn::Lanes(df);
  V r00, r01, r02, r10, r11, r12, r20, r21, r22, r30, r31, r32;
  V r40, r41, r42, r50, r51, r52, r60, r61, r62, r70, r71, r72;
  if constexpr (kFirst) {
    r00 = hn::Zero(df);
    r01 = r02 = r10 = r11 = r12 = r20 = r21 = r22 = r30 = r31 = r32 = r00;
    r40 = r41 = r42 = r50 = r51 = r52 = r60 = r61 = r62 = r70 = r71 = r72 = r00;
  } else {
    // clang-format off
    r00 = hn::Load(df, acc + 0 * L);  r01 = hn::Load(df, acc + 1 * L);  r02 = hn::Load(df, acc + 2 * L);
    r10 = hn::Load(df, acc + 3 * L);  r11 = hn::Load(df, acc + 4 * L);  r12 = hn::Load(df, acc + 5 * L);
    r20 = hn::Load(df, acc + 6 * L);  r21 = hn::Load(df, acc + 7 * L);  r22 = hn::Load(df, acc + 8 * L);
    r30 = hn::Load(df, acc + 9 * L);  r31 = hn::Load(df, acc + 10 * L); r32 = hn::Load(df, acc + 11 * L);
    r40 = hn::Load(df, acc + 12 * L); r41 = hn::Load(df, acc + 13 * L); r42 = hn::Load(df, acc + 14 * L);
    r50 = hn::Load(df, acc + 15 * L); r51 = hn::Load(df, acc + 16 * L); r52 = hn::Load(df, acc + 17 * L);
    r60 = hn::Load(df, acc + 18 * L); r61 = hn::Load(df, acc + 19 * L); r62 = hn::Load(df, acc + 20 * L);
    r70 = hn::Load(df, acc + 21 * L); r71 = hn::Load(df, acc + 22 * L); r72 = hn::Load(df, acc + 23 * L);
    // clang-format on
  }
  size_t k = 0;
  for (; k + L <= n; k += L) {
#define TINYLOOP_LOAD_FULL(P) hn::LoadU(df, (P) + k)
    TINYLOOP_TILE83_STEP(TINYLOOP_LOAD_FULL)
#undef TINYLOOP_LOAD_FULL
  }
  if constexpr (kLast) {
    if (k < n) {
      const size_t rem = n - k;
#define TINYLOOP_LOAD_TAIL(P) LoadF32Tail(df, (P) + k, rem)
      TINYLOOP_TILE83_STEP(TINYLOOP_LOAD_TAIL)
#undef TINYLOOP_LOAD_TAIL
    }
    // out[i * 3 + j] in order, four at a time (6 reductions of 4 outputs, none wasted).
    ReduceSum4F32(df, r00, r01, r02, r10, out);
    ReduceSum4F32(df, r11, r12, r20, r21, out + 4);
    ReduceSum4F32(df, r22, r30, r31, r32, out + 8);
    ReduceSum4F32(df, r40, r41, r42, r50, out + 12);
    ReduceSum4F32(df, r51, r52, r60, r61, out + 16);
    ReduceSum4F32(df, r62, r70, r71, r72, out + 20);
  } else {
    // clang-format off
    hn::Store(r00, df, acc + 0 * L);  hn::Store(r01, df, acc + 1 * L);  hn::Store(r02, df, acc + 2 * L);
    hn::Store(r10, df, acc + 3 * L);  hn::Store(r11, df, acc + 4 * L);  hn::Store(r12, df, acc + 5 * L);
    hn::Store(r20, df, acc + 6 * L);  hn::Store(r21, df, acc + 7 * L);  hn::Store(r22, df, acc + 8 * L);
    hn::Store(r30, df, acc + 9 * L);  hn::Store(r31, df, acc + 10 * L); hn::Store(r32, df, acc + 11 * L);
    hn::Store(r40, df, acc + 12 * L); hn::Store(r41, df, acc + 13 * L); hn::Store(r42, df, acc + 14 * L);
    hn::Store(r50, df, acc + 15 * L); hn::Store(r51, df, acc + 16 * L); hn::Store(r52, df, acc + 17 * L);
    hn::Store(r60, df, acc + 18 * L); hn::Store(r61, df, acc + 19 * L); hn::Store(r62, df, acc + 20 * L);
    hn::Store(r70, df, acc + 21 * L); hn::Store(r71, df, acc + 22 * L); hn::Store(r72, df, acc + 23 * L);
    // clang-format on
  }
}
#undef TINYLOOP_IN_REGISTER
#undef TINYLOOP_TILE83_ROW
#undef TINYLOOP_TILE83_STEP
// clang-format on
#endif  // AVX-512

// Weight rows per task of the tiled path (the driver splits N into tasks of this many rows,
// matmul.cc): as many as fit the widened tile (f32 weights are used in place, but the same
// split keeps their working set in L2 too), a multiple of 12 so that both micro-tiles (4
// weight rows, and AVX-512's 8 x 3) cover a task without a ragged group: with 40 rows
// (K = 768) the 8 x 3 tile left one row to a 4 x 1 tile at a third of its speed. On AVX-512
// a K beyond one 8 x 3 pass (ChunkedRange, which widens a span of columns at a time) gets
// kChunkedTileBytes and at least kChunkedMinRows rows whatever K is (float_tile false: the
// int8 / int4 tiled path, which runs the 4 x 4 tile only, keeps kTileBytes).
HWY_INLINE int64_t TiledTaskRows(int64_t K, bool float_tile) {
  const int64_t row_bytes = (K + 15) / 16 * 16 * int64_t(sizeof(float));  // K padded to the widest vector
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (float_tile && !OnePass83(K))
    return std::clamp<int64_t>(kChunkedTileBytes / row_bytes / 12 * 12, kChunkedMinRows, detail::kTileMaxRows);
#endif
  return std::clamp<int64_t>(detail::kTileBytes / row_bytes / 12 * 12, 12, detail::kTileMaxRows);
}

// y[t0 .. t0+mt, n0 .. n0+mj] from a tile result acc[MR * NR] (+ bias). Only the mt x mj
// valid part is written; padded rows / columns are dropped.
template <int NR>
HWY_INLINE void StoreTile(const float* acc, int64_t mt, int64_t mj, const float* bias, float* y, int64_t N, int64_t t0,
                          int64_t n0) {
  for (int64_t i = 0; i < mt; ++i) {
    float* yr = y + (t0 + i) * N + n0;  // [mj] of row t0 + i
    for (int64_t j = 0; j < mj; ++j) yr[j] = bias ? acc[i * NR + j] + bias[n0 + j] : acc[i * NR + j];
  }
}

// xr[MR]: x rows t0 .. t0+mt (mt <= MR), the last one repeated into the padding slots (a
// padded row's results are computed and dropped by StoreTile).
template <int MR>
HWY_INLINE void XRows(const detail::MatmulArgs& a, int64_t t0, int64_t mt, const float** xr) {
  for (int i = 0; i < MR; ++i) xr[i] = a.x + (t0 + std::min<int64_t>(i, mt - 1)) * a.K;
}

// How far ahead of its read position the fused path prefetches weights. Measured on one
// core of the EPYC Zen 5 (F16, K = 768, 2026-12-03): without it the row-by-row stream ran at
// 44 GB/s from the L3 (a 28 MB loop block re-read) and 37 GB/s from memory; 8 KiB ahead gave
// 58 / 48, 12-24 KiB 64 / 51, 32 KiB and more fell back (the prefetched lines are evicted
// before use). 16 KiB is about what the memory system must have in flight at 40 GB/s and
// ~400 ns latency. The prefetch goes to L2 (prefetcht1), not L1: an L1 prefetch holds one
// of the core's few L1 miss buffers for the whole memory latency, stalling the stream's
// own loads. Engine tinyloop bench tg64, bench model, EPYC Zen 4 (2026-12-04), L1 / L2:
// F16 1 thread 77 / 91 t/s, 2 threads 118 / 140; 32 KiB ahead into L2 no faster. Not
// re-measured on Zen 5 or the Xeon. The builtin is written at the call, not in a helper
// (GCC drops a non-inlined prefetch helper's body when called from Highway code).
constexpr int64_t kFusedPrefetchBytes = 16384;

// Weight rows side by side in the fused path, so that MR * R independent FMA chains run at
// once (R = FusedRowsFor(MR)). One output element is still one chain (the arithmetic at the
// top), so R changes only the speed. With 16 float lanes (AVX-512) a 64-byte line of F16 is
// 2 FMAs of one chain, and one row at a time streams fastest: on the EPYC Zen 5 4 rows side
// by side read 36-42 GB/s from memory against 48-51 for one ("Decode weight streams" in
// docs/benchmarks.md). With 8 lanes (AVX2) a line is 4 dependent FMAs, 16 cycles at Zen 3's
// 4-cycle latency, so narrower targets run 4 chains. EPYC Zen 3 (family 25 model 1), one
// thread, 2026-12-07: the loop block re-read (`TINYLOOP_BENCH_LOOP_BLOCK=1
// cpu_kernels_bench`) 12.9-14.1 GB/s with one chain, 11.9-19.6 with 2, 15.3-21.7 with 4;
// engine tg, the bundled model (cache-resident) 376-409 t/s one / 437-516 two / 575-745
// four chains; the benchmark model (304 MB a token from DRAM, ~14 GB/s either way) 41-45 /
// 45-48 / 44-47, the same within the noise.
constexpr int kFusedChains = hn::MaxLanes(hn::ScalableTag<float>()) >= 16 ? 1 : 4;
template <int MR>
constexpr int FusedRowsFor() {
  return std::max(1, kFusedChains / MR);
}

// R weight rows against MR rows of x (out[r * MR + i] = dot(x_i, w_r), the per-element
// arithmetic at the top: one accumulator per (row, x row), vectors in k order, the tail
// zero-padded). MR * R <= 4.
// kPrefetch: also prefetches each row's bytes kFusedPrefetchBytes past each 64-byte step
// (the caller checks they lie inside its range). The k loop goes a cache line of weights
// a step (U vectors) so that there is one prefetch a line: a prefetch every vector of F16
// measured 15-20 % slower on cache-resident rows (its extra instructions), one a line cost
// nothing there.
//   x   MR row pointers, each [K] float
//   w   [R, ld] of WT: rows w, w + ld, ..., each [K]
//   out [R * MR]
template <int MR, int R, bool kPrefetch, typename WT>
HWY_INLINE void FusedDot(const float* const* HWY_RESTRICT x, const WT* HWY_RESTRICT w, size_t ld, size_t K,
                         float* HWY_RESTRICT out) {
  static_assert(MR >= 1 && R >= 1 && MR * R <= 4, "up to 4 chains");
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const size_t L = hn::Lanes(df);
  // Vectors a cache line of weights spans (at least 1): 2 for F16 / BF16 on AVX-512.
  constexpr size_t kU = std::max<size_t>(1, 64 / (hn::MaxLanes(hn::ScalableTag<float>()) * sizeof(WT)));
  // Chain c = r * MR + i: weight row r, x row i. Named, not an array (see DotTile).
  V a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
  // One vector of every chain at k: xv(i) the x rows' vectors, wv(r) the weight rows'.
  const auto fma_all = [&](const auto& xv, const auto& wv) HWY_ATTR {
    a0 = hn::MulAdd(xv(0), wv(0), a0);
    if constexpr (MR * R > 1) a1 = hn::MulAdd(xv(1 % MR), wv(1 / MR), a1);
    if constexpr (MR * R > 2) a2 = hn::MulAdd(xv(2 % MR), wv(2 / MR), a2);
    if constexpr (MR * R > 3) a3 = hn::MulAdd(xv(3 % MR), wv(3 / MR), a3);
  };
  // One vector of every chain at k, each row's vector read by load(row pointer): LoadF32 for
  // whole vectors, LoadF32Tail for the zero-padded tail.
  const auto step_with = [&](size_t k, const auto& load) HWY_ATTR {
    const V w0 = load(w + k);
    const V w1 = R > 1 ? load(w + ld + k) : w0;
    const V w2 = R > 2 ? load(w + 2 * ld + k) : w0;
    const V w3 = R > 3 ? load(w + 3 * ld + k) : w0;
    const V x0 = load(x[0] + k);
    const V x1 = MR > 1 ? load(x[1] + k) : x0;
    const V x2 = MR > 2 ? load(x[2] + k) : x0;
    const V x3 = MR > 3 ? load(x[3] + k) : x0;
    fma_all([&](int i) HWY_ATTR { return i == 0   ? x0
                                         : i == 1 ? x1
                                         : i == 2 ? x2
                                                  : x3; },
            [&](int r) HWY_ATTR {
              return r == 0 ? w0 : r == 1 ? w1 : r == 2 ? w2 : w3;
            });
  };
  const auto step = [&](size_t k) HWY_ATTR { step_with(k, [&](const auto* p) HWY_ATTR { return LoadF32(df, p); }); };
  size_t k = 0;
  if (L * kU * sizeof(WT) <= 64) {  // always on x86 targets (L is MaxLanes there)
    for (; k + kU * L <= K; k += kU * L) {
      if constexpr (kPrefetch) {
        const char* p = reinterpret_cast<const char*>(w + k) + kFusedPrefetchBytes;
        __builtin_prefetch(p, 0, 2);
        if constexpr (R > 1) __builtin_prefetch(p + ld * sizeof(WT), 0, 2);
        if constexpr (R > 2) __builtin_prefetch(p + 2 * ld * sizeof(WT), 0, 2);
        if constexpr (R > 3) __builtin_prefetch(p + 3 * ld * sizeof(WT), 0, 2);
      }
      for (size_t u = 0; u < kU; ++u) step(k + u * L);
    }
  }
  for (; k + L <= K; k += L) step(k);
  if (k < K) step_with(k, [&](const auto* p) HWY_ATTR { return LoadF32Tail(df, p, K - k); });
  out[0] = ReduceSumF32(df, a0);
  if constexpr (MR * R > 1) out[1] = ReduceSumF32(df, a1);
  if constexpr (MR * R > 2) out[2] = ReduceSumF32(df, a2);
  if constexpr (MR * R > 3) out[3] = ReduceSumF32(df, a3);
}

// Fused path, MR rows of x (t0 .. t0+mt, mt <= MR) against weight rows [n0, n1), the
// weights widened in registers: W is read once for these rows.
// FusedRowsFor(MR) weight rows at a time, front to back, so the task's rows form one
// sequential stream: what the hardware prefetcher serves best. Reading 4 rows side by side
// (4 accumulator chains) looked better for latency but turned the matrix into 1-8 KiB
// streams that restart every few rows: on one core of the EPYC test machine a 98 MB F16
// matrix-vector product streamed at 19-26 GB/s row by row against 7-12 GB/s four rows at a
// time (software prefetching 16 KiB ahead recovered only part of it), and the benchmark
// model's decode matmuls went from ~22 to ~45 tokens/s. (That was an AVX-512 target; on
// AVX2 the single chain itself is the limit, see kFusedChains.) The stream is
// software-prefetched kFusedPrefetchBytes ahead (FusedDot) up to the matrix's last row,
// past the task's own range: with tasks of 32 rows, stopping at the task's end left its
// last third and the next task's first 16 KiB to the hardware prefetcher. One core of the
// EPYC Zen 5 (2026-12-03), the benchmark model's loop block re-read from the L3
// (`TINYLOOP_BENCH_LOOP_BLOCK=1 cpu_kernels_bench`): 37-38 GB/s without, 38-41 prefetching
// inside the task, 47-48 to the matrix's end; 2 threads 75-78 -> 84 GB/s, where the next
// task is often the other thread's (a line fetched twice costs less than a stall), and
// 93-95 with the longer tasks of matmul_split.h stream_task_rows. Bytes past the matrix
// are never prefetched: they are not the weights'.
template <int MR, typename WT>
HWY_NOINLINE void FusedRows(const detail::MatmulArgs& a, int64_t t0, int64_t mt, int64_t n0, int64_t n1) {
  constexpr int R = FusedRowsFor<MR>();
  const WT* w = static_cast<const WT*>(a.w);  // [N, K]
  const int64_t K = a.K;
  const float* xr[MR];
  XRows<MR>(a, t0, mt, xr);
  // Rows n < n_pf prefetch bytes that lie inside W's N rows.
  const int64_t row_bytes = K * int64_t(sizeof(WT));
  const int64_t n_pf = a.N - std::min<int64_t>(a.N - n0, (kFusedPrefetchBytes + row_bytes - 1) / row_bytes + 1);
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    float acc[R * MR];  // [R, MR]: row r's result for x row i at r * MR + i
    if (n + R - 1 < n_pf) FusedDot<MR, R, true, WT>(xr, w + n * K, size_t(K), size_t(K), acc);
    else FusedDot<MR, R, false, WT>(xr, w + n * K, size_t(K), size_t(K), acc);
    for (int r = 0; r < R; ++r) StoreTile<1>(acc + r * MR, mt, 1, a.bias, a.y, a.N, t0, n + r);
  }
  for (; n < n1; ++n) {  // the last rows of a range that is not a multiple of R
    float acc[MR];
    if (n < n_pf) FusedDot<MR, 1, true, WT>(xr, w + n * K, size_t(K), size_t(K), acc);
    else FusedDot<MR, 1, false, WT>(xr, w + n * K, size_t(K), size_t(K), acc);
    StoreTile<1>(acc, mt, 1, a.bias, a.y, a.N, t0, n);
  }
}

// Widens columns [c0, c1) of rows [n0, n0 + nb) of W into buf[nb, ldb] (ldb >= c1 - c0
// rounded up to whole vectors). Full vectors through LoadF32, the tail through LoadF32Tail:
// the same exact widening the fused path does in registers. c0 is a multiple of the lane
// count, so a tail (zero-padded) is only ever W's own.
//   w [N, K] of WT
template <typename WT>
HWY_INLINE void WidenCols(const WT* HWY_RESTRICT w, int64_t K, int64_t n0, int64_t nb, int64_t c0, int64_t c1,
                          int64_t ldb, float* HWY_RESTRICT buf) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df)), n = c1 - c0;
  for (int64_t r = 0; r < nb; ++r) {
    const WT* src = w + (n0 + r) * K + c0;  // [n]
    float* dst = buf + r * ldb;  // [ldb]
    int64_t k = 0;
    for (; k + L <= n; k += L) hn::StoreU(LoadF32(df, src + k), df, dst + k);
    if (k < n) hn::StoreU(LoadF32Tail(df, src + k, size_t(n - k)), df, dst + k);
  }
}

// Tiled path for weight rows [n0, n1) (the driver keeps n1 - n0 <= kTileMaxRows and the
// widened tile within kTileBytes): widen the rows once, then sweep every x row past them.
template <typename WT>
HWY_NOINLINE void TiledRange(const detail::MatmulArgs& a, int64_t n0, int64_t n1) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t K = a.K, nb = n1 - n0;
  const float* tile;  // [nb, ld] float weight rows
  int64_t ld;
  if constexpr (std::is_same_v<WT, float>) {
    tile = static_cast<const float*>(a.w) + n0 * K;
    ld = K;
  } else {
    ld = (K + L - 1) / L * L;
    thread_local std::vector<float> buf;  // [nb, ld], grows to the largest tile seen
    if (buf.size() < size_t(nb * ld)) buf.resize(size_t(nb * ld));
    WidenCols(static_cast<const WT*>(a.w), K, n0, nb, 0, K, ld, buf.data());
    tile = buf.data();
  }
  // x rows t .. t + mt - 1 (mt <= kTileMR) against the tile's weight rows j0 .. nb - 1,
  // kTileNR at a time (a ragged last group repeats its last row).
  const auto rows4 = [&](int64_t t, int64_t mt, int64_t j0) HWY_ATTR {
    const float* xr[kTileMR];
    XRows<kTileMR>(a, t, mt, xr);
    for (int64_t j = j0; j < nb; j += kTileNR) {
      const int64_t mj = std::min<int64_t>(kTileNR, nb - j);
      const float* wr[kTileNR];
      for (int q = 0; q < kTileNR; ++q) wr[q] = tile + (j + std::min<int64_t>(q, mj - 1)) * ld;
      float acc[kTileMR * kTileNR];
      DotTile<kTileMR, kTileNR, float>(xr, wr, size_t(K), acc);
      StoreTile<kTileNR>(acc, mt, mj, a.bias, a.y, a.N, t, n0 + j);
    }
  };
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // The 8 x 3 tile in one pass over K where its 8 x rows fit L1 (OnePass83; larger K on
  // tasks of kChunkedMinRows rows run ChunkedRange); blocks of up to 4 x rows (the last one)
  // take the 4 x 4 tile, which computes fewer padding rows.
  if (OnePass83(K)) {
    const int64_t groups = nb / 3;  // 3-row weight groups; the last nb % 3 rows: the 4-row tile
    int64_t t = 0;
    for (; t + 4 < a.T; t += 8) {
      const int64_t mt = std::min<int64_t>(8, a.T - t);
      const float* xr[8];
      XRows<8>(a, t, mt, xr);
      for (int64_t g = 0; g < groups; ++g) {
        const float* wr[3] = {tile + 3 * g * ld, tile + (3 * g + 1) * ld, tile + (3 * g + 2) * ld};
        float out[24];
        DotTile83Part<true, true>(xr, wr, size_t(K), nullptr, out);
        StoreTile<3>(out, mt, 3, a.bias, a.y, a.N, t, n0 + 3 * g);
      }
      // The last 1 or 2 weight rows (tasks are multiples of 12 rows, so only at the end of N):
      // the 4-row tile on each half of the 8 x rows.
      if (3 * groups < nb) {
        rows4(t, 4, 3 * groups);
        rows4(t + 4, mt - 4, 3 * groups);
      }
    }
    if (t < a.T) rows4(t, a.T - t, 0);
    return;
  }
#endif
  for (int64_t t = 0; t < a.T; t += kTileMR) rows4(t, std::min<int64_t>(kTileMR, a.T - t), 0);
}

// y[t0 .. t0+mt, j0 .. j0+mj] (mt <= MR, mj <= kTileNR) with the tile of the prefill path on
// the weight rows as stored, widened in registers (as the fused path does); pf: null, or the
// kTileNR rows [K] of WT to prefetch meanwhile.
template <int MR, typename WT>
HWY_INLINE void DirectTile(const detail::MatmulArgs& a, int64_t t0, int64_t mt, int64_t j0, int64_t mj,
                           const WT* const* pf) {
  const WT* w = static_cast<const WT*>(a.w);  // [N, K]
  const int64_t K = a.K;
  const float* xr[MR];
  XRows<MR>(a, t0, mt, xr);
  const WT* wr[kTileNR];
  for (int q = 0; q < kTileNR; ++q) wr[q] = w + (j0 + std::min<int64_t>(q, mj - 1)) * K;
  float acc[MR * kTileNR];
  if (pf) DotTile<MR, kTileNR, WT, true>(xr, wr, size_t(K), acc, pf);
  else DotTile<MR, kTileNR, WT>(xr, wr, size_t(K), acc);
  StoreTile<kTileNR>(acc, mt, mj, a.bias, a.y, a.N, t0, j0);
}

// DirectTile for x rows t0 .. t0 + mt - 1 with mt known only at run time (1 <= mt; more than
// kTileMR is cut to kTileMR).
template <typename WT>
HWY_INLINE void DirectRows(const detail::MatmulArgs& a, int64_t t0, int64_t mt, int64_t j0, int64_t mj,
                           const WT* const* pf) {
  switch (std::min<int64_t>(kTileMR, mt)) {
    case 1: return DirectTile<1, WT>(a, t0, 1, j0, mj, pf);
    case 2: return DirectTile<2, WT>(a, t0, 2, j0, mj, pf);
    case 3: return DirectTile<3, WT>(a, t0, 3, j0, mj, pf);
    default: return DirectTile<kTileMR, WT>(a, t0, kTileMR, j0, mj, pf);
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// x rows of a panel whose accumulators ChunkedRange keeps between column spans.
constexpr int64_t kPanelRows = 512;

// The prefill path from K = 1024 on (!OnePass83), for a task of kChunkedMinRows or more
// weight rows [n0, n1): the 8 x 3 tile with the 8 x rows copied a K chunk (kChunkFloats) at a
// time into one contiguous block, each 3-row group's 24 accumulators stored between chunks
// (the header of kChunkFloats says why). The widened weight tile holds a span of S columns
// of the task's rows (S: as many whole chunks as fit kChunkedTileBytes), so any K keeps it
// in L2; where K needs more than one span, the accumulators of every 8-row block of a panel
// of up to kPanelRows x rows are kept between spans. The bits are DotTile's (DotTile83Part).
// nb is a multiple of 3 (MatmulRange sends only such tasks: the driver's are multiples of
// 12). The last <= 4 x rows run DirectTile on the weights as stored (widened in registers,
// the same arithmetic).
template <typename WT>
HWY_NOINLINE void ChunkedRange(const detail::MatmulArgs& a, int64_t n0, int64_t n1) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t K = a.K, nb = n1 - n0, groups = nb / 3;  // nb % 3 == 0
  // Columns of one span: whole chunks, at least one.
  const int64_t S =
      std::max(kChunkFloats, kChunkedTileBytes / (nb * int64_t(sizeof(float))) / kChunkFloats * kChunkFloats);
  const int64_t ldb = std::min(S, (K + L - 1) / L * L);  // the widened span's row stride
  const bool spans = K > S;  // more than one span: accumulators kept per 8-row block
  // x rows [0, t_end) go in 8-row blocks (the last may have 5-7), [t_end, T) (<= 4) to DirectTile.
  int64_t t_end = 0;
  while (t_end + 4 < a.T) t_end += 8;
  t_end = std::min(t_end, a.T);
  // Per thread, 64-byte aligned, grown to the largest call seen:
  //   wbuf  [nb, ldb] float  the span of the weight rows, widened (16-bit weights only)
  //   xpack [8, kChunkFloats] float  one chunk of an 8-row block
  //   accs  [blocks, groups, 24, L] float  (blocks: a panel's 8-row blocks, or 1 without spans)
  thread_local std::vector<float> tile_buf, xpack_buf, acc_buf;
  const auto aligned = [](std::vector<float>& v, int64_t n) {
    if (v.size() < size_t(n + 16)) v.resize(size_t(n + 16));
    return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
  };
  const int64_t blocks = spans ? (std::min(t_end, kPanelRows) + 7) / 8 : 1;
  float* const xpack = aligned(xpack_buf, 8 * kChunkFloats);
  float* const accs = aligned(acc_buf, blocks * groups * 24 * L);
  float* const wbuf = std::is_same_v<WT, float> ? nullptr : aligned(tile_buf, nb * ldb);
  const float* xp[8];  // the packed rows of a chunk
  for (int i = 0; i < 8; ++i) xp[i] = xpack + i * kChunkFloats;

  for (int64_t p0 = 0; p0 < t_end; p0 += kPanelRows) {
    const int64_t p1 = std::min(t_end, p0 + kPanelRows);
    for (int64_t ks = 0; ks < K; ks += S) {
      const int64_t ke = std::min(K, ks + S);
      // Row r of the span: tile + r * ld, its column k at (k - ks).
      const float* tile;
      int64_t ld;
      if constexpr (std::is_same_v<WT, float>) {
        tile = static_cast<const float*>(a.w) + n0 * K + ks;
        ld = K;
      } else {
        WidenCols(static_cast<const WT*>(a.w), K, n0, nb, ks, ke, ldb, wbuf);
        tile = wbuf;
        ld = ldb;
      }
      for (int64_t t = p0; t < p1; t += 8) {
        const int64_t mt = std::min<int64_t>(8, a.T - t);
        const float* xr[8];
        XRows<8>(a, t, mt, xr);
        float* const acc_block = accs + (spans ? (t - p0) / 8 : 0) * groups * 24 * L;  // [groups, 24, L]
        for (int64_t k0 = ks; k0 < ke; k0 += kChunkFloats) {
          const int64_t n = std::min(ke - k0, kChunkFloats);
          for (int i = 0; i < 8; ++i) std::copy(xr[i] + k0, xr[i] + k0 + n, xpack + i * kChunkFloats);
          // Where K takes several spans (x rows of 11 MB and more at T = 512), the next chunk's
          // x rows (this block's next chunk, else the next block's first in this span) are
          // prefetched into L2, a slice of their lines per group while this chunk runs:
          // K = 5632 N = 2048 120-147 -> 162-172 GFLOP/s (one thread, EPYC Zen 5, three
          // alternating runs of `TINYLOOP_BENCH_PREFILL_SHAPES=ouro cpu_kernels_bench`); at
          // K = 2048 (one span, 4 MB of x) it measured no faster (144-189 against 174-189).
          const float* nx[8];  // the next chunk's 8 rows, nn floats each (0: none)
          int64_t nn = 0;
          if (spans) {
            const bool same_block = k0 + kChunkFloats < ke;
            if (same_block || t + 8 < p1) {
              const int64_t c0 = same_block ? k0 + kChunkFloats : ks;
              for (int i = 0; i < 8; ++i) nx[i] = (same_block ? xr[i] : a.x + std::min(t + 8 + i, a.T - 1) * K) + c0;
              nn = std::min(ke - c0, kChunkFloats);
            }
          }
          const int64_t lines = (nn + 15) / 16, pf_total = 8 * lines;  // 64-byte lines of x
          const int64_t pf_per_group = (pf_total + groups - 1) / groups;
          for (int64_t g = 0; g < groups; ++g) {
            for (int64_t q = g * pf_per_group; q < std::min(pf_total, (g + 1) * pf_per_group); ++q)
              __builtin_prefetch(nx[q / lines] + std::min((q % lines) * 16, nn - 1), 0, 2);
            const float* w0 = tile + 3 * g * ld + (k0 - ks);
            const float* wr[3] = {w0, w0 + ld, w0 + 2 * ld};
            float* acc = acc_block + g * 24 * L;  // [24, L]
            if (k0 == 0) {  // K > kChunkFloats: the first chunk is never the last
              DotTile83Part<true, false>(xp, wr, size_t(n), acc, nullptr);
            } else if (k0 + n < K) {
              DotTile83Part<false, false>(xp, wr, size_t(n), acc, nullptr);
            } else {
              float out[24];
              DotTile83Part<false, true>(xp, wr, size_t(n), acc, out);
              StoreTile<3>(out, mt, 3, a.bias, a.y, a.N, t, n0 + 3 * g);
            }
          }
        }
      }
    }
  }
  // The last 1-4 x rows [t_end, T) against the task's weight rows, 4 at a time.
  for (int64_t j = n0; t_end < a.T && j < n1; j += kTileNR)
    DirectRows<WT>(a, t_end, a.T - t_end, j, std::min<int64_t>(kTileNR, n1 - j), nullptr);
}
#endif  // AVX-512

// Batched decode path for 16-bit weights (kFusedMaxRows < T <= kDirectMaxRows), weight rows
// [n0, n1): kTileNR weight rows at a time against every x row, so each weight row is read
// from memory once (then from L1), the next kTileNR rows prefetched meanwhile (without the
// prefetch the stream stalls between groups: T = 5 ran at half this speed). No widened float
// tile: its stores and reloads cost more than a few dozen x rows win back. x rows (T x K
// floats) stay in L2. Ragged x rows run a narrower tile instead of padded ones. The
// prefetch goes to L2, as FusedDot's (kFusedPrefetchBytes): bench/batched_decode.py, F16,
// EPYC Zen 4 (2026-12-04), into L1 / L2, tokens/s: 1 thread B = 8 165-169 / 207-213,
// B = 16 208 / 249, B = 32 257-263 / 278-284, B = 64 286 / 293; 2 threads B = 16 412 / 459,
// B = 64 538 / 564. The next group's prefetches are spread over the first tile's k loop (a
// line of each row every 64 bytes, DotTile's kPrefetch) rather than issued in one burst
// before it: the burst of 96 held the miss buffers and then left the stream idle. 32000 x
// 768 F16 head from memory (`TINYLOOP_BENCH_BATCH_ONLY=1 cpu_kernels_bench`, one thread,
// EPYC Zen 5, 2026-12-07), GFLOP/s burst / spread: T = 8 68-98 / 107-124, T = 16 97-105 /
// 133-146, T = 64 145-157 / 164-173; a burst 16 KiB ahead measured slower (T = 8 76-81), and
// spreading two groups ahead the same as one.
template <typename WT>
HWY_NOINLINE void DirectRange(const detail::MatmulArgs& a, int64_t n0, int64_t n1) {
  static_assert(kTileNR == 4, "DotTile prefetches 4 rows of the next group");
  const WT* w = static_cast<const WT*>(a.w);  // [N, K]
  for (int64_t j = n0; j < n1; j += kTileNR) {
    const int64_t mj = std::min<int64_t>(kTileNR, n1 - j);
    // The next group's rows, prefetched a line per row every 64 bytes of the first pass.
    const WT* pf[kTileNR];
    for (int q = 0; q < kTileNR; ++q) pf[q] = w + std::min<int64_t>(j + kTileNR + q, n1 - 1) * a.K;
    for (int64_t t = 0; t < a.T; t += kTileMR) DirectRows<WT>(a, t, a.T - t, j, mj, t == 0 ? pf : nullptr);
  }
}

// Output columns [n0, n1) of all rows.
template <typename WT>
HWY_INLINE void MatmulRange(const detail::MatmulArgs& a, int64_t n0, int64_t n1) {
  if constexpr (!std::is_same_v<WT, float>) {
    if (a.T > detail::kFusedMaxRows && a.T <= detail::kDirectMaxRows) return DirectRange<WT>(a, n0, n1);
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (a.T > detail::kFusedMaxRows && !OnePass83(a.K) && n1 - n0 >= kChunkedMinRows && (n1 - n0) % 3 == 0)
    return ChunkedRange<WT>(a, n0, n1);
#endif
  if (a.T > detail::kFusedMaxRows) return TiledRange<WT>(a, n0, n1);
  switch (a.T) {
    case 1: return FusedRows<1, WT>(a, 0, 1, n0, n1);
    case 2: return FusedRows<2, WT>(a, 0, 2, n0, n1);
    case 3: return FusedRows<3, WT>(a, 0, 3, n0, n1);
    default: return FusedRows<4, WT>(a, 0, a.T, n0, n1);
  }
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TINYLOOP_CPU_MATMUL_INL_H_ toggle
