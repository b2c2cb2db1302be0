#include "runtime/generate.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void validate(const Engine& e, const GenerateRequest& r) {
  e.check_tokens(r.prompt);
  if (r.max_tokens < 1)
    throw std::invalid_argument("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  e.resolve_loops(r.loops);
  validate(r.sampling);
  if (r.cache_window < 0)
    throw std::invalid_argument("cache_window must be >= 0, got " + std::to_string(r.cache_window));
  e.check_length(static_cast<int64_t>(r.prompt.size()), r.max_tokens);
}

// The distinct ids seen so far (prompt + output), for the repetition penalty.
class SeenSet {
 public:
  explicit SeenSet(int64_t V) : mark_(V, 0) {}
  void add(int32_t id) {
    if (!mark_[id]) {
      mark_[id] = 1;
      ids_.push_back(id);
    }
  }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::vector<uint8_t> mark_;
  std::vector<int32_t> ids_;
};

// Produces next-token logits for the growing sequence, cached or uncached.
class LogitSource {
 public:
  LogitSource(const Engine& e, int64_t loops, int64_t total_len, int64_t window)
      : e_(e), loops_(loops), window_(window) {
    if (!e.kv_cache_disabled()) kv_ = e.new_cache(loops, total_len, window, e.kv_dtype());
  }
  // logits[V] after `ids`, of which the last `n_new` are not yet in the cache.
  void next(const std::vector<int32_t>& ids, int64_t n_new, std::vector<float>& logits) {
    const int64_t T = static_cast<int64_t>(ids.size());
    if (kv_) {
      e_.model().forward(ids.data() + T - n_new, n_new, *kv_, model::LogitRows::Last, logits);
      return;
    }
    model::KvCache kv(e_.config(), loops_, T, window_, e_.kv_dtype(), &e_.model().memory());
    e_.model().forward(ids.data(), T, kv, model::LogitRows::Last, logits);
  }

 private:
  const Engine& e_;
  int64_t loops_, window_;
  std::unique_ptr<model::KvCache> kv_;
};

bool is_eos(const ModelConfig& c, int32_t id) {
  for (int64_t e : c.eos_ids)
    if (e == id) return true;
  return false;
}

}  // namespace

GenerateResult generate(const Engine& engine, const GenerateRequest& req,
                        const TokenCallback& on_token) {
  validate(engine, req);
  const ModelConfig& c = engine.config();
  const StopMatcher stops(req.stop_sequences, c.vocab_size);
  const int64_t loops = engine.resolve_loops(req.loops);
  Rng rng = req.seed ? Rng(*req.seed) : Rng::from_entropy();

  GenerateResult res;
  const auto t0 = Clock::now();
  Clock::time_point first_done;
  res.tokens = req.prompt;
  std::vector<int32_t> emitted;
  SeenSet seen(c.vocab_size);
  for (int32_t id : req.prompt) seen.add(id);

  LogitSource source(engine, loops, static_cast<int64_t>(req.prompt.size()) + req.max_tokens,
                     req.cache_window);
  std::vector<float> logits;
  source.next(res.tokens, static_cast<int64_t>(res.tokens.size()), logits);
  res.prefill_ms = ms_since(t0);

  while (true) {
    const int32_t tok = sample_next(logits.data(), c.vocab_size, req.sampling, seen.ids(), rng);
    res.tokens.push_back(tok);
    emitted.push_back(tok);
    seen.add(tok);
    const bool keep_going = on_token ? on_token(tok) : true;
    if (emitted.size() == 1) {
      first_done = Clock::now();
      res.first_token_ms = ms_since(t0);
    }
    if (!keep_going || static_cast<int64_t>(emitted.size()) >= req.max_tokens) break;
    if (req.stop_at_eos && is_eos(c, tok)) break;
    if (stops.matches(emitted)) break;
    source.next(res.tokens, 1, logits);
  }
  res.tokens_emitted = static_cast<int64_t>(emitted.size());
  res.decode_steady_ms = ms_since(first_done);
  return res;
}

}  // namespace tinyloop::runtime
