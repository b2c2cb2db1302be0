// Exception types. Frontends map them: std::invalid_argument -> ValueError,
// FormatError -> tinyloop_py.ModelFormatError (a ValueError), FileNotFound ->
// FileNotFoundError, ModelClosed and other std::runtime_error -> RuntimeError.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace tinyloop {

// `s` with every byte that is not part of well-formed UTF-8 written as \xHH, so a message
// quoting a file's bytes (a JSON parser's "last read" excerpt) is valid text: Python gets
// the message, not a UnicodeDecodeError about it.
inline std::string printable_utf8(std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1; };
  auto cont = [&](size_t k, int lo = 0x80, int hi = 0xbf) {
    const int c = at(k);
    return c >= lo && c <= hi;
  };
  while (i < s.size()) {
    const int b = at(0);
    size_t len = 0;
    if (b < 0x80) len = 1;
    else if (b >= 0xc2 && b <= 0xdf) len = cont(1) ? 2 : 0;
    else if (b == 0xe0) len = cont(1, 0xa0) && cont(2) ? 3 : 0;
    else if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) len = cont(1) && cont(2) ? 3 : 0;
    else if (b == 0xed) len = cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
    else if (b == 0xf0) len = cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
    else if (b >= 0xf1 && b <= 0xf3) len = cont(1) && cont(2) && cont(3) ? 4 : 0;
    else if (b == 0xf4) len = cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
    if (len == 0) {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

// A model file that is malformed: truncated, bad header, wrong sizes, bad config... The
// message is made printable_utf8 (it may quote the file's bytes).
struct FormatError : std::runtime_error {
  explicit FormatError(const std::string& msg) : std::runtime_error(printable_utf8(msg)) {}
  explicit FormatError(const char* msg) : std::runtime_error(printable_utf8(msg)) {}
};
// The model file path does not exist or cannot be opened.
struct FileNotFound : std::runtime_error {
  explicit FileNotFound(const std::string& msg) : std::runtime_error(printable_utf8(msg)) {}
};

}  // namespace tinyloop
