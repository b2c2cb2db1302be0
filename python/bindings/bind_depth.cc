// Depth-wise scoring (docs/loop-depth.md, section 2): score_logit_lens,
// score_trajectory, score_with_uncertainty, score_with_consistency; and the teacher-forced
// decode hooks of tinyloop_py._testing (benchmarks, tests): stepwise_logits (plain cached
// decoding) and early_exit_stepwise_logits.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <vector>

#include "convert.h"
#include "generate_args.h"
#include "py_model.h"
#include "runtime/depth_scoring.h"
#include "runtime/early_exit.h"
#include "runtime/state_draw.h"

namespace tinyloop::py_bind {
namespace {

using Shape = std::vector<py::ssize_t>;

// A copy of v as a numpy array of `shape` (for the small int / bool / double outputs).
template <typename T, typename U = T>
py::array_t<U> copy_array(const std::vector<T>& v, Shape shape) {
  py::array_t<U> out(shape);
  U* dst = out.mutable_data();
  for (size_t i = 0; i < v.size(); ++i) dst[i] = static_cast<U>(v[i]);
  return out;
}

}  // namespace

void bind_depth(ModelClass& cls, py::module_& testing) {
  cls.def(
         "score_logit_lens",
         [](const PyModel& self, const py::object& prompt, std::optional<int64_t> loops) {
           auto e = self.engine();
           auto ids = to_ids(prompt, "prompt");
           const int64_t L = e->resolve_loops(loops);
           std::vector<float> logits;
           {
             py::gil_scoped_release nogil;
             logits = runtime::score_logit_lens(*e, ids, L);
           }
           return to_numpy(std::move(logits), {static_cast<py::ssize_t>(L), static_cast<py::ssize_t>(ids.size()),
                                               static_cast<py::ssize_t>(e->config().vocab_size)});
         },
         py::arg("prompt"), py::arg("loops") = py::none(),
         R"doc(Logit lens: float32 [loops, seq_len, vocab_size]; [l-1] are the logits read out of the
loop state after iteration l (post-loop norm, post blocks, final norm, head), from ONE forward.
[l-1] equals score(prompt, loops=l). loops defaults to config()["default_loops"].)doc")
      .def(
          "score_trajectory",
          [](const PyModel& self, const py::object& prompt, std::optional<int64_t> loops, const py::object& seed,
             double init_scale) {
            auto e = self.engine();
            auto ids = to_ids(prompt, "prompt");
            const int64_t L = e->resolve_loops(loops);
            runtime::validate_init_scale(e->config(), init_scale);
            std::optional<model::StateDraw> draw;  // default: the file's fixed state
            if (!seed.is_none() || init_scale != 1.0)
              draw = runtime::resolve_state_draw(e->config(), to_seed(seed), init_scale);
            runtime::Trajectory tr;
            {
              py::gil_scoped_release nogil;
              tr = runtime::score_trajectory(*e, ids, L, draw);
            }
            const auto T = static_cast<py::ssize_t>(ids.size());
            const auto D = static_cast<py::ssize_t>(e->config().dim);
            const auto n_pre = static_cast<py::ssize_t>(e->config().n_pre_blocks);
            py::dict d;
            d["embedding"] = to_numpy(std::move(tr.embedding), {T, D});
            d["pre"] = to_numpy(std::move(tr.pre), {n_pre, T, D});
            d["init"] = to_numpy(std::move(tr.init), {T, D});
            d["iterations"] = to_numpy(std::move(tr.iterations), {static_cast<py::ssize_t>(L), T, D});
            return d;
          },
          py::arg("prompt"), py::arg("loops") = py::none(), py::arg("seed") = py::none(), py::arg("init_scale") = 1.0,
          R"doc(Hidden-state trajectory of one forward, float32 arrays in a dict:
  embedding  [seq_len, dim]               embed * embed_scale (+ learned positions)
  pre        [n_pre_blocks, seq_len, dim] output of each pre layer
  init       [seq_len, dim]               the loop's initial state s0
  iterations [loops, seq_len, dim]        loop state after each iteration (loop_norm included,
                                          post_loop_norm not)
seed / init_scale: the random initial state of this forward (a model with init_state_per_call,
Huginn, draws it from seed as generate does; init_scale multiplies its std, 0 = zeros). By
default the file's fixed init_state_seed, as score() uses.)doc")
      .def(
          "score_with_uncertainty",
          [](const PyModel& self, const py::object& prompt, int64_t shallow_loops, int64_t deep_loops) {
            auto e = self.engine();
            auto ids = to_ids(prompt, "prompt");
            runtime::Uncertainty u;
            {
              py::gil_scoped_release nogil;
              u = runtime::score_with_uncertainty(*e, ids, shallow_loops, deep_loops);
            }
            const auto T = static_cast<py::ssize_t>(ids.size());
            const auto V = static_cast<py::ssize_t>(e->config().vocab_size);
            py::dict d;
            d["kl"] = copy_array(u.kl, {T});
            d["shallow_logits"] = to_numpy(std::move(u.shallow_logits), {T, V});
            d["deep_logits"] = to_numpy(std::move(u.deep_logits), {T, V});
            return d;
          },
          py::arg("prompt"), py::arg("shallow_loops"), py::arg("deep_loops"),
          R"doc(Per-position disagreement between two depths of ONE forward. Returns a dict:
  kl             float64 [seq_len]  KL(p_deep || p_shallow) = sum_v p_deep (log p_deep - log p_shallow),
                                    in nats, p = softmax of the raw logits (no temperature)
  shallow_logits float32 [seq_len, vocab_size]  = score(prompt, loops=shallow_loops)
  deep_logits    float32 [seq_len, vocab_size]  = score(prompt, loops=deep_loops)
Needs 1 <= shallow_loops <= deep_loops (ValueError naming the argument).)doc")
      .def(
          "score_with_consistency",
          [](const PyModel& self, const py::object& prompt, int64_t shallow_loops, int64_t deep_loops,
             std::optional<int64_t> escalate_loops) {
            auto e = self.engine();
            auto ids = to_ids(prompt, "prompt");
            runtime::Consistency c;
            {
              py::gil_scoped_release nogil;
              c = runtime::score_with_consistency(*e, ids, shallow_loops, deep_loops, escalate_loops);
            }
            const auto T = static_cast<py::ssize_t>(ids.size());
            const auto V = static_cast<py::ssize_t>(e->config().vocab_size);
            std::vector<int64_t> positions;
            int64_t agree = 0;
            for (py::ssize_t t = 0; t < T; ++t) {
              if (c.escalated[t]) positions.push_back(t);
              else ++agree;
            }
            py::dict d;
            d["shallow_argmax"] = copy_array(c.shallow_argmax, {T});
            d["deep_argmax"] = copy_array(c.deep_argmax, {T});
            d["escalated"] = copy_array<uint8_t, bool>(c.escalated, {T});
            d["escalated_positions"] = copy_array(positions, {static_cast<py::ssize_t>(positions.size())});
            d["agreement"] = static_cast<double>(agree) / static_cast<double>(T);
            d["escalate_loops"] = c.escalate_loops;
            d["final_argmax"] = copy_array(c.final_argmax, {T});
            d["logits"] = to_numpy(std::move(c.logits), {T, V});
            return d;
          },
          py::arg("prompt"), py::arg("shallow_loops"), py::arg("deep_loops"), py::arg("escalate_loops") = py::none(),
          R"doc(Argmax-agreement gate with escalation, from ONE forward. Positions whose argmax at
shallow_loops differs from the one at deep_loops are escalated: their logits are read out at
escalate_loops (default 2 * deep_loops). Returns a dict:
  shallow_argmax, deep_argmax, final_argmax  int32 [seq_len] (ties to the lowest id)
  escalated            bool [seq_len]       shallow_argmax != deep_argmax
  escalated_positions  int64 [n_escalated]
  agreement            float                share of positions that agree
  escalate_loops       int
  logits               float32 [seq_len, vocab_size]  score(prompt, loops=deep_loops) rows, and
                       score(prompt, loops=escalate_loops) rows where escalated
Needs 1 <= shallow_loops <= deep_loops <= escalate_loops (ValueError naming the argument).)doc");

  testing.def(
      "stepwise_logits",
      [](const PyModel& self, const py::object& ids, int64_t prefill_len, std::optional<int64_t> loops,
         int64_t cache_window, int64_t kv_loop_slots) {
        auto e = self.engine();
        auto v = to_ids(ids, "ids");
        std::vector<float> logits;
        {
          py::gil_scoped_release nogil;
          logits = e->stepwise_logits(v, prefill_len, loops, cache_window, kv_loop_slots);
        }
        const auto rows = static_cast<py::ssize_t>(v.size()) - prefill_len + 1;
        return to_numpy(std::move(logits), {rows, static_cast<py::ssize_t>(e->config().vocab_size)});
      },
      py::arg("model"), py::arg("ids"), py::arg("prefill_len"), py::arg("loops") = py::none(),
      py::arg("cache_window") = 0, py::arg("kv_loop_slots") = 0,
      "Logits float32 [len(ids) - prefill_len + 1, vocab_size] of a prefill of ids[:prefill_len] then\n"
      "one cached decode step per remaining id (row r predicts the token after ids[prefill_len - 1 + r]).");
  testing.def(
      "early_exit_stepwise_logits",
      [](const PyModel& self, const py::object& ids, int64_t prefill_len, std::optional<int64_t> loops,
         int64_t early_exit_patience, int64_t early_exit_min_L, double early_exit_tau, int64_t early_exit_peek_every,
         double early_exit_logit_margin) {
        auto e = self.engine();
        auto v = to_ids(ids, "ids");
        const auto p = early_exit_params(early_exit_patience, early_exit_min_L, early_exit_tau, early_exit_peek_every,
                                         early_exit_logit_margin);
        runtime::StepwiseExit r;
        {
          py::gil_scoped_release nogil;
          r = runtime::early_exit_stepwise(*e, v, prefill_len, loops, p);
        }
        const auto rows = static_cast<py::ssize_t>(r.depths.size());
        py::dict d;
        d["depths"] = copy_array(r.depths, {rows});
        d["logits"] = to_numpy(std::move(r.logits), {rows, static_cast<py::ssize_t>(e->config().vocab_size)});
        return d;
      },
      py::arg("model"), py::arg("ids"), py::arg("prefill_len"), py::arg("loops") = py::none(),
      py::arg("early_exit_patience") = 0, py::arg("early_exit_min_L") = 2, py::arg("early_exit_tau") = 1e-3,
      py::arg("early_exit_peek_every") = 1, py::arg("early_exit_logit_margin") = 0.0,
      R"doc(Teacher-forced early exit. Prefill ids[:prefill_len] at full
depth, then feed each remaining id through one early-exit decode step. Returns a dict: logits
float32 [len(ids) - prefill_len + 1, vocab_size] (row r predicts the token after
ids[prefill_len - 1 + r]) and depths int64 [rows] (iterations behind each row; row 0 is the
prefill). early_exit_patience=0 is plain cached decoding.)doc");
}

}  // namespace tinyloop::py_bind
