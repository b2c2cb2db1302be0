// Token masks: the trie scan against a brute-force per-token simulation, the vocabulary
// edge cases (empty, duplicate and prefix tokens), and concurrent first use.
#include "grammar/token_masks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "grammar/grammar.h"

namespace tinyloop::grammar {
namespace {

std::vector<std::string> random_vocab(std::mt19937& rng, int n, const std::string& alphabet, int max_len) {
  std::vector<std::string> v;
  for (unsigned char c : alphabet) v.push_back(std::string(1, static_cast<char>(c)));
  std::uniform_int_distribution<int> len(0, max_len), pick(0, static_cast<int>(alphabet.size()) - 1);
  while (static_cast<int>(v.size()) < n) {
    std::string t;
    for (int i = len(rng); i > 0; --i) t.push_back(alphabet[pick(rng)]);
    v.push_back(t);  // may be empty or a duplicate: both must be handled
  }
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

void expect_masks_equal_brute_force(const Grammar& g, const std::vector<std::string>& vocab) {
  const TokenMasks& m = *g.vocabulary();
  for (int32_t s = Dfa::kDead; s < g.num_states(); ++s) {
    const Bitset& mask = m.allowed(s);
    ASSERT_EQ(mask.size(), static_cast<int64_t>(vocab.size()));
    for (size_t t = 0; t < vocab.size(); ++t) {
      bool want = s != Dfa::kDead && !vocab[t].empty() && g.advance_bytes(s, vocab[t]) != Dfa::kDead;
      ASSERT_EQ(mask.test(static_cast<int64_t>(t)), want)
          << g.pattern() << " state " << s << " token '" << vocab[t] << "'";
      ASSERT_EQ(m.advance(s, static_cast<int32_t>(t)), want ? g.advance_bytes(s, vocab[t]) : Dfa::kDead);
    }
  }
}

TEST(TokenMasks, EqualBruteForceOnRandomVocabularies) {
  std::mt19937 rng(11);
  const char* patterns[] = {"(ab|ac)d*", "[a-c]{2,4}", "a*b?c+|d", "(?:abc)+", "\\{\"a\":\"[a-d]+\"\\}",
                            "(a|b)*abb", "[0-9]{1,3}", ".*"};
  for (const char* p : patterns) {
    for (int round = 0; round < 3; ++round) {
      Grammar g(p);
      auto vocab = random_vocab(rng, 200, "abcd{}\":0129\n\xc3\xa9\xff", 5);
      g.set_token_vocabulary(vocab);
      expect_masks_equal_brute_force(g, vocab);
    }
  }
}

TEST(TokenMasks, EmptyDuplicateAndPrefixTokens) {
  Grammar g("ab|abc");
  std::vector<std::string> vocab = {"", "a", "ab", "abc", "ab", "b", "abcd", "", "c"};
  g.set_token_vocabulary(vocab);
  const Bitset& m0 = g.allowed_tokens(g.initial_state());
  std::vector<int> want0 = {0, 1, 1, 1, 1, 0, 0, 0, 0};
  for (size_t t = 0; t < vocab.size(); ++t) EXPECT_EQ(m0.test(t), want0[t] == 1) << t;
  EXPECT_EQ(m0.count(), 4);
  int32_t s = g.advance(g.initial_state(), 4);  // the duplicate "ab"
  EXPECT_TRUE(g.is_accepting(s));
  EXPECT_TRUE(g.can_continue(s));
  const Bitset& m1 = g.allowed_tokens(s);
  EXPECT_EQ(m1.count(), 1);
  EXPECT_TRUE(m1.test(8));  // "c"
  EXPECT_EQ(g.advance(g.initial_state(), 0), Grammar::kDead);  // empty: never allowed
  EXPECT_EQ(g.advance(g.initial_state(), 5), Grammar::kDead);
  EXPECT_THROW(g.advance(g.initial_state(), 9), std::invalid_argument);
  EXPECT_THROW(g.advance(g.initial_state(), -1), std::invalid_argument);
  EXPECT_FALSE(g.allowed_tokens(Grammar::kDead).any());
}

TEST(TokenMasks, NeedsAVocabulary) {
  Grammar g("a+");
  EXPECT_FALSE(g.has_vocabulary());
  EXPECT_THROW(g.allowed_tokens(0), std::logic_error);
  EXPECT_THROW(g.advance(0, 0), std::logic_error);
  EXPECT_THROW(g.set_token_vocabulary({}), std::invalid_argument);
  EXPECT_FALSE(g.has_vocabulary());
  g.set_token_vocabulary({"a"});
  EXPECT_TRUE(g.has_vocabulary());
}

TEST(TokenMasks, ReplacingTheVocabularyKeepsOldReferencesValid) {
  Grammar g("a+");
  g.set_token_vocabulary({"a", "b"});
  const Bitset& old_mask = g.allowed_tokens(0);
  auto snapshot = g.vocabulary();
  g.set_token_vocabulary({"b", "aa", "a"});
  EXPECT_EQ(old_mask.size(), 2);
  EXPECT_TRUE(old_mask.test(0));
  EXPECT_EQ(snapshot->vocab_size(), 2);
  EXPECT_EQ(g.allowed_tokens(0).size(), 3);
  EXPECT_EQ(g.allowed_tokens(0).count(), 2);
}

TEST(TokenMasks, CacheAndPrecompute) {
  Grammar g("[a-c]{2,4}");
  g.set_token_vocabulary({"a", "bc", "abc", "x"});
  auto v = g.vocabulary();
  EXPECT_EQ(v->cached_masks(), 0);
  const Bitset* first = &v->allowed(0);
  EXPECT_EQ(&v->allowed(0), first);  // second use: the same cached object
  EXPECT_EQ(v->cached_masks(), 1);
  v->precompute_all();
  EXPECT_EQ(v->cached_masks(), g.num_states());
}

TEST(TokenMasks, ConcurrentFirstUseGivesTheSameMasks) {
  std::mt19937 rng(3);
  auto vocab = random_vocab(rng, 3000, "ab{}\":,0123456789xyz \n", 6);
  const std::string pattern = "\\{(\"[a-z]+\":[0-9]+,)*\"[a-z]+\":[0-9]+\\}";
  Grammar serial(pattern);
  serial.set_token_vocabulary(vocab);
  Grammar shared(pattern);
  shared.set_token_vocabulary(vocab);
  const int n = shared.num_states();
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < n; ++k) {
        int s = (k * (t + 1) + t) % n;  // each thread its own order
        if (shared.allowed_tokens(s).words() != serial.allowed_tokens(s).words()) ++failures[t];
      }
    });
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(TokenMasks, MaskLogits) {
  Bitset m(130);
  for (int i : {0, 5, 64, 127, 129}) m.set(i);
  std::vector<float> logits(130, 1.5f);
  mask_logits(m, logits.data(), 130);
  for (int i = 0; i < 130; ++i) {
    if (m.test(i)) EXPECT_EQ(logits[i], 1.5f) << i;
    else EXPECT_TRUE(std::isinf(logits[i]) && logits[i] < 0) << i;
  }
  Bitset all(64);
  for (int i = 0; i < 64; ++i) all.set(i);
  std::vector<float> l2(64, 2.0f);
  mask_logits(all, l2.data(), 64);
  for (float x : l2) EXPECT_EQ(x, 2.0f);
}

TEST(TokenTrie, PreorderWithSubtreeEnds) {
  TokenTrie trie({"ab", "a", "", "b", "abc", "ab"});
  const auto& nodes = trie.nodes();
  ASSERT_EQ(nodes.size(), 4u);  // a, ab, abc, b
  EXPECT_EQ(nodes[0].byte, 'a');
  EXPECT_EQ(nodes[0].subtree_end, 3);
  EXPECT_EQ(nodes[1].byte, 'b');
  EXPECT_EQ(nodes[1].depth, 2);
  EXPECT_EQ(nodes[1].tokens_end - nodes[1].tokens_begin, 2);  // "ab" twice
  EXPECT_EQ(nodes[2].byte, 'c');
  EXPECT_EQ(nodes[2].subtree_end, 3);
  EXPECT_EQ(nodes[3].byte, 'b');
  EXPECT_EQ(nodes[3].depth, 1);
  EXPECT_EQ(nodes[3].subtree_end, 4);
  EXPECT_EQ(trie.max_depth(), 3);
}

}  // namespace
}  // namespace tinyloop::grammar
