// Thompson NFA over bytes, built from a parsed Regex. Only an intermediate: the DFA
// (dfa.h) is what matching and masks use.
#pragma once
#include <cstdint>
#include <vector>

#include "grammar/regex_ast.h"

namespace tinyloop::grammar {

struct Nfa {
  enum Kind : uint8_t {
    kByte,  // on a byte in sets[set] go to out
    kSplit,  // epsilon to out and (when >= 0) to out2
    kMatch,  // accepting
  };
  struct State {
    Kind kind;
    int32_t set = -1;
    int32_t out = -1, out2 = -1;
  };
  std::vector<State> states;
  std::vector<ByteSet> sets;  // distinct byte sets of the kByte states
  int32_t start = -1;
};

// Throws std::invalid_argument("pattern too large: ...") when the NFA would need more than
// max_states states (counted before anything is built, so "(a{9999}){9999}" fails fast
// instead of allocating).
Nfa build_nfa(const Regex& re, int64_t max_states);

}  // namespace tinyloop::grammar
