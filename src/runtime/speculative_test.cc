// Self-speculative decoding (docs/speculative.md), run under ASan/UBSan by the test command:
//  - SpecAttention's tree attention: each node's output equals ops::attention over a cache
//    holding the past and the node's own path (bit for bit), for F16 and F32 storage;
//  - the tree forward: verify logits of every tree node, and the draft logits, equal a
//    sequential one-token decode of that path at verify_loops / draft_loops (bit for bit),
//    and after commit() the cache continues exactly as the sequential one;
//  - chain and tree generation, greedy, equal generate(loops = verify_loops), ring included;
//  - the acceptance rules reproduce the target distribution (Monte Carlo).
// Statistical tests of the whole sampler path and the many-model sweeps are in
// tests/python/test_speculative.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

#include "io/test_file_builder.h"
#include "model/spec_attention.h"
#include "model/spec_forward.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/spec_sampling.h"
#include "runtime/speculative.h"
#include "runtime/test_random_model.h"
#include "runtime/tree_speculative.h"

namespace tinyloop::runtime {
namespace {

using model::KvCache;
using model::LogitRows;

ModelConfig config() {
  ModelConfig c = testing::small_runtime_config();
  c.vocab_size = 29;
  c.default_loops = 4;
  c.max_seq_len = 256;
  c.norm_placement = NormPlacement::HuginnSandwich;
  c.inject = Inject::LinearConcat;
  c.init_state = InitState::Random;
  c.init_state_std = 0.5;
  c.init_state_seed = 3;
  return c;
}

class SpecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_unique<Engine>(testing::write_random_model(file_, config(), "F16", 11), EngineOptions{});
  }
  const model::LoopedModel& m() const { return engine_->model(); }

  // Logits [V] after each of ids[prefill..] decoded one token at a time at `loops`, after a
  // prefill of ids[0..prefill): rows for ids[prefill - 1 + r], r = 0..
  std::vector<std::vector<float>> sequential(const std::vector<int32_t>& ids, int64_t prefill, int64_t loops,
                                             int64_t window = 0) {
    KvCache kv(config(), loops, int64_t(ids.size()), window, engine_->kv_dtype(), nullptr);
    std::vector<std::vector<float>> out(1);
    m().forward(ids.data(), prefill, kv, LogitRows::Last, out[0]);
    for (size_t t = size_t(prefill); t < ids.size(); ++t) {
      out.emplace_back();
      m().forward(&ids[t], 1, kv, LogitRows::Last, out.back());
    }
    return out;
  }

  testing::TempFile file_;
  std::unique_ptr<Engine> engine_;
};

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, sizeof(float) * size_t(n)) == 0; }

// --- the tree attention itself ---------------------------------------------------------

class TreeAttentionTest : public ::testing::TestWithParam<ops::KvDType> {};

TEST_P(TreeAttentionTest, EachNodeSeesPastRootAndItsPath) {
  ModelConfig c = config();
  const int64_t kw = c.n_kv_heads * c.head_dim, qw = c.n_heads * c.head_dim;
  const int64_t past = 9, base = past, branches = 3, depth = 4, window = 0;
  KvCache kv(c, 2, 32, window, GetParam(), nullptr);
  const int64_t slot = kv.layout().loop(1, 0);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rnd = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(gen);
    return v;
  };
  // The past: positions 0..past-1 in the slot.
  {
    std::vector<int64_t> pos(past);
    for (int64_t p = 0; p < past; ++p) pos[p] = p;
    auto k = rnd(past * kw), v = rnd(past * kw);
    kv.write(slot, k.data(), v.data(), pos.data(), past);
  }
  kv.advance(past);
  // Rows: root, then branch-major nodes. Branch 1 is only 2 deep (a ragged tree).
  std::vector<int64_t> nodes, pos{base};
  for (int64_t b = 0; b < branches; ++b)
    for (int64_t d = 0; d < (b == 1 ? 2 : depth); ++d) nodes.push_back(b * depth + d), pos.push_back(base + 1 + d);
  const int64_t T = int64_t(pos.size());
  auto q = rnd(T * qw), k = rnd(T * kw), v = rnd(T * kw);
  std::vector<float> out(size_t(T * qw));
  std::vector<int64_t> k_lo(T);
  auto ref_kv = kv.clone();  // before the tree writes its scratch rows into the ring
  model::SpecAttention sa(c, kv, branches, depth);
  sa.begin_tree(base);
  sa.set_rows(1, nodes);
  sa.attend(c, slot, q.data(), k.data(), v.data(), pos.data(), T, kv, k_lo.data(), out.data());

  // Reference: per row, a cache with the past, the root and the node's path at their
  // positions; ops::attention over it.
  for (int64_t t = 0; t < T; ++t) {
    auto ref = ref_kv->clone();
    std::vector<int64_t> rows{0};  // row indices of root + path
    if (t > 0) {
      const int64_t node = nodes[t - 1], b = node / depth, d = node % depth;
      for (int64_t dd = 0; dd <= d; ++dd)
        for (int64_t r = 1; r < T; ++r)
          if (nodes[r - 1] == b * depth + dd) rows.push_back(r);
    }
    for (int64_t r : rows) ref->write(slot, &k[r * kw], &v[r * kw], &pos[r], 1);
    std::vector<float> want(static_cast<size_t>(qw));
    const int64_t lo = 0;
    ops::attention(&q[t * qw], 1, c.n_heads, ref->view(slot), &pos[t], &lo, want.data());
    EXPECT_TRUE(same_bits(&out[t * qw], want.data(), qw)) << "row " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TreeAttentionTest, ::testing::Values(ops::KvDType::F16, ops::KvDType::F32));

// --- the tree forward against sequential decode ----------------------------------------

TEST_F(SpecTest, TreeForwardMatchesSequentialDecodeAndCommits) {
  const int64_t d = 2, L = 4, branches = 3, depth = 3, V = config().vocab_size, D = config().dim;
  const std::vector<int32_t> prompt{4, 9, 1, 17, 22, 5};
  const int32_t paths[3][3] = {{7, 8, 9}, {10, 2, 2}, {0, 28, 13}};
  const int64_t T0 = int64_t(prompt.size()), P = T0 - 1;
  KvCache kv(config(), L, 64, 0, engine_->kv_dtype(), nullptr, config().n_post_blocks);
  model::SpecForward f(m(), kv, d, L, branches, depth);
  f.prefill(prompt.data(), T0 - 1);
  ASSERT_EQ(kv.length(), P);

  // Root (linear) and its draft readout.
  std::vector<float> xr(D), sr(D), s_tmp, logits;
  f.router().set_all_linear();
  f.draft_prefix(&prompt[P], &P, 1, xr.data(), sr.data());
  s_tmp = sr;
  f.readout(s_tmp.data(), &P, 1, true, LogitRows::Last, logits);
  const auto draft_root = sequential(prompt, T0, d);
  EXPECT_TRUE(same_bits(logits.data(), draft_root[0].data(), V));

  // Levels.
  f.router().begin_tree(P);
  std::vector<float> xn(branches * depth * D), sn(branches * depth * D);  // [b, depth, D]
  std::vector<std::vector<float>> draft_logits(branches * depth);
  for (int64_t lv = 0; lv < depth; ++lv) {
    std::vector<int64_t> nodes(branches), pos(branches, P + 1 + lv);
    std::vector<int32_t> ids(branches);
    for (int64_t b = 0; b < branches; ++b) nodes[b] = b * depth + lv, ids[b] = paths[b][lv];
    std::vector<float> x(branches * D), s(branches * D);
    f.router().set_rows(0, nodes);
    f.draft_prefix(ids.data(), pos.data(), branches, x.data(), s.data());
    for (int64_t b = 0; b < branches; ++b) {
      std::memcpy(&xn[(b * depth + lv) * D], &x[b * D], sizeof(float) * D);
      std::memcpy(&sn[(b * depth + lv) * D], &s[b * D], sizeof(float) * D);
    }
    f.readout(s.data(), pos.data(), branches, true, LogitRows::All, logits);
    for (int64_t b = 0; b < branches; ++b)
      draft_logits[b * depth + lv].assign(logits.begin() + b * V, logits.begin() + (b + 1) * V);
  }
  // Verify.
  std::vector<int64_t> nodes, pos{P};
  std::vector<float> x(xr), s(sr);
  for (int64_t b = 0; b < branches; ++b)
    for (int64_t lv = 0; lv < depth; ++lv) nodes.push_back(b * depth + lv), pos.push_back(P + 1 + lv);
  x.insert(x.end(), xn.begin(), xn.end());
  s.insert(s.end(), sn.begin(), sn.end());
  f.router().set_rows(1, nodes);
  f.verify_rest(s.data(), x.data(), pos.data(), int64_t(pos.size()));
  f.readout(s.data(), pos.data(), int64_t(pos.size()), false, LogitRows::All, logits);
  kv.advance(1);

  for (int64_t b = 0; b < branches; ++b) {
    std::vector<int32_t> ids(prompt);
    ids.insert(ids.end(), paths[b], paths[b] + depth);
    const auto want_L = sequential(ids, T0, L), want_d = sequential(ids, T0, d);
    if (b == 0) {
      EXPECT_TRUE(same_bits(logits.data(), want_L[0].data(), V)) << "root";
    }
    for (int64_t lv = 0; lv < depth; ++lv) {
      EXPECT_TRUE(same_bits(&logits[(1 + b * depth + lv) * V], want_L[lv + 1].data(), V))
          << "verify, branch " << b << " depth " << lv + 1;
      EXPECT_TRUE(same_bits(draft_logits[b * depth + lv].data(), want_d[lv + 1].data(), V))
          << "draft, branch " << b << " depth " << lv + 1;
    }
  }

  // Commit two nodes of branch 1, then a plain decode step continues like sequential decode.
  f.router().commit(kv, 1, 2);
  kv.advance(2);
  std::vector<int32_t> ids(prompt);
  ids.insert(ids.end(), {paths[1][0], paths[1][1], 6});
  const auto want = sequential(ids, T0, L);
  std::vector<float> got;
  m().forward(&ids.back(), 1, kv, LogitRows::Last, got);
  EXPECT_TRUE(same_bits(got.data(), want.back().data(), V));
}

// --- whole generation ------------------------------------------------------------------

GenerateRequest plain(const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t loops, int64_t window) {
  GenerateRequest g;
  g.prompt = prompt;
  g.max_tokens = max_tokens;
  g.loops = loops;
  g.cache_window = window;
  g.stop_at_eos = false;
  return g;
}

SpeculativeRequest spec(const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t d, int64_t L, int64_t ahead,
                        int64_t K, int64_t window) {
  SpeculativeRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.draft_loops = d;
  r.verify_loops = L;
  r.draft_ahead = ahead;
  r.k_branches = K;
  r.cache_window = window;
  r.stop_at_eos = false;
  return r;
}

TEST_F(SpecTest, GreedyChainAndTreeEqualGenerate) {
  const std::vector<int32_t> prompt{3, 14, 15, 9, 2, 6};
  for (int64_t window : {0, 5}) {
    const auto want = generate(*engine_, plain(prompt, 70, 4, window)).tokens;
    for (auto [d, ahead, K] : {std::tuple{1, 3, 1}, {2, 4, 1}, {4, 2, 1}, {1, 2, 3}, {3, 5, 2}}) {
      const auto chain = generate_speculative(*engine_, spec(prompt, 70, d, 4, ahead, 1, window));
      EXPECT_EQ(chain.tokens, want) << "chain d=" << d << " ahead=" << ahead << " window=" << window;
      const auto tree = generate_tree_speculative(*engine_, spec(prompt, 70, d, 4, ahead, K, window));
      EXPECT_EQ(tree.tokens, want) << "tree d=" << d << " ahead=" << ahead << " K=" << K << " window=" << window;
      EXPECT_LE(chain.accepted, chain.drafted);
      EXPECT_LE(tree.accepted, tree.drafted);
    }
  }
}

TEST_F(SpecTest, BadArgumentsAreNamed) {
  const std::vector<int32_t> prompt{1, 2};
  auto expect_named = [&](SpeculativeRequest r, bool tree, const char* name) {
    try {
      tree ? generate_tree_speculative(*engine_, r) : generate_speculative(*engine_, r);
      ADD_FAILURE() << "no error for " << name;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect_named(spec(prompt, 4, 0, 4, 2, 1, 0), false, "draft_loops");
  expect_named(spec(prompt, 4, 5, 4, 2, 1, 0), false, "draft_loops");
  expect_named(spec(prompt, 4, 1, 0, 2, 1, 0), false, "verify_loops");
  expect_named(spec(prompt, 4, 1, 4, 0, 1, 0), true, "draft_ahead");
  expect_named(spec(prompt, 4, 1, 4, 2, 0, 0), true, "K_branches");
  expect_named(spec(prompt, 4, 1, 4, 9, 8, 0), true, "K_branches * draft_ahead");
}

// --- acceptance rules ------------------------------------------------------------------

std::vector<double> frequencies(int64_t V, int n, const std::function<int32_t(Rng&)>& draw) {
  Rng rng(17);
  std::vector<double> f(size_t(V), 0.0);
  for (int i = 0; i < n; ++i) f[size_t(draw(rng))] += 1.0 / n;
  return f;
}

TEST(SpecSampling, ChainRuleReproducesTarget) {
  const std::vector<float> p{0.5f, 0.2f, 0.2f, 0.1f, 0.0f}, q{0.1f, 0.1f, 0.3f, 0.2f, 0.3f};
  const auto f = frequencies(5, 200000, [&](Rng& rng) {
    const int32_t x = sample_from(q, rng);
    return accept_draft(p, q, x, rng) ? x : sample_from(residual(p, q), rng);
  });
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(f[i], p[i], 0.005) << i;
}

TEST(SpecSampling, MultiDraftRuleReproducesTarget) {
  const std::vector<float> p{0.05f, 0.45f, 0.2f, 0.3f, 0.0f}, q{0.4f, 0.1f, 0.3f, 0.1f, 0.1f};
  for (int64_t K : {1, 2, 3, 5}) {
    const auto f = frequencies(5, 200000, [&](Rng& rng) {
      const auto c = draw_without_replacement(q, K, rng);
      int32_t tok = -1;
      const int64_t i = accept_among(p, q, c, rng, &tok);
      return i >= 0 ? c[size_t(i)] : tok;
    });
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(f[i], p[i], 0.005) << "K=" << K << " id " << i;
  }
}

TEST(SpecSampling, TopIdsOrderAndTies) {
  const float z[6] = {1.f, 3.f, 3.f, NAN, -2.f, 2.f};
  EXPECT_EQ(top_ids(z, 6, 3), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(top_ids(z, 6, 10).size(), 6u);
  EXPECT_EQ(top_ids(z, 6, 1)[0], argmax(z, 6));
}

}  // namespace
}  // namespace tinyloop::runtime
