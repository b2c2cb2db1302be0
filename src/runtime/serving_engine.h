// The serving engine: many requests, one decode loop (docs/serving.md).
//
// Requests are submitted from any thread and run on the engine's own thread, which repeats
//   schedule (scheduler.h) -> one forward over every scheduled row (run_step) ->
//   per sequence: penalties, grammar, sampling, stop checks (SequenceDecoder) -> emit
// until no request is left, then sleeps. KV lives in one paged pool sized at start from a
// memory budget; a request's depth, early exit, window, slot groups, grammar and sampling
// are its own, and its tokens are exactly what Model.generate gives for the same request
// (greedy and seeded sampling): batching never changes an output.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "model/kv_pool.h"
#include "runtime/batch_step.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"

namespace tinyloop::runtime {

struct ServingOptions {
  double kv_budget_mb = 1024;  // the KV pool, allocated (and made resident) at start
  int64_t kv_block_size = model::kDefaultBlockRows;  // positions per KV block
  int64_t max_num_seqs = 64;  // sequences running at once
  int64_t max_batch_tokens = 512;  // rows per step
  int64_t prefill_chunk = 256;  // prompt rows one sequence feeds per step
  int64_t max_queue = 4096;  // waiting requests; more are refused (QueueFull)
  bool prefix_caching = true;  // keep prompt blocks for later requests (prefix_index.h)
};

// submit() when max_queue requests already wait, or after shutdown began.
class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A snapshot of the engine's counters (metrics, tests, benchmarks).
struct ServingStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0, kv_block_bytes = 0;
  int64_t requests_submitted = 0, requests_finished = 0, requests_cancelled = 0;
  int64_t requests_failed = 0, requests_timed_out = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  int64_t steps = 0, step_rows = 0;  // forward steps run, rows over all of them
  int64_t loops_run = 0;  // loop iterations behind the generated tokens
  int64_t preemptions = 0;
  // Automatic prefix caching: lookups, requests that shared blocks, prompt tokens not
  // recomputed, cached block positions (one block per slot each) and pool blocks they hold.
  int64_t prefix_queries = 0, prefix_hits = 0, prefix_hit_tokens = 0;
  int64_t prefix_cached_positions = 0, kv_blocks_cached = 0;
  double mean_batch_rows() const { return steps ? double(step_rows) / double(steps) : 0.0; }
  double mean_loops() const { return generated_tokens ? double(loops_run) / double(generated_tokens) : 0.0; }
};

class ServingEngine {
 public:
  // Starts the engine thread. std::invalid_argument for options out of range.
  ServingEngine(std::shared_ptr<const Engine> engine, const ServingOptions& opts);
  // Cancels whatever is left (each sink gets on_finish with Cancelled) and joins the thread.
  ~ServingEngine();
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  // Validates the request as generate() does (std::invalid_argument naming the argument,
  // std::runtime_error past max_seq_len), also against the KV budget (std::invalid_argument
  // when it could never fit the pool), then queues it. timeout_s > 0: finished with Timeout
  // when still running that long after submit. QueueFull when the queue is full or the
  // engine is shutting down. Returns the request id.
  uint64_t submit(GenerateRequest req, std::shared_ptr<RequestSink> sink, double timeout_s = 0);
  // Cancels a request (no-op when it already finished): it leaves at the next step
  // boundary, its blocks go back to the pool and its sink gets on_finish(Cancelled).
  void cancel(uint64_t id);
  // Stops taking requests (QueueFull); with drain the ones in flight finish, otherwise they
  // are cancelled. Blocks until the engine thread is done.
  void shutdown(bool drain);

  ServingStats stats() const;
  // Drops every cached prefix block (they go back to the pool at the next step).
  void clear_prefix_cache();
  const Engine& engine() const { return *engine_; }
  const ServingOptions& options() const { return opts_; }

 private:
  void loop();
  void step();
  // Copies the prefix cache's counters into stats_ (mu_ held).
  void publish_cache_stats();
  // Reports s finished (sink, counters) and forgets it.
  void finish(Sequence* s, FinishReason reason, const std::string& error = {});

  std::shared_ptr<const Engine> engine_;
  ServingOptions opts_;
  model::KvPoolPtr pool_;
  Scheduler scheduler_;  // engine thread only
  StepScratch scratch_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;  // submitted, not yet scheduled
  std::unordered_map<uint64_t, Sequence*> live_;  // every unfinished request
  uint64_t next_id_ = 1;
  bool accepting_ = true, stop_ = false, drain_ = false, clear_cache_ = false;
  ServingStats stats_;  // counters, under mu_
  std::thread thread_;
};

}  // namespace tinyloop::runtime
