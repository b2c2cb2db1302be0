// Automatic prefix caching for the serving engine (vLLM's automatic prefix caching, the
// prefix pool as shared blocks): the KV blocks of every prompt's whole blocks stay in the
// pool after the request, indexed by a hash chain over their tokens; a later request whose
// prompt starts with the same blocks shares them (KvCache::adopt_block) and computes only
// the rest of its prompt.
//
// Exact, not approximate: the K/V of positions 0 .. n-1 depend only on tokens 0 .. n-1,
// the loop depth, the window and the initial-state draw (the kernels are batch-invariant, prefill never exits
// early), so a shared block holds exactly the bits the request would compute. The key of a
// block is therefore (its tokens, every earlier token, loops, cache_window, the draw's
// seed and scale: runtime/state_draw.h); sequences with
// recurrence-shared slot groups never share (chunking changes their K/V), and the KV mode
// is the engine's own. At least the prompt's last token is always computed, for its logits.
//
// Cached blocks count as used in the pool. When a request needs blocks the pool does not
// have, the least recently used cached blocks that nobody else holds go first (the leaves of
// the chain before their parents), before any running request is preempted.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/kv_cache.h"
#include "runtime/sequence.h"

namespace tinyloop::runtime {

struct PrefixIndexStats {
  int64_t queries = 0;  // requests looked up
  int64_t hits = 0;  // requests that shared at least one block
  int64_t hit_tokens = 0;  // prompt tokens not recomputed
  int64_t cached_blocks = 0;  // block positions cached (each: one block per slot)
  int64_t evicted_blocks = 0;
};

class PrefixIndex {
 public:
  // Shares the longest cached run of s's prompt blocks into s.kv (which must be empty).
  // Returns the positions it covers (0 when none or when s cannot share).
  int64_t adopt(Sequence& s);
  // Indexes the whole blocks of s's prompt once s.kv holds them (after its prefill).
  void insert(const Sequence& s);
  // Evicts the least recently used cached block position whose blocks nobody else holds.
  // False when there is none.
  bool evict_one();
  // Drops every cached block (engine shutdown, tests).
  void clear();
  const PrefixIndexStats& stats() const { return stats_; }
  // Pool blocks the cache holds (one per slot for every cached block position).
  int64_t held_blocks() const { return held_blocks_; }
  // Whether s takes part in prefix caching at all.
  static bool eligible(const Sequence& s);

 private:
  struct Entry {
    uint64_t parent = 0;  // hash of the previous block (0: the first)
    std::vector<int32_t> tokens;  // this block's tokens (checked on every match)
    std::shared_ptr<model::KvCache> donor;  // holds the blocks
    int64_t block = 0;  // their index in donor (and in the prompt)
    int64_t children = 0;  // entries whose parent this is
    uint64_t last_used = 0;
  };
  // The chain hash of block b of `tokens` given the previous hash and the key.
  static uint64_t chain(uint64_t prev, const int32_t* tokens, int64_t n, uint64_t key);
  static uint64_t key_of(const Sequence& s);
  std::unordered_map<uint64_t, Entry> entries_;
  uint64_t clock_ = 0;
  int64_t held_blocks_ = 0;
  PrefixIndexStats stats_;
};

}  // namespace tinyloop::runtime
