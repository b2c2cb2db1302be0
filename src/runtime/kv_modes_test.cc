// Every KV storage mode end to end on a small random model, so the model-layer paths (INT8
// scales, store-h rebuild, shared slot groups, early exit's latest rule, ring wrap) also run
// under ASan/UBSan: the cached decode equals the uncached one (each mode is batch-invariant),
// windowed long generation stays within its ring, and shared groups >= loops are the exact
// layout. Numerical agreement with the numpy reference is tests/python/test_kv_modes.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/test_file_builder.h"
#include "runtime/early_exit.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

class KvModesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ModelConfig c = testing::small_runtime_config();
    path_ = testing::write_random_model(file_, c, "F32", 5);
  }
  Engine engine(const std::string& mode) {
    EngineOptions o;
    o.kv_mode = mode;
    return Engine(path_, o);
  }
  static std::vector<int32_t> ids(int n) {
    std::mt19937_64 g(3);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = int32_t(g() % 31);
    return v;
  }
  testing::TempFile file_;
  std::string path_;
};

TEST_P(KvModesTest, CachedEqualsUncachedFullAndWindowed) {
  const Engine e = engine(GetParam());
  EXPECT_EQ(e.kv_mode(), GetParam());
  const auto seq = ids(90);
  for (int64_t window : {0, 9}) {
    const auto cached = e.stepwise_logits(seq, 5, 3, window);  // 90 > 9 + 64: the ring wraps
    // The uncached reference: every prefix in one forward over a full-length cache.
    std::vector<float> uncached, logits;
    for (int64_t end = 5; end <= 90; ++end) {
      model::KvCache kv(e.config(), 3, end, window, e.kv_dtype(), nullptr);
      e.model().forward(seq.data(), end, kv, model::LogitRows::Last, logits);
      uncached.insert(uncached.end(), logits.begin(), logits.end());
    }
    ASSERT_EQ(cached, uncached) << "window " << window;
  }
}

// The tokens generate() emitted are the greedy choices (first maximum) of logits[rows, V]
// from a teacher-forced run of the same mode over those tokens: row r predicts token
// prompt_len + r. Ties the decode path (batch_step) to the stepwise forward path.
void expect_greedy_chain(const std::vector<float>& logits, int64_t V, const std::vector<int32_t>& tokens,
                         size_t prompt_len, const std::string& what) {
  ASSERT_EQ(logits.size() % size_t(V), 0u);
  const size_t rows = logits.size() / size_t(V);
  ASSERT_GE(rows, tokens.size() - prompt_len) << what;
  for (size_t r = 0; r + prompt_len < tokens.size(); ++r) {
    const float* z = logits.data() + r * size_t(V);
    const auto best = int32_t(std::max_element(z, z + V) - z);
    ASSERT_EQ(tokens[prompt_len + r], best) << what << ": token " << r;
  }
}

TEST_P(KvModesTest, SharedGroupsEarlyExitAndLongWindowedGeneration) {
  const Engine e = engine(GetParam());
  const int64_t V = e.config().vocab_size;
  GenerateRequest r;
  r.prompt = ids(6);
  r.max_tokens = 100;
  r.loops = 4;
  r.stop_at_eos = false;
  r.cache_window = 8;
  const auto exact = generate(e, r).tokens;
  ASSERT_EQ(exact.size(), 106u);
  expect_greedy_chain(e.stepwise_logits(exact, 6, 4, 8), V, exact, 6, "exact, window 8");
  r.kv_loop_slots = 4;  // B >= loops: the exact layout
  EXPECT_EQ(generate(e, r).tokens, exact);
  for (int64_t b : {1, 2}) {
    r.kv_loop_slots = b;
    const auto shared = generate(e, r).tokens;
    ASSERT_EQ(shared.size(), 106u);
    expect_greedy_chain(e.stepwise_logits(shared, 6, 4, 8, b), V, shared, 6, "kv_loop_slots " + std::to_string(b));
  }
  // Early exit (the latest rule fills the skipped slots): generate's tokens and depths equal
  // the teacher-forced early-exit path's over the same tokens.
  r.kv_loop_slots = 0;
  r.cache_window = 0;
  r.early_exit.patience = 1;  // a probe that always fires: tokens stop after min_L
  r.early_exit.tau = 1e9;
  r.early_exit.min_L = 2;
  const auto ee = generate(e, r);
  ASSERT_EQ(ee.tokens.size(), 106u);
  EXPECT_LT(ee.mean_loops(), 4.0);
  const StepwiseExit tf = early_exit_stepwise(e, ee.tokens, 6, 4, r.early_exit);
  expect_greedy_chain(tf.logits, V, ee.tokens, 6, "early exit");
  EXPECT_EQ(std::vector<int64_t>(tf.depths.begin(), tf.depths.begin() + 100), ee.loops_per_token);
  r.early_exit = EarlyExitParams{};
  r.kv_loop_slots = -1;
  EXPECT_THROW(generate(e, r), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Modes, KvModesTest, ::testing::Values("fp32", "fp16", "int8", "h_fp16", "h_int8", "h_int4"));

}  // namespace
}  // namespace tinyloop::runtime
