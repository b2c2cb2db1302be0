// The automaton: dead-state pruning, accepting / can-continue flags, shortest completion,
// size limits, and agreement with a brute-force NFA simulation.
#include "grammar/dfa.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "grammar/grammar.h"
#include "grammar/nfa.h"
#include "grammar/regex_parser.h"

namespace tinyloop::grammar {
namespace {

TEST(Dfa, EveryStateCanReachAcceptance) {
  // Without pruning, "ab|ac" after "a" then "x" would sit in a dead state; here it is kDead.
  Grammar g("(ab|ac)d*");
  const Dfa& d = g.dfa();
  for (int32_t s = 0; s < d.num_states(); ++s) {
    EXPECT_GE(d.distance_to_accept(s), 0);
    std::string tail = d.shortest_completion(s);
    EXPECT_EQ(static_cast<int32_t>(tail.size()), d.distance_to_accept(s));
    int32_t end = d.run(s, tail);
    ASSERT_NE(end, Dfa::kDead);
    EXPECT_TRUE(d.accepting(end));
  }
  EXPECT_EQ(g.advance_bytes(g.initial_state(), "ax"), Grammar::kDead);
  EXPECT_EQ(g.advance_bytes(g.initial_state(), "x"), Grammar::kDead);
  EXPECT_EQ(g.advance_bytes(Grammar::kDead, "a"), Grammar::kDead);
}

TEST(Dfa, AcceptingAndCanContinue) {
  Grammar g("ab?");
  int32_t s0 = g.initial_state();
  EXPECT_FALSE(g.is_accepting(s0));
  EXPECT_TRUE(g.can_continue(s0));
  int32_t s1 = g.advance_bytes(s0, "a");
  EXPECT_TRUE(g.is_accepting(s1));
  EXPECT_TRUE(g.eos_allowed(s1));
  EXPECT_TRUE(g.can_continue(s1));
  int32_t s2 = g.advance_bytes(s1, "b");
  EXPECT_TRUE(g.is_accepting(s2));
  EXPECT_FALSE(g.can_continue(s2));  // nothing may follow: the output must end
  EXPECT_FALSE(g.is_accepting(Grammar::kDead));
  EXPECT_FALSE(g.can_continue(Grammar::kDead));
  EXPECT_THROW(g.is_accepting(g.num_states()), std::invalid_argument);
  EXPECT_THROW(g.is_accepting(-2), std::invalid_argument);
}

TEST(Dfa, ShortestCompletionPrefersPrintable) {
  Grammar g("[\\x00-\\xff]{3}");
  EXPECT_EQ(g.shortest_completion(g.initial_state()), "   ");
  Grammar j(R"(\{\"name\":\"[a-z]+\"\})");
  EXPECT_EQ(j.shortest_completion(j.initial_state()), R"({"name":"a"})");
  EXPECT_THROW(j.shortest_completion(Grammar::kDead), std::invalid_argument);
}

TEST(Dfa, EmptyLanguageIsAnError) {
  for (const char* p : {"[^\\x00-\\xff]", "a[^\\x00-\\xff]b", "(?:[^\\x00-\\xff])+"}) {
    try {
      Grammar g(p);
      ADD_FAILURE() << p << " should be rejected";
    } catch (const std::invalid_argument& e) {
      EXPECT_STREQ(e.what(), "pattern matches no string") << p;
    }
  }
  // ...but an empty branch next to a live one is fine: it is pruned.
  Grammar g("a|b[^\\x00-\\xff]");
  EXPECT_TRUE(g.matches("a"));
  EXPECT_EQ(g.advance_bytes(g.initial_state(), "b"), Grammar::kDead);
}

TEST(Dfa, LimitsGiveClearErrors) {
  // (a|b)*a(a|b){n} needs 2^(n+1) DFA states.
  CompileOptions small;
  small.dfa.max_states = 100;
  try {
    Grammar g("(a|b)*a(a|b){8}", small);
    ADD_FAILURE() << "should exceed 100 states";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pattern too complex: its DFA exceeds 100 states"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(Grammar("(a|b)*a(a|b){8}"));  // 512 states: fine by default
  try {
    Grammar g("(a{10000}){10000}");
    ADD_FAILURE() << "should exceed the NFA limit";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pattern too large"), std::string::npos) << e.what();
  }
  CompileOptions tiny_work;
  tiny_work.dfa.max_subset_entries = 1000;
  EXPECT_THROW(Grammar("(a|b)*a(a|b){8}", tiny_work), std::invalid_argument);
  CompileOptions tiny_time;
  tiny_time.dfa.max_work = 2000;
  try {
    Grammar g("(a|b)*a(a|b){8}", tiny_time);
    ADD_FAILURE() << "should exceed the work limit";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds 2000 steps"), std::string::npos) << e.what();
  }
}

TEST(Dfa, ByteClassesStaySmall) {
  Grammar g("[a-z]+@[a-z]+\\.com");
  EXPECT_LE(g.dfa().num_classes(), 8);  // a-z, @, ., c, o, m and the rest
}

// Brute force: simulate the NFA state sets directly, no subsets cached.
bool nfa_matches(const Nfa& nfa, const std::string& s) {
  auto closure = [&](std::set<int32_t> seeds) {
    std::vector<int32_t> stack(seeds.begin(), seeds.end());
    std::set<int32_t> out;
    while (!stack.empty()) {
      int32_t x = stack.back();
      stack.pop_back();
      if (x < 0 || !out.insert(x).second) continue;
      if (nfa.states[x].kind == Nfa::kSplit) {
        stack.push_back(nfa.states[x].out);
        stack.push_back(nfa.states[x].out2);
      }
    }
    return out;
  };
  std::set<int32_t> cur = closure({nfa.start});
  for (unsigned char b : s) {
    std::set<int32_t> next;
    for (int32_t x : cur)
      if (nfa.states[x].kind == Nfa::kByte && nfa.sets[nfa.states[x].set].test(b)) next.insert(nfa.states[x].out);
    cur = closure(next);
  }
  for (int32_t x : cur)
    if (nfa.states[x].kind == Nfa::kMatch) return true;
  return false;
}

TEST(Dfa, AgreesWithNfaSimulationOnAllShortStrings) {
  const char* patterns[] = {"(a|b)*abb",   "a{2,3}(b|c)?", "(ab|a)(bc|c)", "((a|)b)*c?",
                            "[ab]{0,3}c*", "(a+b+)+",      "a*b?a*",       "(?:aa|b){1,}a"};
  for (const char* p : patterns) {
    Nfa nfa = build_nfa(parse_regex(p), 100000);
    Grammar g(p);
    // every string over {a,b,c} up to length 6
    for (int len = 0; len <= 6; ++len) {
      int total = 1;
      for (int i = 0; i < len; ++i) total *= 3;
      for (int code = 0; code < total; ++code) {
        std::string s;
        for (int i = 0, c = code; i < len; ++i, c /= 3) s.push_back("abc"[c % 3]);
        ASSERT_EQ(g.matches(s), nfa_matches(nfa, s)) << p << " on '" << s << "'";
      }
    }
  }
}

}  // namespace
}  // namespace tinyloop::grammar
