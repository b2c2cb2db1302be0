#include "runtime/depth_scoring.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "runtime/loop_run.h"
#include "runtime/sampler.h"

namespace tinyloop::runtime {
namespace {

void check_loops(int64_t v, const char* name) {
  if (v < 1) throw std::invalid_argument(std::string(name) + " must be >= 1, got " + std::to_string(v));
}

// 1 <= shallow_loops <= deep_loops, the pair both uncertainty scores compare.
void check_shallow_deep(int64_t shallow_loops, int64_t deep_loops) {
  check_loops(shallow_loops, "shallow_loops");
  check_loops(deep_loops, "deep_loops");
  if (deep_loops < shallow_loops)
    throw std::invalid_argument("deep_loops must be >= shallow_loops (" + std::to_string(shallow_loops) + "), got " +
                                std::to_string(deep_loops));
}

// The prompt checks of Engine::score, and a float32 cache with slots for `loops` iterations
// (float32 K/V: nothing is kept, so nothing is rounded, exactly as score() does).
std::unique_ptr<model::KvCache> scoring_cache(const Engine& e, const std::vector<int32_t>& ids, int64_t loops) {
  e.check_tokens(ids);
  const auto T = static_cast<int64_t>(ids.size());
  e.check_length(T, 0);
  return e.new_cache(loops, T, 0, ops::KvDType::F32);
}

// log softmax of z[V] in double, into out[V].
void log_softmax(const float* z, int64_t V, std::vector<double>& out) {
  out.resize(V);
  double m = -INFINITY;
  for (int64_t v = 0; v < V; ++v) m = std::max(m, double(z[v]));
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - m);
  const double lse = m + std::log(sum);
  for (int64_t v = 0; v < V; ++v) out[v] = double(z[v]) - lse;
}

}  // namespace

std::vector<float> score_logit_lens(const Engine& e, const std::vector<int32_t>& ids, std::optional<int64_t> loops) {
  const int64_t L = e.resolve_loops(loops);
  auto kv = scoring_cache(e, ids, L);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t V = e.config().vocab_size;
  std::vector<float> out(L * T * V);  // [L, T, V]
  LoopRun run(e.model(), *kv, ids.data(), T);
  while (run.done() < L) {
    run.step();
    run.read_out(model::LogitRows::All, out.data() + (run.done() - 1) * T * V);
  }
  return out;
}

Trajectory score_trajectory(const Engine& e, const std::vector<int32_t>& ids, std::optional<int64_t> loops,
                            const std::optional<model::StateDraw>& draw) {
  const int64_t L = e.resolve_loops(loops);
  auto kv = scoring_cache(e, ids, L);
  if (draw) kv->set_state_draw(*draw);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t D = e.config().dim, n_pre = e.config().n_pre_blocks;
  std::vector<float> trace((1 + n_pre) * T * D);  // [1 + n_pre, T, D] embedding, pre outputs
  LoopRun run(e.model(), *kv, ids.data(), T, trace.data());
  Trajectory tr;
  tr.embedding.assign(trace.begin(), trace.begin() + T * D);
  tr.pre.assign(trace.begin() + T * D, trace.end());
  tr.init = run.state();
  tr.iterations.resize(L * T * D);
  while (run.done() < L) {
    run.step();
    std::memcpy(tr.iterations.data() + (run.done() - 1) * T * D, run.state().data(), sizeof(float) * T * D);
  }
  return tr;
}

Uncertainty score_with_uncertainty(const Engine& e, const std::vector<int32_t>& ids, int64_t shallow_loops,
                                   int64_t deep_loops) {
  check_shallow_deep(shallow_loops, deep_loops);
  auto kv = scoring_cache(e, ids, deep_loops);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t V = e.config().vocab_size;
  Uncertainty u;
  u.shallow_logits.resize(T * V);  // [T, V]
  u.deep_logits.resize(T * V);  // [T, V]
  LoopRun run(e.model(), *kv, ids.data(), T);
  run.run_to(shallow_loops);
  run.read_out(model::LogitRows::All, u.shallow_logits.data());
  run.run_to(deep_loops);
  run.read_out(model::LogitRows::All, u.deep_logits.data());
  u.kl.resize(T);
  std::vector<double> lp_deep, lp_shallow;  // [V] log probabilities of one row
  for (int64_t t = 0; t < T; ++t) {
    log_softmax(u.deep_logits.data() + t * V, V, lp_deep);
    log_softmax(u.shallow_logits.data() + t * V, V, lp_shallow);
    double kl = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(lp_deep[v]);
      if (p > 0) kl += p * (lp_deep[v] - lp_shallow[v]);
    }
    u.kl[t] = std::max(kl, 0.0);  // rounding can leave a tiny negative for equal rows
  }
  return u;
}

Consistency score_with_consistency(const Engine& e, const std::vector<int32_t>& ids, int64_t shallow_loops,
                                   int64_t deep_loops, std::optional<int64_t> escalate_loops) {
  check_shallow_deep(shallow_loops, deep_loops);
  const int64_t esc = escalate_loops.value_or(2 * deep_loops);
  if (esc < deep_loops)
    throw std::invalid_argument("escalate_loops must be >= deep_loops (" + std::to_string(deep_loops) + "), got " +
                                std::to_string(esc));
  auto kv = scoring_cache(e, ids, esc);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t V = e.config().vocab_size;
  Consistency c;
  c.escalate_loops = esc;
  std::vector<float> shallow(T * V);  // [T, V]
  c.logits.resize(T * V);  // [T, V]
  LoopRun run(e.model(), *kv, ids.data(), T);
  run.run_to(shallow_loops);
  run.read_out(model::LogitRows::All, shallow.data());
  run.run_to(deep_loops);
  run.read_out(model::LogitRows::All, c.logits.data());
  c.shallow_argmax.resize(T);
  c.deep_argmax.resize(T);
  c.escalated.assign(T, 0);
  int64_t last = -1;  // last disagreeing position
  for (int64_t t = 0; t < T; ++t) {
    c.shallow_argmax[t] = argmax(shallow.data() + t * V, V);
    c.deep_argmax[t] = argmax(c.logits.data() + t * V, V);
    if (c.shallow_argmax[t] != c.deep_argmax[t]) {
      c.escalated[t] = 1;
      last = t;
    }
  }
  c.final_argmax = c.deep_argmax;
  if (last >= 0 && esc > deep_loops) {
    const int64_t n = last + 1;
    run.keep_rows(n);
    run.run_to(esc);
    std::vector<float> deeper(n * V);  // [n, V]
    run.read_out(model::LogitRows::All, deeper.data());
    for (int64_t t = 0; t < n; ++t) {
      if (!c.escalated[t]) continue;
      std::memcpy(c.logits.data() + t * V, deeper.data() + t * V, sizeof(float) * V);
      c.final_argmax[t] = argmax(deeper.data() + t * V, V);
    }
  }
  return c;
}

}  // namespace tinyloop::runtime
