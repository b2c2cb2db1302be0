// Per-target matmul kernels for int8 / int4 weights (ops::WeightView), included once per
// Highway target by matmul_int8.cc and matmul_int4.cc. The weights are dequantized in
// registers, a vector of Lanes columns at a time, and go into the same per-element
// arithmetic as the float kernels of matmul-inl.h:
//   acc = 0; for each chunk: acc = MulAdd(x chunk, W chunk, acc); y = SumOfLanes(acc) (+ b)
// W chunk (int8)  = float(q) * scale                     (one rounding, as the reference)
// W chunk (int4)  = MulAdd(float(q), scale, offset)      (fused: <= 1 ulp from the reference)
// Decode (T <= kFusedMaxRows) dequantizes each row once for all x rows as it streams past;
// prefill first dequantizes a tile of rows into a float buffer with the SAME chunk function
// and runs the float DotTile over it, so both paths give the same bits (batch invariance).
//
// int4 columns: a block of B = Lanes bytes holds 2B columns; its low nibbles (the even
// columns) form one float vector and its high nibbles (the odd ones) the next, against x
// permuted the same way by the driver (matmul_internal.h). A partial last block is padded
// with zero weights and zero x.
//
// Scales: when every chunk lies inside one group (G a multiple of the chunk's columns: the
// GGUF G = 32 on every target but int4 on AVX-512, whose blocks are 32 columns: G = 32 fits
// too) a fast path walks group by group with the row's scales widened to float once; else a
// general walk broadcasts per chunk or gathers per-lane scales in a scalar loop (slow).
// Both produce the same values.
#if defined(TINYLOOP_CPU_MATMUL_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TINYLOOP_CPU_MATMUL_QUANT_INL_H_
#undef TINYLOOP_CPU_MATMUL_QUANT_INL_H_
#else
#define TINYLOOP_CPU_MATMUL_QUANT_INL_H_
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/matmul-inl.h"
#include "cpu/matmul_internal.h"
#include "cpu/simd-inl.h"
#include "hwy/highway.h"
#include "base/convert_inl.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One quantized weight row n.
struct QuantRow {
  const uint8_t* q;  // int8 [K] (as bytes) / int4 [K / 2]
  const void* s;  // [K / G] scales of this row
  const void* o;  // [K / G] offsets of this row (int4), else null
  bool f16;  // scales / offsets are F16 (else F32)
  int64_t G, K;
  float param(const void* p, int64_t g) const {
    return f16 ? ops::detail::half_to_float(static_cast<const uint16_t*>(p)[g]) : static_cast<const float*>(p)[g];
  }
  float scale(int64_t g) const { return param(s, g); }
  float offset(int64_t g) const { return o ? param(o, g) : 0.f; }
};

HWY_INLINE QuantRow RowOf(const detail::MatmulArgs& a, int64_t n, bool int4) {
  const int64_t n_groups = a.K / a.group;
  const int64_t psize = a.scale_f16 ? 2 : 4;
  QuantRow r;
  r.q = static_cast<const uint8_t*>(a.w) + n * (int4 ? a.K / 2 : a.K);
  r.s = static_cast<const char*>(a.scales) + n * n_groups * psize;
  r.o = int4 ? static_cast<const char*>(a.offsets) + n * n_groups * psize : nullptr;
  r.f16 = a.scale_f16;
  r.G = a.group;
  r.K = a.K;
  return r;
}

// The group of the columns a row walk is at; columns only grow, so moving on is one step
// (or one division when a chunk skipped whole groups: G < chunk width).
struct GroupCursor {
  int64_t G;
  int64_t g = -1, end = 0;  // current group and its first column past the end
  float s = 0.f, o = 0.f;
  HWY_INLINE void Seek(const QuantRow& r, int64_t k) {
    if (k < end) return;
    g = k < end + G ? g + 1 : k / G;
    end = (g + 1) * G;
    s = r.scale(g);
    o = r.offset(g);
  }
};

// Columns k .. k+n (n <= Lanes) of an int8 row, dequantized; lanes past n are 0.
template <class DF>
HWY_INLINE hn::Vec<DF> DequantI8(DF df, const QuantRow& r, GroupCursor& c, int64_t k, int64_t n) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::RebindToSigned<DF> di;
  const int64_t L = int64_t(hn::Lanes(df));
  constexpr size_t kMax = hn::MaxLanes(DF());
  const int8_t* q = reinterpret_cast<const int8_t*>(r.q) + k;
  hn::Vec<DF> qf;
  if (n == L) {
    qf = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q)));
  } else {  // row tail: never read past the row (it may end the mapping)
    alignas(64) int8_t pad[kMax] = {};
    std::memcpy(pad, q, size_t(HWY_MIN(n, int64_t(kMax))));
    qf = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, pad)));
  }
  c.Seek(r, k);
  hn::Vec<DF> s;
  if (k + n <= c.end) {
    s = hn::Set(df, c.s);
  } else {  // the chunk spans groups
    alignas(64) float lanes[kMax] = {};
    for (int64_t j = 0; j < n; ++j) lanes[j] = r.scale((k + j) / r.G);
    s = hn::Load(df, lanes);
  }
  const hn::Vec<DF> w = hn::Mul(qf, s);
  return n == L ? w : hn::IfThenElseZero(hn::FirstN(df, size_t(n)), w);
}

// Block starting at column c0 of an int4 row: we = its even columns, wo = its odd ones,
// dequantized (Lanes each; lanes past the row's end are 0).
template <class DF>
HWY_INLINE void DequantU4(DF df, const QuantRow& r, GroupCursor& c, int64_t c0, hn::Vec<DF>& we, hn::Vec<DF>& wo) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const int64_t B = int64_t(hn::Lanes(df));
  constexpr size_t kMax = hn::MaxLanes(DF());
  const int64_t nb = std::min<int64_t>(B, (r.K - c0) / 2);  // bytes in this block
  const uint8_t* q = r.q + c0 / 2;
  hn::Vec<decltype(du)> v;
  if (nb == B) {
    v = hn::PromoteTo(du, hn::LoadU(d8, q));
  } else {
    alignas(64) uint8_t pad[kMax] = {};
    std::memcpy(pad, q, size_t(HWY_MIN(nb, int64_t(kMax))));
    v = hn::PromoteTo(du, hn::LoadU(d8, pad));
  }
  const hn::Vec<DF> lo = hn::ConvertTo(df, hn::BitCast(di, hn::And(v, hn::Set(du, 0x0fu))));
  const hn::Vec<DF> hi = hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<4>(v)));
  c.Seek(r, c0);
  if (c0 + 2 * nb <= c.end) {
    const hn::Vec<DF> s = hn::Set(df, c.s), o = hn::Set(df, c.o);
    we = hn::MulAdd(lo, s, o);
    wo = hn::MulAdd(hi, s, o);
  } else {  // the block spans groups
    alignas(64) float se[kMax] = {}, oe[kMax] = {}, so[kMax] = {}, oo[kMax] = {};
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t ge = (c0 + 2 * j) / r.G, go = (c0 + 2 * j + 1) / r.G;
      se[j] = r.scale(ge), oe[j] = r.offset(ge);
      so[j] = r.scale(go), oo[j] = r.offset(go);
    }
    we = hn::MulAdd(lo, hn::Load(df, se), hn::Load(df, oe));
    wo = hn::MulAdd(hi, hn::Load(df, so), hn::Load(df, oo));
  }
  if (nb < B) {
    const auto m = hn::FirstN(df, size_t(nb));
    we = hn::IfThenElseZero(m, we);
    wo = hn::IfThenElseZero(m, wo);
  }
}

// The fast path's inputs: a row's scales (and offsets) as float, converted with the SIMD
// widening of simd-inl.h (exact, like the scalar decode) or used in place when F32.
//   buf  [2, K / G] scratch
template <class DF>
HWY_INLINE void RowParams(DF df, const QuantRow& r, std::vector<float>& buf, const float** s, const float** o) {
  const int64_t ng = r.K / r.G;
  if (!r.f16) {
    *s = static_cast<const float*>(r.s);
    *o = static_cast<const float*>(r.o);
    return;
  }
  if (buf.size() < size_t(2 * ng)) buf.resize(size_t(2 * ng));
  const int64_t L = int64_t(hn::Lanes(df));
  const void* src[2] = {r.s, r.o};
  for (int i = 0; i < (r.o ? 2 : 1); ++i) {
    const auto* p = static_cast<const hwy::float16_t*>(src[i]);  // [ng]
    float* out = buf.data() + i * ng;
    int64_t g = 0;
    for (; g + L <= ng; g += L) hn::StoreU(LoadF32(df, p + g), df, out + g);
    // The tail one by one (the same exact conversion): LoadF32Tail + StoreTail go through
    // memcpy, whose `rep movs` start-up cost ~17% of SmolLM2's decode (18 groups a row: a
    // 2-element tail twice per row, 49152 rows in its head).
    for (; g < ng; ++g) {
      uint16_t h;
      std::memcpy(&h, p + g, 2);
      out[g] = ops::detail::half_to_float(h);
    }
  }
  *s = buf.data();
  *o = r.o ? buf.data() + ng : nullptr;
}

// Fast-path chunks (a whole chunk inside one group, scale s and offset o broadcast): the
// same values DequantI8 / DequantU4 produce.
template <class DF>
HWY_INLINE hn::Vec<DF> ChunkI8(DF df, const int8_t* q, hn::Vec<DF> s) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::RebindToSigned<DF> di;
  return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q))), s);
}
template <class DF>
HWY_INLINE void BlockU4(DF df, const uint8_t* q, hn::Vec<DF> s, hn::Vec<DF> o, hn::Vec<DF>& we, hn::Vec<DF>& wo) {
  const hn::Rebind<uint8_t, DF> d8;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto v = hn::PromoteTo(du, hn::LoadU(d8, q));
  we = hn::MulAdd(hn::ConvertTo(df, hn::BitCast(di, hn::And(v, hn::Set(du, 0x0fu)))), s, o);
  wo = hn::MulAdd(hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<4>(v))), s, o);
}

// Whether a row walk can take the fast path: every chunk (int8: Lanes columns) or block
// (int4: 2 Lanes columns) lies in one group, so K has no partial chunk either.
template <bool kInt4, class DF>
HWY_INLINE bool FastGroups(DF df, int64_t G) {
  const int64_t cols = int64_t(hn::Lanes(df)) * (kInt4 ? 2 : 1);
  return G % cols == 0;
}

// Fast path of the fused kernel for TWO weight rows n, n+1 side by side. Each output
// element keeps its own single accumulator chain (the same arithmetic as one row alone and
// as the tiled path); two rows only give the core two independent chains to overlap. A
// quantized chunk is cheap to read but costs 3-4 vector ops to dequantize, so one row's
// chain (an FMA every 4 cycles) held decode at half the F16 rate per chunk; two rows lift
// that while still streaming memory in long runs (an int4 row is a quarter of an F16 one).
//   xr  MR row pointers into x ([K] int8, [ldx] permuted int4)
//   pbuf0, pbuf1  the caller's buffers for each row's params as float ([2, K / G] each; a
//                 thread_local here cost a __tls_get_addr call per row pair)
template <int MR, bool kInt4>
HWY_INLINE void FastRowPair(const detail::MatmulArgs& a, const float* const* xr, int64_t mt, int64_t n,
                            std::vector<float>& pbuf0, std::vector<float>& pbuf1) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const QuantRow r0 = RowOf(a, n, kInt4), r1 = RowOf(a, n + 1, kInt4);
  const float *sp0, *op0, *sp1, *op1;
  RowParams(df, r0, pbuf0, &sp0, &op0);
  RowParams(df, r1, pbuf1, &sp1, &op1);
  V a00 = hn::Zero(df), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
#define TINYLOOP_PAIR_STEP(XOFF, W0, W1)          \
  {                                               \
    const V x0 = hn::LoadU(df, xr[0] + (XOFF));   \
    a00 = hn::MulAdd(x0, W0, a00);                \
    a01 = hn::MulAdd(x0, W1, a01);                \
    if constexpr (MR > 1) {                       \
      const V x1 = hn::LoadU(df, xr[1] + (XOFF)); \
      a10 = hn::MulAdd(x1, W0, a10);              \
      a11 = hn::MulAdd(x1, W1, a11);              \
    }                                             \
    if constexpr (MR > 2) {                       \
      const V x2 = hn::LoadU(df, xr[2] + (XOFF)); \
      a20 = hn::MulAdd(x2, W0, a20);              \
      a21 = hn::MulAdd(x2, W1, a21);              \
    }                                             \
    if constexpr (MR > 3) {                       \
      const V x3 = hn::LoadU(df, xr[3] + (XOFF)); \
      a30 = hn::MulAdd(x3, W0, a30);              \
      a31 = hn::MulAdd(x3, W1, a31);              \
    }                                             \
  }
  for (int64_t g = 0, k0 = 0; k0 < a.K; ++g, k0 += a.group) {
    const V s0 = hn::Set(df, sp0[g]), s1 = hn::Set(df, sp1[g]);
    if constexpr (kInt4) {
      const V o0 = hn::Set(df, op0[g]), o1 = hn::Set(df, op1[g]);
      for (int64_t c0 = k0; c0 < k0 + a.group; c0 += 2 * L) {
        V we0, wo0, we1, wo1;
        BlockU4(df, r0.q + c0 / 2, s0, o0, we0, wo0);
        BlockU4(df, r1.q + c0 / 2, s1, o1, we1, wo1);
        TINYLOOP_PAIR_STEP(c0, we0, we1)
        TINYLOOP_PAIR_STEP(c0 + L, wo0, wo1)
      }
    } else {
      const int8_t* q0 = reinterpret_cast<const int8_t*>(r0.q);
      const int8_t* q1 = reinterpret_cast<const int8_t*>(r1.q);
      for (int64_t k = k0; k < k0 + a.group; k += L) {
        const V w0 = ChunkI8(df, q0 + k, s0), w1 = ChunkI8(df, q1 + k, s1);
        TINYLOOP_PAIR_STEP(k, w0, w1)
      }
    }
  }
#undef TINYLOOP_PAIR_STEP
  float acc[8];  // [MR, 2]
  acc[0] = ReduceSumF32(df, a00), acc[1] = ReduceSumF32(df, a01);
  if constexpr (MR > 1) acc[2] = ReduceSumF32(df, a10), acc[3] = ReduceSumF32(df, a11);
  if constexpr (MR > 2) acc[4] = ReduceSumF32(df, a20), acc[5] = ReduceSumF32(df, a21);
  if constexpr (MR > 3) acc[6] = ReduceSumF32(df, a30), acc[7] = ReduceSumF32(df, a31);
  StoreTile<2>(acc, mt, 2, a.bias, a.y, a.N, 0, n);
}

// a_i += x row i [off .. off + lanes) * w for the MR rows of a fused call (rows past mt
// repeat the last one, see FusedRowsQuant). tail > 0: only `tail` columns are left (the
// same zero-padded loads as DotTile).
template <int MR, class DF>
HWY_INLINE void MulAddRows(DF df, const float* const* xr, int64_t off, hn::Vec<DF> w, hn::Vec<DF>& a0, hn::Vec<DF>& a1,
                           hn::Vec<DF>& a2, hn::Vec<DF>& a3, size_t tail = 0) {
  const auto x = [df, xr, off, tail](int i)
                     HWY_ATTR { return tail ? LoadF32Tail(df, xr[i] + off, tail) : hn::LoadU(df, xr[i] + off); };
  a0 = hn::MulAdd(x(0), w, a0);
  if constexpr (MR > 1) a1 = hn::MulAdd(x(1), w, a1);
  if constexpr (MR > 2) a2 = hn::MulAdd(x(2), w, a2);
  if constexpr (MR > 3) a3 = hn::MulAdd(x(3), w, a3);
}

// Fused path: x rows 0 .. T (T = mt <= MR) against weight rows [n0, n1), one row at a time
// (the sequential stream FusedRows of matmul-inl.h explains).
//   x rows: [T, K] (int8) or [T, ldx] permuted (int4)
template <int MR, bool kInt4>
HWY_NOINLINE void FusedRowsQuant(const detail::MatmulArgs& a, int64_t mt, int64_t n0, int64_t n1) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t K = a.K, ldx = kInt4 ? a.ldx : a.K;
  const float* xr[4];
  for (int i = 0; i < 4; ++i) xr[i] = a.x + std::min<int64_t>(std::min(i, MR - 1), mt - 1) * ldx;
  const bool fast = FastGroups<kInt4>(df, a.group);
  thread_local std::vector<float> pbuf, pbuf1;  // [2, K / G] a row's params as float
  int64_t n = n0;
  // Pairs for int4 only: for int8 two row streams read from memory at half the rate of one
  // (1 x 768 -> 32000: 12.5 against 23 GFLOP/s on the EPYC test machine), while int4 gained
  // (18 -> 21), its dequantisation being the longer chain of work.
  if (kInt4 && fast)
    for (; n + 1 < n1; n += 2) FastRowPair<MR, kInt4>(a, xr, mt, n, pbuf, pbuf1);
  for (; n < n1; ++n) {
    const QuantRow r = RowOf(a, n, kInt4);
    GroupCursor c{r.G};
    V a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
    if (fast) {
      const float *sp, *op;
      RowParams(df, r, pbuf, &sp, &op);
      for (int64_t g = 0, k0 = 0; k0 < K; ++g, k0 += r.G) {
        const V s = hn::Set(df, sp[g]);
        if constexpr (kInt4) {
          const V o = hn::Set(df, op[g]);
          for (int64_t c0 = k0; c0 < k0 + r.G; c0 += 2 * L) {
            V we, wo;
            BlockU4(df, r.q + c0 / 2, s, o, we, wo);
            MulAddRows<MR>(df, xr, c0, we, a0, a1, a2, a3);
            MulAddRows<MR>(df, xr, c0 + L, wo, a0, a1, a2, a3);
          }
        } else {
          const int8_t* q = reinterpret_cast<const int8_t*>(r.q);
          for (int64_t k = k0; k < k0 + r.G; k += L) {
            const V w = ChunkI8(df, q + k, s);
            MulAddRows<MR>(df, xr, k, w, a0, a1, a2, a3);
          }
        }
      }
    } else if constexpr (kInt4) {
      for (int64_t c0 = 0; c0 < K; c0 += 2 * L) {
        V we, wo;
        DequantU4(df, r, c, c0, we, wo);
        MulAddRows<MR>(df, xr, c0, we, a0, a1, a2, a3);
        MulAddRows<MR>(df, xr, c0 + L, wo, a0, a1, a2, a3);
      }
    } else {
      int64_t k = 0;
      for (; k + L <= K; k += L) {
        const V w = DequantI8(df, r, c, k, L);
        MulAddRows<MR>(df, xr, k, w, a0, a1, a2, a3);
      }
      if (k < K) {  // the same tail loads as DotTile
        const size_t rem = size_t(K - k);
        const V w = DequantI8(df, r, c, k, K - k);
        MulAddRows<MR>(df, xr, k, w, a0, a1, a2, a3, rem);
      }
    }
    float acc[4];
    acc[0] = ReduceSumF32(df, a0);
    if constexpr (MR > 1) acc[1] = ReduceSumF32(df, a1);
    if constexpr (MR > 2) acc[2] = ReduceSumF32(df, a2);
    if constexpr (MR > 3) acc[3] = ReduceSumF32(df, a3);
    StoreTile<1>(acc, mt, 1, a.bias, a.y, a.N, 0, n);
  }
}

// Dequantizes rows [n0, n0 + nb) into buf[nb, ld] with the chunk functions of the fused
// path (ld: K rounded up to whole chunks; int4 in the permuted column order).
template <bool kInt4>
HWY_INLINE void DequantRows(const detail::MatmulArgs& a, int64_t n0, int64_t nb, int64_t ld, float* HWY_RESTRICT buf) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  const bool fast = FastGroups<kInt4>(df, a.group);
  thread_local std::vector<float> pbuf;  // [2, K / G] a row's params as float
  for (int64_t i = 0; i < nb; ++i) {
    const QuantRow r = RowOf(a, n0 + i, kInt4);
    GroupCursor c{r.G};
    float* dst = buf + i * ld;  // [ld]
    if (fast) {
      const float *sp, *op;
      RowParams(df, r, pbuf, &sp, &op);
      for (int64_t g = 0, k0 = 0; k0 < a.K; ++g, k0 += r.G) {
        const auto s = hn::Set(df, sp[g]);
        if constexpr (kInt4) {
          const auto o = hn::Set(df, op[g]);
          for (int64_t c0 = k0; c0 < k0 + r.G; c0 += 2 * L) {
            hn::Vec<decltype(df)> we, wo;
            BlockU4(df, r.q + c0 / 2, s, o, we, wo);
            hn::StoreU(we, df, dst + c0);
            hn::StoreU(wo, df, dst + c0 + L);
          }
        } else {
          const int8_t* q = reinterpret_cast<const int8_t*>(r.q);
          for (int64_t k = k0; k < k0 + r.G; k += L) hn::StoreU(ChunkI8(df, q + k, s), df, dst + k);
        }
      }
    } else if constexpr (kInt4) {
      for (int64_t c0 = 0; c0 < a.K; c0 += 2 * L) {
        hn::Vec<decltype(df)> we, wo;
        DequantU4(df, r, c, c0, we, wo);
        hn::StoreU(we, df, dst + c0);
        hn::StoreU(wo, df, dst + c0 + L);
      }
    } else {
      for (int64_t k = 0; k < a.K; k += L) hn::StoreU(DequantI8(df, r, c, k, std::min(L, a.K - k)), df, dst + k);
    }
  }
}

// Tiled path for weight rows [n0, n1): dequantize them once, sweep every x row past them
// with the float DotTile (dot length K for int8, whose tail DotTile pads as the fused path
// does; the whole padded ldx for int4, all full chunks).
template <bool kInt4>
HWY_NOINLINE void TiledQuant(const detail::MatmulArgs& a, int64_t n0, int64_t n1) {
  const hn::ScalableTag<float> df;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t nb = n1 - n0;
  const int64_t ld = kInt4 ? a.ldx : (a.K + L - 1) / L * L;
  const int64_t ldx = kInt4 ? a.ldx : a.K;  // x row stride
  const int64_t dot_k = kInt4 ? a.ldx : a.K;  // columns each dot runs over
  thread_local std::vector<float> buf;  // [nb, ld], grows to the largest tile seen
  if (buf.size() < size_t(nb * ld)) buf.resize(size_t(nb * ld));
  DequantRows<kInt4>(a, n0, nb, ld, buf.data());
  for (int64_t t = 0; t < a.T; t += kTileMR) {
    const int64_t mt = std::min<int64_t>(kTileMR, a.T - t);
    const float* xr[kTileMR];
    for (int i = 0; i < kTileMR; ++i) xr[i] = a.x + (t + std::min<int64_t>(i, mt - 1)) * ldx;
    for (int64_t j = 0; j < nb; j += kTileNR) {
      const int64_t mj = std::min<int64_t>(kTileNR, nb - j);
      const float* wr[kTileNR];
      for (int q = 0; q < kTileNR; ++q) wr[q] = buf.data() + (j + std::min<int64_t>(q, mj - 1)) * ld;
      float acc[kTileMR * kTileNR];
      DotTile<kTileMR, kTileNR, float>(xr, wr, size_t(dot_k), acc);
      StoreTile<kTileNR>(acc, mt, mj, a.bias, a.y, a.N, t, n0 + j);
    }
  }
}

// Output columns [n0, n1) of all rows.
template <bool kInt4>
HWY_INLINE void MatmulRangeQuant(const detail::MatmulArgs& a, int64_t n0, int64_t n1) {
  if (a.T > detail::kFusedMaxRows) return TiledQuant<kInt4>(a, n0, n1);
  switch (a.T) {
    case 1: return FusedRowsQuant<1, kInt4>(a, 1, n0, n1);
    case 2: return FusedRowsQuant<2, kInt4>(a, 2, n0, n1);
    case 3: return FusedRowsQuant<3, kInt4>(a, 3, n0, n1);
    default: return FusedRowsQuant<4, kInt4>(a, a.T, n0, n1);
  }
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TINYLOOP_CPU_MATMUL_QUANT_INL_H_ toggle
