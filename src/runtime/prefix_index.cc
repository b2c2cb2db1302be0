#include "runtime/prefix_index.h"

#include <algorithm>
#include <cstring>

namespace tinyloop::runtime {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: every input bit reaches every output bit
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

bool PrefixIndex::eligible(const Sequence& s) {
  // Shared slot groups: a chunk boundary changes their K/V. A window: the early prompt
  // blocks are released during the prefill, so there is nothing whole to share.
  return !(s.req.kv_loop_slots > 0 && s.req.kv_loop_slots < s.loops) && s.req.cache_window == 0;
}

uint64_t PrefixIndex::key_of(const Sequence& s) {
  // The initial-state draw shapes every K/V of a random-state model (a Huginn call's own
  // seed); for other models it is the same constant in every request.
  uint64_t scale_bits;
  std::memcpy(&scale_bits, &s.draw.scale, sizeof scale_bits);
  return mix(mix(mix(mix(uint64_t(s.loops)) ^ uint64_t(s.req.cache_window)) ^ s.draw.seed) ^ scale_bits);
}

uint64_t PrefixIndex::chain(uint64_t prev, const int32_t* tokens, int64_t n, uint64_t key) {
  uint64_t h = mix(prev ^ key);
  for (int64_t i = 0; i < n; ++i) h = mix(h ^ uint64_t(uint32_t(tokens[i])));
  return h | 1;  // never 0, which marks "no parent"
}

int64_t PrefixIndex::adopt(Sequence& s) {
  if (!eligible(s) || !s.kv || s.kv->length() != 0) return 0;
  ++stats_.queries;
  const int64_t B = s.kv->block_rows(), P = s.prompt_len();
  const int64_t most = std::min((P - 1) / B, s.kv->block_count());  // the last token is computed
  const uint64_t key = key_of(s);
  const int32_t* prompt = s.req.prompt.data();
  uint64_t h = 0;
  for (int64_t b = 0; b < most; ++b) {
    const uint64_t hb = chain(h, prompt + b * B, B, key);
    auto it = entries_.find(hb);
    if (it == entries_.end() || it->second.parent != h ||
        !std::equal(prompt + b * B, prompt + (b + 1) * B, it->second.tokens.begin()))
      break;
    s.kv->adopt_block(*it->second.donor, it->second.block);
    it->second.last_used = ++clock_;
    h = hb;
  }
  const int64_t n = s.kv->length();
  if (n > 0) {
    ++stats_.hits;
    stats_.hit_tokens += n;
  }
  return n;
}

void PrefixIndex::insert(const Sequence& s) {
  if (!eligible(s) || !s.kv) return;
  const int64_t B = s.kv->block_rows(), P = s.prompt_len();
  const int64_t m = std::min(P / B, s.kv->length() / B);  // whole prompt blocks held
  const uint64_t key = key_of(s);
  const int32_t* prompt = s.req.prompt.data();
  std::shared_ptr<model::KvCache> donor;
  std::vector<uint8_t> used;  // [block_count] blocks the donor's entries reference
  uint64_t h = 0;
  for (int64_t b = 0; b < m; ++b) {
    const uint64_t hb = chain(h, prompt + b * B, B, key);
    auto it = entries_.find(hb);
    if (it != entries_.end()) {
      if (it->second.parent != h || !std::equal(prompt + b * B, prompt + (b + 1) * B, it->second.tokens.begin()))
        break;  // a hash collision with other tokens: index no further
      it->second.last_used = ++clock_;
      h = hb;
      continue;
    }
    if (!donor) {
      donor = s.kv->clone(s.kv->pool());  // shares every block; unreferenced ones dropped below
      used.assign(size_t(donor->block_count()), 0);
    }
    Entry e;
    e.parent = h;
    e.tokens.assign(prompt + b * B, prompt + (b + 1) * B);
    e.donor = donor;
    e.block = b;
    e.last_used = ++clock_;
    entries_.emplace(hb, std::move(e));
    if (h) ++entries_[h].children;
    used[size_t(b)] = 1;
    ++stats_.cached_blocks;
    held_blocks_ += donor->slot_count();  // an entry is one block of every slot
    h = hb;
  }
  if (donor)
    for (int64_t b = 0; b < donor->block_count(); ++b)
      if (!used[size_t(b)]) donor->drop_block(b);
}

bool PrefixIndex::evict_one() {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const Entry& e = it->second;
    if (e.children > 0 || e.donor->block_shared(e.block)) continue;  // frees nothing yet
    if (victim == entries_.end() || e.last_used < victim->second.last_used) victim = it;
  }
  if (victim == entries_.end()) return false;
  Entry& e = victim->second;
  e.donor->drop_block(e.block);
  held_blocks_ -= e.donor->slot_count();
  if (e.parent) {
    auto p = entries_.find(e.parent);
    if (p != entries_.end()) --p->second.children;
  }
  entries_.erase(victim);
  --stats_.cached_blocks;
  ++stats_.evicted_blocks;
  return true;
}

void PrefixIndex::clear() {
  stats_.evicted_blocks += static_cast<int64_t>(entries_.size());
  entries_.clear();
  stats_.cached_blocks = 0;
  held_blocks_ = 0;
}

}  // namespace tinyloop::runtime
