// tl.Grammar: byte-regex grammars for constrained decoding (docs/grammar.md). Held by shared_ptr so generate() can keep the
// grammar alive while it decodes with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/patterns.h"

namespace tinyloop::py_bind {
namespace py = pybind11;
using grammar::Grammar;
using grammar::JsonShape;

namespace {

std::shared_ptr<Grammar> compile(std::string pattern) {
  py::gil_scoped_release release;  // large patterns take a while to compile
  return std::make_shared<Grammar>(std::move(pattern));
}

// A pattern is bytes; show it as str when it is valid UTF-8 (the usual case).
py::object pattern_object(const std::string& p) {
  PyObject* s = PyUnicode_DecodeUTF8(p.data(), static_cast<Py_ssize_t>(p.size()), "strict");
  if (s) return py::reinterpret_steal<py::object>(s);
  PyErr_Clear();
  return py::bytes(p);
}

// {"name": "string", "tags": ["string"], "pos": {"x": "number"}} -> JsonShape.
// Recursive, so the depth is checked first: a 20,000-deep dict once overflowed the stack.
JsonShape to_shape(const py::handle& v, const std::string& where, int depth = 0) {
  if (depth > grammar::kMaxJsonDepth)
    throw py::value_error("json_object: shape nested deeper than " + std::to_string(grammar::kMaxJsonDepth) +
                          " levels (at " + where + ")");
  if (py::isinstance<py::str>(v)) return JsonShape::scalar(v.cast<std::string>());
  if (py::isinstance<py::dict>(v)) {
    JsonShape s;
    s.kind = JsonShape::kObject;
    for (auto item : v.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first))
        throw py::type_error("json_object: keys must be str (at " + where + ")");
      std::string key = item.first.cast<std::string>();
      s.fields.emplace_back(key, to_shape(item.second, where + "." + key, depth + 1));
    }
    return s;
  }
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    py::sequence seq = v.cast<py::sequence>();
    if (seq.size() != 1)
      throw py::value_error("json_object: an array shape is a list with exactly one item shape (at " + where + ")");
    JsonShape s;
    s.kind = JsonShape::kArray;
    s.item.push_back(to_shape(seq[0], where + "[]", depth + 1));
    return s;
  }
  throw py::type_error("json_object: a shape is a type name (str), a dict or a one-element list (at " + where + ")");
}

py::array_t<bool> mask_to_numpy(const grammar::Bitset& mask) {
  py::array_t<bool> out(static_cast<py::ssize_t>(mask.size()));
  bool* p = out.mutable_data();
  const auto& words = mask.words();
  for (int64_t i = 0; i < mask.size(); ++i) p[i] = (words[i >> 6] >> (i & 63)) & 1u;
  return out;
}

// The grammar's share of one decode step, timed in C++ so Python call overhead and numpy
// conversion do not swamp it: mask lookup (allowed), applying it to a row of logits
// (mask_logits) and advancing by the chosen token. Walks `token_ids` from the initial state
// `passes` times; pass 0 is whatever the cache holds on entry (fresh after
// set_token_vocabulary: first use). Nanoseconds per step, [passes][steps] for each part.
std::map<std::string, std::vector<std::vector<double>>> time_mask_steps(const Grammar& g,
                                                                        const std::vector<int32_t>& token_ids,
                                                                        int passes) {
  using Clock = std::chrono::steady_clock;
  auto v = g.vocabulary();
  std::vector<float> logits(v->vocab_size(), 0.0f);
  std::map<std::string, std::vector<std::vector<double>>> out;
  auto ns = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::nano>(b - a).count();
  };
  for (int p = 0; p < passes; ++p) {
    std::vector<double> lookup, apply, advance;
    int32_t s = g.initial_state();
    for (int32_t t : token_ids) {
      auto t0 = Clock::now();
      const grammar::Bitset& mask = v->allowed(s);
      auto t1 = Clock::now();
      grammar::mask_logits(mask, logits.data(), v->vocab_size());
      auto t2 = Clock::now();
      s = v->advance(s, t);
      auto t3 = Clock::now();
      if (s == Grammar::kDead)
        throw std::invalid_argument("token walk leaves the grammar at token " + std::to_string(t));
      lookup.push_back(ns(t0, t1));
      apply.push_back(ns(t1, t2));
      advance.push_back(ns(t2, t3));
    }
    out["lookup"].push_back(std::move(lookup));
    out["apply"].push_back(std::move(apply));
    out["advance"].push_back(std::move(advance));
  }
  return out;
}

}  // namespace

void bind_grammar(py::module_& m, py::module_& testing) {
  py::class_<Grammar, std::shared_ptr<Grammar>> cls(m, "Grammar", R"doc(
A byte regular expression the whole output must match, compiled to a DFA (docs/grammar.md).

    g = tl.Grammar(r'\{"name":"[a-z]+"\}')
    g.set_token_vocabulary(token_bytes)   # one bytes object per token id
    model.generate(prompt, grammar=g, ...)

A bad pattern raises ValueError naming the problem and its byte position. States are ints;
Grammar.DEAD (-1) means the output can no longer match. A Grammar may be shared by several
threads / generate calls at once: masks are computed once per state and cached.)doc");
  cls.def(py::init(&compile), py::arg("pattern"), "Compile `pattern` (str, UTF-8 encoded, or bytes).")
      .def_property_readonly("pattern", [](const Grammar& g) { return pattern_object(g.pattern()); })
      .def_property_readonly("num_states", &Grammar::num_states)
      .def_property_readonly(
          "vocab_size",
          [](const Grammar& g) -> std::optional<int64_t> {
            if (!g.has_vocabulary()) return std::nullopt;
            return g.vocabulary()->vocab_size();
          },
          "Tokens in the vocabulary, None before set_token_vocabulary.")
      .def("set_token_vocabulary", &Grammar::set_token_vocabulary, py::arg("token_bytes"),
           py::call_guard<py::gil_scoped_release>(),
           "One bytes object (str: UTF-8) per token id. Empty ones are never allowed; EOS is "
           "handled by eos_allowed(). ValueError for an empty list.")
      .def("matches", &Grammar::matches, py::arg("data"), "Whether `data` (bytes, or str as UTF-8) matches as a whole.")
      .def("initial_state", &Grammar::initial_state)
      .def("advance", &Grammar::advance, py::arg("state"), py::arg("token_id"),
           "State after the token's bytes, or DEAD when the token is not allowed in `state`.")
      .def("advance_bytes", &Grammar::advance_bytes, py::arg("state"), py::arg("data"),
           "State after `data`, or DEAD once the output can no longer match.")
      .def(
          "allowed_tokens",
          [](const Grammar& g, int32_t state) {
            std::shared_ptr<const grammar::TokenMasks> v = g.vocabulary();
            const grammar::Bitset* mask;
            {
              py::gil_scoped_release release;  // first use of a state scans the vocabulary
              mask = &v->allowed(state);
            }
            return mask_to_numpy(*mask);
          },
          py::arg("state"), "Bool array [vocab_size]: the tokens allowed in `state` (all False for DEAD).")
      .def("is_accepting", &Grammar::is_accepting, py::arg("state"))
      .def("eos_allowed", &Grammar::eos_allowed, py::arg("state"), "Same as is_accepting.")
      .def("can_continue", &Grammar::can_continue, py::arg("state"),
           "Whether any further byte is possible (False: the output must end here).")
      .def(
          "shortest_completion",
          [](const Grammar& g, int32_t state) { return py::bytes(g.shortest_completion(state)); }, py::arg("state"),
          "One shortest byte string leading from `state` to an accepting state.")
      .def(
          "precompute_masks", [](const Grammar& g) { g.vocabulary()->precompute_all(); },
          py::call_guard<py::gil_scoped_release>(), "Compute every state's mask now instead of on first use.")
      .def("__repr__", [](const Grammar& g) {
        std::string r = "Grammar(" + py::repr(pattern_object(g.pattern())).cast<std::string>() +
                        ", states=" + std::to_string(g.num_states());
        if (g.has_vocabulary()) r += ", vocab_size=" + std::to_string(g.vocabulary()->vocab_size());
        return r + ")";
      });

  cls.attr("DEAD") = Grammar::kDead;
  testing.def("time_mask_steps", &time_mask_steps, py::arg("grammar"), py::arg("token_ids"), py::arg("passes") = 10,
              py::call_guard<py::gil_scoped_release>(),
              "Benchmark hook (bench/grammar_mask.py): decode-step mask cost measured in C++.");
  cls.def_static(
      "escape", [](const std::string& s) { return grammar::escape_literal(s); }, py::arg("literal"),
      "Pattern text matching exactly `literal` (str as UTF-8, or bytes).");
  cls.def_static(
      "digits",
      [](int min_len, std::optional<int> max_len) { return compile(grammar::digits_pattern(min_len, max_len)); },
      py::arg("min_len") = 1, py::arg("max_len") = py::none(),
      "Only ASCII digits, between min_len and max_len of them (no upper bound when None).");
  cls.def_static(
      "choice", [](const std::vector<std::string>& options) { return compile(grammar::choice_pattern(options)); },
      py::arg("options"), "Exactly one of `options` (str as UTF-8, or bytes), taken literally.");
  cls.def_static(
      "json_object", [](const py::dict& fields) { return compile(grammar::json_pattern(to_shape(fields, "$"))); },
      py::arg("fields"), R"doc(
A JSON object with exactly these keys in this order, e.g.
{"name": "string", "age": "integer", "tags": ["string"], "pos": {"x": "number"}}.
Types: "string", "integer", "number", "boolean", "null", a dict (nested object) or a
one-element list (array of that shape). Whitespace: at most one space after '{' '[' ':' ','
and before ':' ',' '}' ']'. See docs/grammar.md for the string and number sub-grammars.)doc");
}

}  // namespace tinyloop::py_bind
