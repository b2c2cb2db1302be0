#include "model/layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace tinyloop::model {
namespace {

int64_t q_width(const ModelConfig& c) { return c.n_heads * c.head_dim; }
int64_t kv_width(const ModelConfig& c) { return c.n_kv_heads * c.head_dim; }

void linear(const Linear& l, const float* x, int64_t T, float* y) { ops::matmul(x, T, l.w, l.bias, y); }

// q/k/v [T, *] from the normed input, fused or split.
void project_qkv(const ModelConfig& c, const LayerWeights& L, const float* x, int64_t T, Workspace& ws) {
  const int64_t qw = q_width(c), kw = kv_width(c);
  if (!c.qkv_fused) {
    linear(L.wq, x, T, ws.q.data());
    linear(L.wk, x, T, ws.k.data());
    linear(L.wv, x, T, ws.v.data());
    return;
  }
  const int64_t row = qw + 2 * kw;
  linear(L.wqkv, x, T, ws.qkv.data());  // [T, q | k | v]
  for (int64_t t = 0; t < T; ++t) {
    const float* r = ws.qkv.data() + t * row;
    std::memcpy(ws.q.data() + t * qw, r, sizeof(float) * qw);
    std::memcpy(ws.k.data() + t * kw, r + qw, sizeof(float) * kw);
    std::memcpy(ws.v.data() + t * kw, r + qw + kw, sizeof(float) * kw);
  }
}

void rope_rows(const ModelConfig& c, float* x, int64_t T, int64_t n_heads, const int64_t* pos) {
  if (!c.uses_rope()) return;
  const auto layout = c.pos_encoding == PosEncoding::RopeHalf ? ops::RopeLayout::Half : ops::RopeLayout::Interleaved;
  ops::rope(x, T, n_heads, c.head_dim, pos, static_cast<float>(c.rope_theta), layout);
}

// RoPE, then with qk_norm each head's vector divided by its RMS (no weight: a weight of
// ones, which rounds nothing). x [T, n_heads * head_dim], in place.
void position_qk(const ModelConfig& c, float* x, int64_t T, int64_t n_heads, const int64_t* pos) {
  rope_rows(c, x, T, n_heads, pos);
  if (!c.qk_norm) return;
  const std::vector<float> ones(static_cast<size_t>(c.head_dim), 1.0f);  // [hd]
  ops::rmsnorm(x, T * n_heads, c.head_dim, ones.data(), kQkNormEps, x);
}

// Store-h attention (docs/kv-cache.md): the slot keeps the normed input h of every position;
// K/V of the visible positions are rebuilt from the stored (rounded) h rows with this
// layer's own projection (+ bias, RoPE at each key's position) and attended as a float32
// slot. The new tokens' K/V are rebuilt from their stored rows too, so a row's K/V never
// depend on which forward wrote it (cached == uncached, bit for bit).
//   x [T, D] normed input, q [T, n_heads * head_dim] (roped), out [T, n_heads * head_dim]
void attend_store_h(const ModelConfig& c, const LayerWeights& L, int64_t slot, const float* x, const float* q,
                    const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo, float* out) {
  kv.write_h(slot, x, pos, T);
  int64_t lo = pos[0], hi = pos[0];
  for (int64_t t = 0; t < T; ++t) {
    k_lo[t] = kv.first_visible(pos[t]);
    lo = std::min(lo, k_lo[t]);
    hi = std::max(hi, pos[t]);
  }
  // The rebuilt rows form a float32 slot of capacity n: position p in row p % n (a
  // bijection on lo .. hi), so h is decoded straight into that order and K/V need no copy.
  const int64_t n = hi - lo + 1, D = c.dim, kw = kv_width(c), qw = q_width(c);
  std::vector<float> h(static_cast<size_t>(n * D));  // [n, D] stored h rows, decoded
  std::vector<int64_t> kpos(static_cast<size_t>(n));  // [n] their positions
  for (int64_t p = lo; p <= hi; ++p) {
    kpos[size_t(p % n)] = p;
    kv.read_h(slot, p, h.data() + (p % n) * D);
  }
  std::vector<float> k(static_cast<size_t>(n * kw)), v(k.size());  // [n, kw] rebuilt K, V
  if (c.qkv_fused) {
    std::vector<float> qkv(static_cast<size_t>(n * (qw + 2 * kw)));  // [n, q | k | v]
    linear(L.wqkv, h.data(), n, qkv.data());
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(k.data() + i * kw, qkv.data() + i * (qw + 2 * kw) + qw, sizeof(float) * kw);
      std::memcpy(v.data() + i * kw, qkv.data() + i * (qw + 2 * kw) + qw + kw, sizeof(float) * kw);
    }
  } else {
    linear(L.wk, h.data(), n, k.data());
    linear(L.wv, h.data(), n, v.data());
  }
  position_qk(c, k.data(), n, c.n_kv_heads, kpos.data());
  ops::KvView view;
  view.dtype = ops::KvDType::F32;
  view.k = k.data();
  view.v = v.data();
  view.capacity = n;
  view.n_kv_heads = c.n_kv_heads;
  view.head_dim = c.head_dim;
  ops::attention(q, T, c.n_heads, view, pos, k_lo, out);
}

// v[t] += 2 sigmoid(value_gate . x[t, :kValueGateDim]) * value_embed[token t], per kv head
// (Parcae's value embedding). x [T, D] normed input, v [T, KVH hd].
void add_value_embedding(const ModelConfig& c, const LayerWeights& L, const float* x, const RowBatch& b, float* v) {
  if (!b.tokens) throw std::logic_error("a layer with a value embedding needs its rows' token ids");
  const int64_t KVH = c.n_kv_heads, hd = c.head_dim, kw = kv_width(c);
  std::vector<float> gate_w(static_cast<size_t>(KVH * kValueGateDim));  // [KVH, 32] as float
  for (int64_t g = 0; g < KVH; ++g) ops::weight_row_to_f32(L.value_gate, g, gate_w.data() + g * kValueGateDim);
  std::vector<float> row(static_cast<size_t>(kw));  // [KVH hd] the token's table row
  for (int64_t t = 0; t < b.T; ++t) {
    ops::weight_row_to_f32(L.value_embed, b.tokens[t], row.data());
    const float* xt = x + t * c.dim;
    float* vt = v + t * kw;
    for (int64_t g = 0; g < KVH; ++g) {
      float z = 0.f;
      for (int64_t i = 0; i < kValueGateDim; ++i) z += gate_w[size_t(g * kValueGateDim + i)] * xt[i];
      const float gate = 2.f / (1.f + std::exp(-z));  // in (0, 2)
      for (int64_t j = 0; j < hd; ++j) vt[g * hd + j] += gate * row[size_t(g * hd + j)];
    }
  }
}

// ws.proj[T, D] = attention sublayer output (before the residual) of normed input x.
void attention_sublayer(const ModelConfig& c, const LayerWeights& L, const LayerApp& app, const float* x,
                        const RowBatch& b, Workspace& ws) {
  const int64_t T = b.T, qw = q_width(c), kw = kv_width(c);
  project_qkv(c, L, x, T, ws);
  if (L.value_embed.data) {
    // Store-h rebuilds V of every visible position from stored h alone, without the tokens.
    if (ops::is_store_h(b.groups.front().kv->dtype()))
      throw std::invalid_argument("store-h kv_mode (h_fp16, h_int8, h_int4) does not support value embeddings");
    add_value_embedding(c, L, x, b, ws.v.data());
  }
  position_qk(c, ws.q.data(), T, c.n_heads, b.pos);
  if (ws.router) {
    if (b.groups.size() != 1) throw std::logic_error("an attention router serves one sequence");
    KvCache& kv = b.only();
    if (ops::is_store_h(kv.dtype()))
      throw std::invalid_argument("store-h kv_mode (h_fp16, h_int8, h_int4) does not support speculative decoding yet");
    position_qk(c, ws.k.data(), T, c.n_kv_heads, b.pos);
    ws.router->attend(c, kv.layout().of(app), ws.q.data(), ws.k.data(), ws.v.data(), b.pos, T, kv, ws.k_lo.data(),
                      ws.attn.data());
  } else if (ops::is_store_h(b.groups.front().kv->dtype())) {
    for (const RowGroup& g : b.groups)
      attend_store_h(c, L, g.kv->layout().of(app), x + g.begin * c.dim, ws.q.data() + g.begin * qw, b.pos + g.begin,
                     g.rows, *g.kv, ws.k_lo.data() + g.begin, ws.attn.data() + g.begin * qw);
  } else {
    position_qk(c, ws.k.data(), T, c.n_kv_heads, b.pos);
    // Each sequence's rows into its own slot, then one attention call over every sequence.
    std::vector<ops::KvRowGroup> views(b.groups.size());
    for (size_t i = 0; i < b.groups.size(); ++i) {
      const RowGroup& g = b.groups[i];
      const int64_t slot = g.kv->layout().of(app);
      g.kv->write(slot, ws.k.data() + g.begin * kw, ws.v.data() + g.begin * kw, b.pos + g.begin, g.rows);
      for (int64_t t = g.begin; t < g.begin + g.rows; ++t) ws.k_lo[t] = g.kv->first_visible(b.pos[t]);
      views[i] = {g.kv->view(slot), g.begin, g.rows};
    }
    ops::attention_batch(ws.q.data(), T, c.n_heads, views.data(), int64_t(views.size()), b.pos, ws.k_lo.data(),
                         ws.attn.data());
  }
  linear(L.wo, ws.attn.data(), T, ws.proj.data());
}

// ws.proj[T, D] = MLP sublayer output (before the residual) of normed input x:
//   swiglu: down(silu(gate x) * up x)   gelu*: down(gelu(up x))   relu2: down(max(up x, 0)^2)
void mlp_sublayer(const ModelConfig& c, const LayerWeights& L, const float* x, int64_t T, Workspace& ws) {
  const int64_t n = T * c.ffn_dim;
  linear(L.w_up, x, T, ws.up.data());
  if (c.mlp == MlpType::SwiGLU) {
    linear(L.w_gate, x, T, ws.gate.data());
    ops::silu_mul(ws.gate.data(), ws.up.data(), n, ws.up.data());
  } else if (c.mlp == MlpType::ReLU2) {
    ops::relu_square(ws.up.data(), n);
  } else {
    ops::gelu(ws.up.data(), n, c.mlp == MlpType::GELUTanh);
  }
  linear(L.w_down, ws.up.data(), T, ws.proj.data());
}

// Adds the sublayer output ws.proj into the residual h per the norm placement:
//   pre:    h = h + f          huginn: h = post(h + f)          ouro: h = h + post(f)
void residual(const ModelConfig& c, const NormWeights& post, float* h, int64_t T, Workspace& ws) {
  const int64_t n = T * c.dim;
  switch (c.norm_placement) {
    case NormPlacement::Pre: ops::add(h, ws.proj.data(), n, h); break;
    case NormPlacement::HuginnSandwich:
      ops::add(h, ws.proj.data(), n, h);
      apply_norm(c, post, h, T, h);
      break;
    case NormPlacement::OuroSandwich:
      apply_norm(c, post, ws.proj.data(), T, ws.proj.data());
      ops::add(h, ws.proj.data(), n, h);
      break;
  }
}

}  // namespace

void Workspace::reserve(const ModelConfig& c, int64_t T) {
  auto grow = [](std::vector<float>& b, int64_t n) {
    if (static_cast<int64_t>(b.size()) < n) b.resize(n);
  };
  const int64_t qw = q_width(c), kw = kv_width(c);
  grow(normed, T * c.dim);
  if (c.qkv_fused) grow(qkv, T * (qw + 2 * kw));
  grow(q, T * qw);
  grow(k, T * kw);
  grow(v, T * kw);
  grow(attn, T * qw);
  grow(proj, T * c.dim);
  if (c.mlp == MlpType::SwiGLU) grow(gate, T * c.ffn_dim);
  grow(up, T * c.ffn_dim);
  if (c.inject == Inject::LinearConcat) grow(concat, T * 2 * c.dim);
  if (static_cast<int64_t>(k_lo.size()) < T) k_lo.resize(T);
}

int64_t Workspace::bytes() const {
  int64_t n = 0;
  for (const auto* b : {&normed, &qkv, &q, &k, &v, &attn, &proj, &gate, &up, &concat})
    n += static_cast<int64_t>(b->capacity() * sizeof(float));
  return n + static_cast<int64_t>(k_lo.capacity() * sizeof(int64_t));
}

KvCache& RowBatch::only() const {
  if (groups.empty()) throw std::logic_error("a forward with no rows");
  return *groups.front().kv;
}

void attend_causal(const ModelConfig& c, int64_t slot, const float* q, const float* k, const float* v,
                   const int64_t* pos, int64_t T, KvCache& kv, int64_t* k_lo, float* out) {
  kv.write(slot, k, v, pos, T);
  for (int64_t t = 0; t < T; ++t) k_lo[t] = kv.first_visible(pos[t]);
  ops::attention(q, T, c.n_heads, kv.view(slot), pos, k_lo, out);
}

void apply_norm(const ModelConfig& c, const NormWeights& n, const float* x, int64_t T, float* y) {
  const float eps = static_cast<float>(c.norm_eps);
  if (c.norm_type == NormType::RMSNorm) ops::rmsnorm(x, T, c.dim, n.w, eps, y);
  else ops::layernorm(x, T, c.dim, n.w, n.b, eps, y);
}

void run_layer(const ModelConfig& c, const LayerWeights& L, const LayerApp& app, float* h, const RowBatch& rows,
               Workspace& ws) {
  const int64_t T = rows.T;
  apply_norm(c, L.attn_norm, h, T, ws.normed.data());
  attention_sublayer(c, L, app, ws.normed.data(), rows, ws);
  residual(c, L.attn_post_norm, h, T, ws);
  apply_norm(c, L.mlp_norm, h, T, ws.normed.data());
  mlp_sublayer(c, L, ws.normed.data(), T, ws);
  residual(c, L.mlp_post_norm, h, T, ws);
}

}  // namespace tinyloop::model
