// Prefix cache (docs/prefix-cache.md): PrefixCache,
// Model.build_prefix_cache, Model.generate_from_prefix_cache.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "py_prefix_cache.h"
#include "runtime/prefix_cache.h"

namespace tinyloop::py_bind {

void bind_prefix_cache(py::module_& m, ModelClass& cls) {
  py::class_<PyPrefixCache, std::shared_ptr<PyPrefixCache>>(m, "PrefixCache", R"doc(
A prefilled prompt prefix (Model.build_prefix_cache) for generate_from_prefix_cache. Holds the
prefix's KV cache at `loops` iterations. Immutable and never copied: each call keeps only its
own suffix + generated tokens in a small tail cache and reads the prefix in place, so one
PrefixCache serves many calls, from several threads at once. Its memory counts in
Model.vram_usage_mb() while it is alive.)doc")
      .def_property_readonly("seq_len", [](const PyPrefixCache& p) { return p.c->seq_len(); })
      .def_property_readonly("loops", [](const PyPrefixCache& p) { return p.c->loops(); })
      .def_property_readonly("cache_window", [](const PyPrefixCache& p) { return p.c->cache_window(); })
      .def_property_readonly("bytes", [](const PyPrefixCache& p) { return p.c->bytes(); })
      .def("__repr__", [](const PyPrefixCache& p) {
        return "<PrefixCache seq_len=" + std::to_string(p.c->seq_len()) + " loops=" + std::to_string(p.c->loops()) +
               " cache_window=" + std::to_string(p.c->cache_window()) + " bytes=" + std::to_string(p.c->bytes()) + ">";
      });

  cls.def(
         "build_prefix_cache",
         [](const PyModel& self, const py::object& prompt, std::optional<int64_t> loops, int64_t cache_window) {
           auto e = self.engine();
           auto ids = to_ids(prompt, "prompt");
           auto out = std::make_shared<PyPrefixCache>();
           py::gil_scoped_release nogil;
           out->c = runtime::PrefixCache::build(e, std::move(ids), loops, cache_window);
           return out;
         },
         py::arg("prompt"), py::arg("loops") = py::none(), py::arg("cache_window") = 0,
         R"doc(Prefill `prompt` (the shared prefix, non-empty) at `loops` iterations (default
config()["default_loops"]) and keep its KV cache. Returns a PrefixCache. cache_window = W > 0:
the prefix is prefilled as generate(..., cache_window=W) would (each position sees the last W),
and the cache serves calls with that window only (docs/prefix-cache.md).)doc")
      .def(
          "generate_from_prefix_cache",
          [](const PyModel& self, const PyPrefixCache& cache, const py::object& suffix, int64_t max_tokens,
             std::optional<int64_t> loops, double temperature, int64_t top_k, double top_p,
             std::optional<int64_t> cache_window, double repetition_penalty, const py::object& stop_sequences,
             int64_t early_exit_patience, int64_t early_exit_min_L, double early_exit_tau,
             int64_t early_exit_peek_every, double early_exit_logit_margin, std::optional<uint64_t> seed,
             bool stop_at_eos, const py::object& grammar, int64_t kv_loop_slots) {
            auto e = self.engine();
            if (&cache.c->engine() != e.get()) throw py::value_error("cache: built by a different Model");
            // An empty suffix decodes right after the prefix (to_ids rejects empty arrays).
            std::vector<int32_t> ids;
            if (py::len(suffix) > 0) ids = to_ids(suffix, "suffix");
            runtime::GenerateRequest req;
            fill_request(req, max_tokens, loops, temperature, top_k, top_p,
                         cache_window.value_or(cache.c->cache_window()), repetition_penalty, stop_sequences, seed,
                         stop_at_eos);
            fill_exit_grammar_slots(req, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                    early_exit_logit_margin, grammar, kv_loop_slots);
            return decode_tokens_without_gil([&] { return cache.c->generate(ids, std::move(req)); });
          },
          py::arg("cache"), py::arg("suffix"), py::arg("max_tokens") = 64, py::arg("loops") = py::none(),
          py::arg("temperature") = 0.0, py::arg("top_k") = 50, py::arg("top_p") = 1.0,
          py::arg("cache_window") = py::none(), py::arg("repetition_penalty") = 1.0,
          py::arg("stop_sequences") = py::list(), py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2,
          py::arg("early_exit_tau") = 1e-3, py::arg("early_exit_peek_every") = 1,
          py::arg("early_exit_logit_margin") = 0.0, py::arg("seed") = py::none(), py::arg("stop_at_eos") = true,
          py::arg("grammar") = py::none(), py::arg("kv_loop_slots") = 0,
          R"doc(Decode prefix + suffix off a PrefixCache: prefills only the suffix (which may be
empty), then decodes as generate(prefix + suffix, ...) would; returns the same List[int]
(prefix + suffix + new tokens). loops defaults to cache.loops; any other value raises
RuntimeError('loops mismatch ...'). cache_window defaults to cache.cache_window; any other
value raises ValueError('cache_window mismatch ...'). ValueError when the cache comes from
another Model, or for any argument generate() rejects. grammar: as generate(). kv_loop_slots > 0
raises ValueError (the prefix was computed with one slot group per iteration). beam_size is not
accepted here. The cache is not modified.)doc");
}

}  // namespace tinyloop::py_bind
