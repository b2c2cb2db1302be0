// tinyloop::Engine: a loaded .tinyloop model that generates tokens, the entry point of the
// public C++ API (docs/cpp-api.md). The runtime behind it lives in the library; this header
// holds only a pointer to it (pimpl), so an installed program needs no source header.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tinyloop/export.h"
#include "tinyloop/generation.h"
#include "tinyloop/tokenizer.h"

namespace tinyloop {

struct EngineOptions {
  std::optional<int64_t> max_seq_len;  // unset = the config's max_seq_len
  // KV cache storage: "fp16" | "fp32" | "int8" | "h_fp16" | "h_int8" | "h_int4"
  // (docs/kv-cache.md); unset = fp16 (or the TINYLOOP_KV_* environment variables).
  std::optional<std::string> kv_mode;
  bool use_mmap = true;  // false: read the weights into memory instead of mapping the file
  // generate_batch's serving engine (started on its first call): its KV pool in MiB and the
  // sequences it runs at once.
  double batch_kv_budget_mb = 256;
  int64_t batch_max_seqs = 64;
};

// What a caller needs to know about the loaded model.
struct ModelInfo {
  int64_t vocab_size = 0;
  int64_t default_loops = 0;  // depth used when GenerationOptions::loops is unset
  int64_t max_seq_len = 0;  // prompt + emitted tokens, as this engine allows
  std::vector<int32_t> eos_ids;  // ids that end generation when stop_at_eos
  std::optional<int32_t> bos_id;  // the id a prompt should start with, if the model has one
};

class TINYLOOP_API Engine {
 public:
  // Loads the model. Throws tinyloop::FileNotFound for a missing or unreadable path,
  // tinyloop::FormatError naming what is wrong with the file, std::invalid_argument naming
  // a bad option.
  explicit Engine(const std::string& model_path, const EngineOptions& options = {});
  ~Engine();
  // A moved-from Engine may only be assigned to or destroyed.
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelInfo& info() const;
  // The tokenizer stored in the file, or nullptr when the file has none. Throws
  // std::invalid_argument when the file's tokenizer is a kind this library cannot run
  // (only byte-level BPE is supported, docs/cpp-api.md).
  const Tokenizer* tokenizer() const;

  // Generates up to options.max_tokens tokens after `prompt` (token ids in [0, vocab_size),
  // not empty). on_token, if set, streams each token as it is chosen. Throws
  // std::invalid_argument naming the bad argument, std::runtime_error when prompt +
  // max_tokens exceeds max_seq_len. Safe to call from several threads at once.
  GenerationResult generate(const std::vector<int32_t>& prompt, const GenerationOptions& options = {},
                            const TokenCallback& on_token = {}) const;

  // Generates for every prompt with the same options, batched: one forward step serves all
  // running prompts (the runtime's serving engine). Results are in the prompts' order and
  // equal what generate() gives for each prompt alone (greedy or seeded). Every prompt is
  // validated before any runs (std::invalid_argument names the prompt's index).
  std::vector<GenerationResult> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                               const GenerationOptions& options = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tinyloop
