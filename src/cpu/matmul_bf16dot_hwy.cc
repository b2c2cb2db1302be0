// The portable kernel of the reduced-precision matmul (ops/matmul_bf16dot.h), for CPUs
// without AVX512-BF16: compiled once per Highway target. It reads the same packed pairs as
// vdpbf16ps and forms the same chain per element: both bf16 halves widened exactly (the even
// column by a shift, the odd one by a mask), then acc = MulAdd(x_odd, w_odd, acc) and
// acc = MulAdd(x_even, w_even, acc). A product of two bf16 values is exact in float32, so a
// fused multiply-add and a multiply followed by an add (targets without FMA: HWY_SCALAR)
// round the same way, once, as the instruction does: this kernel gives the AVX512-BF16
// kernel's bits.
//
// Tile: up to 3 x rows at a time against 2 vectors of a panel's columns (6 accumulators,
// named: GCC keeps arrays of Highway vectors in memory), sweeping the panel's 64 columns.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul_bf16dot_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <bit>

#include "cpu/matmul_bf16dot_internal.h"
#include "hwy/highway.h"
#include "base/bf16dot_format.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[r * 64 + c] for r < MR (x rows at xp + r * ldx), c < 64.
template <int MR>
HWY_INLINE void Bf16DotRows(const uint32_t* HWY_RESTRICT xp, int64_t ldx, int64_t K2,
                            const uint32_t* HWY_RESTRICT panel, float* HWY_RESTRICT out) {
  constexpr int64_t C = ops::kBf16DotPanel;
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  for (int64_t c0 = 0; c0 < C; c0 += 2 * L) {  // 64 is a multiple of 2 L for L <= 32
    V a00 = hn::Zero(df), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    for (int64_t i = 0; i < K2; ++i) {
      const auto u0 = hn::LoadU(du, panel + i * C + c0);
      const auto u1 = hn::LoadU(du, panel + i * C + c0 + L);
      const V we0 = hn::BitCast(df, hn::ShiftLeft<16>(u0)), wo0 = hn::BitCast(df, hn::And(u0, hi_mask));
      const V we1 = hn::BitCast(df, hn::ShiftLeft<16>(u1)), wo1 = hn::BitCast(df, hn::And(u1, hi_mask));
#define TINYLOOP_BF16DOT_ROW(R)                                       \
  if constexpr (MR > R) {                                             \
    const uint32_t xv = xp[R * ldx + i];                              \
    const V xe = hn::Set(df, std::bit_cast<float>(xv << 16));         \
    const V xo = hn::Set(df, std::bit_cast<float>(xv & 0xffff0000u)); \
    a##R##0 = hn::MulAdd(xe, we0, hn::MulAdd(xo, wo0, a##R##0));      \
    a##R##1 = hn::MulAdd(xe, we1, hn::MulAdd(xo, wo1, a##R##1));      \
  }
      TINYLOOP_BF16DOT_ROW(0)
      TINYLOOP_BF16DOT_ROW(1)
      TINYLOOP_BF16DOT_ROW(2)
#undef TINYLOOP_BF16DOT_ROW
    }
    hn::StoreU(a00, df, out + c0);
    hn::StoreU(a01, df, out + c0 + L);
    if constexpr (MR > 1) hn::StoreU(a10, df, out + C + c0), hn::StoreU(a11, df, out + C + c0 + L);
    if constexpr (MR > 2) hn::StoreU(a20, df, out + 2 * C + c0), hn::StoreU(a21, df, out + 2 * C + c0 + L);
  }
}

// The Bf16DotTileFn contract (matmul_bf16dot_internal.h): rows in groups of 3.
void Bf16DotTile(const uint32_t* xp, int64_t ldx, int64_t mt, int64_t K2, const uint32_t* panel, float* out) {
  constexpr int64_t C = ops::kBf16DotPanel;
  for (int64_t r = 0; r < mt; r += 3) {
    const uint32_t* x = xp + r * ldx;
    float* o = out + r * C;
    switch (std::min<int64_t>(3, mt - r)) {
      case 1: Bf16DotRows<1>(x, ldx, K2, panel, o); break;
      case 2: Bf16DotRows<2>(x, ldx, K2, panel, o); break;
      default: Bf16DotRows<3>(x, ldx, K2, panel, o); break;
    }
  }
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu::detail {
HWY_EXPORT(Bf16DotTile);
Bf16DotTileFn bf16dot_tile_portable() { return HWY_DYNAMIC_DISPATCH(Bf16DotTile); }
}  // namespace tinyloop::cpu::detail
#endif
