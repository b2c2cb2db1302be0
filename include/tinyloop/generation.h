// What one generation call asks for and what it returns: the public C++ API's options and
// results (docs/cpp-api.md). Plain structs with standard-library members only, so this header
// stands alone once installed; src/api/engine.cc maps them onto the runtime's request.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tinyloop/export.h"

namespace tinyloop {

// Decode-time early exit: a token stops iterating once its loop state settles
// (docs/loop-depth.md). patience 0 disables it.
struct EarlyExitOptions {
  int64_t patience = 0;  // consecutive stable probes to stop; 0 = off
  int64_t min_loops = 2;  // iterations before the first probe (>= 1)
  double tau = 1e-3;  // hidden-state change threshold (>= 0)
  int64_t peek_every = 1;  // iterations between probes after min_loops (>= 1)
  double logit_margin = 0.0;  // > 0: stop on the top1 - top2 logit gap instead (>= 0)
};

// A learned exit gate (Ouro models, docs/loop-depth.md "Exit gate"). An unset field takes
// the model file's config; models without a gate refuse any setting.
struct ExitGateOptions {
  std::optional<std::string> mode;  // "off" | "threshold" | "step" | "weighted"
  std::optional<double> threshold;  // threshold mode: cumulative exit probability in [0, 1]
  std::optional<int64_t> step;  // step mode: the iteration to exit at (>= 1)
  std::optional<std::string> kv;  // "latest" (skip iterations) | "full" (run them all)
};

// One options struct for a call (single or batch). Defaults are greedy decoding at the
// model's default depth, stopping at EOS or after max_tokens.
struct GenerationOptions {
  int64_t max_tokens = 64;  // tokens to emit at most (>= 1)
  std::optional<int64_t> loops;  // loop depth; unset = the config's default_loops
  float temperature = 0.0f;  // <= 0.01 is greedy (argmax)
  int top_k = 50;  // >= 1 when sampling
  float top_p = 1.0f;  // in (0, 1]; 1 disables
  float repetition_penalty = 1.0f;  // > 0; 1 disables
  float presence_penalty = 0.0f;  // in [-2, 2]
  float frequency_penalty = 0.0f;  // in [-2, 2]
  std::optional<uint64_t> seed;  // unset = fresh entropy; set = reproducible sampling
  bool stop_at_eos = true;  // the config's eos_ids end generation (kept in the output)
  std::vector<std::vector<int32_t>> stop_sequences;  // each ends generation when emitted (kept)
  EarlyExitOptions early_exit;
  ExitGateOptions exit_gate;
};

// Why generation ended.
enum class FinishReason {
  Length,  // max_tokens emitted
  Eos,  // an EOS id was emitted (kept in tokens)
  Stop,  // a stop sequence was emitted (kept)
  Callback,  // the token callback returned false
  Cancelled,  // the engine was torn down while the request ran (batch)
  Timeout,  // a deadline passed (batch)
};
// "length", "eos", "stop", "callback", "cancelled", "timeout".
TINYLOOP_API const char* finish_reason_name(FinishReason reason);

struct GenerationResult {
  std::vector<int32_t> tokens;  // [n] the emitted tokens, prompt excluded
  std::vector<int64_t> loops_per_token;  // [n] loop iterations behind each emitted token
  FinishReason finish_reason = FinishReason::Length;
  double prefill_ms = 0;  // the prompt's forward (single generate only; 0 in a batch)
  double total_ms = 0;  // call (or submit) to finish
};

// Called once per emitted token, in order, on the calling thread; returning false stops
// generation after that token (FinishReason::Callback).
using TokenCallback = std::function<bool(int32_t token)>;

}  // namespace tinyloop
