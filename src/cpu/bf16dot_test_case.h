// One bf16dot matmul test case (test-only): x, a stored weight and its bf16-pair packing,
// shared by the AVX512-BF16 (matmul_bf16dot_test.cc) and AMX (matmul_amx_bf16_test.cc) tests.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/matmul_bf16dot.h"
#include "ops/test_util.h"

namespace tinyloop::cpu::testing {

struct Bf16dotCase {
  std::vector<float> x;  // [T, K]
  ops::testing::StoredWeight w;  // [N, K]
  std::vector<uint32_t> packed;  // [ceil(N / 64), ceil(K / 2), 64]
  std::vector<float> b;  // [N]
  int64_t T, K, N;
  ops::WeightView view() const {
    ops::WeightView v = w.view();
    v.bf16dot = packed.data();
    return v;
  }
};

// Weights of a trained layer's size (|w| ~ 1 / sqrt(K)) and activations up to ~4, with
// values down to ~1e-6 in both: sums stay far above 2^-126.
inline Bf16dotCase make_bf16dot_case(int64_t T, int64_t K, int64_t N, DType dt, uint32_t seed) {
  using ops::testing::random_floats;
  Bf16dotCase c{random_floats(size_t(T * K), seed, -4.f, 4.f),
                ops::testing::store_weight(random_floats(size_t(N * K), seed + 1, -0.05f, 0.05f), N, K, dt),
                {},
                random_floats(size_t(N), seed + 2),
                T,
                K,
                N};
  c.packed.resize(size_t(ops::bf16dot_packed_words(N, K)));
  ops::pack_bf16dot(c.w.view(), c.packed.data());
  return c;
}

}  // namespace tinyloop::cpu::testing
