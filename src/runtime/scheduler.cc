#include "runtime/scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tinyloop::runtime {
namespace {

// Inserts s keeping `v` in arrival order.
template <class C>
void insert_by_arrival(C& v, std::unique_ptr<Sequence> s) {
  auto at =
      std::upper_bound(v.begin(), v.end(), s->arrival,
                       [](SteadyClock::time_point t, const std::unique_ptr<Sequence>& x) { return t < x->arrival; });
  v.insert(at, std::move(s));
}

bool shared_groups(const Sequence& s) { return s.req.kv_loop_slots > 0 && s.req.kv_loop_slots < s.loops; }

}  // namespace

Scheduler::Scheduler(const Engine& e, model::KvPoolPtr pool, SchedulerOptions opts)
    : e_(e), pool_(std::move(pool)), opts_(opts) {
  if (opts_.max_num_seqs < 1) throw std::invalid_argument("max_num_seqs must be >= 1");
  if (opts_.max_batch_tokens < 1) throw std::invalid_argument("max_batch_tokens must be >= 1");
  if (opts_.prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be >= 1");
}

void Scheduler::add(std::unique_ptr<Sequence> s) { insert_by_arrival(waiting_, std::move(s)); }

void Scheduler::remove(Sequence* s) {
  auto drop = [&](auto& v) {
    for (auto it = v.begin(); it != v.end(); ++it)
      if (it->get() == s) {
        v.erase(it);
        return true;
      }
    return false;
  };
  if (!drop(running_)) drop(waiting_);
}

std::vector<Sequence*> Scheduler::all() const {
  std::vector<Sequence*> out;
  for (const auto& s : running_) out.push_back(s.get());
  for (const auto& s : waiting_) out.push_back(s.get());
  return out;
}

int64_t Scheduler::max_blocks(const GenerateRequest& r, int64_t loops) const {
  const model::SlotLayout layout(e_.config(), loops, r.kv_loop_slots);
  const int64_t rows = pool_->layout().rows;
  const int64_t cap = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  const int64_t per_slot = r.cache_window > 0
                               ? std::min(model::KvCache::window_blocks(r.cache_window, rows), (cap + rows - 1) / rows)
                               : (cap + rows - 1) / rows;
  return layout.count() * per_slot;
}

void Scheduler::ensure_cache(Sequence& s) {
  if (!s.kv)
    s.kv = std::make_unique<model::KvCache>(e_.config(), s.loops, s.prompt_len() + s.req.max_tokens, s.req.cache_window,
                                            e_.kv_dtype(), &e_.model().memory(), 0, s.req.kv_loop_slots, pool_);
  s.kv->set_state_draw(s.draw);
  if (opts_.prefix_caching && s.computed() == 0) index_.adopt(s);
}

bool Scheduler::make_room(int64_t n) {
  while (!pool_->can_allocate(n))
    if (!index_.evict_one()) return false;
  return true;
}

void Scheduler::prompt_done(const Sequence& s) {
  if (opts_.prefix_caching) index_.insert(s);
}

PlannedPart Scheduler::next_part(Sequence& s, int64_t budget, bool first) const {
  PlannedPart p;
  p.seq = &s;
  p.loops = s.loops;
  const int64_t P = s.prompt_len(), c = s.computed();
  const int64_t total = static_cast<int64_t>(s.tokens.size());
  // A windowed cache holds window_blocks() only while it feeds <= kWindowSlack rows a step.
  int64_t chunk = std::min(opts_.prefill_chunk, budget);
  if (s.req.cache_window > 0) chunk = std::min(chunk, model::KvCache::kWindowSlack);
  if (c < P) {
    // The prompt. With shared slot groups a chunk boundary would change the K/V (a later
    // chunk sees the groups' last iteration, one forward sees each iteration's own), so the
    // whole prompt goes in one step: when it is the first part, even over the budget.
    int64_t n = P - c;
    if (shared_groups(s)) {
      if (n > budget && !first) return p;
    } else {
      n = std::min(n, chunk);
    }
    p.n = n;
    p.want_logits = c + n == total;
    p.gate_exit = p.want_logits;
    return p;
  }
  if (c == total - 1) {  // the last emitted token: a decode row
    p.n = 1;
    p.early_exit = s.req.early_exit.enabled();
    p.gate_exit = true;
    p.decode_row = true;
    p.want_logits = true;
    return p;
  }
  // A replay of emitted tokens after preemption. Rows that ran at full depth in one
  // forward regardless of their batch can go in chunks; with early exit or shared groups
  // each row replays alone at the depth it ran (the depth behind the next token).
  if (!s.req.early_exit.enabled() && !s.gate.stops_early() && !shared_groups(s)) {
    p.n = std::min(total - c, chunk);
    p.want_logits = c + p.n == total;
    p.gate_exit = p.want_logits;
    return p;
  }
  p.n = 1;
  p.loops = s.decoder.depths()[size_t(c - P + 1)];
  return p;
}

Sequence* Scheduler::preempt_latest(const std::vector<PlannedPart>& planned, const Sequence* except) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* s = it->get();
    if (s == except) continue;
    bool is_planned = false;
    for (const PlannedPart& p : planned) is_planned |= p.seq == s;
    if (is_planned) continue;
    std::unique_ptr<Sequence> owned = std::move(*it);
    running_.erase(std::next(it).base());
    owned->kv->release_all();
    ++owned->preemptions;
    ++preemptions_;
    insert_by_arrival(waiting_, std::move(owned));
    return s;
  }
  return nullptr;
}

std::vector<PlannedPart> Scheduler::plan(SteadyClock::time_point now, std::vector<Dropped>& dropped) {
  dropped.clear();
  auto is_dropped = [&](const Sequence* s) {
    for (const Dropped& d : dropped)
      if (d.seq == s) return true;
    return false;
  };
  auto check = [&](Sequence* s) {
    if (s->cancel_requested.load(std::memory_order_relaxed)) dropped.push_back({s, FinishReason::Cancelled});
    else if (now > s->deadline) dropped.push_back({s, FinishReason::Timeout});
  };
  for (const auto& s : running_) check(s.get());
  for (const auto& s : waiting_) check(s.get());

  std::vector<PlannedPart> parts;
  int64_t budget = opts_.max_batch_tokens;
  // 1. Running sequences, earliest arrival first; a sequence short of blocks takes them
  // from the latest arrival not yet planned (possibly itself).
  std::vector<Sequence*> order;  // running_ may lose members to preemption as we go
  for (const auto& s : running_) order.push_back(s.get());
  auto is_running = [&](const Sequence* s) {
    for (const auto& r : running_)
      if (r.get() == s) return true;
    return false;
  };
  for (Sequence* sp : order) {
    if (budget <= 0) break;
    Sequence& s = *sp;
    if (is_dropped(&s) || !is_running(&s)) continue;
    PlannedPart p = next_part(s, budget, parts.empty());
    if (p.n == 0) continue;
    const int64_t end = s.computed() + p.n;
    bool self_preempted = false;
    while (!make_room(s.kv->blocks_needed(end))) {
      if (!preempt_latest(parts, &s)) {  // nobody else to take from: s waits itself
        preempt_latest(parts, nullptr);
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // every later arrival was preempted before it
    s.kv->reserve(end);
    if (!s.scheduled.time_since_epoch().count()) s.scheduled = now;
    parts.push_back(p);
    budget -= p.n;
  }
  // 2. Waiting sequences join in arrival order while there is room (a 1% block watermark
  // keeps admissions from forcing preemptions at the very next step).
  const int64_t watermark = std::max<int64_t>(1, pool_->max_blocks() / 100);
  size_t w = 0;
  while (w < waiting_.size() && static_cast<int64_t>(running_.size()) < opts_.max_num_seqs && budget > 0) {
    Sequence& s = *waiting_[w];
    if (is_dropped(&s)) {
      ++w;
      continue;
    }
    ensure_cache(s);
    PlannedPart p = next_part(s, budget, parts.empty());
    if (p.n == 0) break;
    const int64_t end = s.computed() + p.n;
    const int64_t need = s.kv->blocks_needed(end);
    // With nothing running the request must go (it fits the pool: checked at submit).
    if (!make_room(need + (running_.empty() ? 0 : watermark))) break;
    s.kv->reserve(end);
    if (!s.scheduled.time_since_epoch().count()) s.scheduled = now;
    std::unique_ptr<Sequence> owned = std::move(waiting_[w]);
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    insert_by_arrival(running_, std::move(owned));
    parts.push_back(p);
    budget -= p.n;
  }
  return parts;
}

}  // namespace tinyloop::runtime
