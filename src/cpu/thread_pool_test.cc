// The pool: every task runs exactly once, nested and concurrent callers complete (inline
// when the pool is busy), resizing works and n < 1 means the hardware concurrency
// (TINYLOOP_NUM_THREADS is the ops backend's default: ops/backend_test.cc).
#include "cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

namespace tinyloop::cpu {
namespace {

TEST(ThreadPool, EveryTaskExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    ASSERT_EQ(num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 17, 1000, 70000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
    }
  }
  set_num_threads(0);
}

TEST(ThreadPool, NestedCallsRunInline) {
  set_num_threads(3);
  std::atomic<int64_t> sum{0};
  parallel_for(8, [&](int64_t i) { parallel_for(5, [&](int64_t j) { sum.fetch_add(i * 10 + j); }); });
  int64_t want = 0;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 5; ++j) want += i * 10 + j;
  EXPECT_EQ(sum.load(), want);
  set_num_threads(0);
}

TEST(ThreadPool, ConcurrentCallersAllComplete) {
  // Several threads issue many jobs at once: one gets the pool at a time, the others run
  // inline. Every job must see all of its tasks done when parallel_for returns.
  set_num_threads(2);
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int job = 0; job < 300; ++job) {
        const int64_t n = 1 + (job * 7 + c) % 40;
        std::vector<int> hits(static_cast<size_t>(n), 0);  // distinct tasks: no race
        parallel_for(n, [&](int64_t i) { hits[size_t(i)] += 1; });
        for (int h : hits) bad += h != 1;
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
  set_num_threads(0);
}

TEST(ThreadPool, BelowOneMeansTheHardwareConcurrency) {
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(0);
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(num_threads(), hw > 0 ? int(hw) : 1);
}

}  // namespace
}  // namespace tinyloop::cpu
