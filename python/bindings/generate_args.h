// generate()'s keyword arguments -> runtime::GenerateRequest (or SpeculativeRequest), shared by
// every binding that decodes (generate / generate_stream, resume_generate, the prefix cache and
// pool, speculative decoding). Range checks stay in the runtime, which names the argument in
// its std::invalid_argument (a Python ValueError).
#pragma once
#include <pybind11/pybind11.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convert.h"
#include "runtime/beam_search.h"
#include "runtime/early_exit.h"
#include "runtime/gate_exit.h"
#include "runtime/generate.h"
#include "grammar/grammar.h"

namespace tinyloop::py_bind {

// grammar=None | tl.Grammar (with its token vocabulary set; checked by the runtime).
inline std::shared_ptr<const grammar::Grammar> to_grammar(const py::object& obj) {
  if (obj.is_none()) return nullptr;
  try {
    return obj.cast<std::shared_ptr<grammar::Grammar>>();
  } catch (const py::cast_error&) {
    throw py::value_error("grammar must be a tinyloop_py.Grammar or None");
  }
}

// seed=None | an int in [0, 2^64): ValueError naming seed otherwise (pybind's own
// "incompatible function arguments" lists every signature and names nothing).
inline std::optional<uint64_t> to_seed(const py::object& seed) {
  if (seed.is_none()) return std::nullopt;
  if (!PyIndex_Check(seed.ptr()) || PyBool_Check(seed.ptr()))
    throw py::value_error("seed must be an integer in [0, 2^64) or None, got " +
                          std::string(Py_TYPE(seed.ptr())->tp_name));
  PyObject* index = PyNumber_Index(seed.ptr());
  if (!index) throw py::error_already_set();
  py::int_ v = py::reinterpret_steal<py::int_>(index);
  const unsigned long long s = PyLong_AsUnsignedLongLong(v.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw py::value_error("seed must be an integer in [0, 2^64), got " + py::str(v).cast<std::string>());
  }
  return static_cast<uint64_t>(s);
}

// The sampling and stop kwargs, shared by runtime::GenerateRequest and
// runtime::SpeculativeRequest (both have these fields). top_k is clamped into int: a huge
// top_k means "keep all".
template <class Request>
void fill_sampling_and_stops(Request& r, int64_t max_tokens, double temperature, int64_t top_k, double top_p,
                             int64_t cache_window, double repetition_penalty, const py::object& stop_sequences,
                             std::optional<uint64_t> seed, bool stop_at_eos) {
  r.max_tokens = max_tokens;
  if (top_k > INT32_MAX) top_k = INT32_MAX;
  if (top_k < INT32_MIN) top_k = INT32_MIN;
  r.sampling.temperature = static_cast<float>(temperature);
  r.sampling.top_k = static_cast<int>(top_k);
  r.sampling.top_p = static_cast<float>(top_p);
  r.sampling.repetition_penalty = static_cast<float>(repetition_penalty);
  r.cache_window = cache_window;
  r.stop_sequences = to_stop_sequences(stop_sequences);
  r.seed = seed;
  r.stop_at_eos = stop_at_eos;
}

// Everything of a request except the prompt and the depth / grammar kwargs.
inline void fill_request(runtime::GenerateRequest& r, int64_t max_tokens, std::optional<int64_t> loops,
                         double temperature, int64_t top_k, double top_p, int64_t cache_window,
                         double repetition_penalty, const py::object& stop_sequences, std::optional<uint64_t> seed,
                         bool stop_at_eos) {
  fill_sampling_and_stops(r, max_tokens, temperature, top_k, top_p, cache_window, repetition_penalty, stop_sequences,
                          seed, stop_at_eos);
  r.loops = loops;
}

inline runtime::EarlyExitParams early_exit_params(int64_t patience, int64_t min_L, double tau, int64_t peek_every,
                                                  double logit_margin) {
  runtime::EarlyExitParams p;
  p.patience = patience;
  p.min_L = min_L;
  p.tau = tau;
  p.peek_every = peek_every;
  p.logit_margin = logit_margin;
  return p;
}

// early_exit_* / grammar / kv_loop_slots, as every decoding binding takes them (generate_args
// order); on a SpeculativeRequest they are carried only so the runtime can refuse them by name.
template <class Request>
void fill_exit_grammar_slots(Request& r, int64_t early_exit_patience, int64_t early_exit_min_L, double early_exit_tau,
                             int64_t early_exit_peek_every, double early_exit_logit_margin, const py::object& grammar,
                             int64_t kv_loop_slots) {
  r.early_exit = early_exit_params(early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                   early_exit_logit_margin);
  r.grammar = to_grammar(grammar);
  r.kv_loop_slots = kv_loop_slots;
}

// Runs decode() (returning a runtime::GenerateResult) with the GIL released; returns the
// tokens (prompt + new), what the list-returning decode methods give back.
template <class Decode>
std::vector<int32_t> decode_tokens_without_gil(Decode&& decode) {
  runtime::GenerateResult res;
  {
    py::gil_scoped_release nogil;
    res = decode();
  }
  return std::move(res.tokens);
}

// exit_gate / exit_gate_threshold / exit_gate_step (None = the model file's config); the
// runtime checks the values and names the kwarg (runtime/gate_exit.h resolve_gate).
inline runtime::GateExitRequest gate_request(const std::optional<std::string>& mode, std::optional<double> threshold,
                                             std::optional<int64_t> step,
                                             const std::optional<std::string>& kv = std::nullopt) {
  runtime::GateExitRequest r;
  if (mode) r.mode = runtime::parse_gate_mode(*mode);
  r.threshold = threshold;
  r.step = step;
  if (kv) r.full_kv = runtime::parse_gate_kv(*kv);
  return r;
}

// beam_size / length_penalty / early_stopping, validated (ValueError naming the kwarg).
inline runtime::BeamParams beam_params(int64_t beam_size, double length_penalty, bool early_stopping) {
  runtime::BeamParams p{beam_size, length_penalty, early_stopping};
  runtime::validate(p);
  return p;
}

// generate_stream's timing dict, plus the loop depth behind each emitted token.
inline py::dict stream_result(const runtime::GenerateResult& res) {
  py::dict d;
  d["tokens"] = res.tokens;
  d["prefill_ms"] = res.prefill_ms;
  d["first_token_ms"] = res.first_token_ms;
  d["decode_steady_ms"] = res.decode_steady_ms;
  d["tokens_emitted"] = res.tokens_emitted;
  d["loops_per_token"] = res.loops_per_token;
  d["mean_loops"] = res.mean_loops();
  return d;
}

}  // namespace tinyloop::py_bind
