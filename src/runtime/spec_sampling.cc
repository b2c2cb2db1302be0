#include "runtime/spec_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace tinyloop::runtime {

bool accept_draft(const std::vector<float>& p, const std::vector<float>& q, int32_t x, Rng& rng) {
  const double px = p[static_cast<size_t>(x)], qx = q[static_cast<size_t>(x)];
  const double u = rng.uniform();  // [0, 1)
  // u < p/q, written without the division; qx > 0 because x was drawn from q.
  return u * qx < px;
}

std::vector<float> residual(const std::vector<float>& p, const std::vector<float>& q) {
  std::vector<double> r(p.size());  // [V]
  double total = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    r[i] = std::max(0.0, double(p[i]) - double(q[i]));
    total += r[i];
  }
  if (!(total > 0.0)) return p;
  std::vector<float> out(p.size());  // [V]
  for (size_t i = 0; i < p.size(); ++i) out[i] = static_cast<float>(r[i] / total);
  return out;
}

std::vector<int32_t> draw_without_replacement(const std::vector<float>& q, int64_t k, Rng& rng) {
  std::vector<float> left(q);  // [V] q with the drawn ids removed
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < k; ++i) {
    if (std::none_of(left.begin(), left.end(), [](float v) { return v > 0.0f; })) break;
    const int32_t id = sample_from(left, rng);  // sample_from renormalises
    ids.push_back(id);
    left[static_cast<size_t>(id)] = 0.0f;
  }
  return ids;
}

int64_t accept_among(const std::vector<float>& p, const std::vector<float>& q, const std::vector<int32_t>& candidates,
                     Rng& rng, int32_t* token) {
  std::vector<float> pi(p);  // [V] target of step i
  std::vector<float> qi(q);  // [V] proposal of step i: q without the earlier candidates
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double total = std::accumulate(qi.begin(), qi.end(), 0.0);
    if (!(total > 0.0)) break;
    for (float& v : qi) v = static_cast<float>(v / total);
    const int32_t c = candidates[i];
    if (accept_draft(pi, qi, c, rng)) return static_cast<int64_t>(i);
    pi = residual(pi, qi);
    qi[static_cast<size_t>(c)] = 0.0f;
  }
  *token = sample_from(pi, rng);
  return -1;
}

std::vector<int32_t> top_ids(const float* logits, int64_t V, int64_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  const auto key = [](float v) { return std::isnan(v) ? -INFINITY : v; };  // NaN never wins
  k = std::min(k, V);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    const float x = key(logits[a]), y = key(logits[b]);
    return x != y ? x > y : a < b;
  });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

}  // namespace tinyloop::runtime
