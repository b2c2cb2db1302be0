// Early exit's KV invariants (docs/loop-depth.md, the "latest" rule), run under ASan/UBSan by
// the test command. Token-level agreement with an independent numpy decode is tested from
// Python (tests/python/test_early_exit.py); here we check the cache itself:
//  - a token that stops after n < L iterations leaves, for every loop layer j, rows of
//    slots (n..L-1, j) equal to slot (n-1, j), and everything else exactly as a plain
//    forward at n loops would (same logits, same pre / loop / post rows);
//  - no other position's rows change;
//  - with no exit the step is bit-identical to a plain forward at L;
//  - all of this through a wrapping ring (cache_window).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "io/test_file_builder.h"
#include "ops/test_util.h"
#include "runtime/early_exit.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

using model::KvCache;
using model::LogitRows;

constexpr int64_t kLoops = 6;

ModelConfig config() {
  ModelConfig c = testing::small_runtime_config();
  c.default_loops = kLoops;
  c.max_seq_len = 256;
  c.norm_placement = NormPlacement::HuginnSandwich;
  c.inject = Inject::LinearConcat;
  c.init_state = InitState::Random;
  c.init_state_std = 0.5;
  c.init_state_seed = 3;
  return c;
}

// One position's K and V bytes in one slot.
std::vector<uint8_t> row(const KvCache& kv, int64_t slot, int64_t p) {
  return ops::testing::position_bytes(kv.view(slot), p);
}

class EarlyExitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::write_random_model(file_, config(), "F32", 11);
    engine_ = std::make_unique<Engine>(path_, EngineOptions{});
  }
  const model::LoopedModel& m() const { return engine_->model(); }
  std::vector<int32_t> ids(int n, uint64_t seed = 1) {
    std::mt19937_64 g(seed);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(g() % 31);
    return v;
  }
  // A cache holding a prefilled prompt of n tokens at kLoops.
  std::unique_ptr<KvCache> prefilled(int n, int64_t total, int64_t window = 0) {
    auto kv = engine_->new_cache(kLoops, total, window, ops::KvDType::F32);
    std::vector<float> logits;
    auto p = ids(n);
    m().forward(p.data(), n, *kv, LogitRows::Last, logits);
    return kv;
  }
  // Checks the latest rule at position p for a token that ran `done` iterations, and that
  // every slot not skipped matches `plain` (a copy that ran a plain forward at `done` loops).
  void expect_latest_rule(const KvCache& kv, const KvCache& plain, int64_t p, int64_t done) {
    const model::SlotLayout& s = kv.layout();
    for (int64_t slot = 0; slot < s.count(); ++slot) {
      for (int64_t q = kv.first_visible(p); q <= p; ++q) {
        const bool skipped = q == p && slot >= s.loop(done, 0) && slot < s.loop(kLoops, 0);
        if (!skipped) {
          EXPECT_EQ(row(kv, slot, q), row(plain, slot, q)) << "slot " << slot << " pos " << q;
        }
      }
    }
    for (int64_t j = 0; j < s.n_loop; ++j)
      for (int64_t i = done; i < kLoops; ++i)
        EXPECT_EQ(row(kv, s.loop(i, j), p), row(kv, s.loop(done - 1, j), p)) << "iteration " << i;
  }
  testing::TempFile file_;
  std::string path_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EarlyExitTest, ProbeSchedule) {
  EarlyExitParams p;
  p.patience = 1;
  p.min_L = 3;
  p.peek_every = 2;
  std::vector<int64_t> probed;
  for (int64_t n = 1; n <= 9; ++n)
    if (p.probes_at(n, 8)) probed.push_back(n);
  EXPECT_EQ(probed, (std::vector<int64_t>{3, 5, 7}));  // never at n == loops
}

TEST_F(EarlyExitTest, ValidateNamesEachArgument) {
  auto expect_bad = [](EarlyExitParams p, const char* name) {
    try {
      validate(p);
      ADD_FAILURE() << "no error for " << name;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  EarlyExitParams ok;
  EXPECT_NO_THROW(validate(ok));
  EarlyExitParams p = ok;
  p.patience = -1;
  expect_bad(p, "early_exit_patience");
  p = ok;
  p.min_L = 0;
  expect_bad(p, "early_exit_min_L");
  p = ok;
  p.peek_every = 0;
  expect_bad(p, "early_exit_peek_every");
  p = ok;
  p.tau = -1e-3;
  expect_bad(p, "early_exit_tau");
  p = ok;
  p.tau = NAN;
  expect_bad(p, "early_exit_tau");
  p = ok;
  p.logit_margin = -0.5;
  expect_bad(p, "early_exit_logit_margin");
}

TEST_F(EarlyExitTest, NoExitIsBitIdenticalToPlainForward) {
  auto kv = prefilled(7, 20);
  auto plain = kv->clone();
  EarlyExitParams p;
  p.patience = 1;
  p.min_L = 1;
  p.tau = 0.0;  // rho < 0 never holds: every probe runs, none stops
  std::vector<float> got, want;
  EXPECT_EQ(decode_step_early_exit(m(), *kv, 5, kLoops, p, got), kLoops);
  int32_t tok = 5;
  m().forward(&tok, 1, *plain, LogitRows::Last, want, kLoops);
  EXPECT_EQ(got, want);
  EXPECT_EQ(kv->length(), plain->length());
  for (int64_t slot = 0; slot < kv->layout().count(); ++slot)
    for (int64_t q = 0; q < kv->length(); ++q) ASSERT_EQ(row(*kv, slot, q), row(*plain, slot, q));
}

TEST_F(EarlyExitTest, HiddenModeStopFillsSkippedSlotsFromLastIteration) {
  for (int64_t min_L : {1, 2, 4}) {
    auto kv = prefilled(7, 20);
    auto plain = kv->clone();
    EarlyExitParams p;
    p.patience = 1;
    p.min_L = min_L;
    p.tau = 1e9;  // every probe is stable: stop at the first one
    std::vector<float> got, want;
    const int64_t pos = kv->length();
    ASSERT_EQ(decode_step_early_exit(m(), *kv, 9, kLoops, p, got), min_L);
    int32_t tok = 9;
    m().forward(&tok, 1, *plain, LogitRows::Last, want, min_L);
    EXPECT_EQ(got, want) << "logits are those of a forward at the exit depth";
    EXPECT_EQ(kv->length(), pos + 1);
    expect_latest_rule(*kv, *plain, pos, min_L);
  }
}

TEST_F(EarlyExitTest, PatienceCountsConsecutiveStableProbes) {
  auto kv = prefilled(5, 20);
  EarlyExitParams p;
  p.patience = 3;
  p.min_L = 2;
  p.peek_every = 1;
  p.tau = 1e9;
  std::vector<float> logits;
  EXPECT_EQ(decode_step_early_exit(m(), *kv, 1, kLoops, p, logits), 4);  // probes at 2, 3, 4
  p.peek_every = 2;
  EXPECT_EQ(decode_step_early_exit(m(), *kv, 2, kLoops, p, logits), kLoops);  // probes 2, 4 only
}

TEST_F(EarlyExitTest, MarginModeStopReusesTheProbeReadout) {
  auto kv = prefilled(6, 20);
  auto plain = kv->clone();
  EarlyExitParams p;
  p.patience = 1;
  p.min_L = 3;
  p.logit_margin = 1e-30;  // any non-tied top-2 counts as stable
  std::vector<float> got, want;
  const int64_t pos = kv->length();
  ASSERT_EQ(decode_step_early_exit(m(), *kv, 4, kLoops, p, got), 3);
  int32_t tok = 4;
  m().forward(&tok, 1, *plain, LogitRows::Last, want, 3);
  EXPECT_EQ(got, want);
  expect_latest_rule(*kv, *plain, pos, 3);  // post slots included: written by the probe
}

TEST_F(EarlyExitTest, LaterDeepTokenReadsTheCopiedRows) {
  // After a shallow token, a full-depth token attends to the copied rows: it equals a cache
  // built the same way by hand (forward at the exit depth + copy_row from iteration 1), and
  // differs from one whose skipped rows came from another iteration (iteration 0).
  auto kv = prefilled(6, 20);
  auto manual = kv->clone();
  auto wrong = kv->clone();
  EarlyExitParams shallow;
  shallow.patience = 1;
  shallow.min_L = 2;
  shallow.tau = 1e9;
  std::vector<float> a, b;
  const int64_t pos = kv->length();
  ASSERT_EQ(decode_step_early_exit(m(), *kv, 7, kLoops, shallow, a), 2);
  int32_t tok = 7;
  m().forward(&tok, 1, *manual, LogitRows::Last, b, 2);
  m().forward(&tok, 1, *wrong, LogitRows::Last, b, 2);
  const model::SlotLayout& s = manual->layout();
  for (int64_t j = 0; j < s.n_loop; ++j) {
    for (int64_t i = 2; i < kLoops; ++i) {
      manual->copy_row(s.loop(1, j), s.loop(i, j), pos);
      wrong->copy_row(s.loop(0, j), s.loop(i, j), pos);
    }
  }
  std::vector<float> c;
  tok = 8;
  m().forward(&tok, 1, *kv, LogitRows::Last, a, kLoops);
  m().forward(&tok, 1, *manual, LogitRows::Last, b, kLoops);
  m().forward(&tok, 1, *wrong, LogitRows::Last, c, kLoops);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(EarlyExitTest, WindowKeepsTheRuleWhileBlocksAreReleased) {
  const int64_t window = 4, steps = 120;  // far past window + kWindowSlack: blocks released
  auto kv = prefilled(3, 3 + steps, window);
  EarlyExitParams p;
  p.patience = 1;
  p.min_L = 1;
  p.peek_every = 2;
  std::vector<float> logits;
  std::mt19937_64 g(2);
  for (int64_t t = 0; t < steps; ++t) {
    p.tau = (t % 3 == 0) ? 0.0 : 1e9;  // mix full-depth and stopped tokens
    auto plain = kv->clone();
    const int64_t pos = kv->length();
    const int32_t tok = int32_t(g() % 31);
    const int64_t done = decode_step_early_exit(m(), *kv, tok, kLoops, p, logits);
    ASSERT_EQ(done, p.tau == 0.0 ? kLoops : 1);
    std::vector<float> want;
    int32_t tk = tok;
    m().forward(&tk, 1, *plain, LogitRows::Last, want, done);
    ASSERT_EQ(logits, want);
    expect_latest_rule(*kv, *plain, pos, done);
    if (HasFailure()) return;
  }
}

TEST_F(EarlyExitTest, GenerateReportsDepthPerToken) {
  GenerateRequest r;
  r.prompt = ids(5);
  r.max_tokens = 12;
  r.stop_at_eos = false;
  const auto plain = generate(*engine_, r);
  EXPECT_EQ(plain.loops_per_token, std::vector<int64_t>(12, kLoops));
  r.early_exit.patience = 1;
  r.early_exit.min_L = 2;
  r.early_exit.tau = 0.0;  // enabled, never stops: same tokens as plain
  EXPECT_EQ(generate(*engine_, r).tokens, plain.tokens);
  r.early_exit.tau = 1e9;  // stops at min_L on every decode step; the prefill never does
  const auto fast = generate(*engine_, r);
  std::vector<int64_t> want(12, 2);
  want[0] = kLoops;
  EXPECT_EQ(fast.loops_per_token, want);
  EXPECT_DOUBLE_EQ(fast.mean_loops(), (kLoops + 11 * 2) / 12.0);
  r.early_exit.min_L = 0;
  EXPECT_THROW(generate(*engine_, r), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::runtime
