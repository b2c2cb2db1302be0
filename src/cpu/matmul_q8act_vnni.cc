// AVX512-VNNI q8-activation matmul for int8 / int4 weights (ops/matmul_q8act.h has the math;
// the fast version of ops::ref::matmul_q8act on CPUs with vpdpbusd). Highway 1.0.3 has no
// int8 dot-product op and no AVX3_DL target, so this file uses x86 intrinsics inside
// functions compiled for AVX512 F/BW/VL/DQ + VNNI by target attribute (no -march flag), run
// only when __builtin_cpu_supports says the CPU and OS have them (vnni_supported()).
//
// vpdpbusd multiplies 4 adjacent u8 x s8 byte pairs and adds them to one int32 lane: 64
// products an instruction, exactly (no saturation: |sum| <= 8 * 255 * 128 over the two used
// per lane). The unit of work is 128 columns = 4 blocks of 32, two vpdpbusd into one int32
// vector whose 128-bit lane q holds block q (int32 lane l: block l / 4):
//  - int4: one 64-byte load of a weight row is the unit; its low nibbles (even columns) and
//    high nibbles (odd columns) are the u8 operands of the two vpdpbusd, against x stored in
//    the same order (xa = even columns, xb = odd ones, per block 16 bytes each).
//  - int8: two 64-byte loads; a 128-bit-lane shuffle gathers the first 16 bytes of the 4
//    blocks (wa) and the last 16 (wb), x stored the same way. The weight is signed, so its
//    bytes are flipped to u8 = w + 128 (xor 0x80, exact for every value -128..127) and the
//    accumulator starts at -128 * (the lane's 8 x bytes), precomputed once per x row:
//    sum (w + 128) x - 128 sum x = sum w x, exactly.
// The int32 lanes are converted to float and FMAd with the lane's d_w * d_x (d_w expanded
// from its block by a permute, d_x pre-expanded per x row): 3 float instructions per 128
// products. At the end the NR accumulators of an x row are summed by one transposed
// reduction (reduce4: the NR sums in one vector, each by the tree of _mm512_reduce_add_ps),
// then the offset term sum_b o_w s_x (int4) as a 16-block dot product reduced the same way,
// then the bias, one masked store of NR outputs.
//
// Register tile: MR <= 4 x rows against NR <= 4 weight rows; each weight unit is loaded
// and decoded once for the MR rows, each x unit once for the NR rows. Batch invariance:
// output (t, n) has its own accumulator and goes through the same instructions in the same
// order (units j = 0, 1, ..., then the same reductions) in every tile shape, so its bits
// depend only on x row t, weight row n and K - never on T, N, the tile or the thread.
#include "cpu/matmul_q8act_vnni.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/matmul_split.h"
#include "base/q8act_format.h"
#include "base/weight_quant_inl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define TINYLOOP_HAVE_VNNI_KERNEL 1
#include <immintrin.h>
#define TL_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12's AVX-512 headers start some intrinsics from `__m512 __Y = __Y;` (an undefined
// pass-through) and then warn about it where they are inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tinyloop::cpu::detail {

#ifndef TINYLOOP_HAVE_VNNI_KERNEL

bool vnni_supported() { return false; }
void matmul_q8act_vnni(const float*, int64_t, const ops::WeightView&, const float*, float*) {
  throw std::runtime_error("q8 activations: the VNNI kernel is not compiled on this platform");
}
void quantize_row_q8_avx512(const float*, int64_t, Q8RowLayout, int8_t*, float*, int32_t*, int32_t*) {
  throw std::runtime_error("q8 activations: the AVX-512 quantizer is not compiled on this platform");
}

#else

bool vnni_supported() {
  // libgcc's cpu model also checks that the OS saves the AVX-512 state (XCR0).
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
}

namespace {

constexpr int64_t kVecBytes = 64;  // one zmm
constexpr int64_t kUnit = 128;  // columns per unit (4 blocks), for x: xa | xb, 128 bytes
constexpr int64_t kRowsPerTask = 32;  // weight rows per pool task (as matmul.cc)
constexpr int64_t kTChunk = 64;  // x rows per pass over a task's weight rows (L2-sized)
// Tile bounds: prefill runs 4 x rows x 4 weight rows (the widest tile used; see range()).
constexpr int kMaxMR = 4, kMaxNR = 4;
// Decode prefetches the weight this many rows ahead (int8 K = 768: 6 KiB). See range().
constexpr int64_t kPrefetchRows = 8;

// Everything the tiles read. Shapes: nv = units per row (ceil(K / 128)), nb = K / 32
// blocks, nbp = nb rounded up to 16.
struct Ctx {
  bool int4;
  int64_t T, N, K, nv, nb, nbp;
  __mmask64 tail0, tail1;  // valid weight bytes of the last unit's two loads (int4: one)
  const int8_t* xq;  // [T, nv * 128] (xa | xb per unit, as the weight operands)
  const int32_t* corr;  // [T, nv * 16] int8: -128 * sum of the lane's 8 x bytes
  const float* dxe;  // [T, nv * 16] d_x of each lane's block (0 past K)
  const float* sx;  // [T, nbp] int4: Q8_1 block sums (0 past nb)
  const uint8_t* w;  // int8 [N, K] / int4 [N, K / 2]
  int64_t w_row_bytes;
  int64_t prefetch_rows;  // decode: prefetch the weight this many rows ahead (0: none)
  const float* bias;  // [N] or null
  float* y;  // [T, N]
};

// A task's weight rows decoded for the tiles: per row r, dwb [nbw] the d_w of each block
// (0 past nb; nbw = nv * 4 + 16 so a 16-float load at any unit's first block stays inside) and owb [nbp] the int4 offsets of each block (0 past nb).
struct Panel {
  const float* dwb;
  const float* owb;
  int64_t nbw;
};

// Params [ng] of one weight row (F16 / F32) expanded to blocks: out [nout], block b gets
// param b / bpg, 0 from nb on.
TL_VNNI void block_params(const void* p, bool f16, int64_t ng, int64_t bpg, int64_t nb, float* out, int64_t nout) {
  if (bpg == 1 && f16) {
    // 16 at a time, the tail and the zeros past ng by masks (decode redoes this per row and
    // call).
    const uint16_t* h = static_cast<const uint16_t*>(p);  // [ng]
    for (int64_t g = 0; g < nout; g += 16) {
      const int64_t nl = std::clamp<int64_t>(ng - g, 0, 16), ns = std::min<int64_t>(nout - g, 16);
      const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(__mmask16((1u << nl) - 1), h + g));
      _mm512_mask_storeu_ps(out + g, __mmask16((1u << ns) - 1), v);
    }
    return;
  } else if (bpg == 1) {
    std::memcpy(out, p, size_t(ng) * sizeof(float));
  } else {
    for (int64_t b = 0; b < nb; ++b) out[b] = ops::detail::quant_param(p, f16 ? DType::F16 : DType::F32, b / bpg);
  }
  std::fill(out + nb, out + nout, 0.f);
}

// The sums of NR <= 4 vectors, lane r = sum of a[r] (lanes NR.. undefined): one transposed
// reduction instead of NR horizontal ones. Each sum goes through exactly the tree of GCC's
// _mm512_reduce_add_ps (upper 256 + lower 256, upper 128 + lower 128, elements 0 + 2 and
// 1 + 3, then those two), lane-wise, so its bits depend only on its own vector - not on NR
// or on the other vectors (padding rows are zeros, their lanes dropped by the caller).
template <int NR>
TL_VNNI inline __m128 reduce4(const __m512* a) {
  if constexpr (NR == 1) return _mm_set_ss(_mm512_reduce_add_ps(a[0]));  // the same tree
  const __m512 z = _mm512_setzero_ps();
  const __m512 a0 = a[0], a1 = NR > 1 ? a[1] : z, a2 = NR > 2 ? a[2] : z, a3 = NR > 3 ? a[3] : z;
  // 128-bit lanes [a0.0 + a0.2, a0.1 + a0.3, a1.0 + a1.2, a1.1 + a1.3], same for a2, a3.
  const __m512 h01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 h23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a2, a3, _MM_SHUFFLE(3, 2, 3, 2)));
  // 128-bit lane r: the 4 partial sums e0..e3 of a[r].
  const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(h01, h23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(h01, h23, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));  // e0 + e2, e1 + e3
  const __m512 s = _mm512_add_ps(p, _mm512_permute_ps(p, _MM_SHUFFLE(2, 3, 0, 1)));  // element 0: the sum
  const __m512i first = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(first, s));
}

// y[t0 .. t0 + MR, n0 .. n0 + NR]: x rows t0.., weight rows n0.. (Panel rows r0..).
template <int MR, int NR, bool INT4>
TL_VNNI void tile(const Ctx& c, int64_t t0, int64_t n0, const Panel& pn, int64_t r0) {
  constexpr int64_t kWBytes = INT4 ? kVecBytes : 2 * kVecBytes;  // weight bytes per unit
  // Lane l of the int32 vector belongs to block l / 4 of the unit.
  const __m512i blk_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8(char(0x80));
  const int64_t lrow = c.nv * 16;
  const uint8_t* wr[NR];  // [w_row_bytes] each
  const float* dwb[NR];  // [nbw] each
  for (int r = 0; r < NR; ++r) {
    wr[r] = c.w + (n0 + r) * c.w_row_bytes;
    dwb[r] = pn.dwb + (r0 + r) * pn.nbw;
  }
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < c.nv; ++j) {
    const bool last = j + 1 == c.nv;
    const __mmask64 m0 = last ? c.tail0 : ~__mmask64(0), m1 = last ? c.tail1 : ~__mmask64(0);
    __m512i wa[NR], wb[NR];  // the u8 operands: int4 low / high nibbles; int8 first / last 16
        // bytes of each block, + 128
    __m512 dwe[NR];  // d_w of each lane's block
    for (int r = 0; r < NR; ++r) {
      const uint8_t* wp = wr[r] + j * kWBytes;
      if (c.prefetch_rows) {  // decode: the same unit prefetch_rows rows on (never faults)
        _mm_prefetch(reinterpret_cast<const char*>(wp + c.prefetch_rows * c.w_row_bytes), _MM_HINT_T0);
        if constexpr (!INT4)
          _mm_prefetch(reinterpret_cast<const char*>(wp + c.prefetch_rows * c.w_row_bytes + kVecBytes), _MM_HINT_T0);
      }
      if constexpr (INT4) {
        const __m512i raw = _mm512_maskz_loadu_epi8(m0, wp);
        wa[r] = _mm512_and_si512(raw, low4);
        wb[r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      } else {
        const __m512i v0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m0, wp), flip);  // blocks 0, 1
        const __m512i v1 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m1, wp + kVecBytes), flip);  // 2, 3
        wa[r] = _mm512_shuffle_i64x2(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
        wb[r] = _mm512_shuffle_i64x2(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
      }
      dwe[r] = _mm512_permutexvar_ps(blk_of_lane, _mm512_loadu_ps(dwb[r] + j * 4));
    }
    for (int i = 0; i < MR; ++i) {
      const int8_t* xp = c.xq + (t0 + i) * c.nv * kUnit + j * kUnit;
      const __m512i xa = _mm512_loadu_si512(xp), xb = _mm512_loadu_si512(xp + kVecBytes);
      __m512i init = _mm512_setzero_si512();
      if constexpr (!INT4) init = _mm512_loadu_si512(c.corr + (t0 + i) * lrow + j * 16);
      const __m512 dxe = _mm512_loadu_ps(c.dxe + (t0 + i) * lrow + j * 16);
      for (int r = 0; r < NR; ++r) {
        const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, wa[r], xa), wb[r], xb);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dwe[r], dxe), acc[i][r]);
      }
    }
  }
  // Epilogue: the NR sums of x row i in one transposed reduction (reduce4), then the int4
  // offset term the same way, the bias, one masked store of NR outputs.
  const __mmask16 rows_mask = __mmask16((1u << NR) - 1);
  __m128 bias4 = _mm_setzero_ps();
  if (c.bias) bias4 = _mm_maskz_loadu_ps(rows_mask, c.bias + n0);
  for (int i = 0; i < MR; ++i) {
    const int64_t t = t0 + i;
    __m128 v = reduce4<NR>(acc[i]);
    if constexpr (INT4) {
      const float* sx = c.sx + t * c.nbp;  // [nbp]
      __m512 off[NR];
      for (int r = 0; r < NR; ++r) off[r] = _mm512_setzero_ps();
      for (int64_t b = 0; b < c.nbp; b += 16) {
        const __m512 s = _mm512_loadu_ps(sx + b);
        for (int r = 0; r < NR; ++r)
          off[r] = _mm512_fmadd_ps(_mm512_loadu_ps(pn.owb + (r0 + r) * c.nbp + b), s, off[r]);
      }
      v = _mm_add_ps(v, reduce4<NR>(off));
    }
    if (c.bias) v = _mm_add_ps(v, bias4);
    _mm_mask_storeu_ps(c.y + t * c.N + n0, rows_mask, v);
  }
}

using TileFn = void (*)(const Ctx&, int64_t, int64_t, const Panel&, int64_t);

template <bool INT4, int MR, int... NRs>
constexpr auto tile_row(std::integer_sequence<int, NRs...>) {
  return std::array<TileFn, sizeof...(NRs)>{&tile<MR, NRs + 1, INT4>...};
}

template <bool INT4>
TileFn pick(int mr, int nr) {
  using Seq = std::make_integer_sequence<int, kMaxNR>;
  static constexpr std::array<std::array<TileFn, kMaxNR>, kMaxMR> table{
      tile_row<INT4, 1>(Seq{}), tile_row<INT4, 2>(Seq{}), tile_row<INT4, 3>(Seq{}), tile_row<INT4, 4>(Seq{})};
  return table[size_t(mr - 1)][size_t(nr - 1)];
}

// Weight rows [n0, n1): decode their params, then every x row in tiles.
void range(const Ctx& c, const ops::WeightView& w, int64_t n0, int64_t n1) {
  const int64_t ng = c.K / w.group, bpg = w.group / ops::kQ8Block;
  const bool f16 = w.scale_dtype == DType::F16;
  const int64_t psize = f16 ? 2 : 4;
  const int64_t nbw = c.nv * 4 + 16;
  const int64_t rows = n1 - n0;
  thread_local std::vector<float> dwb, owb;  // [rows, nbw], [rows, nbp]
  if (dwb.size() < size_t(rows * nbw)) dwb.resize(size_t(rows * nbw));
  if (c.int4 && owb.size() < size_t(rows * c.nbp)) owb.resize(size_t(rows * c.nbp));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = n0 + r;
    block_params(static_cast<const char*>(w.scales) + n * ng * psize, f16, ng, bpg, c.nb, dwb.data() + r * nbw, nbw);
    if (c.int4)
      block_params(static_cast<const char*>(w.offsets) + n * ng * psize, f16, ng, bpg, c.nb, owb.data() + r * c.nbp,
                   c.nbp);
  }
  const Panel pn{dwb.data(), c.int4 ? owb.data() : nullptr, nbw};
  // Decode (T < 4): one weight row at a time, so the task's rows are one sequential stream
  // (as matmul-inl.h FusedRows), and the tile prefetches the row kPrefetchRows ahead: in the
  // engine the weights are not hot in L1/L2 each token (other layers and the head pass in
  // between), and the explicit prefetch is what sped decode up. Measured with `tinyloop
  // bench` tg128, 1 thread, alternating: int4 85 -> 105 t/s, int8 71 -> 81 t/s. (The engine
  // now runs matmul_q8act_packed.cc on CPUs with VNNI; this kernel serves views without a
  // packed copy, so its decode was left as it was.)
  // Prefill: 4 x rows x 4 weight rows (each weight row holds 2 operand registers a unit).
  // q8act_bench, 1 thread, T = 512: 4 rows 130-152 GFLOP/s against 3 rows 122-131 and 2 rows
  // 115-133 (Xeon, 2026-12-01; on Zen 4, 3 rows had measured ~10% above 2). Each output's
  // arithmetic is the same in every tile.
  const int nr_max = c.T < kMaxMR ? 1 : kMaxNR;
  for (int64_t tc = 0; tc < c.T; tc += kTChunk) {
    const int64_t te = std::min(c.T, tc + kTChunk);
    for (int64_t r0 = 0; r0 < rows; r0 += nr_max) {
      const int nr = int(std::min<int64_t>(nr_max, rows - r0));
      for (int64_t t = tc; t < te; t += kMaxMR) {
        const int mr = int(std::min<int64_t>(kMaxMR, te - t));
        (c.int4 ? pick<true>(mr, nr) : pick<false>(mr, nr))(c, t, n0 + r0, pn, r0);
      }
    }
  }
}

}  // namespace

// See matmul_q8act_vnni.h. The bits equal the reference's: max |x| is exact in any order (a
// NaN lane is skipped, as fmax does); q = cvtps_epi32(x * id) rounds half to even like the
// reference's `(x * id + 1.5 * 2^23) - 1.5 * 2^23`, and the product is _mm512_mul_round_ps,
// which GCC cannot fuse into an FMA (a plain `x * id + c` in code compiled for AVX-512 would
// be contracted and round differently). Unit-layout int8 rows also get corr [nv * 16] =
// -128 * (the 8 x bytes of each lane).
TL_VNNI void quantize_row_q8_avx512(const float* x, int64_t K, Q8RowLayout layout, int8_t* out, float* amax,
                                    int32_t* qsum, int32_t* corr) {
  const bool int4 = layout == Q8RowLayout::UnitInt4;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const int64_t nb = K / ops::kQ8Block;
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    // max(v, m) returns m when v is NaN: the NaN lanes drop out.
    __m512 m = _mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_and_ps(x1, abs_mask), m);
    const float a = _mm512_reduce_max_ps(m);
    amax[b] = a;
    const __m512 id = _mm512_set1_ps(ops::detail::q8_inverse_scale(a));
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_round_ps(x0, id, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_round_ps(x1, id, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    qsum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    // Natural: columns in order. Unit layouts: block b is 128-bit lane b % 4 of unit b / 4:
    // int4 even columns | odd columns (the nibble order), int8 columns 0-15 | 16-31.
    // vpmovdb truncates to the int8 value.
    const bool natural = layout == Q8RowLayout::Natural;
    int8_t* u = natural ? out + b * 32 : out + (b / 4) * kUnit + (b % 4) * 16;
    const __m512i lo = int4 ? _mm512_permutex2var_epi32(q0, even, q1) : q0;
    const __m512i hi = int4 ? _mm512_permutex2var_epi32(q0, odd, q1) : q1;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(u), _mm512_cvtepi32_epi8(lo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(u + (natural ? 16 : kVecBytes)), _mm512_cvtepi32_epi8(hi));
  }
  if (layout != Q8RowLayout::UnitInt8) return;
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t j = 0; j < (K + kUnit - 1) / kUnit; ++j) {
    const int8_t* u = out + j * kUnit;
    const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(u)),
                                            ones, _mm512_loadu_si512(u + kVecBytes));
    _mm512_storeu_si512(corr + j * 16, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
  }
}

namespace {

// x rows quantized (bit for bit as the scalar quantizer of ops/matmul_q8act.h) and laid out
// for the tiles: xq, corr (int8), dxe, sx (int4) of Ctx. Not compiled for AVX-512 itself, so
// d and s come from the reference's own ops::detail::q8_block_scales.
void prepare_x(const float* x, Ctx& c, std::vector<int8_t>& xq, std::vector<int32_t>& corr, std::vector<float>& dxe,
               std::vector<float>& sx) {
  const int64_t T = c.T, K = c.K, nb = c.nb, nv = c.nv;
  const int64_t xrow = nv * kUnit, lrow = nv * 16;
  xq.assign(size_t(T * xrow), 0);
  dxe.assign(size_t(T * lrow), 0.f);
  if (!c.int4) corr.assign(size_t(T * lrow), 0);
  if (c.int4) sx.assign(size_t(T * c.nbp), 0.f);
  thread_local std::vector<float> amax;  // [nb] one row's block maxima
  thread_local std::vector<int32_t> qsum;  // [nb] its integer block sums
  if (amax.size() < size_t(nb)) amax.resize(size_t(nb)), qsum.resize(size_t(nb));
  for (int64_t t = 0; t < T; ++t) {
    quantize_row_q8_avx512(x + t * K, K, c.int4 ? Q8RowLayout::UnitInt4 : Q8RowLayout::UnitInt8, xq.data() + t * xrow,
                           amax.data(), qsum.data(), c.int4 ? nullptr : corr.data() + t * lrow);
    float* de = dxe.data() + t * lrow;  // [lrow]: 4 lanes a block
    for (int64_t b = 0; b < nb; ++b) {
      float d, s;
      ops::detail::q8_block_scales(amax[size_t(b)], qsum[size_t(b)], &d, &s);
      for (int e = 0; e < 4; ++e) de[b * 4 + e] = d;
      if (c.int4) sx[size_t(t * c.nbp + b)] = s;
    }
  }
}

}  // namespace

void matmul_q8act_vnni(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y) {
  ops::require_q8act(w);
  if (!vnni_supported()) throw std::runtime_error("q8 activations: this CPU has no AVX512-VNNI");
  const int64_t N = w.rows, K = w.cols;
  if (T <= 0 || N <= 0) return;
  Ctx c{};
  c.int4 = w.dtype == DType::U4;
  c.T = T, c.N = N, c.K = K, c.nb = K / ops::kQ8Block, c.nbp = (c.nb + 15) / 16 * 16;
  c.w_row_bytes = c.int4 ? K / 2 : K;
  c.nv = (K + kUnit - 1) / kUnit;
  // Bytes of the last unit's first and second 64-byte loads (int4: only the first).
  const int64_t rem = c.w_row_bytes - (c.nv - 1) * (c.int4 ? kVecBytes : 2 * kVecBytes);
  const auto mask = [](int64_t bytes) {
    return bytes >= 64 ? ~__mmask64(0) : bytes <= 0 ? __mmask64(0) : (__mmask64(1) << bytes) - 1;
  };
  c.tail0 = mask(rem), c.tail1 = mask(rem - kVecBytes);
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<int32_t> corr;
  thread_local std::vector<float> dxe, sx;
  prepare_x(x, c, xq, corr, dxe, sx);
  c.xq = xq.data(), c.corr = corr.data(), c.dxe = dxe.data(), c.sx = sx.data();
  c.w = static_cast<const uint8_t*>(w.data), c.bias = bias, c.y = y;
  c.prefetch_rows = T < kMaxMR ? kPrefetchRows : 0;
  for_row_chunks(T, N, K, kRowsPerTask, [&](int64_t n0, int64_t n1) { range(c, w, n0, n1); });
}

#endif  // TINYLOOP_HAVE_VNNI_KERNEL

}  // namespace tinyloop::cpu::detail
