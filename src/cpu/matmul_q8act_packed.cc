// The q8-activation matmul on a repacked copy of an int8 / int4 weight (AVX512-VNNI), bit
// for bit ops::ref::matmul_q8act. ops/matmul_q8act.h has the math; matmul_q8act_packed.h the
// contract. Compiled with -ffp-contract=off (src/cpu/CMakeLists.txt): the reference rounds
// every product and sum on its own, and so must the vector code.
//
// Why a copy: in the weight's own row-major layout one vpdpbusd covers 64 columns of ONE
// output row, so the kernel keeps per-lane partial sums and pays a convert + scale per 128
// products (matmul_q8act_vnni.cc). Here 16 output rows are interleaved by 4 columns (the
// layout of an AMX / VNNI "B" operand): one vpdpbusd multiplies 4 columns of 16 rows by the
// same 4 x bytes broadcast, 8 of them give the 16 rows' exact int32 sums over a block of
// 32 columns, and the float work is one convert, two products and one sum per 512 products,
// in the reference's order: acc += (d_w * d_x) * float(isum), block after block.
//
// Packed layout: row groups of 16 (rows past N are zeros), each a run of nb = K / 32 cells,
// one per block b:
//   int8 [8 quads][16 rows][4 bytes] u8 = w + 128 (512 B), d_w [16]
//   int4 [4 quad pairs][16 rows][4 bytes]: low nibble quad p, high nibble quad p + 4 (256 B),
//        d_w [16], o_w [16]
// with the params in the weight's dtype (F16: 32 B each, F32: 64 B), groups of several
// blocks repeated per block. F16 cells hold the same bytes as the row-major weight.
// The int8 weight is signed and vpdpbusd's first operand unsigned: (w + 128) x summed, then
// -128 * sum x (the block's integer sum of x, exact) added back gives sum w x exactly.
//
// Tiles: MR x rows by one group of 16 weight rows; each cell is loaded (and int4 unpacked)
// once per tile, each broadcast x quad once per x row. Prefill: 4 x rows a tile.
// Decode (T < 4): T x rows. The first tile over a task's cells streams them from
// memory and prefetches them ahead (a batched decode's T = 4 .. 64 rows too: without it, T = 4
// cost 2.1x T = 3 on the EPYC); the later tiles find them in L1 / L2. Every output's
// arithmetic is the same in every tile shape, task split and thread.
// CPUs without AVX512-VNNI run tile_avx2 on the same cells (see there), same bits.
#include "cpu/matmul_q8act_packed.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/amx.h"
#include "cpu/matmul_q8act_packed_internal.h"
#include "cpu/matmul_q8act_vnni.h"
#include "cpu/matmul_split.h"
#include "cpu/thread_pool.h"
#include "base/q8act_format.h"
#include "base/weight_quant_inl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define TINYLOOP_HAVE_PACKED_KERNEL 1
#include <immintrin.h>
#define TL_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC bug 105593 (see matmul_q8act_vnni.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tinyloop::cpu::detail {

namespace {

constexpr int64_t kRowsPerTask = 32;  // weight rows per pool task (not decode): 2 groups
constexpr int64_t kTChunk = 64;  // x rows per pass over a task's cells

bool packable(const ops::WeightView& w) {
  return ops::q8act_applies(w) && (vnni_supported() || packed_avx2_supported());
}

}  // namespace

int64_t q8act_packed_bytes(const ops::WeightView& w) {
  if (!packable(w)) return 0;
  const bool int4 = w.dtype == DType::U4;
  return (w.rows + kGroupRows - 1) / kGroupRows * (w.cols / ops::kQ8Block) *
         cell_bytes(int4, w.scale_dtype == DType::F16);
}

void pack_q8act(const ops::WeightView& w, void* out) {
  if (!packable(w))
    throw std::invalid_argument(
        "pack_q8act: needs an int8/int4 weight with a group that is a multiple of 32 "
        "and a CPU with AVX512-VNNI or AVX2");
  ops::detail::check_quant_view(w);
  const bool int4 = w.dtype == DType::U4;
  const int64_t N = w.rows, K = w.cols, nb = K / ops::kQ8Block, ng = K / w.group;
  const bool f16 = w.scale_dtype == DType::F16;
  const int64_t bpg = w.group / ops::kQ8Block, cb = cell_bytes(int4, f16), wb = weight_bytes(int4);
  const int64_t ps = f16 ? 2 : 4;  // bytes of one param
  uint8_t* dst = static_cast<uint8_t*>(out);
  const uint8_t* wq = static_cast<const uint8_t*>(w.data);  // int8 [N, K] / int4 [N, K / 2]
  const int64_t row_bytes = int4 ? K / 2 : K;
  // Row groups in parallel (a 135M-parameter model packs in ~0.1 s): each writes its own cells.
  parallel_for((N + kGroupRows - 1) / kGroupRows, [&](int64_t g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* cell = dst + (g * nb + b) * cb;  // [wb] weight bytes, then d_w [16] (, o_w [16])
      std::memset(cell, int4 ? 0 : 0x80, size_t(wb));  // padding rows: q = 0 (int8 stored + 128)
      std::memset(cell + wb, 0, size_t(cb - wb));  // and params 0
      for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < N; ++r) {
        const int64_t n = g * kGroupRows + r;
        const uint8_t* src = wq + n * row_bytes;  // the row's bytes
        const int64_t p = n * ng + b / bpg;  // the row's param index of this block
        // The params copied as stored (F16 or F32 bits).
        std::memcpy(cell + wb + r * ps, static_cast<const uint8_t*>(w.scales) + p * ps, size_t(ps));
        if (int4)
          std::memcpy(cell + wb + param_bytes(f16) + r * ps, static_cast<const uint8_t*>(w.offsets) + p * ps,
                      size_t(ps));
        for (int64_t j = 0; j < 4; ++j) {
          if (int4) {
            // Column k is nibble k % 2 of byte k / 2 (low first); quad pair pq takes the low
            // nibble from column 4 pq + j of the block and the high one from 16 + 4 pq + j.
            const auto nib = [&](int64_t k) { return (src[k / 2] >> (4 * (k % 2))) & 0x0f; };
            const int64_t k0 = b * ops::kQ8Block;
            for (int64_t pq = 0; pq < 4; ++pq)
              cell[pq * kQuadBytes + r * 4 + j] = uint8_t(nib(k0 + 4 * pq + j) | (nib(k0 + 16 + 4 * pq + j) << 4));
          } else {
            for (int64_t q = 0; q < 8; ++q)  // int8 value v stored as v + 128 (flip the sign bit)
              cell[q * kQuadBytes + r * 4 + j] = uint8_t(src[b * ops::kQ8Block + 4 * q + j] ^ 0x80);
          }
        }
      }
    }
  });
}

#ifndef TINYLOOP_HAVE_PACKED_KERNEL

bool packed_avx2_supported() { return false; }
bool packed_amx_int8_supported() { return false; }
void matmul_q8act_packed(const float*, int64_t, const ops::WeightView&, const float*, float*, PackedIsa) {
  throw std::runtime_error("q8 activations: the packed kernels are not compiled on this platform");
}

#else

bool packed_amx_int8_supported() { return amx_int8_active() && vnni_supported(); }

bool packed_avx2_supported() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

namespace {

using Ctx = Q8PackedCtx;

// 16 params at p (F16 or F32), as floats (F16 -> F32 is exact).
template <bool PF16>
TL_VNNI inline __m512 load_params(const uint8_t* p) {
  if constexpr (PF16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

// y[t0 .. t0 + MR, 16 g .. 16 g + 16] (rows past N not stored); PF16: F16 params.
// prefetch: the cells come from memory (the first tile over them), prefetch them
// kPrefetchBytes ahead.
// One group of 16 weight rows a tile: its 8 quads stay in registers. With two groups a tile
// (the first version) GCC 12 kept the [2][8] quad array on the stack, a store and reload of
// every cell, and decode read two streams at once: EPYC Zen 4, one thread, q8act_bench, the
// 26 MB int8 head (768 x 32000) 1.24-1.60 -> 0.73-0.83 ms, int4 0.50-0.94 -> 0.30-0.47 ms,
// prefill no slower (int8 252-263 -> 285-305 GFLOP/s), engine tg128 int8 99-105 -> 160-168
// t/s, int4 191-193 -> 323-328 (2026-12-04).
template <int MR, bool INT4, bool PF16>
TL_VNNI void tile(const Ctx& c, int64_t t0, int64_t g, bool prefetch) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const uint8_t* run = c.packed + g * c.nb * c.cb;  // [nb, cell]
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* cell = run + b * c.cb;
    if (prefetch) {  // the first tile's stream runs through the group's cells
      for (int64_t l = 0; l < c.cb; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(cell + kPrefetchBytes + l), _MM_HINT_T1);
    }
    __m512i wq[8];  // the u8 operands of the 8 quads of block b
    if constexpr (INT4) {
      for (int p = 0; p < 4; ++p) {
        const __m512i raw = _mm512_loadu_si512(cell + p * kQuadBytes);
        wq[p] = _mm512_and_si512(raw, low4);
        wq[p + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
    } else {
      for (int q = 0; q < 8; ++q) wq[q] = _mm512_loadu_si512(cell + q * kQuadBytes);
    }
    const __m512 dw = load_params<PF16>(cell + c.wb);  // d_w of the 16 rows
    for (int i = 0; i < MR; ++i) {
      const int64_t t = t0 + i;
      const int8_t* xb = c.xq + t * c.K + b * ops::kQ8Block;  // [32] the block's x bytes
      // Two chains (even / odd quads), added at the end: integer, exact.
      __m512i s0 = INT4 ? _mm512_setzero_si512() : _mm512_set1_epi32(c.corr[t * c.nb + b]);
      __m512i s1 = _mm512_setzero_si512();
      for (int q = 0; q < 8; q += 2) {
        int32_t x0, x1;
        std::memcpy(&x0, xb + 4 * q, 4);
        std::memcpy(&x1, xb + 4 * q + 4, 4);
        s0 = _mm512_dpbusd_epi32(s0, wq[q], _mm512_set1_epi32(x0));
        s1 = _mm512_dpbusd_epi32(s1, wq[q + 1], _mm512_set1_epi32(x1));
      }
      const __m512 dxv = _mm512_set1_ps(c.dx[t * c.nb + b]);
      const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      // acc += (d_w * d_x) * float(isum): two roundings, then the sum (no FMA: see top).
      acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(_mm512_mul_ps(dw, dxv), isum));
    }
  }
  // Epilogue: + the int4 offset term (its own sum in block order, as the reference's `off`;
  // int8 adds the reference's off = 0 too, which turns a -0 sum into +0 as it does), + bias.
  const int64_t n0 = g * kGroupRows;
  const int64_t nl = std::min<int64_t>(kGroupRows, c.N - n0);
  const __mmask16 m = __mmask16((1u << nl) - 1);
  const __m512 bias = c.bias ? _mm512_maskz_loadu_ps(m, c.bias + n0) : _mm512_setzero_ps();
  for (int i = 0; i < MR; ++i) {
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

// --- AVX2 (+ FMA, F16C): the same cells, each 64-byte quad as two halves of 8 rows ----------
// No vpdpbusd: a quad's 4 products per row come from vpmaddubsw (u8 x s8 pairs into int16)
// and vpmaddwd (pairs of those into int32), exact because no int16 sum can saturate: int8
// uses |w| <= 128 against x with w's sign moved onto it (vpsignb, as ggml's AVX2 code), at
// most 2 * 128 * 127 = 32512 a pair, so each pair goes to int32 at once; int4 q <= 15
// against |x| <= 127 gives at most 3810 a pair, so a block's 8 quads add up in int16 (at
// most 16 * 15 * 127 = 30480) and go to int32 once. The block sums are the same integers as
// the VNNI kernel's and the float steps the same operations, so the bits are the
// reference's too.
//
// Loop order (register pressure: AVX2 has 16 vector registers): quads outer and x rows
// inner, so one quad's weights (int8: w and |w|) are live at a time, not all 8; the
// accumulators of the rows stay in registers. With up to 2 x rows a tile both halves
// of a cell run in one pass (4 float accumulators); with 3-4 rows one half a pass, the
// second pass reading the group's cells (13-35 KiB) back from L1 / L2. The first version
// (all 8 quads' w and |w| live, both halves a pass) spilled the quads and the accumulators
// to the stack: Zen 3, one thread, q8act_bench prefill T=512 K=768 N=2048 int8 66 GFLOP/s.
#define TL_AVX2 __attribute__((target("avx2,fma,f16c")))

// 8 params at p (F16 or F32), as floats.
template <bool PF16>
TL_AVX2 inline __m256 load_params8(const uint8_t* p) {
  if constexpr (PF16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

// An empty asm that "changes" v: GCC may not reassociate the integer sums across it. Without
// it GCC 12 turned each block's chain of adds into a tree, computing every product first and
// spilling them to the stack (the same bits, as integer sums are exact, but 16+ live vectors).
TL_AVX2 inline void keep_in_register(__m256i& v) { asm("" : "+x"(v)); }

// 4 x bytes at p broadcast to every 32-bit lane.
TL_AVX2 inline __m256i bcast_x4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The int32 sums of half h (rows 8 h .. 8 h + 7) of cell for MR x rows (block b):
// s[i] = sum over the block's 32 columns of w[row, k] * xq[t0 + i, k], lane = row.
template <int MR, bool INT4>
TL_AVX2 inline void half_sums(const Ctx& c, const uint8_t* cell, int h, int64_t t0, int64_t b, __m256i* s) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* xb[MR];  // [32] the block's x bytes of each row
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) xb[i] = c.xq + (t0 + i) * c.K + b * ops::kQ8Block;
  if constexpr (INT4) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i s16[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) s16[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {  // quad pair p: quads p (low nibbles) and p + 4 (high)
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + p * kQuadBytes + h * 32));
      const __m256i lo = _mm256_and_si256(raw, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(lo, bcast_x4(xb[i] + 4 * p)));
        s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(hi, bcast_x4(xb[i] + 4 * p + 16)));
        keep_in_register(s16[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) s[i] = _mm256_madd_epi16(s16[i], ones);
  } else {
    const __m256i flip = _mm256_set1_epi8(char(0x80));
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) s[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      const __m256i wv =
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + q * kQuadBytes + h * 32)), flip);
      const __m256i aw = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256i pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast_x4(xb[i] + 4 * q), wv));
        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(pairs, ones));
        keep_in_register(s[i]);
      }
    }
  }
}

// One pass over a group's cells for halves H0 .. H0 + HP - 1 (HP <= 2): acc[i][hh] += the
// float block terms of x row t0 + i and half H0 + hh. Template indices only, so that the
// accumulators stay in registers (a runtime half index kept them on the stack).
//   run [nb, cell] the group's cells; acc [MR][HP]
template <int MR, bool INT4, bool PF16, int H0, int HP>
TL_AVX2 inline void tile_pass_avx2(const Ctx& c, const uint8_t* run, int64_t t0, bool prefetch, __m256 (&acc)[MR][HP]) {
  constexpr int64_t kHalfParams = param_bytes(PF16) / 2;
  for (int64_t b = 0; b < c.nb; ++b) {
    const uint8_t* cell = run + b * c.cb;
    if (prefetch)
      for (int64_t l = 0; l < c.cb; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(cell + kPrefetchBytes + l), _MM_HINT_T1);
#pragma GCC unroll 2
    for (int hh = 0; hh < HP; ++hh) {
      __m256i s[MR];
      half_sums<MR, INT4>(c, cell, H0 + hh, t0, b, s);
      const __m256 dw = load_params8<PF16>(cell + c.wb + (H0 + hh) * kHalfParams);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 dxv = _mm256_set1_ps(c.dx[(t0 + i) * c.nb + b]);
        // acc += (d_w * d_x) * float(isum): two roundings, then the sum (no FMA: see top).
        acc[i][hh] = _mm256_add_ps(acc[i][hh], _mm256_mul_ps(_mm256_mul_ps(dw, dxv), _mm256_cvtepi32_ps(s[i])));
      }
    }
  }
}

// Epilogue of half h as the VNNI tile's: y rows t0 .. t0 + MR, columns 16 g + 8 h .. + 8 =
// acc[i] (+ the int4 offset term, its own sum in block order) (+ bias).
template <int MR, bool INT4, bool PF16>
TL_AVX2 void store_half_avx2(const Ctx& c, const uint8_t* run, int64_t t0, int64_t g, int h, const __m256* acc) {
  constexpr int64_t kParamBytes = param_bytes(PF16), kHalfParams = kParamBytes / 2;
  const int64_t n0 = g * kGroupRows + h * 8;
  if (n0 >= c.N) return;
  const int nl = int(std::min<int64_t>(8, c.N - n0));
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nl), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 bias = c.bias ? _mm256_maskload_ps(c.bias + n0, m) : _mm256_setzero_ps();
  for (int i = 0; i < MR; ++i) {
    const int64_t t = t0 + i;
    __m256 off = _mm256_setzero_ps();
    if constexpr (INT4) {
      for (int64_t b = 0; b < c.nb; ++b) {
        const __m256 ow = load_params8<PF16>(run + b * c.cb + c.wb + kParamBytes + h * kHalfParams);
        off = _mm256_add_ps(off, _mm256_mul_ps(ow, _mm256_set1_ps(c.sx[t * c.nb + b])));
      }
    }
    __m256 v = _mm256_add_ps(acc[i], off);
    if (c.bias) v = _mm256_add_ps(v, bias);
    _mm256_maskstore_ps(c.y + t * c.N + n0, m, v);
  }
}

// y[t0 .. t0 + MR, 16 g .. 16 g + 16] (rows past N not stored). Up to 2 x rows: both halves
// in one pass over the cells (one stream from memory in decode); 3-4 rows: a pass a half.
template <int MR, bool INT4, bool PF16>
TL_AVX2 void tile_avx2(const Ctx& c, int64_t t0, int64_t g, bool prefetch) {
  const uint8_t* run = c.packed + g * c.nb * c.cb;  // [nb, cell]
  if constexpr (MR <= 2) {
    __m256 acc[MR][2];
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    tile_pass_avx2<MR, INT4, PF16, 0, 2>(c, run, t0, prefetch, acc);
    for (int h = 0; h < 2; ++h) {
      __m256 ah[MR];
      for (int i = 0; i < MR; ++i) ah[i] = acc[i][h];
      store_half_avx2<MR, INT4, PF16>(c, run, t0, g, h, ah);
    }
  } else {
    __m256 a0[MR][1], a1[MR][1];
    for (int i = 0; i < MR; ++i) a0[i][0] = a1[i][0] = _mm256_setzero_ps();
    tile_pass_avx2<MR, INT4, PF16, 0, 1>(c, run, t0, prefetch, a0);
    tile_pass_avx2<MR, INT4, PF16, 1, 1>(c, run, t0, false, a1);  // the cells are in L1 / L2 now
    __m256 ah[MR];
    for (int i = 0; i < MR; ++i) ah[i] = a0[i][0];
    store_half_avx2<MR, INT4, PF16>(c, run, t0, g, 0, ah);
    for (int i = 0; i < MR; ++i) ah[i] = a1[i][0];
    store_half_avx2<MR, INT4, PF16>(c, run, t0, g, 1, ah);
  }
}

using TileFn = void (*)(const Ctx&, int64_t, int64_t, bool);
constexpr int kMaxMR = 4;

template <bool INT4, bool PF16>
TileFn pick(int mr) {
  static constexpr TileFn table[kMaxMR] = {&tile<1, INT4, PF16>, &tile<2, INT4, PF16>, &tile<3, INT4, PF16>,
                                           &tile<4, INT4, PF16>};
  return table[mr - 1];
}

TileFn pick(bool int4, bool pf16, int mr) {
  if (int4) return pf16 ? pick<true, true>(mr) : pick<true, false>(mr);
  return pf16 ? pick<false, true>(mr) : pick<false, false>(mr);
}

template <bool INT4, bool PF16>
TileFn pick_avx2(int mr) {
  static constexpr TileFn table[kMaxMR] = {&tile_avx2<1, INT4, PF16>, &tile_avx2<2, INT4, PF16>,
                                           &tile_avx2<3, INT4, PF16>, &tile_avx2<4, INT4, PF16>};
  return table[mr - 1];
}

TileFn pick_avx2(bool int4, bool pf16, int mr) {
  if (int4) return pf16 ? pick_avx2<true, true>(mr) : pick_avx2<true, false>(mr);
  return pf16 ? pick_avx2<false, true>(mr) : pick_avx2<false, false>(mr);
}

// Weight rows [n0, n1) (n0 a multiple of 16): every x row, in tiles of one group each.
void range(const Ctx& c, PackedIsa isa, int64_t n0, int64_t n1) {
  const int64_t ga = n0 / kGroupRows, gb = (n1 + kGroupRows - 1) / kGroupRows;
  for (int64_t tc = 0; tc < c.T; tc += kTChunk) {
    const int64_t te = std::min(c.T, tc + kTChunk);
    for (int64_t g = ga; g < gb; ++g) {
      for (int64_t t = tc; t < te; t += kMaxMR) {
        const int mr = int(std::min<int64_t>(kMaxMR, te - t));
        // The first tile over these cells reads them from memory: prefetch its stream. The
        // later tiles (more x rows) find them in L1 / L2.
        const bool first = t == 0;
        if (isa == PackedIsa::Avx512Vnni) pick(c.int4, c.pf16, mr)(c, t, g, first);
        else pick_avx2(c.int4, c.pf16, mr)(c, t, g, first);
      }
    }
  }
}

}  // namespace

// See matmul_q8act_packed_internal.h.
// max |x| is exact in any order (max_ps returns its
// second operand when the first is NaN, so NaN lanes drop out as fmax drops them); q =
// cvtps_epi32(x * id) rounds half to even like the reference's `(x * id + 1.5 * 2^23) - 1.5 *
// 2^23` (this file is compiled with -ffp-contract=off, and a product is all there is here);
// the int32 values are truncated to their low byte as the reference's int8_t(v) does.
// Replaces the scalar quantizer on this path: its libm fmaxf calls were 3 % of an int8
// pp512 (Zen 3, perf).
TL_AVX2 void quantize_row_q8_avx2(const float* x, int64_t K, int8_t* q, float* d, float* s) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i low8 = _mm256_set1_epi32(0xff);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < K / ops::kQ8Block; ++b) {
    const float* xb = x + b * ops::kQ8Block;  // [32]
    __m256 xv[4];
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      xv[j] = _mm256_loadu_ps(xb + 8 * j);
      m = _mm256_max_ps(_mm256_and_ps(xv[j], abs_mask), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 id = _mm256_set1_ps(ops::detail::q8_inverse_scale(amax));
    __m256i qv[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      qv[j] = _mm256_cvtps_epi32(_mm256_mul_ps(xv[j], id));
      sum = _mm256_add_epi32(sum, qv[j]);
      qv[j] = _mm256_and_si256(qv[j], low8);  // the low byte, unsigned: the packs below keep it
    }
    // Bytes [q0[0..3] q1[0..3] q2[0..3] q3[0..3] | q0[4..7] ...] as dwords, then in order.
    const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(qv[0], qv[1]), _mm256_packus_epi32(qv[2], qv[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * ops::kQ8Block), _mm256_permutevar8x32_epi32(bytes, order));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    ops::detail::q8_block_scales(amax, _mm_cvtsi128_si32(s4), d + b, s + b);
  }
}

void matmul_q8act_packed(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y,
                         PackedIsa isa) {
  if (!w.q8packed) throw std::invalid_argument("matmul_q8act_packed: the view has no packed copy");
  if (!ops::q8act_applies(w))
    throw std::invalid_argument(
        "q8 activations: the packed kernel needs an int8/int4 weight with a group "
        "that is a multiple of 32");
  if (isa == PackedIsa::AmxInt8 && !packed_amx_int8_supported())
    throw std::runtime_error(
        "q8 activations: no AMX-INT8 kernel here (" +
        (amx_inactive_reason().empty() ? std::string("no AMX-INT8 on this CPU") : amx_inactive_reason()) + ")");
  if (isa == PackedIsa::Avx2 ? !packed_avx2_supported() : !vnni_supported())
    throw std::runtime_error(std::string("q8 activations: this CPU has no ") +
                             (isa == PackedIsa::Avx2 ? "AVX2 + FMA + F16C" : "AVX512-VNNI"));
  const int64_t N = w.rows, K = w.cols;
  if (T <= 0 || N <= 0) return;
  Ctx c{};
  c.int4 = w.dtype == DType::U4;
  c.T = T, c.N = N, c.K = K, c.nb = K / ops::kQ8Block;
  c.pf16 = w.scale_dtype == DType::F16;
  c.cb = cell_bytes(c.int4, c.pf16), c.wb = weight_bytes(c.int4);
  // x rows quantized bit for bit as the reference (the AVX-512 quantizer for q, amax and the
  // integer sums, d and s by the reference's ops::detail::q8_block_scales in plain code;
  // without AVX-512 the reference's own quantizer).
  // The AMX tiles load x 16 rows at a time: pad to Tp rows (zeros; their results are dropped).
  const bool amx = isa == PackedIsa::AmxInt8;
  const int64_t Tp = amx ? (T + 15) / 16 * 16 : T;
  thread_local std::vector<int8_t> xq;  // [Tp, K]
  thread_local std::vector<float> dx, sx, amax;  // [Tp, nb], [Tp, nb], [nb]
  thread_local std::vector<int32_t> corr, qsum;  // [Tp, nb], [nb]
  const int64_t nb = c.nb;
  if (xq.size() < size_t(Tp * K)) xq.resize(size_t(Tp * K));
  if (dx.size() < size_t(Tp * nb)) dx.resize(size_t(Tp * nb)), sx.resize(size_t(Tp * nb)), corr.resize(size_t(Tp * nb));
  if (amax.size() < size_t(nb)) amax.resize(size_t(nb)), qsum.resize(size_t(nb));
  if (Tp > T) {
    std::fill(xq.begin() + T * K, xq.begin() + Tp * K, int8_t{0});
    std::fill(dx.begin() + T * nb, dx.begin() + Tp * nb, 0.f);
    std::fill(sx.begin() + T * nb, sx.begin() + Tp * nb, 0.f);
    std::fill(corr.begin() + T * nb, corr.begin() + Tp * nb, 0);
  }
  for (int64_t t = 0; t < T; ++t) {
    if (isa == PackedIsa::Avx2) {  // the AVX2 tiles need neither the sums nor corr
      quantize_row_q8_avx2(x + t * K, K, xq.data() + t * K, dx.data() + t * nb, sx.data() + t * nb);
      continue;
    }
    quantize_row_q8_avx512(x + t * K, K, Q8RowLayout::Natural, xq.data() + t * K, amax.data(), qsum.data(), nullptr);
    for (int64_t b = 0; b < nb; ++b) {
      const size_t i = size_t(t * nb + b);
      ops::detail::q8_block_scales(amax[size_t(b)], qsum[size_t(b)], &dx[i], &sx[i]);
      corr[i] = -128 * qsum[size_t(b)];
    }
  }
  c.xq = xq.data(), c.dx = dx.data(), c.sx = sx.data(), c.corr = corr.data();
  c.packed = w.q8packed, c.bias = bias, c.y = y;
  if (amx) return for_row_chunks(T, N, K, kRowsPerTask, [&](int64_t n0, int64_t n1) { amx_int8_range(c, n0, n1); });
  // Decode streams the cells once: tasks as long as load balance allows (matmul_split.h).
  const int64_t rows = T < kMaxMR ? stream_task_rows(N) : kRowsPerTask;
  for_row_chunks(T, N, K, rows, [&](int64_t n0, int64_t n1) { range(c, isa, n0, n1); });
}

#endif  // TINYLOOP_HAVE_PACKED_KERNEL

}  // namespace tinyloop::cpu::detail
