// tinyloop::Engine (include/tinyloop/engine.h) over the runtime: generate() is
// runtime::generate on a shared runtime::Engine; generate_batch() submits every prompt to a
// runtime::ServingEngine started on first use and waits for all of them.
#include "tinyloop/engine.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>

#include "api/request.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/serving_engine.h"

namespace tinyloop {
namespace {

// Collects the results of one generate_batch call; on_finish runs on the serving thread.
class BatchSink : public runtime::RequestSink {
 public:
  void on_token(int32_t, int64_t, const runtime::TokenLogprobs*) override {}
  void on_finish(const runtime::RequestResult& result) override {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = result;
    done_ = true;
    cv_.notify_all();
  }
  runtime::RequestResult wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return result_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  runtime::RequestResult result_;
};

ModelInfo make_info(const runtime::Engine& e) {
  const ModelConfig& c = e.config();
  ModelInfo info;
  info.vocab_size = c.vocab_size;
  info.default_loops = c.default_loops;
  info.max_seq_len = e.max_seq_len();
  info.eos_ids.assign(c.eos_ids.begin(), c.eos_ids.end());
  if (c.bos_id) info.bos_id = static_cast<int32_t>(*c.bos_id);
  return info;
}

}  // namespace

struct Engine::Impl {
  std::shared_ptr<const runtime::Engine> engine;
  ModelInfo info;
  std::string tokenizer_json;  // "" when the file has none
  std::once_flag tokenizer_once;  // the tokenizer is parsed on first use
  std::unique_ptr<Tokenizer> tokenizer;
  runtime::ServingOptions serving_options;
  std::mutex serving_mu;  // guards the lazy start
  std::unique_ptr<runtime::ServingEngine> serving;  // generate_batch's, started on first use

  runtime::ServingEngine& serving_engine() {
    std::lock_guard<std::mutex> lock(serving_mu);
    if (!serving) serving = std::make_unique<runtime::ServingEngine>(engine, serving_options);
    return *serving;
  }
};

Engine::Engine(const std::string& model_path, const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
  runtime::EngineOptions ro;
  ro.max_seq_len = options.max_seq_len;
  ro.kv_mode = options.kv_mode;
  ro.use_mmap = options.use_mmap;
  impl_->engine = std::make_shared<const runtime::Engine>(model_path, ro);
  impl_->info = make_info(*impl_->engine);
  // Kept as text: a model whose tokenizer the C++ side cannot run still generates from ids.
  impl_->tokenizer_json = impl_->engine->model().file().tokenizer_json();
  // Checked now rather than on the first batch, so a bad value is reported where it was given.
  if (!(options.batch_kv_budget_mb > 0))
    throw std::invalid_argument("batch_kv_budget_mb must be > 0, got " + std::to_string(options.batch_kv_budget_mb));
  if (options.batch_max_seqs < 1)
    throw std::invalid_argument("batch_max_seqs must be >= 1, got " + std::to_string(options.batch_max_seqs));
  impl_->serving_options.kv_budget_mb = options.batch_kv_budget_mb;
  impl_->serving_options.max_num_seqs = options.batch_max_seqs;
}

Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

const ModelInfo& Engine::info() const { return impl_->info; }

const Tokenizer* Engine::tokenizer() const {
  if (impl_->tokenizer_json.empty()) return nullptr;
  // An unsupported tokenizer throws out of call_once, so every later call throws the same.
  std::call_once(impl_->tokenizer_once, [&] { impl_->tokenizer = std::make_unique<Tokenizer>(impl_->tokenizer_json); });
  return impl_->tokenizer.get();
}

GenerationResult Engine::generate(const std::vector<int32_t>& prompt, const GenerationOptions& options,
                                  const TokenCallback& on_token) const {
  const auto start = std::chrono::steady_clock::now();
  const runtime::GenerateRequest req = api::to_runtime_request(prompt, options);
  runtime::TokenCallback cb;
  if (on_token) cb = [&on_token](int32_t token) { return on_token(token); };
  const runtime::GenerateResult res = runtime::generate(*impl_->engine, req, cb);
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return api::to_public_result(res, total_ms);
}

std::vector<GenerationResult> Engine::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                     const GenerationOptions& options) const {
  // Validate all first, so a bad prompt fails the call before any work is queued.
  std::vector<runtime::GenerateRequest> requests;
  requests.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests.push_back(api::to_runtime_request(prompts[i], options));
    try {
      runtime::validate(*impl_->engine, requests.back());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("prompts[" + std::to_string(i) + "]: " + e.what());
    } catch (const std::runtime_error& e) {  // too long for max_seq_len
      throw std::runtime_error("prompts[" + std::to_string(i) + "]: " + e.what());
    }
  }
  runtime::ServingEngine& serving = impl_->serving_engine();
  std::vector<std::shared_ptr<BatchSink>> sinks;
  std::vector<uint64_t> ids;
  sinks.reserve(requests.size());
  try {
    for (runtime::GenerateRequest& req : requests) {
      sinks.push_back(std::make_shared<BatchSink>());
      ids.push_back(serving.submit(std::move(req), sinks.back()));
    }
  } catch (...) {
    // A request the pool can never hold, or a full queue: no half-finished batch keeps running.
    for (uint64_t id : ids) serving.cancel(id);
    throw;
  }
  std::vector<GenerationResult> results;
  results.reserve(sinks.size());
  for (const auto& sink : sinks) results.push_back(api::to_public_result(sink->wait()));
  return results;
}

}  // namespace tinyloop
