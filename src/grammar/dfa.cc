// Subset construction (eager, bounded) and dead-state pruning.
//
// Eager rather than lazy: the token masks need every state anyway, a fully built table
// makes the automaton immutable (no locking on the hot path), and the limits turn a
// pattern that would explode into a clear error at compile time instead of mid-generation.
#include "grammar/dfa.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace tinyloop::grammar {
namespace {

// Partition of the 256 bytes into classes no NFA byte set distinguishes: refine one
// partition by each set in turn. Class ids are numbered by first byte, so class 0 holds 0x00.
int32_t byte_classes(const std::vector<ByteSet>& sets, std::array<uint8_t, 256>& class_of) {
  std::array<int32_t, 256> cls{};
  int32_t n = 1;
  for (const ByteSet& s : sets) {
    std::vector<int32_t> in(n, -1), out(n, -1);
    int32_t m = 0;
    for (int b = 0; b < 256; ++b) {
      int32_t& slot = s.test(b) ? in[cls[b]] : out[cls[b]];
      if (slot < 0) slot = m++;
      cls[b] = slot;
    }
    n = m;
  }
  for (int b = 0; b < 256; ++b) class_of[b] = static_cast<uint8_t>(cls[b]);
  return n;
}

struct SubsetHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Epsilon closure, keeping only the states that matter to a DFA state (byte and match
// states), sorted so equal subsets compare equal.
class Closure {
 public:
  explicit Closure(const Nfa& nfa) : nfa_(nfa), mark_(nfa.states.size(), 0) {}

  int64_t visits = 0;  // states touched, for the work limit

  std::vector<int32_t> of(const std::vector<int32_t>& seeds) {
    ++stamp_;
    std::vector<int32_t> out;
    stack_.assign(seeds.begin(), seeds.end());
    while (!stack_.empty()) {
      int32_t s = stack_.back();
      stack_.pop_back();
      ++visits;
      if (s < 0 || mark_[s] == stamp_) continue;
      mark_[s] = stamp_;
      const Nfa::State& st = nfa_.states[s];
      if (st.kind == Nfa::kSplit) {
        stack_.push_back(st.out2);
        stack_.push_back(st.out);
      } else {
        out.push_back(s);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  const Nfa& nfa_;
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
  std::vector<int32_t> stack_;
};

[[noreturn]] void too_complex(const std::string& what) {
  throw std::invalid_argument("pattern too complex: " + what +
                              " (simplify it, e.g. fewer nested or overlapping repeats)");
}

}  // namespace

std::string Dfa::shortest_completion(int32_t s) const {
  std::string out;
  while (s != kDead && !accepting(s)) {
    int32_t best_c = -1;
    for (int32_t c = 0; c < num_classes_; ++c) {
      int32_t t = step_class(s, c);
      if (t == kDead || distance_[t] != distance_[s] - 1) continue;
      // prefer a printable representative, then the lowest one
      auto rank = [&](int32_t k) {
        uint8_t r = class_rep_[k];
        return (r >= 0x20 && r < 0x7f ? 0 : 256) + r;
      };
      if (best_c < 0 || rank(c) < rank(best_c)) best_c = c;
    }
    out.push_back(static_cast<char>(class_rep_[best_c]));
    s = step_class(s, best_c);
  }
  return out;
}

Dfa build_dfa(const Nfa& nfa, const DfaLimits& limits) {
  Dfa d;
  d.num_classes_ = byte_classes(nfa.sets, d.class_of_);
  const int32_t nc = d.num_classes_;
  // Representative per class: the lowest printable byte if any, else the lowest byte.
  std::vector<int> rep(nc, -1);
  for (int b = 0x20; b < 0x7f; ++b)
    if (rep[d.class_of_[b]] < 0) rep[d.class_of_[b]] = b;
  for (int b = 0; b < 256; ++b)
    if (rep[d.class_of_[b]] < 0) rep[d.class_of_[b]] = b;
  for (int32_t c = 0; c < nc; ++c) d.class_rep_[c] = static_cast<uint8_t>(rep[c]);

  // --- subset construction: raw states, some of them dead ---
  Closure closure(nfa);
  std::unordered_map<std::vector<int32_t>, int32_t, SubsetHash> ids;
  std::vector<const std::vector<int32_t>*> subsets;  // by raw id (keys of `ids` are stable)
  std::vector<int32_t> table;
  std::vector<uint8_t> accepting;
  int64_t entries = 0;
  auto intern = [&](std::vector<int32_t>&& subset) -> int32_t {
    auto it = ids.find(subset);
    if (it != ids.end()) return it->second;
    if (static_cast<int64_t>(subsets.size()) >= limits.max_states)
      too_complex("its DFA exceeds " + std::to_string(limits.max_states) + " states");
    entries += static_cast<int64_t>(subset.size());
    if (entries > limits.max_subset_entries)
      too_complex("its DFA construction exceeds " + std::to_string(limits.max_subset_entries) + " NFA-state entries");
    bool acc = false;
    for (int32_t s : subset) acc = acc || nfa.states[s].kind == Nfa::kMatch;
    int32_t id = static_cast<int32_t>(subsets.size());
    auto ins = ids.emplace(std::move(subset), id).first;
    subsets.push_back(&ins->first);
    accepting.push_back(acc ? 1 : 0);
    return id;
  };

  intern(closure.of({nfa.start}));
  std::vector<int32_t> seeds;
  int64_t scanned = 0;
  for (size_t cur = 0; cur < subsets.size(); ++cur) {
    // Work bound: many byte classes times big subsets can be slow long before the state
    // limit is reached.
    scanned += static_cast<int64_t>(subsets[cur]->size()) * nc;
    if (scanned + closure.visits > limits.max_work)
      too_complex("its DFA construction exceeds " + std::to_string(limits.max_work) + " steps");
    table.resize((cur + 1) * nc, Dfa::kDead);
    for (int32_t c = 0; c < nc; ++c) {
      seeds.clear();
      for (int32_t s : *subsets[cur]) {
        const Nfa::State& st = nfa.states[s];
        if (st.kind == Nfa::kByte && nfa.sets[st.set].test(d.class_rep_[c])) seeds.push_back(st.out);
      }
      if (seeds.empty()) continue;
      int32_t t = intern(closure.of(seeds));
      table[cur * nc + c] = t;  // `table` is not resized by intern, so this index stays valid
    }
  }
  const int32_t raw_n = static_cast<int32_t>(subsets.size());

  // --- distance to acceptance by reverse BFS; unreachable = dead ---
  std::vector<std::vector<int32_t>> preds(raw_n);
  for (int32_t s = 0; s < raw_n; ++s)
    for (int32_t c = 0; c < nc; ++c)
      if (int32_t t = table[static_cast<size_t>(s) * nc + c]; t != Dfa::kDead) preds[t].push_back(s);
  std::vector<int32_t> dist(raw_n, -1);
  std::deque<int32_t> queue;
  for (int32_t s = 0; s < raw_n; ++s)
    if (accepting[s]) {
      dist[s] = 0;
      queue.push_back(s);
    }
  while (!queue.empty()) {
    int32_t t = queue.front();
    queue.pop_front();
    for (int32_t s : preds[t])
      if (dist[s] < 0) {
        dist[s] = dist[t] + 1;
        queue.push_back(s);
      }
  }
  if (dist[0] < 0) throw std::invalid_argument("pattern matches no string");

  // --- keep the live states, renumbered in construction order (the start stays 0) ---
  std::vector<int32_t> new_id(raw_n, Dfa::kDead);
  int32_t n = 0;
  for (int32_t s = 0; s < raw_n; ++s)
    if (dist[s] >= 0) new_id[s] = n++;
  d.start_ = 0;
  d.table_.assign(static_cast<size_t>(n) * nc, Dfa::kDead);
  d.accepting_.assign(n, 0);
  d.can_continue_.assign(n, 0);
  d.distance_.assign(n, 0);
  for (int32_t s = 0; s < raw_n; ++s) {
    int32_t ns = new_id[s];
    if (ns == Dfa::kDead) continue;
    d.accepting_[ns] = accepting[s];
    d.distance_[ns] = dist[s];
    for (int32_t c = 0; c < nc; ++c) {
      int32_t t = table[static_cast<size_t>(s) * nc + c];
      int32_t nt = t == Dfa::kDead ? Dfa::kDead : new_id[t];
      d.table_[static_cast<size_t>(ns) * nc + c] = nt;
      if (nt != Dfa::kDead) d.can_continue_[ns] = 1;
    }
  }
  return d;
}

}  // namespace tinyloop::grammar
