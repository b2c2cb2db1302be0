// What this machine can do at best, measured: the memory read bandwidth and the float32 FMA
// rate of `threads` threads running at once. bench/roofline.py sets the engine's speeds
// beside them (how far a decode at long context is from reading its K/V at memory speed,
// how far a prefill is from the FMA peak), so a speed target can be checked against what
// the CPU allows before anyone tunes for it (docs/benchmarks.md, "Roofline").
//
// Both probes use the best SIMD target Highway picks at run time (the one the kernels use)
// and their own std::threads, not the kernel pool: each thread gets exactly one equal share.
// They are measurements on a shared machine: best of `reps` runs, still noisy.
#pragma once
#include <cstdint>
#include <string>

namespace tinyloop::cpu {

struct MachineBounds {
  int threads = 0;
  double read_gbps = 0;  // bytes read from memory per second by all threads together / 1e9
  double fma_gflops = 0;  // float32 flops (2 per lane of an FMA) of all threads / 1e9
  std::string simd_target;  // the Highway target the probes ran
};

// Reads a buffer of read_bytes (spread evenly over the threads; it must be far larger than
// the last-level cache to measure memory, 1 GiB by default), best of reps passes; then runs
// independent FMA chains on every thread. Throws std::invalid_argument for threads < 1 or >
// 1024, read_bytes < 1 MiB, > 64 GiB or over half of the machine's memory, reps < 1 or > 100.
MachineBounds probe_machine(int threads, int64_t read_bytes = int64_t{1} << 30, int reps = 5);

}  // namespace tinyloop::cpu
