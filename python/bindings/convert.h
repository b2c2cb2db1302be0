// Python -> C++ argument conversion shared by every binding file.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace tinyloop::py_bind {
namespace py = pybind11;

// A 1-D integer array (or list) of token ids -> int32 vector. ValueError naming `what` for
// another shape, a non-integer dtype, an empty array or an id outside [0, 2^31). The engine
// range-checks ids against the vocabulary.
std::vector<int32_t> to_ids(const py::handle& obj, const char* what);
// stop_sequences: a list of non-empty token-id lists (None = none).
std::vector<std::vector<int32_t>> to_stop_sequences(const py::object& obj);
// A heap vector handed to numpy without a copy.
py::array_t<float> to_numpy(std::vector<float>&& v, std::vector<py::ssize_t> shape);

}  // namespace tinyloop::py_bind
