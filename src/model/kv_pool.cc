#include "model/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <system_error>

#include "ops/kv_quant.h"
#include "tinyloop/checked.h"

namespace tinyloop::model {
namespace {

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

// The helper's arenas are at least this big (a few blocks' fault-in is not worth a thread).
constexpr int64_t kAheadMinBytes = int64_t(4) << 20;

// Bytes of an arena of n blocks, refusing sizes no machine has.
int64_t arena_size(int64_t n, int64_t block_bytes, int64_t have) {
  if (n > (int64_t(1) << 40) / block_bytes)
    throw std::runtime_error("out of memory: KV pool of " + std::to_string(n) + " blocks");
  if (checked_add(have, n, "KV pool block count") > INT32_MAX)
    throw std::runtime_error("out of memory: KV pool of more than 2^31 blocks");
  return checked_mul(n, block_bytes, "KV pool arena bytes");
}

}  // namespace

KvBlockLayout::KvBlockLayout(const ModelConfig& c, ops::KvDType dt, int64_t rows_, int64_t extent_)
    : dtype(dt), rows(rows_), n_kv_heads(c.n_kv_heads), head_dim(c.head_dim), dim(c.dim), extent(extent_) {
  if (rows < 1) throw std::invalid_argument("kv_block_size must be >= 1, got " + std::to_string(rows));
  if (extent < 1 || extent > 4096)
    throw std::invalid_argument("KV blocks per extent must be in [1, 4096], got " + std::to_string(extent));
  if (ops::is_store_h(dtype)) {
    extent = 1;  // h rows are position-major: nothing to join
    areas = 1;
    row_bytes = ops::h_row_bytes(dtype, dim);
    row_scales = ops::h_row_scales(dtype, dim);
  } else {
    const int64_t elem = dtype == ops::KvDType::F32 ? 4 : dtype == ops::KvDType::F16 ? 2 : 1;
    areas = 2;
    row_bytes =
        checked_mul<std::invalid_argument>(checked_mul(n_kv_heads, head_dim, "KV row width"), elem, "KV row bytes");
    row_scales = dtype == ops::KvDType::I8 ? n_kv_heads : 0;
  }
  // Block sizes stay far below 2^62: rows and row_bytes are bounded by what a model file
  // and the engine options allow, checked here once so no product below can wrap.
  if (rows > (int64_t(1) << 24) || row_bytes > (int64_t(1) << 32))
    throw std::invalid_argument("KV block too large: " + std::to_string(rows) + " rows of " +
                                std::to_string(row_bytes) + " bytes");
  const int64_t values = align64(rows * row_bytes);
  const int64_t scales = align64(rows * row_scales * int64_t(sizeof(float)));
  v_off = values;
  ks_off = areas * values;
  vs_off = ks_off + scales;
  bytes = ks_off + areas * scales;
  checked_mul<std::invalid_argument>(bytes, extent, "KV extent bytes");
}

int64_t KvBlockLayout::bytes_per_position() const { return areas * (row_bytes + row_scales * int64_t(sizeof(float))); }

ops::KvBlock KvBlockLayout::at(uint8_t* base, int64_t i) const {
  // Each part of an extent is `extent` times the block's; block i starts i * rows rows into
  // every head's run of it (the header's layout; E = 1, and every store-h block: i = 0).
  const int64_t values = areas == 2 ? i * rows * (row_bytes / n_kv_heads) : 0;
  const int64_t scales = i * rows * int64_t(sizeof(float));
  ops::KvBlock b;
  b.k = base + values;
  if (areas == 2) b.v = base + extent * v_off + values;
  if (row_scales > 0) {
    b.k_scale = reinterpret_cast<float*>(base + extent * ks_off + scales);
    if (areas == 2) b.v_scale = reinterpret_cast<float*>(base + extent * vs_off + scales);
  }
  return b;
}

void KvBlockLayout::copy(const ops::KvBlock& dst, const ops::KvBlock& src) const {
  if (areas == 1) {  // store-h: h rows, then their scales, each one run
    std::memcpy(dst.k, src.k, size_t(rows * row_bytes));
    if (row_scales > 0) std::memcpy(dst.k_scale, src.k_scale, size_t(rows * row_scales) * sizeof(float));
    return;
  }
  // K / V: each kv head's rows are one run of the block, head_rows() rows from the next
  // head's (values), scales likewise.
  const int64_t hb = row_bytes / n_kv_heads, run = rows * hb, step = head_rows() * hb;
  const bool scaled = row_scales > 0;
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    std::memcpy(static_cast<uint8_t*>(dst.k) + g * step, static_cast<const uint8_t*>(src.k) + g * step, size_t(run));
    std::memcpy(static_cast<uint8_t*>(dst.v) + g * step, static_cast<const uint8_t*>(src.v) + g * step, size_t(run));
    if (scaled) {
      std::memcpy(dst.k_scale + g * head_rows(), src.k_scale + g * head_rows(), size_t(rows) * sizeof(float));
      std::memcpy(dst.v_scale + g * head_rows(), src.v_scale + g * head_rows(), size_t(rows) * sizeof(float));
    }
  }
}

KvPool::KvPool(const KvBlockLayout& layout, int64_t max_blocks, int64_t initial_blocks, MemoryTracker* tracker)
    : layout_(layout), max_blocks_(max_blocks), tracker_(tracker) {
  if (max_blocks < 0 || initial_blocks < 0) throw std::invalid_argument("KV pool block counts must be >= 0");
  if (max_blocks > INT32_MAX) throw std::invalid_argument("KV pool of more than 2^31 blocks");
  const int64_t E = layout_.extent;
  if (max_blocks > 0) max_blocks_ = std::max(E, max_blocks / E * E);  // whole extents
  if (max_blocks_ > 0 && initial_blocks > max_blocks_) initial_blocks = max_blocks_;
  std::lock_guard<std::mutex> lock(mu_);
  if (initial_blocks > 0) grow(initial_blocks);
}

int64_t KvPool::whole_extents(int64_t n) const { return (n + layout_.extent - 1) / layout_.extent * layout_.extent; }

void KvPool::grow(int64_t n) {
  n = whole_extents(n);
  const int64_t bytes = arena_size(n, layout_.bytes, int64_t(base_.size()));
  HugeBytes arena;
  try {
    arena = alloc_huge_pages(static_cast<size_t>(bytes));
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of memory: KV pool arena of " + std::to_string(bytes) + " bytes");
  }
  attach(std::move(arena), n);
}

void KvPool::attach(HugeBytes arena, int64_t n) {
  // n is whole extents (grow, maybe_grow_ahead), and so is every arena before: block ids of
  // an extent are id / E * E .. + E - 1, the extent's first byte base_[id].
  const int32_t first = static_cast<int32_t>(base_.size());
  const int64_t E = layout_.extent;
  for (int64_t i = 0; i < n; ++i) {
    base_.push_back(arena.get() + i / E * E * layout_.bytes);
    refs_.push_back(0);
    listed_.push_back(1);
  }
  // Lowest ids on top of the stacks: a fresh pool hands out blocks in address order.
  for (int64_t i = n - 1; i >= 0; --i) free_.push_back(first + static_cast<int32_t>(i));
  const int32_t first_ext = static_cast<int32_t>(ext_free_.size());
  for (int64_t e = 0; e < n / E; ++e) {
    ext_free_.push_back(static_cast<int32_t>(E));
    ext_listed_.push_back(E > 1);
  }
  if (E > 1)  // single blocks never take the extent pick
    for (int64_t e = n / E - 1; e >= 0; --e) free_ext_.push_back(first_ext + static_cast<int32_t>(e));
  arenas_.push_back(std::move(arena));
  tracked_.emplace_back(tracker_, n * layout_.bytes);
}

void KvPool::take_pending() {
  const int64_t n = pending_n_;
  HugeBytes arena;
  try {
    arena = pending_.get();  // rethrows the helper's exception, if any
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of memory: KV pool arena of " + std::to_string(n * layout_.bytes) + " bytes");
  }
  attach(std::move(arena), n);
}

void KvPool::maybe_grow_ahead() {
  if (ahead_limit_ <= 0 || pending_.valid()) return;
  const int64_t have = static_cast<int64_t>(base_.size());
  // Not before the first forward has sized the pool (its reserve_free), nor past the limit.
  if (have == 0 || have >= ahead_limit_ || (have - used_) * 4 > have) return;
  const int64_t min_blocks = (kAheadMinBytes + layout_.bytes - 1) / layout_.bytes;
  const int64_t n = whole_extents(std::min(std::max({int64_t(16), min_blocks, have / 2}), ahead_limit_ - have));
  int64_t bytes;
  try {
    bytes = arena_size(n, layout_.bytes, have);
  } catch (const std::exception&) {
    return;  // allocate() grows (and reports) itself when it gets there
  }
  try {
    pending_ = std::async(std::launch::async, [bytes] { return alloc_huge_pages(static_cast<size_t>(bytes)); });
    pending_n_ = n;
  } catch (const std::system_error&) {
    // No thread to be had: allocate() grows on the caller's thread, as without the helper.
  }
}

void KvPool::grow_ahead_to(int64_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_blocks_ > 0) throw std::logic_error("KvPool::grow_ahead_to: the pool has a budget");
  ahead_limit_ = std::max<int64_t>(0, limit);
  maybe_grow_ahead();
}

void KvPool::reserve_free(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_blocks_ > 0) throw std::logic_error("KvPool::reserve_free: the pool has a budget");
  int64_t missing = n - (static_cast<int64_t>(base_.size()) - used_);
  if (missing <= 0) return;
  if (pending_.valid()) {
    take_pending();
    missing = n - (static_cast<int64_t>(base_.size()) - used_);
  }
  if (missing > 0) grow(missing);
  maybe_grow_ahead();
}

int32_t KvPool::allocate(int32_t after) {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ == int64_t(base_.size()) && pending_.valid()) take_pending();
  if (used_ == int64_t(base_.size())) {
    const int64_t have = static_cast<int64_t>(base_.size());
    if (max_blocks_ > 0 && have >= max_blocks_)
      throw KvPoolExhausted("KV pool exhausted: all " + std::to_string(max_blocks_) + " blocks (" +
                            std::to_string(max_blocks_ * layout_.bytes >> 20) +
                            " MiB) are in use; raise kv_budget_mb or lower the load");
    // Grow by half of what is there (at least 16 blocks), within the budget, and for a pool
    // grown ahead not past its limit while below it (a small sequence's pool stays its size).
    int64_t n = std::max<int64_t>(16, have / 2);
    if (max_blocks_ > 0) n = std::min(n, max_blocks_ - have);
    if (ahead_limit_ > have) n = std::min(n, ahead_limit_ - have);
    grow(n);
  }
  const int32_t id = pick(after);
  take(id);
  maybe_grow_ahead();
  return id;
}

int32_t KvPool::pick(int32_t after) {
  const int64_t E = layout_.extent;
  if (E > 1) {
    // The block after `after` in its extent, if free.
    if (after >= 0 && after + 1 < int64_t(refs_.size()) && (after + 1) % E != 0 && refs_[size_t(after) + 1] == 0)
      return after + 1;
    // The first block of a wholly free extent. A listed extent is wholly free: none of its
    // blocks can be `after`'s neighbour, and the stack below is used only when none is
    // listed; checked all the same.
    while (!free_ext_.empty()) {
      const int32_t e = free_ext_.back();
      free_ext_.pop_back();
      ext_listed_[size_t(e)] = 0;
      if (ext_free_[size_t(e)] == E) return static_cast<int32_t>(e * E);
    }
  }
  // The most recently freed block (ids taken above since they were listed are dropped).
  for (;;) {
    const int32_t id = free_.back();  // used_ < blocks, so a free block is listed
    free_.pop_back();
    listed_[size_t(id)] = 0;
    if (refs_[size_t(id)] == 0) return id;
  }
}

void KvPool::take(int32_t id) {
  refs_[size_t(id)] = 1;
  ++used_;
  --ext_free_[size_t(id / layout_.extent)];
}

bool KvPool::can_allocate(int64_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_blocks_ == 0) return true;
  return max_blocks_ - used_ >= n;
}

void KvPool::retain(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (refs_.at(size_t(id)) <= 0) throw std::logic_error("retain of a free KV block");
  ++refs_[size_t(id)];
}

void KvPool::release(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t& r = refs_.at(size_t(id));
  if (r <= 0) throw std::logic_error("release of a free KV block");
  if (--r == 0) {
    --used_;
    if (!listed_[size_t(id)]) {
      free_.push_back(id);
      listed_[size_t(id)] = 1;
    }
    const int64_t e = id / layout_.extent;
    if (++ext_free_[size_t(e)] == layout_.extent && layout_.extent > 1 && !ext_listed_[size_t(e)]) {
      free_ext_.push_back(static_cast<int32_t>(e));
      ext_listed_[size_t(e)] = 1;
    }
  }
}

bool KvPool::shared(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return refs_.at(size_t(id)) > 1;
}

ops::KvBlock KvPool::block(int32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return layout_.at(base_.at(size_t(id)), id % layout_.extent);
}

int64_t KvPool::used_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t KvPool::free_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_blocks_ > 0) return max_blocks_ - used_;
  return static_cast<int64_t>(base_.size()) - used_;
}

int64_t KvPool::arena_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(base_.size()) * layout_.bytes;
}

}  // namespace tinyloop::model
