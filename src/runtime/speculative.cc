// One cycle, with the committed prefix in the cache up to position P - 1 and `cur` (the
// last committed token, not yet run) at P:
//   draft   row j = 0..k: prelude + iterations 0..d-1 of token r_j at P + j (r_0 = cur),
//           keeping x and the state; for j < k the draft's readout gives r_{j+1}.
//   verify  iterations d..L-1 of all k + 1 rows at once, then the verifier's readout of
//           every row: the logits after cur, r_1, .., r_k.
//   accept  r_1.. while the verifier agrees (greedy) or by the speculative sampling rule,
//           then one token from the verifier (correction, or bonus when all are accepted).
// The rows' pre slots and iteration 0..d-1 slots written by the draft are the verifier's
// too, so nothing is recomputed; rejected rows are rolled back with KvCache::truncate.
#include "runtime/speculative.h"

#include <algorithm>
#include <cstring>

#include "runtime/spec_sampling.h"

namespace tinyloop::runtime {

SpeculativeResult generate_speculative(const Engine& engine, const SpeculativeRequest& req) {
  validate(engine, req, /*tree=*/false);
  const ModelConfig& c = engine.config();
  const int64_t D = c.dim, V = c.vocab_size;
  const SamplingParams& sp = req.sampling;
  const bool greedy = sp.greedy();
  Rng rng = req.seed ? Rng(*req.seed) : Rng::from_entropy();

  auto kv = new_spec_cache(engine, req);
  model::SpecForward f(engine.model(), *kv, req.draft_loops, req.verify_loops, 0, 0);
  SpecOutput out(engine, req);
  PendingDraftRows pending(c);
  SpeculativeResult res;

  // The last prompt token is the first cycle's `cur`, so the first new token is already
  // drafted and verified (and its logits are the same as a whole-prompt prefill's).
  const int64_t T0 = static_cast<int64_t>(req.prompt.size());
  f.prefill(req.prompt.data(), T0 - 1);
  int32_t cur = req.prompt.back();

  std::vector<int32_t> rows;        // [k + 1] r_0 = cur, r_1..r_k drafted
  std::vector<int64_t> pos;         // [k + 1] P .. P + k
  std::vector<float> x, s, s_draft;  // [k + 1, D] loop input, loop state, state after d
  std::vector<std::vector<float>> q;  // [k][V] draft distribution of r_1..r_k (sampling)
  std::vector<float> logits, p;      // [V] / [k + 1, V], [V]
  while (true) {
    const int64_t P = kv->length();
    const int64_t k_max = std::min(req.draft_ahead, out.remaining() - 1);
    rows.assign(1, cur);
    pos.clear();
    q.clear();
    x.clear(), s.clear(), s_draft.clear();
    // Draft.
    bool last = false;  // the newest draft token would end generation: draft no further
    for (int64_t j = 0;; ++j) {
      pos.push_back(P + j);
      x.resize((j + 1) * D), s.resize((j + 1) * D);
      f.router().set_all_linear();
      f.draft_prefix(&rows[j], &pos[j], 1, x.data() + j * D, s.data() + j * D);
      s_draft.insert(s_draft.end(), s.begin() + j * D, s.begin() + (j + 1) * D);
      ++res.draft_calls;
      if (j == k_max || last) break;
      pending.readout(f, s.data() + j * D, P + j, logits);
      const std::vector<int32_t> drafted(rows.begin() + 1, rows.end());
      const auto seen = out.seen_with(drafted);
      int32_t next;
      if (greedy) {
        next = greedy_token(logits.data(), V, sp, seen);
      } else {
        q.emplace_back();
        row_distribution(logits.data(), V, sp, seen, q.back());
        next = sample_from(q.back(), rng);
      }
      rows.push_back(next);
      last = out.ends_with(std::vector<int32_t>(rows.begin() + 1, rows.end()));
    }
    const int64_t k = static_cast<int64_t>(rows.size()) - 1;

    // Verify all k + 1 rows in one forward.
    f.router().set_all_linear();
    f.verify_rest(s.data(), x.data(), pos.data(), k + 1);
    f.readout(s.data(), pos.data(), k + 1, false, model::LogitRows::All, logits);
    kv->advance(k + 1);
    ++res.verify_calls;

    // Accept.
    int64_t m = 0;
    int32_t next = -1;
    for (; m <= k; ++m) {
      const float* row = logits.data() + m * V;  // after cur, r_1..r_m
      const auto seen = out.seen_with(std::vector<int32_t>(rows.begin() + 1, rows.begin() + 1 + m));
      if (greedy) {
        const int32_t t = greedy_token(row, V, sp, seen);
        if (m < k && t == rows[m + 1]) continue;
        next = t;
        break;
      }
      row_distribution(row, V, sp, seen, p);
      if (m == k) {  // every draft token accepted: a bonus token from the verifier
        next = sample_from(p, rng);
        break;
      }
      if (accept_draft(p, q[m], rows[m + 1], rng)) continue;
      next = sample_from(residual(p, q[m]), rng);
      break;
    }
    res.drafted += k;
    res.accepted += m;
    kv->truncate(P + m + 1);  // cur and the accepted rows stay
    if (m == k) pending.add(P + k, s_draft.data() + k * D);

    // Emit.
    bool stop = false;
    for (int64_t j = 1; j <= m && !stop; ++j) stop = out.push(rows[j]);
    if (!stop) stop = out.push(next);
    if (stop) break;
    cur = next;
  }
  res.tokens = std::move(out.tokens());
  res.tokens_emitted = static_cast<int64_t>(res.tokens.size()) - T0;
  return res;
}

}  // namespace tinyloop::runtime
