// Timing for the C++ benchmark programs in bench/: best-of-reps wall and CPU seconds.
// On a shared machine the CPU time says how fast the code is while it runs, the wall time
// how fast it was this time; the programs print rates from both.
#pragma once
#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <utility>

namespace tinyloop::bench {

// CPU seconds used by this process so far (all threads).
inline double process_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best-of-reps {wall, CPU} seconds of fn(), after one untimed warm-up call (page faults,
// scratch buffers, caches).
inline std::pair<double, double> time_best(const std::function<void()>& fn, int reps) {
  fn();
  double wall = 1e30, cpu = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double c0 = process_cpu_s();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    wall = std::min(wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu = std::min(cpu, process_cpu_s() - c0);
  }
  return {wall, cpu};
}

}  // namespace tinyloop::bench
