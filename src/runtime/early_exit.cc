#include "runtime/early_exit.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "runtime/batch_step.h"

namespace tinyloop::runtime {

void validate(const EarlyExitParams& p) {
  if (p.patience < 0)
    throw std::invalid_argument("early_exit_patience must be >= 0, got " + std::to_string(p.patience));
  if (p.min_L < 1) throw std::invalid_argument("early_exit_min_L must be >= 1, got " + std::to_string(p.min_L));
  if (p.peek_every < 1)
    throw std::invalid_argument("early_exit_peek_every must be >= 1, got " + std::to_string(p.peek_every));
  if (!(p.tau >= 0))  // also rejects NaN
    throw std::invalid_argument("early_exit_tau must be >= 0, got " + std::to_string(p.tau));
  if (!(p.logit_margin >= 0))
    throw std::invalid_argument("early_exit_logit_margin must be >= 0, got " + std::to_string(p.logit_margin));
}

void fill_skipped_slots(model::KvCache& kv, int64_t done, int64_t loops, int64_t p) {
  if (done >= loops) return;
  if (done < 1) throw std::logic_error("fill_skipped_slots needs at least one computed iteration");
  const model::SlotLayout& s = kv.layout();
  for (int64_t j = 0; j < s.n_loop; ++j)
    for (int64_t i = done; i < loops; ++i) kv.copy_row(s.loop(done - 1, j), s.loop(i, j), p);
}

bool hidden_stable(const float* prev, const float* cur, int64_t n, double tau) {
  double diff2 = 0, norm2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(cur[i]) - double(prev[i]);
    diff2 += d * d;
    norm2 += double(cur[i]) * double(cur[i]);
  }
  // Written without a division so a zero state is never "stable" by 0/0.
  return std::sqrt(diff2) < tau * std::sqrt(norm2);
}

double top_gap(const float* logits, int64_t V) {
  double top1 = -std::numeric_limits<double>::infinity(), top2 = top1;
  for (int64_t v = 0; v < V; ++v) {
    const double z = logits[v];
    if (std::isnan(z)) continue;
    if (z > top1) {
      top2 = top1;
      top1 = z;
    } else if (z > top2) {
      top2 = z;
    }
  }
  if (V == 1) return std::numeric_limits<double>::infinity();
  return top1 - top2;
}

int64_t decode_step_early_exit(const model::LoopedModel& m, model::KvCache& kv, int32_t token, int64_t loops,
                               const EarlyExitParams& p, std::vector<float>& logits) {
  // One part of the batched step: the probes, the stop and the latest rule live there.
  StepScratch scratch(m);
  std::vector<StepPart> parts(1);
  parts[0].kv = &kv;
  parts[0].tokens = &token;
  parts[0].n = 1;
  parts[0].loops = loops;
  parts[0].early_exit = &p;
  parts[0].want_logits = true;
  run_step(m, parts, scratch);
  logits.swap(parts[0].logits);
  return parts[0].depth;
}

StepwiseExit early_exit_stepwise(const Engine& e, const std::vector<int32_t>& ids, int64_t prefill_len,
                                 std::optional<int64_t> loops, const EarlyExitParams& p) {
  e.check_tokens(ids, "ids");
  validate(p);
  const int64_t L = e.resolve_loops(loops), T = static_cast<int64_t>(ids.size());
  const int64_t V = e.config().vocab_size;
  if (prefill_len < 1 || prefill_len > T) throw std::invalid_argument("prefill_len must be in [1, len(ids)]");
  e.check_length(T, 0);
  auto kv = e.new_cache(L, T, 0, e.kv_dtype());
  StepwiseExit out;
  out.logits.reserve((T - prefill_len + 1) * V);
  std::vector<float> logits;  // [V]
  e.model().forward(ids.data(), prefill_len, *kv, model::LogitRows::Last, logits, L);
  out.logits.insert(out.logits.end(), logits.begin(), logits.end());
  out.depths.push_back(L);
  for (int64_t t = prefill_len; t < T; ++t) {
    out.depths.push_back(decode_step_early_exit(e.model(), *kv, ids[t], L, p, logits));
    out.logits.insert(out.logits.end(), logits.begin(), logits.end());
  }
  return out;
}

}  // namespace tinyloop::runtime
