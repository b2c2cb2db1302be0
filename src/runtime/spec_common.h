// What chain and tree self-speculative decoding share (docs/speculative.md): the request and
// result, argument validation, the KV cache they decode in, the output with its stop rules,
// the per-row sampling distributions, and the chain rule that accepts drafted tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/kv_cache.h"
#include "model/spec_forward.h"
#include "grammar/grammar.h"
#include "runtime/decoder.h"
#include "runtime/early_exit.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace tinyloop::runtime {

struct SpeculativeRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 64;
  int64_t draft_loops = 2;
  int64_t verify_loops = 8;
  int64_t draft_ahead = 4;  // chain length / depth of each tree branch
  int64_t k_branches = 1;  // tree only: branches from the root
  SamplingParams sampling;  // of the verifier; the draft samples with the same settings
  int64_t cache_window = 0;
  std::vector<std::vector<int32_t>> stop_sequences;
  std::optional<uint64_t> seed;
  bool stop_at_eos = true;
  // generate()'s other features, accepted so the call can say why each does not combine
  // with speculative decoding (validate() refuses them by name).
  std::shared_ptr<const grammar::Grammar> grammar;
  EarlyExitParams early_exit;
  int64_t kv_loop_slots = 0;
};

struct SpeculativeResult {
  std::vector<int32_t> tokens;  // prompt followed by the emitted tokens
  int64_t draft_calls = 0;  // draft forwards (one per drafted row; a tree level is one)
  int64_t verify_calls = 0;  // verify forwards (one per cycle)
  int64_t drafted = 0;  // draft positions put to the verifier (tree: its depth)
  int64_t accepted = 0;  // of those, accepted by the verifier
  int64_t tokens_emitted = 0;
  double accept_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  double tokens_per_verify() const { return verify_calls ? double(tokens_emitted) / double(verify_calls) : 0.0; }
};

// Largest K_branches * draft_ahead of a tree (its scratch rows per slot).
inline constexpr int64_t kMaxTreeNodes = 64;

// Every generate() argument as generate validates it, then draft_loops, verify_loops,
// draft_ahead (and K_branches for a tree): std::invalid_argument naming the argument.
void validate(const Engine& e, const SpeculativeRequest& r, bool tree);

// The cache of a speculative call: slots for verify_loops iterations plus n_post_blocks
// extra slots (the draft's post blocks). With a window, blocks are released only past window + KvCache::kWindowSlack positions:
// room for a cycle's rollback.
std::unique_ptr<model::KvCache> new_spec_cache(const Engine& e, const SpeculativeRequest& r);

// The emitted tokens and the rules that end generation: generate()'s own SequenceDecoder
// (max_tokens, EOS, stop sequences; the penalty's set), so the speculative paths cannot stop
// differently from generate().
class SpecOutput {
 public:
  SpecOutput(const Engine& e, const SpeculativeRequest& r);
  // Append one token; true when generation ends after it (max_tokens, EOS, stop sequence).
  bool push(int32_t tok);
  // Whether emitting `drafted` after the current output would end generation at its last
  // token (so drafting past it is wasted).
  bool ends_with(const std::vector<int32_t>& drafted) const { return dec_.would_end(drafted); }
  int64_t remaining() const { return dec_.max_tokens() - emitted(); }
  // Distinct ids of prompt + output, then `extra` (a drafted prefix): the penalty's set.
  std::vector<int32_t> seen_with(const std::vector<int32_t>& extra) const;
  int64_t emitted() const { return static_cast<int64_t>(dec_.emitted().size()); }
  // A cycle's output: the `accepted` drafted tokens [m], then the verifier's `next`, each
  // pushed until one ends generation; true when it ended.
  bool push_cycle(const int32_t* accepted, int64_t m, int32_t next);
  // Moves the tokens (prompt + emitted) and the emitted count into res; the output is
  // empty afterwards.
  void finish(SpeculativeResult& res);

 private:
  int64_t verify_loops_;
  SequenceDecoder dec_;
  int64_t prompt_len_;
  std::vector<int32_t> tokens_;  // prompt + emitted
};

// Committed positions whose draft readout has not run (the last row of a fully accepted
// cycle: the verifier needed only its state after d iterations), so their draft post-block
// K/V are missing. The next draft readout runs them first, in the same call. Nothing is kept
// for a model without post blocks (its readout writes no K/V).
class PendingDraftRows {
 public:
  explicit PendingDraftRows(const ModelConfig& c) : D_(c.dim), needed_(c.n_post_blocks > 0) {}
  // s [D]: the loop state after d iterations of position pos.
  void add(int64_t pos, const float* s);
  // Draft logits [V] of state s_row [D] at pos (not clobbered), pending rows first; all rows
  // of the call are linear.
  void readout(model::SpecForward& f, const float* s_row, int64_t pos, std::vector<float>& logits);

 private:
  int64_t D_;
  bool needed_;
  std::vector<int64_t> pos_;  // [n]
  std::vector<float> s_;  // [n, D]
};

// One row of logits [V] turned into what the sampler uses, with the repetition penalty over
// `seen`: the greedy token, or the sampling distribution probs [V].
int32_t greedy_token(const float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen);
void row_distribution(const float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen,
                      std::vector<float>& probs);

// The token a row of logits [V] gives with the penalty over `seen`: greedy_token, or (sampling)
// a draw from row_distribution, which is left in probs [V] for the acceptance rule.
int32_t pick_token(const float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen,
                   std::vector<float>& probs, Rng& rng);

// What the verifier makes of a drafted chain: how many of its tokens it accepts, and the
// token it adds after them (its correction, or a bonus when it accepts them all).
struct ChainVerdict {
  int64_t accepted = 0;
  int32_t next = -1;
};

// The chain rule down drafted [k], whose first `from` tokens are already accepted: at each
// m >= from the verifier's row after drafted[0 .. m-1] either agrees with drafted[m] (greedy:
// its token equals it; sampling: accept_draft against q[m], the draft's distribution [V] of
// drafted[m]) and the walk goes on, or gives `next` (at m == k, all accepted: the verifier's
// bonus token). logits [k + 1 - from, V]: row i is the
// verifier's after drafted[0 .. from + i - 1]. The penalty's set is out's plus the accepted
// prefix; probs [V] is scratch.
ChainVerdict verify_chain(const float* logits, int64_t V, const SamplingParams& p, const SpecOutput& out,
                          const int32_t* drafted, int64_t k, int64_t from, const std::vector<std::vector<float>>& q,
                          std::vector<float>& probs, Rng& rng);

}  // namespace tinyloop::runtime
