// Continuous batching (docs/serving.md "Scheduling"; vLLM's scheduler, MLC-LLM's engine actions):
// which sequences feed which rows into the next step, under a token budget and the KV pool.
//
// Each step, in arrival order (first come, first served):
//   1. running sequences: a decode row each (one token, early exit allowed), or the next
//      chunk of their prompt (chunked prefill, at most prefill_chunk rows), or, after a
//      preemption, the replay of what they had generated;
//   2. waiting sequences join while there is room: max_num_seqs running, max_batch_tokens
//      rows, and KV blocks for their first chunk.
// A running sequence that needs blocks the pool does not have takes them from the latest
// arrival still running, which is preempted: its blocks are dropped and it waits again, to
// be recomputed from its tokens (prompt + what it emitted) when there is room. Recompute
// reproduces its K/V exactly (the same depth per row, the latest rule for rows that exited
// early, the RNG untouched), so preemption never changes a request's output.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "model/kv_pool.h"
#include "runtime/engine.h"
#include "runtime/prefix_index.h"
#include "runtime/sequence.h"

namespace tinyloop::runtime {

struct SchedulerOptions {
  int64_t max_num_seqs = 64;  // sequences running at once
  int64_t max_batch_tokens = 512;  // rows per step (decode rows + prompt chunk rows)
  int64_t prefill_chunk = 256;  // prompt rows one sequence feeds per step
  bool prefix_caching = true;  // share cached prompt blocks (prefix_index.h)
};

// One sequence's rows in the next step.
struct PlannedPart {
  Sequence* seq = nullptr;
  int64_t n = 0;  // tokens seq->tokens[computed .. computed + n)
  int64_t loops = 0;  // iterations for these rows
  bool early_exit = false;  // a decode row with the request's early exit
  bool gate_exit = false;  // rows whose last one's logits follow the request's exit gate
  bool decode_row = false;  // the last emitted token (its gate may stop its loop)
  bool want_logits = false;  // the last row's logits choose the next token
};

// Why a sequence leaves without finishing normally (cancel, deadline) at planning time.
struct Dropped {
  Sequence* seq;
  FinishReason reason;
};

class Scheduler {
 public:
  Scheduler(const Engine& e, model::KvPoolPtr pool, SchedulerOptions opts);

  // A new request, waiting until it is admitted.
  void add(std::unique_ptr<Sequence> s);
  // Plans the next step. Sequences that were cancelled or ran past their deadline come
  // back in `dropped` (still owned here: the caller finishes them, then remove()s them).
  std::vector<PlannedPart> plan(SteadyClock::time_point now, std::vector<Dropped>& dropped);
  // Forgets a sequence (finished); its KV blocks go back to the pool.
  void remove(Sequence* s);
  // s's cache now holds its whole prompt: index its blocks for later requests.
  void prompt_done(const Sequence& s);
  PrefixIndex& prefix_index() { return index_; }
  const PrefixIndex& prefix_index() const { return index_; }

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t preemptions() const { return preemptions_; }
  // Every live sequence (running first), e.g. to fail them all at shutdown.
  std::vector<Sequence*> all() const;

  // Blocks a request of this shape needs at most (its whole capacity in every slot):
  // requests above the pool's size can never run and are refused at submit.
  int64_t max_blocks(const GenerateRequest& r, int64_t loops) const;
  const SchedulerOptions& options() const { return opts_; }

 private:
  // The rows `s` feeds next within `budget` rows (n == 0: none this step).
  PlannedPart next_part(Sequence& s, int64_t budget, bool first) const;
  // Makes sure s has a cache (from the pool), sharing cached prompt blocks when it is empty.
  void ensure_cache(Sequence& s);
  // Frees blocks until n can be allocated: cached prefix blocks first. False when the
  // cache has nothing more to give.
  bool make_room(int64_t n);
  // Drops the blocks of the latest-arrived running sequence other than the planned ones
  // and moves it back to waiting. Returns it (null when there is none to take).
  Sequence* preempt_latest(const std::vector<PlannedPart>& planned, const Sequence* except);

  const Engine& e_;
  model::KvPoolPtr pool_;
  SchedulerOptions opts_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in arrival order
  std::deque<std::unique_ptr<Sequence>> waiting_;  // in arrival order
  PrefixIndex index_;
  int64_t preemptions_ = 0;
};

}  // namespace tinyloop::runtime
