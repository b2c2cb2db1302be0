// A compiled byte grammar for constrained decoding (docs/grammar.md). The output must match the pattern as a whole.
//
// State model: a state is an int32 DFA state id, Dfa::kDead (-1) once the output can no
// longer match. initial_state() -> advance(state, token) per emitted token; EOS is allowed
// exactly when is_accepting(state); when !can_continue(state) the output must end.
//
// Thread safety: a Grammar may be used by several threads (several generate calls) at once.
// The automaton is immutable after construction. The vocabulary is an immutable TokenMasks
// behind a shared_ptr, swapped under a mutex by set_token_vocabulary; a caller that needs a
// stable view for a whole generation takes vocabulary() once and uses that snapshot.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/bitset.h"
#include "grammar/dfa.h"
#include "grammar/token_masks.h"

namespace tinyloop::grammar {

// Longest pattern text a Grammar compiles (and json_pattern builds): 1 MiB. Longer ones
// are refused with std::invalid_argument before parsing.
inline constexpr int64_t kMaxPatternBytes = int64_t(1) << 20;

struct CompileOptions {
  int64_t max_nfa_states = 200000;
  DfaLimits dfa;
};

class Grammar {
 public:
  static constexpr int32_t kDead = Dfa::kDead;

  // Throws std::invalid_argument with the byte position for a bad pattern, and for a
  // pattern too large (kMaxPatternBytes, see CompileOptions) or matching no string at all.
  explicit Grammar(std::string pattern, const CompileOptions& options = {});
  Grammar(const Grammar&) = delete;
  Grammar& operator=(const Grammar&) = delete;

  const std::string& pattern() const { return pattern_; }
  const Dfa& dfa() const { return *dfa_; }
  int32_t num_states() const { return dfa_->num_states(); }

  // --- byte level (no vocabulary needed) ---
  int32_t initial_state() const { return dfa_->start(); }
  int32_t advance_bytes(int32_t state, std::string_view bytes) const;
  bool matches(std::string_view bytes) const;  // whole-string match
  bool is_accepting(int32_t state) const;  // kDead: false
  bool eos_allowed(int32_t state) const { return is_accepting(state); }
  bool can_continue(int32_t state) const;  // kDead: false
  std::string shortest_completion(int32_t state) const;  // kDead: throws

  // --- token level ---
  // One byte string per token id. Empty strings (e.g. special tokens one does not want to
  // spell) are never allowed; the EOS token is handled by eos_allowed(), not by the mask.
  // Throws std::invalid_argument for an empty list. Replacing a vocabulary keeps the old
  // one alive until the Grammar dies, so references from allowed_tokens() stay valid.
  void set_token_vocabulary(const std::vector<std::string>& token_bytes);
  bool has_vocabulary() const;
  // The current vocabulary; throws std::logic_error when none was set.
  std::shared_ptr<const TokenMasks> vocabulary() const;
  const Bitset& allowed_tokens(int32_t state) const { return vocabulary()->allowed(state); }
  int32_t advance(int32_t state, int32_t token_id) const { return vocabulary()->advance(state, token_id); }

 private:
  void check_state(int32_t state) const;

  std::string pattern_;
  std::shared_ptr<const Dfa> dfa_;
  mutable std::mutex mu_;  // guards vocab_ and retired_
  std::shared_ptr<const TokenMasks> vocab_;
  std::vector<std::shared_ptr<const TokenMasks>> retired_;
};

}  // namespace tinyloop::grammar
