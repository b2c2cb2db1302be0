// Beam search hooks for tests and benchmarks (docs/beam-search.md). generate(beam_size=...)
// itself is bound with the other decode kwargs in bind_model.cc.
//   tinyloop_py._testing.beam_search_core(log_probs, vocab_size, max_tokens, beam_size, ...): the search
//     core over a Python callback, so tests can compare it with an independent Python beam
//     search on hand-made log-probabilities;
//   tinyloop_py._testing.beam_search_memory(model, prompt, ...): the KV figures of one beam_generate call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "runtime/beam_search.h"

namespace tinyloop::py_bind {
namespace {

// BeamModel over Python: log_probs(beams: list[list[int]]) -> float64 [len(beams), V].
class PyBeamModel : public runtime::BeamModel {
 public:
  PyBeamModel(py::object fn, int64_t V, std::vector<int32_t> enders)
      : fn_(std::move(fn)), V_(V), enders_(std::move(enders)) {}
  void log_probs(int64_t n, std::vector<double>& out) override {
    py::array_t<double, py::array::c_style | py::array::forcecast> a = fn_(beams_);
    if (a.ndim() != 2 || a.shape(0) != n || a.shape(1) != V_)
      throw std::invalid_argument("log_probs must return an array of shape [" + std::to_string(n) + ", " +
                                  std::to_string(V_) + "]");
    std::copy(a.data(), a.data() + n * V_, out.begin());
  }
  bool ends(int64_t, int32_t token) override {
    return std::find(enders_.begin(), enders_.end(), token) != enders_.end();
  }
  void select(const std::vector<int64_t>& parent, const std::vector<int32_t>& token) override {
    std::vector<std::vector<int32_t>> next;
    for (size_t i = 0; i < parent.size(); ++i) {
      next.push_back(beams_[parent[i]]);
      next.back().push_back(token[i]);
    }
    beams_ = std::move(next);
  }

 private:
  py::object fn_;
  int64_t V_;
  std::vector<int32_t> enders_;
  std::vector<std::vector<int32_t>> beams_{{}};
};

}  // namespace

void bind_beam(py::module_& testing) {
  testing.def(
      "beam_search_core",
      [](py::object log_probs, int64_t vocab_size, int64_t max_tokens, int64_t beam_size, double length_penalty,
         bool early_stopping, std::vector<int32_t> enders) {
        PyBeamModel model(std::move(log_probs), vocab_size, std::move(enders));
        const auto r = runtime::beam_search_core(model, vocab_size, max_tokens,
                                                 beam_params(beam_size, length_penalty, early_stopping));
        py::dict d;
        d["tokens"] = r.tokens;
        d["log_prob"] = r.log_prob;
        d["score"] = r.score;
        d["steps"] = r.steps;
        return d;
      },
      py::arg("log_probs"), py::arg("vocab_size"), py::arg("max_tokens"), py::arg("beam_size"),
      py::arg("length_penalty") = 1.0, py::arg("early_stopping") = true, py::arg("enders") = std::vector<int32_t>{},
      "Testing hook: the beam search core over log_probs(beams: list[list[int]]) -> float64 [n, V]\n"
      "(-inf = not allowed); a token in `enders` ends its hypothesis. Returns {tokens, log_prob, score, steps}.");

  testing.def(
      "beam_search_memory",
      [](const PyModel& self, const py::object& prompt, int64_t max_tokens, int64_t beam_size,
         std::optional<int64_t> loops, double length_penalty, bool early_stopping, bool stop_at_eos) {
        auto e = self.engine();
        runtime::GenerateRequest req;
        req.prompt = to_ids(prompt, "prompt");
        req.max_tokens = max_tokens;
        req.loops = loops;
        req.stop_at_eos = stop_at_eos;
        const auto beam = beam_params(beam_size, length_penalty, early_stopping);
        runtime::BeamMemory mem;
        runtime::GenerateResult res;
        int64_t single = 0;
        {
          py::gil_scoped_release nogil;
          res = runtime::beam_generate(*e, req, beam, {}, &mem);
          // What generate() (beam 1) holds by the end of the same call: one cache of prompt +
          // max_tokens, every position written (its pool grows as it writes, so reserve them).
          const int64_t total = int64_t(req.prompt.size()) + max_tokens;
          auto greedy = e->new_cache(e->resolve_loops(loops), total, 0, e->kv_dtype());
          greedy->reserve(total);
          single = greedy->bytes();
        }
        py::dict d;
        d["tokens"] = res.tokens;
        d["prefix_bytes"] = mem.prefix_bytes;
        d["tail_bytes"] = mem.tail_bytes;
        d["peak_tails"] = mem.peak_tails;
        d["peak_bytes"] = mem.peak_bytes;
        d["naive_bytes"] = mem.naive_bytes;
        d["tail_rows_copied"] = mem.tail_rows_copied;
        d["greedy_cache_bytes"] = single;
        return d;
      },
      py::arg("model"), py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("beam_size") = 4,
      py::arg("loops") = py::none(), py::arg("length_penalty") = 1.0, py::arg("early_stopping") = true,
      py::arg("stop_at_eos") = true,
      "Benchmark hook: one beam search call's KV figures: prefix_bytes (the prompt, shared), tail_bytes\n"
      "(one beam's generated tokens), peak_tails, peak_bytes, naive_bytes (beam_size full caches, the\n"
      "spec's scheme), tail_rows_copied, greedy_cache_bytes (generate()'s one cache), tokens.");
}

}  // namespace tinyloop::py_bind
