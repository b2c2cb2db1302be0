// One process-wide pool of worker threads for the SIMD kernels (matmul splits output
// features, attention splits (query row, kv head) pairs across it).
//
// Size: env TINYLOOP_NUM_THREADS when set to a positive integer, else the hardware
// concurrency; set_num_threads() changes it at run time (tinyloop_py.set_num_threads).
// The calling thread is one of the threads: a pool of n runs n - 1 workers.
//
// Concurrency policy (several Python threads calling the engine at once): the pool runs one
// job at a time. A run() that finds the pool busy - another caller's job is in flight, or
// it is called from inside a job - does not queue and does not start threads: it runs all of
// its tasks inline on its own thread. So k concurrent callers use at most
// num_threads + k - 1 threads (the k callers exist anyway), never k * num_threads, and
// nobody waits for another caller's job to finish. Results do not depend on which case
// happened: every kernel computes each output element with the same code whichever thread
// runs the task that holds it (see matmul.cc), so the engine stays deterministic.
//
// Workers spin for a short while (50 us) after a job, since decode issues ~200 small jobs
// per token and waking a sleeping thread costs tens of microseconds; then they sleep on a
// condition variable, so an idle or oversubscribed process does not burn CPU. A caller that
// finishes its share first spins as briefly for the others' last tasks, then sleeps on a
// futex. Kernel tasks must not throw.
#pragma once
#include <cstdint>

namespace tinyloop::cpu {

class ThreadPool;

// The process-wide pool (created on first use).
ThreadPool& global_pool();

// Threads the global pool uses (the caller included), >= 1.
int num_threads();
// Resize the global pool; n < 1 means the hardware concurrency (ops/backend.h applies the
// TINYLOOP_NUM_THREADS default). Waits for a job in flight to finish first.
void set_num_threads(int n);

// Runs fn(task) for every task in [0, n_tasks) on the global pool (see the policy above);
// returns when all have finished. fn must be safe to call concurrently for different tasks.
// Tasks are claimed dynamically one at a time, so a thread descheduled by a busy machine
// delays only the task it holds.
template <class Fn>
void parallel_for(int64_t n_tasks, const Fn& fn);

// --- implementation --------------------------------------------------------------------

namespace detail {
// Type-erased task function: call(ctx, task).
using TaskFn = void (*)(const void* ctx, int64_t task);
void run_on_pool(int64_t n_tasks, TaskFn call, const void* ctx);
}  // namespace detail

template <class Fn>
void parallel_for(int64_t n_tasks, const Fn& fn) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1) {  // nothing to share: skip the pool's atomics
    fn(int64_t{0});
    return;
  }
  detail::run_on_pool(
      n_tasks, [](const void* ctx, int64_t task) { (*static_cast<const Fn*>(ctx))(task); }, &fn);
}

}  // namespace tinyloop::cpu
