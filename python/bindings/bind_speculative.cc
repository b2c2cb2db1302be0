// Self-speculative decoding: Model.generate_speculative and Model.generate_tree_speculative
// (docs/speculative.md).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "runtime/speculative.h"
#include "runtime/tree_speculative.h"

namespace tinyloop::py_bind {
namespace {

runtime::SpeculativeRequest make_request(const py::object& prompt, int64_t max_tokens, int64_t draft_loops,
                                         int64_t verify_loops, int64_t draft_ahead, int64_t k_branches,
                                         double temperature, int64_t top_k, double top_p, double repetition_penalty,
                                         int64_t cache_window, const py::object& stop_sequences,
                                         std::optional<uint64_t> seed, bool stop_at_eos, const py::object& grammar,
                                         int64_t kv_loop_slots, int64_t early_exit_patience, int64_t early_exit_min_L,
                                         double early_exit_tau, int64_t early_exit_peek_every,
                                         double early_exit_logit_margin) {
  runtime::SpeculativeRequest r;
  r.prompt = to_ids(prompt, "prompt");
  r.draft_loops = draft_loops;
  r.verify_loops = verify_loops;
  r.draft_ahead = draft_ahead;
  r.k_branches = k_branches;
  fill_sampling_and_stops(r, max_tokens, temperature, top_k, top_p, cache_window, repetition_penalty, stop_sequences,
                          seed, stop_at_eos);
  fill_exit_grammar_slots(r, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                          early_exit_logit_margin, grammar, kv_loop_slots);
  return r;
}

py::dict to_dict(const runtime::SpeculativeResult& res) {
  py::dict d;
  d["tokens"] = res.tokens;
  d["accept_rate"] = res.accept_rate();
  d["draft_calls"] = res.draft_calls;
  d["verify_calls"] = res.verify_calls;
  d["tokens_per_verify"] = res.tokens_per_verify();
  d["drafted_tokens"] = res.drafted;
  d["accepted_tokens"] = res.accepted;
  d["tokens_emitted"] = res.tokens_emitted;
  return d;
}

// One speculative decode (chain or tree: run) with the GIL released, as a result dict.
template <class Run>
py::dict run_speculative(const PyModel& self, const runtime::SpeculativeRequest& req, Run run) {
  auto e = self.engine();
  runtime::SpeculativeResult res;
  {
    py::gil_scoped_release nogil;
    res = run(*e, req);
  }
  return to_dict(res);
}

constexpr const char* kResultDoc =
    " Returns {'tokens': prompt + new tokens, 'accept_rate': accepted_tokens / drafted_tokens,"
    " 'draft_calls', 'verify_calls', 'tokens_per_verify': tokens_emitted / verify_calls,"
    " 'drafted_tokens', 'accepted_tokens', 'tokens_emitted'}.";

}  // namespace

void bind_speculative(py::module_& m, ModelClass& cls) {
  (void)m;
  cls.def(
      "generate_speculative",
      [](const PyModel& self, const py::object& prompt, int64_t max_tokens, int64_t draft_loops, int64_t verify_loops,
         int64_t draft_ahead, double temperature, int64_t top_k, double top_p, double repetition_penalty,
         int64_t cache_window, const py::object& stop_sequences, std::optional<uint64_t> seed, bool stop_at_eos,
         const py::object& grammar, int64_t kv_loop_slots, int64_t early_exit_patience, int64_t early_exit_min_L,
         double early_exit_tau, int64_t early_exit_peek_every, double early_exit_logit_margin) {
        return run_speculative(self,
                               make_request(prompt, max_tokens, draft_loops, verify_loops, draft_ahead, 1, temperature,
                                            top_k, top_p, repetition_penalty, cache_window, stop_sequences, seed,
                                            stop_at_eos, grammar, kv_loop_slots, early_exit_patience, early_exit_min_L,
                                            early_exit_tau, early_exit_peek_every, early_exit_logit_margin),
                               runtime::generate_speculative);
      },
      py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("draft_loops") = 2, py::arg("verify_loops") = 8,
      py::arg("draft_ahead") = 4, py::arg("temperature") = 0.0, py::arg("top_k") = 50, py::arg("top_p") = 1.0,
      py::arg("repetition_penalty") = 1.0, py::arg("cache_window") = 0, py::arg("stop_sequences") = py::list(),
      py::arg("seed") = py::none(), py::arg("stop_at_eos") = true, py::arg("grammar") = py::none(),
      py::arg("kv_loop_slots") = 0, py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2,
      py::arg("early_exit_tau") = 1e-3, py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0,
      (std::string("Self-speculative decoding: draft draft_ahead tokens at draft_loops, verify them in"
                   " one forward at verify_loops (same weights). Greedy output equals"
                   " generate(loops=verify_loops); sampling keeps the verifier's distribution."
                   " grammar, early_exit_* and kv_loop_slots are accepted only to refuse them with"
                   " the reason (ValueError).") +
       kResultDoc)
          .c_str());
  cls.def(
      "generate_tree_speculative",
      [](const PyModel& self, const py::object& prompt, int64_t max_tokens, int64_t draft_loops, int64_t verify_loops,
         int64_t draft_ahead, int64_t k_branches, double temperature, int64_t top_k, double top_p,
         double repetition_penalty, int64_t cache_window, const py::object& stop_sequences,
         std::optional<uint64_t> seed, bool stop_at_eos, const py::object& grammar, int64_t kv_loop_slots,
         int64_t early_exit_patience, int64_t early_exit_min_L, double early_exit_tau, int64_t early_exit_peek_every,
         double early_exit_logit_margin) {
        return run_speculative(
            self,
            make_request(prompt, max_tokens, draft_loops, verify_loops, draft_ahead, k_branches, temperature, top_k,
                         top_p, repetition_penalty, cache_window, stop_sequences, seed, stop_at_eos, grammar,
                         kv_loop_slots, early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                         early_exit_logit_margin),
            runtime::generate_tree_speculative);
      },
      py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("draft_loops") = 2, py::arg("verify_loops") = 8,
      py::arg("draft_ahead") = 4, py::arg("K_branches") = 1, py::arg("temperature") = 0.0, py::arg("top_k") = 50,
      py::arg("top_p") = 1.0, py::arg("repetition_penalty") = 1.0, py::arg("cache_window") = 0,
      py::arg("stop_sequences") = py::list(), py::arg("seed") = py::none(), py::arg("stop_at_eos") = true,
      py::arg("grammar") = py::none(), py::arg("kv_loop_slots") = 0, py::arg("early_exit_patience") = 0,
      py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3, py::arg("early_exit_peek_every") = 1,
      py::arg("early_exit_logit_margin") = 0.0,
      (std::string("Tree self-speculative decoding: K_branches draft candidates at the root, each"
                   " extended to draft_ahead tokens at draft_loops, the whole tree verified in one"
                   " forward with a tree mask at verify_loops. K_branches * draft_ahead <= 64.") +
       kResultDoc)
          .c_str());
}

}  // namespace tinyloop::py_bind
