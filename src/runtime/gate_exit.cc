#include "runtime/gate_exit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "runtime/engine.h"
#include "runtime/loop_run.h"

namespace tinyloop::runtime {

const char* gate_mode_name(ExitGateMode m) {
  switch (m) {
    case ExitGateMode::Threshold: return "threshold";
    case ExitGateMode::Step: return "step";
    case ExitGateMode::Weighted: return "weighted";
    case ExitGateMode::Off: break;
  }
  return "off";
}

ExitGateMode parse_gate_mode(const std::string& name) {
  for (ExitGateMode m : {ExitGateMode::Off, ExitGateMode::Threshold, ExitGateMode::Step, ExitGateMode::Weighted})
    if (name == gate_mode_name(m)) return m;
  throw std::invalid_argument(
      "exit_gate must be one of 'off', 'threshold', 'step', 'weighted' (or None for "
      "the model file's default), got '" +
      name + "'");
}

void validate(const GateExitRequest& r) {
  if (r.threshold && !(*r.threshold >= 0 && *r.threshold <= 1))  // also rejects NaN
    throw std::invalid_argument("exit_gate_threshold must be in [0, 1], got " + std::to_string(*r.threshold));
  if (r.step && (*r.step < 1 || *r.step > kMaxLoops))
    throw std::invalid_argument("exit_gate_step must be in [1, " + std::to_string(kMaxLoops) + "], got " +
                                std::to_string(*r.step));
}

bool parse_gate_kv(const std::string& name) {
  if (name == "latest") return false;
  if (name == "full") return true;
  throw std::invalid_argument("exit_gate_kv must be 'latest' or 'full' (or None for 'latest'), got '" + name + "'");
}

GateExitParams resolve_gate(const ModelConfig& c, const GateExitRequest& r, const EarlyExitParams& ee) {
  validate(r);
  const bool explicit_off = r.mode && *r.mode == ExitGateMode::Off;
  if (!c.exit_gate) {
    if (r.any() && !explicit_off)
      throw std::invalid_argument(
          "exit_gate: this model has no exit gate (config exit_gate is false); "
          "exit_gate, exit_gate_threshold and exit_gate_step apply to Ouro-style "
          "models only");
    return {};
  }
  GateExitParams g;
  g.mode = r.mode.value_or(c.exit_gate_mode);
  g.threshold = r.threshold.value_or(c.exit_gate_threshold);
  g.step = r.step.value_or(c.exit_gate_step);
  g.full_kv = r.full_kv.value_or(false);
  if (!g.enabled()) return g;
  if (ee.enabled()) {
    // The file's default yields to an explicit early exit; two explicit criteria would fight.
    if (!r.mode) return {};
    throw std::invalid_argument(
        "exit_gate: cannot be combined with early_exit_patience > 0 (two exit "
        "criteria); pass exit_gate='off' or early_exit_patience=0");
  }
  if (g.mode == ExitGateMode::Step && g.step < 1)
    throw std::invalid_argument("exit_gate_step must be given (>= 1) with exit_gate='step'");
  if (c.n_post_blocks > 0)
    throw std::invalid_argument(
        "exit_gate: not supported on a model with post blocks (an exited token's "
        "post-block K/V is not defined by Ouro's reference)");
  return g;
}

void refuse_file_gate(const ModelConfig& c, const std::string& what) {
  if (!c.exit_gate || c.exit_gate_mode == ExitGateMode::Off) return;
  if (c.exit_gate_mode == ExitGateMode::Threshold && c.exit_gate_threshold >= 1.0) return;
  throw std::invalid_argument(std::string("exit_gate_mode: this model file's exit gate rule ('") +
                              gate_mode_name(c.exit_gate_mode) + "') is not supported by " + what +
                              ", which run every loop; use generate / generate_stream / "
                              "tl.Engine, which apply it (docs/loop-depth.md \"Exit gate\")");
}

float GateTracker::observe(float gate_logit, int64_t loops) {
  ++t_;
  float p;
  if (t_ < loops) {
    const float lambda = 1.0f / (1.0f + std::exp(-gate_logit));
    p = lambda * remaining_;
    remaining_ = remaining_ * (1.0f - lambda);
  } else {
    p = remaining_;  // the last step takes what is left
  }
  cdf_ += p;
  return p;
}

bool GateTracker::exits_now(const GateExitParams& g, int64_t loops) const {
  if (t_ >= loops) return true;
  // torch compares a float32 tensor with a Python float in float32, so the threshold is
  // rounded to float first (0.7 -> 0.699999988).
  if (g.mode == ExitGateMode::Threshold) return cdf_ >= static_cast<float>(g.threshold);
  if (g.mode == ExitGateMode::Step) return t_ >= g.step;
  return false;
}

float gate_logit(const model::LoopedModel& m, const float* state) {
  const model::Linear& gate = m.weights().exit_gate;
  float y = 0;  // [1]
  ops::matmul(state, 1, gate.w, gate.bias, &y);
  return y;
}

std::vector<float> score_exit_gate(const Engine& e, const std::vector<int32_t>& ids, std::optional<int64_t> loops,
                                   const GateExitParams& g) {
  e.check_tokens(ids);
  const int64_t L = e.resolve_loops(loops), T = static_cast<int64_t>(ids.size());
  const int64_t D = e.config().dim, V = e.config().vocab_size;
  e.check_length(T, 0);
  auto kv = e.new_cache(L, T, 0, ops::KvDType::F32);
  LoopRun run(e.model(), *kv, ids.data(), T);
  std::vector<GateTracker> gates(static_cast<size_t>(T));
  std::vector<char> decided(static_cast<size_t>(T), 0);  // a selecting mode has picked the row
  std::vector<float> weight(static_cast<size_t>(T));  // [T] p_t of this step
  std::vector<float> out(static_cast<size_t>(T * V), 0.0f);  // [T, V]
  std::vector<float> step_logits(static_cast<size_t>(T * V));  // [T, V]
  for (int64_t t = 1; t <= L; ++t) {
    run.step();
    bool read = g.mode == ExitGateMode::Weighted;
    for (int64_t r = 0; r < T; ++r) {
      GateTracker& tr = gates[size_t(r)];
      weight[size_t(r)] = tr.observe(gate_logit(e.model(), run.state().data() + r * D), L);
      read |= !decided[size_t(r)] && tr.exits_now(g, L);
    }
    if (!read) continue;
    // The reference runs every step over the whole sequence, so this readout of all rows at
    // step t equals its logits_t; rows the rule does not take from this step are ignored.
    run.read_out(model::LogitRows::All, step_logits.data());
    for (int64_t r = 0; r < T; ++r) {
      const float* src = step_logits.data() + r * V;
      float* dst = out.data() + r * V;
      if (g.mode == ExitGateMode::Weighted) {
        const float w = weight[size_t(r)];
        for (int64_t v = 0; v < V; ++v) dst[v] += w * src[v];
      } else if (!decided[size_t(r)] && gates[size_t(r)].exits_now(g, L)) {
        std::copy(src, src + V, dst);
        decided[size_t(r)] = 1;
      }
    }
  }
  run.commit();
  return out;
}

}  // namespace tinyloop::runtime
