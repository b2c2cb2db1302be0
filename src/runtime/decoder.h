// What turns a sequence's logits into its next token and decides when it ends: the one
// place for the repetition penalty, the grammar mask, sampling, EOS, stop sequences and
// max_tokens (docs/generation.md). generate(), generate_stream(), resume, the prefix paths
// and every request of the serving engine decode through it, so these rules cannot drift
// apart between entry points.
#pragma once
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "runtime/generate.h"
#include "runtime/grammar_step.h"
#include "runtime/sampler.h"

namespace tinyloop::runtime {

class SequenceDecoder {
 public:
  // req must be valid (validate()); the prompt seeds the repetition penalty's set.
  SequenceDecoder(const ModelConfig& c, const GenerateRequest& req);

  // The logits processing every strategy shares, on logits [V] in place: the repetition
  // penalty over prompt + output, the presence / frequency penalties over the output, then
  // the grammar mask. False when the grammar has reached
  // a full match that nothing can extend on a model without EOS (no token is allowed).
  // Sampling (choose), beam search (log-softmax) and speculative verification differ only
  // in what they do with the result.
  bool process(float* logits) const;
  // The next token from logits [V] (modified in place): process(), then temperature /
  // top-k / top-p -> sample (greedy consumes no random draw). nullopt when process() finds
  // nothing allowed: the sequence ends there (reason() == Grammar) without a token. With
  // req.logprobs >= 0 it also keeps the token's log-probabilities (of the processed logits,
  // before temperature) for emit() to record.
  std::optional<int32_t> choose(float* logits);
  // Records a token emitted after `depth` loop iterations and returns why the sequence must
  // stop after it (None: go on). Checks, in order: max_tokens, EOS, the grammar, stop
  // sequences.
  FinishReason emit(int32_t token, int64_t depth);
  // Whether emitting `more` after the current output would end the sequence at its last
  // token (speculative decoding stops drafting there): max_tokens, EOS, stop sequences.
  bool would_end(const std::vector<int32_t>& more) const;
  // Ends the sequence for a reason from outside (callback, cancel, timeout, error).
  void finish(FinishReason r) { reason_ = r; }

  bool finished() const { return reason_ != FinishReason::None; }
  FinishReason reason() const { return reason_; }
  const std::vector<int32_t>& emitted() const { return emitted_; }
  const std::vector<int64_t>& depths() const { return depths_; }  // [emitted] loops behind each
  // [emitted] when req.logprobs >= 0 (a token emitted without choose() gets NaN); else empty.
  const std::vector<TokenLogprobs>& logprobs() const { return logprobs_; }
  bool wants_logprobs() const { return top_logprobs_ >= 0; }
  // The distinct ids of prompt + output (the repetition penalty's set), in first-seen order.
  const std::vector<int32_t>& seen() const { return seen_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  bool is_eos(int32_t id) const;
  const ModelConfig& c_;
  SamplingParams sampling_;
  int64_t max_tokens_;
  bool stop_at_eos_;
  StopMatcher stops_;
  Rng rng_;
  GrammarCursor grammar_;
  std::vector<uint8_t> seen_mark_;  // [V] 1 = in prompt + output
  std::vector<int32_t> seen_;  // distinct ids of prompt + output (the penalty's set)
  std::unordered_map<int32_t, int32_t> out_counts_;  // id -> times emitted (the penalties' counts)
  int top_logprobs_ = -1;
  std::optional<TokenLogprobs> pending_logprobs_;  // of the token choose() returned last
  std::vector<TokenLogprobs> logprobs_;
  std::vector<int32_t> emitted_;
  std::vector<int64_t> depths_;
  FinishReason reason_ = FinishReason::None;
};

}  // namespace tinyloop::runtime
