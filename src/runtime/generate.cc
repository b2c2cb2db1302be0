#include "runtime/generate.h"

#include "runtime/grammar_step.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
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
  // Early exit always keeps a cache: its latest rule is defined on the cache's slots, which
  // the uncached reference path (TINYLOOP_DISABLE_KV_CACHE) does not keep.
  // The recurrence-shared mode (loop_slots) is defined by what the cache keeps, so it
  // always keeps one too.
  LogitSource(const Engine& e, int64_t loops, int64_t total_len, int64_t window, bool need_cache,
              int64_t loop_slots = 0)
      : e_(e), loops_(loops), window_(window) {
    if (loop_slots > 0 && loop_slots < loops) need_cache = true;
    if (need_cache || !e.kv_cache_disabled())
      kv_ = e.new_cache(loops, total_len, window, e.kv_dtype(), loop_slots);
  }
  // A sequence whose prompt a caller already put into kv (warm-start resume).
  LogitSource(const Engine& e, int64_t loops, std::unique_ptr<model::KvCache> kv)
      : e_(e), loops_(loops), window_(kv->window()), kv_(std::move(kv)) {}

  // One decode step for ids.back() (the only id not yet in the cache): logits[V] after ids.
  // Returns the iterations it ran (fewer than loops only when early exit stops it).
  int64_t step(const std::vector<int32_t>& ids, const EarlyExitParams& ee, std::vector<float>& logits) {
    if (kv_ && ee.enabled()) return decode_step_early_exit(e_.model(), *kv_, ids.back(), loops_, ee, logits);
    next(ids, 1, logits);
    return loops_;
  }
  // logits[V] after `ids`, of which the last `n_new` are not yet in the cache.
  void next(const std::vector<int32_t>& ids, int64_t n_new, std::vector<float>& logits) {
    const int64_t T = static_cast<int64_t>(ids.size());
    if (kv_) {
      e_.model().forward(ids.data() + T - n_new, n_new, *kv_, model::LogitRows::Last, logits, loops_);
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

// The decode loop shared by generate() and generate_after_prefill(): `logits` [V] follow
// the prompt, which `source` already holds.
GenerateResult decode(const Engine& engine, const GenerateRequest& req, int64_t loops,
                      LogitSource& source, std::vector<float> logits, Clock::time_point t0,
                      double prefill_ms, const TokenCallback& on_token) {
  const ModelConfig& c = engine.config();
  const StopMatcher stops(req.stop_sequences, c.vocab_size);
  Rng rng = req.seed ? Rng(*req.seed) : Rng::from_entropy();

  GenerateResult res;
  res.prefill_ms = prefill_ms;
  Clock::time_point first_done;
  res.tokens = req.prompt;
  std::vector<int32_t> emitted;
  SeenSet seen(c.vocab_size);
  for (int32_t id : req.prompt) seen.add(id);
  int64_t depth = loops;  // iterations behind `logits`: the prefill never exits early

  GrammarCursor grammar(req.grammar, c);

  while (true) {
    // Order (DESIGN.md section 4): penalty -> grammar mask -> temperature/top-k/top-p/sample.
    apply_repetition_penalty(logits.data(), c.vocab_size, seen.ids(), req.sampling.repetition_penalty);
    if (!grammar.mask(logits.data())) break;  // a full match nothing can extend
    const int32_t tok = sample_next(logits.data(), c.vocab_size, req.sampling, seen.ids(), rng,
                                    /*apply_penalty=*/false);
    res.tokens.push_back(tok);
    res.loops_per_token.push_back(depth);
    emitted.push_back(tok);
    seen.add(tok);
    const bool keep_going = on_token ? on_token(tok) : true;
    if (emitted.size() == 1) {
      first_done = Clock::now();
      res.first_token_ms = ms_since(t0);
    }
    if (!keep_going || static_cast<int64_t>(emitted.size()) >= req.max_tokens) break;
    if (req.stop_at_eos && is_eos(c, tok)) break;
    if (grammar.active()) {
      if (is_eos(c, tok)) break;  // EOS was allowed: the output is a full match
      grammar.advance(tok);
      if (grammar.finished()) break;  // the grammar admits no more bytes
    }
    if (stops.matches(emitted)) break;
    depth = source.step(res.tokens, req.early_exit, logits);
  }
  res.tokens_emitted = static_cast<int64_t>(emitted.size());
  res.decode_steady_ms = ms_since(first_done);
  return res;
}

}  // namespace

void validate(const Engine& e, const GenerateRequest& r) {
  e.check_tokens(r.prompt);
  if (r.max_tokens < 1)
    throw std::invalid_argument("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  e.resolve_loops(r.loops);
  e.check_loop_slots(r.kv_loop_slots);
  validate(r.sampling);
  if (r.cache_window < 0)
    throw std::invalid_argument("cache_window must be >= 0, got " + std::to_string(r.cache_window));
  e.check_length(static_cast<int64_t>(r.prompt.size()), r.max_tokens);
  (void)StopMatcher(r.stop_sequences, e.config().vocab_size);  // throws for a bad sequence
  validate(r.early_exit);
  if (r.grammar) (void)GrammarCursor(r.grammar, e.config());  // vocabulary set and sized
}

double GenerateResult::mean_loops() const {
  if (loops_per_token.empty()) return 0.0;
  double sum = 0;
  for (int64_t l : loops_per_token) sum += static_cast<double>(l);
  return sum / static_cast<double>(loops_per_token.size());
}

GenerateResult generate(const Engine& engine, const GenerateRequest& req,
                        const TokenCallback& on_token) {
  validate(engine, req);
  const int64_t loops = engine.resolve_loops(req.loops);
  const auto t0 = Clock::now();
  LogitSource source(engine, loops, static_cast<int64_t>(req.prompt.size()) + req.max_tokens,
                     req.cache_window, req.early_exit.enabled(), req.kv_loop_slots);
  std::vector<float> logits;
  source.next(req.prompt, static_cast<int64_t>(req.prompt.size()), logits);
  return decode(engine, req, loops, source, std::move(logits), t0, ms_since(t0), on_token);
}

GenerateResult generate_after_prefill(const Engine& engine, const GenerateRequest& req, int64_t loops,
                                      std::unique_ptr<model::KvCache> kv, std::vector<float> logits,
                                      Clock::time_point start, double prefill_ms,
                                      const TokenCallback& on_token) {
  // The caller built the cache (resume handle, prefix cache): a shared slot layout it was
  // not built with cannot be honoured here, so refuse instead of silently ignoring it.
  if (req.kv_loop_slots > 0 && req.kv_loop_slots < loops && !kv->layout().shared())
    throw std::invalid_argument(
        "kv_loop_slots is not supported with resume_generate or prefix caches yet (their KV "
        "is built with one slot group per iteration)");
  LogitSource source(engine, loops, std::move(kv));
  return decode(engine, req, loops, source, std::move(logits), start, prefill_ms, on_token);
}

}  // namespace tinyloop::runtime
