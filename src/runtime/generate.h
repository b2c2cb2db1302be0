// Autoregressive generation: prefill the prompt once, then one token per step reusing the
// KV cache (or, on the uncached reference path, re-running the whole prefix each step).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/early_exit.h"
#include "runtime/gate_exit.h"
#include "grammar/grammar.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace tinyloop::runtime {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 64;
  std::optional<int64_t> loops;  // default: config default_loops
  SamplingParams sampling;
  int64_t cache_window = 0;  // 0 = full cache; W > 0 = sliding window of W positions
  // Recurrence-shared KV (docs/kv-cache.md): B > 0 slot groups for the loop iterations,
  // iteration i in group i mod B; 0 (or B >= loops) = one slot group per iteration.
  int64_t kv_loop_slots = 0;
  std::vector<std::vector<int32_t>> stop_sequences;
  std::optional<uint64_t> seed;  // none = fresh entropy
  bool stop_at_eos = true;  // the config's eos_ids end generation (kept in the output)
  EarlyExitParams early_exit;  // decode-time early exit; disabled by default
  // Ouro's exit gate (runtime/gate_exit.h): unset fields take the model file's config.
  GateExitRequest exit_gate;
  std::shared_ptr<const grammar::Grammar> grammar;  // constrained decoding; null = none
  // >= 0: every emitted token carries its log-probability and this many top alternatives
  // (at most kMaxTopLogprobs; SequenceDecoder::logprobs()); -1 = none (no cost).
  int logprobs = -1;
  // Multiplier of a random initial state's std (Huginn's init_scale; 0 = the zero state);
  // must stay 1 on other models. runtime/state_draw.h.
  double init_scale = 1.0;
};

// Why a sequence stopped. None while it runs.
enum class FinishReason {
  None,
  Length,  // max_tokens emitted
  Eos,  // the model's EOS id was emitted (kept in the output)
  Stop,  // a stop sequence was emitted (kept)
  Grammar,  // the grammar admits nothing more (a full match)
  Callback,  // the caller's token callback returned false
  Cancelled,  // cancelled by the caller (serving engine)
  Timeout,  // the request's deadline passed (serving engine)
  Error,  // failed; the engine reports the message
};
const char* finish_reason_name(FinishReason r);  // "length", "eos", "stop", ...

struct GenerateResult {
  std::vector<int32_t> tokens;  // prompt followed by the emitted tokens
  double prefill_ms = 0;  // the prompt's forward
  double first_token_ms = 0;  // call start -> first on_token returned
  double decode_steady_ms = 0;  // first on_token returned -> end
  int64_t tokens_emitted = 0;
  // Iterations of the forward whose logits chose each emitted token ([tokens_emitted]):
  // the first comes from the prefill (always `loops`), the rest from decode steps, which
  // early exit may stop sooner.
  std::vector<int64_t> loops_per_token;
  FinishReason finish_reason = FinishReason::None;  // why generation ended
  double mean_loops() const;
};

// Called once per emitted token; returning false stops after that token.
using TokenCallback = std::function<bool(int32_t)>;

// Validates every argument first (std::invalid_argument naming it; std::runtime_error when
// prompt + max_tokens exceeds max_seq_len), then generates.
GenerateResult generate(const Engine& engine, const GenerateRequest& req, const TokenCallback& on_token = {});

// The argument checks of generate(), for callers that prefill themselves.
void validate(const Engine& engine, const GenerateRequest& req);

// Decoding after a prefill done elsewhere (warm-start resume): `kv` holds req.prompt at
// `loops` iterations (it may have slots for more), `logits` [V] are the prompt's last-position
// logits. Continues exactly as generate() would after its own prefill. Timings count from
// `start`; prefill_ms is passed in. The caller validates req.
GenerateResult generate_after_prefill(const Engine& engine, const GenerateRequest& req, int64_t loops,
                                      std::unique_ptr<model::KvCache> kv, std::vector<float> logits,
                                      std::chrono::steady_clock::time_point start, double prefill_ms,
                                      const TokenCallback& on_token = {});

}  // namespace tinyloop::runtime
