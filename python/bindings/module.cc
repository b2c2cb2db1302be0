// tinyloop_py: the Python frontend (spec/python-api.txt, spec/generation.txt).
// Thin: converts arguments, releases the GIL around compute, maps C++ errors to Python ones.
// Each bind_*.cc file adds one section of the API.
#include <pybind11/pybind11.h>

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
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const FormatError& e) {
      py::set_error(format_error.get_stored(), e.what());
    } catch (const FileNotFound& e) {
      py::set_error(PyExc_FileNotFoundError, e.what());
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
