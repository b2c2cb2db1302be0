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
void bind_sampler(py::module_& testing);
void bind_runtime(py::module_& m, py::module_& testing);
void bind_depth(ModelClass& cls, py::module_& testing);
void bind_resume(py::module_& m, ModelClass& cls);
void bind_prefix_cache(py::module_& m, ModelClass& cls);
void bind_prefix_pool(py::module_& m, ModelClass& cls);
void bind_speculative(py::module_& m, ModelClass& cls);
void bind_beam(py::module_& testing);
void bind_grammar(py::module_& m, py::module_& testing);
void bind_serving(py::module_& m);
void bind_schema(py::module_& m);
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

  // Test and benchmark hooks live apart from the API, in tinyloop_py._testing (a model or
  // grammar is their first argument), so nothing public starts with "_"
  // (tests/python/test_public_names.py).
  py::module_ testing =
      m.def_submodule("_testing", "Test and benchmark hooks: not part of the API, may change without notice.");
  // Registered in sys.modules too, so `import tinyloop_py._testing` works as for a package.
  py::module_::import("sys").attr("modules")["tinyloop_py._testing"] = testing;

  ModelClass cls(m, "Model");
  bind_model(m, cls);
  bind_sampler(testing);
  bind_runtime(m, testing);
  bind_depth(cls, testing);
  bind_resume(m, cls);
  bind_prefix_cache(m, cls);
  bind_prefix_pool(m, cls);
  bind_speculative(m, cls);
  bind_beam(testing);
  bind_grammar(m, testing);
  bind_serving(m);
  bind_schema(m);
}
