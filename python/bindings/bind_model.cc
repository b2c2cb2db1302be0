// Model lifecycle, config, memory, scoring and generation (README.md "Python",
// docs/generation.md).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "runtime/gate_exit.h"
#include "runtime/generate.h"

namespace tinyloop::py_bind {
namespace {

// Every field of the file's config (the table of include/tinyloop/config_fields.def, as
// config_to_json writes it), then what this Model adds: max_seq_len is the one it was
// opened with (the file's is trained_max_seq_len) and the engine's storage choices.
py::dict config_dict(const Engine& e) {
  const ModelConfig& c = e.config();
  py::dict d = py::module_::import("json").attr("loads")(config_to_json(c));
  d["max_seq_len"] = e.max_seq_len();
  d["trained_max_seq_len"] = c.max_seq_len;
  d["kv_mode"] = e.kv_mode();
  d["quant_activations"] = e.quant_activations();
  d["fp16_body"] = e.fp16_body();
  d["kv_cache_disabled"] = e.kv_cache_disabled();
  return d;
}

runtime::GenerateRequest make_request(const Engine& e, const py::object& prompt, int64_t max_tokens,
                                      std::optional<int64_t> loops, double temperature, int64_t top_k, double top_p,
                                      int64_t cache_window, double repetition_penalty, const py::object& stop_sequences,
                                      std::optional<uint64_t> seed, bool stop_at_eos) {
  runtime::GenerateRequest r;
  r.prompt = to_ids(prompt, "prompt");
  fill_request(r, max_tokens, loops, temperature, top_k, top_p, cache_window, repetition_penalty, stop_sequences, seed,
               stop_at_eos);
  return r;
}

// The initial-state scale and the exit gate of a generate / generate_stream request; the gate
// cannot steer beam search, so that pair is refused by name.
void set_state_and_gate(runtime::GenerateRequest& req, const runtime::BeamParams& beam, double init_scale,
                        const std::optional<std::string>& exit_gate, std::optional<double> exit_gate_threshold,
                        std::optional<int64_t> exit_gate_step, const std::optional<std::string>& exit_gate_kv) {
  req.init_scale = init_scale;
  req.exit_gate = gate_request(exit_gate, exit_gate_threshold, exit_gate_step, exit_gate_kv);
  if (beam.active() && req.exit_gate.any())
    throw py::value_error("exit_gate: not supported with beam search (beam_size >= 2)");
}

// Logits of score (every position: [T, V]) or score_last (the last: [V]), the exit gate's rule
// applied per row when the call or the file enables it; the GIL is released while it runs.
std::vector<float> score_logits(const runtime::Engine& e, const py::object& prompt, std::optional<int64_t> loops,
                                const std::optional<std::string>& exit_gate, std::optional<double> exit_gate_threshold,
                                std::optional<int64_t> exit_gate_step, bool last_only) {
  const auto ids = to_ids(prompt, "prompt");
  const auto gate = runtime::resolve_gate(e.config(), gate_request(exit_gate, exit_gate_threshold, exit_gate_step), {});
  const int64_t V = e.config().vocab_size;
  py::gil_scoped_release nogil;
  if (!gate.enabled()) return last_only ? e.score_last(ids, loops) : e.score(ids, loops);
  std::vector<float> logits = runtime::score_exit_gate(e, ids, loops, gate);  // [T, V]
  if (last_only) logits.erase(logits.begin(), logits.end() - V);
  return logits;
}

// Model.score (every row: float32 [T, V]) and Model.score_last (the last: [V]): one body,
// the same arguments.
auto score_method(bool last_only) {
  return [last_only](const PyModel& self, const py::object& prompt, std::optional<int64_t> loops,
                     const std::optional<std::string>& exit_gate, std::optional<double> exit_gate_threshold,
                     std::optional<int64_t> exit_gate_step) {
    auto e = self.engine();
    auto logits = score_logits(*e, prompt, loops, exit_gate, exit_gate_threshold, exit_gate_step, last_only);
    const auto V = static_cast<py::ssize_t>(e->config().vocab_size);
    const auto T = static_cast<py::ssize_t>(logits.size()) / V;
    return last_only ? to_numpy(std::move(logits), {V}) : to_numpy(std::move(logits), {T, V});
  };
}

}  // namespace

void bind_model(py::module_& m, ModelClass& cls) {
  cls.doc() = R"doc(
A loaded looped-transformer model (.tinyloop file, memory-mapped).

Model(path, max_seq_len=None, kv_mode=None, quant_activations=None, fp16_body=None)
  max_seq_len: longest prompt + generated tokens a call may use (default: the config's).
  kv_mode: KV storage of generation (docs/kv-cache.md): "fp16" (default), "fp32", "int8", or
    store-h "h_fp16" / "h_int8" / "h_int4" (keeps each attention input, rebuilds K/V);
    TINYLOOP_KV_INT8=1 / TINYLOOP_KV_FP32=1 / TINYLOOP_KV_H_MODE=1 (+ _INT8 / _INT4) set it.
  quant_activations: "q8" quantizes the input rows of int8 / int4 weight matmuls to int8
    per 32 columns with integer dot products, as llama.cpp does; "f32" keeps them exact.
    Default: TINYLOOP_QUANT_ACTIVATIONS, else "q8" for a file with int8 / int4 weights
    (several times faster for a few 1e-5 nats of KL; docs/model-format.md), else "f32".
  fp16_body: True runs the layers' float (F32 / F16 / BF16) matmuls - pre, loop and post
    blocks; not the head - in reduced precision: inputs rounded to bf16, a packed BF16 copy
    of those weights (extra memory, counted in vram_usage_mb), float32 sums, AMX tiles on
    CPUs that have them (docs/benchmarks.md "Reduced-precision loop body").
    TINYLOOP_EXPERIMENTAL_FP16_BODY=1 sets the default.
  use_mmap: True (default) maps the file: fast to open, weights shared with the page cache,
    but truncating the file while the model is open kills the process (SIGBUS) and rewriting
    it in place changes the weights. False reads the weights into memory (docs/limits.md).
Use as a context manager or call close(); any call after close() raises RuntimeError.
One Model may be used from several Python threads at once (the GIL is released during compute).
)doc";
  cls.def(py::init<const std::string&, std::optional<int64_t>, std::optional<std::string>, std::optional<std::string>,
                   std::optional<bool>, bool>(),
          py::arg("path"), py::arg("max_seq_len") = py::none(), py::arg("kv_mode") = py::none(),
          py::arg("quant_activations") = py::none(), py::arg("fp16_body") = py::none(), py::arg("use_mmap") = true)
      .def("close", &PyModel::close, "Release the model. Later calls raise RuntimeError.")
      .def_property_readonly("closed", &PyModel::closed)
      .def("__enter__",
           [](std::shared_ptr<PyModel> self) {
             self->engine();
             return self;
           })
      .def("__exit__",
           [](PyModel& self, py::object, py::object, py::object) {
             self.close();
             return false;
           })
      .def_property_readonly("max_seq_len", [](const PyModel& self) { return self.engine()->max_seq_len(); })
      .def(
          "config", [](const PyModel& self) { return config_dict(*self.engine()); },
          "The model config as a dict (dim, vocab_size, n_heads, ..., default_loops, max_seq_len).")
      .def(
          "vram_usage_mb", [](const PyModel& self) { return self.engine()->memory_mb(); },
          "Bytes the model holds on its backend (host memory on CPU), in MiB: weights + live caches + workspace.")
      .def(
          "tokenizer_json", [](const PyModel& self) { return self.engine()->model().file().tokenizer_json(); },
          "The embedded Hugging Face tokenizer.json text ('' when the file has none).")
      .def("score", score_method(false), py::arg("prompt"), py::arg("loops") = py::none(),
           py::arg("exit_gate") = py::none(), py::arg("exit_gate_threshold") = py::none(),
           py::arg("exit_gate_step") = py::none(),
           "Logits of every position: float32 [seq_len, vocab_size]. On a model with an exit gate\n"
           "(Ouro) each row follows the gate's rule (exit_gate: 'off' | 'threshold' | 'step' |\n"
           "'weighted'; None = the model file's config; docs/loop-depth.md, \"Exit gate\").")
      .def("score_last", score_method(true), py::arg("prompt"), py::arg("loops") = py::none(),
           py::arg("exit_gate") = py::none(), py::arg("exit_gate_threshold") = py::none(),
           py::arg("exit_gate_step") = py::none(),
           "Logits of the last position: float32 [vocab_size] (the exit gate as in score()).")
      .def(
          "generate",
          [](const PyModel& self, const py::object& prompt, int64_t max_tokens, std::optional<int64_t> loops,
             double temperature, int64_t top_k, double top_p, int64_t cache_window, double repetition_penalty,
             const py::object& stop_sequences, int64_t early_exit_patience, int64_t early_exit_min_L,
             double early_exit_tau, int64_t early_exit_peek_every, double early_exit_logit_margin, int64_t beam_size,
             double length_penalty, bool early_stopping, const py::object& grammar, const py::object& seed,
             bool stop_at_eos, int64_t kv_loop_slots, double init_scale, const std::optional<std::string>& exit_gate,
             std::optional<double> exit_gate_threshold, std::optional<int64_t> exit_gate_step,
             const std::optional<std::string>& exit_gate_kv) {
            auto e = self.engine();
            const auto beam = beam_params(beam_size, length_penalty, early_stopping);
            auto req = make_request(*e, prompt, max_tokens, loops, temperature, top_k, top_p, cache_window,
                                    repetition_penalty, stop_sequences, to_seed(seed), stop_at_eos);
            fill_exit_grammar_slots(req, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                    early_exit_logit_margin, grammar, kv_loop_slots);
            set_state_and_gate(req, beam, init_scale, exit_gate, exit_gate_threshold, exit_gate_step, exit_gate_kv);
            runtime::GenerateResult res;
            {
              py::gil_scoped_release nogil;
              res = beam.active() ? runtime::beam_generate(*e, req, beam) : runtime::generate(*e, req);
            }
            return res.tokens;
          },
          py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("loops") = py::none(), py::arg("temperature") = 0.0,
          py::arg("top_k") = 50, py::arg("top_p") = 1.0, py::arg("cache_window") = 0,
          py::arg("repetition_penalty") = 1.0, py::arg("stop_sequences") = py::list(),
          py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3,
          py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0, py::arg("beam_size") = 0,
          py::arg("length_penalty") = 1.0, py::arg("early_stopping") = true, py::arg("grammar") = py::none(),
          py::arg("seed") = py::none(), py::arg("stop_at_eos") = true, py::arg("kv_loop_slots") = 0,
          py::arg("init_scale") = 1.0, py::arg("exit_gate") = py::none(), py::arg("exit_gate_threshold") = py::none(),
          py::arg("exit_gate_step") = py::none(), py::arg("exit_gate_kv") = py::none(),
          "Prefill the prompt, then decode up to max_tokens. Returns prompt + new tokens (List[int]).\n"
          "beam_size >= 2: deterministic beam search (docs/beam-search.md); final beams ranked by\n"
          "log_prob / max(1, new_len)^length_penalty; early_stopping returns once the top-ranked beam ended.\n"
          "kv_loop_slots = B > 0: recurrence-shared KV (docs/kv-cache.md), B slot groups for the loop\n"
          "iterations (iteration i in group i mod B), so cache memory stops growing with loops; 0 = exact.\n"
          "early_exit_patience > 0 enables decode-time early exit (docs/loop-depth.md): after early_exit_min_L\n"
          "iterations, a probe every early_exit_peek_every iterations; stable when ||s_i - s_{i-1}|| / ||s_i|| <\n"
          "early_exit_tau, or (early_exit_logit_margin > 0) when top1 - top2 of the logits read out of s_i >\n"
          "the margin; a token stops after early_exit_patience consecutive stable probes.\n"
          "init_scale multiplies the std of a random initial loop state (Huginn; 0 = the zero state).\n"
          "A model converted from Huginn draws that state per call from seed (fresh without one),\n"
          "as its reference does (docs/loop-depth.md \"Random initial state\").\n"
          "exit_gate ('off' | 'threshold' | 'step' | 'weighted'), exit_gate_threshold, exit_gate_step: Ouro's\n"
          "learned exit gate (docs/loop-depth.md, \"Exit gate\"); None = the model file's config.\n"
          "exit_gate_kv: 'latest' (default) stops a decoded token's loop at its exit and fills the skipped\n"
          "KV slots from its last computed loop; 'full' runs every loop as the reference (no saving).")
      .def(
          "generate_stream",
          [](const PyModel& self, const py::object& prompt, const py::object& on_token, int64_t max_tokens,
             std::optional<int64_t> loops, double temperature, int64_t top_k, double top_p, int64_t cache_window,
             double repetition_penalty, const py::object& stop_sequences, int64_t early_exit_patience,
             int64_t early_exit_min_L, double early_exit_tau, int64_t early_exit_peek_every,
             double early_exit_logit_margin, const py::object& seed, bool stop_at_eos, const py::object& grammar,
             int64_t beam_size, double length_penalty, bool early_stopping, int64_t kv_loop_slots, double init_scale,
             const std::optional<std::string>& exit_gate, std::optional<double> exit_gate_threshold,
             std::optional<int64_t> exit_gate_step, const std::optional<std::string>& exit_gate_kv) {
            auto e = self.engine();
            if (!PyCallable_Check(on_token.ptr())) throw py::value_error("on_token must be callable");
            const auto beam = beam_params(beam_size, length_penalty, early_stopping);
            auto req = make_request(*e, prompt, max_tokens, loops, temperature, top_k, top_p, cache_window,
                                    repetition_penalty, stop_sequences, to_seed(seed), stop_at_eos);
            fill_exit_grammar_slots(req, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                    early_exit_logit_margin, grammar, kv_loop_slots);
            set_state_and_gate(req, beam, init_scale, exit_gate, exit_gate_threshold, exit_gate_step, exit_gate_kv);
            // A Python exception in the callback stops generation and is re-raised here,
            // unchanged (one raised by the returned value's __bool__ too). The callback
            // returns a bool, None (= go on), or a number-like value with a truth value
            // (numpy.bool_, int); anything else (a str, a list) is a TypeError naming on_token.
            std::exception_ptr callback_error;
            auto cb = [&](int32_t tok) -> bool {
              py::gil_scoped_acquire gil;
              try {
                py::object r = on_token(tok);
                if (r.is_none()) return true;
                const PyNumberMethods* nm = Py_TYPE(r.ptr())->tp_as_number;
                if (!nm || !nm->nb_bool)
                  throw py::type_error("on_token must return a bool (or None to go on), got " +
                                       std::string(Py_TYPE(r.ptr())->tp_name));
                const int truth = PyObject_IsTrue(r.ptr());
                if (truth < 0) throw py::error_already_set();
                return truth == 1;
              } catch (...) {
                callback_error = std::current_exception();
                return false;
              }
            };
            runtime::GenerateResult res;
            {
              py::gil_scoped_release nogil;
              // Beam search streams the winning beam once the search is over.
              res = beam.active() ? runtime::beam_generate(*e, req, beam, cb) : runtime::generate(*e, req, cb);
            }
            if (callback_error) std::rethrow_exception(callback_error);
            return stream_result(res);
          },
          py::arg("prompt"), py::arg("on_token"), py::arg("max_tokens") = 64, py::arg("loops") = py::none(),
          py::arg("temperature") = 0.0, py::arg("top_k") = 50, py::arg("top_p") = 1.0, py::arg("cache_window") = 0,
          py::arg("repetition_penalty") = 1.0, py::arg("stop_sequences") = py::list(),
          py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3,
          py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0, py::arg("seed") = py::none(),
          py::arg("stop_at_eos") = true, py::arg("grammar") = py::none(), py::arg("beam_size") = 0,
          py::arg("length_penalty") = 1.0, py::arg("early_stopping") = true, py::arg("kv_loop_slots") = 0,
          py::arg("init_scale") = 1.0, py::arg("exit_gate") = py::none(), py::arg("exit_gate_threshold") = py::none(),
          py::arg("exit_gate_step") = py::none(), py::arg("exit_gate_kv") = py::none(),
          "generate() with on_token(tok) -> bool called per token (False stops after it). Returns a dict:\n"
          "(with beam_size >= 2 on_token receives the winning beam's tokens after the search.)\n"
          "tokens, prefill_ms, first_token_ms, decode_steady_ms, tokens_emitted, loops_per_token (the loop\n"
          "depth behind each emitted token; early exit lowers it), mean_loops (their mean).");

  m.def(
      "load",
      [](const std::string& path, std::optional<int64_t> max_seq_len, std::optional<std::string> kv_mode,
         std::optional<std::string> quant_activations, std::optional<bool> fp16_body, bool use_mmap) {
        return std::make_shared<PyModel>(path, max_seq_len, kv_mode, quant_activations, fp16_body, use_mmap);
      },
      py::arg("path"), py::arg("max_seq_len") = py::none(), py::arg("kv_mode") = py::none(),
      py::arg("quant_activations") = py::none(), py::arg("fp16_body") = py::none(), py::arg("use_mmap") = true,
      "Alias of Model(path, ...).");
}

}  // namespace tinyloop::py_bind
