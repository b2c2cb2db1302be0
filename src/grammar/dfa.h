// Deterministic automaton over bytes, from the NFA by subset construction, with every dead
// state removed: each state that exists can still reach an accepting state, so "the next
// byte leads to a state" is exactly "the output so far can still be completed". Immutable
// after construction, hence safe to share between threads.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/nfa.h"

namespace tinyloop::grammar {

struct DfaLimits {
  int64_t max_states = 10000;  // live + dead states built before pruning
  int64_t max_subset_entries = 16'000'000;  // NFA states over all subsets (memory: 4 bytes each)
  int64_t max_work = 100'000'000;  // NFA-state visits while building (time: about 1 s)
};

class Dfa {
 public:
  static constexpr int32_t kDead = -1;

  int32_t start() const { return start_; }
  int32_t num_states() const { return static_cast<int32_t>(accepting_.size()); }
  // Bytes that every state treats alike share a class; transitions are per class.
  int32_t num_classes() const { return num_classes_; }
  uint8_t byte_class(uint8_t b) const { return class_of_[b]; }
  int32_t step(int32_t s, uint8_t b) const { return table_[static_cast<size_t>(s) * num_classes_ + class_of_[b]]; }
  int32_t step_class(int32_t s, int32_t c) const { return table_[static_cast<size_t>(s) * num_classes_ + c]; }
  // Runs `bytes` from s; kDead as soon as the output can no longer be completed.
  int32_t run(int32_t s, std::string_view bytes) const {
    for (unsigned char b : bytes) {
      if (s == kDead) break;
      s = step(s, b);
    }
    return s;
  }
  bool accepting(int32_t s) const { return accepting_[s] != 0; }
  // Some byte leads on to a live state (false: the output must end here).
  bool can_continue(int32_t s) const { return can_continue_[s] != 0; }
  // Fewest bytes from s to an accepting state (0 when s accepts).
  int32_t distance_to_accept(int32_t s) const { return distance_[s]; }
  // One shortest byte string from s to an accepting state, preferring printable ASCII.
  std::string shortest_completion(int32_t s) const;

 private:
  friend Dfa build_dfa(const Nfa& nfa, const DfaLimits& limits);
  int32_t start_ = 0;
  int32_t num_classes_ = 0;
  std::array<uint8_t, 256> class_of_{};
  std::array<uint8_t, 256> class_rep_{};  // a representative byte per class
  std::vector<int32_t> table_;  // [state * num_classes + class] -> state or kDead
  std::vector<uint8_t> accepting_, can_continue_;
  std::vector<int32_t> distance_;
};

// Throws std::invalid_argument("pattern too complex: ...") past the limits, and
// std::invalid_argument("pattern matches no string") when the language is empty.
Dfa build_dfa(const Nfa& nfa, const DfaLimits& limits = {});

}  // namespace tinyloop::grammar
