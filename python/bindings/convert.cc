#include "convert.h"

#include <string>

namespace tinyloop::py_bind {

// A 1-D integer array (or list) of token ids -> int32 vector; ids are range-checked later
// by the engine against the vocabulary, here only against int32.
std::vector<int32_t> to_ids(const py::handle& obj, const char* what) {
  py::module_ np = py::module_::import("numpy");
  py::array arr = np.attr("asarray")(obj);
  if (arr.ndim() != 1)
    throw py::value_error(std::string(what) + " must be a 1-D array of token ids, got " +
                          std::to_string(arr.ndim()) + " dimensions");
  if (arr.size() == 0) throw py::value_error(std::string(what) + " must not be empty");
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw py::value_error(std::string(what) + " must hold integer token ids, got dtype " +
                          py::str(arr.dtype()).cast<std::string>());
  auto ids64 = arr.attr("astype")(np.attr("int64")).cast<py::array_t<int64_t>>();
  std::vector<int32_t> out(ids64.size());
  auto r = ids64.unchecked<1>();
  for (py::ssize_t i = 0; i < r.shape(0); ++i) {
    if (r(i) < 0 || r(i) > INT32_MAX)
      throw py::value_error(std::string(what) + ": token id " + std::to_string(r(i)) +
                            " at index " + std::to_string(i) + " is outside [0, vocab_size)");
    out[i] = static_cast<int32_t>(r(i));
  }
  return out;
}

std::vector<std::vector<int32_t>> to_stop_sequences(const py::object& obj) {
  std::vector<std::vector<int32_t>> out;
  if (obj.is_none()) return out;
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj))
    throw py::value_error("stop_sequences must be a list of token-id lists, got a string");
  py::sequence seq;
  try {
    seq = obj.cast<py::sequence>();
  } catch (const py::cast_error&) {
    throw py::value_error("stop_sequences must be a list of token-id lists");
  }
  for (size_t i = 0; i < seq.size(); ++i) {
    py::object s = seq[i];
    if (py::isinstance<py::int_>(s))
      throw py::value_error("stop_sequences[" + std::to_string(i) +
                            "] must be a list of token ids, got an int");
    py::module_ np = py::module_::import("numpy");
    py::array arr = np.attr("asarray")(s);
    if (arr.ndim() != 1 || (arr.size() > 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
      throw py::value_error("stop_sequences[" + std::to_string(i) + "] must be a list of token ids");
    if (arr.size() == 0)
      throw py::value_error("stop_sequences[" + std::to_string(i) + "] is empty");
    std::vector<int32_t> ids;
    for (auto v : arr.attr("tolist")().cast<py::list>()) {
      const int64_t id = v.cast<int64_t>();
      if (id < 0 || id > INT32_MAX)
        throw py::value_error("stop_sequences[" + std::to_string(i) + "]: token id " +
                              std::to_string(id) + " is outside [0, vocab_size)");
      ids.push_back(static_cast<int32_t>(id));
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// A heap vector handed to numpy without a copy.
py::array_t<float> to_numpy(std::vector<float>&& v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<float>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>(shape, heap->data(), owner);
}

}  // namespace tinyloop::py_bind
