// Prefix cache (docs/prefix-cache.md): prefill a prompt
// prefix once, then decode many continuations prefix + suffix off it.
//
// The cache is immutable after build and is never copied: each call's KvCache shares this
// cache's KV blocks (model/kv_pool.h, KvCache::share_prefix) and allocates blocks only for
// positions >= seq_len() (suffix + generated tokens); the prefix's partial last block is
// copied when the call first writes into it. So one cache serves many calls, from several
// threads at once, in every KV mode, and a call costs only the suffix's prefill plus
// decoding.
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

class PrefixCache {
 public:
  // Prefills `prefix` (non-empty) at `loops` (default the config's default_loops) with
  // generate()'s sliding window `cache_window` (0 = none): a window changes the prefix's K/V
  // once the prefix is longer than it, so a cache serves calls with its own window only.
  // std::invalid_argument for bad tokens / loops / window;
  // std::runtime_error when the prefix alone exceeds max_seq_len.
  static std::shared_ptr<const PrefixCache> build(std::shared_ptr<const Engine> engine, std::vector<int32_t> prefix,
                                                  std::optional<int64_t> loops, int64_t cache_window = 0);

  const Engine& engine() const { return *engine_; }
  const std::vector<int32_t>& prefix() const { return prefix_; }
  int64_t seq_len() const { return static_cast<int64_t>(prefix_.size()); }
  int64_t loops() const { return loops_; }
  int64_t cache_window() const { return window_; }
  int64_t bytes() const;  // KV + the prefix's last logits
  // The KV storage mode the prefix was built with (a pool matches on it).
  ops::KvDType kv_dtype() const { return kv_->dtype(); }

  // Returns exactly generate(prefix + suffix, ...) for req (its prompt is ignored; the
  // suffix may be empty). req.loops: none = loops(); another value throws std::runtime_error
  // "loops mismatch". std::invalid_argument "cache_window mismatch" when req.cache_window is
  // not cache_window(), and for whatever generate() rejects.
  GenerateResult generate(const std::vector<int32_t>& suffix, GenerateRequest req,
                          const TokenCallback& on_token = {}) const;

 private:
  PrefixCache() = default;
  std::shared_ptr<const Engine> engine_;  // keeps the model (and kv_'s tracker) alive
  std::vector<int32_t> prefix_;  // [P]
  int64_t loops_ = 0;
  int64_t window_ = 0;  // generate()'s cache_window the prefix was built with
  std::unique_ptr<model::KvCache> kv_;  // length P, window_; read-only after build
  std::vector<float> logits_;  // [V] after the prefix (for an empty suffix)
  model::TrackedBytes tracked_;  // logits_ in the model's memory report
};

}  // namespace tinyloop::runtime
