// Matmul kernels for int4 weights (per-group scales and offsets, two columns a byte),
// compiled once per Highway target (see matmul_quant-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul_int4.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/matmul_quant-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
void MatmulRangeU4(const detail::MatmulArgs& a, int64_t n0, int64_t n1) { MatmulRangeQuant<true>(a, n0, n1); }
// Bytes of a block = float lanes of this target (matmul_internal.h).
int64_t Int4BlockBytes() { return int64_t(hn::Lanes(hn::ScalableTag<float>())); }
}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu::detail {
HWY_EXPORT(MatmulRangeU4);
HWY_EXPORT(Int4BlockBytes);
MatmulRangeFn matmul_range_u4() { return HWY_DYNAMIC_DISPATCH(MatmulRangeU4); }
int64_t int4_block_bytes() { return HWY_DYNAMIC_DISPATCH(Int4BlockBytes)(); }
}  // namespace tinyloop::cpu::detail
#endif
