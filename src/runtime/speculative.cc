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

namespace tinyloop::runtime {

SpeculativeResult generate_speculative(const Engine& engine, const SpeculativeRequest& req) {
  validate(engine, req, /*tree=*/false);
  const ModelConfig& c = engine.config();
  const int64_t D = c.dim, V = c.vocab_size;
  const SamplingParams& sp = req.sampling;
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

  std::vector<int32_t> rows;  // [k + 1] r_0 = cur, r_1..r_k drafted
  std::vector<int64_t> pos;  // [k + 1] P .. P + k
  std::vector<float> x, s, s_draft;  // [k + 1, D] loop input, loop state, state after d
  std::vector<std::vector<float>> q;  // [k][V] draft distribution of r_1..r_k (greedy: [k][0])
  std::vector<float> logits, p;  // [V] / [k + 1, V], [V]
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
      q.emplace_back();  // filled when sampling
      rows.push_back(pick_token(logits.data(), V, sp, seen, q.back(), rng));
      last = out.ends_with(std::vector<int32_t>(rows.begin() + 1, rows.end()));
    }
    const int64_t k = static_cast<int64_t>(rows.size()) - 1;

    // Verify all k + 1 rows in one forward.
    f.router().set_all_linear();
    f.verify_rest(s.data(), x.data(), pos.data(), k + 1);
    f.readout(s.data(), pos.data(), k + 1, false, model::LogitRows::All, logits);
    kv->advance(k + 1);
    ++res.verify_calls;

    // Accept: logits row m is the verifier's after cur, r_1..r_m.
    const auto [m, next] = verify_chain(logits.data(), V, sp, out, rows.data() + 1, k, 0, q, p, rng);
    res.drafted += k;
    res.accepted += m;
    kv->truncate(P + m + 1);  // cur and the accepted rows stay
    if (m == k) pending.add(P + k, s_draft.data() + k * D);

    if (out.push_cycle(rows.data() + 1, m, next)) break;
    cur = next;
  }
  out.finish(res);
  return res;
}

}  // namespace tinyloop::runtime
