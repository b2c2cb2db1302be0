// Test-only: a small random model file with finite, non-degenerate logits, for runtime tests
// that need real numbers (the io builder's fixed byte pattern is not a usable model).
#pragma once
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "io/test_file_builder.h"
#include "base/dtype.h"

namespace tinyloop::testing {

// Replace the builder's byte pattern with small normal weights (norm weights near 1).
inline void fill_random_weights(RawFile& f, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& [name, entry] : f.header.items()) {
    if (name == "__metadata__") continue;
    const std::string dtype = entry["dtype"];
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    const auto& shape = entry["shape"];
    const bool is_norm = name.find("norm.weight") != std::string::npos;
    const double fan_in = shape.size() > 1 ? double(shape[1]) : 1.0;
    const float std = is_norm ? 0.1f : float(1.0 / std::sqrt(fan_in));
    const uint64_t elem = test_elem_size(dtype);
    for (uint64_t off = begin; off < end; off += elem) {
      const float v = (is_norm ? 1.0f : 0.0f) + std * normal(gen);
      if (dtype == "F32") {
        std::memcpy(&f.data[off], &v, 4);
      } else {
        const uint16_t h = dtype == "F16" ? ops::f32_to_f16(v) : ops::f32_to_bf16(v);
        std::memcpy(&f.data[off], &h, 2);
      }
    }
  }
}

// The shape the runtime tests share: 1 pre block, 2 loop layers, 1 post block; dim 16,
// 4 query heads over 2 KV heads of width 4, FFN 24, vocab 31, no EOS. Each test then sets
// the family options it exercises (placement, inject, init state, loops, ...).
inline ModelConfig small_runtime_config() {
  ModelConfig c = tiny_config();
  c.dim = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.ffn_dim = 24;
  c.vocab_size = 31;
  c.default_loops = 3;
  c.max_seq_len = 128;
  c.eos_ids = {};
  return c;
}

// Writes `c` with random weights stored as `weight_dtype` into `file`; returns its path.
inline const std::string& write_random_model(TempFile& file, const ModelConfig& c, const std::string& weight_dtype,
                                             uint64_t seed) {
  RawFile raw = make_raw_file(c, weight_dtype);
  fill_random_weights(raw, seed);
  return file.write(serialize(raw));
}

}  // namespace tinyloop::testing
