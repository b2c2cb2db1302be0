#include "runtime/spec_common.h"

#include "model/kv_pool.h"
#include "runtime/spec_sampling.h"
#include "runtime/state_draw.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {
namespace {

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

void validate(const Engine& e, const SpeculativeRequest& r, bool tree) {
  // generate()'s checks, in its order and with its messages.
  e.check_tokens(r.prompt);
  if (r.max_tokens < 1) bad("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  validate(r.sampling);
  if (r.cache_window < 0) bad("cache_window must be >= 0, got " + std::to_string(r.cache_window));
  StopMatcher(r.stop_sequences, e.config().vocab_size);
  // The speculative arguments.
  if (r.draft_loops < 1) bad("draft_loops must be >= 1, got " + std::to_string(r.draft_loops));
  if (r.verify_loops < 1 || r.verify_loops > kMaxLoops)
    bad("verify_loops must be in [1, " + std::to_string(kMaxLoops) + "], got " + std::to_string(r.verify_loops));
  if (r.draft_loops > r.verify_loops)
    bad("draft_loops (" + std::to_string(r.draft_loops) + ") must be <= verify_loops (" +
        std::to_string(r.verify_loops) + ")");
  if (r.draft_ahead < 1) bad("draft_ahead must be >= 1, got " + std::to_string(r.draft_ahead));
  // Features of generate() that do not combine with speculative decoding, each with why.
  const char* what = tree ? "generate_tree_speculative" : "generate_speculative";
  if (r.grammar)
    bad(std::string("grammar is not supported by ") + what +
        " yet: the draft and the verifier would both need the grammar's mask along every drafted "
        "path; use generate(grammar=...)");
  validate(r.early_exit);
  refuse_file_gate(e.config(), what);
  if (r.early_exit.enabled())
    bad(std::string("early_exit_* does not combine with ") + what +
        ": the verifier checks several drafted tokens in one forward at verify_loops, while early "
        "exit picks each token's depth while decoding it alone");
  if (r.kv_loop_slots < 0) bad("kv_loop_slots must be >= 0, got " + std::to_string(r.kv_loop_slots));
  if (r.kv_loop_slots > 0 && r.kv_loop_slots < r.verify_loops)
    bad(std::string("kv_loop_slots does not combine with ") + what +
        ": with shared slot groups a multi-token verify forward writes other K/V than "
        "token-by-token decoding, so the output would not be generate()'s");
  if (tree) {
    if (r.k_branches < 1) bad("K_branches must be >= 1, got " + std::to_string(r.k_branches));
    // Divided, not multiplied: K_branches = 2^62 + 1 once wrapped the product past the check.
    if (r.draft_ahead > kMaxTreeNodes || r.k_branches > kMaxTreeNodes / r.draft_ahead)
      bad("K_branches * draft_ahead must be <= " + std::to_string(kMaxTreeNodes) + ", got " +
          std::to_string(r.k_branches) + " * " + std::to_string(r.draft_ahead));
  }
  e.check_length(static_cast<int64_t>(r.prompt.size()), r.max_tokens);
}

std::unique_ptr<model::KvCache> new_spec_cache(const Engine& e, const SpeculativeRequest& r) {
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  // A cycle touches positions P - 2 .. P + draft_ahead at once (pending draft readouts,
  // root, drafted rows) and rolls back at most draft_ahead + 1 of them: a windowed cache
  // keeps KvCache::kWindowSlack positions beyond its window for that.
  if (r.cache_window > 0 && std::min(r.draft_ahead, r.max_tokens) + 4 > model::KvCache::kWindowSlack)
    throw std::invalid_argument("draft_ahead must be <= " + std::to_string(model::KvCache::kWindowSlack - 4) +
                                " with cache_window");
  // Drafts never run past max_tokens (the scratch depth is min(draft_ahead, max_tokens)), so
  // a huge draft_ahead adds no capacity (and cannot wrap the sum).
  auto kv = std::make_unique<model::KvCache>(
      e.config(), r.verify_loops, total + std::min(r.draft_ahead, r.max_tokens) + 2, r.cache_window, e.kv_dtype(),
      &e.model().memory(), e.config().n_post_blocks, 0, nullptr, 0,
      model::private_block_rows(static_cast<int64_t>(r.prompt.size()), r.cache_window));
  // Draft and verify rows of a position start from the same state: one draw per call.
  kv->set_state_draw(resolve_state_draw(e.config(), r.seed, 1.0));
  return kv;
}

namespace {

// The generate() request a speculative one decodes like (its sampling and stop rules).
GenerateRequest as_generate(const SpeculativeRequest& r) {
  GenerateRequest g;
  g.prompt = r.prompt;
  g.max_tokens = r.max_tokens;
  g.sampling = r.sampling;
  g.stop_sequences = r.stop_sequences;
  g.seed = r.seed;
  g.stop_at_eos = r.stop_at_eos;
  return g;
}

}  // namespace

SpecOutput::SpecOutput(const Engine& e, const SpeculativeRequest& r)
    : verify_loops_(r.verify_loops),
      dec_(e.config(), as_generate(r)),
      prompt_len_(static_cast<int64_t>(r.prompt.size())),
      tokens_(r.prompt) {}

bool SpecOutput::push(int32_t tok) {
  tokens_.push_back(tok);
  return dec_.emit(tok, verify_loops_) != FinishReason::None;
}

bool SpecOutput::push_cycle(const int32_t* accepted, int64_t m, int32_t next) {
  for (int64_t j = 0; j < m; ++j)
    if (push(accepted[j])) return true;
  return push(next);
}

void SpecOutput::finish(SpeculativeResult& res) {
  res.tokens = std::move(tokens_);
  res.tokens_emitted = static_cast<int64_t>(res.tokens.size()) - prompt_len_;
  tokens_.clear();  // a moved-from vector is valid but unspecified: make it the empty one
}

std::vector<int32_t> SpecOutput::seen_with(const std::vector<int32_t>& extra) const {
  std::vector<int32_t> s = dec_.seen();
  s.insert(s.end(), extra.begin(), extra.end());  // the penalty dedups
  return s;
}

void PendingDraftRows::add(int64_t pos, const float* s) {
  if (!needed_) return;
  pos_.push_back(pos);
  s_.insert(s_.end(), s, s + D_);
}

void PendingDraftRows::readout(model::SpecForward& f, const float* s_row, int64_t pos, std::vector<float>& logits) {
  pos_.push_back(pos);
  s_.insert(s_.end(), s_row, s_row + D_);  // [n + 1, D], clobbered by the readout
  f.router().set_all_linear();
  f.readout(s_.data(), pos_.data(), static_cast<int64_t>(pos_.size()), true, model::LogitRows::Last, logits);
  pos_.clear();
  s_.clear();
}

int32_t greedy_token(const float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen) {
  std::vector<float> z(logits, logits + V);  // [V]
  apply_repetition_penalty(z.data(), V, seen, p.repetition_penalty);
  return argmax(z.data(), V);
}

void row_distribution(const float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen,
                      std::vector<float>& probs) {
  std::vector<float> z(logits, logits + V);  // [V]
  apply_repetition_penalty(z.data(), V, seen, p.repetition_penalty);
  sampling_distribution(z.data(), V, p, probs);
}

int32_t pick_token(const float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen,
                   std::vector<float>& probs, Rng& rng) {
  if (p.greedy()) return greedy_token(logits, V, p, seen);
  row_distribution(logits, V, p, seen, probs);
  return sample_from(probs, rng);
}

ChainVerdict verify_chain(const float* logits, int64_t V, const SamplingParams& p, const SpecOutput& out,
                          const int32_t* drafted, int64_t k, int64_t from, const std::vector<std::vector<float>>& q,
                          std::vector<float>& probs, Rng& rng) {
  for (int64_t m = from;; ++m) {  // drafted[0 .. m-1] accepted
    const float* row = logits + (m - from) * V;  // [V] the verifier's after them
    const auto seen = out.seen_with(std::vector<int32_t>(drafted, drafted + m));
    if (p.greedy()) {
      const int32_t t = greedy_token(row, V, p, seen);
      if (m < k && t == drafted[m]) continue;
      return {m, t};
    }
    row_distribution(row, V, p, seen, probs);
    if (m == k) return {m, sample_from(probs, rng)};  // all accepted: the verifier's bonus
    if (accept_draft(probs, q[size_t(m)], drafted[m], rng)) continue;
    return {m, sample_from(residual(probs, q[size_t(m)]), rng)};
  }
}

}  // namespace tinyloop::runtime
