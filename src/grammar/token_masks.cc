// Mask computation: one preorder scan of the vocabulary trie per DFA state.
#include "grammar/token_masks.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace tinyloop::grammar {

TokenMasks::TokenMasks(std::shared_ptr<const Dfa> dfa, const std::vector<std::string>& token_bytes)
    : dfa_(std::move(dfa)), trie_(token_bytes), none_(static_cast<int64_t>(token_bytes.size())) {
  if (token_bytes.empty()) throw std::invalid_argument("token vocabulary is empty");
  offsets_.reserve(token_bytes.size() + 1);
  offsets_.push_back(0);
  for (const std::string& t : token_bytes) {
    bytes_ += t;
    offsets_.push_back(static_cast<int64_t>(bytes_.size()));
  }
  const int32_t n = dfa_->num_states();
  cache_ = std::make_unique<std::atomic<const Bitset*>[]>(n);
  for (int32_t s = 0; s < n; ++s) cache_[s].store(nullptr, std::memory_order_relaxed);
}

TokenMasks::~TokenMasks() {
  for (int32_t s = 0; s < dfa_->num_states(); ++s) delete cache_[s].load(std::memory_order_relaxed);
}

void TokenMasks::check_state(int32_t state) const {
  if (state < Dfa::kDead || state >= dfa_->num_states())
    throw std::invalid_argument("grammar state " + std::to_string(state) + " out of range [-1, " +
                                std::to_string(dfa_->num_states()) + ")");
}

Bitset TokenMasks::compute(int32_t start) const {
  Bitset mask(vocab_size());
  const Dfa& d = *dfa_;
  const std::vector<TokenTrie::Node>& nodes = trie_.nodes();
  const std::vector<int32_t>& ids = trie_.token_ids();
  std::vector<int32_t> state_at(trie_.max_depth() + 1);  // DFA state after each depth
  state_at[0] = start;
  const int32_t n = static_cast<int32_t>(nodes.size());
  for (int32_t i = 0; i < n;) {
    const TokenTrie::Node& node = nodes[i];
    int32_t t = d.step(state_at[node.depth - 1], node.byte);
    if (t == Dfa::kDead) {  // no token below this prefix can be allowed
      i = node.subtree_end;
      continue;
    }
    state_at[node.depth] = t;
    for (int32_t k = node.tokens_begin; k < node.tokens_end; ++k) mask.set(ids[k]);
    ++i;
  }
  return mask;
}

const Bitset& TokenMasks::allowed(int32_t state) const {
  check_state(state);
  if (state == Dfa::kDead) return none_;
  std::atomic<const Bitset*>& slot = cache_[state];
  if (const Bitset* m = slot.load(std::memory_order_acquire)) return *m;
  auto fresh = std::make_unique<const Bitset>(compute(state));
  const Bitset* expected = nullptr;
  if (slot.compare_exchange_strong(expected, fresh.get(), std::memory_order_acq_rel, std::memory_order_acquire))
    return *fresh.release();
  return *expected;  // another thread published first; ours is dropped
}

int32_t TokenMasks::advance(int32_t state, int32_t token_id) const {
  check_state(state);
  if (token_id < 0 || token_id >= vocab_size())
    throw std::invalid_argument("token id " + std::to_string(token_id) + " out of range for a vocabulary of " +
                                std::to_string(vocab_size()) + " tokens");
  if (state == Dfa::kDead || offsets_[token_id] == offsets_[token_id + 1]) return Dfa::kDead;
  std::string_view bytes(bytes_.data() + offsets_[token_id], offsets_[token_id + 1] - offsets_[token_id]);
  return dfa_->run(state, bytes);
}

void TokenMasks::precompute_all() const {
  for (int32_t s = 0; s < dfa_->num_states(); ++s) allowed(s);
}

int32_t TokenMasks::cached_masks() const {
  int32_t n = 0;
  for (int32_t s = 0; s < dfa_->num_states(); ++s) n += cache_[s].load(std::memory_order_acquire) != nullptr;
  return n;
}

namespace {
// kByteLanes[b][j]: all ones when bit j of b is set.
const std::array<std::array<uint32_t, 8>, 256> kByteLanes = [] {
  std::array<std::array<uint32_t, 8>, 256> t{};
  for (int b = 0; b < 256; ++b)
    for (int j = 0; j < 8; ++j) t[b][j] = ((b >> j) & 1) ? ~uint32_t{0} : 0u;
  return t;
}();
constexpr uint32_t kNegInfBits = 0xff800000u;  // -inf as float32 bits
}  // namespace

void mask_logits(const Bitset& mask, float* logits, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::vector<uint64_t>& words = mask.words();
  const int64_t full = std::min<int64_t>(n / 64, static_cast<int64_t>(words.size()));
  for (int64_t k = 0; k < full; ++k) {
    const uint64_t w = words[k];
    float* row = logits + k * 64;
    if (w == ~uint64_t{0}) continue;  // all allowed: common inside free text
    if (w == 0) {  // none allowed: common in tight grammars
      std::fill(row, row + 64, kNegInf);
      continue;
    }
    // Mixed word: expand each mask byte to 8 lane masks through a table and blend on the
    // float bit patterns; plain and/or on uint32 lanes vectorizes on baseline SSE2, where a
    // per-bit select (a variable 64-bit shift per lane) would not.
    uint32_t lanes[64], keep[64];
    std::memcpy(lanes, row, sizeof(lanes));
    for (int b = 0; b < 8; ++b) std::memcpy(keep + 8 * b, kByteLanes[(w >> (8 * b)) & 0xff].data(), 32);
    for (int j = 0; j < 64; ++j) lanes[j] = (lanes[j] & keep[j]) | (kNegInfBits & ~keep[j]);
    std::memcpy(row, lanes, sizeof(lanes));
  }
  for (int64_t i = full * 64; i < n; ++i)
    if (i >= mask.size() || !mask.test(i)) logits[i] = kNegInf;
}

}  // namespace tinyloop::grammar
