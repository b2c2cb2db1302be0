// Matmul kernels for F16 weights, compiled once per Highway target (see matmul-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul_f16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/matmul-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
void MatmulRangeF16(const detail::MatmulArgs& a, int64_t n0, int64_t n1) { MatmulRange<hwy::float16_t>(a, n0, n1); }
}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu::detail {
HWY_EXPORT(MatmulRangeF16);
MatmulRangeFn matmul_range_f16() { return HWY_DYNAMIC_DISPATCH(MatmulRangeF16); }
}  // namespace tinyloop::cpu::detail
#endif
