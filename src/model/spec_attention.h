// Attention routing for self-speculative decoding (docs/speculative.md). Both jobs are an
// AttentionRouter installed in the Workspace, so the looped forward itself
// (LoopedModel::prelude / iteration / readout) runs unchanged for draft, verify and tree.
//
// 1. Draft readout. A draft at d loops and the verifier at L >= d loops compute the same
//    K/V for the pre slots and the slots of iterations 0..d-1 (iteration i of a position
//    depends only on lower depths), so they share them. Only the post blocks differ: with
//    draft_readout on, post slot k is redirected to the cache's extra slot k (the cache is
//    made with extra_slots = n_post_blocks).
//
// 2. Draft tree. A cycle's tree is a root (a linear row at position `base`) and `branches`
//    chains of `depth` nodes; node (b, δ), δ = 1..depth, sits at position base + δ and has
//    id b * depth + δ - 1. Nodes of different branches share positions, so they cannot own
//    cache rows: their K/V rows go to per-cycle scratch (float, [slot, node]). To attend,
//    a branch's rows 1..δmax are written from scratch into the cache rows of base+1..+δmax
//    of the slot (rows past the sequence's length, overwritten by the next branch), and the
//    ordinary ops::attention runs over them. So a node sees exactly what a one-token decode
//    of the same path would see, in the same order, through the same kernel: tree logits
//    are bit-identical to sequential decode whatever the attention kernel's summation
//    order. commit() writes the accepted path's rows into the cache for every slot.
#pragma once
#include <cstdint>
#include <vector>

#include "model/kv_cache.h"
#include "model/layer.h"

namespace tinyloop::model {

class SpecAttention : public AttentionRouter {
 public:
  // Scratch for a tree of `branches` x `depth` nodes over every slot of kv (0, 0: no tree).
  SpecAttention(const ModelConfig& c, const KvCache& kv, int64_t branches, int64_t depth);

  // Post slots -> extra slots (draft readout) or the cache's own post slots (verify).
  void set_draft_readout(bool on) { draft_readout_ = on; }
  // Start a tree whose root is at position `base`; forgets every stored node row.
  void begin_tree(int64_t base);
  // The rows of the next calls: rows 0..n_linear-1 are linear (written at their position,
  // causal attention); row n_linear + i is node nodes[i]. Node rows of one branch must be
  // consecutive and in increasing depth, each branch's shallower nodes already stored.
  void set_rows(int64_t n_linear, std::vector<int64_t> nodes);
  // Every row of the next calls is linear, whatever their number (chains, prefill).
  void set_all_linear() { set_rows(-1, {}); }
  // Write nodes (branch, 1..m) into the cache rows base+1..base+m of every slot where they
  // were stored this tree (a node whose draft readout never ran has no extra-slot rows).
  void commit(KvCache& kv, int64_t branch, int64_t m) const;

  void attend(const ModelConfig& c, int64_t slot, const float* q, const float* k, const float* v, const int64_t* pos,
              int64_t T, KvCache& kv, int64_t* k_lo, float* out) override;

  int64_t bytes() const;

 private:
  int64_t route(int64_t slot) const;
  float* k_row(int64_t slot, int64_t node) { return k_.data() + (slot * nodes_ + node) * row_; }
  float* v_row(int64_t slot, int64_t node) { return v_.data() + (slot * nodes_ + node) * row_; }

  int64_t post0_, n_post_, extra0_;  // first post slot, post slot count, first extra slot
  int64_t slots_, branches_, depth_, nodes_, row_;
  int64_t base_ = 0;
  bool draft_readout_ = false;
  int64_t n_linear_ = -1;  // -1: every row of a call is linear
  std::vector<int64_t> row_nodes_;  // [rows after the linear ones] node id per row
  std::vector<float> k_, v_;  // [slots, nodes, KVH hd] node K/V rows (float)
  std::vector<uint8_t> stored_;  // [slots, nodes] 1 once the row was computed this tree
  std::vector<int64_t> path_pos_;  // [depth] base + 1 .. base + depth
};

}  // namespace tinyloop::model
