// One cycle, with the committed prefix cached up to P - 1 and `cur` (committed, not yet run)
// at P, k = tree depth, Kc = branches:
//   root    prelude + iterations 0..d-1 of cur at P (a linear row, in the cache); the draft's
//           readout gives the root distribution; Kc candidates c_b (greedy: the top Kc).
//   levels  δ = 1..k: the Kc nodes (b, δ) at position P + δ in one draft forward with the
//           tree mask (K/V in SpecAttention's scratch); for δ < k the draft readout picks
//           each branch's next token.
//   verify  iterations d..L-1 and the verifier's readout of root + all Kc * k nodes in one
//           forward with the tree mask: the verifier's logits after every tree prefix.
//   accept  the root's token picks a branch (greedy: the candidate equal to the verifier's
//           argmax; sampling: the multi-draft rule), then the chain rule down that branch,
//           then one token from the verifier. The accepted path's K/V rows move from scratch
//           into the cache (SpecAttention::commit); nothing is re-run.
#include "runtime/tree_speculative.h"

#include <algorithm>
#include <cstring>

#include "runtime/spec_sampling.h"

namespace tinyloop::runtime {
namespace {

// A branch's tokens at depths 1..n.
std::vector<int32_t> prefix(const std::vector<int32_t>& branch, int64_t n) {
  return std::vector<int32_t>(branch.begin(), branch.begin() + n);
}

}  // namespace

SpeculativeResult generate_tree_speculative(const Engine& engine, const SpeculativeRequest& req) {
  validate(engine, req, /*tree=*/true);
  const ModelConfig& c = engine.config();
  const int64_t D = c.dim, V = c.vocab_size;
  const SamplingParams& sp = req.sampling;
  const bool greedy = sp.greedy();
  Rng rng = req.seed ? Rng(*req.seed) : Rng::from_entropy();

  auto kv = new_spec_cache(engine, req);
  const int64_t depth_cap = std::min(req.draft_ahead, req.max_tokens);  // scratch depth
  model::SpecForward f(engine.model(), *kv, req.draft_loops, req.verify_loops, req.k_branches, depth_cap);
  SpecOutput out(engine, req);
  PendingDraftRows pending(c);
  SpeculativeResult res;

  const int64_t T0 = static_cast<int64_t>(req.prompt.size());
  f.prefill(req.prompt.data(), T0 - 1);  // the last prompt token is the first root
  int32_t cur = req.prompt.back();

  std::vector<float> x_root(D), s_root(D), s_tmp;  // [D] root's loop input, state after d
  std::vector<float> logits, p, q_root;  // [rows, V], [V], [V]
  while (true) {
    const int64_t P = kv->length();
    const int64_t k = std::min(req.draft_ahead, out.remaining() - 1);

    // Root.
    f.router().set_all_linear();
    f.draft_prefix(&cur, &P, 1, x_root.data(), s_root.data());
    ++res.draft_calls;
    if (k == 0) {  // the last token: nothing to draft, the verifier decides alone
      s_tmp = s_root;
      f.verify_rest(s_tmp.data(), x_root.data(), &P, 1);
      f.readout(s_tmp.data(), &P, 1, false, model::LogitRows::Last, logits);
      kv->advance(1);
      ++res.verify_calls;
      pending.add(P, s_root.data());
      out.push(pick_token(logits.data(), V, sp, out.seen_with({}), p, rng));
      break;  // remaining was 1
    }
    pending.readout(f, s_root.data(), P, logits);
    const auto seen0 = out.seen_with({});
    std::vector<int32_t> cands;
    if (greedy) {
      std::vector<float> z(logits.begin(), logits.begin() + V);  // [V] penalised root logits
      apply_repetition_penalty(z.data(), V, seen0, sp.repetition_penalty);
      cands = top_ids(z.data(), V, req.k_branches);
    } else {
      row_distribution(logits.data(), V, sp, seen0, q_root);
      cands = draw_without_replacement(q_root, req.k_branches, rng);
    }
    const int64_t Kc = static_cast<int64_t>(cands.size());

    // Levels: all branches one depth at a time.
    f.router().begin_tree(P);
    std::vector<std::vector<int32_t>> tok(Kc, std::vector<int32_t>(k));  // [Kc][k]
    std::vector<std::vector<std::vector<float>>> q(Kc, std::vector<std::vector<float>>(k));  // [Kc][k][V]
    std::vector<float> xn(Kc * k * D), sn(Kc * k * D);  // [Kc, k, D] node loop inputs / states after d
    for (int64_t b = 0; b < Kc; ++b) tok[b][0] = cands[b];
    for (int64_t lv = 0; lv < k; ++lv) {  // depth lv + 1
      std::vector<int64_t> nodes(Kc), pos(Kc, P + lv + 1);  // [Kc]
      std::vector<int32_t> ids(Kc);  // [Kc]
      for (int64_t b = 0; b < Kc; ++b) nodes[b] = b * depth_cap + lv, ids[b] = tok[b][lv];
      std::vector<float> x(Kc * D), s(Kc * D);  // [Kc, D]
      f.router().set_rows(0, nodes);
      f.draft_prefix(ids.data(), pos.data(), Kc, x.data(), s.data());
      ++res.draft_calls;
      for (int64_t b = 0; b < Kc; ++b) {
        std::memcpy(&xn[(b * k + lv) * D], &x[b * D], sizeof(float) * D);
        std::memcpy(&sn[(b * k + lv) * D], &s[b * D], sizeof(float) * D);
      }
      if (lv + 1 == k) break;
      f.readout(s.data(), pos.data(), Kc, true, model::LogitRows::All, logits);
      for (int64_t b = 0; b < Kc; ++b) {
        const auto seen = out.seen_with(prefix(tok[b], lv + 1));
        tok[b][lv + 1] = pick_token(logits.data() + b * V, V, sp, seen, q[b][lv + 1], rng);
      }
    }

    // Verify root + every node in one forward: rows [root, (0,1..k), (1,1..k), ...].
    const int64_t n = 1 + Kc * k;
    std::vector<int64_t> nodes, pos(n);  // [Kc * k], [n]
    std::vector<float> x(n * D), s(n * D);  // [n, D]
    pos[0] = P;
    std::memcpy(x.data(), x_root.data(), sizeof(float) * D);
    std::memcpy(s.data(), s_root.data(), sizeof(float) * D);
    std::memcpy(x.data() + D, xn.data(), sizeof(float) * Kc * k * D);
    std::memcpy(s.data() + D, sn.data(), sizeof(float) * Kc * k * D);
    for (int64_t b = 0; b < Kc; ++b)
      for (int64_t lv = 0; lv < k; ++lv) {
        nodes.push_back(b * depth_cap + lv);
        pos[1 + b * k + lv] = P + lv + 1;
      }
    f.router().set_rows(1, nodes);
    f.verify_rest(s.data(), x.data(), pos.data(), n);
    f.readout(s.data(), pos.data(), n, false, model::LogitRows::All, logits);
    kv->advance(1);  // the root
    ++res.verify_calls;

    // Accept: pick a branch at the root, then walk it.
    int64_t bi = -1, m = 0;
    int32_t next = -1;
    if (greedy) {
      const int32_t t = greedy_token(logits.data(), V, sp, seen0);
      const auto it = std::find(cands.begin(), cands.end(), t);
      if (it == cands.end()) next = t;
      else bi = it - cands.begin();
    } else {
      row_distribution(logits.data(), V, sp, seen0, p);
      bi = accept_among(p, q_root, cands, rng, &next);
    }
    if (bi >= 0) {  // tok[bi][0] accepted: the chain rule down the rest of the branch
      const float* branch_rows = logits.data() + (1 + bi * k) * V;  // [k, V] lv: after tok[bi][0..lv]
      const ChainVerdict v = verify_chain(branch_rows, V, sp, out, tok[bi].data(), k, 1, q[bi], p, rng);
      m = v.accepted, next = v.next;
      f.router().commit(*kv, bi, m);
      kv->advance(m);
      if (m == k) pending.add(P + k, &sn[(bi * k + k - 1) * D]);
    }
    res.drafted += k;
    res.accepted += m;

    if (out.push_cycle(bi >= 0 ? tok[bi].data() : nullptr, m, next)) break;
    cur = next;
  }
  out.finish(res);
  return res;
}

}  // namespace tinyloop::runtime
