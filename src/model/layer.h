// One transformer layer application (attention + MLP sublayers) over T new rows, writing
// their K/V into each row's sequence cache. Used for pre, loop and post layers alike. The
// rows may come from many sequences (the serving engine's batched forward): every matmul
// runs once over all rows (the weights are read once per step), attention runs per
// sequence against its own cache, and a row's numbers never depend on its batch-mates.
#pragma once
#include <cstdint>
#include <vector>

#include "model/kv_cache.h"
#include "model/weights.h"
#include "tinyloop/config.h"

namespace tinyloop::model {

// Where the K/V rows of one attention sublayer go and which keys its queries see. Without a
// router (Workspace::router == nullptr) every row is written at its position in `slot` and
// attends causally over the cache (attend_causal). Self-speculative decoding installs one
// to send the draft's post-block K/V to slots of their own and to show draft-tree nodes,
// which share positions, only their own ancestors (model/spec_attention.h).
class AttentionRouter {
 public:
  virtual ~AttentionRouter() = default;
  //   q [T, H hd] and k [T, KVH hd] with RoPE applied, v [T, KVH hd], k_lo [T] scratch,
  //   out [T, H hd] the attention output before wo.
  virtual void attend(const ModelConfig& c, int64_t slot, const float* q, const float* k, const float* v,
                      const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo, float* out) = 0;
};

// The default attention step: k/v rows [T, KVH hd] written at pos[t] of `slot`, then causal
// attention of q [T, H hd] over each query's cache window into out [T, H hd].
void attend_causal(const ModelConfig& c, int64_t slot, const float* q, const float* k, const float* v,
                   const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo, float* out);

// The rows of one forward call grouped by sequence: rows [begin, begin + rows) of every
// [T, *] buffer belong to the sequence whose cache is kv, at absolute positions pos[begin ..].
struct RowGroup {
  KvCache* kv = nullptr;
  int64_t begin = 0, rows = 0;
};
struct RowBatch {
  const int64_t* pos = nullptr;  // [T] absolute positions
  int64_t T = 0;
  std::vector<RowGroup> groups;  // cover rows 0 .. T-1 in order, without gaps
  // [T] the rows' token ids: layers with a value embedding read them (null elsewhere is fine).
  const int32_t* tokens = nullptr;
  // T rows of one sequence.
  static RowBatch one(KvCache& kv, const int64_t* pos, int64_t T, const int32_t* tokens = nullptr) {
    return {pos, T, {{&kv, 0, T}}, tokens};
  }
  // The first group's cache (single-sequence callers, routers).
  KvCache& only() const;
};

// Scratch buffers of one forward call, sized for T rows (grown on demand, never shrunk).
struct Workspace {
  std::vector<float> normed;  // [T, D]
  std::vector<float> qkv;  // [T, (H + 2 KVH) hd]   fused projection output
  std::vector<float> q;  // [T, H hd]
  std::vector<float> k;  // [T, KVH hd]
  std::vector<float> v;  // [T, KVH hd]
  std::vector<float> attn;  // [T, H hd]
  std::vector<float> proj;  // [T, D]  output of wo / w_down / inject
  std::vector<float> gate;  // [T, F]
  std::vector<float> up;  // [T, F]
  std::vector<float> concat;  // [T, 2D] inject input
  std::vector<int64_t> k_lo;  // [T] first visible key position per query
  AttentionRouter* router = nullptr;  // not owned; null = attend_causal
  void reserve(const ModelConfig& c, int64_t T);
  int64_t bytes() const;
};

// y[T, D] = norm(x) with the config's norm type; y may alias x.
void apply_norm(const ModelConfig& c, const NormWeights& n, const float* x, int64_t T, float* y);

// h[T, D] <- layer(h) for the rows of `rows`; each group's K/V go to the slot its cache
// assigns to application `app`. A router (ws.router) takes single-sequence batches only.
void run_layer(const ModelConfig& c, const LayerWeights& L, const LayerApp& app, float* h, const RowBatch& rows,
               Workspace& ws);

}  // namespace tinyloop::model
