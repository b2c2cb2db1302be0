#include "model/weights.h"

#include <cstdlib>
#include <new>
#include <string>

#include "ops/matmul_bf16dot.h"
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
    default: throw FormatError("tensor '" + t.name + "': dtype " + t.dtype_name +
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

LayerWeights layer(const ModelFile& f, const ModelConfig& c, const std::string& p) {
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
  for (int64_t i = 0; i < c.n_pre_blocks; ++i) w.pre.push_back(layer(f, c, "pre." + std::to_string(i) + "."));
  for (int64_t i = 0; i < c.n_loop_layers; ++i) w.loop.push_back(layer(f, c, "loop." + std::to_string(i) + "."));
  for (int64_t i = 0; i < c.n_post_blocks; ++i) w.post.push_back(layer(f, c, "post." + std::to_string(i) + "."));
  if (c.loop_norm) w.loop_norm = norm(f, "loop_norm", c.norm_bias);
  if (c.final_norm) w.final_norm = norm(f, "final_norm", c.norm_bias);
  if (c.post_loop_norm == PostLoopNorm::Own) w.post_loop_norm = norm(f, "post_loop_norm", c.norm_bias);
  if (c.post_loop_norm == PostLoopNorm::Final) w.post_loop_norm = w.final_norm;
  w.head = c.tie_embeddings ? w.embed : matrix(f, "head.weight");
  if (c.exit_gate) w.exit_gate = linear(f, "exit_gate", true);
  for (const auto& [name, t] : f.tensors()) w.bytes += t.nbytes;
  return w;
}

void set_activation_q8(ModelWeights& w, bool q8) {
  auto mark = [q8](Linear& l) { l.w.act_q8 = q8; };
  for (auto* layers : {&w.pre, &w.loop, &w.post})
    for (LayerWeights& L : *layers)
      for (Linear* l : {&L.wqkv, &L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        mark(*l);
  mark(w.inject);
  mark(w.exit_gate);
  w.head.act_q8 = q8;
}


Bf16DotCopies set_loop_bf16dot(ModelWeights& w) {
  std::vector<Linear*> todo;  // the float matmul weights of the loop body
  for (LayerWeights& L : w.loop)
    for (Linear* l : {&L.wqkv, &L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      todo.push_back(l);
  todo.push_back(&w.inject);
  std::erase_if(todo, [](const Linear* l) {
    const DType t = l->w.dtype;
    return !l->w.data || (t != DType::F32 && t != DType::F16 && t != DType::BF16);
  });
  constexpr int64_t kAlignWords = 16;  // 64 bytes: one vector, one cache line
  auto words_of = [](const Linear* l) {
    return (ops::bf16dot_packed_words(l->w.rows, l->w.cols) + kAlignWords - 1) / kAlignWords * kAlignWords;
  };
  int64_t total = 0;
  for (const Linear* l : todo) total += words_of(l);
  Bf16DotCopies c;
  if (total == 0) return c;
  c.arena = alloc_huge_pages(size_t(total) * sizeof(uint32_t));  // 2 MiB pages: huge_pages.h
  uint32_t* next = reinterpret_cast<uint32_t*>(c.arena.get());
  for (Linear* l : todo) {
    ops::pack_bf16dot(l->w, next);
    l->w.bf16dot = next;
    c.bytes += ops::bf16dot_packed_words(l->w.rows, l->w.cols) * int64_t(sizeof(uint32_t));
    next += words_of(l);
  }
  return c;
}

}  // namespace tinyloop::model
