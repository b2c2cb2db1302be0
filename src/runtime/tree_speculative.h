// Self-speculative decoding with a draft tree (Model.generate_tree_speculative;
// docs/speculative.md): K_branches candidates for the next
// token from the draft's distribution at the root, each extended by the draft to a chain of
// draft_ahead tokens, and the whole tree verified in ONE forward with a tree attention mask
// (each node sees the cached past, the root and its own ancestors). Greedy output equals
// generate(loops = verify_loops) token for token for every K_branches; with temperature > 0
// a multi-draft rejection rule keeps the output distributed exactly as generate's.
#pragma once

#include "runtime/engine.h"
#include "runtime/spec_common.h"

namespace tinyloop::runtime {

// Validates every argument first (std::invalid_argument naming it, K_branches * draft_ahead
// <= 64; std::runtime_error when prompt + max_tokens exceeds max_seq_len).
SpeculativeResult generate_tree_speculative(const Engine& engine, const SpeculativeRequest& req);

}  // namespace tinyloop::runtime
