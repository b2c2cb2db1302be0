// Beam search (docs/beam-search.md).
//
// Two parts, so the search can be tested on hand-made numbers:
//   * the core, beam_search_core(): hypotheses, candidates, survivors, finished hypotheses,
//     length normalisation and early stopping, over a BeamModel that answers "log-probs of
//     the next token for these beams" -- no model, no cache;
//   * the glue, beam_generate(): a BeamModel over the looped model, with the prompt's KV
//     prefilled once and its KV blocks shared by every beam, each beam adding blocks for its
//     generated tokens only and sharing its parent's at a reorder (copy-on-write, no copy of
//     the prompt); repetition penalty, grammar, stop sequences, EOS and early exit per beam.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generate.h"

namespace tinyloop::runtime {

struct BeamParams {
  int64_t beam_size = 0;  // 0 or 1: no beam search; >= 2: beam search
  double length_penalty = 1.0;  // final score = log_prob / max(1, new_len)^length_penalty
  bool early_stopping = true;  // stop once the top-ranked hypothesis has ended
  bool active() const { return beam_size >= 2; }
};

constexpr int64_t kMaxBeamSize = 4096;  // a bound on the search's memory, not a quality knob

// std::invalid_argument naming the kwarg: beam_size < 0 or > kMaxBeamSize (always checked);
// length_penalty not finite (checked only when beam search is active: ignored otherwise,
// as top_k is under greedy decoding).
void validate(const BeamParams& p);

// log_prob / max(1, new_len)^length_penalty (the spec's final ranking).
double beam_score(double log_prob, int64_t new_len, double length_penalty);

// ---- the search core ----

// What the search asks of the model side. Beams are numbered 0 .. n-1 in the order of the
// last select() (one beam, the bare prompt, before the first).
class BeamModel {
 public:
  virtual ~BeamModel() = default;
  // out[n * V]: log-probabilities of the next token for each of the n live beams (after
  // whatever penalties and masks apply to that beam); -inf = the token is not allowed. A row
  // that is -inf everywhere means the beam cannot continue: it ends as it is.
  virtual void log_probs(int64_t n, std::vector<double>& out) = 0;
  // True when appending `token` to live beam `beam` ends that hypothesis (EOS, a stop
  // sequence, a grammar that admits nothing more). It is then finished, not expanded.
  virtual bool ends(int64_t beam, int32_t token) = 0;
  // The survivors: new beam i continues old beam parent[i] with token[i]. Called before the
  // next log_probs(), never after the search has stopped.
  virtual void select(const std::vector<int64_t>& parent, const std::vector<int32_t>& token) = 0;
};

struct BeamSearchResult {
  std::vector<int32_t> tokens;  // the winning hypothesis' generated tokens
  // [tokens.size()]: for each of the winner's tokens, the index of the live beam whose
  // log_probs() row chose it, at that step (lets the glue look up per-step facts, such as
  // the loop depth early exit ran).
  std::vector<int64_t> history;
  double log_prob = 0;  // its summed log-probability
  double score = 0;  // beam_score(log_prob, tokens.size(), length_penalty)
  int64_t steps = 0;  // log_probs() calls made
};

// Deterministic beam search, Hugging Face's BeamSearchScorer rules with the spec's
// early_stopping (docs/beam-search.md):
//  * per step every live beam offers its 2 * beam_size most likely tokens (-inf excluded),
//    scored by the beam's log_prob + the token's; the 2 * beam_size best of all offers,
//    best first (ties: lower beam, then lower token id), are walked in order;
//  * an offer that ends its hypothesis (ends()) is finished if its rank is < beam_size,
//    else dropped; any other offer survives until beam_size survivors are found;
//  * at max_tokens every survivor is finished too; the winner is the finished hypothesis
//    with the best beam_score (ties: the one finished first);
//  * early_stopping: the search stops as soon as the best finished hypothesis ranks at
//    least as high (beam_score) as every live beam; otherwise it runs to max_tokens (or
//    until no beam is live), which returns the same hypothesis as HF's
//    early_stopping="never".
BeamSearchResult beam_search_core(BeamModel& model, int64_t vocab_size, int64_t max_tokens, const BeamParams& p);

// ---- the model glue ----

// Peak KV bytes of a beam_generate call, for docs/beam-search.md and its benchmark.
struct BeamMemory {
  int64_t prefix_bytes = 0;  // the prompt's KV, shared read-only by every beam
  int64_t tail_bytes = 0;  // one beam's tail (its generated tokens' KV)
  int64_t peak_tails = 0;  // most tails alive at once (<= beam_size)
  int64_t peak_bytes = 0;  // prefix_bytes + peak_tails * tail_bytes
  int64_t naive_bytes = 0;  // beam_size full caches of prompt + max_tokens (the spec's scheme)
  int64_t tail_rows_copied = 0;  // KV rows (one position, one slot) copied by reorders
};

// generate(req) with beam search (p.active()). Validates everything generate() does, with
// temperature / top_k / top_p / seed ignored, then the beam kwargs. Returns the prompt
// followed by the winning beam's tokens; loops_per_token holds that beam's depths. on_token
// (optional) is called with the winning beam's tokens once the search is over (a stream of
// the final beam; returning false truncates it). memory (optional) receives the KV figures.
GenerateResult beam_generate(const Engine& engine, const GenerateRequest& req, const BeamParams& p,
                             const TokenCallback& on_token = {}, BeamMemory* memory = nullptr);

}  // namespace tinyloop::runtime
