#include "runtime/grammar_step.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace tinyloop::runtime {

GrammarCursor::GrammarCursor(std::shared_ptr<const grammar::Grammar> g, const ModelConfig& c)
    : g_(std::move(g)), c_(c) {
  if (!g_) return;
  if (!g_->has_vocabulary())
    throw std::invalid_argument("grammar: call set_token_vocabulary(token_bytes) before generating");
  masks_ = g_->vocabulary();
  if (masks_->vocab_size() != c.vocab_size)
    throw std::invalid_argument("grammar: its vocabulary has " + std::to_string(masks_->vocab_size()) +
                                " tokens, the model has " + std::to_string(c.vocab_size));
  state_ = g_->initial_state();
}

bool GrammarCursor::mask(float* logits) const {
  if (!g_) return true;
  const int64_t V = c_.vocab_size;
  std::vector<float> eos_logits;  // [n_eos] saved: EOS is decided by the grammar state
  for (int64_t id : c_.eos_ids) eos_logits.push_back(logits[id]);
  grammar::mask_logits(masks_->allowed(state_), logits, V);
  const bool eos_ok = g_->eos_allowed(state_);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < c_.eos_ids.size(); ++i) logits[c_.eos_ids[i]] = eos_ok ? eos_logits[i] : kNegInf;
  for (int64_t v = 0; v < V; ++v)
    if (logits[v] != kNegInf) return true;
  if (eos_ok) return false;
  throw std::runtime_error(
      "grammar: no token of this vocabulary can continue the output, "
      "and the output so far is not a full match");
}

void GrammarCursor::advance(int32_t token) {
  if (!g_) return;
  state_ = masks_->advance(state_, token);
}

bool GrammarCursor::finished() const { return g_ && !g_->can_continue(state_); }

}  // namespace tinyloop::runtime
