#include "api/request.h"

#include <stdexcept>
#include <string>

#include "runtime/gate_exit.h"

namespace tinyloop::api {

runtime::GenerateRequest to_runtime_request(const std::vector<int32_t>& prompt, const GenerationOptions& o) {
  runtime::GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = o.max_tokens;
  r.loops = o.loops;
  r.sampling.temperature = o.temperature;
  r.sampling.top_k = o.top_k;
  r.sampling.top_p = o.top_p;
  r.sampling.repetition_penalty = o.repetition_penalty;
  r.sampling.presence_penalty = o.presence_penalty;
  r.sampling.frequency_penalty = o.frequency_penalty;
  r.seed = o.seed;
  r.stop_at_eos = o.stop_at_eos;
  r.stop_sequences = o.stop_sequences;
  r.early_exit.patience = o.early_exit.patience;
  r.early_exit.min_L = o.early_exit.min_loops;
  r.early_exit.tau = o.early_exit.tau;
  r.early_exit.peek_every = o.early_exit.peek_every;
  r.early_exit.logit_margin = o.early_exit.logit_margin;
  // parse_gate_mode / parse_gate_kv throw std::invalid_argument naming exit_gate / exit_gate_kv.
  if (o.exit_gate.mode) r.exit_gate.mode = runtime::parse_gate_mode(*o.exit_gate.mode);
  r.exit_gate.threshold = o.exit_gate.threshold;
  r.exit_gate.step = o.exit_gate.step;
  if (o.exit_gate.kv) r.exit_gate.full_kv = runtime::parse_gate_kv(*o.exit_gate.kv);
  return r;
}

FinishReason to_public_reason(runtime::FinishReason reason, const std::string& error) {
  switch (reason) {
    case runtime::FinishReason::Length: return FinishReason::Length;
    case runtime::FinishReason::Eos: return FinishReason::Eos;
    case runtime::FinishReason::Stop: return FinishReason::Stop;
    case runtime::FinishReason::Callback: return FinishReason::Callback;
    case runtime::FinishReason::Cancelled: return FinishReason::Cancelled;
    case runtime::FinishReason::Timeout: return FinishReason::Timeout;
    case runtime::FinishReason::Error: throw std::runtime_error("generation failed: " + error);
    default:
      throw std::runtime_error(std::string("generation ended with a reason the C++ API does not expose: ") +
                               runtime::finish_reason_name(reason));
  }
}

GenerationResult to_public_result(const runtime::GenerateResult& res, double total_ms) {
  GenerationResult out;
  const size_t emitted = static_cast<size_t>(res.tokens_emitted);
  out.tokens.assign(res.tokens.end() - static_cast<std::ptrdiff_t>(emitted), res.tokens.end());
  out.loops_per_token = res.loops_per_token;
  out.finish_reason = to_public_reason(res.finish_reason);
  out.prefill_ms = res.prefill_ms;
  out.total_ms = total_ms;
  return out;
}

GenerationResult to_public_result(const runtime::RequestResult& res) {
  GenerationResult out;
  out.finish_reason = to_public_reason(res.finish_reason, res.error);
  out.tokens = res.tokens;
  out.loops_per_token = res.loops_per_token;
  out.total_ms = res.total_ms;
  return out;
}

}  // namespace tinyloop::api

namespace tinyloop {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Length: return "length";
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Callback: return "callback";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
  }
  return "unknown";
}

}  // namespace tinyloop
