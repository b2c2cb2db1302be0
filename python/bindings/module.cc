// tinyloop_py: the Python frontend (README.md "Python", docs/generation.md).
// Thin: converts arguments, releases the GIL around compute, maps C++ errors to Python ones.
// Each bind_*.cc file adds one section of the API.
#include <pybind11/pybind11.h>

#include <cstring>
#include <exception>

#include "py_model.h"
#include "tinyloop/errors.h"

namespace tinyloop::py_bind {
void bind_model(py::module_& m, ModelClass& cls);
void bind_sampler(py::module_& m);
void bind_runtime(py::module_& m);
void bind_depth(py::module_& m, ModelClass& cls);
void bind_resume(py::module_& m, ModelClass& cls);
void bind_prefix_cache(py::module_& m, ModelClass& cls);
void bind_prefix_pool(py::module_& m, ModelClass& cls);
void bind_speculative(py::module_& m, ModelClass& cls);
void bind_beam(py::module_& m, ModelClass& cls);
void bind_grammar(py::module_& m);
void bind_serving(py::module_& m);
}  // namespace tinyloop::py_bind

namespace py = pybind11;
using namespace tinyloop;
using namespace tinyloop::py_bind;

PYBIND11_MODULE(tinyloop_py, m) {
  m.doc() = "TinyLoop: inference runtime for looped (weight-shared, recurrent-depth) transformers";

  // ModelFormatError: a ValueError for malformed model files (FormatError in C++).
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> format_error;
  format_error.call_once_and_store_result(
      [&]() { return py::exception<FormatError>(m, "ModelFormatError", PyExc_ValueError); });
  // Messages are decoded with backslashreplace: a message holding bytes that are not UTF-8
  // must still reach Python as the documented exception (never a UnicodeDecodeError).
  py::register_exception_translator([](std::exception_ptr p) {
    auto set = [](PyObject* type, const char* what) {
      PyObject* msg = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
      if (!msg) {
        PyErr_Clear();
        msg = PyUnicode_FromString("(unprintable error message)");
      }
      PyErr_SetObject(type, msg);
      Py_XDECREF(msg);
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const FormatError& e) {
      set(format_error.get_stored().ptr(), e.what());
    } catch (const FileNotFound& e) {
      set(PyExc_FileNotFoundError, e.what());
    }
  });

  ModelClass cls(m, "Model");
  bind_model(m, cls);
  bind_sampler(m);
  bind_runtime(m);
  bind_depth(m, cls);
  bind_resume(m, cls);
  bind_prefix_cache(m, cls);
  bind_prefix_pool(m, cls);
  bind_speculative(m, cls);
  bind_beam(m, cls);
  bind_grammar(m);
  bind_serving(m);
}
