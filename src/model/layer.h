// One transformer layer application (attention + MLP sublayers) over T new tokens, writing
// its K/V into one slot of the sequence's cache. Used for pre, loop and post layers alike.
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
  virtual void attend(const ModelConfig& c, int64_t slot, const float* q, const float* k,
                      const float* v, const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo,
                      float* out) = 0;
};

// The default attention step: k/v rows [T, KVH hd] written at pos[t] of `slot`, then causal
// attention of q [T, H hd] over each query's cache window into out [T, H hd].
void attend_causal(const ModelConfig& c, int64_t slot, const float* q, const float* k,
                   const float* v, const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo,
                   float* out);

// Scratch buffers of one forward call, sized for T rows (grown on demand, never shrunk).
struct Workspace {
  std::vector<float> normed;   // [T, D]
  std::vector<float> qkv;      // [T, (H + 2 KVH) hd]   fused projection output
  std::vector<float> q;        // [T, H hd]
  std::vector<float> k;        // [T, KVH hd]
  std::vector<float> v;        // [T, KVH hd]
  std::vector<float> attn;     // [T, H hd]
  std::vector<float> proj;     // [T, D]  output of wo / w_down / inject
  std::vector<float> gate;     // [T, F]
  std::vector<float> up;       // [T, F]
  std::vector<float> concat;   // [T, 2D] inject input
  std::vector<int64_t> k_lo;   // [T] first visible key position per query
  AttentionRouter* router = nullptr;  // not owned; null = attend_causal
  void reserve(const ModelConfig& c, int64_t T);
  int64_t bytes() const;
};

// y[T, D] = norm(x) with the config's norm type; y may alias x.
void apply_norm(const ModelConfig& c, const NormWeights& n, const float* x, int64_t T, float* y);

// h[T, D] <- layer(h) for tokens at absolute positions pos[T]; K/V go to `slot` of kv.
void run_layer(const ModelConfig& c, const LayerWeights& L, int64_t slot, float* h,
               const int64_t* pos, int64_t T, KvCache& kv, Workspace& ws);

}  // namespace tinyloop::model
