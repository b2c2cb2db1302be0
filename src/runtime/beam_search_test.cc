// Beam search: the core on hand-made log-probabilities (values worked out by hand in the
// comments, an exhaustive enumeration written separately here, HF divergences spelled out),
// then the model glue (shared prompt KV + per-beam tails) against the core driven by an
// oracle that scores every beam's whole sequence with Engine::score_last.
#include "runtime/beam_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "io/test_file_builder.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

using Seq = std::vector<int32_t>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A BeamModel whose next-token log-probs are a function of the beam's tokens.
class FnModel : public BeamModel {
 public:
  using Fn = std::function<std::vector<double>(const Seq&)>;  // -> log-probs [V]
  FnModel(int64_t V, Fn fn, std::vector<int32_t> enders) : V_(V), fn_(std::move(fn)), enders_(std::move(enders)) {}
  void log_probs(int64_t n, std::vector<double>& out) override {
    EXPECT_EQ(n, int64_t(beams_.size()));
    for (int64_t b = 0; b < n; ++b) {
      const auto row = fn_(beams_[b]);
      std::copy(row.begin(), row.end(), out.begin() + b * V_);
    }
  }
  bool ends(int64_t b, int32_t token) override {
    (void)b;
    return std::find(enders_.begin(), enders_.end(), token) != enders_.end();
  }
  void select(const std::vector<int64_t>& parent, const std::vector<int32_t>& token) override {
    std::vector<Seq> next;
    for (size_t i = 0; i < parent.size(); ++i) {
      next.push_back(beams_[parent[i]]);
      next.back().push_back(token[i]);
    }
    beams_ = next;
  }

 private:
  int64_t V_;
  Fn fn_;
  std::vector<int32_t> enders_;
  std::vector<Seq> beams_{Seq{}};
};

// Probabilities of a table keyed by the prefix, as log-probs (0 -> -inf).
FnModel::Fn table(std::map<Seq, std::vector<double>> probs) {
  return [probs](const Seq& s) {
    std::vector<double> lp;
    for (double p : probs.at(s)) lp.push_back(p > 0 ? std::log(p) : kNegInf);
    return lp;
  };
}

// Random log-softmax rows, a deterministic function of the prefix.
FnModel::Fn random_rows(int64_t V, uint64_t seed) {
  return [V, seed](const Seq& s) {
    uint64_t h = seed;
    for (int32_t t : s) h = h * 1000003u + uint64_t(t) + 17;
    std::mt19937_64 g(h);
    std::normal_distribution<double> n(0.0, 2.0);
    std::vector<double> x(V);
    double m = -1e300, sum = 0;
    for (auto& v : x) m = std::max(m, v = n(g));
    for (double v : x) sum += std::exp(v - m);
    for (auto& v : x) v = v - m - std::log(sum);
    return x;
  };
}

BeamSearchResult run(FnModel::Fn fn, int64_t V, std::vector<int32_t> enders, int64_t max_tokens, int64_t B, double lp,
                     bool early) {
  FnModel m(V, std::move(fn), std::move(enders));
  return beam_search_core(m, V, max_tokens, BeamParams{B, lp, early});
}

// Independent exhaustive search: every sequence that ends (an ender token) at or before
// max_tokens, or runs to max_tokens; best score, ties to the first in enumeration order.
void exhaustive(const FnModel::Fn& fn, int64_t V, int32_t eos, int64_t max_tokens, double lp, Seq& prefix, double logp,
                Seq& best, double& best_score) {
  const auto row = fn(prefix);
  for (int32_t v = 0; v < V; ++v) {
    prefix.push_back(v);
    const double l = logp + row[v];
    const auto n = int64_t(prefix.size());
    if (v == eos || n == max_tokens) {
      const double s = l / std::pow(double(n), lp);
      if (s > best_score) {
        best_score = s;
        best = prefix;
      }
    } else {
      exhaustive(fn, V, eos, max_tokens, lp, prefix, l, best, best_score);
    }
    prefix.pop_back();
  }
}

TEST(BeamCore, WideBeamEqualsExhaustiveSearch) {
  const int64_t V = 4, max_tokens = 4;
  for (uint64_t seed : {1, 2, 3, 4, 5})
    for (double lp : {-1.0, 0.0, 0.5, 1.0, 2.0}) {
      const auto fn = random_rows(V, seed);
      Seq prefix, best;
      double best_score = kNegInf;
      exhaustive(fn, V, /*eos=*/0, max_tokens, lp, prefix, 0.0, best, best_score);
      // 4^3 = 64 live hypotheses at most: beam 64 keeps them all.
      const auto r = run(fn, V, {0}, max_tokens, 64, lp, /*early=*/false);
      EXPECT_EQ(r.tokens, best) << "seed " << seed << " lp " << lp;
      EXPECT_NEAR(r.score, best_score, 1e-12);
    }
}

TEST(BeamCore, LengthPenaltyChoosesBetweenShortAndLong) {
  // Tokens: 0 = EOS, 1 = a. Root: EOS 0.4, a 0.6; after a: EOS 0.5, a 0.5; after aa: EOS 1.
  // [EOS]: log 0.4 = -0.916.  [a EOS]: log 0.3 = -1.204, per token -0.602.
  // [a a EOS]: log 0.3 = -1.204, / 3 = -0.401.
  auto fn = table({{{}, {0.4, 0.6}}, {{1}, {0.5, 0.5}}, {{1, 1}, {1.0, 0.0}}});
  EXPECT_EQ(run(fn, 2, {0}, 3, 2, 0.0, false).tokens, (Seq{0}));  // -0.916 wins
  EXPECT_EQ(run(fn, 2, {0}, 3, 2, 1.0, false).tokens, (Seq{1, 1, 0}));  // -0.401 wins
  // lp = 0.5: [EOS] -0.916, [a EOS] -1.204/1.414 = -0.851, [a a EOS] -1.204/1.732 = -0.695.
  EXPECT_EQ(run(fn, 2, {0}, 3, 2, 0.5, false).tokens, (Seq{1, 1, 0}));
  // lp = 0.2: -0.916 vs -1.204/1.149 = -1.048 vs -1.204/1.246 = -0.966: [EOS] wins.
  EXPECT_EQ(run(fn, 2, {0}, 3, 2, 0.2, false).tokens, (Seq{0}));
  const auto r = run(fn, 2, {0}, 3, 2, 1.0, false);
  EXPECT_NEAR(r.log_prob, std::log(0.3), 1e-12);
  EXPECT_NEAR(r.score, std::log(0.3) / 3, 1e-12);
}

TEST(BeamCore, EarlyStoppingFollowsTheSpecNotHF) {
  // Tokens: 0 = EOS, 1 = a, 2 = b. Root: EOS 0.5, a 0.3, b 0.2; after a or b: EOS 1.
  // lp = 1. Step 1 finishes [EOS] (score -0.693); live a: -1.204, b: -1.609.
  auto fn = table({{{}, {0.5, 0.3, 0.2}}, {{1}, {1.0, 0, 0}}, {{2}, {1.0, 0, 0}}});
  // Spec early_stopping=True: [EOS] already ranks above every live beam -> return it.
  const auto early = run(fn, 3, {0}, 4, 2, 1.0, true);
  EXPECT_EQ(early.tokens, (Seq{0}));
  EXPECT_EQ(early.steps, 1);
  // early_stopping=False runs on: [a EOS] = -1.204 / 2 = -0.602 beats -0.693.
  // HF early_stopping=True would also return [a EOS] here: it waits for beam_size (2)
  // finished hypotheses, [EOS] and [a EOS], and ranks them -- the documented difference.
  const auto full = run(fn, 3, {0}, 4, 2, 1.0, false);
  EXPECT_EQ(full.tokens, (Seq{1, 0}));
  EXPECT_EQ(full.steps, 2);  // no live beam left after step 2
}

TEST(BeamCore, WalkStopsOnceBeamSizeSurvivorsAreFound) {
  // HF rule: offers are walked best first until beam_size survivors exist, so an ending
  // offer below them is never finished. (HF also drops an ending offer ranked >= beam_size
  // when it is reached; that never changes the single best answer: a better ending offer
  // of the same length is then already finished.) B = 2. Root: a 0.45, b 0.35, EOS 0.2.
  // After a / b: only c (prob 1), then max_tokens = 2 ends them: [a c] = log 0.45 = -0.799.
  // lp = -3 favours short outputs: [EOS] would score -1.609, [a c] -0.799 * 8 = -6.39, so
  // [EOS] would win had it been kept.
  auto fn = table({{{}, {0.2, 0.45, 0.35, 0}}, {{1}, {0, 0, 0, 1.0}}, {{2}, {0, 0, 0, 1.0}}});
  EXPECT_EQ(run(fn, 4, {0}, 2, 2, -3.0, false).tokens, (Seq{1, 3}));
  // B = 3: EOS (rank 2) is reached before the third survivor, finished, and wins.
  EXPECT_EQ(run(fn, 4, {0}, 2, 3, -3.0, false).tokens, (Seq{0}));
}

TEST(BeamCore, NoEndersRunsToMaxTokensAndMaskedRowsEndABeam) {
  // Without enders (stop_at_eos=False) the answer is the best full-length sequence.
  const int64_t V = 3;
  const auto fn = random_rows(V, 9);
  Seq prefix, best;
  double best_score = kNegInf;
  exhaustive(fn, V, /*eos=*/-1, 3, 1.0, prefix, 0.0, best, best_score);
  const auto r = run(fn, V, {}, 3, 9, 1.0, true);
  EXPECT_EQ(r.tokens, best);
  EXPECT_EQ(r.tokens.size(), 3u);
  // A row with nothing allowed ends that beam as it is (grammar: full match, no EOS).
  auto fn2 =
      table({{{}, {0.0, 0.7, 0.3}}, {{1}, {0, 0, 0}}, {{2}, {0, 0.5, 0.5}}, {{2, 1}, {0, 0, 0}}, {{2, 2}, {0, 0, 0}}});
  EXPECT_EQ(run(fn2, 3, {}, 5, 2, 0.0, false).tokens, (Seq{1}));
}

TEST(BeamCore, DeterministicTiesGoToLowerIds) {
  // Uniform rows: every sequence ties; the winner is the lowest-id one, every run.
  auto fn = [](const Seq&) { return std::vector<double>(3, std::log(1.0 / 3)); };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(run(fn, 3, {}, 3, 4, 1.0, true).tokens, (Seq{0, 0, 0}));
}

TEST(BeamCore, Validation) {
  EXPECT_THROW(validate(BeamParams{-1, 1.0, true}), std::invalid_argument);
  EXPECT_THROW(validate(BeamParams{kMaxBeamSize + 1, 1.0, true}), std::invalid_argument);
  EXPECT_THROW(validate(BeamParams{2, std::nan(""), true}), std::invalid_argument);
  EXPECT_THROW(validate(BeamParams{2, INFINITY, true}), std::invalid_argument);
  EXPECT_NO_THROW(validate(BeamParams{1, std::nan(""), true}));  // ignored without beams
  try {
    validate(BeamParams{-3, 1.0, true});
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("beam_size"), std::string::npos);
  }
}

// ---- the glue on a real (random) model ----

class BeamModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelConfig c = testing::small_runtime_config();
    c.inject = Inject::Add;
    c.eos_ids = {3};
    path_ = testing::write_random_model(file_, c, "F32", 5);
    EngineOptions o;
    o.kv_mode = "fp32";
    engine_ = std::make_shared<Engine>(path_, o);
  }
  testing::TempFile file_;
  std::string path_;
  std::shared_ptr<Engine> engine_;
};

// The oracle: each beam's whole sequence through score_last (one fresh forward, no tails).
class ScoreOracle : public BeamModel {
 public:
  ScoreOracle(const Engine& e, Seq prompt, double penalty) : e_(e), prompt_(std::move(prompt)), pen_(penalty) {}
  void log_probs(int64_t n, std::vector<double>& out) override {
    const int64_t V = e_.config().vocab_size;
    for (int64_t b = 0; b < n; ++b) {
      Seq s = prompt_;
      s.insert(s.end(), beams_[b].begin(), beams_[b].end());
      auto logits = e_.score_last(s, std::nullopt);
      std::vector<bool> seen(V, false);
      for (int32_t t : s) seen[t] = true;
      for (int64_t v = 0; v < V; ++v)
        if (seen[v]) logits[v] = logits[v] > 0 ? logits[v] / float(pen_) : logits[v] * float(pen_);
      double m = -1e300, sum = 0;
      for (float x : logits) m = std::max(m, double(x));
      for (float x : logits) sum += std::exp(double(x) - m);
      for (int64_t v = 0; v < V; ++v) out[b * V + v] = double(logits[v]) - m - std::log(sum);
    }
  }
  bool ends(int64_t, int32_t token) override { return token == 3; }
  void select(const std::vector<int64_t>& parent, const std::vector<int32_t>& token) override {
    std::vector<Seq> next;
    for (size_t i = 0; i < parent.size(); ++i) {
      next.push_back(beams_[parent[i]]);
      next.back().push_back(token[i]);
    }
    beams_ = next;
  }

 private:
  const Engine& e_;
  Seq prompt_;
  double pen_;
  std::vector<Seq> beams_{Seq{}};
};

TEST_F(BeamModelTest, SharedPrefixTailsMatchWholeSequenceScoring) {
  const Seq prompt = {1, 5, 9, 2, 7, 7, 4};
  for (int64_t B : {2, 3, 5})
    for (double pen : {1.0, 1.3}) {
      GenerateRequest req;
      req.prompt = prompt;
      req.max_tokens = 6;
      req.sampling.repetition_penalty = float(pen);
      BeamParams p{B, 0.7, false};
      BeamMemory mem;
      const auto got = beam_generate(*engine_, req, p, {}, &mem);
      ScoreOracle oracle(*engine_, prompt, pen);
      const auto want = beam_search_core(oracle, engine_->config().vocab_size, req.max_tokens, p);
      Seq want_tokens = prompt;
      want_tokens.insert(want_tokens.end(), want.tokens.begin(), want.tokens.end());
      EXPECT_EQ(got.tokens, want_tokens) << "beam " << B << " penalty " << pen;
      // Memory: one prompt prefix plus at most B tails of max_tokens - 1 rows.
      EXPECT_LE(mem.peak_tails, B);
      EXPECT_EQ(mem.peak_bytes, mem.prefix_bytes + mem.peak_tails * mem.tail_bytes);
      EXPECT_LT(mem.peak_bytes, mem.naive_bytes);
      EXPECT_EQ(mem.tail_bytes * int64_t(prompt.size()), mem.prefix_bytes * (req.max_tokens - 1));
    }
}

TEST_F(BeamModelTest, AssignFromMakesACacheThatDecodesIdentically) {
  // Two caches over one prompt prefix hold different tokens; after b.assign_from(a) (b
  // shares a's blocks) the next decode step gives bit-identical logits on both, and a's
  // own next step is unchanged by b's (copy-on-write of the shared partial block).
  const auto& m = engine_->model();
  const Seq prompt = {1, 5, 9, 2, 7};
  const int64_t L = 3;
  auto pre = engine_->new_cache(L, int64_t(prompt.size()), 0, engine_->kv_dtype(), 0, 4);
  std::vector<float> la, lb;  // [V]
  m.forward(prompt.data(), int64_t(prompt.size()), *pre, model::LogitRows::Last, la, L);
  auto a = engine_->new_cache(L, 11, 0, engine_->kv_dtype(), 0, 4);
  auto b = engine_->new_cache(L, 11, 0, engine_->kv_dtype(), 0, 4);
  a->share_prefix(*pre);
  b->share_prefix(*pre);
  const Seq ta = {4, 8, 12, 6}, tb = {30, 0};
  m.forward(ta.data(), 4, *a, model::LogitRows::Last, la, L);
  m.forward(tb.data(), 2, *b, model::LogitRows::Last, lb, L);
  b->assign_from(*a);
  EXPECT_EQ(b->length(), a->length());
  const int32_t next = 17, other = 3;
  m.forward(&other, 1, *b, model::LogitRows::Last, lb, L);  // b writes first: a must not see it
  b->truncate(a->length());
  m.forward(&next, 1, *a, model::LogitRows::Last, la, L);
  m.forward(&next, 1, *b, model::LogitRows::Last, lb, L);
  EXPECT_EQ(la, lb);
  // A cache of another shape is refused.
  auto deeper = engine_->new_cache(L + 1, 11, 0, engine_->kv_dtype(), 0, 4);
  EXPECT_THROW(deeper->assign_from(*a), std::logic_error);
}

TEST_F(BeamModelTest, EarlyExitAndWindowRunPerBeam) {
  GenerateRequest req;
  req.prompt = {1, 5, 9, 2};
  req.max_tokens = 5;
  req.early_exit.patience = 1;
  req.early_exit.min_L = 1;
  req.early_exit.tau = 10.0;  // always stable: every decode stops after one iteration
  const auto r = beam_generate(*engine_, req, BeamParams{3, 1.0, false});
  ASSERT_GE(r.loops_per_token.size(), 1u);
  EXPECT_EQ(r.loops_per_token[0], 3);  // the prefill runs every loop
  for (size_t i = 1; i < r.loops_per_token.size(); ++i) EXPECT_EQ(r.loops_per_token[i], 1);
  req.early_exit = {};
  req.cache_window = 3;
  const auto w = beam_generate(*engine_, req, BeamParams{3, 1.0, false});
  EXPECT_GE(w.tokens_emitted, 1);
}

TEST_F(BeamModelTest, ErrorsAreNamed) {
  GenerateRequest req;
  req.prompt = {1, 2};
  req.max_tokens = 0;
  EXPECT_THROW(beam_generate(*engine_, req, BeamParams{2, 1.0, true}), std::invalid_argument);
  req.max_tokens = 4;
  req.sampling.temperature = 0.9f;
  req.sampling.top_k = 0;  // ignored by beam search, so not an error
  EXPECT_NO_THROW(beam_generate(*engine_, req, BeamParams{2, 1.0, true}));
  EXPECT_THROW(beam_generate(*engine_, req, BeamParams{2, NAN, true}), std::invalid_argument);
}

}  // namespace
}  // namespace tinyloop::runtime
