// Ouro's learned exit gate (docs/loop-depth.md, "Exit gate"; docs/convert.md, "Ouro").
//
// After iteration t (1-based) of a token, lambda_t = sigmoid(exit_gate . s_t + bias) on the
// loop state s_t (loop norm applied: Ouro's `norm(h)`, the state that feeds step t + 1).
// The exit distribution over the L iterations is
//   p_t = lambda_t * prod_{j<t} (1 - lambda_j)   for t < L,   p_L = prod_{j<L} (1 - lambda_j)
// and a mode picks the token's logits from it:
//   Threshold: readout(s_e), e = the first t with p_1 + ... + p_t >= threshold (else L)
//   Step:      readout(s_e), e = min(step, L)
//   Weighted:  sum_t p_t * readout(s_t)
// Threshold and Step stop a decoded token's loop at e (the compute saving; the skipped KV
// slots follow the latest rule, fill_skipped_slots), unless the call asks for the
// reference's full K/V (every iteration runs, the rule only picks the logits). Weighted
// needs every iteration.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/looped_model.h"
#include "runtime/early_exit.h"
#include "tinyloop/config.h"

namespace tinyloop::runtime {

class Engine;

// A call's exit_gate* kwargs; an unset field takes the model file's config.
struct GateExitRequest {
  std::optional<ExitGateMode> mode;
  std::optional<double> threshold;
  std::optional<int64_t> step;
  std::optional<bool> full_kv;  // exit_gate_kv: "full" = true, "latest" = false
  bool any() const { return mode || threshold || step || full_kv; }
};

// The rule one call applies.
struct GateExitParams {
  ExitGateMode mode = ExitGateMode::Off;
  double threshold = 1.0;
  int64_t step = 0;
  // Every iteration of a decoded token runs, as in the reference (no saving, its exact K/V).
  bool full_kv = false;
  bool enabled() const { return mode != ExitGateMode::Off; }
  // Threshold and Step modes pick one iteration's logits.
  bool picks() const { return mode == ExitGateMode::Threshold || mode == ExitGateMode::Step; }
  // ... and stop a decoded token's loop there unless full_kv.
  bool stops_early() const { return picks() && !full_kv; }
};

// "off" / "threshold" / "step" / "weighted" and back; parse throws std::invalid_argument
// naming exit_gate.
const char* gate_mode_name(ExitGateMode m);
ExitGateMode parse_gate_mode(const std::string& name);
// exit_gate_kv: "latest" -> false, "full" -> true; throws std::invalid_argument naming it.
bool parse_gate_kv(const std::string& name);

// The call's rule: its kwargs over the file's config. Throws std::invalid_argument naming
// the kwarg for a value out of range (exit_gate_threshold outside [0, 1], NaN included;
// exit_gate_step < 1), for any gate kwarg other than exit_gate="off" on a model without an
// exit gate, for a gate on a model with post blocks (intermediate readouts would need
// post-block K/V the reference does not define), and when both the gate and
// early_exit_patience > 0 are asked for explicitly. A gate that only comes from the file
// yields to an explicit early_exit_patience > 0.
GateExitParams resolve_gate(const ModelConfig& c, const GateExitRequest& r, const EarlyExitParams& ee);
// The model-free part of those checks (exit_gate_threshold, exit_gate_step ranges).
void validate(const GateExitRequest& r);

// Paths that do not run the gate (`what`: resume, prefix caches, speculative decoding, beam
// search) refuse a file whose default rule changes the logits (step, weighted, a threshold
// below 1): running the last iteration instead would silently differ from the reference.
// Throws std::invalid_argument naming exit_gate_mode. A threshold of 1 (the released Ouro
// configs) passes: it is the last iteration unless the gate saturates.
void refuse_file_gate(const ModelConfig& c, const std::string& what);

// The exit distribution of one token, built step by step in float32 in the reference's
// order of operations (OuroForCausalLM.forward: remaining *= 1 - lambda, cumsum of p), so
// a threshold of 1.0 behaves as the float32 reference does.
class GateTracker {
 public:
  // Feeds the gate logit after the next iteration of a token decoded at `loops`; returns
  // that iteration's weight p_t.
  float observe(float gate_logit, int64_t loops);
  int64_t steps() const { return t_; }
  float cdf() const { return cdf_; }
  // True when the rule picks the iteration just observed (always at the last one).
  bool exits_now(const GateExitParams& g, int64_t loops) const;

 private:
  int64_t t_ = 0;
  float remaining_ = 1.0f, cdf_ = 0.0f;
};

// The gate's logit exit_gate . s + bias for one state row s[D] (the model's own matmul, as
// Ouro's nn.Linear).
float gate_logit(const model::LoopedModel& m, const float* state);

// score() under the gate: every position's logits [T, V] by the rule, from one forward that
// runs all L iterations over the prompt (as the reference does) on a float32 cache.
std::vector<float> score_exit_gate(const Engine& e, const std::vector<int32_t>& ids, std::optional<int64_t> loops,
                                   const GateExitParams& g);

}  // namespace tinyloop::runtime
