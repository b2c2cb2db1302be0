// Early exit: one decode step that stops iterating once the loop state has settled
// (docs/loop-depth.md, section 1: the early_exit_* kwargs and the latest KV rule).
//
// Per decoded token, after `min_L` iterations and then every `peek_every` iterations, a probe
// asks whether the state is stable:
//   hidden-L2 mode (logit_margin == 0): ||s_n - s_{n-1}|| < tau * ||s_n||   (rho < tau)
//   logit-margin mode (logit_margin > 0): top1 - top2 of readout(s_n) > logit_margin
// After `patience` consecutive stable probes the token stops at n iterations. The slots of
// iterations n .. loops-1 for that position are then filled from iteration n-1's slot of the
// same loop layer (the "latest" rule), so later tokens that run deeper still attend to every
// earlier position. Prefill never exits early.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "model/kv_cache.h"
#include "model/looped_model.h"
#include "runtime/engine.h"

namespace tinyloop::runtime {

struct EarlyExitParams {
  int64_t patience = 0;  // consecutive stable probes to stop; 0 disables early exit
  int64_t min_L = 2;  // iterations before the first probe (>= 1)
  double tau = 1e-3;  // hidden-L2 threshold on rho (>= 0)
  int64_t peek_every = 1;  // iterations between probes after min_L (>= 1)
  double logit_margin = 0.0;  // > 0 selects logit-margin mode (>= 0)
  bool enabled() const { return patience > 0; }
  bool margin_mode() const { return logit_margin > 0; }
  // True when a probe runs after n iterations of a token decoded at `loops`: n = min_L,
  // min_L + peek_every, ... and n < loops (stopping at loops saves nothing).
  bool probes_at(int64_t n, int64_t loops) const { return n < loops && n >= min_L && (n - min_L) % peek_every == 0; }
};

// Throws std::invalid_argument naming the kwarg ("early_exit_patience", "early_exit_min_L",
// "early_exit_peek_every", "early_exit_tau", "early_exit_logit_margin") for a value out of
// range (NaN included). Checked whether or not early exit is enabled.
void validate(const EarlyExitParams& p);

// The latest rule for position p of a token that stopped after `done` < loops iterations:
// for every loop layer j, the rows of slots (i, j), i = done .. loops-1, become copies of
// slot (done-1, j). No-op when done >= loops. Needs done >= 1.
void fill_skipped_slots(model::KvCache& kv, int64_t done, int64_t loops, int64_t p);

// Decodes one token (position kv.length()) at up to `loops` iterations with probes, writes
// logits[V] and advances kv by one. Returns the iterations actually run (1 .. loops).
// With no exit it performs exactly forward(token, 1, kv, Last, logits, loops), bit for bit.
int64_t decode_step_early_exit(const model::LoopedModel& m, model::KvCache& kv, int32_t token, int64_t loops,
                               const EarlyExitParams& p, std::vector<float>& logits);

// Teacher-forced early exit, for quality measurements (perplexity) and tests: prefill
// ids[0:prefill_len] at full depth (engine KV mode, no window), then feed the remaining ids
// one at a time through decode_step_early_exit. logits: [T - prefill_len + 1, V], row r
// predicts the token after ids[prefill_len - 1 + r]; depths[r]: iterations behind row r
// (row 0 comes from the prefill). patience 0 gives plain cached decoding.
struct StepwiseExit {
  std::vector<float> logits;  // [T - prefill_len + 1, V]
  std::vector<int64_t> depths;  // [T - prefill_len + 1]
};
StepwiseExit early_exit_stepwise(const Engine& e, const std::vector<int32_t>& ids, int64_t prefill_len,
                                 std::optional<int64_t> loops, const EarlyExitParams& p);

// Probe quantities, exposed for tests and benchmarks.
// ||cur - prev|| < tau * ||cur|| over n floats, accumulated in double.
bool hidden_stable(const float* prev, const float* cur, int64_t n, double tau);
// Largest minus second-largest logit of logits[V] (+inf when V == 1; NaN ignored).
double top_gap(const float* logits, int64_t V);

}  // namespace tinyloop::runtime
