#include "runtime/resume.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "model/kv_pool.h"
#include "runtime/loop_run.h"
#include "runtime/state_draw.h"

namespace tinyloop::runtime {

std::shared_ptr<const ResumeHandle> ResumeHandle::build(std::shared_ptr<const Engine> engine,
                                                        std::vector<int32_t> prompt, std::optional<int64_t> loops,
                                                        std::optional<int64_t> max_loops, int64_t max_tokens) {
  const Engine& e = *engine;
  e.check_tokens(prompt);
  const int64_t L1 = e.resolve_loops(loops);
  const int64_t max_L = max_loops.value_or(std::max(2 * L1, e.config().default_loops));
  if (max_L < L1 || max_L > kMaxLoops)
    throw std::invalid_argument("max_loops must be in [loops (" + std::to_string(L1) + "), " +
                                std::to_string(kMaxLoops) + "], got " + std::to_string(max_L));
  if (max_tokens < 1) throw std::invalid_argument("max_tokens must be >= 1, got " + std::to_string(max_tokens));
  const auto T = static_cast<int64_t>(prompt.size());
  e.check_length(T, max_tokens);

  auto h = std::shared_ptr<ResumeHandle>(new ResumeHandle());
  h->kv_ = e.new_cache(max_L, T + max_tokens, 0, e.kv_dtype(), 0, model::private_block_rows(T, 0));
  // A per-call random state (Huginn) is drawn now, once: every resume continues this state.
  h->kv_->set_state_draw(resolve_state_draw(e.config(), std::nullopt, 1.0));
  // The first L1 iterations exactly as generate's prefill runs them; no readout yet (the
  // post slots are written by each resume at its own depth).
  LoopRun run(e.model(), *h->kv_, prompt.data(), T);
  run.run_to(L1);
  h->x_ = run.input();
  h->s_ = run.state();
  h->tracked_ = model::TrackedBytes(&e.model().memory(), int64_t(h->x_.size() + h->s_.size()) * int64_t(sizeof(float)));
  h->engine_ = std::move(engine);
  h->prompt_ = std::move(prompt);
  h->loops_used_ = L1;
  h->max_loops_ = max_L;
  h->max_tokens_ = max_tokens;
  return h;
}

int64_t ResumeHandle::bytes() const { return kv_->bytes() + int64_t(x_.size() + s_.size()) * int64_t(sizeof(float)); }

GenerateResult ResumeHandle::resume(GenerateRequest req, const TokenCallback& on_token) const {
  const Engine& e = *engine_;
  req.prompt = prompt_;
  const int64_t L2 = req.loops.value_or(loops_used_);
  if (L2 < loops_used_ || L2 > max_loops_)
    throw std::invalid_argument("loops must be in [" + std::to_string(loops_used_) + ", " + std::to_string(max_loops_) +
                                "] (the handle's loops_used .. max_loops), got " + std::to_string(L2));
  req.loops = L2;
  if (req.max_tokens > max_tokens_)
    throw std::invalid_argument("max_tokens " + std::to_string(req.max_tokens) + " exceeds the handle's max_tokens " +
                                std::to_string(max_tokens_));
  if (req.cache_window != 0)
    throw std::invalid_argument("cache_window must be 0 for resume_generate (the handle's cache is full-length)");
  validate(e, req);
  if (req.init_scale != kv_->state_draw().scale)
    throw std::invalid_argument(
        "init_scale cannot change the initial state of a resume handle's prompt (drawn when "
        "the handle was made); leave it at 1");

  const auto t0 = std::chrono::steady_clock::now();
  auto kv = kv_->clone();  // the handle stays untouched for other resumes
  LoopRun run(e.model(), *kv, 0, x_, s_, loops_used_, prompt_.data());  // tokens: value embeddings
  run.run_to(L2);  // only iterations L1 .. L2-1: no prelude, no earlier iterations
  std::vector<float> logits(e.config().vocab_size);  // [V] after the prompt
  run.read_out(model::LogitRows::Last, logits.data());
  run.commit();
  const double prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return generate_after_prefill(e, req, L2, std::move(kv), std::move(logits), t0, prefill_ms, on_token);
}

}  // namespace tinyloop::runtime
