#include "runtime/prefix_pool.h"

#include <stdexcept>
#include <string>

namespace tinyloop::runtime {
namespace {

// Same engine, depth, storage and window: the only entries whose K/V a request can read.
bool fits(const PrefixCache& c, const Engine& e, int64_t loops, ops::KvDType dt, int64_t window) {
  return &c.engine() == &e && c.loops() == loops && c.kv_dtype() == dt && c.cache_window() == window;
}

}  // namespace

PrefixPool::PrefixPool(int64_t max_bytes, int64_t max_entries) : max_bytes_(max_bytes), max_entries_(max_entries) {
  if (max_bytes < 0)
    throw std::invalid_argument("max_bytes must be >= 0 (0 = no limit), got " + std::to_string(max_bytes));
  if (max_entries < 0)
    throw std::invalid_argument("max_entries must be >= 0 (0 = no limit), got " + std::to_string(max_entries));
}

PrefixPool::~PrefixPool() {
  // Iteratively, so a very long prefix (a deep chain of nodes) cannot overflow the stack in
  // the recursive unique_ptr destructors.
  std::vector<std::unique_ptr<Node>> stack;
  for (auto& [tok, child] : root_.children) stack.push_back(std::move(child));
  while (!stack.empty()) {
    std::unique_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    for (auto& [tok, child] : n->children) stack.push_back(std::move(child));
  }
}

void PrefixPool::insert(std::shared_ptr<const PrefixCache> cache) {
  if (!cache) throw std::invalid_argument("insert: null prefix cache");
  if (max_bytes_ > 0 && cache->bytes() > max_bytes_)
    throw std::invalid_argument("prefix cache of " + std::to_string(cache->bytes()) +
                                " bytes does not fit a pool of max_bytes " + std::to_string(max_bytes_));
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = &root_;
  for (int32_t tok : cache->prefix()) {
    auto& child = n->children[tok];
    if (!child) {
      child = std::make_unique<Node>();
      child->parent = n;
      child->token = tok;
    }
    n = child.get();
  }
  for (auto it : n->here)
    if (fits(*it->cache, cache->engine(), cache->loops(), cache->kv_dtype(), cache->cache_window())) {
      // Re-registration: the new cache replaces the old one, as the most recent.
      stats_.bytes += cache->bytes() - it->cache->bytes();
      it->cache = std::move(cache);
      lru_.splice(lru_.begin(), lru_, it);
      enforce_capacity_locked();
      return;
    }
  stats_.bytes += cache->bytes();
  ++stats_.entries;
  lru_.push_front(Entry{std::move(cache), n});
  n->here.push_back(lru_.begin());
  enforce_capacity_locked();
}

void PrefixPool::enforce_capacity_locked() {
  // The front entry is never evicted here: insert() checked that it fits max_bytes alone.
  while (lru_.size() > 1 &&
         ((max_bytes_ > 0 && stats_.bytes > max_bytes_) || (max_entries_ > 0 && stats_.entries > max_entries_))) {
    evict_locked(std::prev(lru_.end()));
    ++stats_.evictions;
  }
}

void PrefixPool::evict_locked(Lru::iterator it) {
  Node* n = it->node;
  for (size_t i = 0; i < n->here.size(); ++i)
    if (n->here[i] == it) {
      n->here.erase(n->here.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  stats_.bytes -= it->cache->bytes();
  --stats_.entries;
  lru_.erase(it);
  // Prune the branch that no entry needs any more.
  while (n != &root_ && n->here.empty() && n->children.empty()) {
    Node* parent = n->parent;
    parent->children.erase(n->token);  // destroys n
    n = parent;
  }
}

std::shared_ptr<const PrefixCache> PrefixPool::lookup(const Engine& engine, const std::vector<int32_t>& prompt,
                                                      int64_t loops, ops::KvDType kv_dtype, int64_t cache_window) {
  std::lock_guard<std::mutex> lock(mu_);
  Lru::iterator best = lru_.end();
  const Node* n = &root_;
  for (int32_t tok : prompt) {
    auto c = n->children.find(tok);
    if (c == n->children.end()) break;  // the prompt leaves every registered path here
    n = c->second.get();
    for (auto it : n->here)
      if (fits(*it->cache, engine, loops, kv_dtype, cache_window)) best = it;  // deeper = longer
  }
  if (best == lru_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, best);
  return best->cache;
}

PrefixPoolStats PrefixPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void PrefixPool::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!lru_.empty()) evict_locked(lru_.begin());
}

GenerateResult generate_with_pool(const Engine& engine, PrefixPool& pool, const GenerateRequest& req,
                                  const TokenCallback& on_token, int64_t* matched_len) {
  validate(engine, req);
  const int64_t L = engine.resolve_loops(req.loops);
  // A hit would refuse it (generate_after_prefill); refuse a miss too, so the answer does
  // not depend on what the pool holds.
  if (req.kv_loop_slots > 0 && req.kv_loop_slots < L)
    throw std::invalid_argument(
        "kv_loop_slots is not supported with prefix caches and pools: the prefix's K/V were "
        "computed with one slot group per iteration");
  auto cache = pool.lookup(engine, req.prompt, L, engine.kv_dtype(), req.cache_window);
  if (matched_len) *matched_len = cache ? cache->seq_len() : 0;
  if (!cache) return generate(engine, req, on_token);
  const std::vector<int32_t> suffix(req.prompt.begin() + cache->seq_len(), req.prompt.end());
  // The cache holds a shared_ptr to the engine, which this caller also keeps alive.
  return cache->generate(suffix, req, on_token);
}

}  // namespace tinyloop::runtime
