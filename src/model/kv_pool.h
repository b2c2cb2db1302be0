// Paged KV memory (docs/serving.md "How it works"; vLLM's PagedAttention): fixed-size blocks of
// `rows` positions of one slot (one layer application), handed out by a pool and addressed
// through per-sequence block tables (model/kv_cache.h). Blocks are reference counted, so
// sequences share the blocks of a common prefix, beams share their parents' blocks and a
// clone shares everything; a block is copied only when a sharer writes into it
// (copy-on-write, KvCache::writable).
//
// One pool serves all sequences of the serving engine, sized once from a memory budget; a
// standalone cache (Model.generate and friends) owns a private pool that starts empty,
// grows by each forward's blocks and has its next arena faulted in ahead on a helper thread
// (grow_ahead_to). Either way a block's address never changes while it is held.
#pragma once
#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "base/huge_pages.h"
#include "model/memory_tracker.h"
#include "ops/ops.h"
#include "tinyloop/config.h"

namespace tinyloop::model {

// Positions per block unless a caller picks another size (EngineOptions::kv_block_size).
// A speed / waste trade: the attention kernel walks a window as one run per block, and a
// sequence wastes up to rows - 1 positions per slot in its last block.
inline constexpr int64_t kDefaultBlockRows = 32;

// Positions per block of a standalone sequence's private cache (Model.generate and its
// streaming form, a prefix cache and the calls that share it, a resume handle, speculative
// decoding), chosen from its prompt: kLongBlockRows for a prompt of kLongPromptRows or
// more without a window, else 0 (the cache's default: kDefaultBlockRows, or less for a
// short cache). Why: decode attention reads each kv head's rows of a block as one
// contiguous run, and a core reads scattered runs of 4 KiB (32 F16 rows of head_dim 64) at
// 20-23 GB/s, runs of 64 KiB at 30-32 (EPYC Zen 5, docs/benchmarks.md History "Decode
// attention: what bounds the K/V walk"). tg32 after a 4000-token prompt, benchmark model
// at L = 8, F16, one thread, block sizes alternating (tl.Engine kv_block_size, three
// rounds): 32 rows 60.5-62.6 t/s, 256 59.4-67.9, 480 63.2-71.2, 512 66.8-70.0. The bits do
// not depend on the block size (docs/kv-cache.md "Block layout"). A long prompt fills its
// blocks, so a slot's partly written last block (up to kLongBlockRows - 1 rows) is at most
// a quarter of what the prompt holds; a call that shares a prefix cache's or a resume
// handle's blocks copies at most one partly written block a slot (copy-on-write). Shorter
// prompts, windowed caches (they release blocks as the window slides), the serving pool
// (EngineOptions::kv_block_size) and beam search (every fork copies its partly written
// blocks) keep their own sizes.
inline constexpr int64_t kLongBlockRows = 512, kLongPromptRows = 2048;
inline int64_t private_block_rows(int64_t prompt_len, int64_t window) {
  return prompt_len >= kLongPromptRows && window == 0 ? kLongBlockRows : 0;
}

// Blocks per extent of a serving pool (EngineOptions::kv_block_size rows each): as many as
// make kExtentRows positions, so that a kv head's runs in a sequence's consecutive blocks
// of one slot make runs of up to 64 KiB (F16, head_dim 64) where the pool could place the
// blocks side by side (KvPool::allocate's `after`). Why: decode attention reads each kv
// head's rows of a slot in block-table order, and one core reads scattered 4 KiB runs (32
// F16 rows of head_dim 64) at 20-23 GB/s, 64 KiB runs at 30-32 (EPYC Zen 5,
// docs/benchmarks.md History "Decode attention: what bounds the K/V walk").
inline constexpr int64_t kExtentRows = 512;
inline int64_t serving_extent_blocks(int64_t block_rows) { return std::max<int64_t>(1, kExtentRows / block_rows); }

// The bytes of one block: `rows` positions of one slot in `dtype`.
//   K / V modes: K [n_kv_heads, rows, head_dim] | V [same] | (I8) K scales [n_kv_heads, rows]
//                | V scales [same]  (head-major, ops::KvView::head_major: attention walks one
//                kv head over many positions, so each head's rows are one contiguous stream)
//   store-h:     h [rows, h_row_bytes] | (H8 / H4) scales [rows, h_row_scales]
// Every part starts 64-byte aligned.
// With extent E > 1 (K / V modes), E blocks side by side are laid out as one extent of E
// times the bytes, each part of it E times the block's part, the rows of all E blocks
// head-major: K [n_kv_heads, E * rows, head_dim] | V [same] | (I8) K scales [n_kv_heads,
// E * rows] | V scales [same]. Block i of the extent is rows i * rows .. (i + 1) * rows - 1
// of every head (ops::KvView::head_rows = E * rows), so a head's runs of blocks i and i + 1
// are one stream. E = 1 is the plain block above.
struct KvBlockLayout {
  ops::KvDType dtype = ops::KvDType::F16;
  int64_t rows = 0, n_kv_heads = 0, head_dim = 0, dim = 0;
  int64_t row_bytes = 0;  // one position's K (or V, or h) values
  int64_t areas = 2;  // 2: K and V; 1: store-h (h only)
  int64_t row_scales = 0;  // float scales per row per area (I8: n_kv_heads; H8: 1; H4: groups)
  int64_t v_off = 0, ks_off = 0, vs_off = 0;  // byte offsets of V, K scales, V scales (E = 1)
  int64_t bytes = 0;  // the whole block, a multiple of 64 (an extent: extent * bytes)
  int64_t extent = 1;  // blocks per extent (store-h: 1)

  KvBlockLayout() = default;
  // Throws std::invalid_argument for rows < 1, extent < 1 or a size that overflows.
  KvBlockLayout(const ModelConfig& c, ops::KvDType dtype, int64_t rows, int64_t extent = 1);
  // Bytes one position takes in one slot (values + scales, no padding).
  int64_t bytes_per_position() const;
  // Block i (< extent) of the extent whose first byte is `base`, as attention and kv_write
  // address it.
  ops::KvBlock at(uint8_t* base, int64_t i = 0) const;
  // Rows from one kv head's run to the next head's (ops::KvView::head_rows).
  int64_t head_rows() const { return extent * rows; }
  // Copies block src's rows (values and scales) into block dst, both of this layout.
  void copy(const ops::KvBlock& dst, const ops::KvBlock& src) const;
  bool operator==(const KvBlockLayout& o) const {
    return dtype == o.dtype && rows == o.rows && n_kv_heads == o.n_kv_heads && head_dim == o.head_dim && dim == o.dim &&
           extent == o.extent;
  }
};

// Thrown when a pool with a budget has no free block: the scheduler waits or preempts; a
// caller without a scheduler sees the message.
class KvPoolExhausted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class KvPool {
 public:
  // max_blocks > 0: a budget; allocate() throws KvPoolExhausted past it. 0: no bound, arenas
  // are added on demand. initial_blocks are allocated now (the budget's pool allocates all of
  // them at start, so serving never allocates). Arena bytes are reported to `tracker`. With
  // the layout's extent E > 1 every arena holds whole extents: block counts are rounded up
  // to multiples of E, a budget down (to at least E).
  KvPool(const KvBlockLayout& layout, int64_t max_blocks, int64_t initial_blocks, MemoryTracker* tracker);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvBlockLayout& layout() const { return layout_; }
  // A free block with one reference. Throws KvPoolExhausted when the budget is used up.
  // after: the block this one follows in its slot (-1: none). With extents (E > 1) the pick
  // keeps a slot's blocks side by side: block after + 1 when it is free and in after's
  // extent, else the first block of a wholly free extent (the rest of it left for this
  // slot's next blocks), else any free block (the most recently freed).
  int32_t allocate(int32_t after = -1);
  // True when n more blocks can be allocated now.
  bool can_allocate(int64_t n) const;
  void retain(int32_t id);
  // Drops one reference; the block is free again at zero.
  void release(int32_t id);
  // More than one holder: a writer must copy it first.
  bool shared(int32_t id) const;
  // The block as kv_write addresses it, and its K part's first byte (fixed while it is held).
  ops::KvBlock block(int32_t id) const;
  uint8_t* data(int32_t id) const { return static_cast<uint8_t*>(block(id).k); }

  // Unbounded pools (max_blocks 0, a standalone cache's private pool) only. Grows the pool
  // now, in one arena, until n blocks are free (a prompt's blocks before its forward).
  void reserve_free(int64_t n);
  // Unbounded pools only: from now on, whenever a quarter or less of the blocks are free,
  // the next arena (half of what there is, at least kAheadMinBytes, never past `limit`
  // blocks in all) is allocated and faulted in on a helper thread, so a decode step that
  // opens a new block finds it ready instead of faulting huge pages in itself (header of
  // base/huge_pages.h). allocate() waits for that arena only when it runs out first.
  void grow_ahead_to(int64_t limit);

  int64_t max_blocks() const { return max_blocks_; }
  int64_t used_blocks() const;
  int64_t free_blocks() const;  // allocatable now without growing (budget: max - used)
  int64_t arena_bytes() const;  // bytes allocated from the system so far

 private:
  void grow(int64_t n);  // adds an arena of n blocks to the free list (mu_ held)
  void attach(HugeBytes arena, int64_t n);  // adds an allocated arena of n blocks (mu_ held)
  void take_pending();  // waits for the helper's arena and attaches it (mu_ held)
  void maybe_grow_ahead();  // starts the helper when the pool runs low (mu_ held)
  int64_t whole_extents(int64_t n) const;  // n blocks rounded up to whole extents
  int32_t pick(int32_t after);  // a free block for allocate (one is free; mu_ held)
  void take(int32_t id);  // marks free block id held once (mu_ held)
  KvBlockLayout layout_;
  int64_t max_blocks_;
  MemoryTracker* tracker_;
  mutable std::mutex mu_;
  std::vector<HugeBytes> arenas_;
  std::vector<TrackedBytes> tracked_;
  std::vector<uint8_t*> base_;  // [blocks] first byte of each block's extent (E = 1: the block's)
  std::vector<int32_t> refs_;  // [blocks] holders, 0 = free
  // Ids of free blocks, a stack (recently freed reused first). An id taken by allocate's
  // `after` or extent pick stays listed until it reaches the top (then it is skipped), so
  // that pick is O(1); listed_ keeps each id listed at most once.
  std::vector<int32_t> free_;
  std::vector<uint8_t> listed_;  // [blocks] 1: in free_
  // Free blocks per extent, and (E > 1 only) a stack of wholly free extents for pick
  // (ext_listed_ keeps each listed at most once).
  std::vector<int32_t> ext_free_, free_ext_;
  std::vector<uint8_t> ext_listed_;
  int64_t used_ = 0;
  int64_t ahead_limit_ = 0;  // grow_ahead_to's limit in blocks, 0: off
  std::future<HugeBytes> pending_;  // the helper's arena of pending_n_ blocks, if one is on the way
  int64_t pending_n_ = 0;
};

using KvPoolPtr = std::shared_ptr<KvPool>;

}  // namespace tinyloop::model
