// One forward step over rows of many sequences (docs/serving.md "How it works"): decode tokens and
// prompt chunks of different sequences, at different positions and depths, in one pass.
//
//   prelude + initial state      all rows at once
//   loop iteration i             the rows of every part still in the loop: a part leaves
//                                after its own `loops` iterations, or earlier when its early
//                                exit probe says so (decode parts); the others go on
//   readout (post blocks, head)  all rows at once; logits for the parts that want them
//
// Every matmul runs once over all rows still in the step, so the weights are read once per
// step and, for a looped model, once per iteration for all rows, instead of once per
// sequence. The kernels are batch-invariant and attention reads each sequence's own cache,
// so a part's logits and K/V are bit-identical to running it alone; in particular a
// one-part step performs exactly LoopedModel::forward's operations (and with early exit
// exactly decode_step_early_exit's).
#pragma once
#include <cstdint>
#include <vector>

#include "model/kv_cache.h"
#include "model/layer.h"
#include "model/looped_model.h"
#include "runtime/early_exit.h"
#include "runtime/gate_exit.h"

namespace tinyloop::runtime {

struct StepPart {
  model::KvCache* kv = nullptr;
  const int32_t* tokens = nullptr;  // [n] new tokens at positions kv->length() ..
  int64_t n = 0;
  int64_t loops = 0;  // iterations to run (1 .. kv->loops())
  // The depth the sequence decodes at: when the last row runs fewer iterations than this
  // (early exit, or a replay of an exited token), its slots up to it are filled by the
  // latest rule (docs/loop-depth.md, early exit). 0 = loops.
  int64_t full_loops = 0;
  // Per-token early exit (parts of one row only; prefill never exits early). null or
  // disabled = fixed depth.
  const EarlyExitParams* early_exit = nullptr;
  // Ouro's exit gate on the last row when it wants logits (runtime/gate_exit.h): the rule
  // picks (or mixes) that row's logits; a one-row part in Threshold / Step mode stops its
  // loop there (unless full_kv). Longer parts (a prompt) run every iteration, as the
  // reference does. null or
  // Off = the last iteration's logits.
  const GateExitParams* gate_exit = nullptr;
  // A decode row (not the last row of a prompt, which may be one row too): only a decode
  // row's loop may stop at the gate's exit.
  bool gate_may_stop = false;
  bool want_logits = false;  // logits of the last row
  // Outputs.
  std::vector<float> logits;  // [V] when want_logits
  int64_t depth = 0;  // iterations the last row ran
};

// Buffers reused from step to step (grown on demand), counted in the model's memory report.
class StepScratch {
 public:
  explicit StepScratch(const model::LoopedModel& m) : m_(m) {}
  // Sizes every buffer for T rows.
  void reserve(int64_t T);
  model::Workspace ws;
  std::vector<int32_t> tokens;  // [T]
  std::vector<int64_t> pos;  // [T] absolute positions
  std::vector<float> x, s;  // [T, D] prelude output, loop state
  std::vector<float> xa, sa;  // [T, D] the rows still in the loop, gathered
  std::vector<float> prev;  // [T, D] states before a hidden-L2 probe
  std::vector<float> probe;  // [T, D] states a margin probe reads out (clobbered)
  std::vector<int64_t> apos;  // [T] positions of the gathered rows
  std::vector<int32_t> atokens;  // [T] their tokens (layers with a value embedding read them)

 private:
  const model::LoopedModel& m_;
  int64_t rows_ = 0;
  model::TrackedBytes tracked_;
};

// Runs one step over `parts` (each part's cache must hold room for its rows: reserve them
// first when the pool has a budget) and advances each part's cache by its n. Throws
// std::invalid_argument for a part with no rows, loops outside 1 .. kv->loops(), or early
// exit on more than one row.
void run_step(const model::LoopedModel& m, std::vector<StepPart>& parts, StepScratch& scratch);

}  // namespace tinyloop::runtime
