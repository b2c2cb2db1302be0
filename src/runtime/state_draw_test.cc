// The per-request initial-state draw (runtime/state_draw.h) and its use by the model: a
// batch of sequences with different draws gives each row what it gets alone, a seeded call
// reproduces, an unseeded per-call draw differs each time, init_scale 0 is the zero state.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>

#include "model/init_state.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/state_draw.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

ModelConfig random_state_config(bool per_call) {
  ModelConfig c = testing::small_runtime_config();
  c.inject = Inject::LinearConcat;
  c.init_state = InitState::Random;
  c.init_state_std = 0.5;
  c.init_state_seed = 99;
  c.init_state_per_call = per_call;
  return c;
}

TEST(StateDraw, FixedSeedModelsKeepTheFilesSeed) {
  const ModelConfig c = random_state_config(false);
  EXPECT_EQ(resolve_state_draw(c, 5, 1.0).seed, 99u);
  EXPECT_EQ(resolve_state_draw(c, std::nullopt, 0.5).seed, 99u);
  EXPECT_EQ(resolve_state_draw(c, std::nullopt, 0.5).scale, 0.5);
}

TEST(StateDraw, PerCallModelsDrawFromTheCallsSeed) {
  const ModelConfig c = random_state_config(true);
  EXPECT_EQ(resolve_state_draw(c, 5, 1.0).seed, resolve_state_draw(c, 5, 1.0).seed);
  EXPECT_NE(resolve_state_draw(c, 5, 1.0).seed, resolve_state_draw(c, 6, 1.0).seed);
  EXPECT_NE(resolve_state_draw(c, 5, 1.0).seed, 5u);  // a stream apart from the sampler's
  // Without a seed: fresh entropy (equal only with probability 2^-64).
  EXPECT_NE(resolve_state_draw(c, std::nullopt, 1.0).seed, resolve_state_draw(c, std::nullopt, 1.0).seed);
}

TEST(StateDraw, InitScaleIsChecked) {
  const ModelConfig c = random_state_config(true);
  EXPECT_NO_THROW(validate_init_scale(c, 0.0));
  EXPECT_NO_THROW(validate_init_scale(c, 2.5));
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity(), 2e6})
    EXPECT_THROW(validate_init_scale(c, bad), std::invalid_argument) << bad;
  ModelConfig input = c;
  input.init_state = InitState::Input;
  EXPECT_NO_THROW(validate_init_scale(input, 1.0));
  EXPECT_THROW(validate_init_scale(input, 0.5), std::invalid_argument);
}

class StateDrawModel : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<Engine>(testing::write_random_model(file_, random_state_config(true), "F32", 3),
                                       EngineOptions{});
  }
  testing::TempFile file_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(StateDrawModel, BatchRowsUseTheirOwnSequencesDraw) {
  const model::LoopedModel& m = engine_->model();
  const int64_t D = m.config().dim;
  const int64_t pos[3] = {0, 1, 2};
  auto a = engine_->new_cache(2, 8, 0, ops::KvDType::F32);
  auto b = engine_->new_cache(2, 8, 0, ops::KvDType::F32);
  a->set_state_draw({11, 1.0});
  b->set_state_draw({12, 0.0});
  std::vector<float> x(3 * D, 0.25f), s(3 * D);  // [3, D]
  model::RowBatch both{pos, 3, {{a.get(), 0, 2}, {b.get(), 2, 1}}};
  m.initial_state(x.data(), both, s.data());
  std::vector<float> want(2 * D);  // [2, D] the first group's rows alone
  model::random_initial_state(11, pos, 2, D, m.config().init_state_std, want.data());
  for (int64_t i = 0; i < 2 * D; ++i) EXPECT_EQ(s[i], want[i]);
  for (int64_t i = 2 * D; i < 3 * D; ++i) EXPECT_EQ(s[i], 0.0f);  // scale 0: zeros
}

TEST_F(StateDrawModel, SeededGenerateReproducesAndUnseededVaries) {
  GenerateRequest r;
  r.prompt = {1, 2, 3, 4};
  r.max_tokens = 12;
  r.stop_at_eos = false;
  r.seed = 7;
  const auto g1 = generate(*engine_, r), g2 = generate(*engine_, r);
  EXPECT_EQ(g1.tokens, g2.tokens);
  r.init_scale = 0.0;  // the zero state: no randomness left, with or without a seed
  const auto z1 = generate(*engine_, r);
  r.seed.reset();
  EXPECT_EQ(generate(*engine_, r).tokens, z1.tokens);
}

}  // namespace
}  // namespace tinyloop::runtime
