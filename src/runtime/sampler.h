// Turning one row of logits into the next token (docs/generation.md "Sampling").
// Order per step: repetition penalty -> grammar mask -> temperature -> top-k -> top-p -> sample.
// Conventions follow Hugging Face transformers' logits processors / warpers.
#pragma once
#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tinyloop::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0.01 is greedy (argmax, ties to the lowest id)
  int top_k = 50;  // >= 1 while sampling; ignored when greedy
  float top_p = 1.0f;  // in (0, 1]; 1 disables
  float repetition_penalty = 1.0f;  // > 0; 1 disables
  // OpenAI's additive penalties over the tokens generated so far (not the prompt), in
  // [-2, 2]; 0 disables: logit -= presence * [count > 0] + frequency * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  bool greedy() const { return temperature <= 0.01f; }
};

// Throws std::invalid_argument naming the argument ("temperature", "top_k", "top_p",
// "repetition_penalty", "presence_penalty", "frequency_penalty") when a value is out of range; the message starts with the name.
// temperature >= 0 and repetition_penalty > 0 always (as HF, +inf passes); top_k >= 1 and
// top_p in (0, 1] only when sampling (they are ignored when greedy). NaN is out of range.
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
// divided by `penalty`, a negative one multiplied. logits[V] in place. An id seen several
// times is penalised once; ids outside [0, V) are ignored (the caller validates them);
// penalty 1 is a no-op. Throws std::invalid_argument("repetition_penalty ...") unless > 0.
void apply_repetition_penalty(float* logits, int64_t V, const std::vector<int32_t>& seen, float penalty);

// OpenAI's presence / frequency penalties (as vLLM applies them): for every (id, count) in
// `counts` (the generated tokens so far, count > 0), logits[id] -= presence + frequency *
// count. ids outside [0, V) are ignored. logits[V] in place.
void apply_presence_frequency(float* logits, int64_t V, const std::unordered_map<int32_t, int32_t>& counts,
                              float presence, float frequency);

// Log-probabilities of one step for the API's `logprobs`: the chosen token's log-softmax
// value and the `top_n` most probable ids (descending; ties to the lower id), all from
// logits[V] as given (the caller passes them after penalties and grammar mask, before
// temperature: masked ids are -inf and rank last).
constexpr int kMaxTopLogprobs = 20;
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // [top_n] (id, logprob)
};
TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t token, int top_n);

// Index of the largest logit; ties go to the lowest id; NaN never wins (read as -inf).
// -inf (or NaN) everywhere returns 0. Throws std::invalid_argument for V < 1.
int32_t argmax(const float* logits, int64_t V);

// The distribution sampling draws from, after temperature, top-k (keeps every token tied
// with the k-th largest, as HF does) and top-p (keeps the smallest prefix of the sorted
// distribution whose mass reaches top_p, at least one token). probs[V] sums to 1; removed
// tokens are exactly 0. Requires !p.greedy() (throws std::invalid_argument otherwise, and
// for any value validate() rejects). logits are not modified.
// Details: temperature divides in double; top-k keeps every logit >= the k-th largest
// (k >= V keeps all); top-p ranks tokens by probability, ties ranked by id (the lower id
// counts as the more probable, as in argmax), and removes the least probable ones while
// the cumulative mass from the bottom stays <= 1 - top_p; the most probable always stays.
// -inf (masked) and NaN logits get probability 0. Degenerate rows: when every logit is
// -inf/NaN all mass goes to argmax() (id 0); when some are +inf they share it equally.
void sampling_distribution(const float* logits, int64_t V, const SamplingParams& p, std::vector<float>& probs);

// Draw an id from probs[V] (inverse CDF on one uniform in double): the first id whose
// cumulative mass exceeds u * total; a token with probability 0 is never drawn. Throws
// std::invalid_argument when no entry is positive.
int32_t sample_from(const std::vector<float>& probs, Rng& rng);

// Whole step on logits[V] (modified in place by the penalty): penalty over `seen`, then
// greedy argmax or sample from sampling_distribution. The grammar mask, when there is one,
// is applied by the caller between the penalty and this call (use apply_penalty = false).
// Validates p first. Greedy consumes no draw from rng; sampling consumes exactly one.
int32_t sample_next(float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen, Rng& rng,
                    bool apply_penalty = true);

// Stop sequences: non-empty, ids in [0, V). Matches the tail of the emitted tokens only
// (never reaching into the prompt). Checked after every emitted token, so a shorter sequence
// that completes first stops generation first; when several match at once (one is a suffix
// of another) the shortest wins, and among equal ones the first listed.
class StopMatcher {
 public:
  // Throws std::invalid_argument("stop_sequences: ...") for an empty sequence or an id
  // outside [0, vocab_size).
  StopMatcher(std::vector<std::vector<int32_t>> sequences, int64_t vocab_size);
  // True when the emitted tokens (output only, not the prompt) end with a stop sequence.
  bool matches(const std::vector<int32_t>& emitted) const { return match_index(emitted) >= 0; }
  // Index in the list of the winning sequence, or -1 when none matches.
  int match_index(const std::vector<int32_t>& emitted) const;
  size_t max_length() const { return max_len_; }  // the match window
  bool empty() const { return seqs_.empty(); }

 private:
  std::vector<std::vector<int32_t>> seqs_;
  size_t max_len_ = 0;
};

}  // namespace tinyloop::runtime
