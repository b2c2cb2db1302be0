#include "runtime/serving_engine.h"

#include <chrono>
#include <cmath>
#include <string>

namespace tinyloop::runtime {
namespace {

double ms_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

model::KvPoolPtr make_pool(const Engine& e, const ServingOptions& o) {
  if (!(o.kv_budget_mb > 0) || !std::isfinite(o.kv_budget_mb) || o.kv_budget_mb > (1 << 30))
    throw std::invalid_argument("kv_budget_mb must be a positive number of MiB, got " + std::to_string(o.kv_budget_mb));
  if (o.kv_block_size < 1 || o.kv_block_size > 4096)
    throw std::invalid_argument("kv_block_size must be in [1, 4096], got " + std::to_string(o.kv_block_size));
  if (o.max_queue < 1) throw std::invalid_argument("max_queue must be >= 1, got " + std::to_string(o.max_queue));
  const model::KvBlockLayout block(e.config(), e.kv_dtype(), o.kv_block_size);
  const double blocks = o.kv_budget_mb * double(1 << 20) / double(block.bytes);
  if (blocks < 1)
    throw std::invalid_argument("kv_budget_mb " + std::to_string(o.kv_budget_mb) + " holds no KV block (one block is " +
                                std::to_string(block.bytes) + " bytes)");
  const int64_t n = static_cast<int64_t>(std::min(blocks, double(INT32_MAX)));
  // Blocks in extents (kv_pool.h), so that a sequence's blocks of a slot sit side by side
  // where the pool can place them: when the budget holds 8 extents or more (the pool then
  // rounds it down to whole extents, under an eighth of it); a smaller pool keeps single
  // blocks.
  const int64_t extent = model::serving_extent_blocks(o.kv_block_size);
  const model::KvBlockLayout layout(e.config(), e.kv_dtype(), o.kv_block_size, n >= 8 * extent ? extent : 1);
  return std::make_shared<model::KvPool>(layout, n, n, &e.model().memory());
}

SchedulerOptions scheduler_options(const ServingOptions& o) {
  SchedulerOptions s;
  s.max_num_seqs = o.max_num_seqs;
  s.max_batch_tokens = o.max_batch_tokens;
  s.prefill_chunk = o.prefill_chunk;
  s.prefix_caching = o.prefix_caching;
  return s;
}

}  // namespace

double RequestResult::mean_loops() const {
  if (loops_per_token.empty()) return 0.0;
  double sum = 0;
  for (int64_t l : loops_per_token) sum += double(l);
  return sum / double(loops_per_token.size());
}

ServingEngine::ServingEngine(std::shared_ptr<const Engine> engine, const ServingOptions& opts)
    : engine_(std::move(engine)),
      opts_(opts),
      pool_(make_pool(*engine_, opts_)),
      scheduler_(*engine_, pool_, scheduler_options(opts_)),
      scratch_(engine_->model()) {
  stats_.kv_blocks_total = pool_->max_blocks();
  stats_.kv_block_bytes = pool_->layout().bytes;
  thread_ = std::thread([this] { loop(); });
}

ServingEngine::~ServingEngine() { shutdown(false); }

uint64_t ServingEngine::submit(GenerateRequest req, std::shared_ptr<RequestSink> sink, double timeout_s) {
  validate(*engine_, req);
  if (!(timeout_s >= 0) || timeout_s > 1e9)
    throw std::invalid_argument("timeout must be >= 0 seconds, got " + std::to_string(timeout_s));
  if (!sink) throw std::invalid_argument("submit needs a sink for the output");
  const int64_t loops = engine_->resolve_loops(req.loops);
  const int64_t need = scheduler_.max_blocks(req, loops);
  if (need > pool_->max_blocks())
    throw std::invalid_argument("the request needs up to " + std::to_string(need) + " KV blocks (" +
                                std::to_string((need * pool_->layout().bytes) >> 20) + " MiB) but the pool holds " +
                                std::to_string(pool_->max_blocks()) +
                                ": lower max_tokens or loops, or raise kv_budget_mb");
  const int64_t P = static_cast<int64_t>(req.prompt.size());
  std::unique_lock<std::mutex> lock(mu_);
  if (!accepting_) throw QueueFull("the engine is shutting down and takes no new requests");
  if (static_cast<int64_t>(inbox_.size()) + stats_.waiting >= opts_.max_queue)
    throw QueueFull("the request queue is full (" + std::to_string(opts_.max_queue) + " waiting): retry later");
  const uint64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(req), loops, engine_->config(), std::move(sink));
  if (timeout_s > 0)
    seq->deadline =
        seq->arrival + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(timeout_s));
  live_[id] = seq.get();
  inbox_.push_back(std::move(seq));
  ++stats_.requests_submitted;
  stats_.prompt_tokens += P;
  lock.unlock();
  cv_.notify_one();
  return id;
}

void ServingEngine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;
    it->second->cancel_requested.store(true, std::memory_order_relaxed);
  }
  cv_.notify_one();
}

void ServingEngine::shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stop_ = true;
    drain_ = drain_ || drain;
  }
  cv_.notify_one();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

ServingStats ServingEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ServingStats s = stats_;
  s.waiting += static_cast<int64_t>(inbox_.size());
  s.kv_blocks_used = pool_->used_blocks();
  return s;
}

void ServingEngine::clear_prefix_cache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    clear_cache_ = true;
  }
  cv_.notify_one();
}

void ServingEngine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || clear_cache_ || !inbox_.empty() || !scheduler_.idle(); });
      for (auto& s : inbox_) scheduler_.add(std::move(s));
      inbox_.clear();
      if (clear_cache_) {
        scheduler_.prefix_index().clear();
        clear_cache_ = false;
        publish_cache_stats();
      }
      if (stop_ && (!drain_ || scheduler_.idle())) break;
    }
    step();
  }
  for (Sequence* s : scheduler_.all()) finish(s, FinishReason::Cancelled);
  scheduler_.prefix_index().clear();
  std::lock_guard<std::mutex> lock(mu_);
  publish_cache_stats();
}

void ServingEngine::publish_cache_stats() {
  const PrefixIndexStats& p = scheduler_.prefix_index().stats();
  stats_.prefix_queries = p.queries;
  stats_.prefix_hits = p.hits;
  stats_.prefix_hit_tokens = p.hit_tokens;
  stats_.prefix_cached_positions = p.cached_blocks;
  stats_.kv_blocks_cached = scheduler_.prefix_index().held_blocks();
}

void ServingEngine::finish(Sequence* s, FinishReason reason, const std::string& error) {
  const auto now = SteadyClock::now();
  RequestResult r;
  r.id = s->id;
  r.tokens = s->decoder.emitted();
  r.loops_per_token = s->decoder.depths();
  r.logprobs = s->decoder.logprobs();
  r.finish_reason = reason;
  r.error = error;
  r.prompt_tokens = s->prompt_len();
  const bool scheduled = s->scheduled.time_since_epoch().count() != 0;
  r.queue_ms = ms_between(s->arrival, scheduled ? s->scheduled : now);
  r.first_token_ms = r.tokens.empty() ? 0.0 : ms_between(s->arrival, s->first_token);
  r.total_ms = ms_between(s->arrival, now);
  r.preemptions = s->preemptions;
  // The sequence (and its blocks) and the counters first: whoever waits on the sink sees
  // the pool and the stats already reflect the end.
  std::shared_ptr<RequestSink> sink = s->sink;
  const uint64_t id = s->id;
  scheduler_.remove(s);  // destroys s
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(id);
    ++stats_.requests_finished;
    if (reason == FinishReason::Cancelled) ++stats_.requests_cancelled;
    if (reason == FinishReason::Error) ++stats_.requests_failed;
    if (reason == FinishReason::Timeout) ++stats_.requests_timed_out;
    stats_.running = scheduler_.running();
    stats_.waiting = scheduler_.waiting();
  }
  try {
    sink->on_finish(r);
  } catch (...) {
    // A sink that throws must not take the engine down; the request is over either way.
  }
}

void ServingEngine::step() {
  const auto now = SteadyClock::now();
  std::vector<Dropped> dropped;
  std::vector<PlannedPart> plan = scheduler_.plan(now, dropped);
  for (const Dropped& d : dropped) finish(d.seq, d.reason);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = scheduler_.running();
    stats_.waiting = scheduler_.waiting();
    stats_.preemptions = scheduler_.preemptions();
  }
  if (plan.empty()) {
    // Nothing could be scheduled this round (every remaining request was just dropped, or
    // the head of the queue waits for blocks that finishing requests will free).
    if (!scheduler_.idle() && dropped.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  std::vector<StepPart> parts(plan.size());
  int64_t rows = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    StepPart& p = parts[i];
    p.kv = s.kv.get();
    p.tokens = s.tokens.data() + s.computed();
    p.n = plan[i].n;
    p.loops = plan[i].loops;
    p.full_loops = s.loops;
    p.early_exit = plan[i].early_exit ? &s.req.early_exit : nullptr;
    p.gate_exit = plan[i].gate_exit ? &s.gate : nullptr;
    p.gate_may_stop = plan[i].decode_row;
    p.want_logits = plan[i].want_logits;
    rows += p.n;
  }
  std::vector<int64_t> before(plan.size());  // positions each held before the step
  for (size_t i = 0; i < plan.size(); ++i) before[i] = plan[i].seq->computed();
  try {
    run_step(engine_->model(), parts, scratch_);
  } catch (const std::exception& e) {
    // The step's caches are in an unknown state: fail its requests, keep serving the rest.
    for (const PlannedPart& p : plan) finish(p.seq, FinishReason::Error, e.what());
    return;
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    const Sequence& s = *plan[i].seq;
    if (before[i] < s.prompt_len() && s.computed() >= s.prompt_len()) scheduler_.prompt_done(s);
  }
  const auto after = SteadyClock::now();
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].want_logits) continue;
    Sequence& s = *plan[i].seq;
    FinishReason why = FinishReason::None;
    try {
      const std::optional<int32_t> tok = s.decoder.choose(parts[i].logits.data());
      if (!tok) {
        finish(&s, FinishReason::Grammar);
        continue;
      }
      s.tokens.push_back(*tok);
      why = s.decoder.emit(*tok, parts[i].depth);
      if (s.decoder.emitted().size() == 1) s.first_token = after;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.generated_tokens;
        stats_.loops_run += parts[i].depth;
      }
      s.sink->on_token(*tok, parts[i].depth, s.decoder.wants_logprobs() ? &s.decoder.logprobs().back() : nullptr);
    } catch (const std::exception& e) {
      finish(&s, FinishReason::Error, e.what());
      continue;
    }
    if (why != FinishReason::None) finish(&s, why);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.step_rows += rows;
  publish_cache_stats();
  stats_.running = scheduler_.running();
  stats_.waiting = scheduler_.waiting();
}

}  // namespace tinyloop::runtime
