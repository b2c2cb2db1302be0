// The process-wide worker pool. See thread_pool.h for the policy; here is how it works.
//
// One job at a time is published through `state_`, a 64-bit word: the job's epoch in the
// high half, the next unclaimed task index in the low half. A thread claims a task with a
// compare-exchange that succeeds only if the epoch is still the one it read the job's
// fields (call_, ctx_, n_) under, so a worker that wakes late can never run a task of a
// finished job with a newer job's function, or the reverse. After the last task completes
// the caller "closes" the epoch (index = kClosed) before it writes the next job's fields.
#include "cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace tinyloop::cpu {
namespace {

constexpr uint64_t kClosed = 0xffffffffu;  // low half of state_: no tasks left to claim
// How long an idle worker spins before it sleeps: longer than the gaps between the jobs of
// a decode step (a norm, RoPE, a KV write: microseconds), short enough that a worker does
// not burn the CPU while its caller is descheduled or busy elsewhere. Measured on a loaded
// 2-vCPU machine (other jobs running): 1 ms of spinning made 2-thread decode 1.5-2x slower
// than 50 us, because the spinning came out of the process's own share of the CPUs.
constexpr auto kSpin = std::chrono::microseconds(50);
// How long a caller spins for the other threads' last tasks before it sleeps.
constexpr auto kCallerSpin = std::chrono::microseconds(50);

// Set while a thread runs tasks of a job, so a nested parallel_for runs inline.
thread_local bool tls_in_job = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The hardware concurrency (TINYLOOP_NUM_THREADS is applied above, by ops/backend.cc).
int default_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? int(hw) : 1;
}

}  // namespace

class ThreadPool {
 public:
  explicit ThreadPool(int n) { start(n); }

  int size() const { return size_.load(std::memory_order_relaxed); }

  void resize(int n) {
    if (n < 1) n = default_threads();
    lock_busy();
    stop();
    start(n);
    busy_.store(false, std::memory_order_release);
  }

  void run(int64_t n_tasks, detail::TaskFn call, const void* ctx) {
    bool expected = false;
    // (Task indices live in 32 bits of state_; no kernel comes near 4 billion tasks.)
    if (tls_in_job || n_tasks >= int64_t(kClosed) ||
        !busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      // Busy (another caller, or nested): run everything on this thread.
      for (int64_t i = 0; i < n_tasks; ++i) call(ctx, i);
      return;
    }
    if (workers_.empty()) {  // a pool of one thread (read only while holding busy_)
      for (int64_t i = 0; i < n_tasks; ++i) call(ctx, i);
      busy_.store(false, std::memory_order_release);
      return;
    }
    call_.store(call, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(uint64_t(n_tasks), std::memory_order_relaxed);
    completed_.store(0, std::memory_order_relaxed);
    const uint64_t e = (state_.load(std::memory_order_relaxed) >> 32) + 1;
    state_.store(e << 32, std::memory_order_seq_cst);  // publishes the fields above
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      // Taking the mutex orders this notify after a sleeper's predicate check.
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    }
    tls_in_job = true;
    work(e);
    tls_in_job = false;
    wait_completed(uint32_t(n_tasks));
    state_.store((e << 32) | kClosed, std::memory_order_release);
    busy_.store(false, std::memory_order_release);
  }

 private:
  // Waits until n tasks have completed: the tasks other threads claimed are still running.
  // Spins briefly (they usually end within microseconds), then sleeps on the counter: on a
  // loaded machine the thread holding the last task may have been descheduled, and a
  // spinning (or sched_yield-ing) caller would only burn the time slice that thread needs.
  void wait_completed(uint32_t n) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int spins = 1;; ++spins) {
      uint32_t c = completed_.load(std::memory_order_acquire);
      if (c >= n) return;
      if ((spins & 63) != 0 || std::chrono::steady_clock::now() - t0 < kCallerSpin) {
        cpu_relax();
        continue;
      }
      // Dekker with finish_task(): either we see its count, or it sees us waiting.
      caller_waiting_.store(true, std::memory_order_seq_cst);
      c = completed_.load(std::memory_order_seq_cst);
      if (c < n) completed_.wait(c, std::memory_order_acquire);  // futex: no lost wakeup
      caller_waiting_.store(false, std::memory_order_relaxed);
    }
  }

  void finish_task() {
    completed_.fetch_add(1, std::memory_order_seq_cst);
    if (caller_waiting_.load(std::memory_order_seq_cst)) completed_.notify_all();
  }

  void lock_busy() {
    bool expected = false;
    while (!busy_.compare_exchange_weak(expected, true, std::memory_order_acquire)) {
      expected = false;
      std::this_thread::yield();
    }
  }

  void start(int n) {
    stop_.store(false, std::memory_order_relaxed);
    size_.store(n, std::memory_order_relaxed);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true, std::memory_order_seq_cst);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  // Claims and runs tasks of epoch e until none is left (or the epoch has moved on).
  void work(uint64_t e) {
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      if ((s >> 32) != e) return;
      // Read under epoch e; if they are already a later job's, the exchange below fails.
      const detail::TaskFn call = call_.load(std::memory_order_relaxed);
      const void* ctx = ctx_.load(std::memory_order_relaxed);
      const uint64_t n = n_.load(std::memory_order_relaxed);
      const uint64_t idx = s & kClosed;
      if (idx >= n) return;  // kClosed is above any n
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
      call(ctx, int64_t(idx));
      finish_task();
    }
  }

  void worker_loop() {
    uint64_t seen = state_.load(std::memory_order_acquire) >> 32;
    auto idle_since = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      if (stop_.load(std::memory_order_acquire)) return;
      const uint64_t s = state_.load(std::memory_order_acquire);
      if ((s >> 32) != seen) {
        seen = s >> 32;
        tls_in_job = true;
        work(seen);
        tls_in_job = false;
        idle_since = std::chrono::steady_clock::now();
        spins = 0;
        continue;
      }
      if ((spins & 63) != 63) {
        cpu_relax();
        continue;
      }
      if (std::chrono::steady_clock::now() - idle_since < kSpin) continue;
      // Sleep until a new epoch is published (or the pool stops).
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      cv_.wait(lk, [&] {
        return stop_.load(std::memory_order_seq_cst) || (state_.load(std::memory_order_seq_cst) >> 32) != seen;
      });
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      idle_since = std::chrono::steady_clock::now();
    }
  }

  std::vector<std::thread> workers_;
  std::atomic<int> size_{1};
  std::atomic<bool> busy_{false};  // a job is in flight (or the pool is being resized)
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> state_{uint64_t(kClosed)};  // [epoch:32 | next task:32]
  std::atomic<detail::TaskFn> call_{nullptr};
  std::atomic<const void*> ctx_{nullptr};
  std::atomic<uint64_t> n_{0};
  std::atomic<uint32_t> completed_{0};  // tasks of the current job finished
  std::atomic<bool> caller_waiting_{false};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

ThreadPool& global_pool() {
  // Never destroyed: workers may still be parked when static destructors run at exit, and
  // another static's destructor might still call a kernel. The pointer keeps it reachable.
  static ThreadPool* pool = new ThreadPool(default_threads());
  return *pool;
}

int num_threads() { return global_pool().size(); }
void set_num_threads(int n) { global_pool().resize(n); }

namespace detail {
void run_on_pool(int64_t n_tasks, TaskFn call, const void* ctx) { global_pool().run(n_tasks, call, ctx); }
}  // namespace detail

}  // namespace tinyloop::cpu
