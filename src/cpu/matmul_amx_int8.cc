// The q8-activation matmul on AMX-INT8 tiles (TDPBSUD), on the packed copy of an int8 / int4
// weight (matmul_q8act_packed.cc has the layout), bit for bit ops::ref::matmul_q8act like
// the VNNI kernel. Compiled with -ffp-contract=off (src/cpu/CMakeLists.txt) for the same
// reason: the reference rounds every product and sum on its own.
//
// Why it is exact. The reference sums each 32-column block of a row in integers, then
// acc += (d_w * d_x) * float(isum), block after block. TDPBSUD with a 32-byte "A" row does
// exactly one block: C[t][n] = sum over the block of x[t][k] (signed) * b[k][n] (unsigned),
// an exact int32 sum for 16 x rows by 16 weight rows at once; the float steps after it are
// the VNNI kernel's, in the same order, so the bits are the same too.
//
// Operands, no copies for int8:
//   A  the 16 x rows' block b: xq + t0 * K + 32 b, 16 rows K bytes apart (32 bytes each);
//   B  the int8 cell of block b as it is: its 8 quads [16 rows][4 bytes] are the 8 rows of a
//      TDPBSUD "B" tile (64 bytes: 16 weight rows x 4 columns). Its bytes are w + 128
//      (unsigned), so C + corr (-128 * the block's integer sum of x, exact) = sum w x;
//      int4: the nibbles are unpacked once per group into a [nb][8][64] scratch (quad p's low
//      nibbles are quad p, the high ones quad p + 4), already unsigned, and there is no corr.
// Tile registers: C0 / C1 (tmm0-1), A0 / A1 (tmm2-3), B0 / B1 (tmm4-5): two blocks in flight,
// so the float work of block b (16 rows: load C, + corr, convert, (d_w * d_x), multiply,
// add) runs while the tile unit computes block b + 1. That float work, ~5 vector ops a row
// and block, is the kernel's cost (one TDPBSUD replaces 8 vpdpbusd a row), and the reason
// the rows are not blocked further (a wider tile would not fit its 16 accumulators in zmm).
//
// Rows: x is padded to whole 16-row tiles (zeros, Q8PackedCtx); the float work covers only
// R = the tile's real rows rounded up to 4 (templates for 4, 8, 12, 16), and only real rows
// are stored. A row's arithmetic never depends on T, its tile or the thread: matmul_q8act
// can pick this kernel by row count (batch invariance holds, the bits being the reference's).
//
// Threads: tasks of 32 weight rows (2 groups); each task loads the tile config (ldtilecfg)
// first and releases the tiles last. The first tile over a group's cells prefetches them
// kPrefetchBytes ahead into L2 as the VNNI kernel does (batched decode reads them from
// memory once).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/matmul_q8act_packed_internal.h"
#include "base/q8act_format.h"

namespace tinyloop::cpu::detail {

#if defined(__x86_64__) && defined(__GNUC__)
#define TL_AMX_INT8 __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq")))
// GCC bug 105593 (see matmul_q8act_vnni.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

constexpr int64_t kTileRows = 16;  // x rows of a tile
constexpr int64_t kTChunk = 64;  // x rows per pass over a task's groups (their cells stay in L1 / L2)

// The 64-byte tile configuration (palette 1): C0, C1 16 x 64 B (16 x 16 int32); A0, A1
// 16 x 32 B (16 x rows by one block); B0, B1 8 x 64 B (one cell's 8 quads).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};

constexpr TileConfig make_config() {
  TileConfig cfg;
  for (int t = 0; t < 2; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;  // C
  for (int t = 2; t < 4; ++t) cfg.colsb[t] = 32, cfg.rows[t] = 16;  // A
  for (int t = 4; t < 6; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 8;  // B
  return cfg;
}
constexpr TileConfig kConfig = make_config();

// ldtilecfg naming the whole struct: GCC 12's _tile_loadconfig names only its first 8 bytes
// (matmul_amx_bf16.cc, "A GCC 12 pitfall" in docs/benchmarks.md).
TL_AMX_INT8 void load_config() { __asm__ volatile("ldtilecfg %0" ::"m"(kConfig)); }
TL_AMX_INT8 void release_tiles() { _tile_release(); }

// out[16][16] int32 = the 16 x rows at a (K bytes apart) by the 8-quad B operand at b.
// Slot S picks the tile registers (C S, A 2 + S, B 4 + S): two blocks in flight.
// GCC 12's tile intrinsics have no memory clobber: the barriers keep the vector loads of
// out after the store (and the unpacked int4 scratch's stores before the load).
// (GCC's tile intrinsics are macros that paste the register number into the asm: literals.)
#define TL_BLOCK_SUMS(S, A, B)                                                                          \
  TL_AMX_INT8 inline void block_sums##S(const int8_t* a, int64_t lda, const uint8_t* b, int32_t* out) { \
    __asm__ volatile("" ::: "memory");                                                                  \
    _tile_zero(S);                                                                                      \
    _tile_loadd(A, a, lda);                                                                             \
    _tile_loadd(B, b, kQuadBytes);                                                                      \
    _tile_dpbsud(S, A, B);                                                                              \
    _tile_stored(S, out, kQuadBytes);                                                                   \
    __asm__ volatile("" ::: "memory");                                                                  \
  }
TL_BLOCK_SUMS(0, 2, 4)
TL_BLOCK_SUMS(1, 3, 5)
#undef TL_BLOCK_SUMS

template <bool PF16>
TL_AMX_INT8 inline __m512 load_params(const uint8_t* p) {
  if constexpr (PF16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

// acc[0 .. R) += (d_w * d_x) * float(isum) for block b of group run `run`, the tile's x rows
// t0 .. t0 + R, from one slot's sums [16][16], in the reference's order.
template <int R, bool INT4, bool PF16>
TL_AMX_INT8 inline void scale_add(const Q8PackedCtx& c, const uint8_t* run, int64_t t0, int64_t b, const int32_t* s,
                                  bool prefetch, __m512* acc) {
  const uint8_t* cell = run + b * c.cb;
  if (prefetch)
    for (int64_t l = 0; l < c.cb; l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(cell + kPrefetchBytes + l), _MM_HINT_T1);
  const __m512 dw = load_params<PF16>(cell + c.wb);  // d_w of the 16 weight rows
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) {
    const int64_t t = t0 + i;
    __m512i is = _mm512_load_si512(s + i * kTileRows);
    if constexpr (!INT4) is = _mm512_add_epi32(is, _mm512_set1_epi32(c.corr[t * c.nb + b]));
    const __m512 dxv = _mm512_set1_ps(c.dx[t * c.nb + b]);
    acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(_mm512_mul_ps(dw, dxv), _mm512_cvtepi32_ps(is)));
  }
}

// y[t0 .. t0 + min(R, T - t0), 16 g .. 16 g + 16] (rows past N not stored).
//   bops    [nb][8][64] the B operands of group g's blocks (int8: its cells, cb apart; int4:
//           the unpacked scratch, 512 apart)
//   bstride bytes from one block's B operand to the next
//   prefetch the first tile over the group's int8 cells: prefetch them ahead into L2
template <int R, bool INT4, bool PF16>
TL_AMX_INT8 void tile(const Q8PackedCtx& c, int64_t t0, int64_t g, const uint8_t* bops, int64_t bstride,
                      bool prefetch) {
  static_assert(R % 4 == 0 && R <= kTileRows);
  const uint8_t* run = c.packed + g * c.nb * c.cb;  // [nb, cell]
  const int8_t* xa = c.xq + t0 * c.K;  // [16, K] the tile's x rows
  alignas(64) int32_t sums[2][kTileRows * kTileRows];  // [2 slots][16 x rows][16 weight rows]
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  const auto a_of = [&](int64_t b) { return xa + b * ops::kQ8Block; };
  const auto b_of = [&](int64_t b) { return bops + b * bstride; };
  block_sums0(a_of(0), c.K, b_of(0), sums[0]);
  for (int64_t b = 0; b < c.nb; b += 2) {
    if (b + 1 < c.nb) block_sums1(a_of(b + 1), c.K, b_of(b + 1), sums[1]);
    scale_add<R, INT4, PF16>(c, run, t0, b, sums[0], prefetch, acc);
    if (b + 1 < c.nb) {
      if (b + 2 < c.nb) block_sums0(a_of(b + 2), c.K, b_of(b + 2), sums[0]);
      scale_add<R, INT4, PF16>(c, run, t0, b + 1, sums[1], prefetch, acc);
    }
  }
  // Epilogue as the VNNI tile's: + the int4 offset term (its own sum in block order; int8
  // adds the reference's off = 0, which turns a -0 sum into +0 as it does), + bias.
  const int64_t n0 = g * kGroupRows;
  const int64_t nl = std::min<int64_t>(kGroupRows, c.N - n0);
  const __mmask16 m = __mmask16((1u << nl) - 1);
  const __m512 bias = c.bias ? _mm512_maskz_loadu_ps(m, c.bias + n0) : _mm512_setzero_ps();
  const int64_t rows = std::min<int64_t>(R, c.T - t0);
  for (int i = 0; i < R; ++i) {
    if (i >= rows) break;
    const int64_t t = t0 + i;
    __m512 off = _mm512_setzero_ps();
    if constexpr (INT4) {
      for (int64_t b = 0; b < c.nb; ++b) {
        const __m512 ow = load_params<PF16>(run + b * c.cb + c.wb + param_bytes(PF16));
        off = _mm512_add_ps(off, _mm512_mul_ps(ow, _mm512_set1_ps(c.sx[t * c.nb + b])));
      }
    }
    __m512 v = _mm512_add_ps(acc[i], off);
    if (c.bias) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(c.y + t * c.N + n0, m, v);
  }
}

// Group g's int4 cells unpacked into B operands: out [nb][8 quads][64] u8, quad p's low
// nibbles as quad p, its high nibbles as quad p + 4 (the columns the layout put there).
// The cells are read once here, so this is where a batched decode's prefetch goes.
TL_AMX_INT8 void unpack_int4(const Q8PackedCtx& c, int64_t g, uint8_t* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const uint8_t* run = c.packed + g * c.nb * c.cb;  // [nb, cell]
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* cell = run + b * c.cb;
    for (int64_t l = 0; l < c.cb; l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(cell + kPrefetchBytes + l), _MM_HINT_T1);
    uint8_t* o = out + b * 8 * kQuadBytes;  // [8][64]
    for (int p = 0; p < 4; ++p) {
      const __m512i raw = _mm512_loadu_si512(cell + p * kQuadBytes);
      _mm512_store_si512(o + p * kQuadBytes, _mm512_and_si512(raw, low4));
      _mm512_store_si512(o + (p + 4) * kQuadBytes, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
    }
  }
}

using TileFn = void (*)(const Q8PackedCtx&, int64_t, int64_t, const uint8_t*, int64_t, bool);

template <bool INT4, bool PF16>
TileFn pick(int64_t rows) {  // rows 1 .. 16: the tile for ceil(rows / 4) * 4
  static constexpr TileFn table[4] = {&tile<4, INT4, PF16>, &tile<8, INT4, PF16>, &tile<12, INT4, PF16>,
                                      &tile<16, INT4, PF16>};
  return table[(rows + 3) / 4 - 1];
}

TileFn pick(bool int4, bool pf16, int64_t rows) {
  if (int4) return pf16 ? pick<true, true>(rows) : pick<true, false>(rows);
  return pf16 ? pick<false, true>(rows) : pick<false, false>(rows);
}

}  // namespace

void amx_int8_range(const Q8PackedCtx& c, int64_t n0, int64_t n1) {
  const int64_t ga = n0 / kGroupRows, gb = (n1 + kGroupRows - 1) / kGroupRows;
  thread_local std::vector<uint8_t> scratch;  // int4: [nb][8][64] + 64 for alignment
  uint8_t* unpacked = nullptr;
  if (c.int4) {
    const size_t need = size_t(c.nb * 8 * kQuadBytes + 64);
    if (scratch.size() < need) scratch.resize(need);
    unpacked = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  }
  load_config();
  for (int64_t tc = 0; tc < c.T; tc += kTChunk) {
    const int64_t te = std::min(c.T, tc + kTChunk);
    for (int64_t g = ga; g < gb; ++g) {
      if (c.int4) unpack_int4(c, g, unpacked);
      const uint8_t* bops = c.int4 ? unpacked : c.packed + g * c.nb * c.cb;
      const int64_t bstride = c.int4 ? 8 * kQuadBytes : c.cb;
      for (int64_t t = tc; t < te; t += kTileRows) {
        const int64_t rows = std::min(kTileRows, te - t);
        pick(c.int4, c.pf16, rows)(c, t, g, bops, bstride, !c.int4 && t == 0);
      }
    }
  }
  release_tiles();
}

#else

void amx_int8_range(const Q8PackedCtx&, int64_t, int64_t) {}

#endif

}  // namespace tinyloop::cpu::detail
