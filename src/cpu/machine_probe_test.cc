// The machine probes: argument checks, and rates inside what any CPU can physically do (a
// unit slip - bytes for elements, a lost thread or lane factor - lands outside these).
#include "cpu/machine_probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "cpu/kernels.h"

namespace tinyloop::cpu {
namespace {

TEST(MachineProbe, RatesArePhysical) {
  for (int threads : {1, 2}) {
    const MachineBounds b = probe_machine(threads, int64_t{8} << 20, 1);
    EXPECT_EQ(b.threads, threads);
    EXPECT_EQ(b.simd_target, simd_target_name());
    ASSERT_TRUE(std::isfinite(b.read_gbps) && std::isfinite(b.fma_gflops));
    // 8 MiB may sit in a cache, so the read bound is a cache's: above 0.1 GB/s, below 4 TB/s
    // a thread. FMA: at most 2 pipes x 16 lanes x 2 flops x 6 GHz = 384 GFLOP/s a thread.
    EXPECT_GT(b.read_gbps, 0.1);
    EXPECT_LT(b.read_gbps, 4000.0 * threads);
    EXPECT_GT(b.fma_gflops, 0.1);
    EXPECT_LT(b.fma_gflops, 384.0 * threads);
  }
}

TEST(MachineProbe, RejectsBadArguments) {
  EXPECT_THROW(probe_machine(0), std::invalid_argument);
  EXPECT_THROW(probe_machine(1025), std::invalid_argument);
  EXPECT_THROW(probe_machine(1, 1000), std::invalid_argument);
  EXPECT_THROW(probe_machine(1, int64_t{65} << 30), std::invalid_argument);
  EXPECT_THROW(probe_machine(1, int64_t{8} << 20, 0), std::invalid_argument);
  // More than half of the machine's memory: refused before anything is allocated (the probe
  // writes its buffer whole, which would end in the OOM killer, not an exception).
  const int64_t phys = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  if (phys / 2 + 1 <= (int64_t{64} << 30)) {
    try {
      probe_machine(1, phys / 2 + (int64_t{1} << 20));
      FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("half of this machine's memory"), std::string::npos) << e.what();
    }
  }
  try {
    probe_machine(-3);
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("threads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tinyloop::cpu
