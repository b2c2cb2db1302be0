// The compute backend's process-wide settings and state, as the frontends see them
// (tinyloop_py.set_num_threads, set_force_scalar, cpu_info; the CLI's --threads). The runtime
// passes them through to ops/backend.h, so no frontend reaches below the runtime.
#pragma once
#include "ops/backend.h"
#include "ops/ops.h"  // set_force_scalar

namespace tinyloop::runtime {

using BackendInfo = ops::BackendInfo;
using BackendSettings = ops::BackendSettings;

// Threads the kernels use (the calling thread included); n < 1 restores the default (env
// TINYLOOP_NUM_THREADS, else the hardware concurrency).
inline void set_num_threads(int n) {
  BackendSettings s;
  s.num_threads = n;
  ops::configure_backend(s);
}
inline int num_threads() { return ops::num_threads(); }
// true: the scalar reference kernels instead of the SIMD ones (default env TINYLOOP_FORCE_SCALAR=1).
inline void set_force_scalar(bool on) { ops::set_force_scalar(on); }
inline void configure_backend(const BackendSettings& s) { ops::configure_backend(s); }
inline BackendInfo backend_info() { return ops::backend_info(); }
// The machine's read bandwidth and FMA rate at `threads` threads (ops/backend.h).
using MachineBounds = ops::MachineBounds;
inline MachineBounds probe_machine(int threads, int64_t read_bytes, int reps) {
  return ops::probe_machine(threads, read_bytes, reps);
}

}  // namespace tinyloop::runtime
