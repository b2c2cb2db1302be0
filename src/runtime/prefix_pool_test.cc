// PrefixPool in C++ (also run under ASan/UBSan): longest-prefix matching through the trie
// (prompts that diverge inside a registered prefix get a shorter entry or a miss), keys on
// loops, LRU eviction by entries and by bytes, statistics, re-registration, and
// generate_with_pool == generate from several threads while entries are being evicted.
#include "runtime/prefix_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

class PrefixPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelConfig c = testing::small_runtime_config();
    path_ = testing::write_random_model(file_, c, "F16", 21);
    engine_ = std::make_shared<Engine>(path_, EngineOptions{});
  }
  static std::vector<int32_t> ids(int n, uint64_t seed) {
    std::mt19937_64 g(seed);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(g() % 31);
    return v;
  }
  static std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  std::shared_ptr<const PrefixCache> build(const std::vector<int32_t>& p, int64_t loops = 2) {
    return PrefixCache::build(engine_, p, loops);
  }
  std::shared_ptr<const PrefixCache> find(PrefixPool& pool, const std::vector<int32_t>& prompt, int64_t loops = 2) {
    return pool.lookup(*engine_, prompt, loops, engine_->kv_dtype());
  }
  testing::TempFile file_;
  std::string path_;
  std::shared_ptr<Engine> engine_;
};

TEST_F(PrefixPoolTest, LongestPrefixDivergenceAndLoops) {
  PrefixPool pool(0, 0);
  const auto a = ids(12, 1);
  const std::vector<int32_t> a5(a.begin(), a.begin() + 5);
  pool.insert(build(a5));
  pool.insert(build(a));
  pool.insert(build(a, 3));  // same tokens, other depth: its own entry
  EXPECT_EQ(pool.stats().entries, 3);

  EXPECT_EQ(find(pool, cat(a, ids(4, 9)))->seq_len(), 12);  // longest
  EXPECT_EQ(find(pool, a)->seq_len(), 12);  // all of the prompt
  EXPECT_EQ(find(pool, a, 3)->loops(), 3);
  auto diverge = a;
  diverge[7] = (diverge[7] + 1) % 31;  // leaves the 12-token path inside it
  EXPECT_EQ(find(pool, diverge)->seq_len(), 5);
  EXPECT_EQ(find(pool, std::vector<int32_t>(a.begin(), a.begin() + 11))->seq_len(), 5);
  diverge[2] = (diverge[2] + 1) % 31;  // inside the 5-token one too
  EXPECT_EQ(find(pool, diverge), nullptr);
  EXPECT_EQ(find(pool, cat(a, {1}), 4), nullptr);  // no entry at loops 4
  const auto st = pool.stats();
  EXPECT_EQ(st.hits, 5);
  EXPECT_EQ(st.misses, 2);
  EXPECT_EQ(st.bytes, build(a5)->bytes() + build(a)->bytes() + build(a, 3)->bytes());
}

TEST_F(PrefixPoolTest, LruEvictionByEntriesAndBytes) {
  const auto p1 = ids(6, 11), p2 = ids(6, 12), p3 = ids(6, 13);
  PrefixPool by_entries(0, 2);
  by_entries.insert(build(p1));
  by_entries.insert(build(p2));
  ASSERT_NE(find(by_entries, p1), nullptr);  // p1 now the most recent
  by_entries.insert(build(p3));  // evicts p2, the least recent
  EXPECT_EQ(find(by_entries, p2), nullptr);
  EXPECT_NE(find(by_entries, p1), nullptr);
  EXPECT_NE(find(by_entries, p3), nullptr);
  EXPECT_EQ(by_entries.stats().evictions, 1);
  EXPECT_EQ(by_entries.stats().entries, 2);

  const int64_t one = build(p1)->bytes();
  PrefixPool by_bytes(2 * one + one / 2, 0);  // room for two
  for (const auto& p : {p1, p2, p3}) by_bytes.insert(build(p));
  EXPECT_EQ(by_bytes.stats().entries, 2);
  EXPECT_EQ(by_bytes.stats().bytes, 2 * one);
  EXPECT_EQ(by_bytes.stats().evictions, 1);
  EXPECT_EQ(find(by_bytes, p1), nullptr);

  // Re-registering the same key replaces it: no new entry, no eviction.
  by_bytes.insert(build(p3));
  EXPECT_EQ(by_bytes.stats().entries, 2);
  EXPECT_EQ(by_bytes.stats().evictions, 1);
  by_bytes.clear();
  EXPECT_EQ(by_bytes.stats().entries, 0);
  EXPECT_EQ(by_bytes.stats().bytes, 0);
  EXPECT_EQ(find(by_bytes, p3), nullptr);

  PrefixPool tiny(one - 1, 0);
  EXPECT_THROW(tiny.insert(build(p1)), std::invalid_argument);
  EXPECT_THROW(PrefixPool(-1, 0), std::invalid_argument);
  EXPECT_THROW(PrefixPool(0, -2), std::invalid_argument);
}

TEST_F(PrefixPoolTest, GenerateWithPoolEqualsGenerateFromThreads) {
  const auto base = ids(10, 31);
  PrefixPool pool(0, 2);  // tight: the threads' registrations evict each other
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(cat(base, ids(1 + i % 3, 40 + i)));
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.prompt = p;
    r.max_tokens = 6;
    r.loops = 2;
    r.stop_at_eos = false;
    r.sampling.temperature = 0.7f;
    r.seed = 5;
    want.push_back(generate(*engine_, r).tokens);
  }
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < prompts.size(); ++i)
    ts.emplace_back([&, i] {
      // Each thread registers a prefix of its own length (churning the pool), then decodes.
      pool.insert(build(std::vector<int32_t>(base.begin(), base.begin() + 3 + int(i))));
      GenerateRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 6;
      r.loops = 2;
      r.stop_at_eos = false;
      r.sampling.temperature = 0.7f;
      r.seed = 5;
      int64_t matched = -1;
      got[i] = generate_with_pool(*engine_, pool, r, {}, &matched).tokens;
      EXPECT_GE(matched, 0);
    });
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
  const auto st = pool.stats();
  EXPECT_EQ(st.hits + st.misses, 6);
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.evictions, 4);

  GenerateRequest bad;
  bad.prompt = prompts[0];
  bad.max_tokens = 0;
  EXPECT_THROW(generate_with_pool(*engine_, pool, bad), std::invalid_argument);
  EXPECT_EQ(pool.stats().hits + pool.stats().misses, 6);  // checked before the lookup
}

}  // namespace
}  // namespace tinyloop::runtime
