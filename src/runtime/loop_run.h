// A forward of T new tokens that can stop between loop iterations (docs/loop-depth.md).
//
// Early exit, depth-wise scoring and warm-start resume all rest on one fact: the loop state
// after iteration i is a valid input to iteration i + 1, and logits can be read out of any
// iteration. LoopRun is the one place that drives LoopedModel's four steps (prelude ->
// initial_state -> iteration* -> readout) with that freedom, so none of those features
// re-implements the forward. Driven straight through (run_to(L), read_out) it performs
// exactly the operations of LoopedModel::forward on one chunk, so its logits are
// bit-identical to forward's.
#pragma once
#include <cstdint>
#include <vector>

#include "model/kv_cache.h"
#include "model/layer.h"
#include "model/looped_model.h"
#include "model/memory_tracker.h"

namespace tinyloop::runtime {

class LoopRun {
 public:
  // Prelude + initial state of tokens[T] at positions kv.length() .. kv.length() + T - 1
  // (writes their pre slots). trace, when given: [1 + n_pre_blocks, T, D], see
  // LoopedModel::prelude. Throws std::logic_error when the T rows do not fit one step on kv
  // (LoopedModel::max_step; callers give windowed caches at most KvCache::kWindowSlack).
  LoopRun(const model::LoopedModel& m, model::KvCache& kv, const int32_t* tokens, int64_t T, float* trace = nullptr);
  // Continues a run saved earlier (warm-start resume): prelude output x[T, D] and the state
  // s[T, D] after `done` iterations, for positions start .. start + T - 1 of kv; tokens [T]
  // (the rows' ids) are needed when the model has value embeddings.
  LoopRun(const model::LoopedModel& m, model::KvCache& kv, int64_t start, std::vector<float> x, std::vector<float> s,
          int64_t done, const int32_t* tokens = nullptr);

  int64_t rows() const { return T_; }
  int64_t done() const { return done_; }  // iterations applied so far
  const std::vector<int64_t>& positions() const { return pos_; }  // [T]
  const std::vector<float>& input() const { return x_; }  // [T, D] prelude output x
  const std::vector<float>& state() const { return s_; }  // [T, D] state after done()

  // Applies iteration done() to every row (writing that iteration's slots).
  void step();
  // Steps until done() == loops (no-op when already there). Needs loops <= kv.loops().
  void run_to(int64_t loops);
  // logits[rows, V] (rows = 1 for Last, T for All) the model would emit from the current
  // state. Writes the post slots of these positions; the state itself is kept, so the run
  // can go deeper afterwards and a later read_out rewrites those post rows.
  void read_out(model::LogitRows rows, float* logits);
  // Keeps only the first n rows (positions): they never attend to the later ones, so they
  // can go deeper alone (score_with_consistency escalates a prefix).
  void keep_rows(int64_t n);
  // Marks the T positions as written in kv (call once, after the last read_out).
  void commit() { kv_.advance(T_); }

 private:
  void reserve();
  const int32_t* row_tokens() const { return tokens_.empty() ? nullptr : tokens_.data(); }
  const model::LoopedModel& m_;
  model::KvCache& kv_;
  int64_t T_, done_ = 0;
  std::vector<int64_t> pos_;  // [T] absolute positions
  std::vector<int32_t> tokens_;  // [T] the rows' ids (value embeddings); empty when resumed from a saved state
  std::vector<float> x_;  // [T, D] prelude output (the inject input)
  std::vector<float> s_;  // [T, D] loop state after done_ iterations
  std::vector<float> scratch_;  // [T, D] copy of s_ that readout may clobber
  model::Workspace ws_;
  model::TrackedBytes tracked_;  // ws_ + x_ + s_ + scratch_ in the model's memory report
};

}  // namespace tinyloop::runtime
