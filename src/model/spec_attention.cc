#include "model/spec_attention.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tinyloop::model {

SpecAttention::SpecAttention(const ModelConfig& c, const KvCache& kv, int64_t branches, int64_t depth)
    : post0_(kv.layout().post(0)),
      n_post_(kv.layout().n_post),
      extra0_(kv.layout().count()),
      slots_(kv.slot_count()),
      branches_(branches),
      depth_(depth),
      nodes_(branches * depth),
      row_(c.n_kv_heads * c.head_dim) {
  if (branches < 0 || depth < 0) throw std::invalid_argument("tree size must be >= 0");
  k_.assign(static_cast<size_t>(slots_ * nodes_ * row_), 0.0f);
  v_.assign(k_.size(), 0.0f);
  stored_.assign(static_cast<size_t>(slots_ * nodes_), 0);
  path_pos_.resize(static_cast<size_t>(depth_));
}

int64_t SpecAttention::bytes() const {
  return static_cast<int64_t>((k_.size() + v_.size()) * sizeof(float) + stored_.size());
}

int64_t SpecAttention::route(int64_t slot) const {
  if (!draft_readout_ || slot < post0_ || slot >= post0_ + n_post_) return slot;
  if (extra0_ + n_post_ > slots_) throw std::logic_error("draft readout needs n_post_blocks extra KV slots");
  return extra0_ + (slot - post0_);
}

void SpecAttention::begin_tree(int64_t base) {
  base_ = base;
  for (int64_t d = 0; d < depth_; ++d) path_pos_[d] = base + 1 + d;
  std::fill(stored_.begin(), stored_.end(), 0);
}

void SpecAttention::set_rows(int64_t n_linear, std::vector<int64_t> nodes) {
  for (int64_t n : nodes)
    if (n < 0 || n >= nodes_)
      throw std::logic_error("tree node " + std::to_string(n) + " outside the tree of " + std::to_string(nodes_) +
                             " nodes");
  n_linear_ = n_linear;
  row_nodes_ = std::move(nodes);
  if (n_linear_ < 0 && !row_nodes_.empty()) throw std::logic_error("tree rows need a linear count");
}

void SpecAttention::attend(const ModelConfig& c, int64_t slot, const float* q, const float* k, const float* v,
                           const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo, float* out) {
  const int64_t s = route(slot);
  const int64_t n_nodes = static_cast<int64_t>(row_nodes_.size());
  const int64_t n_linear = n_linear_ < 0 ? T : n_linear_;
  if (n_linear + n_nodes != T)
    throw std::logic_error("SpecAttention: " + std::to_string(T) + " rows, but " + std::to_string(n_linear) +
                           " linear + " + std::to_string(n_nodes) + " tree rows were set");
  // Linear rows first: in every call they come before the nodes (the root precedes them).
  if (n_linear > 0) attend_causal(c, s, q, k, v, pos, n_linear, kv, k_lo, out);
  if (n_nodes == 0) return;

  // Keep the node rows (float: the cache rounds them on commit exactly as on this write).
  for (int64_t i = 0; i < n_nodes; ++i) {
    const int64_t t = n_linear + i, node = row_nodes_[i];
    if (pos[t] != base_ + node % depth_ + 1)
      throw std::logic_error("tree node at position " + std::to_string(pos[t]) + " does not match its depth");
    std::memcpy(k_row(s, node), k + t * row_, sizeof(float) * row_);
    std::memcpy(v_row(s, node), v + t * row_, sizeof(float) * row_);
    stored_[s * nodes_ + node] = 1;
  }
  // One branch at a time: its path goes into the cache rows after the root, then its rows
  // attend causally over root, past and path, exactly as a sequential decode of the path.
  const int64_t qw = c.n_heads * c.head_dim;
  for (int64_t i = 0; i < n_nodes;) {
    const int64_t b = row_nodes_[i] / depth_;
    int64_t j = i + 1;
    while (j < n_nodes && row_nodes_[j] / depth_ == b) ++j;
    int64_t dmax = 0;  // deepest node of the branch in this call
    for (int64_t r = i; r < j; ++r) dmax = std::max(dmax, row_nodes_[r] % depth_ + 1);
    for (int64_t d = 0; d < dmax; ++d)
      if (!stored_[s * nodes_ + b * depth_ + d])
        throw std::logic_error("tree node attends an ancestor that was never computed");
    kv.write(s, k_row(s, b * depth_), v_row(s, b * depth_), path_pos_.data(), dmax);
    const int64_t t0 = n_linear + i, n = j - i;
    for (int64_t t = t0; t < t0 + n; ++t) k_lo[t] = kv.first_visible(pos[t]);
    ops::attention(q + t0 * qw, n, c.n_heads, kv.view(s), pos + t0, k_lo + t0, out + t0 * qw);
    i = j;
  }
}

void SpecAttention::commit(KvCache& kv, int64_t branch, int64_t m) const {
  if (branch < 0 || branch >= branches_ || m < 0 || m > depth_) throw std::logic_error("commit outside the tree");
  for (int64_t s = 0; s < slots_; ++s) {
    int64_t n = 0;  // stored prefix of the path in this slot
    while (n < m && stored_[s * nodes_ + branch * depth_ + n]) ++n;
    if (n == 0) continue;
    const int64_t first = (s * nodes_ + branch * depth_) * row_;
    kv.write(s, k_.data() + first, v_.data() + first, path_pos_.data(), n);
  }
}

}  // namespace tinyloop::model
