// Constrained decoding inside the decode loop (docs/grammar.md, "Connecting it to
// generate"): one grammar state per sequence, a mask applied after the repetition penalty,
// EOS legal exactly where the output so far is a full match.
#pragma once
#include <cstdint>
#include <memory>

#include "grammar/grammar.h"
#include "tinyloop/config.h"

namespace tinyloop::runtime {

class GrammarCursor {
 public:
  // g may be null (no grammar: every call is a no-op). Throws std::invalid_argument when
  // the grammar has no vocabulary or one whose size differs from the model's.
  GrammarCursor(std::shared_ptr<const grammar::Grammar> g, const ModelConfig& c);

  bool active() const { return g_ != nullptr; }
  // logits[V]: -inf on every token the grammar does not allow from the current state; the
  // model's EOS ids keep their logits only when the output so far is a full match.
  // Returns false when nothing is allowed but the output is already a full match (a model
  // without EOS ids): generation ends there. Throws std::runtime_error when nothing is
  // allowed and the output is not a match (the vocabulary cannot spell a continuation).
  bool mask(float* logits) const;
  // Moves past a sampled non-EOS token (one the mask allowed).
  void advance(int32_t token);
  // True when the grammar admits no more bytes: generation must end here.
  bool finished() const;

 private:
  std::shared_ptr<const grammar::Grammar> g_;
  std::shared_ptr<const grammar::TokenMasks> masks_;  // one vocabulary snapshot per call
  const ModelConfig& c_;
  int32_t state_ = 0;
};

}  // namespace tinyloop::runtime
