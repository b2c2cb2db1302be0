// The parsed form of a byte regular expression (docs/grammar.md has the syntax).
// Nodes live in one vector and refer to each other by index: no ownership graph to get
// wrong, and copying a Regex is a plain vector copy.
#pragma once
#include <bitset>
#include <cstdint>
#include <vector>

namespace tinyloop::grammar {

using ByteSet = std::bitset<256>;

struct RegexNode {
  enum Kind : uint8_t {
    kEmpty,  // matches the empty string only
    kBytes,  // one byte from `bytes`
    kConcat,  // children in order
    kAlt,  // any one of children
    kRepeat,  // children[0] between min and max times (max == kUnbounded: no upper bound)
  };
  static constexpr int32_t kUnbounded = -1;

  Kind kind = kEmpty;
  ByteSet bytes;  // kBytes
  std::vector<int32_t> children;  // kConcat, kAlt, kRepeat (one child)
  int32_t min = 0, max = 0;  // kRepeat
};

struct Regex {
  std::vector<RegexNode> nodes;
  int32_t root = -1;
};

}  // namespace tinyloop::grammar
