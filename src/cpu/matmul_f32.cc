// Matmul kernels for F32 weights, compiled once per Highway target (see matmul-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul_f32.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/matmul-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
void MatmulRangeF32(const detail::MatmulArgs& a, int64_t n0, int64_t n1) { MatmulRange<float>(a, n0, n1); }
// The tiled path's task rows for every weight type (their kernels share TiledRange).
int64_t TiledRowsF32(int64_t K, bool float_tile) { return TiledTaskRows(K, float_tile); }
}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu::detail {
HWY_EXPORT(MatmulRangeF32);
MatmulRangeFn matmul_range_f32() { return HWY_DYNAMIC_DISPATCH(MatmulRangeF32); }
HWY_EXPORT(TiledRowsF32);
int64_t tiled_task_rows(int64_t K, bool float_tile) { return HWY_DYNAMIC_DISPATCH(TiledRowsF32)(K, float_tile); }
}  // namespace tinyloop::cpu::detail
#endif
