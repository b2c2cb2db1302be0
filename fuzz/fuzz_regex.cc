// libFuzzer: the byte-regex compiler (parse -> NFA -> DFA) on arbitrary patterns. Every input
// must compile or end in std::invalid_argument naming the problem (the limits keep time and
// memory bounded). A compiled grammar must accept the shortest completion from its start
// state and agree with itself on the input bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "grammar/grammar.h"

namespace {

// Tighter than the defaults (docs/grammar.md): a pattern near the default limits takes up
// to a second to compile, which would cut the executions a run gets a hundredfold; the
// limit checks themselves are exercised all the more.
tinyloop::grammar::CompileOptions fuzz_limits() {
  tinyloop::grammar::CompileOptions o;
  o.max_nfa_states = 5000;
  o.dfa.max_states = 1000;
  o.dfa.max_subset_entries = 200'000;
  o.dfa.max_work = 500'000;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string pattern(reinterpret_cast<const char*>(data), size);
  try {
    tinyloop::grammar::Grammar g(pattern, fuzz_limits());
    const std::string done = g.shortest_completion(g.initial_state());
    if (!g.matches(done)) std::abort();
    const int32_t s = g.advance_bytes(g.initial_state(), pattern);
    if ((s != tinyloop::grammar::Grammar::kDead && g.is_accepting(s)) != g.matches(pattern)) std::abort();
  } catch (const std::invalid_argument&) {}
  return 0;
}
