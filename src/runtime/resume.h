// Warm-start resume (docs/loop-depth.md, section 3): run a
// prompt to L1 iterations once, keep everything a deeper run needs, and later decode at any
// L2 in [L1, max_loops] by running only iterations L1 .. L2-1 on the prompt positions.
//
// The handle keeps the prompt's KV cache (pre slots and loop slots 0 .. L1-1 filled; slots
// exist for max_loops iterations so deeper resumes have room), the prelude output x and the
// loop state after L1 iterations. It is immutable after build: every resume clones the
// cache, so one handle serves many resumes, from several threads at once. A resume at L2
// performs exactly the operations of generate(prompt, loops=L2), so its tokens are the same
// (greedy and seeded sampling).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/kv_cache.h"
#include "model/memory_tracker.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace tinyloop::runtime {

class ResumeHandle {
 public:
  // loops (L1): default the config's default_loops. max_loops: default max(2 * L1,
  // default_loops); must be >= L1. max_tokens: the most tokens a resume may generate (sizes
  // the cache: prompt + max_tokens rows). Validates like generate (std::invalid_argument
  // naming the argument; std::runtime_error when prompt + max_tokens > max_seq_len).
  static std::shared_ptr<const ResumeHandle> build(std::shared_ptr<const Engine> engine, std::vector<int32_t> prompt,
                                                   std::optional<int64_t> loops, std::optional<int64_t> max_loops,
                                                   int64_t max_tokens);

  const Engine& engine() const { return *engine_; }
  const std::vector<int32_t>& prompt() const { return prompt_; }
  int64_t seq_len() const { return static_cast<int64_t>(prompt_.size()); }
  int64_t loops_used() const { return loops_used_; }
  int64_t max_loops() const { return max_loops_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t bytes() const;  // cache + saved states

  // Decodes req (its prompt is ignored: the handle's is used) at L2 = req.loops (default
  // loops_used()). Throws std::invalid_argument naming "loops" unless L1 <= L2 <= max_loops,
  // "max_tokens" above the handle's max_tokens, "cache_window" unless 0 (the handle's cache
  // is not a ring), and whatever generate() rejects.
  GenerateResult resume(GenerateRequest req, const TokenCallback& on_token = {}) const;

 private:
  ResumeHandle() = default;
  std::shared_ptr<const Engine> engine_;  // keeps the model (and the cache's tracker) alive
  std::vector<int32_t> prompt_;  // [T]
  int64_t loops_used_ = 0, max_loops_ = 0, max_tokens_ = 0;
  std::unique_ptr<model::KvCache> kv_;  // slots for max_loops; prompt rows, length() == 0
  std::vector<float> x_;  // [T, D] prelude output
  std::vector<float> s_;  // [T, D] loop state after loops_used_ iterations
  model::TrackedBytes tracked_;  // x_ + s_ in the model's memory report
};

}  // namespace tinyloop::runtime
