// Self-speculative decoding, chain form (Model.generate_speculative;
// docs/speculative.md): the same weights draft draft_ahead tokens one at a time at
// draft_loops iterations, then verify them in ONE multi-token forward at verify_loops.
// Greedy output equals generate(loops = verify_loops) token for token; with temperature > 0
// the output is distributed exactly as generate's (speculative sampling).
#pragma once

#include "runtime/engine.h"
#include "runtime/spec_common.h"

namespace tinyloop::runtime {

// Validates every argument first (std::invalid_argument naming it; std::runtime_error when
// prompt + max_tokens exceeds max_seq_len). k_branches is ignored.
SpeculativeResult generate_speculative(const Engine& engine, const SpeculativeRequest& req);

}  // namespace tinyloop::runtime
