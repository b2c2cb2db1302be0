// The model's weights, bound by name from a mapped ModelFile to the config's structure.
// Nothing is copied: every pointer points into the mapping (which the ModelFile keeps alive).
#pragma once
#include <memory>
#include <vector>

#include "model/huge_pages.h"
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
  NormWeights attn_norm;       // n1
  NormWeights attn_post_norm;  // n2 (sandwich placements only)
  NormWeights mlp_norm;        // n3
  NormWeights mlp_post_norm;   // n4 (sandwich placements only)
  Linear wqkv;                 // [(H + 2 KVH) hd, D] when qkv_fused
  Linear wq, wk, wv;           // [H hd, D], [KVH hd, D], [KVH hd, D] otherwise
  Linear wo;                   // [D, H hd]
  ops::WeightView value_embed; // [V, KVH hd] (value_embed_layers only; data null otherwise)
  ops::WeightView value_gate;  // [KVH, kValueGateDim]
  Linear w_gate;               // [F, D] (swiglu)
  Linear w_up;                 // [F, D]
  Linear w_down;               // [D, F]
};

struct ModelWeights {
  ops::WeightView embed;       // [V, D]
  ops::WeightView pos_emb;     // [max_seq_len, D] (learned positions)
  Linear inject;               // [D, 2D] (linear_concat)
  std::vector<LayerWeights> pre, loop, post;
  NormWeights prelude_norm, loop_norm, post_loop_norm, final_norm;
  Linear post_loop_proj;       // [D, D] (post_loop_proj)
  ops::WeightView head;        // [V, D] (embed when tied)
  Linear exit_gate;            // [1, D] + bias [1]
  uint64_t bytes = 0;          // total bytes of all tensors of the file
};

// Binds every tensor the config needs (the ModelFile has already checked names, shapes and
// dtypes against the config).
ModelWeights bind_weights(const ModelFile& file);

// Marks every matmul weight view (linears, inject, exit gate, head) to quantize its
// activation rows to int8 per block of 32 as llama.cpp does (ops::WeightView::act_q8). The
// matmul op applies it only to int8/int4 weights with a group that is a multiple of 32.
void set_activation_q8(ModelWeights& w, bool q8);

// Repacked copies of weights for a faster kernel (the BF16 copies of the reduced-precision
// body, the VNNI layout of q8 weights), in one arena owned here (each copy 64-byte
// aligned); the views that use them point into it. The arena is 2 MiB aligned and asks
// Linux for transparent huge pages: the model file's mapping gets them from the page cache,
// and a decode step that streams the copies through 4 KiB pages measured 15-20 % slower
// than the same bytes read from the file.
struct PackedCopies {
  HugeBytes arena;     // the copies
  int64_t bytes = 0;   // sum of their sizes
};

// TINYLOOP_EXPERIMENTAL_FP16_BODY: gives every F32 / F16 / BF16 matmul weight of the loop
// body - the loop layers and the inject projection, which run L times a token - a packed
// BF16 copy ([ceil(N / 64), ceil(K / 2), 64] uint32 words) and points its view at it
// (ops::WeightView::bf16dot), so those matmuls round their input rows to bf16 and use
// vdpbf16ps. int8 / int4 weights, pre / post blocks, the head and the exit gate are left
// as they are. The returned copies must outlive w.
PackedCopies set_loop_bf16dot(ModelWeights& w);

// quant_activations="q8" on an x86 CPU with AVX512-VNNI or AVX2: gives every int8 / int4
// weight the q8 matmul applies to (after set_activation_q8) a copy in the packed kernels'
// layout (ops::WeightView::q8packed, ops/matmul_q8act.h): same bits as the reference, faster.
// None elsewhere (bytes 0). The returned copies must outlive w.
PackedCopies set_q8act_packs(ModelWeights& w);

}  // namespace tinyloop::model
