// Sampler: Hugging Face transformers conventions (RepetitionPenaltyLogitsProcessor,
// TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper), computed in double.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

template <typename T>
std::string str(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument(msg); }

void check_vocab(int64_t V) {
  if (V < 1) bad("logits: vocabulary size must be >= 1, got " + str(V));
}

}  // namespace

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f)) bad("temperature must be >= 0, got " + str(p.temperature));
  // The penalty also applies to greedy steps; top_k and top_p only matter when sampling.
  if (!(p.repetition_penalty > 0.0f)) bad("repetition_penalty must be > 0, got " + str(p.repetition_penalty));
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    bad("presence_penalty must be in [-2, 2], got " + str(p.presence_penalty));
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    bad("frequency_penalty must be in [-2, 2], got " + str(p.frequency_penalty));
  if (p.greedy()) return;
  if (p.top_k <= 0) bad("top_k must be >= 1 when sampling (temperature > 0.01), got " + str(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) bad("top_p must be in (0, 1] when sampling, got " + str(p.top_p));
}

// ---------------------------------------------------------------------------------------
Rng::Rng(uint64_t seed) : gen_(seed) {}

Rng Rng::from_entropy() {
  std::random_device rd;
  const uint64_t hi = rd();  // two statements: the order of the draws is fixed
  const uint64_t lo = rd();
  return Rng((hi << 32) | (lo & 0xffffffffULL));
}

uint64_t Rng::next_u64() { return gen_(); }

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

// ---------------------------------------------------------------------------------------
void apply_repetition_penalty(float* logits, int64_t V, const std::vector<int32_t>& seen, float penalty) {
  if (!(penalty > 0.0f)) bad("repetition_penalty must be > 0, got " + str(penalty));
  if (penalty == 1.0f || seen.empty()) return;
  std::vector<int32_t> ids;
  ids.reserve(seen.size());
  for (int32_t id : seen)
    if (id >= 0 && static_cast<int64_t>(id) < V) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int32_t id : ids) {
    float& x = logits[id];
    // torch.where(score < 0, score * penalty, score / penalty)
    x = x < 0.0f ? x * penalty : x / penalty;
  }
}

void apply_presence_frequency(float* logits, int64_t V, const std::unordered_map<int32_t, int32_t>& counts,
                              float presence, float frequency) {
  if (presence == 0.0f && frequency == 0.0f) return;
  for (const auto& [id, n] : counts)
    if (id >= 0 && id < V && n > 0) logits[id] -= presence + frequency * static_cast<float>(n);
}

TokenLogprobs token_logprobs(const float* logits, int64_t V, int32_t token, int top_n) {
  check_vocab(V);
  if (token < 0 || token >= V) bad("token_logprobs: token " + str(token) + " outside [0, " + str(V) + ")");
  if (top_n < 0 || top_n > kMaxTopLogprobs)
    bad("logprobs must be in [0, " + str(kMaxTopLogprobs) + "], got " + str(top_n));
  // log-softmax in double: lse = max + log(sum exp(x - max)); NaN counts as -inf.
  double mx = kNegInf;
  for (int64_t i = 0; i < V; ++i)
    if (logits[i] > mx) mx = logits[i];
  double sum = 0.0;
  if (mx != kNegInf)
    for (int64_t i = 0; i < V; ++i)
      if (logits[i] > kNegInf) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  auto lp = [&](int64_t i) {
    const double x = logits[i];
    return static_cast<float>(x > kNegInf ? x - lse : kNegInf);
  };
  TokenLogprobs out;
  out.logprob = lp(token);
  if (top_n > 0) {
    // One pass keeping the n best (logit desc, id asc) in a sorted list of at most 20: this
    // runs per generated token, so no V-sized index array and sort. Ids come in ascending
    // order, so an equal logit never displaces an earlier (lower) id.
    const auto n = static_cast<size_t>(std::min<int64_t>(top_n, V));
    std::vector<std::pair<float, int32_t>> best;  // [<= n] (key, id), best first
    best.reserve(n + 1);
    for (int64_t i = 0; i < V; ++i) {
      const float k = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
      if (best.size() == n && !(k > best.back().first)) continue;
      auto at = std::find_if(best.begin(), best.end(), [&](const auto& e) { return k > e.first; });
      best.insert(at, {k, static_cast<int32_t>(i)});
      if (best.size() > n) best.pop_back();
    }
    for (const auto& [k, id] : best) out.top.emplace_back(id, lp(id));
  }
  return out;
}

int32_t argmax(const float* logits, int64_t V) {
  check_vocab(V);
  int64_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    const float x = logits[i];
    if (x > best_v) {  // strict: ties keep the lower id; NaN compares false
      best_v = x;
      best = i;
    }
  }
  return static_cast<int32_t>(best);
}

// ---------------------------------------------------------------------------------------
void sampling_distribution(const float* logits, int64_t V, const SamplingParams& p, std::vector<float>& probs) {
  check_vocab(V);
  validate(p);
  if (p.greedy())
    bad("temperature must be > 0.01 for sampling_distribution (greedy otherwise), got " + str(p.temperature));
  const size_t n = static_cast<size_t>(V);

  // Temperature, in double. NaN reads as -inf (never sampled).
  const double t = static_cast<double>(p.temperature);
  std::vector<double> s(n);
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(logits[i]) / t;  // +inf / +inf is NaN too
    s[i] = std::isnan(x) ? kNegInf : x;
  }

  // Top-k: HF removes `scores < topk(scores, k)[-1]`, so everything tied with the k-th
  // largest value stays.
  if (static_cast<int64_t>(p.top_k) < V) {
    std::vector<double> tmp(s);
    const size_t k = static_cast<size_t>(p.top_k);
    std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<double>());
    const double kth = tmp[k - 1];
    for (double& x : s)
      if (x < kth) x = kNegInf;
  }

  // Softmax over what is left.
  double m = kNegInf;
  for (double x : s) m = std::max(m, x);
  std::vector<double> e(n, 0.0);
  if (m == kNegInf) {  // everything masked: fall back to argmax (id 0), as argmax() does
    probs.assign(n, 0.0f);
    probs[static_cast<size_t>(argmax(logits, V))] = 1.0f;
    return;
  }
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isinf(m))  // +inf present: the +inf tokens share the mass (the softmax limit)
      e[i] = s[i] == m ? 1.0 : 0.0;
    else e[i] = s[i] == kNegInf ? 0.0 : std::exp(s[i] - m);
    total += e[i];
  }
  for (double& x : e) x /= total;

  // Top-p (TopPLogitsWarper): sort ascending by probability, cumulative sum, remove the
  // tokens whose cumulative mass is <= 1 - top_p, always keep the most probable. Tokens at
  // probability 0 sort first and only add 0 to the sum, so only positive ones are sorted.
  // Ties: the lower id counts as the more probable (sorts later), as in argmax.
  if (p.top_p < 1.0f) {
    std::vector<int64_t> order;
    order.reserve(n);
    for (size_t i = 0; i < n; ++i)
      if (e[i] > 0.0) order.push_back(static_cast<int64_t>(i));
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (e[a] != e[b]) return e[a] < e[b];
      return a > b;
    });
    const double cut = 1.0 - static_cast<double>(p.top_p);
    double cum = 0.0;
    for (size_t j = 0; j + 1 < order.size(); ++j) {  // the last (most probable) stays
      cum += e[order[j]];
      if (!(cum <= cut)) break;  // cumulative sums only grow: the rest stay
      e[order[j]] = 0.0;
    }
    total = 0.0;
    for (double x : e) total += x;
    for (double& x : e) x /= total;
  }

  probs.resize(n);
  for (size_t i = 0; i < n; ++i) probs[i] = static_cast<float>(e[i]);
}

int32_t sample_from(const std::vector<float>& probs, Rng& rng) {
  double total = 0.0;
  int64_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0f) {  // negative or NaN entries count as 0
      total += static_cast<double>(probs[i]);
      last = static_cast<int64_t>(i);
    }
  }
  if (last < 0) bad("probs: no token has positive probability");
  const double target = rng.uniform() * total;
  double cum = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] > 0.0f)) continue;
    cum += static_cast<double>(probs[i]);
    if (cum > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // rounding guard
}

int32_t sample_next(float* logits, int64_t V, const SamplingParams& p, const std::vector<int32_t>& seen, Rng& rng,
                    bool apply_penalty) {
  validate(p);
  check_vocab(V);
  if (apply_penalty && p.repetition_penalty != 1.0f) apply_repetition_penalty(logits, V, seen, p.repetition_penalty);
  if (p.greedy()) return argmax(logits, V);
  std::vector<float> probs;
  sampling_distribution(logits, V, p, probs);
  return sample_from(probs, rng);
}

// ---------------------------------------------------------------------------------------
StopMatcher::StopMatcher(std::vector<std::vector<int32_t>> sequences, int64_t vocab_size)
    : seqs_(std::move(sequences)) {
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const auto& seq = seqs_[s];
    if (seq.empty()) bad("stop_sequences: sequence " + str(s) + " is empty");
    for (size_t j = 0; j < seq.size(); ++j) {
      if (seq[j] < 0 || static_cast<int64_t>(seq[j]) >= vocab_size)
        bad("stop_sequences: sequence " + str(s) + " has id " + str(seq[j]) + " at position " + str(j) +
            ", outside [0, " + str(vocab_size) + ")");
    }
    max_len_ = std::max(max_len_, seq.size());
  }
}

int StopMatcher::match_index(const std::vector<int32_t>& emitted) const {
  int best = -1;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const auto& seq = seqs_[s];
    if (seq.size() > emitted.size()) continue;
    if (best >= 0 && seq.size() >= seqs_[static_cast<size_t>(best)].size()) continue;
    if (std::equal(seq.begin(), seq.end(), emitted.end() - static_cast<ptrdiff_t>(seq.size())))
      best = static_cast<int>(s);
  }
  return best;
}

}  // namespace tinyloop::runtime
