// libFuzzer: token masks. The input is a pattern, a NUL byte, then a vocabulary of tokens
// separated by '\n' (at most 512). For the first states reached, every token's mask bit must
// agree with advancing by its bytes, and advance(state, token) with advance_bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "grammar/grammar.h"

using tinyloop::grammar::Grammar;

namespace {

// Tighter than the defaults (docs/grammar.md): a pattern near the default limits takes up
// to a second to compile, which would cut the executions a run gets a hundredfold; the
// limit checks themselves are exercised all the more.
tinyloop::grammar::CompileOptions fuzz_limits() {
  tinyloop::grammar::CompileOptions o;
  o.max_nfa_states = 20000;
  o.dfa.max_states = 2000;
  o.dfa.max_subset_entries = 1'000'000;
  o.dfa.max_work = 5'000'000;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) return 0;
  std::vector<std::string> vocab;
  size_t start = nul + 1;
  while (start <= in.size() && vocab.size() < 512) {
    size_t end = in.find('\n', start);
    if (end == std::string::npos) end = in.size();
    vocab.push_back(in.substr(start, end - start));
    start = end + 1;
  }
  try {
    Grammar g(in.substr(0, nul), fuzz_limits());
    g.set_token_vocabulary(vocab);
    std::vector<int32_t> states{g.initial_state()};
    for (size_t i = 0; i < states.size() && i < 16; ++i) {
      const int32_t s = states[i];
      const auto& mask = g.allowed_tokens(s);
      for (int32_t t = 0; t < int32_t(vocab.size()); ++t) {
        const int32_t by_bytes = vocab[t].empty() ? Grammar::kDead : g.advance_bytes(s, vocab[t]);
        const bool allowed = mask.test(t);
        if (allowed != (by_bytes != Grammar::kDead)) std::abort();
        if (g.advance(s, t) != (allowed ? by_bytes : Grammar::kDead)) std::abort();
        if (allowed && states.size() < 64) states.push_back(by_bytes);
      }
    }
  } catch (const std::invalid_argument&) {}
  return 0;
}
