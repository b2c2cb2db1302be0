// Helpers shared by the cpu kernel tests (test-only, not part of tinyloop_cpu): run a check
// once per compiled Highway target that this CPU supports, with that target forced.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "cpu/kernels.h"
#include "hwy/targets.h"

namespace tinyloop::cpu::testing {

// Calls f() with each target of compiled_targets() that the CPU can run forced as the
// dispatch choice (hwy::SetSupportedTargetsForTest), then restores normal dispatch. Checks
// that the dispatcher really switched, so a test cannot silently run one target N times.
template <class F>
void for_each_target(const F& f) {
  hwy::SetSupportedTargetsForTest(0);
  const int64_t supported = hwy::SupportedTargets();
  int ran = 0;
  for (int64_t t : compiled_targets()) {
    if ((supported & t) == 0) continue;
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(t));
    ASSERT_EQ(simd_target_name(), hwy::TargetName(t));
    f();
    ++ran;
    if (::testing::Test::HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(ran, 1);
}

}  // namespace tinyloop::cpu::testing
