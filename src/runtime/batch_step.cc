#include "runtime/batch_step.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {

void StepScratch::reserve(int64_t T) {
  if (T <= rows_) return;
  const int64_t D = m_.config().dim;
  ws.reserve(m_.config(), T);
  tokens.resize(size_t(T));
  pos.resize(size_t(T));
  apos.resize(size_t(T));
  atokens.resize(size_t(T));
  for (auto* b : {&x, &s, &xa, &sa, &prev, &probe}) b->resize(size_t(T * D));
  rows_ = T;
  tracked_ = model::TrackedBytes(&m_.memory(), ws.bytes() + 6 * T * D * int64_t(sizeof(float)));
}

namespace {

// Per part, while the step runs.
struct PartState {
  int64_t begin = 0;  // first row in the step
  int64_t done = 0;  // iterations applied
  int64_t stable = 0;  // consecutive stable probes
  bool exited = false;  // left the loop early
  bool have_logits = false;  // logits already read out by the probe that stopped it
  GateTracker gate;  // the exit gate's distribution over the last row's steps
  bool gate_picked = false;  // Threshold / Step chose an iteration before the last
  std::vector<float> gate_state;  // [D] that iteration's state (parts that keep looping)
  std::vector<float> gate_mix;  // [V] Weighted: sum of p_t * logits_t so far
  float gate_last_weight = 0;  // Weighted: p_L, applied to the final readout
};

// Copies rows [begin, begin + n) of src [*, D] to dst at row `at`.
void copy_rows(const float* src, int64_t begin, int64_t n, int64_t D, float* dst, int64_t at) {
  std::memcpy(dst + at * D, src + begin * D, sizeof(float) * size_t(n * D));
}

}  // namespace

void run_step(const model::LoopedModel& m, std::vector<StepPart>& parts, StepScratch& sc) {
  const ModelConfig& c = m.config();
  const int64_t D = c.dim, V = c.vocab_size;
  const int64_t P = static_cast<int64_t>(parts.size());
  if (P == 0) return;
  int64_t T = 0, max_loops = 0;
  for (StepPart& p : parts) {
    if (p.n < 1) throw std::invalid_argument("a step part needs at least one token");
    if (p.loops < 1 || p.loops > p.kv->loops())
      throw std::invalid_argument("a step part at " + std::to_string(p.loops) + " loops on a cache with slots for " +
                                  std::to_string(p.kv->loops()));
    if (p.early_exit && p.early_exit->enabled() && p.n != 1)
      throw std::invalid_argument("early exit decodes one token per step (prefill never exits early)");
    if (p.kv->length() + p.n > p.kv->capacity())
      throw std::logic_error("KV cache of capacity " + std::to_string(p.kv->capacity()) + " cannot hold position " +
                             std::to_string(p.kv->length() + p.n - 1));
    T += p.n;
    max_loops = std::max(max_loops, p.loops);
  }
  sc.reserve(T);
  std::vector<PartState> st(static_cast<size_t>(P));
  model::RowBatch all{sc.pos.data(), T, {}, sc.tokens.data()};
  all.groups.reserve(size_t(P));
  for (int64_t i = 0, t = 0; i < P; ++i) {
    StepPart& p = parts[size_t(i)];
    st[size_t(i)].begin = t;
    std::copy(p.tokens, p.tokens + p.n, sc.tokens.begin() + t);
    for (int64_t r = 0; r < p.n; ++r) sc.pos[size_t(t + r)] = p.kv->length() + r;
    all.groups.push_back({p.kv, t, p.n});
    t += p.n;
  }

  float* x = sc.x.data();  // [T, D]
  float* s = sc.s.data();  // [T, D]
  m.prelude(sc.tokens.data(), all, sc.ws, x);
  m.initial_state(x, all, s);

  auto in_loop = [&](int64_t i, int64_t it) { return !st[size_t(i)].exited && parts[size_t(i)].loops > it; };
  // The exit gate watches the last row of parts that want logits.
  auto gated = [&](int64_t i) {
    const StepPart& p = parts[size_t(i)];
    return p.want_logits && p.gate_exit && p.gate_exit->enabled();
  };
  auto probes = [&](int64_t i, int64_t n_after) {
    const StepPart& p = parts[size_t(i)];
    return in_loop(i, n_after - 1) && p.early_exit && p.early_exit->enabled() &&
           p.early_exit->probes_at(n_after, p.loops);
  };
  for (int64_t it = 0; it < max_loops; ++it) {
    // The rows still in the loop: every row, or a gathered subset.
    model::RowBatch sub{sc.apos.data(), 0, {}, sc.atokens.data()};
    for (int64_t i = 0; i < P; ++i)
      if (in_loop(i, it)) {
        const StepPart& p = parts[size_t(i)];
        sub.groups.push_back({p.kv, sub.T, p.n});
        sub.T += p.n;
      }
    if (sub.T == 0) break;
    // Hidden-L2 probes compare against the state before this iteration.
    for (int64_t i = 0; i < P; ++i)
      if (probes(i, it + 1) && !parts[size_t(i)].early_exit->margin_mode())
        copy_rows(s, st[size_t(i)].begin, 1, D, sc.prev.data(), st[size_t(i)].begin);
    if (sub.T == T) {
      m.iteration(it, s, x, all, sc.ws);
    } else {
      for (int64_t i = 0, a = 0; i < P; ++i) {
        if (!in_loop(i, it)) continue;
        const int64_t b = st[size_t(i)].begin, n = parts[size_t(i)].n;
        copy_rows(x, b, n, D, sc.xa.data(), a);
        copy_rows(s, b, n, D, sc.sa.data(), a);
        std::copy(sc.pos.begin() + b, sc.pos.begin() + b + n, sc.apos.begin() + a);
        std::copy(sc.tokens.begin() + b, sc.tokens.begin() + b + n, sc.atokens.begin() + a);
        a += n;
      }
      m.iteration(it, sc.sa.data(), sc.xa.data(), sub, sc.ws);
      for (int64_t i = 0, a = 0; i < P; ++i) {
        if (!in_loop(i, it)) continue;
        const int64_t b = st[size_t(i)].begin, n = parts[size_t(i)].n;
        copy_rows(sc.sa.data(), a, n, D, s, b);
        a += n;
      }
    }
    // Probes after it + 1 iterations. Margin probes read out the rows that ask (their
    // post slots are rewritten by the final readout unless they stop here).
    model::RowBatch pb{sc.apos.data(), 0, {}, sc.atokens.data()};
    std::vector<int64_t> probed, out_rows;  // parts probing in margin mode; their rows in pb
    for (int64_t i = 0; i < P; ++i) {
      if (!probes(i, it + 1)) continue;
      PartState& ps = st[size_t(i)];
      const StepPart& p = parts[size_t(i)];
      if (p.early_exit->margin_mode()) {
        copy_rows(s, ps.begin, 1, D, sc.probe.data(), pb.T);
        sc.apos[size_t(pb.T)] = sc.pos[size_t(ps.begin)];
        sc.atokens[size_t(pb.T)] = sc.tokens[size_t(ps.begin)];
        pb.groups.push_back({p.kv, pb.T, 1});
        out_rows.push_back(pb.T++);
        probed.push_back(i);
        continue;
      }
      const bool ok = hidden_stable(sc.prev.data() + ps.begin * D, s + ps.begin * D, D, p.early_exit->tau);
      ps.stable = ok ? ps.stable + 1 : 0;
    }
    if (!probed.empty()) {
      std::vector<float> pl(static_cast<size_t>(pb.T * V));  // [probed, V]
      m.readout(sc.probe.data(), pb, sc.ws, out_rows.data(), int64_t(out_rows.size()), pl.data());
      for (size_t k = 0; k < probed.size(); ++k) {
        const int64_t i = probed[k];
        PartState& ps = st[size_t(i)];
        StepPart& p = parts[size_t(i)];
        const bool ok = top_gap(pl.data() + k * V, V) > p.early_exit->logit_margin;
        ps.stable = ok ? ps.stable + 1 : 0;
        if (ps.stable >= p.early_exit->patience) {
          // The probe's readout is exactly what the token emits if it stops here.
          p.logits.assign(pl.begin() + int64_t(k) * V, pl.begin() + int64_t(k + 1) * V);
          ps.have_logits = true;
        }
      }
    }
    model::RowBatch gb{sc.apos.data(), 0, {}, sc.atokens.data()};  // Weighted gates: rows read out after this iteration
    std::vector<int64_t> mixing, gate_rows;  // their parts; their rows in gb
    for (int64_t i = 0; i < P; ++i) {
      if (!in_loop(i, it)) continue;
      PartState& ps = st[size_t(i)];
      ps.done = it + 1;
      const StepPart& p = parts[size_t(i)];
      if (p.early_exit && p.early_exit->enabled() && ps.stable >= p.early_exit->patience) ps.exited = true;
      if (!gated(i) || ps.gate_picked) continue;
      const GateExitParams& g = *p.gate_exit;
      const int64_t row = ps.begin + p.n - 1;
      const float w = ps.gate.observe(gate_logit(m, s + row * D), p.loops);
      if (g.mode == ExitGateMode::Weighted) {
        if (ps.done == p.loops) {
          ps.gate_last_weight = w;  // the final readout is logits_L
          continue;
        }
        if (ps.gate_mix.empty()) ps.gate_mix.assign(size_t(V), 0.0f);
        copy_rows(s, row, 1, D, sc.probe.data(), gb.T);
        sc.apos[size_t(gb.T)] = sc.pos[size_t(row)];
        sc.atokens[size_t(gb.T)] = sc.tokens[size_t(row)];
        gb.groups.push_back({p.kv, gb.T, 1});
        gate_rows.push_back(gb.T++);
        mixing.push_back(i);
        ps.gate_last_weight = w;  // this step's p_t, applied below
        continue;
      }
      if (ps.done < p.loops && ps.gate.exits_now(g, p.loops)) {
        if (p.n == 1 && p.gate_may_stop && g.stops_early()) {
          ps.exited = true;  // the saving: the loop stops, the state stays s_e
        } else {
          // A prompt runs on (every row needs every iteration's K/V, a one-row prompt too), as
          // does a token that keeps the reference's full K/V; keep s_e for its readout.
          ps.gate_state.assign(s + row * D, s + (row + 1) * D);
          ps.gate_picked = true;
        }
      }
    }
    if (!mixing.empty()) {
      std::vector<float> gl(static_cast<size_t>(gb.T * V));  // [mixing, V]
      m.readout(sc.probe.data(), gb, sc.ws, gate_rows.data(), int64_t(gate_rows.size()), gl.data());
      for (size_t k = 0; k < mixing.size(); ++k) {
        PartState& ps = st[size_t(mixing[k])];
        const float* lt = gl.data() + int64_t(k) * V;
        // In the reference's order: expected = p_1 logits_1 + p_2 logits_2 + ...
        for (int64_t v = 0; v < V; ++v) ps.gate_mix[size_t(v)] += ps.gate_last_weight * lt[v];
      }
    }
  }
  // A prompt whose gate picked an earlier iteration reads out from that state (its last row
  // only: no other row of the step attends to it after the loop, there are no post blocks).
  for (int64_t i = 0; i < P; ++i) {
    const PartState& ps = st[size_t(i)];
    if (ps.gate_picked)
      std::copy(ps.gate_state.begin(), ps.gate_state.end(), s + (ps.begin + parts[size_t(i)].n - 1) * D);
  }

  // Readout over every row (the post slots of every position), logits where wanted.
  std::vector<int64_t> out_rows;
  std::vector<int64_t> out_part;
  for (int64_t i = 0; i < P; ++i) {
    const StepPart& p = parts[size_t(i)];
    if (p.want_logits && !st[size_t(i)].have_logits) {
      out_rows.push_back(st[size_t(i)].begin + p.n - 1);
      out_part.push_back(i);
    }
  }
  std::vector<float> logits(out_rows.size() * size_t(V));  // [out, V]
  m.readout(s, all, sc.ws, out_rows.data(), int64_t(out_rows.size()), logits.data());
  for (size_t k = 0; k < out_part.size(); ++k)
    parts[size_t(out_part[k])].logits.assign(logits.begin() + int64_t(k) * V, logits.begin() + int64_t(k + 1) * V);
  for (int64_t i = 0; i < P; ++i) {
    const PartState& ps = st[size_t(i)];
    if (!gated(i) || parts[size_t(i)].gate_exit->mode != ExitGateMode::Weighted) continue;
    std::vector<float>& out = parts[size_t(i)].logits;  // [V] logits_L
    for (int64_t v = 0; v < V; ++v)
      out[size_t(v)] = (ps.gate_mix.empty() ? 0.0f : ps.gate_mix[size_t(v)]) + ps.gate_last_weight * out[size_t(v)];
  }

  for (int64_t i = 0; i < P; ++i) {
    StepPart& p = parts[size_t(i)];
    const PartState& ps = st[size_t(i)];
    p.depth = ps.done;
    const int64_t full = p.full_loops > 0 ? p.full_loops : p.loops;
    // The latest rule for the last row's skipped iterations (decode rows: n == 1).
    if (ps.done < full) fill_skipped_slots(*p.kv, ps.done, full, p.kv->length() + p.n - 1);
    if (!p.want_logits) p.logits.clear();
    p.kv->advance(p.n);
  }
}

}  // namespace tinyloop::runtime
