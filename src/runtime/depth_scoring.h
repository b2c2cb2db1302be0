// Depth-wise scoring: what the model says after each loop iteration of one forward
// (docs/loop-depth.md). Every function runs the prompt ONCE, reading logits out of the loop
// state at the depths it needs (LoopRun), on a float32 KV cache like Engine::score, so the
// logits at depth l equal score(ids, loops=l). Inputs are validated like score(): non-empty,
// ids in [0, V), len <= max_seq_len; loop counts must be >= 1 (std::invalid_argument naming
// the argument).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/engine.h"

namespace tinyloop::runtime {

// Logit lens: logits [L, T, V], row block l-1 = the logits read out after iteration l.
std::vector<float> score_logit_lens(const Engine& e, const std::vector<int32_t>& ids, std::optional<int64_t> loops);

struct Trajectory {
  std::vector<float> embedding;  // [T, D] embed * embed_scale (+ pos_emb)
  std::vector<float> pre;  // [n_pre_blocks, T, D] after each pre layer
  std::vector<float> init;  // [T, D] the loop's initial state s0
  std::vector<float> iterations;  // [L, T, D] loop state after each iteration (loop_norm incl.)
};
// draw: the initial state's (runtime/state_draw.h); default the file's init_state_seed, scale 1.
Trajectory score_trajectory(const Engine& e, const std::vector<int32_t>& ids, std::optional<int64_t> loops,
                            const std::optional<model::StateDraw>& draw = std::nullopt);

struct Uncertainty {
  std::vector<double> kl;  // [T] KL(p_deep || p_shallow) per position, in nats
  std::vector<float> shallow_logits;  // [T, V] at shallow_loops
  std::vector<float> deep_logits;  // [T, V] at deep_loops
};
// Needs 1 <= shallow_loops <= deep_loops.
Uncertainty score_with_uncertainty(const Engine& e, const std::vector<int32_t>& ids, int64_t shallow_loops,
                                   int64_t deep_loops);

struct Consistency {
  int64_t escalate_loops = 0;
  std::vector<int32_t> shallow_argmax;  // [T]
  std::vector<int32_t> deep_argmax;  // [T]
  std::vector<uint8_t> escalated;  // [T] 1 where the two argmaxes disagree
  std::vector<int32_t> final_argmax;  // [T] argmax of `logits`
  std::vector<float> logits;  // [T, V] deep logits; escalate_loops logits where escalated
};
// Needs 1 <= shallow_loops <= deep_loops <= escalate_loops (default 2 * deep_loops). The
// deeper iterations run only when some position disagrees, and then over every position
// up to the last disagreeing one (causal attention: a deeper row needs deeper keys of every
// earlier row).
Consistency score_with_consistency(const Engine& e, const std::vector<int32_t>& ids, int64_t shallow_loops,
                                   int64_t deep_loops, std::optional<int64_t> escalate_loops);

}  // namespace tinyloop::runtime
