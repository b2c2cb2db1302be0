// Thompson construction in continuation-passing form: build(node, next) makes the states
// for `node` that lead to state `next` and returns the entry state. Building back to front
// needs no patch lists, and a repeated sub-pattern is simply built once per copy.
#include "grammar/nfa.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace tinyloop::grammar {
namespace {

// States `node` will take, saturating at cap + 1 so nested repeats cannot overflow.
int64_t count_states(const Regex& re, int32_t id, int64_t cap) {
  const RegexNode& n = re.nodes[id];
  auto sat = [cap](int64_t v) { return std::min(v, cap + 1); };
  switch (n.kind) {
    case RegexNode::kEmpty: return 0;
    case RegexNode::kBytes: return 1;
    case RegexNode::kConcat:
    case RegexNode::kAlt: {
      int64_t total = n.kind == RegexNode::kAlt ? static_cast<int64_t>(n.children.size()) - 1 : 0;
      for (int32_t c : n.children) total = sat(total + count_states(re, c, cap));
      return total;
    }
    case RegexNode::kRepeat: {
      int64_t body = count_states(re, n.children[0], cap);
      // min mandatory copies, then (max - min) optional copies or one starred copy, each
      // optional/starred copy with one split state.
      int64_t extra = n.max == RegexNode::kUnbounded ? 1 : n.max - n.min;
      return sat(sat(n.min * body) + sat(extra * (body + 1)));
    }
  }
  return 0;
}

class Builder {
 public:
  explicit Builder(const Regex& re) : re_(re) {}

  Nfa run() {
    int32_t match = add({Nfa::kMatch});
    nfa_.start = build(re_.root, match);
    return std::move(nfa_);
  }

 private:
  int32_t add(Nfa::State s) {
    nfa_.states.push_back(s);
    return static_cast<int32_t>(nfa_.states.size() - 1);
  }
  int32_t split(int32_t a, int32_t b) { return add({Nfa::kSplit, -1, a, b}); }

  int32_t set_index(const ByteSet& s) {
    auto [it, inserted] = set_ids_.emplace(s, static_cast<int32_t>(nfa_.sets.size()));
    if (inserted) nfa_.sets.push_back(s);
    return it->second;
  }

  int32_t build(int32_t id, int32_t next) {
    const RegexNode& n = re_.nodes[id];
    switch (n.kind) {
      case RegexNode::kEmpty: return next;
      case RegexNode::kBytes: return add({Nfa::kByte, set_index(n.bytes), next, -1});
      case RegexNode::kConcat:
        for (auto it = n.children.rbegin(); it != n.children.rend(); ++it) next = build(*it, next);
        return next;
      case RegexNode::kAlt: {
        int32_t entry = build(n.children.back(), next);
        for (size_t i = n.children.size() - 1; i-- > 0;) entry = split(build(n.children[i], next), entry);
        return entry;
      }
      case RegexNode::kRepeat: {
        int32_t child = n.children[0];
        int32_t cur = next;
        if (n.max == RegexNode::kUnbounded) {
          // loop: split -> body -> back to split; split -> next
          int32_t loop = split(-1, next);
          int32_t body = build(child, loop);
          nfa_.states[loop].out = body;
          cur = loop;
        } else {
          // x{0,k} as (x(x(x)?)?)?: after each optional copy one may stop.
          for (int32_t i = 0; i < n.max - n.min; ++i) cur = split(build(child, cur), next);
        }
        for (int32_t i = 0; i < n.min; ++i) cur = build(child, cur);
        return cur;
      }
    }
    return next;
  }

  const Regex& re_;
  Nfa nfa_;
  std::unordered_map<ByteSet, int32_t> set_ids_;
};

}  // namespace

Nfa build_nfa(const Regex& re, int64_t max_states) {
  int64_t need = count_states(re, re.root, max_states) + 1;  // + the match state
  if (need > max_states)
    throw std::invalid_argument("pattern too large: its NFA needs more than " + std::to_string(max_states) +
                                " states (reduce repeat counts)");
  return Builder(re).run();
}

}  // namespace tinyloop::grammar
