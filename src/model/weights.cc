#include "model/weights.h"

#include <cstdlib>
#include <new>
#include <string>

#include "tinyloop/errors.h"

namespace tinyloop::model {
namespace {

const TensorInfo& require(const ModelFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  // The loader validated the tensor set against the config, so a miss is a bug here.
  if (!t) throw FormatError("model file: missing tensor '" + name + "'");
  return *t;
}

DType compute_dtype(const TensorInfo& t) {
  switch (t.dtype) {
    case StoredDType::F32: return DType::F32;
    case StoredDType::F16: return DType::F16;
    case StoredDType::BF16: return DType::BF16;
    case StoredDType::I8: return DType::I8;
    case StoredDType::U8: return DType::U4;  // int4, two columns a byte
    default:
      throw FormatError("tensor '" + t.name + "': dtype " + t.dtype_name +
                        " cannot be computed with (F32, F16, BF16, I8 or U8 expected)");
  }
}

ops::WeightView matrix(const ModelFile& f, const std::string& name) {
  const TensorInfo& t = require(f, name);
  ops::WeightView v;
  v.dtype = compute_dtype(t);
  v.data = t.data;
  v.rows = t.shape.at(0);
  v.cols = t.shape.size() > 1 ? t.shape[1] : 1;
  if (is_quantized(v.dtype)) {
    // Companions as the loader validated them: scales (and offsets) [N, K / G], F16 / F32.
    if (v.dtype == DType::U4) v.cols *= 2;  // stored [N, K / 2]
    const TensorInfo& s = require(f, name + ".scales");
    v.scales = s.data;
    v.scale_dtype = s.dtype == StoredDType::F16 ? DType::F16 : DType::F32;
    v.group = v.cols / s.shape.at(1);
    if (v.dtype == DType::U4) v.offsets = require(f, name + ".offsets").data;
  }
  return v;
}

const float* f32_vector(const ModelFile& f, const std::string& name) {
  const TensorInfo& t = require(f, name);
  if (t.dtype != StoredDType::F32) throw FormatError("tensor '" + name + "' must be F32");
  return reinterpret_cast<const float*>(t.data);
}

NormWeights norm(const ModelFile& f, const std::string& prefix, bool has_bias) {
  NormWeights n;
  n.w = f32_vector(f, prefix + ".weight");
  if (has_bias) n.b = f32_vector(f, prefix + ".bias");
  return n;
}

Linear linear(const ModelFile& f, const std::string& prefix, bool has_bias) {
  Linear l;
  l.w = matrix(f, prefix + ".weight");
  if (has_bias) l.bias = f32_vector(f, prefix + ".bias");
  return l;
}

LayerWeights layer(const ModelFile& f, const ModelConfig& c, const std::string& p, bool value_embed) {
  LayerWeights L;
  const bool nb = c.norm_bias;
  L.attn_norm = norm(f, p + "attn_norm", nb);
  L.mlp_norm = norm(f, p + "mlp_norm", nb);
  if (c.sandwich()) {
    L.attn_post_norm = norm(f, p + "attn_post_norm", nb);
    L.mlp_post_norm = norm(f, p + "mlp_post_norm", nb);
  }
  if (c.qkv_fused) {
    L.wqkv = linear(f, p + "attn.wqkv", c.attn_qkv_bias);
  } else {
    L.wq = linear(f, p + "attn.wq", c.attn_qkv_bias);
    L.wk = linear(f, p + "attn.wk", c.attn_qkv_bias);
    L.wv = linear(f, p + "attn.wv", c.attn_qkv_bias);
  }
  L.wo = linear(f, p + "attn.wo", c.attn_out_bias);
  if (value_embed) {
    L.value_embed = matrix(f, p + "attn.value_embed.weight");
    L.value_gate = matrix(f, p + "attn.value_gate.weight");
  }
  if (c.mlp == MlpType::SwiGLU) L.w_gate = linear(f, p + "mlp.w_gate", c.mlp_bias);
  L.w_up = linear(f, p + "mlp.w_up", c.mlp_bias);
  L.w_down = linear(f, p + "mlp.w_down", c.mlp_bias);
  return L;
}

}  // namespace

ModelWeights bind_weights(const ModelFile& f) {
  const ModelConfig& c = f.config();
  ModelWeights w;
  w.embed = matrix(f, "embed.weight");
  if (c.pos_encoding == PosEncoding::Learned) w.pos_emb = matrix(f, "pos_emb.weight");
  if (c.inject == Inject::LinearConcat) w.inject = linear(f, "inject", false);
  // value_embed_layers indexes the pre, loop and post layers in that order.
  const int64_t loop0 = c.n_pre_blocks, post0 = c.n_pre_blocks + c.n_loop_layers;
  for (int64_t i = 0; i < c.n_pre_blocks; ++i)
    w.pre.push_back(layer(f, c, "pre." + std::to_string(i) + ".", c.has_value_embed(i)));
  for (int64_t i = 0; i < c.n_loop_layers; ++i)
    w.loop.push_back(layer(f, c, "loop." + std::to_string(i) + ".", c.has_value_embed(loop0 + i)));
  for (int64_t i = 0; i < c.n_post_blocks; ++i)
    w.post.push_back(layer(f, c, "post." + std::to_string(i) + ".", c.has_value_embed(post0 + i)));
  if (c.prelude_norm) w.prelude_norm = norm(f, "prelude_norm", c.norm_bias);
  if (c.loop_norm) w.loop_norm = norm(f, "loop_norm", c.norm_bias);
  if (c.final_norm) w.final_norm = norm(f, "final_norm", c.norm_bias);
  if (c.post_loop_norm == PostLoopNorm::Own) w.post_loop_norm = norm(f, "post_loop_norm", c.norm_bias);
  if (c.post_loop_norm == PostLoopNorm::Final) w.post_loop_norm = w.final_norm;
  if (c.post_loop_proj) w.post_loop_proj = linear(f, "post_loop_proj", false);
  w.head = c.tie_embeddings ? w.embed : matrix(f, "head.weight");
  if (c.exit_gate) w.exit_gate = linear(f, "exit_gate", true);
  for (const auto& [name, t] : f.tensors()) w.bytes += t.nbytes;
  return w;
}

// Every matmul weight view of the model (linears, inject, exit gate, head), once each.
std::vector<ops::WeightView*> matmul_views(ModelWeights& w) {
  std::vector<ops::WeightView*> v = layer_views(w);  // the layers' linears and the inject
  v.push_back(&w.post_loop_proj.w);
  v.push_back(&w.exit_gate.w);
  v.push_back(&w.head);
  return v;
}

std::vector<ops::WeightView*> layer_views(ModelWeights& w) {
  std::vector<ops::WeightView*> v;
  for (auto* layers : {&w.pre, &w.loop, &w.post})
    for (LayerWeights& L : *layers)
      for (Linear* l : {&L.wqkv, &L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) v.push_back(&l->w);
  v.push_back(&w.inject.w);
  return v;
}

void set_q8act(ModelWeights& w, bool q8) {
  for (ops::WeightView* v : matmul_views(w)) v->q8act = q8;
}

}  // namespace tinyloop::model
