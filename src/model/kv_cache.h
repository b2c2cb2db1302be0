// KV storage of one sequence: one slot per layer application (docs/kv-cache.md).
// Slot order: pre layers, then (iteration i, loop layer j) for i < loops, then post layers.
// Each slot is a table of paged blocks (model/kv_pool.h) holding K and V rows
// [n_kv_heads, head_dim] (or store-h h rows) per position.
#pragma once
#include <cstdint>
#include <memory>

#include "model/kv_pool.h"
#include "model/memory_tracker.h"
#include "ops/ops.h"
#include "tinyloop/config.h"

namespace tinyloop::model {

// One application of a layer: pre layer `index`, loop layer `index` at `iteration`, or
// post layer `index`. Sequences of one batched forward run at different depths, so the
// model names the application and each sequence's SlotLayout maps it to a slot.
struct LayerApp {
  enum class Kind { Pre, Loop, Post };
  Kind kind = Kind::Pre;
  int64_t iteration = 0, index = 0;
  static LayerApp pre(int64_t i) { return {Kind::Pre, 0, i}; }
  static LayerApp loop(int64_t iteration, int64_t j) { return {Kind::Loop, iteration, j}; }
  static LayerApp post(int64_t k) { return {Kind::Post, 0, k}; }
};

// Where each layer application's KV lives for a forward at `loops` iterations.
// groups: loop-iteration slot groups (the recurrence-shared mode, docs/kv-cache.md).
// Iteration i uses group i mod groups, so with groups < loops several iterations share one
// group's rows and the cache stops growing with loops: an iteration writes its K/V into its
// group, then attends to it, so the tokens of the same forward see each other at this very
// iteration while earlier tokens are seen at the last iteration that wrote that group
// (groups = 1: Ouro's last-step KV while decoding; groups = k: Huginn's compress-s(k)).
// groups = loops (the default, also for loop_slots = 0 or >= loops) is one slot per
// iteration, the exact mode.
struct SlotLayout {
  int64_t n_pre = 0, n_loop = 0, n_post = 0, loops = 0, groups = 0;
  SlotLayout() = default;
  SlotLayout(const ModelConfig& c, int64_t loops_, int64_t loop_slots = 0)
      : n_pre(c.n_pre_blocks),
        n_loop(c.n_loop_layers),
        n_post(c.n_post_blocks),
        loops(loops_),
        groups(loop_slots <= 0 || loop_slots >= loops_ ? loops_ : loop_slots) {}
  int64_t pre(int64_t i) const { return i; }
  // In the exact layout iteration is used as is (loop(loops, 0) is one past the last loop
  // slot, which callers use as an end marker); only a shared layout wraps.
  int64_t loop(int64_t iteration, int64_t j) const {
    return n_pre + (groups < loops ? iteration % groups : iteration) * n_loop + j;
  }
  int64_t post(int64_t k) const { return n_pre + groups * n_loop + k; }
  int64_t count() const { return n_pre + groups * n_loop + n_post; }
  int64_t of(const LayerApp& a) const {
    return a.kind == LayerApp::Kind::Pre    ? pre(a.index)
           : a.kind == LayerApp::Kind::Loop ? loop(a.iteration, a.index)
                                            : post(a.index);
  }
  // True when several iterations share a slot group (not the exact per-iteration mode).
  bool shared() const { return groups < loops; }
};

// The KV of one sequence: a block table per slot into a KvPool (model/kv_pool.h). Position p
// of a slot lives in row p % block_rows of the slot's block p / block_rows; blocks are
// allocated when first written, shared with other caches by reference (a common prefix, a
// beam's parent, a clone) and copied before a write when shared (copy-on-write). With a
// window, blocks no query can see any more are released as the sequence advances, so a
// windowed cache holds about window + kWindowSlack positions per slot.
// The random initial state this sequence's loop starts from (config init_state = "random",
// model/init_state.h): the generator's seed and a multiplier of init_state_std (0 gives
// zeros, Huginn's init_scale). It belongs to the sequence, not the model, because the state
// of position p must be the same whenever p is (re)computed, and a batch may mix sequences
// drawn with different seeds. A fresh cache takes the config's init_state_seed and scale 1.
struct StateDraw {
  uint64_t seed = 0;
  double scale = 1.0;
  bool operator==(const StateDraw& o) const { return seed == o.seed && scale == o.scale; }
};

class KvCache {
 public:
  // Positions a windowed cache keeps beyond its window (speculative rollback truncates into
  // them), and the prefill chunk that bounds a windowed forward's memory.
  static constexpr int64_t kWindowSlack = 64;

  // capacity: positions this sequence may reach (0 .. capacity - 1).
  // window: 0 = every earlier position is visible; W > 0 = a query at p sees p-W+1 .. p.
  // extra_slots: slots beyond layout().count(), numbered count() .. count() + extra - 1, that
  // no forward writes by itself (self-speculation keeps its draft's post-block K/V there).
  // loop_slots: the recurrence-shared mode's group count (SlotLayout; 0 = one slot group
  // per iteration).
  // pool: where blocks come from (the serving engine's pool); null = a private pool that
  // grows on demand, its first arena sized for positions first_pos .. capacity - 1 (earlier
  // ones are expected to be shared from a prefix, share_prefix).
  // block_rows: positions per block (the pool's, when given); 0 = kDefaultBlockRows, or the
  // capacity when that is smaller (a short private cache wastes no rows). Caches that share
  // blocks must use the same size.
  KvCache(const ModelConfig& c, int64_t loops, int64_t capacity, int64_t window, ops::KvDType dtype,
          MemoryTracker* tracker, int64_t extra_slots = 0, int64_t loop_slots = 0, KvPoolPtr pool = nullptr,
          int64_t first_pos = 0, int64_t block_rows = 0);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const SlotLayout& layout() const { return layout_; }
  int64_t loops() const { return layout_.loops; }
  // Every slot, extra ones included.
  int64_t slot_count() const { return layout_.count() + extra_slots_; }
  int64_t capacity() const { return capacity_; }
  int64_t window() const { return window_; }
  ops::KvDType dtype() const { return block_.dtype; }
  int64_t block_rows() const { return block_.rows; }
  int64_t block_count() const { return n_blocks_; }  // table entries per slot
  const KvBlockLayout& block_layout() const { return block_; }
  const KvPoolPtr& pool() const { return pool_; }
  // The sequence's initial-state draw; set before its first forward. Copies and shared
  // prefixes (clone, assign_from, share_prefix) take the source's draw with its positions.
  const StateDraw& state_draw() const { return draw_; }
  void set_state_draw(const StateDraw& d) { draw_ = d; }
  // Positions written so far; the next token goes to this absolute position.
  int64_t length() const { return length_; }
  // Marks n more positions written; with a window, releases blocks no later query can see.
  void advance(int64_t n);
  // Forget positions >= new_length (speculative rollback). Rows are not cleared: the next
  // forward overwrites them. Throws std::logic_error below what a window already released.
  void truncate(int64_t new_length);
  // Copy position p's K/V row (and its I8 scales) from slot src to slot dst (the early-exit
  // "latest" rule: a token that stops at iteration e reuses iteration e's rows for the
  // skipped ones). src == dst (iterations sharing a slot group) is a no-op.
  void copy_row(int64_t src_slot, int64_t dst_slot, int64_t p);
  // Write k_rows/v_rows [T, n_kv_heads, head_dim] for absolute positions pos[T] (< capacity)
  // into a slot in this cache's dtype (blocks allocated or copied as needed).
  void write(int64_t slot, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T);

  // Paging. New blocks (fresh or copies of shared ones) that writing positions
  // length() .. end - 1 in every slot needs.
  int64_t blocks_needed(int64_t end) const;
  // Makes those blocks present and writable now, so a forward up to `end` allocates nothing
  // (throws KvPoolExhausted, keeping what it got, when the pool runs out).
  void reserve(int64_t end);
  // A private pool (a standalone cache's) grows now, in one arena, by what a forward up to
  // `end` will allocate, so a prompt's blocks come in one piece on huge pages rather than in
  // many small growths; the blocks themselves are still taken as the forward writes. A
  // no-op for a shared pool (the serving engine's is sized at start).
  void grow_pool_for(int64_t end);
  // Blocks this cache references (shared ones included).
  int64_t blocks_held() const;
  // Drops every block and forgets every position (preemption: the sequence is recomputed).
  void release_all();

  // Blocks per slot a windowed cache holds at most at once (its private pool's size).
  static int64_t window_blocks(int64_t window, int64_t rows);
  // A cache holding the same positions, sharing every block (copy-on-write). Its new blocks
  // come from `pool` (null: a private pool of its own); capacity: positions it may reach
  // (0 = this cache's; never less).
  std::unique_ptr<KvCache> clone(KvPoolPtr pool = nullptr, int64_t capacity = 0) const;
  // Bytes this cache keeps allocated: its private pool's arenas (what the model's memory
  // report counts for it), or, in a pool it was given, the blocks it holds.
  int64_t bytes() const;

  // Shares the blocks of prefix's positions 0 .. prefix.length() - 1 (the prefix cache, the
  // prefix pool, beam search's prompt): must be called while length() == 0 and sets
  // length() to the prefix's. The prefix must have this cache's slot layout, block layout
  // and window; it may be used and destroyed independently afterwards. The recurrence-shared
  // layout is refused (a prefix's shared groups hold its last iteration, where a forward of
  // the whole text sees each iteration's own K/V).
  void share_prefix(const KvCache& prefix);
  // Automatic prefix caching (runtime/prefix_index.h): share block b of every slot from
  // `donor`, a cache of the same shape holding the same token prefix. Needs
  // length() == b * block_rows() and sets it to (b + 1) * block_rows().
  void adopt_block(const KvCache& donor, int64_t b);
  // Drops block b of every slot (a donor giving up one cached block).
  void drop_block(int64_t b);
  // True when block b of some slot is also held elsewhere (dropping it frees nothing).
  bool block_shared(int64_t b) const;
  // Beam search: make this cache hold exactly src's positions by sharing src's blocks
  // (dropping its own). Same shape required.
  void assign_from(const KvCache& src);

  ops::KvView view(int64_t slot) const;
  // Store-h (ops::is_store_h(dtype())): write h rows [T, dim] at positions pos[T] / read the
  // h row of position p back as float (out [dim]). The slot holds no K/V; the layer rebuilds
  // them (model/layer.cc).
  void write_h(int64_t slot, const float* h, const int64_t* pos, int64_t T);
  void read_h(int64_t slot, int64_t p, float* out) const;
  int64_t dim() const { return block_.dim; }
  // Bytes one position takes in one slot (K + V, scales included).
  int64_t bytes_per_position_per_slot() const { return block_.bytes_per_position(); }
  int64_t n_kv_heads() const { return block_.n_kv_heads; }
  int64_t head_dim() const { return block_.head_dim; }
  // First key position visible to a query at absolute position p.
  int64_t first_visible(int64_t p) const { return window_ > 0 && p - window_ + 1 > 0 ? p - window_ + 1 : 0; }

 private:
  struct Ref {
    KvPool* pool = nullptr;  // kept alive by pool_ or held_
    int32_t id = -1;  // -1: no block
  };
  // Block b of slot s present and held by this cache alone (allocated or copied).
  void make_writable(int64_t s, int64_t b);
  void drop(int64_t s, int64_t b);
  // Block b of slot s becomes src's (one more reference; whatever was there is dropped).
  void share_block(const KvCache& src, int64_t s, int64_t b);
  // Keeps the pools of src's blocks alive as long as this cache.
  void hold_pools_of(const KvCache& src);
  void hold_pool(const KvPoolPtr& p);
  // Blocks below this index are released (window); positions before first_kept() are gone.
  int64_t first_kept() const { return released_ * block_.rows; }
  SlotLayout layout_;
  int64_t capacity_, window_;
  int64_t extra_slots_ = 0;
  KvBlockLayout block_;
  MemoryTracker* tracker_;
  KvPoolPtr pool_;  // new blocks come from here
  bool private_pool_ = false;  // pool_ was made for this cache alone
  std::vector<KvPoolPtr> held_;  // other pools whose blocks this cache shares
  int64_t n_blocks_ = 0;  // table entries per slot: ceil(capacity / block_rows)
  std::vector<Ref> refs_;  // [slots, n_blocks_]
  std::vector<ops::KvBlock> table_;  // [slots, n_blocks_] the blocks' addresses (null: none)
  StateDraw draw_;
  int64_t length_ = 0;
  int64_t released_ = 0;  // blocks 0 .. released_ - 1 of every slot dropped
};

}  // namespace tinyloop::model
