#include "runtime/engine.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ops/backend.h"  // the default of quant_activations follows the backend's q8 kernel

namespace tinyloop::runtime {
namespace {

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

ops::KvDType parse_kv_mode(const std::optional<std::string>& mode) {
  std::string m = mode.value_or("");
  if (m.empty()) {
    // docs/kv-cache.md "Storage modes": TINYLOOP_KV_H_MODE selects store-h, whose precision is fp16 unless
    // TINYLOOP_KV_INT8 / TINYLOOP_KV_INT4 say otherwise; int4 exists only as store-h.
    const bool h = env_flag("TINYLOOP_KV_H_MODE"), i8 = env_flag("TINYLOOP_KV_INT8"), i4 = env_flag("TINYLOOP_KV_INT4");
    if (i4 && !h)
      throw std::invalid_argument("TINYLOOP_KV_INT4 needs TINYLOOP_KV_H_MODE=1 (int4 KV exists only as store-h)");
    if (h) m = i4 ? "h_int4" : i8 ? "h_int8" : "h_fp16";
    else m = i8 ? "int8" : env_flag("TINYLOOP_KV_FP32") ? "fp32" : "fp16";
  }
  if (m == "fp16") return ops::KvDType::F16;
  if (m == "fp32") return ops::KvDType::F32;
  if (m == "int8") return ops::KvDType::I8;
  if (m == "h_fp16") return ops::KvDType::H16;
  if (m == "h_int8") return ops::KvDType::H8;
  if (m == "h_int4") return ops::KvDType::H4;
  throw std::invalid_argument("kv_mode must be 'fp16', 'fp32', 'int8', 'h_fp16', 'h_int8' or 'h_int4', got '" + m +
                              "'");
}

// The kwarg, else TINYLOOP_QUANT_ACTIVATIONS, else "q8" when the file holds int8 / int4
// weights (stored I8 / U8) and the backend has a packed q8 kernel (AVX512-VNNI or AVX2), as
// llama.cpp always runs them: on the bundled model it costs +0.04 % perplexity for int8 and
// +0.004 % on top of int4's own error, and runs prefill 1.6-2.1x and decode 3-4x faster
// (docs/benchmarks.md, "Activations of int8 / int4 weights"); else "f32" (a float model is
// unchanged by it; the portable q8 kernel is slower than exact). The error names where a bad
// value came from.
bool parse_quant_activations(const std::optional<std::string>& mode, const ModelFile& file) {
  std::string source = "quant_activations", m = mode.value_or("");
  if (m.empty()) {
    const char* env = std::getenv("TINYLOOP_QUANT_ACTIVATIONS");
    source = "TINYLOOP_QUANT_ACTIVATIONS";
    if (env && *env) m = env;
  }
  if (m.empty()) {
    if (!ops::q8act_is_fast()) return false;
    for (const auto& [name, t] : file.tensors())
      if (t.dtype == StoredDType::I8 || t.dtype == StoredDType::U8) return true;
    return false;
  }
  if (m == "q8") return true;
  if (m == "f32") return false;
  throw std::invalid_argument(source + " must be 'q8' or 'f32', got '" + m + "'");
}

}  // namespace

Engine::Engine(const std::string& path, const EngineOptions& opts) {
  kv_dtype_ = parse_kv_mode(opts.kv_mode);
  kv_cache_disabled_ = env_flag("TINYLOOP_DISABLE_KV_CACHE");
  fp16_body_ = opts.fp16_body.value_or(env_flag("TINYLOOP_EXPERIMENTAL_FP16_BODY"));
  std::shared_ptr<const ModelFile> file = ModelFile::open(path, opts.use_mmap);
  q8act_ = parse_quant_activations(opts.quant_activations, *file);
  model_ = std::make_unique<model::LoopedModel>(std::move(file), q8act_, fp16_body_);
  const ModelConfig& c = model_->config();
  max_seq_len_ = opts.max_seq_len.value_or(c.max_seq_len);
  if (max_seq_len_ < 1 || max_seq_len_ > kMaxSeqLen)
    throw std::invalid_argument("max_seq_len must be in [1, " + std::to_string(kMaxSeqLen) + "], got " +
                                std::to_string(max_seq_len_));
  if (c.pos_encoding == PosEncoding::Learned && max_seq_len_ > c.max_seq_len)
    throw std::invalid_argument("max_seq_len " + std::to_string(max_seq_len_) +
                                " exceeds the model's learned position table (" + std::to_string(c.max_seq_len) +
                                " rows)");
}

double Engine::memory_mb() const {
  const double bytes =
      static_cast<double>(model_->weights().bytes) + static_cast<double>(model_->memory().live_bytes.load());
  return bytes / (1024.0 * 1024.0);
}

int64_t Engine::resolve_loops(std::optional<int64_t> loops) const {
  const int64_t L = loops.value_or(config().default_loops);
  if (L < 1 || L > kMaxLoops)
    throw std::invalid_argument("loops must be in [1, " + std::to_string(kMaxLoops) + "], got " + std::to_string(L));
  return L;
}

void Engine::check_tokens(const std::vector<int32_t>& ids, const char* what) const {
  if (ids.empty()) throw std::invalid_argument(std::string(what) + " must not be empty");
  const int64_t V = config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= V)
      throw std::invalid_argument(std::string(what) + ": token id " + std::to_string(ids[i]) + " at index " +
                                  std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
}

void Engine::check_loop_slots(int64_t loop_slots) const {
  if (loop_slots < 0)
    throw std::invalid_argument("kv_loop_slots must be >= 0 (0 = one slot group per iteration), got " +
                                std::to_string(loop_slots));
}

std::string Engine::kv_mode() const {
  switch (kv_dtype_) {
    case ops::KvDType::F32: return "fp32";
    case ops::KvDType::I8: return "int8";
    case ops::KvDType::H16: return "h_fp16";
    case ops::KvDType::H8: return "h_int8";
    case ops::KvDType::H4: return "h_int4";
    default: return "fp16";
  }
}

void Engine::check_length(int64_t prompt_len, int64_t max_tokens) const {
  if (prompt_len > max_seq_len_ || max_tokens > max_seq_len_ - prompt_len)
    throw std::runtime_error("prompt length " + std::to_string(prompt_len) + " + max_tokens " +
                             std::to_string(max_tokens) + " exceeds max_seq_len " + std::to_string(max_seq_len_));
}

std::unique_ptr<model::KvCache> Engine::new_cache(int64_t loops, int64_t total_len, int64_t window, ops::KvDType dtype,
                                                  int64_t loop_slots, int64_t block_rows) const {
  return std::make_unique<model::KvCache>(config(), loops, total_len, window, dtype, &model_->memory(), 0, loop_slots,
                                          nullptr, 0, block_rows);
}

std::vector<float> Engine::score_rows(const std::vector<int32_t>& ids, std::optional<int64_t> loops,
                                      model::LogitRows rows) const {
  check_tokens(ids);
  const int64_t L = resolve_loops(loops), T = static_cast<int64_t>(ids.size());
  check_length(T, 0);
  auto kv = new_cache(L, T, 0, ops::KvDType::F32);
  std::vector<float> logits;
  model_->forward(ids.data(), T, *kv, rows, logits);
  return logits;
}

std::vector<float> Engine::score(const std::vector<int32_t>& ids, std::optional<int64_t> loops) const {
  return score_rows(ids, loops, model::LogitRows::All);
}

std::vector<float> Engine::score_last(const std::vector<int32_t>& ids, std::optional<int64_t> loops) const {
  return score_rows(ids, loops, model::LogitRows::Last);
}

std::vector<float> Engine::stepwise_logits(const std::vector<int32_t>& ids, int64_t prefill_len,
                                           std::optional<int64_t> loops, int64_t cache_window,
                                           int64_t loop_slots) const {
  check_tokens(ids, "ids");
  const int64_t L = resolve_loops(loops), T = static_cast<int64_t>(ids.size());
  const int64_t V = config().vocab_size;
  if (prefill_len < 1 || prefill_len > T) throw std::invalid_argument("prefill_len must be in [1, len(ids)]");
  if (cache_window < 0) throw std::invalid_argument("cache_window must be >= 0");
  check_loop_slots(loop_slots);
  std::vector<float> out, logits;
  out.reserve((T - prefill_len + 1) * V);
  if (kv_cache_disabled_ && loop_slots > 0 && loop_slots < L)
    throw std::invalid_argument(
        "kv_loop_slots needs the KV cache (TINYLOOP_DISABLE_KV_CACHE=1 is set): the mode is "
        "defined by what the cache keeps");
  if (kv_cache_disabled_) {
    for (int64_t end = prefill_len; end <= T; ++end) {
      // The uncached path keeps the window as a mask over a full-length cache.
      model::KvCache kv(config(), L, end, cache_window, kv_dtype_, &model_->memory());
      model_->forward(ids.data(), end, kv, model::LogitRows::Last, logits);
      out.insert(out.end(), logits.begin(), logits.end());
    }
    return out;
  }
  auto kv = new_cache(L, T, cache_window, kv_dtype_, loop_slots);
  model_->forward(ids.data(), prefill_len, *kv, model::LogitRows::Last, logits);
  out.insert(out.end(), logits.begin(), logits.end());
  for (int64_t t = prefill_len; t < T; ++t) {
    model_->forward(ids.data() + t, 1, *kv, model::LogitRows::Last, logits);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

}  // namespace tinyloop::runtime
