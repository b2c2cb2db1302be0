// The looped forward (docs/model-format.md "Forward", docs/kv-cache.md) over T new tokens of one sequence.
//
// The forward is split at the points every loop-depth feature needs: the state after
// iteration i is a valid input to iteration i + 1, and logits can be read out of any
// iteration. prelude() -> initial_state() -> iteration(0..L-1) -> readout() is exactly
// forward(); early exit, logit lens, warm-start resume and self-speculation compose these
// same four steps instead of re-implementing the model.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/kv_cache.h"
#include "model/layer.h"
#include "model/memory_tracker.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "tinyloop/model_file.h"

namespace tinyloop::model {

// Which rows of a forward get logits.
enum class LogitRows { Last, All };

class LoopedModel {
 public:
  // q8act: int8 activations for the int8/int4 weight matmuls (quant_activations="q8",
  // set_q8act); fp16_body: the float weights of the pre, loop and post layers take the bf16
  // dot-product arithmetic (TINYLOOP_EXPERIMENTAL_FP16_BODY, ops/matmul_bf16dot.h;
  // weights.h layer_views). For both the backend makes
  // copies of the weights in its kernels' layouts (ops/backend.h), counted in memory(). Both
  // fixed for the model's lifetime.
  explicit LoopedModel(std::shared_ptr<const ModelFile> file, bool q8act = false, bool fp16_body = false);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const ModelFile& file() const { return *file_; }
  MemoryTracker& memory() const { return memory_; }
  // Bytes of the packed BF16 copies (0 unless fp16_body).
  int64_t fp16_body_bytes() const { return bf16_copies_.bytes; }
  // Bytes of the q8 weights' packed copies (0 unless quant_activations="q8" on a CPU with
  // AVX512-VNNI or AVX2).
  int64_t q8_packed_bytes() const { return q8_copies_.bytes; }

  // The four steps over a batch of rows (model/layer.h RowBatch): rows of many sequences at
  // their own positions, each group writing its own cache. Row t's numbers never depend on
  // the other rows (batch-invariant kernels), so a row computed in any batch is bit-identical
  // to the same row computed alone.
  //
  // x[T, D] = pre_blocks(embed[tokens] * embed_scale (+ pos_emb[pos])), then prelude_norm
  // when the config has one. Writes pre slots.
  // trace (optional, for score_trajectory): [1 + n_pre_blocks, T, D] receives the embedding,
  // then the output of each pre layer.
  void prelude(const int32_t* tokens, const RowBatch& b, Workspace& ws, float* x, float* trace = nullptr) const;
  // s[T, D] = the loop's initial state for inputs x[T, D] at positions b.pos[T]; a random
  // state is drawn per group with its cache's StateDraw.
  void initial_state(const float* x, const RowBatch& b, float* s) const;
  // s[T, D] <- iteration `i` (0-based) of the loop: inject x, loop layers, loop norm.
  // Writes each group's slots of iteration i.
  void iteration(int64_t i, float* s, const float* x, const RowBatch& b, Workspace& ws) const;
  // From the loop state s[T, D] (clobbered): post-loop norm and projection, post blocks (writing the post
  // slots of every row), then final norm and head for rows out_rows[n_out] only:
  // logits[n_out, V].
  void readout(float* s, const RowBatch& b, Workspace& ws, const int64_t* out_rows, int64_t n_out, float* logits) const;

  // The same steps for T rows of one sequence (positions pos[T] of kv). tokens [T]: the
  // rows' ids, which layers with a value embedding need in every step (null without them).
  void prelude(const int32_t* tokens, const int64_t* pos, int64_t T, KvCache& kv, Workspace& ws, float* x,
               float* trace = nullptr) const {
    prelude(tokens, RowBatch::one(kv, pos, T, tokens), ws, x, trace);
  }
  void iteration(int64_t i, float* s, const float* x, const int64_t* pos, int64_t T, KvCache& kv, Workspace& ws,
                 const int32_t* tokens = nullptr) const {
    iteration(i, s, x, RowBatch::one(kv, pos, T, tokens), ws);
  }
  // logits[rows, V], rows = 1 (Last) or T (All).
  void readout(float* s, const int64_t* pos, int64_t T, KvCache& kv, Workspace& ws, LogitRows rows, float* logits,
               const int32_t* tokens = nullptr) const;

  // The whole forward of T new tokens appended to the sequence in kv (positions
  // kv.length() ..), at `loops` iterations (<= kv.loops(), the iterations kv has slots for;
  // 0 = kv.loops()). Advances kv. logits: [1 or T, V].
  // Long inputs go in chunks (max_chunk), so the workspace stays bounded.
  void forward(const int32_t* tokens, int64_t T, KvCache& kv, LogitRows rows, std::vector<float>& logits,
               int64_t loops = 0) const;

  // The largest T one forward step takes on kv: with a window KvCache::kWindowSlack rows, so
  // a windowed cache never holds much more than its window; else kPrefillChunk rows, so a
  // long prompt's workspace (~40 KiB a row on a dim-768 model: 160 MiB at 4096 rows in one
  // piece) stays bounded. Both give the same bits as one piece: every kernel is
  // batch-invariant and a row attends to the rows written before it whichever call wrote
  // them. Not for the recurrence-shared layout (rows of one forward see each other at the
  // current iteration, earlier forwards' rows at their last: chunking would change what a
  // prompt sees) nor store-h (each piece rebuilds every earlier position's K/V): those take
  // the whole input. Throws std::logic_error when positions up to kv.length() + T exceed
  // kv.capacity().
  int64_t max_chunk(const KvCache& kv, int64_t T) const;
  // The largest T one step can take at all (max_chunk without the memory bound): T, or with a
  // window KvCache::kWindowSlack rows. For callers that keep all rows of a run in one step
  // (runtime/loop_run.h). Same throws as max_chunk.
  int64_t max_step(const KvCache& kv, int64_t T) const;
  // Rows per prefill piece: as fast as one piece (the matmuls reach their prefill rate well
  // below 512 rows) and its workspace fits in L2 + L3 rather than in DRAM.
  static constexpr int64_t kPrefillChunk = 512;

 private:
  // Drops the mapped pages of weights read from a backend copy, and their bytes from w_.bytes
  // (constructor).
  void release_copied_originals();
  std::shared_ptr<const ModelFile> file_;
  const ModelConfig& cfg_;
  ModelWeights w_;
  mutable MemoryTracker memory_;
  ops::WeightCopies bf16_copies_;  // the views of w_ point into these
  TrackedBytes bf16_tracked_;  // their bytes, in memory_
  ops::WeightCopies q8_copies_;  // likewise, the packed layout of q8 weights
  TrackedBytes q8_tracked_;
};

}  // namespace tinyloop::model
