// The AMX-BF16 matmul of the reduced-precision loop body (cpu/amx.h; arithmetic: the AMX
// chain of ops/matmul_bf16dot.h, which is what TDPBF16PS computes).
//
// Operands. TDPBF16PS multiplies an "A" tile (16 rows x 16 bf16 pairs: x rows) by a "B"
// tile (16 pair-rows x 16 columns' (even, odd) pairs) into a "C" tile (16 x 16 floats). The
// packed weight copy (ops::pack_bf16dot) already stores one 64-column panel as [K2, 64]
// pairs, so the B tile of columns c0 .. c0 + 15 and pairs i0 .. i0 + 15 is 16 rows of 64
// bytes at panel + i0 * 64 + c0, 256 bytes apart: loaded as it is, no second copy.
//
// Edges. Every tile has one shape (16 rows x 64 bytes), configured once per task:
//   - rows: x is rounded into a buffer of ceil(T / 32) * 32 rows, the extra rows zero; their
//     results are computed and dropped;
//   - K: that buffer's rows hold K2p = ceil(K2 / 16) * 16 pairs, zero past K2; the last
//     B tile of a panel (K2 % 16 pair-rows) is copied into a zeroed 16-row scratch first, so
//     no load reads past the packed copy. Zero pairs add +0 to both chains: same bits as a
//     shorter tile;
//   - N: the packed copy pads the last panel to 64 columns with zeros; those are dropped.
// A row's chain never depends on T, on where it falls in a tile, or on the thread: batch
// invariance holds as long as every call on this CPU takes this kernel (cpu/matmul_bf16dot.cc).
//
// Tile registers: 32-row blocks (block32) of 2 x 2 tiles per 32-column half of a panel:
// C00 C01 C10 C11 (tmm0-3), A0 A1 (tmm4-5), B0 B1 (tmm6-7), each loaded tile feeding two
// TDPBF16PS; the last <= 16 rows take block16 (1 A, 4 B rotating over tmm5-7). Whole blocks
// store their C tiles straight into y (row stride N), the others go through a scratch.
//
// What made it fast (Intel Xeon family 6 model 207, 2 vCPUs, one thread, T = 64 .. 512 on
// the bench model's shapes; 2026-12-04, before -> after in one process, best of rounds):
//   - x's buffer 64-byte aligned: a tile row that straddles two cache lines costs two (a
//     microbenchmark of the 2 x 2 loop: 6 ns a TDPBF16PS with aligned rows, 9-11 with
//     rows 16 bytes off), and its rows not a multiple of 4 KiB apart (K = 2048: an A
//     tile's 16 rows would share one L1 set): ldx = K2p + 16 there;
//   - x rounded with AVX-512 (round_row_avx512): the project builds for baseline x86-64, so
//     round_rows_bf16dot ran as SSE2 code, ~20 % of a 512-row call;
//   - C tiles stored into y directly, no copy;
//   - blocking for L2 (2 MiB a core): a task's panels in groups of G (~512 KiB of
//     weights), x's rows in groups of R (~384 KiB), so both stay in L2 while the other is
//     swept: before, every panel streamed all of x (2 MiB at T = 512, K = 2048: from L3).
//   Together, on 64-byte-aligned weights (as ops/backend.cc packs them): 1.2-1.9x,
//   ~1000-1450 GFLOP/s at T = 64 .. 512 (was 650-1000 in the same runs); in amx_bench
//   (whose packed copy is a std::vector, not line-aligned) 1.1-1.7x: 870-1020 GFLOP/s at
//   T = 64 and 512 (was 530-810), two threads 1450-1920 (was 800-1580). T = 1 and 4 unchanged.
// Tried and slower here: K blocks of 4, 8 or 16 steps with the C tiles reloaded from y
// between blocks (0.8-1.2x, mostly below the full-K loop: the extra C loads and stores
// cost more than the L1 reuse saves), software prefetch (T1) of the next panel while the
// last row block of the current one runs (0.9x), 32-row groups (slower for the head:
// 32000 columns streamed from L3 once per 32 rows). (For decode, a software prefetch of
// the next B blocks was tried earlier and measured slower too.)
//
// Threads: tasks of whole panels; each task loads the tile config (ldtilecfg, per thread)
// first and releases the tiles (tilerelease) last (~50 ns the pair, measured).
//
// T = 1 (decode) runs row_avx512 instead: the same chain on AVX-512 vectors, bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu/amx.h"
#include "cpu/matmul_split.h"
#include "cpu/thread_pool.h"
#include "base/bf16dot_format.h"

namespace tinyloop::cpu {
namespace {

constexpr int64_t C = ops::kBf16DotPanel;  // 64 columns a panel: 4 C tiles of 16
constexpr int64_t kPairs = ops::kBf16DotAmxPairs;  // 16 pairs a step: one 64-byte tile row
constexpr int64_t kRows = 16;  // rows of every tile

#if defined(__x86_64__) && defined(__GNUC__)
#define TINYLOOP_AMX_BF16 __attribute__((target("amx-tile,amx-bf16")))

// The 64-byte tile configuration (palette 1): tiles 0..7 all 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};

constexpr TileConfig make_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kRows;
  }
  return cfg;
}
constexpr TileConfig kConfig = make_config();

// ldtilecfg with the whole 64-byte struct as the asm's memory operand: GCC 12's
// _tile_loadconfig names only its first 8 bytes, so the compiler may drop the stores of the
// rest (a config on the stack then loads garbage shapes and the first tile op faults).
TINYLOOP_AMX_BF16 void load_config() { __asm__ volatile("ldtilecfg %0" ::"m"(kConfig)); }

TINYLOOP_AMX_BF16 void release_tiles() { _tile_release(); }

// out[16, 64] = the AMX chain for 16 x rows by one panel.
//   xp      [16, ldx] rounded, paired x rows (zero-padded to ldx >= K2p pairs)
//   panel   [K2, 64] pairs of the packed weight
//   tail    [16, 64] the panel's last K2 % 16 pair-rows, zero-padded (unused when 16 | K2)
//   out     [16, 64]
TINYLOOP_AMX_BF16 void block16(const uint32_t* xp, int64_t ldx, int64_t K2, const uint32_t* panel, const uint32_t* tail,
                               float* out) {
  // GCC 12's tile intrinsics are asm statements without a memory clobber: these barriers
  // keep the compiler from moving the stores of xp / tail after the loads, or the reads of
  // out before the stores.
  __asm__ volatile("" ::: "memory");
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t full = K2 / kPairs, steps = (K2 + kPairs - 1) / kPairs;
  for (int64_t s = 0; s < steps; ++s) {
    const uint32_t* b = s < full ? panel + s * kPairs * C : tail;  // [16, 64] pairs
    _tile_loadd(4, xp + s * kPairs, ldx * 4);
    _tile_loadd(5, b, C * 4);
    _tile_loadd(6, b + 16, C * 4);
    _tile_loadd(7, b + 32, C * 4);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, b + 48, C * 4);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out, C * 4);
  _tile_stored(1, out + 16, C * 4);
  _tile_stored(2, out + 32, C * 4);
  _tile_stored(3, out + 48, C * 4);
  __asm__ volatile("" ::: "memory");
}

// out[32, 64] = the AMX chain for 32 x rows by one panel, in two 32-column halves of 2 x 2
// tiles: C00 C01 C10 C11 (tmm0-3) from A0 A1 (tmm4-5: rows 0-15, 16-31) and B0 B1 (tmm6-7),
// so each loaded tile feeds two TDPBF16PS (block16: 1.25 loads a TDPBF16PS, here 1).
// The tiles are stored at out with row stride ldo: straight into y for whole blocks.
//   xp [32, ldx], panel [K2, 64], tail [16, 64] as block16; out [32, ldo] (64 columns used)
TINYLOOP_AMX_BF16 void block32(const uint32_t* xp, int64_t ldx, int64_t K2, const uint32_t* panel, const uint32_t* tail,
                               float* out, int64_t ldo) {
  __asm__ volatile("" ::: "memory");
  const int64_t full = K2 / kPairs, steps = (K2 + kPairs - 1) / kPairs;
  for (int64_t h = 0; h < C; h += 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t s = 0; s < steps; ++s) {
      const uint32_t* b = (s < full ? panel + s * kPairs * C : tail) + h;  // [16, 32 of 64] pairs
      _tile_loadd(4, xp + s * kPairs, ldx * 4);
      _tile_loadd(6, b, C * 4);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, b + 16, C * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, xp + kRows * ldx + s * kPairs, ldx * 4);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out + h, ldo * 4);
    _tile_stored(1, out + h + 16, ldo * 4);
    _tile_stored(2, out + kRows * ldo + h, ldo * 4);
    _tile_stored(3, out + kRows * ldo + h + 16, ldo * 4);
  }
  __asm__ volatile("" ::: "memory");
}

// One x row rounded and paired as ops::round_rows_bf16dot does (the integer steps of
// round_bf16_ftz on 16 lanes: the same bits), then zero pairs up to ld. The project builds
// for baseline x86-64, where round_rows_bf16dot compiles to SSE2: ~20 % of a 512-row call.
//   x [K], out [ld] pairs (ld >= ceil(K2 / 16) * 16)
#define TINYLOOP_AVX512BW __attribute__((target("avx512f,avx512bw")))
// 16 floats -> their round_bf16_ftz values in 32-bit lanes.
TINYLOOP_AVX512BW inline __m512i round16(__m512i u) {
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), hi = _mm512_maskz_srli_epi32(0xffff, u, 16);
  const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r =
      _mm512_maskz_srli_epi32(0xffff, _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  r = _mm512_mask_or_epi32(r, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000)), hi,
                           _mm512_set1_epi32(0x40));  // nan: stays a quiet nan
  return _mm512_mask_and_epi32(r, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x00800000)), hi,
                               _mm512_set1_epi32(0x8000));  // subnormal: a signed zero
}
// 32 floats -> 16 pairs (even column in the low half) at out[0 .. 15].
TINYLOOP_AVX512BW inline void pair32(__m512i u0, __m512i u1, uint32_t* out) {
  // (maskz_ forms: the plain ones' _mm512_undefined trips GCC 12's -Wmaybe-uninitialized)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_maskz_cvtepi32_epi16(0xffff, round16(u0)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm512_maskz_cvtepi32_epi16(0xffff, round16(u1)));
}
TINYLOOP_AVX512BW void round_row_avx512(const float* x, int64_t K, uint32_t* out, int64_t ld) {
  int64_t i = 0;  // floats
  for (; i + 32 <= K; i += 32) pair32(_mm512_loadu_si512(x + i), _mm512_loadu_si512(x + i + 16), out + i / 2);
  if (i < K) {  // masked loads: the lanes past K read +0, which rounds to the zero pairs
    const int64_t n = K - i;
    const __mmask16 m0 = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1),
                    m1 = n > 16 ? __mmask16((1u << (n - 16)) - 1) : __mmask16(0);
    pair32(_mm512_maskz_loadu_epi32(m0, x + i), _mm512_maskz_loadu_epi32(m1, x + i + 16), out + i / 2);
    i += 32;
  }
  for (int64_t j = i / 2; j < ld; ++j) out[j] = 0;
}

// One x row (decode) by one panel, the same AMX chain on AVX-512 registers: tiles would
// spend 15 of their 16 rows on zeros, and streaming a panel through tile loads measured
// ~10 % slower than through vector loads. Each lane is one column: the even and odd chains
// of a 16-pair block in two accumulators (fused multiply-add = the chain's add: a product of
// two bf16 values is exact in float32), then acc + (e + o), as TDPBF16PS does. Bit for bit
// the tile kernel (the tests compare a row alone with the same row in a tile).
//   xp     [K2] rounded, paired x row
//   panel  [K2, 64] pairs
//   out    [64]
__attribute__((target("avx512f"))) void row_avx512(const uint32_t* xp, int64_t K2, const uint32_t* panel, float* out) {
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  __m512 acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t i0 = 0; i0 < K2; i0 += kPairs) {
    __m512 e[4], o[4];
    for (int j = 0; j < 4; ++j) e[j] = o[j] = _mm512_setzero_ps();
    const int64_t i1 = std::min(i0 + kPairs, K2);
    for (int64_t i = i0; i < i1; ++i) {
      const uint32_t* wp = panel + i * C;  // [64] pairs of step i
      const __m512 xe = _mm512_castsi512_ps(_mm512_set1_epi32(int(xp[i] << 16)));
      const __m512 xo = _mm512_castsi512_ps(_mm512_set1_epi32(int(xp[i] & 0xffff0000u)));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i w = _mm512_loadu_si512(wp + 16 * j);  // (even | odd << 16) x 16 columns
        // (maskz_: the plain shift's _mm512_undefined trips GCC 12's -Wmaybe-uninitialized)
        e[j] = _mm512_fmadd_ps(xe, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w, 16)), e[j]);
        o[j] = _mm512_fmadd_ps(xo, _mm512_castsi512_ps(_mm512_and_si512(w, hi)), o[j]);
      }
    }
    for (int j = 0; j < 4; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_add_ps(e[j], o[j]));
  }
  for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}
#endif

}  // namespace

// x [T, K], w.bf16dot [ceil(N / 64), K2, 64] pairs, bias [N] or null, y [T, N].
void matmul_bf16dot_amx(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y) {
  if (!w.bf16dot) throw std::invalid_argument("matmul_bf16dot: the weight view has no bf16 copy");
  if (!amx_status().bf16) throw std::logic_error("matmul_bf16dot_amx: " + amx_status().reason);
#if defined(__x86_64__) && defined(__GNUC__)
  const int64_t N = w.rows, K = w.cols, K2 = (K + 1) / 2;
  if (T <= 0 || N <= 0) return;
  const int64_t P = (N + C - 1) / C, rem = K2 % kPairs;

  if (T == 1) {  // decode: the AVX-512 form of the same chain (row_avx512)
    thread_local std::vector<uint32_t> xbuf1;  // [K2] x rounded, paired
    xbuf1.assign(size_t(K2), 0u);
    ops::round_rows_bf16dot(x, 1, K, xbuf1.data());
    const uint32_t* xp = xbuf1.data();
    detail::for_row_chunks(T, N, K, C, [&](int64_t n0, int64_t n1) {
      alignas(64) float out[C];  // [64]
      for (int64_t p = n0 / C; p * C < n1; ++p) {
        const int64_t c0 = p * C, nc = std::min(C, N - c0);
        row_avx512(xp, K2, w.bf16dot + p * K2 * C, out);
        for (int64_t c = 0; c < nc; ++c) y[c0 + c] = bias ? out[c] + bias[c0 + c] : out[c];
      }
    });
    return;
  }

  const int64_t Tp = (T + 2 * kRows - 1) / (2 * kRows) * (2 * kRows);  // rows padded to 32-row blocks
  const int64_t K2p = std::max<int64_t>((K2 + kPairs - 1) / kPairs * kPairs, kPairs);
  // x rows 64-byte aligned, and not 4 KiB apart (K = 2048: the 16 rows of an A tile would
  // share one L1 set).
  const int64_t ldx = K2p % 1024 ? K2p : K2p + kPairs;
  thread_local std::vector<uint32_t> xbuf;  // [Tp, ldx] x rounded, paired, zero-padded
  xbuf.resize(size_t(Tp * ldx + 16));
  uint32_t* xa = xbuf.data() + (64 - reinterpret_cast<uintptr_t>(xbuf.data()) % 64) % 64 / 4;
  for (int64_t t = 0; t < T; ++t) round_row_avx512(x + t * K, K, xa + t * ldx, ldx);
  std::memset(xa + T * ldx, 0, size_t((Tp - T) * ldx) * 4);
  const uint32_t* xp = xa;

  // Tasks of g panels: few enough that one ldtilecfg per task is nothing (a decode's panel
  // is only 24-64 TDPBF16PS), enough for the pool to balance (~4 a thread).
  const int64_t g = std::max<int64_t>(1, P / (4 * std::max(1, num_threads())));
  // Blocking (top comment): groups of G panels (~512 KiB of weights) x groups of R rows
  // (~384 KiB of x, a multiple of 32 rows).
  const int64_t G = std::max<int64_t>(1, (512 << 10) / (K2 * C * 4));
  const int64_t R = std::max<int64_t>(2 * kRows, (384 << 10) / (ldx * 4) / (2 * kRows) * (2 * kRows));
  const int64_t T32 = T / (2 * kRows) * (2 * kRows);  // rows in whole 32-row blocks
  detail::for_row_chunks(T, N, K, g * C, [&](int64_t n0, int64_t n1) {
    load_config();
    alignas(64) uint32_t tail[kRows * C];  // [16, 64] the last pair-rows of a panel, zero-padded
    alignas(64) float out[2 * kRows * C];  // [32, 64] one output block
    const int64_t p0 = n0 / C, p1 = (n1 + C - 1) / C;
    const int64_t pf1 = std::min(p1, N / C);  // whole panels [p0, pf1)
    // Whole panels x whole 32-row blocks, the tiles stored straight into y.
    for (int64_t q0 = p0; q0 < pf1; q0 += G)
      for (int64_t r0 = 0; r0 < T32; r0 += R)
        for (int64_t p = q0; p < std::min(pf1, q0 + G); ++p) {
          const uint32_t* panel = w.bf16dot + p * K2 * C;  // [K2, 64]
          if (rem) {
            std::memcpy(tail, panel + (K2 - rem) * C, size_t(rem * C) * 4);
            std::memset(tail + rem * C, 0, size_t((kRows - rem) * C) * 4);
          }
          for (int64_t t0 = r0; t0 < std::min(T32, r0 + R); t0 += 2 * kRows)
            block32(xp + t0 * ldx, ldx, K2, panel, tail, y + t0 * N + p * C, N);
        }
    // The rest through the out buffer: the last T % 32 rows of the whole panels, every row
    // of a last partial panel.
    for (int64_t p = p0; p < p1; ++p) {
      if (p < pf1 && T32 == T) continue;
      const uint32_t* panel = w.bf16dot + p * K2 * C;  // [K2, 64]
      if (rem) {
        std::memcpy(tail, panel + (K2 - rem) * C, size_t(rem * C) * 4);
        std::memset(tail + rem * C, 0, size_t((kRows - rem) * C) * 4);
      }
      const int64_t c0 = p * C, nc = std::min(C, N - c0);
      for (int64_t t0 = p < pf1 ? T32 : 0, mt; t0 < T; t0 += mt) {
        mt = T - t0 > kRows ? 2 * kRows : kRows;  // 32-row blocks while > 16 rows remain
        const int64_t nr = std::min(mt, T - t0);
        if (mt == 2 * kRows) block32(xp + t0 * ldx, ldx, K2, panel, tail, out, C);
        else block16(xp + t0 * ldx, ldx, K2, panel, tail, out);
        for (int64_t r = 0; r < nr; ++r) std::copy(out + r * C, out + r * C + nc, y + (t0 + r) * N + c0);
      }
    }
    if (bias)  // y + bias: the same rounding as out + bias
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = p0 * C; c < std::min(N, p1 * C); ++c) y[t * N + c] += bias[c];
    release_tiles();
  });
#else
  (void)x, (void)T, (void)bias, (void)y;
#endif
}

}  // namespace tinyloop::cpu
