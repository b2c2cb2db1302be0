// A loaded model plus the settings a Model is created with (max_seq_len, KV storage mode,
// the uncached reference path). Immutable after construction, so one Engine serves calls
// from many threads at once; every call owns its own caches and workspace.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/looped_model.h"

namespace tinyloop::runtime {

struct EngineOptions {
  std::optional<int64_t> max_seq_len;  // default: the config's max_seq_len
  // "fp16" (default) | "fp32" | "int8" | store-h "h_fp16" | "h_int8" | "h_int4"
  // (docs/kv-cache.md); default from env (TINYLOOP_KV_INT8, TINYLOOP_KV_FP32, TINYLOOP_KV_H_MODE
  // [+ TINYLOOP_KV_INT8 / TINYLOOP_KV_INT4])
  std::optional<std::string> kv_mode;
  // "f32" | "q8": how int8 / int4 weights (group a multiple of 32) take their input rows:
  // exact, or quantized per 32 columns as llama.cpp does (ops/matmul_q8act.h). Default: env
  // TINYLOOP_QUANT_ACTIVATIONS, else "q8" for a file with int8 / int4 weights, else "f32"
  // (docs/model-format.md says why).
  std::optional<std::string> quant_activations;
  // true: the loop body's float matmuls run in reduced precision (x and a packed BF16 copy
  // of the weights, float32 sums: ops/matmul_bf16dot.h, docs/benchmarks.md "Reduced-precision
  // loop body"). Default from env TINYLOOP_EXPERIMENTAL_FP16_BODY (1 = on).
  std::optional<bool> fp16_body;
  // false: read the weights into memory instead of mapping the file (ModelFile::open).
  bool use_mmap = true;
};

class Engine {
 public:
  // Throws FileNotFound / FormatError for the file, std::invalid_argument for options.
  Engine(const std::string& path, const EngineOptions& opts);

  const ModelConfig& config() const { return model_->config(); }
  const model::LoopedModel& model() const { return *model_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  ops::KvDType kv_dtype() const { return kv_dtype_; }
  std::string kv_mode() const;  // as EngineOptions::kv_mode
  std::string quant_activations() const { return q8act_ ? "q8" : "f32"; }
  bool fp16_body() const { return fp16_body_; }
  // TINYLOOP_DISABLE_KV_CACHE=1 at creation: every decode step re-runs the whole prefix.
  bool kv_cache_disabled() const { return kv_cache_disabled_; }
  // Weights + live caches + live workspaces, in MiB.
  double memory_mb() const;

  // `loops` resolved against the config default and validated (1 .. kMaxLoops, config.h).
  int64_t resolve_loops(std::optional<int64_t> loops) const;
  // Throws std::invalid_argument naming "prompt" for an empty prompt or an id outside [0, V).
  void check_tokens(const std::vector<int32_t>& ids, const char* what = "prompt") const;
  // Throws std::invalid_argument naming kv_loop_slots when it is negative.
  void check_loop_slots(int64_t loop_slots) const;
  // Throws std::runtime_error when prompt_len + max_tokens > max_seq_len (without
  // overflowing for any int64 max_tokens; negative values are the caller's to refuse).
  void check_length(int64_t prompt_len, int64_t max_tokens) const;

  // logits [T, V] of every position (float32 K/V: nothing is kept, so nothing is rounded).
  std::vector<float> score(const std::vector<int32_t>& ids, std::optional<int64_t> loops) const;
  // logits [V] of the last position.
  std::vector<float> score_last(const std::vector<int32_t>& ids, std::optional<int64_t> loops) const;
  // Test hook for cached-vs-uncached parity: prefill ids[0:prefill_len] then feed the rest one
  // token at a time (or, on the uncached path, re-run the whole prefix each step), in the
  // model's KV mode and window. Returns logits [T - prefill_len + 1, V]: row r predicts the
  // token after ids[prefill_len - 1 + r].
  std::vector<float> stepwise_logits(const std::vector<int32_t>& ids, int64_t prefill_len, std::optional<int64_t> loops,
                                     int64_t cache_window, int64_t loop_slots = 0) const;

  // A KV cache for one sequence that will reach `total_len` positions (a private block pool;
  // with a window it holds about window + KvCache::kWindowSlack positions at once).
  // loop_slots: the recurrence-shared mode's slot groups (model::SlotLayout; 0 = exact).
  // block_rows: see model::KvCache (0 = the default; caches that will share blocks need the
  // same value).
  std::unique_ptr<model::KvCache> new_cache(int64_t loops, int64_t total_len, int64_t window, ops::KvDType dtype,
                                            int64_t loop_slots = 0, int64_t block_rows = 0) const;

 private:
  // One scoring forward with float32 K/V, logits of every row or the last.
  std::vector<float> score_rows(const std::vector<int32_t>& ids, std::optional<int64_t> loops,
                                model::LogitRows rows) const;
  std::unique_ptr<model::LoopedModel> model_;
  int64_t max_seq_len_ = 0;
  ops::KvDType kv_dtype_ = ops::KvDType::F16;
  bool kv_cache_disabled_ = false;
  bool q8act_ = false;
  bool fp16_body_ = false;
};

}  // namespace tinyloop::runtime
