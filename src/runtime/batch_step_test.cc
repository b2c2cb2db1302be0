// run_step over many sequences: every part's logits, depth and K/V are bit-identical to the
// same part run alone, whatever its batch-mates do: prompt chunks mixed with decode rows,
// different loop depths in one step, early exit leaving the loop while others go on (both
// probes), a windowed sequence, a recurrence-shared one, every KV mode; and a one-part step
// equals LoopedModel::forward.
#include "runtime/batch_step.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/test_file_builder.h"
#include "runtime/engine.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

// One action of a sequence: n tokens at `loops`, optionally with early exit.
struct Action {
  std::vector<int32_t> tokens;
  int64_t loops;
  int ee;  // index into the exit settings, -1 = none
};

struct Script {
  int64_t loops, window, loop_slots;
  std::vector<Action> actions;
};

class BatchStepTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ModelConfig c = testing::small_runtime_config();
    c.default_loops = 4;
    path_ = testing::write_random_model(file_, c, "F32", 11);
    EngineOptions o;
    o.kv_mode = GetParam();
    engine_ = std::make_unique<Engine>(path_, o);
    // Exit settings: never stable, always stable (hidden-L2), margin probes that stop or not.
    exits_.resize(4);
    exits_[0].patience = 1, exits_[0].min_L = 1, exits_[0].tau = 0.0;
    exits_[1].patience = 1, exits_[1].min_L = 2, exits_[1].tau = 1e9;
    exits_[2].patience = 1, exits_[2].min_L = 1, exits_[2].logit_margin = 1e-9;
    exits_[3].patience = 2, exits_[3].min_L = 1, exits_[3].logit_margin = 1e9;
  }
  std::vector<Script> scripts() const {
    std::mt19937_64 g(7);
    auto toks = [&](int n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = int32_t(g() % 31);
      return v;
    };
    std::vector<Script> out;
    // {loops, window, loop_slots}, prompt chunks, decode rows with an exit setting each.
    const int64_t shapes[5][3] = {{4, 0, 0}, {2, 0, 0}, {5, 6, 0}, {3, 0, 1}, {1, 0, 0}};
    const std::vector<std::vector<int>> chunks = {{7}, {3, 4, 2}, {12, 1}, {5}, {2, 2}};
    for (int i = 0; i < 5; ++i) {
      Script s{shapes[i][0], shapes[i][1], shapes[i][2], {}};
      for (int n : chunks[size_t(i)]) s.actions.push_back({toks(n), s.loops, -1});
      for (int d = 0; d < 9 + i; ++d) s.actions.push_back({toks(1), s.loops, int((d + i) % 5) - 1});
      out.push_back(std::move(s));
    }
    return out;
  }
  std::unique_ptr<model::KvCache> cache(const Script& s) const {
    return engine_->new_cache(s.loops, 64, s.window, engine_->kv_dtype(), s.loop_slots);
  }
  StepPart part(model::KvCache* kv, const Action& a) const {
    StepPart p;
    p.kv = kv;
    p.tokens = a.tokens.data();
    p.n = int64_t(a.tokens.size());
    p.loops = a.loops;
    p.early_exit = a.ee >= 0 ? &exits_[size_t(a.ee)] : nullptr;
    p.want_logits = true;
    return p;
  }
  testing::TempFile file_;
  std::string path_;
  std::unique_ptr<Engine> engine_;
  std::vector<EarlyExitParams> exits_;
};

TEST_P(BatchStepTest, EveryPartEqualsItsSequenceAlone) {
  const auto sc = scripts();
  const auto& m = engine_->model();
  // Alone: each sequence's actions, one part per step.
  std::vector<std::vector<std::vector<float>>> want(sc.size());
  std::vector<std::vector<int64_t>> want_depth(sc.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    auto kv = cache(sc[i]);
    StepScratch scratch(m);
    for (const Action& a : sc[i].actions) {
      std::vector<StepPart> parts = {part(kv.get(), a)};
      run_step(m, parts, scratch);
      want[i].push_back(parts[0].logits);
      want_depth[i].push_back(parts[0].depth);
    }
  }
  // Together: step k runs every sequence's k-th action in one batch (sequences join late
  // and leave early: the scripts have different lengths; the order in the batch rotates).
  std::vector<std::unique_ptr<model::KvCache>> kvs;
  for (const Script& s : sc) kvs.push_back(cache(s));
  StepScratch scratch(m);
  size_t longest = 0;
  for (const Script& s : sc) longest = std::max(longest, s.actions.size());
  int exits = 0;
  for (size_t k = 0; k < longest + 2; ++k) {
    std::vector<StepPart> parts;
    std::vector<size_t> who;
    for (size_t j = 0; j < sc.size(); ++j) {
      const size_t i = (j + k) % sc.size();
      const size_t step = k >= i / 2 ? k - i / 2 : sc[i].actions.size();  // late joiners
      if (step >= sc[i].actions.size()) continue;
      parts.push_back(part(kvs[i].get(), sc[i].actions[step]));
      who.push_back(i);
    }
    if (parts.empty()) continue;
    run_step(m, parts, scratch);
    for (size_t p = 0; p < parts.size(); ++p) {
      const size_t i = who[p], step = k - i / 2;
      ASSERT_EQ(parts[p].depth, want_depth[i][step]) << "seq " << i << " step " << step;
      exits += parts[p].depth < sc[i].loops;
      ASSERT_EQ(parts[p].logits.size(), want[i][step].size());
      ASSERT_EQ(0, std::memcmp(parts[p].logits.data(), want[i][step].data(), parts[p].logits.size() * sizeof(float)))
          << "seq " << i << " step " << step;
    }
  }
  EXPECT_GT(exits, 5);  // the exit settings did stop tokens early
}

TEST_P(BatchStepTest, OnePartEqualsForward) {
  const auto& m = engine_->model();
  std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  auto a = engine_->new_cache(4, 32, 0, engine_->kv_dtype());
  auto b = engine_->new_cache(4, 32, 0, engine_->kv_dtype());
  std::vector<float> want;
  m.forward(prompt.data(), int64_t(prompt.size()), *a, model::LogitRows::Last, want, 4);
  StepScratch scratch(m);
  const Action whole{prompt, 4, -1};
  std::vector<StepPart> parts = {part(b.get(), whole)};
  run_step(m, parts, scratch);
  EXPECT_EQ(parts[0].logits, want);
  EXPECT_EQ(b->length(), a->length());
}

TEST_P(BatchStepTest, RefusesBadParts) {
  const auto& m = engine_->model();
  auto kv = engine_->new_cache(2, 4, 0, engine_->kv_dtype());
  StepScratch scratch(m);
  const Action deep{{1, 2}, 3, -1}, chunk_exit{{1, 2}, 2, 1}, long_one{{1, 2, 3, 4, 5}, 2, -1};
  std::vector<StepPart> parts = {part(kv.get(), deep)};  // loops > slots
  EXPECT_THROW(run_step(m, parts, scratch), std::invalid_argument);
  parts = {part(kv.get(), chunk_exit)};  // early exit on a chunk
  EXPECT_THROW(run_step(m, parts, scratch), std::invalid_argument);
  parts = {part(kv.get(), long_one)};  // past the capacity
  EXPECT_THROW(run_step(m, parts, scratch), std::logic_error);
  EXPECT_EQ(kv->length(), 0);
}

INSTANTIATE_TEST_SUITE_P(KvModes, BatchStepTest,
                         ::testing::Values("fp32", "fp16", "int8", "h_fp16", "h_int8", "h_int4"));

}  // namespace
}  // namespace tinyloop::runtime
