// Turning one row of logits into the next token (DESIGN.md section 4).
// Order per step: repetition penalty -> grammar mask -> temperature -> top-k -> top-p -> sample.
// Conventions follow Hugging Face transformers' logits processors / warpers.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace tinyloop::runtime {

struct SamplingParams {
  float temperature = 0.0f;        // <= 0.01 is greedy (argmax, ties to the lowest id)
  int top_k = 50;                  // >= 1 while sampling; ignored when greedy
  float top_p = 1.0f;              // in (0, 1]; 1 disables
  float repetition_penalty = 1.0f; // > 0; 1 disables
  bool greedy() const { return temperature <= 0.01f; }
};

// Throws std::invalid_argument naming the argument ("temperature", "top_k", "top_p",
// "repetition_penalty") when a value is out of range. top_k is checked only when sampling.
void validate(const SamplingParams& p);

// Deterministic 64-bit generator (std::mt19937_64 semantics), seeded or from entropy.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  static Rng from_entropy();
  uint64_t next_u64();
  double uniform();  // [0, 1) with 53 random bits
 private:
  std::mt19937_64 gen_;
};

// HF RepetitionPenaltyLogitsProcessor: for every distinct id in `seen`, a positive logit is
// divided by `penalty`, a negative one multiplied. logits[V] in place.
void apply_repetition_penalty(float* logits, int64_t V, const std::vector<int32_t>& seen,
                              float penalty);

// Index of the largest logit; ties go to the lowest id. -inf everywhere returns 0.
int32_t argmax(const float* logits, int64_t V);

// The distribution sampling draws from, after temperature, top-k (keeps every token tied
// with the k-th largest, as HF does) and top-p (keeps the smallest prefix of the sorted
// distribution whose mass reaches top_p, at least one token). probs[V] sums to 1; removed
// tokens are exactly 0. Requires !p.greedy(). logits are not modified.
void sampling_distribution(const float* logits, int64_t V, const SamplingParams& p,
                           std::vector<float>& probs);

// Draw an id from probs[V] (inverse CDF on one uniform in double).
int32_t sample_from(const std::vector<float>& probs, Rng& rng);

// Whole step on logits[V] (modified in place by the penalty): penalty over `seen`, then
// greedy argmax or sample from sampling_distribution. The grammar mask, when there is one,
// is applied by the caller between the penalty and this call (use apply_penalty = false).
int32_t sample_next(float* logits, int64_t V, const SamplingParams& p,
                    const std::vector<int32_t>& seen, Rng& rng);

// Stop sequences: non-empty, ids in [0, V). Matches the tail of the emitted tokens only
// (never reaching into the prompt); the first sequence in the list that matches wins.
class StopMatcher {
 public:
  // Throws std::invalid_argument("stop_sequences: ...") for an empty sequence or an id
  // outside [0, vocab_size).
  StopMatcher(std::vector<std::vector<int32_t>> sequences, int64_t vocab_size);
  // True when the emitted tokens (output only, not the prompt) end with a stop sequence.
  bool matches(const std::vector<int32_t>& emitted) const;
  bool empty() const { return seqs_.empty(); }
 private:
  std::vector<std::vector<int32_t>> seqs_;
};

}  // namespace tinyloop::runtime
