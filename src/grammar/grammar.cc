// Grammar: pattern -> Regex -> NFA -> DFA, plus the current vocabulary's masks.
#include "grammar/grammar.h"

#include <stdexcept>

#include "grammar/nfa.h"
#include "grammar/regex_parser.h"

namespace tinyloop::grammar {

Grammar::Grammar(std::string pattern, const CompileOptions& options) : pattern_(std::move(pattern)) {
  if (pattern_.size() > size_t(kMaxPatternBytes))
    throw std::invalid_argument("pattern too large: " + std::to_string(pattern_.size()) + " bytes (at most " +
                                std::to_string(kMaxPatternBytes) + ")");
  Regex re = parse_regex(pattern_);
  Nfa nfa = build_nfa(re, options.max_nfa_states);
  dfa_ = std::make_shared<const Dfa>(build_dfa(nfa, options.dfa));
}

void Grammar::check_state(int32_t state) const {
  if (state < kDead || state >= dfa_->num_states())
    throw std::invalid_argument("grammar state " + std::to_string(state) + " out of range [-1, " +
                                std::to_string(dfa_->num_states()) + ")");
}

int32_t Grammar::advance_bytes(int32_t state, std::string_view bytes) const {
  check_state(state);
  return state == kDead ? kDead : dfa_->run(state, bytes);
}

bool Grammar::matches(std::string_view bytes) const {
  int32_t s = dfa_->run(dfa_->start(), bytes);
  return s != kDead && dfa_->accepting(s);
}

bool Grammar::is_accepting(int32_t state) const {
  check_state(state);
  return state != kDead && dfa_->accepting(state);
}

bool Grammar::can_continue(int32_t state) const {
  check_state(state);
  return state != kDead && dfa_->can_continue(state);
}

std::string Grammar::shortest_completion(int32_t state) const {
  check_state(state);
  if (state == kDead) throw std::invalid_argument("the dead grammar state has no completion");
  return dfa_->shortest_completion(state);
}

void Grammar::set_token_vocabulary(const std::vector<std::string>& token_bytes) {
  auto fresh = std::make_shared<const TokenMasks>(dfa_, token_bytes);  // built outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (vocab_) retired_.push_back(std::move(vocab_));
  vocab_ = std::move(fresh);
}

bool Grammar::has_vocabulary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return vocab_ != nullptr;
}

std::shared_ptr<const TokenMasks> Grammar::vocabulary() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!vocab_) throw std::logic_error("grammar has no token vocabulary: call set_token_vocabulary(token_bytes) first");
  return vocab_;
}

}  // namespace tinyloop::grammar
