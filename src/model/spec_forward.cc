#include "model/spec_forward.h"

#include <stdexcept>
#include <string>

namespace tinyloop::model {

SpecForward::SpecForward(const LoopedModel& m, KvCache& kv, int64_t draft_loops, int64_t verify_loops, int64_t branches,
                         int64_t depth)
    : m_(m), kv_(kv), d_(draft_loops), L_(verify_loops), router_(m.config(), kv, branches, depth) {
  if (d_ < 1 || d_ > L_ || L_ > kv.loops())
    throw std::logic_error("SpecForward: need 1 <= draft_loops <= verify_loops <= cache loops");
  if (kv.slot_count() < kv.layout().count() + m.config().n_post_blocks)
    throw std::logic_error("SpecForward: the cache needs n_post_blocks extra slots");
  // Its iterations and readouts carry positions only, while value embeddings need each
  // row's token (and draft-tree nodes share positions).
  if (!m.config().value_embed_layers.empty())
    throw std::invalid_argument("speculative decoding does not support value embeddings yet");
  ws_.router = &router_;
  reserve(1);
}

void SpecForward::reserve(int64_t T) {
  const int64_t before = ws_.bytes();
  ws_.reserve(m_.config(), T);
  if (ws_.bytes() != before) tracked_ = TrackedBytes(&m_.memory(), ws_.bytes() + router_.bytes());
}

void SpecForward::prefill(const int32_t* tokens, int64_t n) {
  const ModelConfig& c = m_.config();
  const int64_t D = c.dim;
  const bool post = c.n_post_blocks > 0;  // without post blocks a readout writes no K/V
  std::vector<float> unused;
  int64_t done = 0;
  while (done < n) {
    const int64_t T = m_.max_chunk(kv_, n - done);
    reserve(T);
    router_.set_all_linear();
    std::vector<int64_t> pos(T);  // [T] absolute positions
    for (int64_t t = 0; t < T; ++t) pos[t] = kv_.length() + t;
    std::vector<float> x(T * D), s(T * D);  // [T, D] loop input, loop state
    draft_prefix(tokens + done, pos.data(), T, x.data(), s.data());
    if (post) {
      std::vector<float> s_draft(s);  // [T, D] state after d iterations, for the draft readout
      readout(s_draft.data(), pos.data(), T, true, LogitRows::Last, unused);
    }
    verify_rest(s.data(), x.data(), pos.data(), T);
    if (post) readout(s.data(), pos.data(), T, false, LogitRows::Last, unused);
    kv_.advance(T);
    done += T;
  }
}

void SpecForward::draft_prefix(const int32_t* tokens, const int64_t* pos, int64_t T, float* x, float* s) {
  reserve(T);
  m_.prelude(tokens, pos, T, kv_, ws_, x);
  m_.initial_state(x, RowBatch::one(kv_, pos, T), s);
  for (int64_t i = 0; i < d_; ++i) m_.iteration(i, s, x, pos, T, kv_, ws_);
}

void SpecForward::verify_rest(float* s, const float* x, const int64_t* pos, int64_t T) {
  reserve(T);
  for (int64_t i = d_; i < L_; ++i) m_.iteration(i, s, x, pos, T, kv_, ws_);
}

void SpecForward::readout(float* s, const int64_t* pos, int64_t T, bool draft, LogitRows rows,
                          std::vector<float>& logits) {
  reserve(T);
  logits.resize((rows == LogitRows::All ? T : 1) * m_.config().vocab_size);
  router_.set_draft_readout(draft);
  try {
    m_.readout(s, pos, T, kv_, ws_, rows, logits.data());
  } catch (...) {
    router_.set_draft_readout(false);
    throw;
  }
  router_.set_draft_readout(false);
}

}  // namespace tinyloop::model
