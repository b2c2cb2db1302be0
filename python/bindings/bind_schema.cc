// The config schema and the container constants for the Python package
// (docs/model-format.md, "Adding a config field"): python/tinyloop/config.py and format.py
// read these instead of keeping their own copies of the format.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "tinyloop/config.h"
#include "tinyloop/config_tensors.h"
#include "tinyloop/container_format.h"
#include "tinyloop/model_file.h"

namespace tinyloop::py_bind {
namespace py = pybind11;

namespace {
py::object json_loads(const std::string& text) { return py::module_::import("json").attr("loads")(text); }
}  // namespace

void bind_schema(py::module_& m) {
  m.def(
      "config_schema", [] { return json_loads(config_schema_json()); },
      R"doc(The config fields of a .tinyloop file, in the doc table's order (docs/model-format.md).

A list of dicts: name, kind ("int", "uint64", "float", "bool", "enum", "int_or_null",
"int_list"), presence ("required", "optional", or "derived": defaulted from other fields),
default (None unless optional), doc; "min" / "max" (None: unlimited) for int fields,
"choices" for enum fields. Declared once in include/tinyloop/config_fields.def.)doc");
  m.def(
      "container_format", [] { return json_loads(container_format_json()); },
      R"doc(The .tinyloop container's constants (docs/model-format.md, "Layout"): header_len_bytes,
data_alignment, metadata_key, metadata_keys, format_name, format_versions,
format_version_float, format_version_quant, and dtypes (name -> size, use
("float" | "quantized" | "unsupported"), scale: allowed for .scales / .offsets).)doc");
  m.def(
      "check_config",
      [](const std::string& config_json) {
        std::string out;
        {
          py::gil_scoped_release nogil;
          out = config_to_json(parse_config(config_json));
        }
        return json_loads(out);
      },
      py::arg("config_json"),
      R"doc(Parse and check a config as the loader does (JSON text in); returns it with every
field filled, as a dict in the doc table's order. Raises ModelFormatError (a ValueError)
naming the field: unknown, missing, wrong type, out of range, or a broken consistency rule.)doc");
  m.def(
      "expected_tensors",
      [](const std::string& config_json) {
        TensorShapeList list;
        {
          py::gil_scoped_release nogil;
          list = expected_tensor_list(parse_config(config_json));
        }
        py::dict out;  // insertion-ordered: the documented tensor order
        for (const auto& [name, shape] : list) out[py::str(name)] = py::tuple(py::cast(shape));
        return out;
      },
      py::arg("config_json"),
      R"doc(Every tensor a config (JSON text) needs -> its shape (a tuple), in the order of
docs/model-format.md "Tensor names", as the loader expects them. Raises ModelFormatError
for a config the loader refuses.)doc");
  m.def(
      "check_model_file",
      [](const std::string& path) {
        std::string config;
        {
          py::gil_scoped_release nogil;
          config = config_to_json(ModelFile::open(path)->config());
        }
        return json_loads(config);
      },
      py::arg("path"),
      R"doc(Validate a .tinyloop file exactly as Model() does when it loads one (the container, the
config, every tensor against the config; docs/model-format.md "The loader checks") without
building a model. Returns the config with every field filled, as a dict. Raises
ModelFormatError (a ValueError) naming the problem, FileNotFoundError for a missing path.)doc");
}

}  // namespace tinyloop::py_bind
