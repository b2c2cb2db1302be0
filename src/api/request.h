// The public API's options and results (include/tinyloop/generation.h) to and from the
// runtime's request and results (runtime/generate.h, runtime/sequence.h). Kept apart from
// the engine so the mapping is one place to extend when the runtime gains an option.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/generate.h"
#include "runtime/sequence.h"
#include "tinyloop/generation.h"

namespace tinyloop::api {

// The runtime request for `prompt` under `options`. Values are not checked here: the
// runtime's validate names the bad argument with the same names the options use.
runtime::GenerateRequest to_runtime_request(const std::vector<int32_t>& prompt, const GenerationOptions& options);

// The public reason. Throws std::runtime_error for reasons the public API cannot produce
// (a grammar stop, an unfinished run) and, for Error, with the runtime's message.
FinishReason to_public_reason(runtime::FinishReason reason, const std::string& error = {});

// A single generate() result: GenerateResult.tokens holds the prompt first, which is dropped.
GenerationResult to_public_result(const runtime::GenerateResult& result, double total_ms);
// A serving-engine result (its tokens are already the emitted ones).
GenerationResult to_public_result(const runtime::RequestResult& result);

}  // namespace tinyloop::api
