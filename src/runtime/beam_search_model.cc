// Beam search over the looped model (see beam_search.h): the BeamModel that decodes each
// live beam, and beam_generate().
//
// KV scheme (paged blocks, model/kv_pool.h): the prompt is prefilled once into `prefix_`,
// which no beam ever writes. Each live beam owns a cache that shares the prompt's blocks
// (a clone of prefix_) and adds blocks for its generated tokens only. Every beam decodes
// token by token as generate() does, so the recurrence-shared layout works too.
// When several survivors share a parent, the first takes over the parent's cache and the
// others share the parent's blocks (KvCache::assign_from): nothing is copied at the reorder,
// and the parent's partial last block is copied only when a child first writes into it
// (copy-on-write). The prompt is never copied.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/batch_step.h"
#include "runtime/beam_search.h"
#include "runtime/decoder.h"
#include "runtime/early_exit.h"
#include "runtime/grammar_step.h"
#include "runtime/sampler.h"
#include "runtime/state_draw.h"

namespace tinyloop::runtime {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// generate()'s request with the length left to beam_search_core: a beam's decoder ends it
// on EOS, a stop sequence or the grammar, never on max_tokens.
GenerateRequest beam_request(const GenerateRequest& r) {
  GenerateRequest b = r;
  b.max_tokens = std::numeric_limits<int64_t>::max();
  return b;
}

// In place: logits[V] (float) -> log_softmax in double, out[V]. -inf stays -inf; a row with
// nothing finite becomes -inf everywhere (the beam cannot continue).
void log_softmax(const float* logits, int64_t V, double* out) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  double m = kNegInf;
  for (int64_t v = 0; v < V; ++v)
    if (!std::isnan(logits[v])) m = std::max(m, static_cast<double>(logits[v]));
  if (m == kNegInf || std::isinf(m)) {  // all masked (or +inf: degenerate, keep argmax-like)
    for (int64_t v = 0; v < V; ++v) out[v] = (std::isinf(m) && m > 0 && logits[v] == m) ? 0.0 : kNegInf;
    return;
  }
  double sum = 0;
  for (int64_t v = 0; v < V; ++v)
    if (!std::isnan(logits[v])) sum += std::exp(static_cast<double>(logits[v]) - m);
  const double lse = m + std::log(sum);
  for (int64_t v = 0; v < V; ++v) out[v] = std::isnan(logits[v]) ? kNegInf : static_cast<double>(logits[v]) - lse;
}

class LoopedBeamModel : public BeamModel {
 public:
  LoopedBeamModel(const Engine& e, const GenerateRequest& req, int64_t loops, int64_t beam_size, BeamMemory& mem)
      : e_(e), c_(e.config()), req_(req), loops_(loops), mem_(mem), scratch_(e.model()) {
    const auto P = static_cast<int64_t>(req.prompt.size());
    // Early exit's latest rule lives in cache slots, so it always decodes with a cache (as
    // generate() does); otherwise TINYLOOP_DISABLE_KV_CACHE re-runs every beam's sequence.
    // The recurrence-shared mode is defined by what the cache keeps (as in generate()).
    const bool shared_groups = req.kv_loop_slots > 0 && req.kv_loop_slots < loops;
    cached_ = !e.kv_cache_disabled() || req.early_exit.enabled() || shared_groups;
    draw_ = resolve_state_draw(c_, req.seed, req.init_scale);  // every beam: one sequence's state
    if (cached_) {
      prefix_ = std::make_unique<model::KvCache>(c_, loops, P, req.cache_window, e.kv_dtype(), &e.model().memory(), 0,
                                                 req.kv_loop_slots);
      prefix_->set_state_draw(draw_);
      e.model().forward(req.prompt.data(), P, *prefix_, model::LogitRows::Last, prompt_logits_, loops);
      tail_rows_ = std::max<int64_t>(1, req.max_tokens - 1);  // the last token is never decoded
      // One position, every slot, K and V (the blocks round this up by < one block per slot).
      const int64_t per_row = prefix_->slot_count() * prefix_->bytes_per_position_per_slot();
      mem_.prefix_bytes = per_row * P;
      mem_.tail_bytes = per_row * tail_rows_;
      const int64_t total = P + req.max_tokens, W = req.cache_window;
      const int64_t naive_rows =
          (W > 0 && W < total - model::KvCache::kWindowSlack) ? W + model::KvCache::kWindowSlack : total;
      mem_.naive_bytes = beam_size * per_row * naive_rows;
      mem_.peak_bytes = mem_.prefix_bytes;
    } else {
      full_forward(req.prompt, prompt_logits_);
    }
    beams_.push_back(Beam{{}, SequenceDecoder(c_, beam_request(req)), nullptr});
  }

  void log_probs(int64_t n, std::vector<double>& out) override {
    const int64_t V = c_.vocab_size;
    std::vector<std::vector<float>> logits(static_cast<size_t>(n));  // [n][V]
    std::vector<int64_t> depths(static_cast<size_t>(n), loops_);
    // Every live beam's next token in one step of the serving engine's forward (the weights
    // read once for all beams); the bare prompt's row is the prefill's.
    std::vector<StepPart> parts;
    std::vector<int64_t> part_beam;
    for (int64_t b = 0; b < n; ++b) {
      Beam& beam = beams_[b];
      if (beam.tokens.empty()) {
        logits[b] = prompt_logits_;  // the prefill never exits early
      } else if (!cached_) {
        std::vector<int32_t> seq = req_.prompt;
        seq.insert(seq.end(), beam.tokens.begin(), beam.tokens.end());
        full_forward(seq, logits[b]);
      } else {
        StepPart p;
        p.kv = beam.tail.get();
        p.tokens = &beam.tokens.back();
        p.n = 1;
        p.loops = loops_;
        p.early_exit = &req_.early_exit;
        p.want_logits = true;
        parts.push_back(p);
        part_beam.push_back(b);
      }
    }
    if (!parts.empty()) run_step(e_.model(), parts, scratch_);
    for (size_t i = 0; i < parts.size(); ++i) {
      logits[size_t(part_beam[i])].swap(parts[i].logits);
      depths[size_t(part_beam[i])] = parts[i].depth;
    }
    for (int64_t b = 0; b < n; ++b) {
      // Penalty -> grammar mask (the decoder's), then log-softmax; a full match no token can
      // extend ends the beam.
      if (!beams_[b].dec.process(logits[b].data()))
        std::fill(logits[b].begin(), logits[b].end(), -std::numeric_limits<float>::infinity());
      log_softmax(logits[b].data(), V, out.data() + b * V);
    }
    depth_log_.push_back(std::move(depths));
  }

  bool ends(int64_t b, int32_t token) override {
    SequenceDecoder d = beams_[b].dec;  // EOS, the grammar, stop sequences: generate()'s rules
    return d.emit(token, loops_) != FinishReason::None;
  }

  void select(const std::vector<int64_t>& parent, const std::vector<int32_t>& token) override {
    std::vector<Beam> next;
    next.reserve(parent.size());
    std::vector<int64_t> owner(beams_.size(), -1);  // old beam -> the child that took its tail
    for (size_t i = 0; i < parent.size(); ++i) {
      Beam& p = beams_[parent[i]];
      Beam child{p.tokens, p.dec, nullptr};
      child.tokens.push_back(token[i]);
      child.dec.emit(token[i], loops_);
      if (owner[parent[i]] < 0) {
        owner[parent[i]] = static_cast<int64_t>(i);
        child.tail = std::move(p.tail);  // the first child continues in its parent's tail
      }
      next.push_back(std::move(child));
    }
    if (cached_) {
      std::vector<std::unique_ptr<model::KvCache>> spare;  // tails of beams with no child
      for (Beam& b : beams_)
        if (b.tail) spare.push_back(std::move(b.tail));
      for (size_t i = 0; i < next.size(); ++i) {
        if (next[i].tail) continue;
        const Beam& first = next[owner[parent[i]]];
        std::unique_ptr<model::KvCache> t;
        if (!spare.empty()) {
          t = std::move(spare.back());
          spare.pop_back();
        } else {
          t = new_tail();
        }
        if (first.tail) {
          // Shares the parent's blocks; only its partial last block gets copied, when this
          // beam first writes into it (copy-on-write).
          t->assign_from(*first.tail);
          mem_.tail_rows_copied += (first.tail->length() % t->block_rows()) * t->slot_count();
        } else {
          t->assign_from(*prefix_);  // the parent is the bare prompt
        }
        next[i].tail = std::move(t);
      }
      // Children of the bare prompt: the first one took a null tail.
      for (Beam& b : next)
        if (!b.tail) b.tail = new_tail();
      int64_t live = 0;
      for (const Beam& b : next) live += b.tail ? 1 : 0;
      mem_.peak_tails = std::max(mem_.peak_tails, live + static_cast<int64_t>(spare.size()));
      mem_.peak_bytes = std::max(mem_.peak_bytes, mem_.prefix_bytes + mem_.peak_tails * mem_.tail_bytes);
    }
    beams_ = std::move(next);
  }

  // Loop depth behind the log-probs row of live beam `beam` at step `step` (0-based).
  int64_t depth(size_t step, int64_t beam) const { return depth_log_[step][beam]; }

 private:
  struct Beam {
    std::vector<int32_t> tokens;  // generated so far; the last is not yet in `tail`
    SequenceDecoder dec;  // penalty set, grammar state, stop rules after `tokens`
    std::unique_ptr<model::KvCache> tail;  // K/V of tokens[0 .. n-2] (null: bare prompt / uncached)
  };

  std::unique_ptr<model::KvCache> new_tail() {
    // The prompt's blocks shared (copy-on-write), room for the beam's own tokens.
    return prefix_->clone(nullptr, prefix_->length() + req_.max_tokens);
  }

  // Uncached reference path: the whole sequence through a fresh cache, last row's logits.
  void full_forward(const std::vector<int32_t>& seq, std::vector<float>& logits) const {
    const auto T = static_cast<int64_t>(seq.size());
    model::KvCache kv(c_, loops_, T, req_.cache_window, e_.kv_dtype(), &e_.model().memory());
    kv.set_state_draw(draw_);
    e_.model().forward(seq.data(), T, kv, model::LogitRows::Last, logits, loops_);
  }

  const Engine& e_;
  const ModelConfig& c_;
  const GenerateRequest& req_;
  int64_t loops_;
  BeamMemory& mem_;
  model::StateDraw draw_;
  StepScratch scratch_;
  bool cached_ = true;
  int64_t tail_rows_ = 1;
  std::unique_ptr<model::KvCache> prefix_;  // the prompt's K/V, read-only once prefilled
  std::vector<float> prompt_logits_;  // [V] after the prompt
  std::vector<Beam> beams_;
  std::vector<std::vector<int64_t>> depth_log_;  // [step][beam] loop depth of each row
};

}  // namespace

GenerateResult beam_generate(const Engine& engine, const GenerateRequest& req_in, const BeamParams& p,
                             const TokenCallback& on_token, BeamMemory* memory) {
  if (!p.active()) throw std::invalid_argument("beam_generate: beam_size must be >= 2");
  // Beam search is deterministic: temperature / top_k / top_p / seed are ignored, so they are
  // not validated either (as top_k under greedy decoding).
  GenerateRequest req = req_in;
  req.sampling.temperature = 0.0f;
  validate(engine, req);
  refuse_file_gate(engine.config(), "beam search");
  const int64_t loops = engine.resolve_loops(req.loops);
  validate(p);
  const auto t0 = Clock::now();

  BeamMemory mem;
  LoopedBeamModel m(engine, req, loops, p.beam_size, mem);
  GenerateResult res;
  res.prefill_ms = ms_since(t0);
  const BeamSearchResult r = beam_search_core(m, engine.config().vocab_size, req.max_tokens, p);

  // Stream the winner (the search cannot know it before the end).
  res.tokens = req.prompt;
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    res.tokens.push_back(r.tokens[i]);
    res.loops_per_token.push_back(m.depth(i, r.history[i]));
    const bool keep_going = on_token ? on_token(r.tokens[i]) : true;
    if (i == 0) res.first_token_ms = ms_since(t0);
    if (!keep_going) break;
  }
  res.tokens_emitted = static_cast<int64_t>(res.tokens.size() - req.prompt.size());
  if (res.tokens_emitted == 0) res.first_token_ms = ms_since(t0);
  res.decode_steady_ms = ms_since(t0) - res.first_token_ms;
  if (memory) *memory = mem;
  return res;
}

}  // namespace tinyloop::runtime
