// Allowed-token masks of one grammar (a Dfa) over one vocabulary.
//
// A token is allowed in a state when all of its bytes can be consumed from there without
// reaching a dead state (the DFA has no dead states left, so: every step has a target).
// Empty tokens are never allowed. Masks are computed on first use of a state by one scan
// of the vocabulary trie and cached; later uses are a lookup.
//
// Thread safety: every method is safe to call from several threads at once. The cache is
// an array of atomic pointers, one per state, filled by compare-and-swap: a reader never
// locks; two threads that miss the same state at the same time may both compute it, the
// first to publish wins and the other's copy is dropped. Published masks never change or
// move, so a returned reference stays valid for the object's lifetime.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/bitset.h"
#include "grammar/dfa.h"
#include "grammar/token_trie.h"

namespace tinyloop::grammar {

class TokenMasks {
 public:
  // Throws std::invalid_argument for an empty vocabulary.
  TokenMasks(std::shared_ptr<const Dfa> dfa, const std::vector<std::string>& token_bytes);
  ~TokenMasks();
  TokenMasks(const TokenMasks&) = delete;
  TokenMasks& operator=(const TokenMasks&) = delete;

  int64_t vocab_size() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  const Dfa& dfa() const { return *dfa_; }

  // The mask of `state` (Dfa::kDead: the all-false mask). Throws std::invalid_argument for
  // another state outside [0, num_states).
  const Bitset& allowed(int32_t state) const;
  // The state after token `token_id`'s bytes, or Dfa::kDead when the token is not allowed.
  // Throws std::invalid_argument for an id outside [0, vocab_size) or a bad state.
  int32_t advance(int32_t state, int32_t token_id) const;
  // Computes every state's mask now (first-use latency moved to setup time).
  void precompute_all() const;
  // Masks computed so far (for tests and benchmarks).
  int32_t cached_masks() const;

 private:
  Bitset compute(int32_t state) const;
  void check_state(int32_t state) const;

  std::shared_ptr<const Dfa> dfa_;
  std::string bytes_;  // all tokens back to back
  std::vector<int64_t> offsets_;  // token i is bytes_[offsets_[i], offsets_[i+1])
  TokenTrie trie_;
  Bitset none_;
  std::unique_ptr<std::atomic<const Bitset*>[]> cache_;  // [dfa.num_states()]
};

// logits[i] = -inf for every i < n whose bit in `mask` is clear (the grammar step of
// docs/generation.md "The decode loop", between the repetition penalty and temperature).
void mask_logits(const Bitset& mask, float* logits, int64_t n);

}  // namespace tinyloop::grammar
