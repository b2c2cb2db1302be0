// Prefix pool (docs/prefix-cache.md "Prefix pool"): PrefixPool,
// Model.register_prefix, Model.generate_with_pool.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "py_prefix_cache.h"
#include "runtime/prefix_pool.h"

namespace tinyloop::py_bind {
namespace {

py::dict stats_dict(const runtime::PrefixPoolStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["evictions"] = s.evictions;
  d["bytes"] = s.bytes;
  d["entries"] = s.entries;
  return d;
}

}  // namespace

void bind_prefix_pool(py::module_& m, ModelClass& cls) {
  using runtime::PrefixPool;
  py::class_<PrefixPool, std::shared_ptr<PrefixPool>>(m, "PrefixPool", R"doc(
PrefixPool(max_bytes=0, max_entries=0)

A registry of PrefixCache entries (Model.register_prefix) that Model.generate_with_pool
searches for the longest registered prefix of each prompt (a token trie, exact). Entries are
keyed by their tokens, the Model that built them, loops and the KV mode. max_bytes (sum of the
entries' PrefixCache.bytes) and max_entries bound it, 0 = no limit; past either, the least
recently used entries (registered or matched) are evicted. An evicted cache stays valid for
whoever still holds it. Safe to use from several threads at once (the GIL is released while
generating). Statistics: hits, misses, evictions, bytes, entries (also stats() as a dict).)doc")
      .def(py::init([](int64_t max_bytes, int64_t max_entries) {
             return std::make_shared<PrefixPool>(max_bytes, max_entries);
           }),
           py::arg("max_bytes") = 0, py::arg("max_entries") = 0)
      .def_property_readonly("max_bytes", &PrefixPool::max_bytes)
      .def_property_readonly("max_entries", &PrefixPool::max_entries)
      .def_property_readonly("hits", [](const PrefixPool& p) { return p.stats().hits; })
      .def_property_readonly("misses", [](const PrefixPool& p) { return p.stats().misses; })
      .def_property_readonly("evictions", [](const PrefixPool& p) { return p.stats().evictions; })
      .def_property_readonly("bytes", [](const PrefixPool& p) { return p.stats().bytes; })
      .def_property_readonly("entries", [](const PrefixPool& p) { return p.stats().entries; })
      .def(
          "stats", [](const PrefixPool& p) { return stats_dict(p.stats()); },
          "A consistent snapshot: {'hits', 'misses', 'evictions', 'bytes', 'entries'}.")
      .def("__len__", [](const PrefixPool& p) { return p.stats().entries; })
      .def("clear", &PrefixPool::clear, py::call_guard<py::gil_scoped_release>(),
           "Drop every entry (the hit/miss/eviction counters stay).")
      .def("__repr__", [](const PrefixPool& p) {
        const auto s = p.stats();
        return "<PrefixPool entries=" + std::to_string(s.entries) + " bytes=" + std::to_string(s.bytes) +
               " hits=" + std::to_string(s.hits) + " misses=" + std::to_string(s.misses) +
               " evictions=" + std::to_string(s.evictions) + ">";
      });

  cls.def(
         "register_prefix",
         [](const PyModel& self, PrefixPool& pool, const py::object& prefix, std::optional<int64_t> loops,
            std::optional<int64_t> cache_window) {
           auto e = self.engine();
           std::shared_ptr<PyPrefixCache> pc;
           if (py::isinstance<PyPrefixCache>(prefix)) {
             pc = prefix.cast<std::shared_ptr<PyPrefixCache>>();
             if (&pc->c->engine() != e.get()) throw py::value_error("prefix: built by a different Model");
             if (loops && *loops != pc->c->loops())
               throw py::value_error("loops=" + std::to_string(*loops) +
                                     " differs from the PrefixCache's loops=" + std::to_string(pc->c->loops()));
             if (cache_window && *cache_window != pc->c->cache_window())
               throw py::value_error(
                   "cache_window=" + std::to_string(*cache_window) +
                   " differs from the PrefixCache's cache_window=" + std::to_string(pc->c->cache_window()));
           } else {
             auto ids = to_ids(prefix, "prefix");
             pc = std::make_shared<PyPrefixCache>();
             py::gil_scoped_release nogil;
             pc->c = runtime::PrefixCache::build(e, std::move(ids), loops, cache_window.value_or(0));
           }
           py::gil_scoped_release nogil;
           pool.insert(pc->c);
           return pc;
         },
         py::arg("pool"), py::arg("prefix"), py::arg("loops") = py::none(), py::arg("cache_window") = py::none(),
         R"doc(Insert a prefix into `pool` as its most recently used entry (evicting least recently used
ones past its capacity) and return its PrefixCache. `prefix` is a PrefixCache built by this
Model, or token ids (np.ndarray[int32] / list), which are prefilled here at `loops` (default
config()["default_loops"]) and `cache_window` (default 0) as build_prefix_cache would.
Registering the same tokens at the same loops and window again replaces the entry. ValueError for a cache from another Model or one larger than
the pool's max_bytes.)doc")
      .def(
          "generate_with_pool",
          [](const PyModel& self, PrefixPool& pool, const py::object& prompt, int64_t max_tokens,
             std::optional<int64_t> loops, double temperature, int64_t top_k, double top_p, int64_t cache_window,
             double repetition_penalty, const py::object& stop_sequences, int64_t early_exit_patience,
             int64_t early_exit_min_L, double early_exit_tau, int64_t early_exit_peek_every,
             double early_exit_logit_margin, std::optional<uint64_t> seed, bool stop_at_eos, const py::object& grammar,
             int64_t kv_loop_slots) {
            auto e = self.engine();
            runtime::GenerateRequest req;
            req.prompt = to_ids(prompt, "prompt");
            fill_request(req, max_tokens, loops, temperature, top_k, top_p, cache_window, repetition_penalty,
                         stop_sequences, seed, stop_at_eos);
            fill_exit_grammar_slots(req, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                    early_exit_logit_margin, grammar, kv_loop_slots);
            return decode_tokens_without_gil([&] { return runtime::generate_with_pool(*e, pool, req); });
          },
          py::arg("pool"), py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("loops") = py::none(),
          py::arg("temperature") = 0.0, py::arg("top_k") = 50, py::arg("top_p") = 1.0, py::arg("cache_window") = 0,
          py::arg("repetition_penalty") = 1.0, py::arg("stop_sequences") = py::list(),
          py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3,
          py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0, py::arg("seed") = py::none(),
          py::arg("stop_at_eos") = true, py::arg("grammar") = py::none(), py::arg("kv_loop_slots") = 0,
          R"doc(generate(prompt, ...) that prefills only what follows the longest prefix of `prompt`
registered in `pool` at these loops (default config()["default_loops"]), cache_window and this
Model's KV mode; returns exactly what generate() returns (prompt + new tokens). A miss (no registered
prefix, or the prompt diverges inside every one) is a plain generate(); nothing is registered
by this call. Counts a hit or a miss in the pool's statistics. Same keyword arguments and
errors as generate_from_prefix_cache (grammar as generate(); beam_size is not accepted).)doc");
}

}  // namespace tinyloop::py_bind
