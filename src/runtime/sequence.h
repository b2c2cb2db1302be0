// One request inside the serving engine (docs/serving.md): everything it owns between
// submit and finish. Its KV is a block table into the engine's pool; its sampler state,
// RNG, grammar cursor and stop matcher are its SequenceDecoder; its depth policy is its
// request's loops and early-exit settings; its output goes to its sink.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "runtime/decoder.h"
#include "runtime/generate.h"
#include "runtime/state_draw.h"

namespace tinyloop::runtime {

using SteadyClock = std::chrono::steady_clock;

// What a finished request reports.
struct RequestResult {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // the emitted tokens (not the prompt)
  std::vector<int64_t> loops_per_token;  // [tokens] iterations behind each
  std::vector<TokenLogprobs> logprobs;  // [tokens] when the request asked for logprobs; else empty
  FinishReason finish_reason = FinishReason::None;
  std::string error;  // the message when finish_reason == Error
  int64_t prompt_tokens = 0;
  double queue_ms = 0;  // submit -> first scheduled
  double first_token_ms = 0;  // submit -> first token
  double total_ms = 0;  // submit -> finish
  int64_t preemptions = 0;  // times its KV was dropped and recomputed
  double mean_loops() const;
};

// Where a request's output goes. Called from the engine's thread, in order: on_token for
// every emitted token, then on_finish once. Implementations must not block for long.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // logprobs: the token's log-probabilities when the request asked for them, else null.
  virtual void on_token(int32_t token, int64_t depth, const TokenLogprobs* logprobs) = 0;
  virtual void on_finish(const RequestResult& result) = 0;
};

struct Sequence {
  Sequence(uint64_t id_, GenerateRequest r, int64_t loops_, const ModelConfig& c, std::shared_ptr<RequestSink> s)
      : id(id_),
        req(std::move(r)),
        loops(loops_),
        tokens(req.prompt),
        decoder(c, req),
        draw(resolve_state_draw(c, req.seed, req.init_scale)),
        gate(resolve_gate(c, req.exit_gate, req.early_exit)),
        sink(std::move(s)),
        arrival(SteadyClock::now()) {}

  uint64_t id;
  GenerateRequest req;  // validated
  int64_t loops;  // resolved depth
  std::vector<int32_t> tokens;  // prompt + emitted
  std::unique_ptr<model::KvCache> kv;  // null until first scheduled (and after preemption)
  SequenceDecoder decoder;
  model::StateDraw draw;  // its initial state, the same after preemption
  GateExitParams gate;  // the exit gate's rule (req's kwargs over the file's)
  std::shared_ptr<RequestSink> sink;
  SteadyClock::time_point arrival, scheduled{}, first_token{};
  SteadyClock::time_point deadline = SteadyClock::time_point::max();
  std::atomic<bool> cancel_requested{false};
  int64_t preemptions = 0;

  int64_t prompt_len() const { return static_cast<int64_t>(req.prompt.size()); }
  // Positions whose K/V the cache holds.
  int64_t computed() const { return kv ? kv->length() : 0; }
  // Fed tokens not yet in the cache (prompt chunks, a replay after preemption, or the last
  // emitted token).
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed(); }
};

}  // namespace tinyloop::runtime
