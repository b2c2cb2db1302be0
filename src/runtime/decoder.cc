#include "runtime/decoder.h"

#include <cmath>

namespace tinyloop::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Length: return "length";
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Grammar: return "grammar";
    case FinishReason::Callback: return "callback";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "none";
}

SequenceDecoder::SequenceDecoder(const ModelConfig& c, const GenerateRequest& req)
    : c_(c),
      sampling_(req.sampling),
      max_tokens_(req.max_tokens),
      stop_at_eos_(req.stop_at_eos),
      stops_(req.stop_sequences, c.vocab_size),
      rng_(req.seed ? Rng(*req.seed) : Rng::from_entropy()),
      grammar_(req.grammar, c),
      seen_mark_(static_cast<size_t>(c.vocab_size), 0),
      top_logprobs_(req.logprobs) {
  for (int32_t id : req.prompt)
    if (!seen_mark_[size_t(id)]) seen_mark_[size_t(id)] = 1, seen_.push_back(id);
}

bool SequenceDecoder::is_eos(int32_t id) const {
  for (int64_t e : c_.eos_ids)
    if (e == id) return true;
  return false;
}

bool SequenceDecoder::process(float* logits) const {
  // Order (docs/generation.md "The decode loop"): penalty -> grammar mask -> (the strategy's own step).
  if (sampling_.repetition_penalty != 1.0f)
    apply_repetition_penalty(logits, c_.vocab_size, seen_, sampling_.repetition_penalty);
  apply_presence_frequency(logits, c_.vocab_size, out_counts_, sampling_.presence_penalty, sampling_.frequency_penalty);
  return grammar_.mask(logits);
}

std::optional<int32_t> SequenceDecoder::choose(float* logits) {
  if (!process(logits)) {  // a full match nothing can extend
    reason_ = FinishReason::Grammar;
    return std::nullopt;
  }
  // sample_next leaves logits as they are without the penalty: the logprobs read them after.
  const int32_t tok = sample_next(logits, c_.vocab_size, sampling_, seen_, rng_, /*apply_penalty=*/false);
  if (top_logprobs_ >= 0) pending_logprobs_ = token_logprobs(logits, c_.vocab_size, tok, top_logprobs_);
  return tok;
}

bool SequenceDecoder::would_end(const std::vector<int32_t>& more) const {
  if (more.empty()) return false;
  if (static_cast<int64_t>(emitted_.size() + more.size()) >= max_tokens_) return true;
  if (stop_at_eos_ && is_eos(more.back())) return true;
  if (stops_.empty()) return false;
  // Only the match window of the tail matters.
  std::vector<int32_t> tail(emitted_.end() - int64_t(std::min(emitted_.size(), stops_.max_length())), emitted_.end());
  tail.insert(tail.end(), more.begin(), more.end());
  return stops_.matches(tail);
}

FinishReason SequenceDecoder::emit(int32_t tok, int64_t depth) {
  emitted_.push_back(tok);
  depths_.push_back(depth);
  if (!seen_mark_[size_t(tok)]) seen_mark_[size_t(tok)] = 1, seen_.push_back(tok);
  if (sampling_.presence_penalty != 0.0f || sampling_.frequency_penalty != 0.0f) ++out_counts_[tok];
  if (top_logprobs_ >= 0) {
    logprobs_.push_back(pending_logprobs_.value_or(TokenLogprobs{std::nanf(""), {}}));
    pending_logprobs_.reset();
  }
  if (static_cast<int64_t>(emitted_.size()) >= max_tokens_) return reason_ = FinishReason::Length;
  if (stop_at_eos_ && is_eos(tok)) return reason_ = FinishReason::Eos;
  if (grammar_.active()) {
    if (is_eos(tok)) return reason_ = FinishReason::Eos;  // EOS was allowed: a full match
    grammar_.advance(tok);
    if (grammar_.finished()) return reason_ = FinishReason::Grammar;
  }
  if (stops_.matches(emitted_)) return reason_ = FinishReason::Stop;
  return FinishReason::None;
}

}  // namespace tinyloop::runtime
