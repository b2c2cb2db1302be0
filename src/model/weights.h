// The model's weights, bound by name from a mapped ModelFile to the config's structure.
// Nothing is copied: every pointer points into the mapping (which the ModelFile keeps alive).
#pragma once
#include <memory>
#include <vector>

#include "ops/ops.h"
#include "tinyloop/config.h"
#include "tinyloop/model_file.h"

namespace tinyloop::model {

// A norm's parameters: w [D], b [D] or nullptr.
struct NormWeights {
  const float* w = nullptr;
  const float* b = nullptr;
};

// A linear layer: W [out, in] in its stored dtype (int8 / int4 with their scales in the
// view), bias [out] (float) or nullptr.
struct Linear {
  ops::WeightView w;
  const float* bias = nullptr;
};

// One transformer layer (used for pre, loop and post layers alike).
struct LayerWeights {
  NormWeights attn_norm;  // n1
  NormWeights attn_post_norm;  // n2 (sandwich placements only)
  NormWeights mlp_norm;  // n3
  NormWeights mlp_post_norm;  // n4 (sandwich placements only)
  Linear wqkv;  // [(H + 2 KVH) hd, D] when qkv_fused
  Linear wq, wk, wv;  // [H hd, D], [KVH hd, D], [KVH hd, D] otherwise
  Linear wo;  // [D, H hd]
  ops::WeightView value_embed;  // [V, KVH hd] (value_embed_layers only; data null otherwise)
  ops::WeightView value_gate;  // [KVH, kValueGateDim]
  Linear w_gate;  // [F, D] (swiglu)
  Linear w_up;  // [F, D]
  Linear w_down;  // [D, F]
};

struct ModelWeights {
  ops::WeightView embed;  // [V, D]
  ops::WeightView pos_emb;  // [max_seq_len, D] (learned positions)
  Linear inject;  // [D, 2D] (linear_concat)
  std::vector<LayerWeights> pre, loop, post;
  NormWeights prelude_norm, loop_norm, post_loop_norm, final_norm;
  Linear post_loop_proj;  // [D, D] (post_loop_proj)
  ops::WeightView head;  // [V, D] (embed when tied)
  Linear exit_gate;  // [1, D] + bias [1]
  uint64_t bytes = 0;  // total bytes of all tensors of the file
};

// Binds every tensor the config needs (the ModelFile has already checked names, shapes and
// dtypes against the config).
ModelWeights bind_weights(const ModelFile& file);

// Marks every matmul weight view (linears, inject, exit gate, head) to quantize its
// activation rows to int8 per block of 32 as llama.cpp does (ops::WeightView::q8act). The
// matmul op applies it only to int8/int4 weights with a group that is a multiple of 32.
void set_q8act(ModelWeights& w, bool q8);

// Every matmul weight view of the model (linears, inject, post-loop projection, exit gate,
// head), once each; views of absent weights have no data.
std::vector<ops::WeightView*> matmul_views(ModelWeights& w);

// The matmul weights of the transformer layers - pre, loop and post blocks - and the inject
// projection: the ones fp16_body gives the reduced-precision arithmetic (the backend packs
// their copies, ops::make_bf16dot_copies). The pre / post blocks are in since 2026-12-06:
// left exact they took 34% of the bf16-body pp512 on the benchmark model (1 pre, 2 loop,
// 1 post at L = 8) on an AMX Xeon, 1368 -> 2000 t/s with them in (docs/benchmarks.md). The
// head, the exit gate and the post-loop projection keep their own arithmetic.
std::vector<ops::WeightView*> layer_views(ModelWeights& w);

}  // namespace tinyloop::model
