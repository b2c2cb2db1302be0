// Checked integer arithmetic for sizes, counts and offsets that come from user input or
// file contents (docs/limits.md). Every overflow becomes an exception naming the quantity,
// never a wrapped value: a wrapped size is a tiny allocation followed by writes past it.
//
//   int64_t bytes = checked_mul(rows, row_bytes, "KV block bytes");        // std::overflow_error
//   uint64_t n = checked_mul<FormatError>(count, elem, "tensor 'x' bytes");  // a file's problem
//
// The exception type E (default std::overflow_error, Python's OverflowError) must be
// constructible from a std::string.
#pragma once
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace tinyloop {

namespace checked_detail {
template <class T>
std::string str(T v) {
  return std::to_string(v);
}
}  // namespace checked_detail

// a * b, or E("<what> overflows: a x b").
template <class E = std::overflow_error, class T>
T checked_mul(T a, T b, std::string_view what) {
  static_assert(std::is_integral_v<T>, "checked_mul is for integers");
  T r;
  if (__builtin_mul_overflow(a, b, &r))
    throw E(std::string(what) + " overflows: " + checked_detail::str(a) + " x " + checked_detail::str(b));
  return r;
}

// a + b, or E("<what> overflows: a + b").
template <class E = std::overflow_error, class T>
T checked_add(T a, T b, std::string_view what) {
  static_assert(std::is_integral_v<T>, "checked_add is for integers");
  T r;
  if (__builtin_add_overflow(a, b, &r))
    throw E(std::string(what) + " overflows: " + checked_detail::str(a) + " + " + checked_detail::str(b));
  return r;
}

// n rounded up to a multiple of align (> 0), or E when that does not fit in T.
template <class E = std::overflow_error, class T>
T checked_round_up(T n, T align, std::string_view what) {
  static_assert(std::is_integral_v<T>, "checked_round_up is for integers");
  if (align <= 0) throw std::invalid_argument(std::string(what) + ": alignment must be > 0");
  const T rem = n % align;
  return rem == 0 ? n : checked_add<E>(n, T(align - rem), what);
}

// v converted to To, or E("<what> is out of range") when it does not fit.
template <class To, class E = std::overflow_error, class From>
To checked_cast(From v, std::string_view what) {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>, "checked_cast is for integers");
  To r = static_cast<To>(v);
  if (static_cast<From>(r) != v || ((r < To(0)) != (v < From(0))))
    throw E(std::string(what) + " is out of range: " + checked_detail::str(v));
  return r;
}

}  // namespace tinyloop
