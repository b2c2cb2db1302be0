// Matmul kernels for int8 weights (per-group scales), compiled once per Highway target
// (see matmul_quant-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul_int8.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/matmul_quant-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
void MatmulRangeI8(const detail::MatmulArgs& a, int64_t n0, int64_t n1) { MatmulRangeQuant<false>(a, n0, n1); }
}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu::detail {
HWY_EXPORT(MatmulRangeI8);
MatmulRangeFn matmul_range_i8() { return HWY_DYNAMIC_DISPATCH(MatmulRangeI8); }
}  // namespace tinyloop::cpu::detail
#endif
