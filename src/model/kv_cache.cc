#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ops/kv_quant.h"
#include "tinyloop/checked.h"

namespace tinyloop::model {

KvCache::KvCache(const ModelConfig& c, int64_t loops, int64_t capacity, int64_t window, ops::KvDType dtype,
                 MemoryTracker* tracker, int64_t extra_slots, int64_t loop_slots, KvPoolPtr pool, int64_t first_pos,
                 int64_t block_rows)
    : layout_(c, loops, loop_slots),
      capacity_(capacity),
      // A window past 2^40 positions (any sequence's length) sees what 2^40 sees; clamped,
      // no window arithmetic (p - window + 1 - kWindowSlack) can wrap for cache_window = 2^63 - 1.
      window_(std::min<int64_t>(window, int64_t(1) << 40)),
      extra_slots_(extra_slots),
      // A shared pool's blocks may be laid out in extents (kv_pool.h): the cache's layout
      // takes its extent, so that the check below compares everything else.
      block_(c, dtype,
             block_rows > 0 ? block_rows
             : pool         ? pool->layout().rows
                            : std::clamp<int64_t>(capacity, 1, kDefaultBlockRows),
             pool ? pool->layout().extent : 1),
      tracker_(tracker),
      pool_(std::move(pool)) {
  draw_.seed = c.init_state_seed;
  if (loops < 1) throw std::invalid_argument("loops must be >= 1, got " + std::to_string(loops));
  if (capacity < 1) throw std::invalid_argument("KV capacity must be >= 1");
  if (extra_slots < 0) throw std::invalid_argument("extra KV slots must be >= 0");
  if (loop_slots < 0) throw std::invalid_argument("kv_loop_slots must be >= 0, got " + std::to_string(loop_slots));
  if (window < 0) throw std::invalid_argument("cache_window must be >= 0");
  // Slots: pre + groups x loop layers + post (+ extra), each term from the config and the
  // call's loops, so it is computed checked rather than trusted.
  const int64_t slots = checked_add(
      checked_add(checked_add(layout_.n_pre, checked_mul(layout_.groups, layout_.n_loop, "KV loop slots"), "KV slots"),
                  layout_.n_post, "KV slots"),
      extra_slots_, "KV slots");
  // The table is [slots, ceil(capacity / rows)] entries: refuse sizes whose product wraps
  // or cannot be held (a huge loops or max_tokens), naming what was asked.
  n_blocks_ = capacity_ / block_.rows + (capacity_ % block_.rows != 0);
  if (slots > (int64_t(1) << 40) / std::max<int64_t>(1, n_blocks_))
    throw std::runtime_error("out of memory: a KV cache of " + std::to_string(slots) + " slots x " +
                             std::to_string(capacity_) + " positions");
  if (pool_) {
    if (!(pool_->layout() == block_))
      throw std::logic_error("KvCache: the pool's block layout differs from the cache's");
  } else {
    // A private pool, empty at first: reserve() grows it to each forward's blocks (a
    // prompt's in one arena), and a helper thread faults the next arena in ahead of the
    // decode steps (KvPool::grow_ahead_to), up to what this sequence can write: positions
    // first_pos .. capacity - 1, or with a window the most blocks it holds at once, so its
    // memory is bounded by the window whatever the length. Sizing it for all of that up
    // front put the fault-in of every position up to max_tokens before the first token
    // (EPYC Zen 5, benchmark model, 1-token prompt: 9 ms to the first token with
    // max_tokens = 1, 84 ms with 4096), and a generation that stops early paid for
    // positions it never wrote.
    const int64_t first = std::clamp<int64_t>(first_pos, 0, capacity_);
    // A window as long as the capacity is no window for the pool's size: every position
    // (and slots x n_blocks_ was bounded above, so the product cannot wrap); a shorter one
    // needs at most n_blocks_ + a few blocks a slot.
    const int64_t per_slot = window_ > 0 && window_ < capacity_
                                 ? window_blocks(window_, block_.rows)
                                 : (capacity_ - 1) / block_.rows - first / block_.rows + 1;
    pool_ = std::make_shared<KvPool>(block_, 0, 0, tracker_);
    pool_->grow_ahead_to(slots * per_slot);
    private_pool_ = true;
  }
  refs_.resize(size_t(slots * n_blocks_));
  table_.resize(refs_.size());
}

KvCache::~KvCache() { release_all(); }

int64_t KvCache::window_blocks(int64_t window, int64_t rows) {
  // During a forward of n <= kWindowSlack new positions from length l, a slot holds blocks
  // floor((l - window + 1 - kWindowSlack) / rows) .. floor((l + n - 1) / rows) (advance()
  // released the ones before): at most (n + window + kWindowSlack - 2) / rows + 2.
  // A window longer than any sequence (2^40: any cache_window a caller passes) is the same
  // as that bound, and cannot make the sum wrap.
  window = std::min<int64_t>(window, int64_t(1) << 40);
  return (kWindowSlack + window + kWindowSlack - 2) / rows + 2;
}

void KvCache::hold_pool(const KvPoolPtr& p) {
  if (p == pool_) return;
  for (const KvPoolPtr& h : held_)
    if (h == p) return;
  held_.push_back(p);
}

void KvCache::share_block(const KvCache& src, int64_t s, int64_t b) {
  const Ref& r = src.refs_[size_t(s * src.n_blocks_ + b)];
  if (r.id >= 0) r.pool->retain(r.id);  // before the drop: src may be this very cache
  drop(s, b);
  if (r.id < 0) return;
  refs_[size_t(s * n_blocks_ + b)] = r;
  table_[size_t(s * n_blocks_ + b)] = src.table_[size_t(s * src.n_blocks_ + b)];
}

void KvCache::hold_pools_of(const KvCache& src) {
  hold_pool(src.pool_);
  for (const KvPoolPtr& p : src.held_) hold_pool(p);
}

void KvCache::drop(int64_t s, int64_t b) {
  Ref& r = refs_[size_t(s * n_blocks_ + b)];
  if (r.id >= 0) r.pool->release(r.id);
  r = Ref{};
  table_[size_t(s * n_blocks_ + b)] = ops::KvBlock{};
}

void KvCache::release_all() {
  for (int64_t s = 0; s < slot_count(); ++s)
    for (int64_t b = 0; b < n_blocks_; ++b) drop(s, b);
  length_ = 0;
  released_ = 0;
}

void KvCache::make_writable(int64_t s, int64_t b) {
  Ref& r = refs_[size_t(s * n_blocks_ + b)];
  if (r.id >= 0 && !r.pool->shared(r.id)) return;
  // The slot's previous block, if this pool holds it: the pool places this one beside it
  // where it can (KvPool::allocate), so a kv head's rows stay one stream across them.
  const Ref& prev = b > 0 ? refs_[size_t(s * n_blocks_ + b - 1)] : Ref{};
  const int32_t id = pool_->allocate(prev.pool == pool_.get() ? prev.id : -1);
  if (r.id >= 0) {  // shared: this holder gets its own copy
    block_.copy(pool_->block(id), r.pool->block(r.id));
    r.pool->release(r.id);
  }
  r = Ref{pool_.get(), id};
  table_[size_t(s * n_blocks_ + b)] = pool_->block(id);
}

int64_t KvCache::blocks_needed(int64_t end) const {
  end = std::min(end, capacity_);
  if (end <= length_) return 0;
  const int64_t b0 = std::max(length_ / block_.rows, released_), b1 = (end - 1) / block_.rows;
  int64_t n = 0;
  for (int64_t s = 0; s < slot_count(); ++s)
    for (int64_t b = b0; b <= b1; ++b) {
      const Ref& r = refs_[size_t(s * n_blocks_ + b)];
      n += r.id < 0 || r.pool->shared(r.id);
    }
  return n;
}

void KvCache::reserve(int64_t end) {
  if (end > capacity_)
    throw std::logic_error("KV reserve to " + std::to_string(end) + " past the capacity " + std::to_string(capacity_));
  if (end <= length_) return;
  grow_pool_for(end);
  const int64_t b0 = std::max(length_ / block_.rows, released_), b1 = (end - 1) / block_.rows;
  for (int64_t s = 0; s < slot_count(); ++s)
    for (int64_t b = b0; b <= b1; ++b) make_writable(s, b);
}

void KvCache::grow_pool_for(int64_t end) {
  if (private_pool_ && end > length_) pool_->reserve_free(blocks_needed(end));
}

int64_t KvCache::blocks_held() const {
  int64_t n = 0;
  for (const Ref& r : refs_) n += r.id >= 0;
  return n;
}

int64_t KvCache::bytes() const {
  if (private_pool_) return pool_->arena_bytes();
  int64_t n = 0;
  for (const Ref& r : refs_) n += r.id >= 0 && r.pool == pool_.get();
  return n * block_.bytes;
}

void KvCache::advance(int64_t n) {
  length_ += n;
  if (window_ <= 0) return;
  // A query at length_ or later sees positions >= length_ - window_ + 1; keep kWindowSlack
  // more for rollback, release whole blocks before that.
  const int64_t keep_from = length_ - window_ + 1 - kWindowSlack;
  const int64_t upto = keep_from > 0 ? keep_from / block_.rows : 0;  // blocks [0, upto) go
  for (; released_ < std::min(upto, n_blocks_); ++released_)
    for (int64_t s = 0; s < slot_count(); ++s) drop(s, released_);
}

void KvCache::truncate(int64_t new_length) {
  if (new_length < 0 || new_length > length_)
    throw std::logic_error("KV truncate to " + std::to_string(new_length) + " of " + std::to_string(length_));
  if (window_ > 0 && new_length - window_ + 1 < first_kept() && new_length > 0)
    throw std::logic_error("KV truncate past the window's released blocks");
  length_ = new_length;
}

void KvCache::copy_row(int64_t src_slot, int64_t dst_slot, int64_t p) {
  if (src_slot == dst_slot) return;  // recurrence-shared iterations: already the same rows
  const int64_t b = p / block_.rows, row = p % block_.rows;
  make_writable(dst_slot, b);
  const auto* src = static_cast<const uint8_t*>(table_[size_t(src_slot * n_blocks_ + b)].k);
  auto* dst = static_cast<uint8_t*>(table_[size_t(dst_slot * n_blocks_ + b)].k);
  if (!src) throw std::logic_error("copy_row from a position the cache does not hold");
  if (ops::is_store_h(block_.dtype)) {  // h [rows, row_bytes] | scales [rows, row_scales]
    const int64_t v = row * block_.row_bytes;
    std::memcpy(dst + v, src + v, size_t(block_.row_bytes));
    if (block_.row_scales > 0) {
      const int64_t sc = block_.ks_off + row * block_.row_scales * int64_t(sizeof(float));
      std::memcpy(dst + sc, src + sc, size_t(block_.row_scales) * sizeof(float));
    }
    return;
  }
  // K / V: each kv head's part of the row is its own run in the block's order (head-major,
  // kv_pool.h): values at index * head_dim of the block's K / V, I8 scales at index of its
  // scales (ops::KvView::index).
  const ops::KvView kv = view(dst_slot);
  const ops::KvBlock& sb = table_[size_t(src_slot * n_blocks_ + b)];
  const ops::KvBlock& db = table_[size_t(dst_slot * n_blocks_ + b)];
  const int64_t hd_bytes = block_.row_bytes / block_.n_kv_heads;
  for (int64_t g = 0; g < block_.n_kv_heads; ++g) {
    const int64_t i = kv.index(row, g);  // (row, kv head)
    std::memcpy(static_cast<uint8_t*>(db.k) + i * hd_bytes, static_cast<const uint8_t*>(sb.k) + i * hd_bytes,
                size_t(hd_bytes));
    std::memcpy(static_cast<uint8_t*>(db.v) + i * hd_bytes, static_cast<const uint8_t*>(sb.v) + i * hd_bytes,
                size_t(hd_bytes));
    if (block_.row_scales > 0) {
      db.k_scale[i] = sb.k_scale[i];
      db.v_scale[i] = sb.v_scale[i];
    }
  }
}

std::unique_ptr<KvCache> KvCache::clone(KvPoolPtr pool, int64_t capacity) const {
  // A private pool of its own starts empty: the clone allocates only what it writes.
  const bool own = !pool;
  if (own) pool = std::make_shared<KvPool>(block_, 0, 0, tracker_);
  ModelConfig c;
  c.n_pre_blocks = layout_.n_pre;
  c.n_loop_layers = layout_.n_loop;
  c.n_post_blocks = layout_.n_post;
  c.n_kv_heads = block_.n_kv_heads;
  c.head_dim = block_.head_dim;
  c.dim = block_.dim;
  auto out = std::make_unique<KvCache>(c, layout_.loops, std::max(capacity, capacity_), window_, block_.dtype, tracker_,
                                       extra_slots_, layout_.groups < layout_.loops ? layout_.groups : 0,
                                       std::move(pool), 0, block_.rows);
  out->private_pool_ = own;
  out->assign_from(*this);
  return out;
}

void KvCache::assign_from(const KvCache& src) {
  if (&src == this) return;
  if (src.slot_count() != slot_count() || !(src.block_ == block_) || src.n_blocks_ > n_blocks_ ||
      src.layout_.groups != layout_.groups || src.window_ != window_)
    throw std::logic_error("assign_from: the caches differ in shape");
  release_all();
  hold_pools_of(src);
  for (int64_t s = 0; s < slot_count(); ++s)
    for (int64_t b = 0; b < src.n_blocks_; ++b) share_block(src, s, b);
  length_ = src.length_;
  released_ = src.released_;
  draw_ = src.draw_;
}

void KvCache::adopt_block(const KvCache& donor, int64_t b) {
  if (layout_.shared() || donor.slot_count() != slot_count() || !(donor.block_ == block_) || donor.window_ != window_ ||
      b < 0 || b >= std::min(n_blocks_, donor.n_blocks_))
    throw std::logic_error("adopt_block: the donor does not match this cache");
  if (length_ != b * block_.rows) throw std::logic_error("adopt_block: blocks must be adopted in order");
  for (int64_t s = 0; s < slot_count(); ++s)
    if (donor.refs_[size_t(s * donor.n_blocks_ + b)].id < 0)
      throw std::logic_error("adopt_block: the donor does not hold the block");
  hold_pools_of(donor);
  for (int64_t s = 0; s < slot_count(); ++s) share_block(donor, s, b);
  length_ = (b + 1) * block_.rows;
}

void KvCache::drop_block(int64_t b) {
  for (int64_t s = 0; s < slot_count(); ++s) drop(s, b);
}

bool KvCache::block_shared(int64_t b) const {
  for (int64_t s = 0; s < slot_count(); ++s) {
    const Ref& r = refs_[size_t(s * n_blocks_ + b)];
    if (r.id >= 0 && r.pool->shared(r.id)) return true;
  }
  return false;
}

void KvCache::share_prefix(const KvCache& prefix) {
  if (layout_.shared() || prefix.layout().shared())
    throw std::invalid_argument(
        "kv_loop_slots (recurrence-shared KV) does not support a shared prefix KV (prefix "
        "cache, prefix pool, beam search): the prefix's shared slot groups hold its last "
        "iteration, where a forward of the whole text sees each iteration's own K/V");
  if (length_ != 0 || window_ != prefix.window_ || prefix.length_ > capacity_ ||
      prefix.layout_.count() != layout_.count() || !(prefix.block_ == block_))
    throw std::invalid_argument("share_prefix: the prefix does not match this cache");
  hold_pools_of(prefix);
  const int64_t nb = (prefix.length_ + block_.rows - 1) / block_.rows;
  for (int64_t s = 0; s < layout_.count(); ++s)
    for (int64_t b = prefix.released_; b < nb; ++b) share_block(prefix, s, b);
  length_ = prefix.length_;
  released_ = prefix.released_;
  draw_ = prefix.draw_;
}

void KvCache::write(int64_t slot, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T) {
  if (ops::is_store_h(block_.dtype))
    throw std::invalid_argument(
        "store-h kv_mode (h_fp16, h_int8, h_int4) keeps h, not K/V rows: this feature "
        "(speculative decoding) does not support it yet");
  int64_t last = -1;
  for (int64_t t = 0; t < T; ++t) {
    if (pos[t] < 0 || pos[t] >= capacity_)
      throw std::logic_error("KV write at position " + std::to_string(pos[t]) + " outside the capacity " +
                             std::to_string(capacity_));
    const int64_t b = pos[t] / block_.rows;
    if (b != last) make_writable(slot, b);
    last = b;
  }
  ops::kv_write(view(slot), k_rows, v_rows, pos, T);
}

void KvCache::write_h(int64_t slot, const float* h, const int64_t* pos, int64_t T) {
  if (!ops::is_store_h(block_.dtype)) throw std::logic_error("write_h on a K/V cache");
  for (int64_t t = 0; t < T; ++t) {
    if (pos[t] < 0 || pos[t] >= capacity_)
      throw std::logic_error("KV write at position " + std::to_string(pos[t]) + " outside the capacity");
    const int64_t b = pos[t] / block_.rows, row = pos[t] % block_.rows;
    make_writable(slot, b);
    const ops::KvBlock& blk = table_[size_t(slot * n_blocks_ + b)];
    ops::h_row_store(block_.dtype, h + t * block_.dim, block_.dim,
                     static_cast<uint8_t*>(blk.k) + row * block_.row_bytes,
                     blk.k_scale ? blk.k_scale + row * block_.row_scales : nullptr);
  }
}

void KvCache::read_h(int64_t slot, int64_t p, float* out) const {
  const int64_t b = p / block_.rows, row = p % block_.rows;
  const ops::KvBlock& blk = table_.at(size_t(slot * n_blocks_ + b));
  if (!blk.k) throw std::logic_error("read_h of a position the cache does not hold");
  ops::h_row_load(block_.dtype, static_cast<const uint8_t*>(blk.k) + row * block_.row_bytes,
                  blk.k_scale ? blk.k_scale + row * block_.row_scales : nullptr, block_.dim, out);
}

ops::KvView KvCache::view(int64_t slot) const {
  ops::KvView v;
  v.dtype = block_.dtype;
  v.capacity = n_blocks_ * block_.rows;
  v.n_kv_heads = block_.n_kv_heads;
  v.head_dim = block_.head_dim;
  v.block_rows = block_.rows;
  v.blocks = table_.data() + slot * n_blocks_;
  v.head_major = true;  // kv_pool.h: each kv head's rows of a block are one stream
  v.head_rows = block_.head_rows();  // block_rows, or an extent's rows
  return v;
}

}  // namespace tinyloop::model
