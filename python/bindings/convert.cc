#include "convert.h"

#include <optional>
#include <string>

namespace tinyloop::py_bind {
namespace {

// A Python int (numpy integers included) as its exact text when it does not fit int64.
std::string int_text(const py::handle& v) { return py::str(v).cast<std::string>(); }

// The id v if it is an integer in [0, INT32_MAX], else nullopt (any size: no wrap, no
// "Unable to cast" for a uint64 or a bignum).
std::optional<int32_t> small_id(const py::handle& v) {
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  if (overflow != 0 || x < 0 || x > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(x);
}

}  // namespace

// A 1-D integer array (or list) of token ids -> int32 vector; ids are range-checked later
// by the engine against the vocabulary, here only against int32.
std::vector<int32_t> to_ids(const py::handle& obj, const char* what) {
  py::module_ np = py::module_::import("numpy");
  py::array arr = np.attr("asarray")(obj);
  if (arr.ndim() != 1)
    throw py::value_error(std::string(what) + " must be a 1-D array of token ids, got " + std::to_string(arr.ndim()) +
                          " dimensions");
  if (arr.size() == 0) throw py::value_error(std::string(what) + " must not be empty");
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw py::value_error(std::string(what) + " must hold integer token ids, got dtype " +
                          py::str(arr.dtype()).cast<std::string>());
  if (kind == 'u') {  // uint64 ids above INT64_MAX would wrap to negatives in astype(int64)
    auto u = arr.attr("astype")(np.attr("uint64")).cast<py::array_t<uint64_t>>();
    auto r = u.unchecked<1>();
    for (py::ssize_t i = 0; i < r.shape(0); ++i)
      if (r(i) > uint64_t(INT32_MAX))
        throw py::value_error(std::string(what) + ": token id " + std::to_string(r(i)) + " at index " +
                              std::to_string(i) + " is outside [0, vocab_size)");
  }
  auto ids64 = arr.attr("astype")(np.attr("int64")).cast<py::array_t<int64_t>>();
  std::vector<int32_t> out(ids64.size());
  auto r = ids64.unchecked<1>();
  for (py::ssize_t i = 0; i < r.shape(0); ++i) {
    if (r(i) < 0 || r(i) > INT32_MAX)
      throw py::value_error(std::string(what) + ": token id " + std::to_string(r(i)) + " at index " +
                            std::to_string(i) + " is outside [0, vocab_size)");
    out[i] = static_cast<int32_t>(r(i));
  }
  return out;
}

std::vector<std::vector<int32_t>> to_stop_sequences(const py::object& obj) {
  std::vector<std::vector<int32_t>> out;
  if (obj.is_none()) return out;
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj))
    throw py::value_error("stop_sequences must be a list of token-id lists, got a string");
  if (!PySequence_Check(obj.ptr()))
    throw py::value_error("stop_sequences must be a list of token-id lists, got " +
                          std::string(Py_TYPE(obj.ptr())->tp_name));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  for (size_t i = 0; i < seq.size(); ++i) {
    py::object s = seq[i];
    if (py::isinstance<py::int_>(s))
      throw py::value_error("stop_sequences[" + std::to_string(i) + "] must be a list of token ids, got an int");
    py::module_ np = py::module_::import("numpy");
    py::array arr = np.attr("asarray")(s);
    if (arr.ndim() != 1 || (arr.size() > 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
      throw py::value_error("stop_sequences[" + std::to_string(i) + "] must be a list of token ids");
    if (arr.size() == 0) throw py::value_error("stop_sequences[" + std::to_string(i) + "] is empty");
    std::vector<int32_t> ids;
    for (auto v : arr.attr("tolist")().cast<py::list>()) {
      const auto id = small_id(v);
      if (!id)
        throw py::value_error("stop_sequences[" + std::to_string(i) + "]: token id " + int_text(v) +
                              " is outside [0, vocab_size)");
      ids.push_back(*id);
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
