#include "runtime/generate.h"

#include "model/kv_pool.h"
#include "runtime/batch_step.h"
#include "runtime/decoder.h"
#include "runtime/grammar_step.h"
#include "runtime/state_draw.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Produces next-token logits for the growing sequence through run_step (the serving
// engine's step, here with one part), cached or uncached.
class LogitSource {
 public:
  // Early exit always keeps a cache: its latest rule is defined on the cache's slots, which
  // the uncached reference path (TINYLOOP_DISABLE_KV_CACHE) does not keep.
  // The recurrence-shared mode (loop_slots) is defined by what the cache keeps, so it
  // always keeps one too.
  // prompt_len picks the cache's block size (model::private_block_rows: long prompts get
  // longer blocks, which decode attention reads faster).
  LogitSource(const Engine& e, int64_t loops, int64_t prompt_len, int64_t total_len, int64_t window, bool need_cache,
              int64_t loop_slots, const model::StateDraw& draw)
      : e_(e), loops_(loops), window_(window), draw_(draw), scratch_(e.model()) {
    if (loop_slots > 0 && loop_slots < loops) need_cache = true;
    if (need_cache || !e.kv_cache_disabled()) {
      kv_ = e.new_cache(loops, total_len, window, e.kv_dtype(), loop_slots,
                        model::private_block_rows(prompt_len, window));
      kv_->set_state_draw(draw);
    }
  }
  // A sequence whose prompt a caller already put into kv (warm-start resume, prefix cache).
  LogitSource(const Engine& e, int64_t loops, std::unique_ptr<model::KvCache> kv)
      : e_(e), loops_(loops), window_(kv->window()), draw_(kv->state_draw()), kv_(std::move(kv)), scratch_(e.model()) {}

  // One decode step for ids.back() (the only id not yet in the cache): logits[V] after ids.
  // Returns the iterations it ran (fewer than loops only when early exit stops it).
  int64_t step(const std::vector<int32_t>& ids, const EarlyExitParams& ee, const GateExitParams& gate,
               std::vector<float>& logits) {
    if (!kv_) {  // uncached: the whole sequence through a fresh cache
      next(ids, static_cast<int64_t>(ids.size()), gate, logits);
      return loops_;
    }
    std::vector<StepPart> parts(1);
    parts[0].kv = kv_.get();
    parts[0].tokens = &ids.back();
    parts[0].n = 1;
    parts[0].loops = loops_;
    parts[0].early_exit = &ee;
    parts[0].gate_exit = &gate;
    parts[0].gate_may_stop = true;
    parts[0].want_logits = true;
    run_step(e_.model(), parts, scratch_);
    logits.swap(parts[0].logits);
    return parts[0].depth;
  }
  // logits[V] after `ids`, of which the last `n_new` are not yet in the cache (the prompt):
  // one step per chunk the cache allows (LoopedModel::max_chunk), prefill never exits early.
  // The gate picks the last row's logits (all iterations run: prompts never stop early).
  void next(const std::vector<int32_t>& ids, int64_t n_new, const GateExitParams& gate, std::vector<float>& logits) {
    const int64_t T = static_cast<int64_t>(ids.size());
    std::unique_ptr<model::KvCache> fresh;
    model::KvCache* kv = kv_.get();
    if (!kv) {
      fresh = e_.new_cache(loops_, T, window_, e_.kv_dtype());
      fresh->set_state_draw(draw_);  // the same state at every re-run of the sequence
      kv = fresh.get();
    }
    for (int64_t done = 0; done < n_new;) {
      std::vector<StepPart> parts(1);
      parts[0].kv = kv;
      parts[0].n = e_.model().max_chunk(*kv, n_new - done);
      parts[0].tokens = ids.data() + T - n_new + done;
      parts[0].loops = loops_;
      done += parts[0].n;
      parts[0].want_logits = done == n_new;
      parts[0].gate_exit = &gate;
      run_step(e_.model(), parts, scratch_);
      if (done == n_new) logits.swap(parts[0].logits);
    }
  }

 private:
  const Engine& e_;
  int64_t loops_, window_;
  model::StateDraw draw_;  // the sequence's initial-state draw, also for uncached re-runs
  std::unique_ptr<model::KvCache> kv_;
  StepScratch scratch_;
};

// The decode loop shared by generate() and generate_after_prefill(): `logits` [V] follow
// the prompt, which `source` already holds. Sampling and stopping: SequenceDecoder.
GenerateResult decode(const Engine& engine, const GenerateRequest& req, int64_t loops, LogitSource& source,
                      std::vector<float> logits, Clock::time_point t0, double prefill_ms, const GateExitParams& gate,
                      const TokenCallback& on_token) {
  SequenceDecoder dec(engine.config(), req);
  GenerateResult res;
  res.prefill_ms = prefill_ms;
  Clock::time_point first_done = Clock::now();
  res.tokens = req.prompt;
  int64_t depth = loops;  // iterations behind `logits`: the prefill never exits early
  while (true) {
    const std::optional<int32_t> tok = dec.choose(logits.data());
    if (!tok) break;  // the grammar's full match, nothing can extend it
    res.tokens.push_back(*tok);
    const FinishReason why = dec.emit(*tok, depth);
    const bool keep_going = on_token ? on_token(*tok) : true;
    if (dec.emitted().size() == 1) {
      first_done = Clock::now();
      res.first_token_ms = ms_since(t0);
    }
    if (!keep_going) {
      if (why == FinishReason::None) dec.finish(FinishReason::Callback);
      break;
    }
    if (why != FinishReason::None) break;
    depth = source.step(res.tokens, req.early_exit, gate, logits);
  }
  res.tokens_emitted = static_cast<int64_t>(dec.emitted().size());
  res.loops_per_token = dec.depths();
  res.finish_reason = dec.reason();
  res.decode_steady_ms = ms_since(first_done);
  return res;
}

}  // namespace

void validate(const Engine& e, const GenerateRequest& r) {
  e.check_tokens(r.prompt);
  if (r.max_tokens < 1) throw std::invalid_argument("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  e.resolve_loops(r.loops);
  e.check_loop_slots(r.kv_loop_slots);
  validate(r.sampling);
  if (r.cache_window < 0)
    throw std::invalid_argument("cache_window must be >= 0, got " + std::to_string(r.cache_window));
  e.check_length(static_cast<int64_t>(r.prompt.size()), r.max_tokens);
  (void)StopMatcher(r.stop_sequences, e.config().vocab_size);  // throws for a bad sequence
  validate(r.early_exit);
  (void)resolve_gate(e.config(), r.exit_gate, r.early_exit);  // throws for a bad exit_gate*
  validate_init_scale(e.config(), r.init_scale);
  if (r.grammar) (void)GrammarCursor(r.grammar, e.config());  // vocabulary set and sized
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs)
    throw std::invalid_argument("logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (or none), got " +
                                std::to_string(r.logprobs));
}

double GenerateResult::mean_loops() const {
  if (loops_per_token.empty()) return 0.0;
  double sum = 0;
  for (int64_t l : loops_per_token) sum += static_cast<double>(l);
  return sum / static_cast<double>(loops_per_token.size());
}

GenerateResult generate(const Engine& engine, const GenerateRequest& req, const TokenCallback& on_token) {
  validate(engine, req);
  const int64_t loops = engine.resolve_loops(req.loops);
  const auto t0 = Clock::now();
  // A gate that stops tokens early needs the cache for its latest rule, as early exit does.
  const GateExitParams gate = resolve_gate(engine.config(), req.exit_gate, req.early_exit);
  const int64_t P = static_cast<int64_t>(req.prompt.size());
  LogitSource source(engine, loops, P, P + req.max_tokens, req.cache_window,
                     req.early_exit.enabled() || gate.stops_early(), req.kv_loop_slots,
                     resolve_state_draw(engine.config(), req.seed, req.init_scale));
  std::vector<float> logits;
  source.next(req.prompt, static_cast<int64_t>(req.prompt.size()), gate, logits);
  return decode(engine, req, loops, source, std::move(logits), t0, ms_since(t0), gate, on_token);
}

GenerateResult generate_after_prefill(const Engine& engine, const GenerateRequest& req, int64_t loops,
                                      std::unique_ptr<model::KvCache> kv, std::vector<float> logits,
                                      Clock::time_point start, double prefill_ms, const TokenCallback& on_token) {
  // The caller built the cache (resume handle, prefix cache): a shared slot layout it was
  // not built with cannot be honoured here, so refuse instead of silently ignoring it.
  if (req.kv_loop_slots > 0 && req.kv_loop_slots < loops && !kv->layout().shared())
    throw std::invalid_argument(
        "kv_loop_slots is not supported with resume_generate or prefix caches (their KV is "
        "built with one slot group per iteration, and a prefix computed apart from its suffix "
        "would hold other shared-group K/V than generate() computes)");
  refuse_file_gate(engine.config(), "resume_generate and prefix caches");
  LogitSource source(engine, loops, std::move(kv));
  // The prompt's logits came from elsewhere without the exit gate, so decoding runs without
  // it too (docs/loop-depth.md, "Exit gate": resume and prefix caches are full depth).
  return decode(engine, req, loops, source, std::move(logits), start, prefill_ms, GateExitParams{}, on_token);
}

}  // namespace tinyloop::runtime
