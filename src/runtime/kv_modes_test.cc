// Every KV storage mode end to end on a small random model, so the model-layer paths (INT8
// scales, store-h rebuild, shared slot groups, early exit's latest rule, ring wrap) also run
// under ASan/UBSan: the cached decode equals the uncached one (each mode is batch-invariant),
// windowed long generation stays within its ring, and shared groups >= loops are the exact
// layout. Numerical agreement with the numpy reference is tests/python/test_kv_modes.py.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/test_file_builder.h"
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

TEST_P(KvModesTest, SharedGroupsEarlyExitAndLongWindowedGeneration) {
  const Engine e = engine(GetParam());
  GenerateRequest r;
  r.prompt = ids(6);
  r.max_tokens = 100;
  r.loops = 4;
  r.stop_at_eos = false;
  r.cache_window = 8;
  const auto exact = generate(e, r).tokens;
  r.kv_loop_slots = 4;  // B >= loops: the exact layout
  EXPECT_EQ(generate(e, r).tokens, exact);
  for (int64_t b : {1, 2}) {
    r.kv_loop_slots = b;
    const auto shared = generate(e, r);
    EXPECT_EQ(shared.tokens.size(), 106u);
    r.early_exit.patience = 1;  // a probe that always fires: tokens stop after min_L
    r.early_exit.tau = 1e9;
    r.early_exit.min_L = 2;
    const auto ee = generate(e, r);
    EXPECT_EQ(ee.tokens.size(), 106u);
    EXPECT_LT(ee.mean_loops(), 4.0);
    r.early_exit = EarlyExitParams{};
  }
  r.kv_loop_slots = -1;
  EXPECT_THROW(generate(e, r), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Modes, KvModesTest,
                         ::testing::Values("fp32", "fp16", "int8", "h_fp16", "h_int8", "h_int4"));

}  // namespace
}  // namespace tinyloop::runtime
