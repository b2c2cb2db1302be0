// Which Highway targets this library holds, and which one the dispatcher picks.
#include "cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/targets.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
int64_t CurrentTarget() { return HWY_TARGET; }
}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(CurrentTarget);

std::string simd_target_name() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CurrentTarget)()); }

std::vector<int64_t> compiled_targets() {
  // HWY_TARGETS here is the set every kernel translation unit of tinyloop_cpu was compiled
  // for (they share the compile definitions). Lower bit = better target.
  std::vector<int64_t> out;
  for (int64_t t = HWY_TARGETS; t != 0; t &= t - 1) out.push_back(t & -t);
  return out;
}

std::vector<std::string> compiled_target_names() {
  std::vector<std::string> names;
  for (int64_t t : compiled_targets()) names.push_back(hwy::TargetName(t));
  return names;
}
}  // namespace tinyloop::cpu
#endif
