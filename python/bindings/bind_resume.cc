// Warm-start resume (docs/loop-depth.md, section 3):
// ResumeHandle, Model.build_resume_handle, Model.resume_generate.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "runtime/resume.h"

namespace tinyloop::py_bind {
namespace {

// Opaque to Python; the C++ handle is immutable, so it is shared by every resume.
struct PyResumeHandle {
  std::shared_ptr<const runtime::ResumeHandle> h;
};

}  // namespace

void bind_resume(py::module_& m, ModelClass& cls) {
  py::class_<PyResumeHandle, std::shared_ptr<PyResumeHandle>>(m, "ResumeHandle", R"doc(
A prompt run to `loops_used` iterations, kept for resume_generate at any depth in
[loops_used, max_loops] (Model.build_resume_handle). Holds the prompt's KV cache (slots for
max_loops iterations), the prelude output and the loop state. Immutable: one handle serves
many resume_generate calls, from several threads at once.)doc")
      .def_property_readonly("seq_len", [](const PyResumeHandle& r) { return r.h->seq_len(); })
      .def_property_readonly("loops_used", [](const PyResumeHandle& r) { return r.h->loops_used(); })
      .def_property_readonly("max_loops", [](const PyResumeHandle& r) { return r.h->max_loops(); })
      .def_property_readonly("max_tokens", [](const PyResumeHandle& r) { return r.h->max_tokens(); })
      .def_property_readonly("nbytes", [](const PyResumeHandle& r) { return r.h->bytes(); })
      .def("__repr__", [](const PyResumeHandle& r) {
        return "<ResumeHandle seq_len=" + std::to_string(r.h->seq_len()) +
               " loops_used=" + std::to_string(r.h->loops_used()) + " max_loops=" + std::to_string(r.h->max_loops()) +
               ">";
      });

  cls.def(
         "build_resume_handle",
         [](const PyModel& self, const py::object& prompt, std::optional<int64_t> loops,
            std::optional<int64_t> max_loops, int64_t max_tokens) {
           auto e = self.engine();
           auto ids = to_ids(prompt, "prompt");
           auto out = std::make_shared<PyResumeHandle>();
           py::gil_scoped_release nogil;
           out->h = runtime::ResumeHandle::build(e, std::move(ids), loops, max_loops, max_tokens);
           return out;
         },
         py::arg("prompt"), py::arg("loops") = py::none(), py::arg("max_loops") = py::none(),
         py::arg("max_tokens") = 64,
         R"doc(Run the prompt to `loops` iterations (default config()["default_loops"]) and keep it
for resume_generate. max_loops (default max(2 * loops, default_loops)) is the deepest resume the
handle allows; its KV cache has slots for that many iterations. max_tokens (default 64) is the
most tokens a resume may generate; prompt + max_tokens must fit max_seq_len. Returns a
ResumeHandle.)doc")
      .def(
          "resume_generate",
          [](const PyModel& self, const PyResumeHandle& handle, std::optional<int64_t> max_tokens,
             std::optional<int64_t> loops, double temperature, int64_t top_k, double top_p, int64_t cache_window,
             double repetition_penalty, const py::object& stop_sequences, int64_t early_exit_patience,
             int64_t early_exit_min_L, double early_exit_tau, int64_t early_exit_peek_every,
             double early_exit_logit_margin, std::optional<uint64_t> seed, bool stop_at_eos, const py::object& grammar,
             int64_t kv_loop_slots) {
            auto e = self.engine();
            if (&handle.h->engine() != e.get()) throw py::value_error("handle: built by a different Model");
            runtime::GenerateRequest req;
            fill_request(req, max_tokens.value_or(handle.h->max_tokens()), loops, temperature, top_k, top_p,
                         cache_window, repetition_penalty, stop_sequences, seed, stop_at_eos);
            fill_exit_grammar_slots(req, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                    early_exit_logit_margin, grammar, kv_loop_slots);
            return decode_tokens_without_gil([&] { return handle.h->resume(std::move(req)); });
          },
          py::arg("handle"), py::arg("max_tokens") = py::none(), py::arg("loops") = py::none(),
          py::arg("temperature") = 0.0, py::arg("top_k") = 50, py::arg("top_p") = 1.0, py::arg("cache_window") = 0,
          py::arg("repetition_penalty") = 1.0, py::arg("stop_sequences") = py::list(),
          py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3,
          py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0, py::arg("seed") = py::none(),
          py::arg("stop_at_eos") = true, py::arg("grammar") = py::none(), py::arg("kv_loop_slots") = 0,
          R"doc(Decode from a ResumeHandle at loops = L2 (default handle.loops_used): runs only
iterations loops_used .. L2-1 on the prompt positions (no prelude, no earlier iterations), then
reads out and decodes exactly as generate(prompt, loops=L2, ...) would, so the tokens are the
same. Returns prompt + new tokens (List[int]). The handle is not modified. ValueError when L2 is
outside [handle.loops_used, handle.max_loops], max_tokens (default handle.max_tokens) exceeds
handle.max_tokens, cache_window != 0, kv_loop_slots > 0 (the handle keeps one slot group per
iteration), or for any argument generate() rejects. grammar: as generate().)doc");
}

}  // namespace tinyloop::py_bind
