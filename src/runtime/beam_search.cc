// The beam search core (see beam_search.h): no model, no cache, only log-probabilities.
#include "runtime/beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {

void validate(const BeamParams& p) {
  if (p.beam_size < 0)
    throw std::invalid_argument("beam_size must be >= 0 (0 or 1 disables beam search), got " +
                                std::to_string(p.beam_size));
  if (p.beam_size > kMaxBeamSize)
    throw std::invalid_argument("beam_size must be <= " + std::to_string(kMaxBeamSize) + ", got " +
                                std::to_string(p.beam_size));
  if (p.active() && !std::isfinite(p.length_penalty))
    throw std::invalid_argument("length_penalty must be a finite number, got " + std::to_string(p.length_penalty));
}

double beam_score(double log_prob, int64_t new_len, double length_penalty) {
  return log_prob / std::pow(static_cast<double>(std::max<int64_t>(1, new_len)), length_penalty);
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Hyp {
  std::vector<int32_t> tokens;  // generated tokens
  std::vector<int64_t> history;  // [tokens.size()] live-beam index that chose each token
  double log_prob = 0;
};

struct Offer {
  double score;  // parent log_prob + token log_prob
  int64_t beam;
  int32_t token;
};

// Best offer first; ties to the lower beam, then the lower token id (deterministic).
bool better(const Offer& a, const Offer& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.beam != b.beam) return a.beam < b.beam;
  return a.token < b.token;
}

// The k most likely tokens of row[V] (finite only), appended to offers for `beam`.
void top_tokens(const double* row, int64_t V, int64_t k, int64_t beam, double base, std::vector<Offer>& offers) {
  std::vector<Offer> mine;  // every finite token of this row
  for (int64_t v = 0; v < V; ++v)
    if (row[v] != kNegInf && !std::isnan(row[v])) mine.push_back({base + row[v], beam, static_cast<int32_t>(v)});
  const auto n = std::min<int64_t>(k, static_cast<int64_t>(mine.size()));
  std::partial_sort(mine.begin(), mine.begin() + n, mine.end(), better);
  offers.insert(offers.end(), mine.begin(), mine.begin() + n);
}

// The best finished hypothesis so far (the search returns one sequence, so the other
// finished ones, which HF keeps to return several, cannot change the answer).
class Finished {
 public:
  explicit Finished(double length_penalty) : lp_(length_penalty) {}
  void offer(Hyp h) {
    const double s = beam_score(h.log_prob, static_cast<int64_t>(h.tokens.size()), lp_);
    if (!have_ || s > score_) {  // ties: the one finished first stays
      best_ = std::move(h);
      score_ = s;
      have_ = true;
    }
  }
  bool have() const { return have_; }
  double score() const { return score_; }
  const Hyp& best() const { return best_; }

 private:
  double lp_;
  bool have_ = false;
  double score_ = kNegInf;
  Hyp best_;
};

}  // namespace

BeamSearchResult beam_search_core(BeamModel& model, int64_t vocab_size, int64_t max_tokens, const BeamParams& p) {
  validate(p);
  if (vocab_size < 1) throw std::invalid_argument("beam search: vocab_size must be >= 1");
  if (max_tokens < 1) throw std::invalid_argument("max_tokens must be >= 1");
  const int64_t B = std::max<int64_t>(1, p.beam_size), V = vocab_size;
  std::vector<Hyp> live(1);  // the bare prompt
  Finished finished(p.length_penalty);
  std::vector<double> lp;  // [n_live, V]
  BeamSearchResult res;

  for (int64_t step = 1; step <= max_tokens && !live.empty(); ++step) {
    const auto n = static_cast<int64_t>(live.size());
    lp.assign(static_cast<size_t>(n * V), kNegInf);
    model.log_probs(n, lp);
    ++res.steps;

    std::vector<Offer> offers;  // up to 2B per beam, then the best 2B overall
    for (int64_t b = 0; b < n; ++b) {
      const size_t before = offers.size();
      top_tokens(lp.data() + b * V, V, 2 * B, b, live[b].log_prob, offers);
      if (offers.size() == before) finished.offer(live[b]);  // nothing allowed: ends as it is
    }
    const auto keep = std::min<int64_t>(2 * B, static_cast<int64_t>(offers.size()));
    std::partial_sort(offers.begin(), offers.begin() + keep, offers.end(), better);
    offers.resize(static_cast<size_t>(keep));

    std::vector<Hyp> next;
    std::vector<int64_t> parent;
    std::vector<int32_t> token;
    for (int64_t rank = 0; rank < keep && static_cast<int64_t>(next.size()) < B; ++rank) {
      const Offer& o = offers[rank];
      const bool ends = model.ends(o.beam, o.token);
      if (ends && rank >= B) continue;  // HF: an ending offer outside the top B is dropped
      Hyp h = live[o.beam];
      h.tokens.push_back(o.token);
      h.history.push_back(o.beam);
      h.log_prob = o.score;
      if (ends) {
        finished.offer(std::move(h));
      } else {
        next.push_back(std::move(h));
        parent.push_back(o.beam);
        token.push_back(o.token);
      }
    }

    if (step == max_tokens) {  // out of tokens: every survivor is a finished hypothesis
      for (Hyp& h : next) finished.offer(std::move(h));
      break;
    }
    live = std::move(next);
    if (live.empty()) break;
    if (p.early_stopping && finished.have()) {
      double best_live = kNegInf;
      for (const Hyp& h : live) best_live = std::max(best_live, beam_score(h.log_prob, step, p.length_penalty));
      if (finished.score() >= best_live) break;  // the top-ranked hypothesis has ended
    }
    model.select(parent, token);
  }

  if (!finished.have()) throw std::logic_error("beam search ended without a hypothesis");
  const Hyp& w = finished.best();
  res.tokens = w.tokens;
  res.history = w.history;
  res.log_prob = w.log_prob;
  res.score = finished.score();
  return res;
}

}  // namespace tinyloop::runtime
