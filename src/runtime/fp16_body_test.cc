// EngineOptions::fp16_body (TINYLOOP_EXPERIMENTAL_FP16_BODY): the layers' float weights
// get packed BF16 copies (counted in memory_mb instead of the originals) and its matmuls take the bf16 dot-product
// path, which changes the logits slightly and keeps batch invariance: decode through the
// cache gives the scoring forward's rows bit for bit. Runs under the sanitizers with the
// rest of the C++ suite (the copies' arena, the packing, the kernels on a real forward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/matmul_bf16dot.h"
#include "runtime/engine.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

ModelConfig config() {
  ModelConfig c = testing::small_runtime_config();
  c.n_pre_blocks = c.n_post_blocks = 1;  // their layers get copies too
  c.ffn_dim = 70;  // not a multiple of the 64-column panel
  c.inject = Inject::LinearConcat;
  return c;
}

// Bytes of the copies: Q, K, V, O, gate, up, down of each pre, loop and post layer and the
// inject.
int64_t expected_copy_bytes(const ModelConfig& c) {
  const int64_t D = c.dim, F = c.ffn_dim, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  int64_t words = 0;
  for (int64_t l = 0; l < c.n_pre_blocks + c.n_loop_layers + c.n_post_blocks; ++l)
    for (auto [n, k] : {std::pair{q, D}, {kv, D}, {kv, D}, {D, q}, {F, D}, {F, D}, {D, F}})
      words += ops::bf16dot_packed_words(n, k);
  return 4 * (words + ops::bf16dot_packed_words(D, 2 * D));
}

// Bytes of the weights those copies replace in the file (no longer counted in memory_mb: the
// kernels read the copies, LoopedModel::release_copied_originals), elem bytes a weight.
int64_t expected_original_bytes(const ModelConfig& c, int64_t elem) {
  const int64_t D = c.dim, F = c.ffn_dim, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  int64_t n_weights = D * 2 * D;  // the inject
  for (int64_t l = 0; l < c.n_pre_blocks + c.n_loop_layers + c.n_post_blocks; ++l)
    for (auto [n, k] : {std::pair{q, D}, {kv, D}, {kv, D}, {D, q}, {F, D}, {F, D}, {D, F}}) n_weights += n * k;
  return elem * n_weights;
}

class Fp16Body : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp16Body, CopiesCountedLogitsCloseAndDecodeEqualsScore) {
  testing::TempFile file;
  const ModelConfig c = config();
  const std::string& path = testing::write_random_model(file, c, GetParam(), 5);
  EngineOptions exact_o, low_o;
  exact_o.kv_mode = low_o.kv_mode = "fp32";  // as score(): nothing rounded in the cache
  exact_o.fp16_body = false;
  low_o.fp16_body = true;
  const Engine exact(path, exact_o), low(path, low_o);
  EXPECT_FALSE(exact.fp16_body());
  EXPECT_TRUE(low.fp16_body());
  EXPECT_EQ(exact.model().fp16_body_bytes(), 0);
  EXPECT_EQ(low.model().fp16_body_bytes(), expected_copy_bytes(c));
  const int64_t elem = GetParam() == "F32" ? 4 : 2;
  EXPECT_DOUBLE_EQ((low.memory_mb() - exact.memory_mb()) * 1024 * 1024,
                   double(expected_copy_bytes(c) - expected_original_bytes(c, elem)));

  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7};
  const int64_t V = c.vocab_size, T = int64_t(ids.size());
  const std::vector<float> a = exact.score(ids, 3), b = low.score(ids, 3);  // [T, V]
  float scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(a[i]));
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  }
  EXPECT_GT(diff, 0.f) << "the flag changed nothing";
  EXPECT_LT(diff, 2e-2f * scale);  // bf16 inputs: ~2^-9 relative per matmul, 3 loops x 2 layers

  // Prefill of 5, then one token a step: rows for ids[4], ids[5], ... == score's rows.
  const std::vector<float> steps = low.stepwise_logits(ids, 5, 3, 0);  // [T - 4, V]
  ASSERT_EQ(int64_t(steps.size()), (T - 4) * V);
  for (int64_t r = 0; r < T - 4; ++r)
    for (int64_t v = 0; v < V; ++v)
      ASSERT_EQ(steps[size_t(r * V + v)], b[size_t((4 + r) * V + v)]) << "row " << r << " token " << v;
}

INSTANTIATE_TEST_SUITE_P(WeightDtypes, Fp16Body, ::testing::Values("F32", "F16", "BF16"));

}  // namespace
}  // namespace tinyloop::runtime
