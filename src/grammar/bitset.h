// A fixed-size bitset over token ids: the allowed-token mask of one grammar state.
// std::vector<bool> hides its words, and the mask is consumed word by word (applying it to
// logits, copying it out to Python), so we keep plain 64-bit words.
#pragma once
#include <cstdint>
#include <vector>

namespace tinyloop::grammar {

class Bitset {
 public:
  Bitset() = default;
  explicit Bitset(int64_t size) : size_(size), words_((size + 63) / 64, 0) {}

  int64_t size() const { return size_; }
  bool test(int64_t i) const { return (words_[i >> 6] >> (i & 63)) & 1u; }
  void set(int64_t i) { words_[i >> 6] |= uint64_t{1} << (i & 63); }
  int64_t count() const {
    int64_t n = 0;
    for (uint64_t w : words_) n += __builtin_popcountll(w);
    return n;
  }
  bool any() const {
    for (uint64_t w : words_)
      if (w) return true;
    return false;
  }
  // Bits at or past size() are always 0.
  const std::vector<uint64_t>& words() const { return words_; }

 private:
  int64_t size_ = 0;
  std::vector<uint64_t> words_;
};

}  // namespace tinyloop::grammar
