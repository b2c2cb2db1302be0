// Depth-wise scoring and warm-start resume in C++, run under ASan/UBSan by the test command
// (the numerical checks against brute force and the numpy reference are in
// tests/python/test_depth_scoring.py and test_resume.py). What this adds: memory safety of
// LoopRun's paths (readouts between iterations, keep_rows, resuming a saved state on a
// cloned cache) and the thread-safety of one ResumeHandle serving many resumes.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "io/test_file_builder.h"
#include "runtime/depth_scoring.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/resume.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

ModelConfig config() {
  ModelConfig c = testing::small_runtime_config();
  c.inject = Inject::Add;
  c.loop_norm = true;
  return c;
}

class LoopDepthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::write_random_model(file_, config(), "F16", 4);
    engine_ = std::make_shared<Engine>(path_, EngineOptions{});
  }
  std::vector<int32_t> ids(int n) {
    std::mt19937_64 g(8);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(g() % 31);
    return v;
  }
  testing::TempFile file_;
  std::string path_;
  std::shared_ptr<Engine> engine_;
};

TEST_F(LoopDepthTest, LogitLensRowsAreScoresAtEachDepth) {
  const auto x = ids(9);
  const auto lens = score_logit_lens(*engine_, x, 4);
  ASSERT_EQ(lens.size(), 4u * 9u * 31u);
  for (int64_t l = 1; l <= 4; ++l) {
    const auto want = engine_->score(x, l);
    EXPECT_EQ(std::vector<float>(lens.begin() + (l - 1) * 9 * 31, lens.begin() + l * 9 * 31), want) << l;
  }
}

TEST_F(LoopDepthTest, TrajectoryShapes) {
  const auto tr = score_trajectory(*engine_, ids(5), 3);
  EXPECT_EQ(tr.embedding.size(), 5u * 16u);
  EXPECT_EQ(tr.pre.size(), 1u * 5u * 16u);
  EXPECT_EQ(tr.init, tr.pre);  // init_state "input": s0 = x, the last pre layer's output
  EXPECT_EQ(tr.iterations.size(), 3u * 5u * 16u);
}

TEST_F(LoopDepthTest, ConsistencyEscalatesAPrefix) {
  const auto x = ids(12);
  const auto c = score_with_consistency(*engine_, x, 1, 2, 5);
  const auto deep = engine_->score(x, 2), esc = engine_->score(x, 5);
  int escalated = 0;
  for (int64_t t = 0; t < 12; ++t) {
    const auto& want = c.escalated[t] ? esc : deep;
    escalated += c.escalated[t];
    for (int64_t v = 0; v < 31; ++v) EXPECT_NEAR(c.logits[t * 31 + v], want[t * 31 + v], 1e-4);
  }
  EXPECT_GT(escalated, 0);
  EXPECT_THROW(score_with_consistency(*engine_, x, 2, 1, std::nullopt), std::invalid_argument);
}

TEST_F(LoopDepthTest, UncertaintyIsZeroAtEqualDepths) {
  const auto u = score_with_uncertainty(*engine_, ids(6), 2, 2);
  for (double kl : u.kl) EXPECT_EQ(kl, 0.0);
  EXPECT_EQ(u.shallow_logits, u.deep_logits);
}

TEST_F(LoopDepthTest, ResumeEqualsGenerateFromManyThreads) {
  const auto prompt = ids(20);
  auto h = ResumeHandle::build(engine_, prompt, 1, 6, 10);
  EXPECT_EQ(h->max_loops(), 6);
  std::vector<std::vector<int32_t>> want(6), got(6);
  GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = 10;
  r.sampling.temperature = 0.8f;
  r.seed = 3;
  for (int64_t L = 1; L <= 6; ++L) {
    r.loops = L;
    want[L - 1] = generate(*engine_, r).tokens;
  }
  std::vector<std::thread> threads;
  for (int64_t L = 1; L <= 6; ++L)
    threads.emplace_back([&, L] {
      GenerateRequest q = r;
      q.prompt.clear();  // the handle's prompt is used
      q.loops = L;
      got[L - 1] = h->resume(q).tokens;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, want);
  GenerateRequest bad = r;
  bad.loops = 7;
  EXPECT_THROW(h->resume(bad), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::runtime
