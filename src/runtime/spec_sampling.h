// The acceptance rules of speculative sampling, which keep the output distributed exactly as
// the verifier's (docs/speculative.md has the proofs). p and q are the verifier's and the
// draft's final sampling distributions over the vocabulary, probs [V] summing to 1.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/sampler.h"

namespace tinyloop::runtime {

// Chain rule (Leviathan et al. 2023, Chen et al. 2023): a draft token x ~ q is accepted
// with probability min(1, p(x) / q(x)). Consumes one draw.
bool accept_draft(const std::vector<float>& p, const std::vector<float>& q, int32_t x, Rng& rng);

// normalize(max(0, p - q)) [V]: what a rejection samples from. When rounding leaves no
// positive mass (p and q equal up to rounding), p itself.
std::vector<float> residual(const std::vector<float>& p, const std::vector<float>& q);

// Up to k distinct ids drawn one after another from q without replacement (each draw from
// q with the ids already drawn removed, renormalised); fewer when q has fewer positive ids.
// Consumes one draw per id.
std::vector<int32_t> draw_without_replacement(const std::vector<float>& q, int64_t k, Rng& rng);

// Multi-draft rule for the tree root (recursive rejection sampling over candidates drawn
// without replacement, as in SpecInfer / Jeon et al. 2024): for i = 1..K, candidate c_i was
// drawn from q_i = q without c_1..c_{i-1} renormalised; accept it with probability
// min(1, p_i(c_i) / q_i(c_i)), else p_{i+1} = normalize(max(0, p_i - q_i)). Returns the index
// of the accepted candidate, or -1 with *token drawn from p_{K+1} when all are rejected.
int64_t accept_among(const std::vector<float>& p, const std::vector<float>& q, const std::vector<int32_t>& candidates,
                     Rng& rng, int32_t* token);

// The k ids with the largest logits [V], largest first, ties to the lower id (greedy
// candidates of the tree root: greedy argmax is the first).
std::vector<int32_t> top_ids(const float* logits, int64_t V, int64_t k);

}  // namespace tinyloop::runtime
