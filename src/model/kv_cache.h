// KV storage of one sequence: one slot per layer application (DESIGN.md section 2).
// Slot order: pre layers, then (iteration i, loop layer j) for i < loops, then post layers.
// Each slot holds `capacity` rows of K and of V, [n_kv_heads, head_dim] each; the row of
// absolute position p is p % capacity, so a capacity below the sequence length is a ring
// buffer (cache_window).
#pragma once
#include <cstdint>
#include <memory>

#include "model/huge_pages.h"
#include "model/memory_tracker.h"
#include "ops/ops.h"
#include "tinyloop/config.h"

namespace tinyloop::model {

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
  // True when several iterations share a slot group (not the exact per-iteration mode).
  bool shared() const { return groups < loops; }
};

class KvCache {
 public:
  // window: 0 = every earlier position is visible; W > 0 = a query at p sees p-W+1 .. p.
  // capacity: rows per slot; a sequence longer than capacity wraps (needs window > 0).
  // extra_slots: slots beyond layout().count(), numbered count() .. count() + extra - 1, that
  // no forward writes by itself (self-speculation keeps its draft's post-block K/V there).
  // loop_slots: the recurrence-shared mode's group count (SlotLayout; 0 = one slot group
  // per iteration).
  KvCache(const ModelConfig& c, int64_t loops, int64_t capacity, int64_t window,
          ops::KvDType dtype, MemoryTracker* tracker, int64_t extra_slots = 0,
          int64_t loop_slots = 0);

  const SlotLayout& layout() const { return layout_; }
  int64_t loops() const { return layout_.loops; }
  // Every slot, extra ones included.
  int64_t slot_count() const { return layout_.count() + extra_slots_; }
  int64_t capacity() const { return capacity_; }
  int64_t window() const { return window_; }
  ops::KvDType dtype() const { return dtype_; }
  // Positions written so far; the next token goes to this absolute position.
  int64_t length() const { return length_; }
  void advance(int64_t n) { length_ += n; }
  // Forget positions >= new_length (speculative rollback). Rows are not cleared: the next
  // forward overwrites them. Only valid while those rows have not wrapped away.
  void truncate(int64_t new_length);
  // Copy position p's K/V row (and its I8 scales) from slot src to slot dst (the early-exit
  // "latest" rule: a token that stops at iteration e reuses iteration e's rows for the
  // skipped ones). src == dst (iterations sharing a slot group) is a no-op.
  void copy_row(int64_t src_slot, int64_t dst_slot, int64_t p);
  // Write k_rows/v_rows [T, n_kv_heads, head_dim] for absolute positions pos[T] into a slot
  // in this cache's dtype (ops::kv_write with the slot's scales when I8).
  void write(int64_t slot, const float* k_rows, const float* v_rows, const int64_t* pos,
             int64_t T);
  // A deep copy (a cache that serves several continuations, e.g. warm-start resume).
  std::unique_ptr<KvCache> clone() const;
  int64_t bytes() const { return bytes_; }

  // Two-segment KV (prefix cache, runtime/prefix_cache.h): positions < prefix->length() are
  // read from `prefix`, which is shared and never written through this cache; this cache
  // holds only the later positions (rows p % capacity). Must be set while length() == 0 and
  // sets length() to the prefix's. The prefix must have this cache's layout, dtype and
  // window, hold every one of its positions (no ring wrap), and outlive this cache. null (the default) = one segment, as everywhere else.
  void set_shared_prefix(const KvCache* prefix);
  const KvCache* shared_prefix() const { return shared_prefix_; }
  // Beam search (runtime/beam_search.h): make this tail a copy of `src`, another tail of the
  // same shape over the same shared prefix, by copying only src's own rows (positions
  // shared_prefix()->length() .. src.length() - 1) in every slot, and taking its length.
  // Cheaper than clone(): no allocation, and the bytes copied grow with the generated
  // tokens, not with the prompt.
  void assign_tail_from(const KvCache& src);

  ops::KvView view(int64_t slot) const;
  void* k_data(int64_t slot);
  void* v_data(int64_t slot);
  // I8: [capacity, n_kv_heads] float scales of a slot's K / V. H8 / H4: k_scale_data is
  // [capacity, scales per h row]. nullptr otherwise.
  float* k_scale_data(int64_t slot);
  float* v_scale_data(int64_t slot);
  // Store-h (ops::is_store_h(dtype())): write h rows [T, dim] at positions pos[T] / read the
  // h row of position p back as float (out [dim]). The slot holds no K/V; the layer rebuilds
  // them (model/layer.cc).
  void write_h(int64_t slot, const float* h, const int64_t* pos, int64_t T);
  void read_h(int64_t slot, int64_t p, float* out) const;
  int64_t dim() const { return dim_; }
  // Bytes one position takes in one slot (K + V, scales included).
  int64_t bytes_per_position_per_slot() const;
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  // First key position visible to a query at absolute position p.
  int64_t first_visible(int64_t p) const { return window_ > 0 && p - window_ + 1 > 0 ? p - window_ + 1 : 0; }

 private:
  KvCache(const KvCache& other, MemoryTracker* tracker);  // deep copy, see clone()
  SlotLayout layout_;
  int64_t capacity_, window_, n_kv_heads_, head_dim_, dim_;
  int64_t extra_slots_ = 0;
  ops::KvDType dtype_;
  int64_t row_bytes_;    // one position's K (or V, or store-h h) in one slot, values only
  int64_t areas_ = 2;    // 2: K and V; 1: store-h (h only)
  int64_t row_scales_ = 0;  // float scales per row per area (I8: n_kv_heads; H8: 1; H4: groups)
  int64_t scale_off_;    // offset of a slot's K scales from its start (I8; else unused)
  int64_t slot_bytes_;   // K and V of one slot (+ I8 scales), a multiple of 16
  int64_t bytes_;
  int64_t length_ = 0;
  // [slots][K | V | (I8: K scales | V scales)]: K, V [capacity][n_kv_heads * head_dim],
  // scales [capacity][n_kv_heads] float.
  HugeBytes data_;  // on 2 MiB pages when large (huge_pages.h: long-context decode streams it)
  MemoryTracker* tracker_;
  TrackedBytes tracked_;
  const KvCache* shared_prefix_ = nullptr;  // not owned; see set_shared_prefix
};

}  // namespace tinyloop::model
