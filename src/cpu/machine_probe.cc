// The machine probes of machine_probe.h: a streaming read and a run of FMA chains, on the
// SIMD target the kernels use, on `threads` std::threads released together.
#include "cpu/machine_probe.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include <unistd.h>

#include "cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/machine_probe.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of p[0 .. n) as uint32 lanes (n a multiple of 4 vectors). Integer adds: one cycle of
// latency, so four accumulators keep up with any load rate; the sum is returned so that the
// loads are not dropped.
uint32_t ReadStream(const uint32_t* HWY_RESTRICT p, int64_t n) {
  const hn::ScalableTag<uint32_t> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t L = int64_t(hn::Lanes(d));
  V a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 4 * L <= n; i += 4 * L) {
    a0 = hn::Add(a0, hn::Load(d, p + i));
    a1 = hn::Add(a1, hn::Load(d, p + i + L));
    a2 = hn::Add(a2, hn::Load(d, p + i + 2 * L));
    a3 = hn::Add(a3, hn::Load(d, p + i + 3 * L));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

// iters steps of 12 independent FMA chains (12 x 4-cycle latency covers two FMA pipes; 12
// accumulators + 2 operands fit AVX2's 16 registers). Returns the flops done (2 a lane) and
// writes a sum so the chains are live.
double FmaChains(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  V a0 = hn::Set(d, 0.1f), a1 = hn::Set(d, 0.2f), a2 = hn::Set(d, 0.3f), a3 = hn::Set(d, 0.4f);
  V a4 = hn::Set(d, 0.5f), a5 = hn::Set(d, 0.6f), a6 = hn::Set(d, 0.7f), a7 = hn::Set(d, 0.8f);
  V a8 = hn::Set(d, 0.9f), a9 = hn::Set(d, 1.0f), a10 = hn::Set(d, 1.1f), a11 = hn::Set(d, 1.2f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c), a1 = hn::MulAdd(a1, m, c), a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c), a4 = hn::MulAdd(a4, m, c), a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c), a7 = hn::MulAdd(a7, m, c), a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c), a10 = hn::MulAdd(a10, m, c), a11 = hn::MulAdd(a11, m, c);
  }
  const V s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                      hn::Add(hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)), hn::Add(hn::Add(a8, a9), hn::Add(a10, a11))));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return 2.0 * 12.0 * double(hn::Lanes(d)) * double(iters);
}

// Elements of uint32 ReadStream reads per step (its n must be a multiple of this).
int64_t ReadStep() { return 4 * int64_t(hn::Lanes(hn::ScalableTag<uint32_t>())); }

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(ReadStream);
HWY_EXPORT(FmaChains);
HWY_EXPORT(ReadStep);

namespace {

using Clock = std::chrono::steady_clock;

// Runs body(thread index) on `threads` threads that start together; returns the wall seconds
// from the common start to the last one's end.
template <class Body>
double run_together(int threads, const Body& body) {
  std::barrier start(threads + 1);
  std::vector<Clock::time_point> ends(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  pool.reserve(size_t(threads));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
      ends[size_t(t)] = Clock::now();
    });
  const Clock::time_point t0 = Clock::now();
  start.arrive_and_wait();
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - t0).count();
}

}  // namespace

MachineBounds probe_machine(int threads, int64_t read_bytes, int reps) {
  if (threads < 1 || threads > 1024)
    throw std::invalid_argument("probe_machine: threads must be in [1, 1024], got " + std::to_string(threads));
  if (read_bytes < (int64_t{1} << 20) || read_bytes > (int64_t{64} << 30))
    throw std::invalid_argument("probe_machine: read_bytes must be in [1 MiB, 64 GiB], got " +
                                std::to_string(read_bytes));
  if (reps < 1 || reps > 100)
    throw std::invalid_argument("probe_machine: reps must be in [1, 100], got " + std::to_string(reps));
  // The buffer is written whole before it is read: past the machine's memory that would be a
  // kill by the kernel's OOM killer, not an exception, so refuse more than half of it.
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const int64_t phys = pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
  if (phys > 0 && read_bytes > phys / 2)
    throw std::invalid_argument("probe_machine: read_bytes " + std::to_string(read_bytes) +
                                " is more than half of this machine's memory (" + std::to_string(phys >> 20) + " MiB)");

  MachineBounds out;
  out.threads = threads;
  out.simd_target = simd_target_name();

  // Read bandwidth: each thread its own contiguous share (a whole number of steps), first
  // touched by that thread (so a NUMA machine places it near the reader), read reps times.
  const auto read = HWY_DYNAMIC_DISPATCH(ReadStream);
  const int64_t step = HWY_DYNAMIC_DISPATCH(ReadStep)();
  const int64_t per_thread = std::max<int64_t>(step, read_bytes / 4 / threads / step * step);  // uint32s
  const size_t total = size_t(per_thread) * size_t(threads) * sizeof(uint32_t);
  std::unique_ptr<uint32_t, decltype(&std::free)> buf(static_cast<uint32_t*>(std::aligned_alloc(64, total)),
                                                      &std::free);
  if (!buf) throw std::bad_alloc();
  run_together(threads, [&](int t) {
    std::memset(buf.get() + int64_t(t) * per_thread, t + 1, size_t(per_thread) * sizeof(uint32_t));
  });
  std::vector<uint32_t> sums(static_cast<size_t>(threads));
  double best = 1e30;
  for (int r = 0; r < reps; ++r)
    best = std::min(best, run_together(threads, [&](int t) {
                      sums[size_t(t)] = read(buf.get() + int64_t(t) * per_thread, per_thread);
                    }));
  out.read_gbps = double(total) / best / 1e9;

  // FMA rate: enough iterations for ~50 ms a thread at 100 GFLOP/s.
  const auto fma = HWY_DYNAMIC_DISPATCH(FmaChains);
  std::vector<float> sink(static_cast<size_t>(threads));
  const int64_t iters = int64_t(5e9) / (24 * 16);
  double flops = 0;
  best = 1e30;
  for (int r = 0; r < reps; ++r)
    best = std::min(best, run_together(threads, [&](int t) {
                      const double f = fma(iters, &sink[size_t(t)]);
                      if (t == 0) flops = f;
                    }));
  out.fma_gflops = flops * threads / best / 1e9;
  return out;
}

}  // namespace tinyloop::cpu
#endif
