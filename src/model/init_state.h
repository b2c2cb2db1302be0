// The loop's seeded random initial state (config init_state = "random"), defined per
// (seed, absolute position, channel) so that prefill, decode and rescoring agree exactly.
// Definition: docs/model-format.md ("The random initial state").
#pragma once
#include <cstdint>

namespace tinyloop::model {

uint64_t splitmix64(uint64_t x);

// out[T, D]: std * truncated standard normal for each (pos[t], channel).
void random_initial_state(uint64_t seed, const int64_t* pos, int64_t T, int64_t D, double std, float* out);

}  // namespace tinyloop::model
