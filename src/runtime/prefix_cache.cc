#include "runtime/prefix_cache.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "model/kv_pool.h"

namespace tinyloop::runtime {

std::shared_ptr<const PrefixCache> PrefixCache::build(std::shared_ptr<const Engine> engine, std::vector<int32_t> prefix,
                                                      std::optional<int64_t> loops, int64_t cache_window) {
  const Engine& e = *engine;
  e.check_tokens(prefix);  // also rejects an empty prefix
  const int64_t L = e.resolve_loops(loops);
  if (cache_window < 0) throw std::invalid_argument("cache_window must be >= 0, got " + std::to_string(cache_window));
  const auto P = static_cast<int64_t>(prefix.size());
  e.check_length(P, 0);

  auto pc = std::shared_ptr<PrefixCache>(new PrefixCache());
  // Exactly generate()'s prefill of these positions: the model is batch-invariant, so the
  // rows are the same whatever suffix a later call appends, in every KV mode. With a window
  // the blocks no later query can see are released as in generate().
  // A long prefix gets generate()'s long blocks (model::private_block_rows); every call's
  // cache shares them, so it copies at most one partly written block a slot.
  pc->kv_ = std::make_unique<model::KvCache>(e.config(), L, P, cache_window, e.kv_dtype(), &e.model().memory(), 0, 0,
                                             nullptr, 0, model::private_block_rows(P, cache_window));
  pc->window_ = cache_window;
  e.model().forward(prefix.data(), P, *pc->kv_, model::LogitRows::Last, pc->logits_, L);
  pc->tracked_ = model::TrackedBytes(&e.model().memory(), int64_t(pc->logits_.size()) * int64_t(sizeof(float)));
  pc->engine_ = std::move(engine);
  pc->prefix_ = std::move(prefix);
  pc->loops_ = L;
  return pc;
}

int64_t PrefixCache::bytes() const { return kv_->bytes() + int64_t(logits_.size()) * int64_t(sizeof(float)); }

GenerateResult PrefixCache::generate(const std::vector<int32_t>& suffix, GenerateRequest req,
                                     const TokenCallback& on_token) const {
  const Engine& e = *engine_;
  const int64_t L = req.loops.value_or(loops_);
  if (L != loops_)
    throw std::runtime_error("loops mismatch: the prefix cache was built at loops=" + std::to_string(loops_) +
                             ", generate_from_prefix_cache asked for " + std::to_string(L));
  req.loops = L;
  if (req.cache_window != window_)
    throw std::invalid_argument("cache_window mismatch: the prefix cache was built with cache_window=" +
                                std::to_string(window_) + ", the call asked for " + std::to_string(req.cache_window) +
                                " (a window changes the prefix's K/V; build the cache with the call's window)");
  if (!suffix.empty()) e.check_tokens(suffix, "suffix");  // empty: decode right after the prefix
  req.prompt = prefix_;
  req.prompt.insert(req.prompt.end(), suffix.begin(), suffix.end());
  validate(e, req);
  if (req.init_scale != kv_->state_draw().scale)
    throw std::invalid_argument(
        "init_scale cannot change the initial state of a prefix cache's positions (they were "
        "computed when the cache was built); leave it at 1");

  const auto t0 = std::chrono::steady_clock::now();
  const auto S = static_cast<int64_t>(suffix.size());
  // The call's cache: the prefix's blocks shared, its own blocks for the suffix and every
  // token decoding may add (positions P ..), the prefix's block size so blocks can be shared.
  auto tail =
      std::make_unique<model::KvCache>(e.config(), L, seq_len() + std::max<int64_t>(1, S + req.max_tokens), window_,
                                       e.kv_dtype(), &e.model().memory(), 0, 0, nullptr, seq_len(), kv_->block_rows());
  tail->share_prefix(*kv_);
  std::vector<float> logits = logits_;  // [V]
  if (S > 0) e.model().forward(suffix.data(), S, *tail, model::LogitRows::Last, logits, L);
  const double prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return generate_after_prefill(e, req, L, std::move(tail), std::move(logits), t0, prefill_ms, on_token);
}

}  // namespace tinyloop::runtime
