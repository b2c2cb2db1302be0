// SIMD + threaded q8-activation matmul for int8 / int4 weights (ops/matmul_q8act.h has the
// math; this is the fast version of ops::ref::matmul_q8act), compiled once per Highway target.
//
// The driver quantizes every x row once per call (the scalar quantizer of
// ops/matmul_q8act.h, so the bits are those of the reference) and widens the int8 values
// to int16: the operand of pmaddwd (ReorderWidenMulAccumulate; Highway 1.0.3 has no int8
// dot product op). For int4 weights each block of 32 columns of x is stored permuted to
// [16 even columns, 16 odd columns], the order of a block's low and high nibbles.
// Per weight row the kernel widens the row to int16 once (the same order), then for every
// x row: per block, an int32 vector of partial sums (pmaddwd), converted to float and
// fused into a float accumulator with the broadcast d_w * d_x; one horizontal sum at the
// end, plus the offset term (scalar, in block order, as the reference).
// Batch invariance: (t, n) is computed by the same code whatever T, N or the thread.
//
// cpu::matmul_q8act (bottom) runs this kernel only as the last resort: on a view with a packed
// copy it runs matmul_q8act_packed.cc (AVX512-VNNI, else AVX2), on others the row-major
// AVX512-VNNI kernel of matmul_q8act_vnni.cc when the CPU has it. TINYLOOP_DISABLE_VNNI (read
// once; for tests and A/B benchmarks) turns both VNNI kernels off.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul_q8act.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <vector>

#include "cpu/simd-inl.h"
#include "hwy/highway.h"
#include "base/q8act_format.h"
#include "base/weight_quant_inl.h"

#ifndef TINYLOOP_CPU_MATMUL_Q8ACT_ARGS_
#define TINYLOOP_CPU_MATMUL_Q8ACT_ARGS_
namespace tinyloop::cpu::detail {
struct Q8ActArgs {
  const int16_t* xq;  // [T, K] quantized x widened (int4: each block permuted)
  const float* dx;  // [T, K / 32] block scales
  const float* sx;  // [T, K / 32] block sums (Q8_1 s)
  int64_t T, N, K;
  bool int4;
  const void* w;  // int8 [N, K] / int4 [N, K / 2]
  int64_t group;
  bool scale_f16;
  const void* scales;  // [N, K / group]
  const void* offsets;  // [N, K / group] int4
  const float* bias;  // [N] or null
  float* y;  // [T, N]
};
}  // namespace tinyloop::cpu::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Weight row n widened to int16 into w16 [K] (int4: blocks permuted like xq).
HWY_INLINE void WidenRow(const detail::Q8ActArgs& a, int64_t n, int16_t* HWY_RESTRICT w16) {
  const hn::CappedTag<int16_t, 16> d16;  // 16 lanes (8 on EMU128)
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const int64_t L = int64_t(hn::Lanes(d16));
  if (!a.int4) {
    const int8_t* q = static_cast<const int8_t*>(a.w) + n * a.K;  // [K]
    for (int64_t k = 0; k < a.K; k += L) hn::StoreU(hn::PromoteTo(d16, hn::LoadU(d8, q + k)), d16, w16 + k);
    return;
  }
  const uint8_t* q = static_cast<const uint8_t*>(a.w) + n * (a.K / 2);  // [K / 2]
  const auto mask = hn::Set(d16, int16_t(0x0f));
  for (int64_t c0 = 0; c0 < a.K; c0 += ops::kQ8Block) {
    for (int64_t j = 0; j < 16; j += L) {
      const auto v =
          hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(), hn::LoadU(du8, q + c0 / 2 + j)));
      hn::StoreU(hn::And(v, mask), d16, w16 + c0 + j);
      hn::StoreU(hn::ShiftRight<4>(v), d16, w16 + c0 + 16 + j);
    }
  }
}

// Rows t0 .. t0 + MR of x against the widened weight row w16 [K]: y[t, n] for each.
// Each (t, n) has its own accumulator chain in the same order whatever MR (batch invariance);
// MR rows only share the weight loads.
template <int MR>
HWY_INLINE void DotRows(const detail::Q8ActArgs& a, const int16_t* HWY_RESTRICT w16, const float* HWY_RESTRICT dw,
                        const float* HWY_RESTRICT ow, int64_t t0, int64_t n) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const hn::Repartition<float, decltype(d16)> df;
  using VF = hn::Vec<decltype(df)>;
  const int64_t L16 = int64_t(hn::Lanes(d16));
  const int64_t K = a.K, nb = K / ops::kQ8Block, bpg = a.group / ops::kQ8Block;
  const int16_t* xq[MR];  // [K] each
  const float *dx[MR], *sx[MR];  // [nb] each
  VF acc[MR];
  float off[MR];
  for (int i = 0; i < MR; ++i) {
    xq[i] = a.xq + (t0 + i) * K;
    dx[i] = a.dx + (t0 + i) * nb;
    sx[i] = a.sx + (t0 + i) * nb;
    acc[i] = hn::Zero(df);
    off[i] = 0.f;
  }
  for (int64_t g = 0, b = 0; b < nb; ++g) {
    const float s = dw[g], o = ow[g];
    for (int64_t e = b + bpg; b < e; ++b) {
      const int64_t k0 = b * ops::kQ8Block;
      for (int i = 0; i < MR; ++i) {
        auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
        for (int64_t c = 0; c < ops::kQ8Block; c += L16)
          s0 = hn::ReorderWidenMulAccumulate(d32, hn::LoadU(d16, w16 + k0 + c), hn::LoadU(d16, xq[i] + k0 + c), s0, s1);
        const auto isum = hn::RearrangeToOddPlusEven(s0, s1);  // partial sums of block b
        acc[i] = hn::MulAdd(hn::ConvertTo(df, isum), hn::Set(df, s * dx[i][b]), acc[i]);
        if (a.int4) off[i] += o * sx[i][b];
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    const float v = ReduceSumF32(df, acc[i]) + off[i];
    a.y[(t0 + i) * a.N + n] = a.bias ? v + a.bias[n] : v;
  }
}

// Output columns [n0, n1) of every row.
void Q8ActRange(const detail::Q8ActArgs& a, int64_t n0, int64_t n1) {
  static_assert(hn::MaxLanes(hn::ScalableTag<int16_t>()) <= ops::kQ8Block, "block < vector");
  const int64_t K = a.K, ng = K / a.group;
  const DType pt = a.scale_f16 ? DType::F16 : DType::F32;  // scales / offsets storage
  thread_local std::vector<int16_t> w16;  // [K] one weight row widened
  thread_local std::vector<float> dw, ow;  // [K / group] its scales, offsets (0 for int8)
  if (w16.size() < size_t(K)) w16.resize(size_t(K));
  if (dw.size() < size_t(ng)) dw.resize(size_t(ng)), ow.resize(size_t(ng));
  for (int64_t n = n0; n < n1; ++n) {
    WidenRow(a, n, w16.data());
    for (int64_t g = 0; g < ng; ++g) {
      dw[size_t(g)] = ops::detail::quant_param(a.scales, pt, n * ng + g);
      ow[size_t(g)] = a.int4 ? ops::detail::quant_param(a.offsets, pt, n * ng + g) : 0.f;
    }
    int64_t t = 0;
    for (; t + 4 <= a.T; t += 4) DotRows<4>(a, w16.data(), dw.data(), ow.data(), t, n);
    for (; t < a.T; ++t) DotRows<1>(a, w16.data(), dw.data(), ow.data(), t, n);
  }
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "cpu/kernels.h"
#include "cpu/matmul_q8act_packed.h"
#include "cpu/matmul_q8act_vnni.h"
#include "cpu/matmul_split.h"
#include "base/weight_quant_inl.h"

namespace tinyloop::cpu {
HWY_EXPORT(Q8ActRange);

namespace {
constexpr int64_t kRowsPerTask = 32;  // weight rows per pool task (as matmul.cc)
}  // namespace

// x [T, K], w [N, K], bias [N] or null, y [T, N].
void detail::matmul_q8act_hwy(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y) {
  ops::require_q8act(w);
  const int64_t N = w.rows, K = w.cols, nb = K / ops::kQ8Block;
  if (T <= 0 || N <= 0) return;
  const bool int4 = w.dtype == DType::U4;
  thread_local std::vector<int16_t> xq;  // [T, K]
  thread_local std::vector<float> dx, sx;  // [T, nb]
  thread_local std::vector<int8_t> q8;  // [K] one row before widening
  if (xq.size() < size_t(T * K)) xq.resize(size_t(T * K));
  if (dx.size() < size_t(T * nb)) dx.resize(size_t(T * nb)), sx.resize(size_t(T * nb));
  if (q8.size() < size_t(K)) q8.resize(size_t(K));
  for (int64_t t = 0; t < T; ++t) {
    ops::detail::quantize_row_q8(x + t * K, K, q8.data(), dx.data() + t * nb, sx.data() + t * nb);
    int16_t* out = xq.data() + t * K;  // [K]
    for (int64_t c0 = 0; c0 < K; c0 += ops::kQ8Block)
      for (int64_t j = 0; j < ops::kQ8Block; ++j) {
        // int4: column c0 + j goes where its nibble lands (even -> j / 2, odd -> 16 + j / 2).
        const int64_t dst = int4 ? (j & 1) * 16 + j / 2 : j;
        out[c0 + dst] = q8[size_t(c0 + j)];
      }
  }
  detail::Q8ActArgs a{xq.data(), dx.data(), sx.data(), T, N, K, int4, w.data, w.group, w.scale_dtype == DType::F16,
                      w.scales,  w.offsets, bias,      y};
  const auto fn = HWY_DYNAMIC_DISPATCH(Q8ActRange);
  detail::for_row_chunks(T, N, K, kRowsPerTask, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
}

namespace {
// What set_vnni_enabled asked for before the first q8 kernel ran (ops/backend.h applies
// TINYLOOP_DISABLE_VNNI through it).
std::atomic<bool> g_vnni_wanted{true};

// VNNI kernels on: the CPU has them and they were not turned off. Decided once, at the first
// q8 kernel or packing, because the packed copies made at load time follow this choice.
bool vnni_on() {
  static const bool on = g_vnni_wanted.load() && detail::vnni_supported();
  return on;
}

// The packed kernel this process runs on views with a packed copy (none: no copies are made).
std::optional<detail::PackedIsa> packed_isa() {
  if (vnni_on()) return detail::PackedIsa::Avx512Vnni;
  if (detail::packed_avx2_supported()) return detail::PackedIsa::Avx2;
  return std::nullopt;
}
}  // namespace

void matmul_q8act(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y) {
  if (w.q8packed)
    if (const auto isa = packed_isa()) {
      // Many rows (prefill, a large batched decode) on AMX-INT8 tiles where the CPU has them:
      // the same bits as the VNNI kernel (both are the reference's), so the switch by T keeps
      // batch invariance.
      const bool amx = *isa == detail::PackedIsa::Avx512Vnni && T >= detail::amx_int8_min_rows(w.dtype == DType::U4) &&
                       detail::packed_amx_int8_supported();
      return detail::matmul_q8act_packed(x, T, w, bias, y, amx ? detail::PackedIsa::AmxInt8 : *isa);
    }
  if (vnni_on()) return detail::matmul_q8act_vnni(x, T, w, bias, y);
  detail::matmul_q8act_hwy(x, T, w, bias, y);
}

int64_t q8act_packed_bytes(const ops::WeightView& w) { return packed_isa() ? detail::q8act_packed_bytes(w) : 0; }

void set_vnni_enabled(bool on) { g_vnni_wanted.store(on); }

bool q8act_packed_available() { return packed_isa().has_value(); }

std::string q8act_kernel_name() {
  if (const auto isa = packed_isa()) {
    if (*isa == detail::PackedIsa::Avx2) return "avx2";
    return detail::packed_amx_int8_supported() ? "amx-int8" : "avx512vnni";
  }
  return "portable-" + simd_target_name();
}

void pack_q8act(const ops::WeightView& w, void* out) {
  if (cpu::q8act_packed_bytes(w) == 0)
    throw std::invalid_argument(
        "pack_q8act: the weight can not be packed (needs int8/int4 with a group that is "
        "a multiple of 32, and a CPU with AVX512-VNNI or AVX2)");
  detail::pack_q8act(w, out);
}

}  // namespace tinyloop::cpu
#endif
