// How every matmul kernel (f32/f16/bf16/int8/int4, q8 activations, bf16 dot) splits its
// output features across the thread pool: chunks of weight rows, claimed one at a time.
// Which thread computes a row never changes its bits (kernels.h), so this is only speed.
#pragma once
#include <algorithm>
#include <cstdint>

#include "cpu/thread_pool.h"

namespace tinyloop::cpu::detail {

// Below this many multiply-adds a call runs as one task on the calling thread: waking the
// workers would cost more than the product.
constexpr int64_t kMinParallelMacs = 1 << 15;

// Weight rows per task when a call streams its weights once (decode: a few x rows): as long
// a run as load balance allows, since each task is one sequential stream that the kernels
// prefetch ahead and a task boundary is where the next task's first bytes go cold (often
// on the other thread). At least 4 tasks a thread where N has the rows (a shared machine's
// threads run at uneven speeds), between 32 and 128 rows, a multiple of 32. EPYC Zen 5, 2
// threads, the benchmark model's F16 loop block re-read (`TINYLOOP_BENCH_LOOP_BLOCK=1
// cpu_kernels_bench`, 2026-12-03): 32-row tasks 82-83 GB/s, 64 rows 91-93, 128 rows 93-95.
constexpr int64_t kStreamRowsMin = 32, kStreamRowsMax = 128;
inline int64_t stream_task_rows(int64_t N) {
  const int64_t per_task = N / (4 * int64_t(num_threads()));
  return std::clamp<int64_t>(per_task / kStreamRowsMin * kStreamRowsMin, kStreamRowsMin, kStreamRowsMax);
}

// Calls fn(n0, n1) for the output rows [0, N) of a T x K x N product in chunks of `rows`
// (the last one shorter), on the pool, or once with [0, N) when the product is small.
template <class Fn>
void for_row_chunks(int64_t T, int64_t N, int64_t K, int64_t rows, const Fn& fn) {
  const int64_t n_tasks = T * N * K < kMinParallelMacs ? 1 : (N + rows - 1) / rows;
  if (n_tasks == 1) return fn(int64_t{0}, N);
  parallel_for(n_tasks, [&](int64_t i) { fn(i * rows, std::min(N, (i + 1) * rows)); });
}

}  // namespace tinyloop::cpu::detail
