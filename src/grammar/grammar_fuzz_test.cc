// Fuzz: random byte strings and mutated valid patterns fed to the whole compile pipeline.
// Each must either compile or throw std::invalid_argument, never crash, hang or throw
// anything else; what compiles must be self-consistent (shortest completion accepted,
// masks equal per-token simulation). Limits are small so the worst case stays fast.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace tinyloop::grammar {
namespace {

CompileOptions small_limits() {
  CompileOptions o;
  o.max_nfa_states = 20000;
  o.dfa.max_states = 2000;
  o.dfa.max_subset_entries = 200000;
  o.dfa.max_work = 5'000'000;
  return o;
}

// Compiles `p`; returns false when it is (correctly) rejected.
bool compile_and_check(const std::string& p, std::mt19937& rng, const std::vector<std::string>& vocab) {
  std::unique_ptr<Grammar> g;
  try {
    g = std::make_unique<Grammar>(p, small_limits());
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()), "") << p;
    return false;
  }
  int32_t s0 = g->initial_state();
  std::string done = g->shortest_completion(s0);
  EXPECT_TRUE(g->matches(done)) << "pattern '" << p << "'";
  std::uniform_int_distribution<int> byte(0, 255), len(0, 8);
  for (int k = 0; k < 4; ++k) {
    std::string s;
    for (int i = len(rng); i > 0; --i) s.push_back(static_cast<char>(k % 2 ? byte(rng) : "ab(){}.-"[byte(rng) % 8]));
    int32_t st = g->advance_bytes(s0, s);
    EXPECT_EQ(g->matches(s), st != Grammar::kDead && g->is_accepting(st));
  }
  g->set_token_vocabulary(vocab);
  const Bitset& m = g->allowed_tokens(s0);
  for (size_t t = 0; t < vocab.size(); ++t)
    EXPECT_EQ(m.test(t), !vocab[t].empty() && g->advance_bytes(s0, vocab[t]) != Grammar::kDead) << p;
  return true;
}

TEST(GrammarFuzz, RandomPatternStrings) {
  const std::string alphabet = "ab.()[]{}|*+?^$\\-,0123456789dwsxDn:?";
  std::vector<std::string> vocab = {"a", "b", "ab", "ba", "", "0", "12", "(", "\n", "\xff", "abab"};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> len(0, 24), pick(0, static_cast<int>(alphabet.size()) - 1), raw(0, 255);
  int compiled = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int iter = 0; iter < 20000; ++iter) {
    std::string p;
    for (int i = len(rng); i > 0; --i) p.push_back(iter % 10 == 0 ? static_cast<char>(raw(rng)) : alphabet[pick(rng)]);
    compiled += compile_and_check(p, rng, vocab);
  }
  EXPECT_GT(compiled, 1000);  // the generator must also reach the compiler, not just the parser
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
}

TEST(GrammarFuzz, MutatedValidPatterns) {
  const std::vector<std::string> seeds = {R"(\{"name":"[a-z]+"\})",
                                          "(?:yes|no|maybe)",
                                          "[0-9]{1,5}",
                                          "(a|b)*abb",
                                          "\\d{3}-\\d{4}",
                                          "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?",
                                          "[^\\n]{2,}x?",
                                          "((ab)+|c{2,3})*"};
  std::vector<std::string> vocab = {"a", "b", "{", "}", "\"", "name", ":", "0", "9", "yes", "-", ".", "ab"};
  const std::string inserts = "()[]{}|*+?\\^$-,.";
  std::mt19937 rng(99);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string p = seeds[iter % seeds.size()];
    for (int m = 1 + static_cast<int>(rng() % 3); m > 0; --m) {
      size_t at = p.empty() ? 0 : rng() % (p.size() + 1);
      switch (rng() % 3) {
        case 0: p.insert(at, 1, inserts[rng() % inserts.size()]); break;
        case 1:
          if (at < p.size()) p.erase(at, 1);
          break;
        default:
          if (at < p.size()) p[at] = inserts[rng() % inserts.size()];
          break;
      }
    }
    compile_and_check(p, rng, vocab);
  }
}

TEST(GrammarFuzz, ExplosivePatternsFailFast) {
  std::mt19937 rng(5);
  std::vector<std::string> vocab = {"a"};
  for (const char* p :
       {"(a{10000}){10000}", "((a*)*)*b{9999}", "(a|b)*a(a|b){20}", "(.{0,100}){0,100}", "([ab]{0,50}c){0,50}"}) {
    const auto t0 = std::chrono::steady_clock::now();
    compile_and_check(p, rng, vocab);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0) << p;
  }
}

}  // namespace
}  // namespace tinyloop::grammar
