// Pattern text builders. Everything is emitted with escapes, so keys and choices can hold
// any bytes.
#include "grammar/patterns.h"

#include <stdexcept>

#include "grammar/grammar.h"

namespace tinyloop::grammar {
namespace {

const char* kHex = "0123456789abcdef";

bool is_word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// JSON text of a key: quotes, backslash and control bytes escaped; UTF-8 kept as is.
std::string json_quote(std::string_view key) {
  std::string out = "\"";
  for (unsigned char c : key) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

constexpr const char* kWs = " ?";  // the one optional space between JSON tokens

}  // namespace

std::string escape_literal(std::string_view literal) {
  std::string out;
  for (unsigned char c : literal) {
    if (is_word_byte(c)) {
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {  // ASCII punctuation and space: \c is a literal
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string digits_pattern(int min_len, std::optional<int> max_len) {
  if (min_len < 0) throw std::invalid_argument("digits: min_len must be >= 0");
  if (max_len && *max_len < min_len) throw std::invalid_argument("digits: max_len must be >= min_len");
  if (max_len && *max_len == 0) throw std::invalid_argument("digits: max_len must be >= 1");
  std::string p = "[0-9]{" + std::to_string(min_len) + ",";
  if (max_len) p += std::to_string(*max_len);
  return p + "}";
}

std::string choice_pattern(const std::vector<std::string>& options) {
  if (options.empty()) throw std::invalid_argument("choice: options must not be empty");
  std::string p = "(?:";
  for (size_t i = 0; i < options.size(); ++i) {
    if (i) p += "|";
    p += escape_literal(options[i]);
  }
  return p + ")";
}

JsonShape::JsonShape() = default;
JsonShape::JsonShape(const JsonShape&) = default;
JsonShape::JsonShape(JsonShape&&) noexcept = default;
JsonShape& JsonShape::operator=(const JsonShape&) = default;
JsonShape& JsonShape::operator=(JsonShape&&) noexcept = default;
JsonShape::~JsonShape() = default;

JsonShape JsonShape::scalar(std::string_view name) {
  JsonShape s;
  if (name == "string") s.kind = kString;
  else if (name == "integer") s.kind = kInteger;
  else if (name == "number") s.kind = kNumber;
  else if (name == "boolean") s.kind = kBoolean;
  else if (name == "null") s.kind = kNull;
  else
    throw std::invalid_argument("json_object: unknown type '" + std::string(name) +
                                "' (expected string, integer, number, boolean, null, a dict or a one-element list)");
  return s;
}

std::string json_string_pattern() {
  // One character: printable ASCII except " and \, a JSON escape, or one well-formed
  // UTF-8 multi-byte character (so every match decodes as UTF-8).
  return "\"(?:[\\x20\\x21\\x23-\\x5b\\x5d-\\x7f]"
         "|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4}"
         "|[\\xc2-\\xdf][\\x80-\\xbf]"
         "|\\xe0[\\xa0-\\xbf][\\x80-\\xbf]|[\\xe1-\\xec\\xee\\xef][\\x80-\\xbf]{2}|\\xed[\\x80-\\x9f][\\x80-\\xbf]"
         "|\\xf0[\\x90-\\xbf][\\x80-\\xbf]{2}|[\\xf1-\\xf3][\\x80-\\xbf]{3}|\\xf4[\\x80-\\x8f][\\x80-\\xbf]{2}"
         ")*\"";
}

std::string json_integer_pattern() { return "-?(?:0|[1-9][0-9]*)"; }

std::string json_number_pattern() { return json_integer_pattern() + "(?:\\.[0-9]+)?(?:[eE][+\\-]?[0-9]+)?"; }

namespace {

std::string json_pattern_at(const JsonShape& shape, int depth);

// Sizes are checked as the pattern is built (before an array writes its item twice), so no
// string ever grows past about twice the cap.
void check_size(size_t bytes) {
  if (bytes > size_t(kMaxPatternBytes))
    throw std::invalid_argument("json_object: the shape's pattern exceeds " + std::to_string(kMaxPatternBytes) +
                                " bytes (each level of nested arrays doubles it): simplify the shape");
}

}  // namespace

std::string json_pattern(const JsonShape& shape) { return json_pattern_at(shape, 0); }

namespace {

std::string json_pattern_at(const JsonShape& shape, int depth) {
  if (depth > kMaxJsonDepth)
    throw std::invalid_argument("json_object: shape nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  const std::string ws = kWs;
  switch (shape.kind) {
    case JsonShape::kString: return json_string_pattern();
    case JsonShape::kInteger: return json_integer_pattern();
    case JsonShape::kNumber: return json_number_pattern();
    case JsonShape::kBoolean: return "(?:true|false)";
    case JsonShape::kNull: return "null";
    case JsonShape::kObject: {
      if (shape.fields.empty()) return "\\{" + ws + "\\}";
      std::string p = "\\{" + ws;
      for (size_t i = 0; i < shape.fields.size(); ++i) {
        if (i) p += ws + "," + ws;
        p += escape_literal(json_quote(shape.fields[i].first)) + ws + ":" + ws +
             json_pattern_at(shape.fields[i].second, depth + 1);
        check_size(p.size());
      }
      return p + ws + "\\}";
    }
    case JsonShape::kArray: {
      if (shape.item.size() != 1) throw std::invalid_argument("json array shape needs exactly one item shape");
      std::string v = "(?:" + json_pattern_at(shape.item[0], depth + 1) + ")";
      check_size(2 * v.size());  // the array writes its item twice
      return "\\[" + ws + "(?:" + v + "(?:" + ws + "," + ws + v + ")*" + ws + ")?\\]";
    }
  }
  return {};
}

}  // namespace

}  // namespace tinyloop::grammar
