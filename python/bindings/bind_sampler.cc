// The C++ sampler exposed for testing against the numpy reference (tinyloop_py._testing).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "convert.h"
#include "runtime/sampler.h"

namespace tinyloop::py_bind {

void bind_sampler(py::module_& testing) {
  testing.def(
      "sampling_distribution",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, double temperature, int64_t top_k,
         double top_p) {
        runtime::SamplingParams p;
        p.temperature = static_cast<float>(temperature);
        p.top_k = static_cast<int>(top_k);
        p.top_p = static_cast<float>(top_p);
        runtime::validate(p);
        if (p.greedy()) throw py::value_error("temperature must be > 0.01 for a sampling distribution");
        std::vector<float> probs;
        runtime::sampling_distribution(logits.data(), logits.size(), p, probs);
        return to_numpy(std::move(probs), {static_cast<py::ssize_t>(logits.size())});
      },
      py::arg("logits"), py::arg("temperature"), py::arg("top_k") = 50, py::arg("top_p") = 1.0);
  testing.def(
      "sample_next",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, double temperature, int64_t top_k,
         double top_p, double repetition_penalty, std::vector<int32_t> seen, uint64_t seed, int64_t n_draws) {
        runtime::SamplingParams p;
        p.temperature = static_cast<float>(temperature);
        p.top_k = static_cast<int>(top_k);
        p.top_p = static_cast<float>(top_p);
        p.repetition_penalty = static_cast<float>(repetition_penalty);
        runtime::validate(p);
        runtime::Rng rng(seed);
        std::vector<int32_t> out;
        for (int64_t i = 0; i < n_draws; ++i) {
          std::vector<float> l(logits.data(), logits.data() + logits.size());
          out.push_back(runtime::sample_next(l.data(), static_cast<int64_t>(l.size()), p, seen, rng));
        }
        return out;
      },
      py::arg("logits"), py::arg("temperature"), py::arg("top_k") = 50, py::arg("top_p") = 1.0,
      py::arg("repetition_penalty") = 1.0, py::arg("seen") = std::vector<int32_t>(), py::arg("seed") = 0,
      py::arg("n_draws") = 1);
}

}  // namespace tinyloop::py_bind
