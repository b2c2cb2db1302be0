#include "model/init_state.h"

#include <cmath>

namespace tinyloop::model {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

namespace {

double uniform(uint64_t key, uint64_t k) { return static_cast<double>(splitmix64(key + k) >> 11) * 0x1.0p-53; }

// Standard normal truncated at +-3 by redrawing (Huginn's trunc_normal init).
double truncated_normal(uint64_t key) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (uint64_t c = 0;; ++c) {
    const double u1 = uniform(key, 2 * c), u2 = uniform(key, 2 * c + 1);
    const double z = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(kTwoPi * u2);
    if (std::fabs(z) <= 3.0) return z;
  }
}

}  // namespace

void random_initial_state(uint64_t seed, const int64_t* pos, int64_t T, int64_t D, double std, float* out) {
  const uint64_t seed_key = splitmix64(seed);
  for (int64_t t = 0; t < T; ++t) {
    const uint64_t pos_key = splitmix64(seed_key ^ static_cast<uint64_t>(pos[t]));
    for (int64_t i = 0; i < D; ++i) {
      const uint64_t key = splitmix64(pos_key ^ static_cast<uint64_t>(i));
      out[t * D + i] = static_cast<float>(std * truncated_normal(key));
    }
  }
}

}  // namespace tinyloop::model
