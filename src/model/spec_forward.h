// The looped forward split at the draft depth, for self-speculative decoding
// (docs/speculative.md). A draft at d loops and the verifier at L loops are one forward cut
// in two: draft_prefix() runs prelude + iterations 0..d-1 (shared by both), the draft reads
// logits out of that state (readout with draft = true, post-block K/V in the cache's extra
// slots), and verify_rest() continues the same state through iterations d..L-1 before the
// verifier's readout. Rows may be linear positions or draft-tree nodes (router().set_rows).
// Every call leaves kv.length() alone; the caller advances / truncates after acceptance.
#pragma once
#include <cstdint>
#include <vector>

#include "model/looped_model.h"
#include "model/spec_attention.h"

namespace tinyloop::model {

class SpecForward {
 public:
  // kv: slots for verify_loops iterations plus n_post_blocks extra slots (draft readout).
  // branches x depth: the largest draft tree (0 x 0 for chains).
  SpecForward(const LoopedModel& m, KvCache& kv, int64_t draft_loops, int64_t verify_loops, int64_t branches,
              int64_t depth);

  KvCache& kv() { return kv_; }
  SpecAttention& router() { return router_; }

  // Append tokens[n] at kv.length().. with every slot filled (verify and draft post
  // slots), in the chunks LoopedModel::max_chunk allows; advances kv. No logits.
  void prefill(const int32_t* tokens, int64_t n);
  // x, s [T, D] of rows tokens[T] at pos[T]: prelude, initial state, iterations 0..d-1.
  void draft_prefix(const int32_t* tokens, const int64_t* pos, int64_t T, float* x, float* s);
  // s [T, D] <- iterations d..L-1 (x [T, D] the rows' loop inputs).
  void verify_rest(float* s, const float* x, const int64_t* pos, int64_t T);
  // logits [1 or T, V] of the loop state s [T, D] (clobbered), the draft's (post-block K/V
  // to the extra slots) or the verifier's.
  void readout(float* s, const int64_t* pos, int64_t T, bool draft, LogitRows rows, std::vector<float>& logits);

 private:
  void reserve(int64_t T);

  const LoopedModel& m_;
  KvCache& kv_;
  int64_t d_, L_;
  SpecAttention router_;
  Workspace ws_;
  TrackedBytes tracked_;  // scratch + workspace
};

}  // namespace tinyloop::model
