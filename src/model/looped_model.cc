#include "model/looped_model.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/init_state.h"

namespace tinyloop::model {

LoopedModel::LoopedModel(std::shared_ptr<const ModelFile> file, bool q8act, bool fp16_body)
    : file_(std::move(file)), cfg_(file_->config()), w_(bind_weights(*file_)) {
  // The model picks each weight's arithmetic; the backend makes whatever copies its kernels
  // want for it (ops/backend.h), and the model counts their bytes.
  set_q8act(w_, q8act);
  if (q8act) {
    q8_copies_ = ops::make_q8act_copies(matmul_views(w_));
    q8_tracked_ = TrackedBytes(&memory_, q8_copies_.bytes);
  }
  if (fp16_body) {
    bf16_copies_ = ops::make_bf16dot_copies(layer_views(w_));
    bf16_tracked_ = TrackedBytes(&memory_, bf16_copies_.bytes);
  }
  release_copied_originals();
}

void LoopedModel::release_copied_originals() {
  // A weight whose kernels read the backend's copy (q8 packed, bf16 body) leaves its file
  // bytes unread after load, but packing them faulted every page in: drop those pages, and
  // stop counting their bytes in the model's memory (vram_usage_mb), since the copy is
  // counted instead. The embedding is the exception when the head is tied to it: its rows
  // are still gathered per token, so its bytes stay counted (its pages come back as rows
  // are read). A path that reads an original again (the scalar kernels, TINYLOOP_FORCE_SCALAR)
  // faults its pages back in, unchanged.
  // Measured (bench/peak_rss.py, 4096-token context, EPYC Zen 5): peak RSS -54 MiB on the
  // int8 benchmark model, -31 MiB int4, -65 MiB on SmolLM2-135M.
  if (!file_->mapped()) return;
  for (const ops::WeightView* v : matmul_views(w_)) {  // the loop body's views among them
    if (!v->q8packed && !v->bf16dot) continue;
    const int64_t values = v->rows * weight_row_bytes(v->dtype, v->cols);
    // scales, and offsets (U4) of the same shape: [N, K / group]
    const int64_t params = v->scales ? v->rows * (v->cols / v->group) * int64_t(dtype_size(v->scale_dtype)) : 0;
    file_->release_pages(v->data, values);
    file_->release_pages(v->scales, params);
    if (v->offsets) file_->release_pages(v->offsets, params);
    if (v->data == w_.embed.data) continue;  // still read row by row: stays counted
    w_.bytes -= uint64_t(values + params * (v->offsets ? 2 : 1));
  }
}

void LoopedModel::prelude(const int32_t* tokens, const RowBatch& b, Workspace& ws, float* x, float* trace) const {
  const int64_t D = cfg_.dim, T = b.T;
  const float scale = static_cast<float>(cfg_.embed_scale);
  std::vector<float> row(cfg_.pos_encoding == PosEncoding::Learned ? D : 0);  // [D]
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x + t * D;
    ops::weight_row_to_f32(w_.embed, tokens[t], xt);
    for (int64_t i = 0; i < D; ++i) xt[i] *= scale;
    if (cfg_.pos_encoding == PosEncoding::Learned) {
      if (b.pos[t] >= w_.pos_emb.rows)
        throw std::out_of_range("position " + std::to_string(b.pos[t]) + " beyond the learned position table (" +
                                std::to_string(w_.pos_emb.rows) + " rows)");
      ops::weight_row_to_f32(w_.pos_emb, b.pos[t], row.data());
      ops::add(xt, row.data(), D, xt);
    }
  }
  if (trace) std::memcpy(trace, x, sizeof(float) * T * D);
  RowBatch bt = b;  // the pre layers' value embeddings read the tokens
  bt.tokens = tokens;
  for (int64_t i = 0; i < cfg_.n_pre_blocks; ++i) {
    run_layer(cfg_, w_.pre[i], LayerApp::pre(i), x, bt, ws);
    if (trace) std::memcpy(trace + (i + 1) * T * D, x, sizeof(float) * T * D);
  }
  if (cfg_.prelude_norm) apply_norm(cfg_, w_.prelude_norm, x, T, x);
}

void LoopedModel::initial_state(const float* x, const RowBatch& b, float* s) const {
  const int64_t D = cfg_.dim, n = b.T * D;
  switch (cfg_.init_state) {
    case InitState::Input: std::memcpy(s, x, sizeof(float) * n); break;
    case InitState::Zeros: std::fill(s, s + n, 0.0f); break;
    case InitState::Random:
      for (const RowGroup& g : b.groups) {
        const StateDraw& d = g.kv->state_draw();
        float* sg = s + g.begin * D;  // [g.rows, D]
        if (d.scale == 0) {
          std::fill(sg, sg + g.rows * D, 0.0f);  // Huginn's init_scale = 0: the zero state
        } else {
          random_initial_state(d.seed, b.pos + g.begin, g.rows, D, cfg_.init_state_std * d.scale, sg);
        }
      }
      break;
  }
}

void LoopedModel::iteration(int64_t i, float* s, const float* x, const RowBatch& b, Workspace& ws) const {
  const int64_t D = cfg_.dim, T = b.T;
  switch (cfg_.inject) {
    case Inject::None: break;
    case Inject::Add: ops::add(s, x, T * D, s); break;
    case Inject::LinearConcat: {
      float* cat = ws.concat.data();  // [T, 2D] = [s | x] per row
      for (int64_t t = 0; t < T; ++t) {
        std::memcpy(cat + t * 2 * D, s + t * D, sizeof(float) * D);
        std::memcpy(cat + t * 2 * D + D, x + t * D, sizeof(float) * D);
      }
      ops::matmul(cat, T, w_.inject.w, w_.inject.bias, s);
      break;
    }
  }
  for (int64_t j = 0; j < cfg_.n_loop_layers; ++j) run_layer(cfg_, w_.loop[j], LayerApp::loop(i, j), s, b, ws);
  if (cfg_.loop_norm) apply_norm(cfg_, w_.loop_norm, s, T, s);
}

void LoopedModel::readout(float* s, const RowBatch& b, Workspace& ws, const int64_t* out_rows, int64_t n_out,
                          float* logits) const {
  const int64_t D = cfg_.dim, T = b.T;
  if (cfg_.post_loop_norm != PostLoopNorm::None) apply_norm(cfg_, w_.post_loop_norm, s, T, s);
  if (cfg_.post_loop_proj) {
    ops::matmul(s, T, w_.post_loop_proj.w, nullptr, ws.proj.data());  // [T, D]; must not alias s
    std::memcpy(s, ws.proj.data(), sizeof(float) * T * D);
  }
  for (int64_t k = 0; k < cfg_.n_post_blocks; ++k) run_layer(cfg_, w_.post[k], LayerApp::post(k), s, b, ws);
  if (n_out <= 0) return;
  float* normed = ws.normed.data();  // [n_out, D] the rows that get logits
  for (int64_t r = 0; r < n_out; ++r) std::memcpy(normed + r * D, s + out_rows[r] * D, sizeof(float) * D);
  if (cfg_.final_norm) apply_norm(cfg_, w_.final_norm, normed, n_out, normed);
  ops::matmul(normed, n_out, w_.head, nullptr, logits);
}

void LoopedModel::readout(float* s, const int64_t* pos, int64_t T, KvCache& kv, Workspace& ws, LogitRows rows,
                          float* logits, const int32_t* tokens) const {
  std::vector<int64_t> out(rows == LogitRows::All ? T : 1);  // [rows] which rows get logits
  for (size_t r = 0; r < out.size(); ++r) out[r] = rows == LogitRows::All ? int64_t(r) : T - 1;
  readout(s, RowBatch::one(kv, pos, T, tokens), ws, out.data(), int64_t(out.size()), logits);
}

int64_t LoopedModel::max_step(const KvCache& kv, int64_t T) const {
  const int64_t end = kv.length() + T;
  if (end > kv.capacity())
    throw std::logic_error("KV cache of capacity " + std::to_string(kv.capacity()) + " cannot hold position " +
                           std::to_string(end - 1));
  return kv.window() > 0 ? std::min(T, KvCache::kWindowSlack) : T;
}

int64_t LoopedModel::max_chunk(const KvCache& kv, int64_t T) const {
  const int64_t n = max_step(kv, T);  // a window's pieces (kWindowSlack) are smaller already
  return kv.layout().shared() || ops::is_store_h(kv.dtype()) ? n : std::min(n, kPrefillChunk);
}

void LoopedModel::forward(const int32_t* tokens, int64_t T, KvCache& kv, LogitRows rows, std::vector<float>& logits,
                          int64_t loops) const {
  if (T < 1) throw std::invalid_argument("forward needs at least one token");
  if (loops == 0) loops = kv.loops();
  if (loops < 1 || loops > kv.loops())
    throw std::logic_error("forward at " + std::to_string(loops) + " loops on a KV cache with slots for " +
                           std::to_string(kv.loops()));
  const int64_t D = cfg_.dim, V = cfg_.vocab_size;
  logits.resize((rows == LogitRows::All ? T : 1) * V);
  Workspace ws;
  int64_t done = 0;
  while (done < T) {
    const int64_t n = max_chunk(kv, T - done);
    kv.grow_pool_for(kv.length() + n);  // a standalone cache's pool: this piece's blocks at once
    ws.reserve(cfg_, n);
    TrackedBytes ws_bytes(&memory_, ws.bytes() + 2 * n * D * int64_t(sizeof(float)));
    std::vector<int64_t> pos(n);  // [n] absolute positions
    for (int64_t t = 0; t < n; ++t) pos[t] = kv.length() + t;
    std::vector<float> x(n * D), s(n * D);  // [n, D] loop input, loop state
    prelude(tokens + done, pos.data(), n, kv, ws, x.data());
    initial_state(x.data(), RowBatch::one(kv, pos.data(), n), s.data());
    const int32_t* chunk = tokens + done;  // [n]
    for (int64_t i = 0; i < loops; ++i) iteration(i, s.data(), x.data(), pos.data(), n, kv, ws, chunk);
    const bool last_chunk = done + n == T;
    if (rows == LogitRows::All) {
      readout(s.data(), pos.data(), n, kv, ws, LogitRows::All, logits.data() + done * V, chunk);
    } else if (last_chunk) {
      readout(s.data(), pos.data(), n, kv, ws, LogitRows::Last, logits.data(), chunk);
    } else {
      // Earlier chunks still need their post-block K/V; their logits are not wanted.
      readout(s.data(), RowBatch::one(kv, pos.data(), n, chunk), ws, nullptr, 0, nullptr);
    }
    kv.advance(n);
    done += n;
  }
}

}  // namespace tinyloop::model
