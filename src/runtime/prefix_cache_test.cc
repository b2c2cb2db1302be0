// Prefix cache in C++, run under ASan/UBSan by the test command: a two-segment forward
// (shared prefix KvCache + tail) equals the single-cache forward bit for bit, with the scalar
// kernels and with the SIMD ones; PrefixCache::generate equals generate(prefix + suffix);
// one cache serves several threads; errors.
#include "runtime/prefix_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "io/test_file_builder.h"
#include "ops/ops.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

ModelConfig config() {
  ModelConfig c = testing::small_runtime_config();
  c.inject = Inject::Add;
  c.loop_norm = true;
  return c;
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::write_random_model(file_, config(), "F16", 11);
    engine_ = std::make_shared<Engine>(path_, EngineOptions{});
  }
  void TearDown() override { ops::set_force_scalar(false); }
  static std::vector<int32_t> ids(int n, uint64_t seed) {
    std::mt19937_64 g(seed);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(g() % 31);
    return v;
  }
  // logits [T, V] of `suffix` after `prefix`, via one cache (want) and via prefix + tail.
  void forward_both(const std::vector<int32_t>& prefix, const std::vector<int32_t>& suffix, std::vector<float>& want,
                    std::vector<float>& got) {
    const auto& m = engine_->model();
    const int64_t P = int64_t(prefix.size()), S = int64_t(suffix.size()), L = 3;
    auto whole = engine_->new_cache(L, P + S, 0, engine_->kv_dtype(), 0, 4);
    std::vector<float> scratch;  // [1, V] prefix logits, unused
    m.forward(prefix.data(), P, *whole, model::LogitRows::Last, scratch, L);
    m.forward(suffix.data(), S, *whole, model::LogitRows::All, want, L);
    auto pre = engine_->new_cache(L, P, 0, engine_->kv_dtype(), 0, 4);
    m.forward(prefix.data(), P, *pre, model::LogitRows::Last, scratch, L);
    auto tail = engine_->new_cache(L, P + S + 3, 0, engine_->kv_dtype(), 0, 4);  // 3 spare rows
    tail->share_prefix(*pre);
    m.forward(suffix.data(), S, *tail, model::LogitRows::All, got, L);
    EXPECT_EQ(tail->length(), P + S);
  }
  testing::TempFile file_;
  std::string path_;
  std::shared_ptr<Engine> engine_;
};

TEST_F(PrefixCacheTest, TwoSegmentForwardIsBitIdenticalWithScalarKernels) {
  ops::set_force_scalar(true);
  std::vector<float> want, got;
  forward_both(ids(13, 1), ids(7, 2), want, got);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
}

TEST_F(PrefixCacheTest, TwoSegmentForwardIsBitIdenticalWithSimdKernels) {
  ops::set_force_scalar(false);
  for (int P : {1, 13, 40}) {  // windows mostly in the prefix, mostly in the tail
    std::vector<float> want, got;
    forward_both(ids(P, 1 + P), ids(7, 2), want, got);
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "P=" << P;
  }
}

TEST_F(PrefixCacheTest, GenerateEqualsGenerateOfConcatenation) {
  const auto prefix = ids(11, 3);
  for (bool scalar : {true, false}) {
    ops::set_force_scalar(scalar);
    auto pc = PrefixCache::build(engine_, prefix, std::nullopt);
    EXPECT_EQ(pc->seq_len(), 11);
    EXPECT_EQ(pc->loops(), 3);
    for (int s : {0, 1, 6}) {
      const auto suffix = ids(s, 10 + s);
      GenerateRequest req;
      req.max_tokens = 12;
      req.stop_at_eos = false;
      req.sampling.temperature = 0.8;
      req.seed = 7;
      GenerateRequest full = req;
      full.prompt = prefix;
      full.prompt.insert(full.prompt.end(), suffix.begin(), suffix.end());
      EXPECT_EQ(pc->generate(suffix, req).tokens, generate(*engine_, full).tokens) << "S=" << s << " scalar=" << scalar;
    }
  }
}

// cache_window: the prefix is prefilled with generate()'s window (longer than the window, so
// its K/V differ from an unwindowed prefill) and the call runs far past the window (blocks
// released as it goes).
TEST_F(PrefixCacheTest, SlidingWindowEqualsGenerateWithTheSameWindow) {
  const auto prefix = ids(20, 8), suffix = ids(5, 9);
  const int64_t W = 6;
  auto pc = PrefixCache::build(engine_, prefix, 2, W);
  EXPECT_EQ(pc->cache_window(), W);
  GenerateRequest req;
  req.max_tokens = 90;  // 95 positions past the prefix, window 6: old blocks are released
  req.stop_at_eos = false;
  req.sampling.temperature = 0.7f;
  req.seed = 3;
  req.cache_window = W;
  GenerateRequest full = req;
  full.loops = 2;
  full.prompt = prefix;
  full.prompt.insert(full.prompt.end(), suffix.begin(), suffix.end());
  EXPECT_EQ(pc->generate(suffix, req).tokens, generate(*engine_, full).tokens);
  req.cache_window = 0;  // another window: the prefix's K/V would differ
  EXPECT_THROW(pc->generate(suffix, req), std::invalid_argument);
  EXPECT_THROW(PrefixCache::build(engine_, prefix, 2, -1), std::invalid_argument);
}

TEST_F(PrefixCacheTest, OneCacheServesManyThreads) {
  const auto prefix = ids(9, 4);
  auto pc = PrefixCache::build(engine_, prefix, 2);
  std::vector<std::vector<int32_t>> want(4), got(4);
  for (int i = 0; i < 4; ++i) {
    GenerateRequest full;
    full.prompt = prefix;
    const auto suffix = ids(1 + i, 20 + i);
    full.prompt.insert(full.prompt.end(), suffix.begin(), suffix.end());
    full.max_tokens = 8;
    full.loops = 2;
    full.stop_at_eos = false;
    want[i] = generate(*engine_, full).tokens;
  }
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      GenerateRequest req;
      req.max_tokens = 8;
      req.stop_at_eos = false;
      got[i] = pc->generate(ids(1 + i, 20 + i), req).tokens;
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[i]) << i;
}

TEST_F(PrefixCacheTest, Errors) {
  auto pc = PrefixCache::build(engine_, ids(5, 5), 3);
  GenerateRequest req;
  req.loops = 4;
  try {
    pc->generate(ids(2, 6), req);
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("loops mismatch"), std::string::npos);
  }
  req.loops.reset();
  req.cache_window = 8;
  EXPECT_THROW(pc->generate(ids(2, 6), req), std::invalid_argument);
  EXPECT_THROW(PrefixCache::build(engine_, {}, 3), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::runtime
