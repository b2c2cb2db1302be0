#include "runtime/loop_run.h"

#include <stdexcept>
#include <string>

namespace tinyloop::runtime {

LoopRun::LoopRun(const model::LoopedModel& m, model::KvCache& kv, const int32_t* tokens, int64_t T, float* trace)
    : m_(m), kv_(kv), T_(T) {
  if (T < 1) throw std::invalid_argument("LoopRun needs at least one token");
  // Unlike forward() a run is not chunked: its rows must fit one step (max_step).
  if (m.max_step(kv, T) < T)
    throw std::logic_error("a loop run of " + std::to_string(T) + " rows does not fit the KV ring");
  const int64_t D = m.config().dim;
  pos_.resize(T);
  for (int64_t t = 0; t < T; ++t) pos_[t] = kv.length() + t;
  tokens_.assign(tokens, tokens + T);
  x_.resize(T * D);
  s_.resize(T * D);
  reserve();
  m.prelude(tokens, pos_.data(), T, kv, ws_, x_.data(), trace);
  m.initial_state(x_.data(), model::RowBatch::one(kv, pos_.data(), T), s_.data());
}

LoopRun::LoopRun(const model::LoopedModel& m, model::KvCache& kv, int64_t start, std::vector<float> x,
                 std::vector<float> s, int64_t done, const int32_t* tokens)
    : m_(m), kv_(kv), done_(done), x_(std::move(x)), s_(std::move(s)) {
  const int64_t D = m.config().dim;
  T_ = static_cast<int64_t>(x_.size()) / D;
  if (T_ < 1 || static_cast<int64_t>(x_.size()) != T_ * D || s_.size() != x_.size())
    throw std::logic_error("LoopRun: saved x and s must both be [T, D]");
  if (done < 0 || done > kv.loops())
    throw std::logic_error("LoopRun: saved state after " + std::to_string(done) + " iterations, cache has slots for " +
                           std::to_string(kv.loops()));
  pos_.resize(T_);
  for (int64_t t = 0; t < T_; ++t) pos_[t] = start + t;
  if (tokens) tokens_.assign(tokens, tokens + T_);
  reserve();
}

void LoopRun::reserve() {
  const int64_t D = m_.config().dim;
  scratch_.resize(T_ * D);
  ws_.reserve(m_.config(), T_);
  tracked_ = model::TrackedBytes(&m_.memory(), ws_.bytes() + 3 * T_ * D * int64_t(sizeof(float)));
}

void LoopRun::step() {
  if (done_ >= kv_.loops())
    throw std::logic_error("iteration " + std::to_string(done_) + " beyond the cache's " + std::to_string(kv_.loops()) +
                           " loop slots");
  m_.iteration(done_, s_.data(), x_.data(), pos_.data(), T_, kv_, ws_, row_tokens());
  ++done_;
}

void LoopRun::run_to(int64_t loops) {
  while (done_ < loops) step();
}

void LoopRun::keep_rows(int64_t n) {
  if (n < 1 || n > T_) throw std::logic_error("keep_rows(" + std::to_string(n) + ") of " + std::to_string(T_));
  const int64_t D = m_.config().dim;
  T_ = n;
  pos_.resize(n);
  if (!tokens_.empty()) tokens_.resize(n);
  x_.resize(n * D);
  s_.resize(n * D);
}

void LoopRun::read_out(model::LogitRows rows, float* logits) {
  // readout normalises and runs the post blocks in place; keep s_ for deeper iterations.
  scratch_ = s_;
  m_.readout(scratch_.data(), pos_.data(), T_, kv_, ws_, rows, logits, row_tokens());
}

}  // namespace tinyloop::runtime
