// Prefix pool (docs/prefix-cache.md "Prefix pool"): a registry of
// prebuilt PrefixCache entries with longest-prefix matching, for serving many prompts that
// start with one of several shared prefixes (system prompts, few-shot headers, tenants).
//
// Matching: a token trie. Each registered prefix ends at the node its tokens lead to, so
// finding the longest registered prefix of a prompt is one walk down the trie along the
// prompt (O(prompt length) map lookups), remembering the deepest node holding an entry that
// fits the request. Exact by construction (no hash collisions to verify), and a prompt that
// diverges inside a registered prefix just stops the walk early: a shorter entry or a miss.
//
// An entry fits a request when it was built by the same Engine at the same loops, KV storage
// mode and cache_window (its K/V were computed with them); several entries may share one
// token path.
//
// Capacity: max_bytes (sum of PrefixCache::bytes()) and/or max_entries, 0 = unlimited; past
// either, the least recently used entries (registered or matched) are evicted. The pool holds
// shared_ptrs: an evicted cache stays alive while a call still decodes off it.
//
// Thread safety: every member takes one mutex; the decoding itself runs outside it (lookup
// hands out a shared_ptr), so many threads generate off the pool at once.
#pragma once
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/generate.h"
#include "runtime/prefix_cache.h"

namespace tinyloop::runtime {

struct PrefixPoolStats {
  int64_t hits = 0;  // lookups that found a registered prefix
  int64_t misses = 0;  // lookups that found none
  int64_t evictions = 0;  // entries dropped to stay within capacity
  int64_t bytes = 0;  // sum of the entries' PrefixCache::bytes()
  int64_t entries = 0;
};

class PrefixPool {
 public:
  // 0 = no limit. std::invalid_argument for a negative value.
  PrefixPool(int64_t max_bytes, int64_t max_entries);
  ~PrefixPool();
  PrefixPool(const PrefixPool&) = delete;
  PrefixPool& operator=(const PrefixPool&) = delete;

  int64_t max_bytes() const { return max_bytes_; }
  int64_t max_entries() const { return max_entries_; }

  // Adds `cache` as the most recently used entry, then evicts from the least recently used
  // end until within capacity. An entry with the same tokens, engine, loops, KV mode and
  // window is replaced (counted neither as an eviction nor twice). std::invalid_argument when the cache
  // alone is larger than max_bytes (it could never stay).
  void insert(std::shared_ptr<const PrefixCache> cache);

  // The longest registered prefix of `prompt` (it may be all of it) built by `engine` at
  // `loops` with KV mode `kv_dtype` and window `cache_window`; null on a miss. Counts a hit
  // or a miss and makes a found entry the most recently used.
  std::shared_ptr<const PrefixCache> lookup(const Engine& engine, const std::vector<int32_t>& prompt, int64_t loops,
                                            ops::KvDType kv_dtype, int64_t cache_window = 0);

  PrefixPoolStats stats() const;
  // Drops every entry (the counters stay).
  void clear();

 private:
  struct Node;
  struct Entry {
    std::shared_ptr<const PrefixCache> cache;
    Node* node;  // where its tokens end in the trie
  };
  using Lru = std::list<Entry>;  // front = most recently used
  struct Node {
    Node* parent = nullptr;
    int32_t token = 0;  // the edge from parent
    std::map<int32_t, std::unique_ptr<Node>> children;
    std::vector<Lru::iterator> here;  // entries whose prefix ends at this node
  };

  void evict_locked(Lru::iterator it);
  void enforce_capacity_locked();

  const int64_t max_bytes_, max_entries_;
  mutable std::mutex mu_;
  Node root_;
  Lru lru_;
  PrefixPoolStats stats_;
};

// Exactly generate(engine, req), prefilling only the part of req.prompt after its longest
// prefix in `pool` (built at req.loops, or the default, with the engine's KV mode and
// req.cache_window); a miss
// is a plain generate(). Nothing is registered by this call. matched_len (optional) gets the
// matched prefix's length, 0 on a miss. Errors as generate() (checked before the lookup, so
// a bad request counts neither a hit nor a miss).
GenerateResult generate_with_pool(const Engine& engine, PrefixPool& pool, const GenerateRequest& req,
                                  const TokenCallback& on_token = {}, int64_t* matched_len = nullptr);

}  // namespace tinyloop::runtime
