#include "runtime/state_draw.h"

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "model/init_state.h"

namespace tinyloop::runtime {

void validate_init_scale(const ModelConfig& c, double init_scale) {
  if (!std::isfinite(init_scale) || init_scale < 0 || init_scale > kMaxInitScale)
    throw std::invalid_argument("init_scale must be a finite number in [0, 1e6], got " + std::to_string(init_scale));
  if (init_scale != 1.0 && c.init_state != InitState::Random)
    throw std::invalid_argument(
        "init_scale applies only to a model whose loop starts from a random state "
        "(config init_state 'random', e.g. Huginn); this model's initial state is not random");
}

model::StateDraw resolve_state_draw(const ModelConfig& c, std::optional<uint64_t> seed, double init_scale) {
  model::StateDraw d;
  d.scale = init_scale;
  if (!c.init_state_per_call) {
    d.seed = c.init_state_seed;
  } else if (seed) {
    // A stream apart from the sampler's (which is seeded with `seed` itself).
    d.seed = model::splitmix64(*seed ^ 0x1417e5eed0fca11ULL);
  } else {
    std::random_device rd;
    d.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }
  return d;
}

}  // namespace tinyloop::runtime
