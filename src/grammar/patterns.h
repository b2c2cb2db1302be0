// Pattern builders for the common constrained-decoding shapes (docs/grammar.md
// "Helpers": digits-only, multiple-choice, JSON-shape). They return pattern text for Grammar; the
// exact sub-grammars are documented in docs/grammar.md.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tinyloop::grammar {

// A pattern matching exactly `literal` (every byte that is not [A-Za-z0-9_] is escaped:
// ASCII punctuation as \c, everything else as \xHH).
std::string escape_literal(std::string_view literal);

// [0-9]{min_len,max_len} ({min_len,} without max). Throws std::invalid_argument for
// min_len < 0, max_len < min_len, or max_len == 0 (only the empty string).
std::string digits_pattern(int min_len, std::optional<int> max_len);

// Exactly one of `options`, as literals. Throws std::invalid_argument for an empty list.
std::string choice_pattern(const std::vector<std::string>& options);

// Limits of json_pattern (docs/limits.md): shapes nested deeper than kMaxJsonDepth levels,
// and shapes whose pattern would exceed kMaxPatternBytes (each level of nested arrays
// writes its item pattern twice, so the text doubles per level), are refused with
// std::invalid_argument before anything large is built.
inline constexpr int kMaxJsonDepth = 64;

// A JSON value shape: a scalar type, an object with fixed keys in a fixed order, or an
// array whose items all have one shape.
struct JsonShape {
  enum Kind { kString, kInteger, kNumber, kBoolean, kNull, kObject, kArray };
  Kind kind = kString;
  std::vector<std::pair<std::string, JsonShape>> fields;  // kObject: key (UTF-8) -> shape
  std::vector<JsonShape> item;  // kArray: exactly one element
  // "string" | "integer" | "number" | "boolean" | "null"; throws std::invalid_argument.
  static JsonShape scalar(std::string_view type_name);
  // Declared here, defined in patterns.cc where the pair<string, JsonShape> of `fields` is
  // complete (clang with libstdc++ refuses to instantiate its destructor inside the class).
  JsonShape();
  JsonShape(const JsonShape&);
  JsonShape(JsonShape&&) noexcept;
  JsonShape& operator=(const JsonShape&);
  JsonShape& operator=(JsonShape&&) noexcept;
  ~JsonShape();
};

// The pattern of one JSON value of that shape. Whitespace: at most one space (0x20) after
// '{', '[', ':' and ',' and before ':', ',', '}' and ']' (an empty object or array: "{}" or
// "{ }"); no other whitespace, so a model cannot pad forever.
// Throws std::invalid_argument past kMaxJsonDepth or kMaxPatternBytes (grammar.h).
std::string json_pattern(const JsonShape& shape);

// Sub-grammars, exposed for docs and tests.
std::string json_string_pattern();  // "..." with JSON escapes, valid UTF-8, no control bytes
std::string json_integer_pattern();  // -?(0|[1-9][0-9]*)
std::string json_number_pattern();  // integer, optional fraction, optional exponent

}  // namespace tinyloop::grammar
