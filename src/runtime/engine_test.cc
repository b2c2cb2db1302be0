// The whole stack (io -> model -> runtime) on small random models, run under ASan/UBSan by
// the test command: cached decode vs the uncached path, the ring-buffer window, generation
// arguments and errors, determinism, threads. Numerical agreement with the independent
// numpy reference is tested from Python (tests/python/test_engine_forward.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

using testing::TempFile;

using testing::fill_random_weights;

ModelConfig huginn_like() {
  ModelConfig c = testing::tiny_config();
  c.dim = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.ffn_dim = 24;
  c.vocab_size = 31;
  c.default_loops = 3;
  c.max_seq_len = 256;
  c.norm_placement = NormPlacement::HuginnSandwich;
  c.qkv_fused = true;
  c.attn_qkv_bias = true;
  c.pos_encoding = PosEncoding::RopeInterleaved;
  c.inject = Inject::LinearConcat;
  c.init_state = InitState::Random;
  c.init_state_std = 0.5;
  c.init_state_seed = 99;
  c.post_loop_norm = PostLoopNorm::Final;
  c.tie_embeddings = true;
  return c;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::RawFile raw = testing::make_raw_file(huginn_like(), "F16");
    fill_random_weights(raw, 5);
    path_ = file_.write(testing::serialize(raw));
    unsetenv("TINYLOOP_DISABLE_KV_CACHE");
  }
  std::unique_ptr<Engine> open(bool uncached = false, const char* kv_mode = nullptr) {
    if (uncached) setenv("TINYLOOP_DISABLE_KV_CACHE", "1", 1);
    EngineOptions o;
    if (kv_mode) o.kv_mode = kv_mode;
    auto e = std::make_unique<Engine>(path_, o);
    unsetenv("TINYLOOP_DISABLE_KV_CACHE");
    return e;
  }
  std::vector<int32_t> ids(int n, uint64_t seed = 1) {
    std::mt19937_64 g(seed);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(g() % 31);
    return v;
  }
  static double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
    return m;
  }
  TempFile file_;
  std::string path_;
};

TEST_F(EngineTest, ScoreIsFiniteAndDependsOnLoops) {
  auto e = open();
  auto a = e->score(ids(9), 2), b = e->score(ids(9), 5);
  ASSERT_EQ(a.size(), 9u * 31u);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(max_abs_diff(a, b), 1e-3);
  auto last = e->score_last(ids(9), 2);
  EXPECT_EQ(std::vector<float>(a.end() - 31, a.end()), last);
}

TEST_F(EngineTest, ScoreIsCausal) {
  auto e = open();
  auto x = ids(10), y = x;
  y[7] = (y[7] + 1) % 31;
  auto a = e->score(x, 3), b = e->score(y, 3);
  EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + 7 * 31), std::vector<float>(b.begin(), b.begin() + 7 * 31));
  EXPECT_GT(max_abs_diff(a, b), 1e-4);
}

TEST_F(EngineTest, CachedDecodeEqualsUncached) {
  auto x = ids(40);
  auto cached = open()->stepwise_logits(x, 6, 3, 0);
  auto uncached = open(true)->stepwise_logits(x, 6, 3, 0);
  EXPECT_LT(max_abs_diff(cached, uncached), 1e-4);
}

TEST_F(EngineTest, WindowEqualsMaskedUncached) {
  auto x = ids(150);  // past window + kWindowSlack: old blocks released as it goes
  for (int64_t window : {1, 5, 70}) {
    auto cached = open()->stepwise_logits(x, 3, 2, window);
    auto uncached = open(true)->stepwise_logits(x, 3, 2, window);
    EXPECT_LT(max_abs_diff(cached, uncached), 1e-4) << "window " << window;
  }
  // A long prefill through a small ring runs in chunks and gives the same last logits.
  auto chunked = open()->stepwise_logits(x, 150, 2, 5);
  auto masked = open(true)->stepwise_logits(x, 150, 2, 5);
  EXPECT_LT(max_abs_diff(chunked, masked), 1e-4);
}

TEST_F(EngineTest, GreedyGenerationCachedEqualsUncached) {
  GenerateRequest r;
  r.prompt = ids(5);
  r.max_tokens = 64;
  r.stop_at_eos = false;
  auto a = generate(*open(), r).tokens, b = generate(*open(true), r).tokens;
  EXPECT_EQ(a.size(), 69u);
  EXPECT_EQ(a, b);
}

TEST_F(EngineTest, SeededSamplingIsDeterministic) {
  GenerateRequest r;
  r.prompt = ids(4);
  r.max_tokens = 30;
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 10;
  r.sampling.top_p = 0.9f;
  r.seed = 42;
  r.stop_at_eos = false;
  auto e = open();
  EXPECT_EQ(generate(*e, r).tokens, generate(*e, r).tokens);
  auto other = r;
  other.seed = 43;
  EXPECT_NE(generate(*e, r).tokens, generate(*e, other).tokens);
}

TEST_F(EngineTest, CallbackStopsAndTimingsAreSet) {
  GenerateRequest r;
  r.prompt = ids(4);
  r.max_tokens = 20;
  r.stop_at_eos = false;
  int calls = 0;
  auto res = generate(*open(), r, [&](int32_t) { return ++calls < 3; });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(res.tokens_emitted, 3);
  EXPECT_EQ(res.tokens.size(), 7u);
  EXPECT_GE(res.first_token_ms, res.prefill_ms);
  EXPECT_GE(res.decode_steady_ms, 0.0);
}

TEST_F(EngineTest, BadArgumentsNameThemselves) {
  auto e = open();
  auto expect_invalid = [&](GenerateRequest r, const std::string& name) {
    try {
      generate(*e, r);
      ADD_FAILURE() << "no exception for " << name;
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find(name), std::string::npos) << ex.what();
    }
  };
  GenerateRequest ok;
  ok.prompt = ids(3);
  auto r = ok;
  r.max_tokens = 0;
  expect_invalid(r, "max_tokens");
  r = ok;
  r.loops = 0;
  expect_invalid(r, "loops");
  r = ok;
  r.sampling.temperature = -1;
  expect_invalid(r, "temperature");
  r = ok;
  r.sampling.temperature = 1;
  r.sampling.top_k = 0;
  expect_invalid(r, "top_k");
  r = ok;
  r.sampling.temperature = 1;
  r.sampling.top_p = 0;
  expect_invalid(r, "top_p");
  r = ok;
  r.sampling.repetition_penalty = 0;
  expect_invalid(r, "repetition_penalty");
  r = ok;
  r.prompt = {};
  expect_invalid(r, "prompt");
  r = ok;
  r.prompt = {1, 31};
  expect_invalid(r, "prompt");
  r = ok;
  r.cache_window = -2;
  expect_invalid(r, "cache_window");
  r = ok;
  r.stop_sequences = {{}};
  expect_invalid(r, "stop_sequences");
  r = ok;
  r.max_tokens = 300;
  EXPECT_THROW(generate(*e, r), std::runtime_error);
}

TEST_F(EngineTest, ThreadsShareOneEngine) {
  auto e = open();
  GenerateRequest r;
  r.prompt = ids(6);
  r.max_tokens = 24;
  r.sampling.temperature = 0.9f;
  r.seed = 3;
  r.stop_at_eos = false;
  const auto alone = generate(*e, r).tokens;
  std::vector<std::vector<int32_t>> out(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { out[i] = generate(*e, r).tokens; });
  for (auto& t : threads) t.join();
  for (const auto& o : out) EXPECT_EQ(o, alone);
}

TEST_F(EngineTest, MemoryCountsLiveCaches) {
  auto e = open();
  const double idle = e->memory_mb();
  double during = 0;
  GenerateRequest r;
  r.prompt = ids(6);
  r.max_tokens = 100;
  r.loops = 8;
  r.stop_at_eos = false;
  generate(*e, r, [&](int32_t) {
    during = std::max(during, e->memory_mb());
    return true;
  });
  // KV: (1 + 8 * 2 + 1) slots x 106 positions x 2 (K, V) x 2 kv heads x 4 dims x 2 bytes.
  const double kv_mb = 18.0 * 106 * 2 * 8 * 2 / (1024.0 * 1024.0);
  EXPECT_GE(during - idle, kv_mb);
  EXPECT_EQ(e->memory_mb(), idle);
}

}  // namespace
}  // namespace tinyloop::runtime
