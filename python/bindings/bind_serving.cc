// The serving engine (runtime/serving_engine.h): tl.SamplingParams, tl.Engine,
// tl.RequestHandle, tl.RequestOutput. The engine thread never touches Python: each request's
// output goes to a C++ queue (QueueSink) that the handle drains with the GIL released, and
// an eventfd per request tells an asyncio loop when there is something to read
// (tinyloop.engine.AsyncEngine).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <climits>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "runtime/serving_engine.h"
#include "runtime/state_draw.h"

namespace tinyloop::py_bind {
namespace {

using runtime::FinishReason;
using runtime::RequestResult;

// Everything of a request but its prompt, validated as far as it can be without a model.
struct PySamplingParams {
  runtime::GenerateRequest req;
  double timeout_s = 0;
};

// A request's output queue, filled by the engine thread, drained by Python.
class QueueSink : public runtime::RequestSink {
 public:
  QueueSink() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~QueueSink() override { close(fd_); }
  void on_token(int32_t token, int64_t depth, const runtime::TokenLogprobs* lp) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(token);
      depth_queue_.push_back(depth);
      if (lp) lp_queue_.push_back(*lp);
    }
    signal();
  }
  void on_finish(const RequestResult& r) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      result_ = r;
      done_ = true;
    }
    signal();
  }
  // Blocks (call without the GIL) until a token or the end; nullopt at the end.
  std::optional<int32_t> next() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !queue_.empty() || done_; });
    if (queue_.empty()) return std::nullopt;
    const int32_t t = queue_.front();
    queue_.pop_front();
    depth_queue_.pop_front();
    if (!lp_queue_.empty()) lp_queue_.pop_front();  // iteration gives ids only
    return t;
  }
  // Tokens that arrived since the last call, without waiting.
  std::vector<int32_t> poll() {
    uint64_t v;
    while (read(fd_, &v, sizeof v) > 0) {}
    std::lock_guard<std::mutex> l(mu_);
    std::vector<int32_t> out(queue_.begin(), queue_.end());
    queue_.clear();
    depth_queue_.clear();
    lp_queue_.clear();
    return out;
  }
  // One token as poll_detail() reports it.
  struct Detail {
    int32_t token;
    int64_t loops;  // iterations behind it (early exit lowers it)
    runtime::TokenLogprobs logprobs;  // NaN and no alternatives when not asked for
  };
  // poll() with each token's loop depth and log-probabilities.
  std::vector<Detail> poll_detail() {
    uint64_t v;
    while (read(fd_, &v, sizeof v) > 0) {}
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Detail> out;
    for (size_t i = 0; i < queue_.size(); ++i)
      out.push_back({queue_[i], depth_queue_[i],
                     i < lp_queue_.size() ? lp_queue_[i] : runtime::TokenLogprobs{std::nanf(""), {}}});
    queue_.clear();
    depth_queue_.clear();
    lp_queue_.clear();
    return out;
  }
  // Waits up to timeout_s (< 0: forever) for the end; false when it timed out.
  bool wait(double timeout_s) {
    std::unique_lock<std::mutex> l(mu_);
    if (timeout_s < 0) {
      cv_.wait(l, [&] { return done_; });
      return true;
    }
    return cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return done_; });
  }
  bool done() const {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  // The end, once done() (empty tokens until then).
  RequestResult result() const {
    std::lock_guard<std::mutex> l(mu_);
    return result_;
  }
  int fd() const { return fd_; }

 private:
  void signal() {
    cv_.notify_all();
    const uint64_t one = 1;
    (void)!write(fd_, &one, sizeof one);
  }
  int fd_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int32_t> queue_;
  std::deque<int64_t> depth_queue_;  // beside queue_: loops behind each token
  std::deque<runtime::TokenLogprobs> lp_queue_;  // beside queue_ when the request wants logprobs
  RequestResult result_;
  bool done_ = false;
};

// tl.Engine: the ServingEngine plus the model it serves.
class PyServingEngine {
 public:
  PyServingEngine(std::shared_ptr<const runtime::Engine> e, const runtime::ServingOptions& o)
      : engine_(std::make_shared<runtime::ServingEngine>(std::move(e), o)) {}
  std::shared_ptr<runtime::ServingEngine> get() const {
    std::lock_guard<std::mutex> l(mu_);
    if (!engine_) throw std::runtime_error("engine was closed");
    return engine_;
  }
  void close(bool drain) {
    std::shared_ptr<runtime::ServingEngine> e;
    {
      std::lock_guard<std::mutex> l(mu_);
      e.swap(engine_);
    }
    if (!e) return;
    py::gil_scoped_release nogil;
    e->shutdown(drain);
    e.reset();
  }
  ~PyServingEngine() {
    if (engine_) engine_->shutdown(false);  // sinks are C++ only: no GIL needed
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<runtime::ServingEngine> engine_;
};

struct PyHandle {
  uint64_t id;
  std::shared_ptr<QueueSink> sink;
  std::weak_ptr<runtime::ServingEngine> engine;
  int64_t prompt_tokens;
};

// RequestOutput.finish_reason strings follow OpenAI's where they exist ("stop" for EOS, a
// stop sequence or a finished grammar; "length"), and name the rest.
const char* openai_reason(FinishReason r) {
  switch (r) {
    case FinishReason::Eos:
    case FinishReason::Stop:
    case FinishReason::Grammar: return "stop";
    default: return runtime::finish_reason_name(r);
  }
}

PySamplingParams make_params(int64_t max_tokens, std::optional<int64_t> loops, double temperature, int64_t top_k,
                             double top_p, int64_t cache_window, double repetition_penalty,
                             const py::object& stop_sequences, int64_t early_exit_patience, int64_t early_exit_min_L,
                             double early_exit_tau, int64_t early_exit_peek_every, double early_exit_logit_margin,
                             const py::object& grammar, std::optional<uint64_t> seed, bool stop_at_eos,
                             int64_t kv_loop_slots, double timeout_s, double presence_penalty, double frequency_penalty,
                             std::optional<int64_t> logprobs, double init_scale,
                             const std::optional<std::string>& exit_gate, std::optional<double> exit_gate_threshold,
                             std::optional<int64_t> exit_gate_step, const std::optional<std::string>& exit_gate_kv) {
  PySamplingParams p;
  fill_request(p.req, max_tokens, loops, temperature, top_k, top_p, cache_window, repetition_penalty, stop_sequences,
               seed, stop_at_eos);
  p.req.early_exit = early_exit_params(early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                       early_exit_logit_margin);
  p.req.kv_loop_slots = kv_loop_slots;
  p.req.init_scale = init_scale;
  p.req.exit_gate = gate_request(exit_gate, exit_gate_threshold, exit_gate_step, exit_gate_kv);
  runtime::validate(p.req.exit_gate);  // the model-dependent checks come at submit
  if (!std::isfinite(init_scale) || init_scale < 0 || init_scale > runtime::kMaxInitScale)
    throw py::value_error("init_scale must be a finite number in [0, 1e6], got " + std::to_string(init_scale));
  p.req.sampling.presence_penalty = static_cast<float>(presence_penalty);
  p.req.sampling.frequency_penalty = static_cast<float>(frequency_penalty);
  if (logprobs) {
    if (*logprobs < 0 || *logprobs > runtime::kMaxTopLogprobs)
      throw py::value_error("logprobs must be in [0, " + std::to_string(runtime::kMaxTopLogprobs) + "] or None, got " +
                            std::to_string(*logprobs));
    p.req.logprobs = static_cast<int>(*logprobs);
  }
  if (!grammar.is_none()) {
    try {
      p.req.grammar = grammar.cast<std::shared_ptr<grammar::Grammar>>();
    } catch (const py::cast_error&) {
      throw py::value_error("grammar must be a tinyloop_py.Grammar or None");
    }
  }
  // What can be checked without a model, now (the rest at submit).
  if (max_tokens < 1) throw py::value_error("max_tokens must be >= 1, got " + std::to_string(max_tokens));
  if (loops && (*loops < 1 || *loops > kMaxLoops))
    throw py::value_error("loops must be in [1, " + std::to_string(kMaxLoops) + "], got " + std::to_string(*loops));
  if (cache_window < 0) throw py::value_error("cache_window must be >= 0, got " + std::to_string(cache_window));
  if (kv_loop_slots < 0) throw py::value_error("kv_loop_slots must be >= 0, got " + std::to_string(kv_loop_slots));
  if (!(timeout_s >= 0) || timeout_s > 1e9)
    throw py::value_error("timeout must be >= 0 seconds, got " + std::to_string(timeout_s));
  runtime::validate(p.req.sampling);
  runtime::validate(p.req.early_exit);
  p.timeout_s = timeout_s;
  return p;
}

py::object params_arg(const py::object& params, const py::kwargs& kwargs) {
  if (!params.is_none() && kwargs.size() > 0)
    throw py::value_error("pass either params=SamplingParams(...) or keyword arguments, not both");
  if (!params.is_none()) {
    if (!py::isinstance<PySamplingParams>(params)) throw py::value_error("params must be a tinyloop_py.SamplingParams");
    return params;
  }
  return py::module_::import("tinyloop_py").attr("SamplingParams")(**kwargs);
}

PyHandle submit(const PyServingEngine& self, const py::object& prompt, const PySamplingParams& params) {
  auto eng = self.get();
  runtime::GenerateRequest req = params.req;
  req.prompt = to_ids(prompt, "prompt");
  auto sink = std::make_shared<QueueSink>();
  const auto P = static_cast<int64_t>(req.prompt.size());
  uint64_t id;
  {
    py::gil_scoped_release nogil;
    id = eng->submit(std::move(req), sink, params.timeout_s);
  }
  return PyHandle{id, sink, eng, P};
}

py::dict stats_dict(const runtime::ServingStats& s) {
  py::dict d;
  d["running"] = s.running;
  d["waiting"] = s.waiting;
  d["kv_blocks_used"] = s.kv_blocks_used;
  d["kv_blocks_total"] = s.kv_blocks_total;
  d["kv_block_bytes"] = s.kv_block_bytes;
  d["requests_submitted"] = s.requests_submitted;
  d["requests_finished"] = s.requests_finished;
  d["requests_cancelled"] = s.requests_cancelled;
  d["requests_failed"] = s.requests_failed;
  d["requests_timed_out"] = s.requests_timed_out;
  d["prompt_tokens"] = s.prompt_tokens;
  d["generated_tokens"] = s.generated_tokens;
  d["steps"] = s.steps;
  d["step_rows"] = s.step_rows;
  d["mean_batch_rows"] = s.mean_batch_rows();
  d["mean_loops"] = s.mean_loops();
  d["preemptions"] = s.preemptions;
  d["prefix_queries"] = s.prefix_queries;
  d["prefix_hits"] = s.prefix_hits;
  d["prefix_hit_tokens"] = s.prefix_hit_tokens;
  d["prefix_cached_positions"] = s.prefix_cached_positions;
  d["kv_blocks_cached"] = s.kv_blocks_cached;
  return d;
}

}  // namespace

void bind_serving(py::module_& m) {
  py::class_<PySamplingParams>(m, "SamplingParams", R"doc(
Generation parameters of one request to a tl.Engine: the keyword arguments of
Model.generate (same names, defaults and ranges), plus timeout (seconds from submit; 0 =
none), presence_penalty / frequency_penalty (OpenAI's, in [-2, 2], over the generated tokens:
logit -= presence * [count > 0] + frequency * count, after the repetition penalty) and
logprobs (None, or 0..20: every generated token then carries its log-probability and that
many most probable alternatives, from the logits after penalties and grammar mask, before
temperature; RequestOutput.logprobs, RequestHandle.poll_detail()) and init_scale (Model.generate's). Validated here as far as possible without a model (ValueError naming the argument),
the rest (token ids, loops against the KV budget, grammar vocabulary) at submit. Every
attribute can be read and set.)doc")
      .def(py::init(&make_params), py::kw_only(), py::arg("max_tokens") = 64, py::arg("loops") = py::none(),
           py::arg("temperature") = 0.0, py::arg("top_k") = 50, py::arg("top_p") = 1.0, py::arg("cache_window") = 0,
           py::arg("repetition_penalty") = 1.0, py::arg("stop_sequences") = py::none(),
           py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3,
           py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0,
           py::arg("grammar") = py::none(), py::arg("seed") = py::none(), py::arg("stop_at_eos") = true,
           py::arg("kv_loop_slots") = 0, py::arg("timeout") = 0.0, py::arg("presence_penalty") = 0.0,
           py::arg("frequency_penalty") = 0.0, py::arg("logprobs") = py::none(), py::arg("init_scale") = 1.0,
           py::arg("exit_gate") = py::none(), py::arg("exit_gate_threshold") = py::none(),
           py::arg("exit_gate_step") = py::none(), py::arg("exit_gate_kv") = py::none())
      .def_property(
          "max_tokens", [](const PySamplingParams& p) { return p.req.max_tokens; },
          [](PySamplingParams& p, int64_t v) { p.req.max_tokens = v; })
      .def_property(
          "loops", [](const PySamplingParams& p) { return p.req.loops; },
          [](PySamplingParams& p, std::optional<int64_t> v) { p.req.loops = v; })
      .def_property(
          "temperature", [](const PySamplingParams& p) { return p.req.sampling.temperature; },
          [](PySamplingParams& p, float v) { p.req.sampling.temperature = v; })
      .def_property(
          "top_k", [](const PySamplingParams& p) { return p.req.sampling.top_k; },
          [](PySamplingParams& p, int v) { p.req.sampling.top_k = v; })
      .def_property(
          "top_p", [](const PySamplingParams& p) { return p.req.sampling.top_p; },
          [](PySamplingParams& p, float v) { p.req.sampling.top_p = v; })
      .def_property(
          "repetition_penalty", [](const PySamplingParams& p) { return p.req.sampling.repetition_penalty; },
          [](PySamplingParams& p, float v) { p.req.sampling.repetition_penalty = v; })
      .def_property(
          "cache_window", [](const PySamplingParams& p) { return p.req.cache_window; },
          [](PySamplingParams& p, int64_t v) { p.req.cache_window = v; })
      .def_property(
          "kv_loop_slots", [](const PySamplingParams& p) { return p.req.kv_loop_slots; },
          [](PySamplingParams& p, int64_t v) { p.req.kv_loop_slots = v; })
      .def_property(
          "init_scale", [](const PySamplingParams& p) { return p.req.init_scale; },
          [](PySamplingParams& p, double v) { p.req.init_scale = v; })
      .def_property(
          "exit_gate",
          [](const PySamplingParams& p) -> std::optional<std::string> {
            if (!p.req.exit_gate.mode) return std::nullopt;
            return std::string(runtime::gate_mode_name(*p.req.exit_gate.mode));
          },
          [](PySamplingParams& p, const std::optional<std::string>& v) {
            p.req.exit_gate.mode = v ? std::optional<ExitGateMode>(runtime::parse_gate_mode(*v)) : std::nullopt;
          })
      .def_property(
          "exit_gate_threshold", [](const PySamplingParams& p) { return p.req.exit_gate.threshold; },
          [](PySamplingParams& p, std::optional<double> v) { p.req.exit_gate.threshold = v; })
      .def_property(
          "exit_gate_step", [](const PySamplingParams& p) { return p.req.exit_gate.step; },
          [](PySamplingParams& p, std::optional<int64_t> v) { p.req.exit_gate.step = v; })
      .def_property(
          "exit_gate_kv",
          [](const PySamplingParams& p) -> std::optional<std::string> {
            if (!p.req.exit_gate.full_kv) return std::nullopt;
            return std::string(*p.req.exit_gate.full_kv ? "full" : "latest");
          },
          [](PySamplingParams& p, const std::optional<std::string>& v) {
            p.req.exit_gate.full_kv = v ? std::optional<bool>(runtime::parse_gate_kv(*v)) : std::nullopt;
          })
      .def_property(
          "stop_sequences", [](const PySamplingParams& p) { return p.req.stop_sequences; },
          [](PySamplingParams& p, const py::object& v) { p.req.stop_sequences = to_stop_sequences(v); })
      .def_property(
          "seed", [](const PySamplingParams& p) { return p.req.seed; },
          [](PySamplingParams& p, std::optional<uint64_t> v) { p.req.seed = v; })
      .def_property(
          "stop_at_eos", [](const PySamplingParams& p) { return p.req.stop_at_eos; },
          [](PySamplingParams& p, bool v) { p.req.stop_at_eos = v; })
      .def_property(
          "early_exit_patience", [](const PySamplingParams& p) { return p.req.early_exit.patience; },
          [](PySamplingParams& p, int64_t v) { p.req.early_exit.patience = v; })
      .def_property(
          "early_exit_min_L", [](const PySamplingParams& p) { return p.req.early_exit.min_L; },
          [](PySamplingParams& p, int64_t v) { p.req.early_exit.min_L = v; })
      .def_property(
          "early_exit_tau", [](const PySamplingParams& p) { return p.req.early_exit.tau; },
          [](PySamplingParams& p, double v) { p.req.early_exit.tau = v; })
      .def_property(
          "early_exit_peek_every", [](const PySamplingParams& p) { return p.req.early_exit.peek_every; },
          [](PySamplingParams& p, int64_t v) { p.req.early_exit.peek_every = v; })
      .def_property(
          "early_exit_logit_margin", [](const PySamplingParams& p) { return p.req.early_exit.logit_margin; },
          [](PySamplingParams& p, double v) { p.req.early_exit.logit_margin = v; })
      .def_property(
          "grammar", [](const PySamplingParams& p) { return std::const_pointer_cast<grammar::Grammar>(p.req.grammar); },
          [](PySamplingParams& p, std::shared_ptr<grammar::Grammar> g) { p.req.grammar = std::move(g); })
      .def_property(
          "timeout", [](const PySamplingParams& p) { return p.timeout_s; },
          [](PySamplingParams& p, double v) { p.timeout_s = v; })
      .def_property(
          "presence_penalty", [](const PySamplingParams& p) { return p.req.sampling.presence_penalty; },
          [](PySamplingParams& p, float v) { p.req.sampling.presence_penalty = v; })
      .def_property(
          "frequency_penalty", [](const PySamplingParams& p) { return p.req.sampling.frequency_penalty; },
          [](PySamplingParams& p, float v) { p.req.sampling.frequency_penalty = v; })
      .def_property(
          "logprobs",
          [](const PySamplingParams& p) {
            return p.req.logprobs < 0 ? std::nullopt : std::optional<int>(p.req.logprobs);
          },
          [](PySamplingParams& p, std::optional<int> v) { p.req.logprobs = v ? *v : -1; })
      .def("__repr__", [](const PySamplingParams& p) {
        return "SamplingParams(max_tokens=" + std::to_string(p.req.max_tokens) +
               ", loops=" + (p.req.loops ? std::to_string(*p.req.loops) : std::string("None")) +
               ", temperature=" + std::to_string(p.req.sampling.temperature) +
               ", top_k=" + std::to_string(p.req.sampling.top_k) + ", top_p=" + std::to_string(p.req.sampling.top_p) +
               ")";
      });

  py::class_<RequestResult>(m, "RequestOutput", R"doc(
The end of one request: tokens (the generated ids, not the prompt), finish_reason ("stop":
EOS, a stop sequence or a finished grammar; "length": max_tokens; "cancelled", "timeout",
"error"), stop_detail (the engine's own reason: "eos", "stop", "grammar", ...), error (the
message when finish_reason is "error"), loops_per_token and mean_loops (the loop depth behind
each token: early exit lowers it), prompt_tokens, queue_ms / first_token_ms / total_ms (from
submit), preemptions (times its KV was dropped and recomputed; outputs never change),
logprobs ([len(tokens)] of (logprob, [(id, logprob), ...]) when the request asked for them,
else []).)doc")
      .def_readonly("id", &RequestResult::id)
      .def_readonly("tokens", &RequestResult::tokens)
      .def_property_readonly("finish_reason", [](const RequestResult& r) { return openai_reason(r.finish_reason); })
      .def_property_readonly("stop_detail",
                             [](const RequestResult& r) { return runtime::finish_reason_name(r.finish_reason); })
      .def_readonly("error", &RequestResult::error)
      .def_readonly("loops_per_token", &RequestResult::loops_per_token)
      .def_property_readonly("logprobs",
                             [](const RequestResult& r) {
                               py::list out;
                               for (const auto& lp : r.logprobs) out.append(py::make_tuple(lp.logprob, lp.top));
                               return out;
                             })
      .def_property_readonly("mean_loops", &RequestResult::mean_loops)
      .def_readonly("prompt_tokens", &RequestResult::prompt_tokens)
      .def_readonly("queue_ms", &RequestResult::queue_ms)
      .def_readonly("first_token_ms", &RequestResult::first_token_ms)
      .def_readonly("total_ms", &RequestResult::total_ms)
      .def_readonly("preemptions", &RequestResult::preemptions)
      .def("__repr__", [](const RequestResult& r) {
        return "RequestOutput(id=" + std::to_string(r.id) + ", tokens=" + std::to_string(r.tokens.size()) +
               " ids, finish_reason='" + openai_reason(r.finish_reason) + "')";
      });

  py::class_<PyHandle>(m, "RequestHandle", R"doc(
A submitted request. Iterating yields its token ids as the engine emits them (blocking
without the GIL); poll() returns what arrived without waiting; fileno() is readable when
something arrived (asyncio: tinyloop.engine.AsyncEngine); result(timeout=None) waits for the
end and returns a RequestOutput (RuntimeError when the request failed, TimeoutError when
the wait timed out); cancel() ends it at the next step and frees its KV.)doc")
      .def_readonly("id", &PyHandle::id)
      .def_readonly("prompt_tokens", &PyHandle::prompt_tokens)
      .def("__iter__", [](PyHandle& h) -> PyHandle& { return h; })
      .def("__next__",
           [](PyHandle& h) {
             std::optional<int32_t> t;
             {
               py::gil_scoped_release nogil;
               t = h.sink->next();
             }
             if (t) return *t;
             const RequestResult r = h.sink->result();
             if (r.finish_reason == FinishReason::Error) throw std::runtime_error(r.error);
             throw py::stop_iteration();
           })
      .def("poll", [](PyHandle& h) { return h.sink->poll(); })
      .def(
          "poll_detail",
          [](PyHandle& h) {
            py::list out;
            for (const auto& d : h.sink->poll_detail())
              out.append(py::make_tuple(d.token, d.loops, d.logprobs.logprob, d.logprobs.top));
            return out;
          },
          "Like poll(), with each token's loop depth (early exit lowers it) and log-probabilities:\n"
          "[(token_id, loops, logprob, [(id, logprob), ...])] (NaN and [] when logprobs was None).")
      .def("fileno", [](const PyHandle& h) { return h.sink->fd(); })
      .def_property_readonly("done", [](const PyHandle& h) { return h.sink->done(); })
      .def(
          "result",
          [](PyHandle& h, std::optional<double> timeout) {
            bool ok;
            {
              py::gil_scoped_release nogil;
              ok = h.sink->wait(timeout ? std::max(0.0, *timeout) : -1.0);
            }
            if (!ok) {
              PyErr_SetString(PyExc_TimeoutError, "the request did not finish in time");
              throw py::error_already_set();
            }
            RequestResult r = h.sink->result();
            if (r.finish_reason == FinishReason::Error) throw std::runtime_error(r.error);
            return r;
          },
          py::arg("timeout") = py::none())
      .def("cancel", [](PyHandle& h) {
        if (auto e = h.engine.lock()) e->cancel(h.id);
      });

  py::class_<PyServingEngine, std::shared_ptr<PyServingEngine>>(m, "Engine", R"doc(
The serving engine (docs/serving.md): many requests, one decode loop on its own thread,
continuous batching over a paged KV pool.

Engine(model, *, kv_budget_mb=1024, kv_block_size=32, max_num_seqs=64, max_batch_tokens=512,
       prefill_chunk=256, max_queue=4096, prefix_caching=True)
  model: a tl.Model (its weights and settings are shared, nothing is copied) or a path
    (opened with the Model defaults).
  kv_budget_mb: the KV pool, allocated (and resident) at start; requests wait (and the latest may be
    preempted and recomputed) when it is full.
  kv_block_size: positions per KV block. max_num_seqs: requests running at once.
  max_batch_tokens: rows per forward step (decode rows + prompt chunk rows).
  prefill_chunk: prompt rows one request feeds per step (chunked prefill).
  max_queue: waiting requests; submit raises tl.QueueFull (a RuntimeError) past it.
  prefix_caching: keep the KV blocks of every prompt's whole blocks in the pool for later
    requests with the same prefix (same loops; not with cache_window or kv_loop_slots):
    exact, they skip that part of the prefill. Evicted (least recently used) before any
    request is preempted.
A request's tokens equal Model.generate's for the same arguments (greedy and seeded
sampling), whatever else runs beside it.)doc")
      .def(py::init([](const py::object& model, double kv_budget_mb, int64_t kv_block_size, int64_t max_num_seqs,
                       int64_t max_batch_tokens, int64_t prefill_chunk, int64_t max_queue, bool prefix_caching) {
             std::shared_ptr<const runtime::Engine> e;
             if (py::isinstance<PyModel>(model)) {
               e = model.cast<std::shared_ptr<PyModel>>()->engine();
             } else if (py::isinstance<py::str>(model)) {
               const std::string path = model.cast<std::string>();
               py::gil_scoped_release nogil;
               e = std::make_shared<runtime::Engine>(path, runtime::EngineOptions{});
             } else {
               throw py::value_error("model must be a tinyloop_py.Model or a path");
             }
             runtime::ServingOptions o;
             o.kv_budget_mb = kv_budget_mb;
             o.kv_block_size = kv_block_size;
             o.max_num_seqs = max_num_seqs;
             o.max_batch_tokens = max_batch_tokens;
             o.prefill_chunk = prefill_chunk;
             o.max_queue = max_queue;
             o.prefix_caching = prefix_caching;
             py::gil_scoped_release nogil;
             return std::make_shared<PyServingEngine>(std::move(e), o);
           }),
           py::arg("model"), py::kw_only(), py::arg("kv_budget_mb") = 1024.0,
           py::arg("kv_block_size") = model::kDefaultBlockRows, py::arg("max_num_seqs") = 64,
           py::arg("max_batch_tokens") = 512, py::arg("prefill_chunk") = 256, py::arg("max_queue") = 4096,
           py::arg("prefix_caching") = true)
      .def(
          "submit",
          [](const PyServingEngine& self, const py::object& prompt, const py::object& params,
             const py::kwargs& kwargs) {
            const py::object p = params_arg(params, kwargs);
            return submit(self, prompt, p.cast<const PySamplingParams&>());
          },
          py::arg("prompt"), py::arg("params") = py::none(),
          "submit(prompt, params=None, **kwargs) -> RequestHandle. prompt: token ids; params: a\n"
          "SamplingParams, or its keyword arguments.")
      .def(
          "generate_batch",
          [](const PyServingEngine& self, const py::list& prompts, const py::object& params, const py::kwargs& kwargs) {
            const py::object p = params_arg(params, kwargs);
            const auto& sp = p.cast<const PySamplingParams&>();
            std::vector<PyHandle> handles;
            try {
              for (const py::handle& prompt : prompts)
                handles.push_back(submit(self, py::reinterpret_borrow<py::object>(prompt), sp));
            } catch (...) {
              if (auto e = self.get())
                for (const PyHandle& h : handles) e->cancel(h.id);
              throw;
            }
            std::vector<RequestResult> out;
            {
              py::gil_scoped_release nogil;
              for (PyHandle& h : handles) {
                h.sink->wait(-1.0);
                out.push_back(h.sink->result());
              }
            }
            for (const RequestResult& r : out)
              if (r.finish_reason == FinishReason::Error) throw std::runtime_error(r.error);
            return out;
          },
          py::arg("prompts"), py::arg("params") = py::none(),
          "generate_batch(prompts, params=None, **kwargs) -> list[RequestOutput]: every prompt\n"
          "submitted at once (they share the engine's steps), results in prompt order.")
      .def(
          "stats", [](const PyServingEngine& self) { return stats_dict(self.get()->stats()); },
          "Counters: running, waiting, kv_blocks_used / kv_blocks_total / kv_block_bytes,\n"
          "requests_submitted / finished / cancelled / failed / timed_out, prompt_tokens,\n"
          "generated_tokens, steps, step_rows, mean_batch_rows, mean_loops, preemptions; prefix\n"
          "caching: prefix_queries, prefix_hits, prefix_hit_tokens, prefix_cached_positions,\n"
          "kv_blocks_cached (pool blocks the cache holds; idle, kv_blocks_used equals it).")
      .def(
          "clear_prefix_cache", [](const PyServingEngine& self) { self.get()->clear_prefix_cache(); },
          "Drops every cached prefix block (back to the pool at the engine's next turn).")
      .def("close", &PyServingEngine::close, py::arg("drain") = false,
           "Stops the engine: with drain=True requests in flight finish first, otherwise they end\n"
           "as 'cancelled'. Later calls raise RuntimeError('engine was closed').")
      .def("__enter__", [](const std::shared_ptr<PyServingEngine>& self) { return self; })
      .def("__exit__",
           [](PyServingEngine& self, const py::object&, const py::object&, const py::object&) { self.close(false); });

  // QueueFull -> RuntimeError with the engine's message (the server maps it to 429/503).
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> queue_full;
  queue_full.call_once_and_store_result(
      [&]() { return py::exception<runtime::QueueFull>(m, "QueueFull", PyExc_RuntimeError); });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const runtime::QueueFull& e) {
      py::set_error(queue_full.get_stored(), e.what());
    }
  });
}

}  // namespace tinyloop::py_bind
