// The initial-state draw of one request (model/kv_cache.h StateDraw), resolved once per
// request so that every (re)computation of its positions — prefill chunks, decode steps,
// the uncached path, recomputation after preemption — starts the loop from the same state.
//
// A model whose config says init_state_per_call (Huginn, docs/convert.md) draws per call,
// as its reference draws a fresh torch.randn per forward: the seed comes from the
// request's `seed` (so a seeded call reproduces) or from fresh entropy. Any other random
// model keeps its file's init_state_seed. `init_scale` multiplies init_state_std; 0 gives
// the zero state (Huginn's init_scale = 0).
#pragma once
#include <optional>

#include "model/kv_cache.h"
#include "tinyloop/config.h"

namespace tinyloop::runtime {

// std::invalid_argument naming init_scale: not finite, < 0, above kMaxInitScale, or != 1 on a
// model whose initial state is not random (it would be silently ignored).
void validate_init_scale(const ModelConfig& c, double init_scale);
constexpr double kMaxInitScale = 1e6;

// The draw for a call with this seed (none: fresh entropy, drawn now) and scale.
model::StateDraw resolve_state_draw(const ModelConfig& c, std::optional<uint64_t> seed, double init_scale);

}  // namespace tinyloop::runtime
