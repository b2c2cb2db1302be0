#include "api/byte_level.h"

#include <cstdint>
#include <unordered_map>

namespace tinyloop::api {
namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the other 68 bytes
// take U+0100, U+0101, ... in byte order.
std::array<uint32_t, 256> byte_code_points() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

const std::unordered_map<std::string, char>& char_to_byte() {
  static const std::unordered_map<std::string, char> table = [] {
    std::unordered_map<std::string, char> t;
    for (int b = 0; b < 256; ++b) t.emplace(byte_to_char()[b], static_cast<char>(b));
    return t;
  }();
  return table;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }
bool is_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_other(char c) { return !is_space(c) && !is_letter(c) && !is_digit(c); }

// Length of the contraction ('s 't 're 've 'm 'll 'd) at text[i], or 0.
size_t contraction(std::string_view text, size_t i) {
  if (text[i] != '\'' || i + 1 >= text.size()) return 0;
  const char a = text[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < text.size()) {
    const char b = text[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

}  // namespace

const std::array<std::string, 256>& byte_to_char() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    const std::array<uint32_t, 256> cp = byte_code_points();
    for (int b = 0; b < 256; ++b) t[b] = utf8(cp[b]);
    return t;
  }();
  return table;
}

bool chars_to_bytes(std::string_view entry, std::string& out) {
  out.clear();
  const auto& table = char_to_byte();
  size_t i = 0;
  while (i < entry.size()) {
    const unsigned char lead = static_cast<unsigned char>(entry[i]);
    const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    auto it = table.find(std::string(entry.substr(i, len)));
    if (it == table.end()) return false;
    out += it->second;
    i += len;
  }
  return true;
}

std::vector<std::string_view> split_gpt2_ascii(std::string_view text) {
  std::vector<std::string_view> out;
  const size_t n = text.size();
  size_t i = 0;
  // The run of chars of one class starting at j.
  auto run = [&](size_t j, bool (*cls)(char)) {
    while (j < n && cls(text[j])) ++j;
    return j;
  };
  while (i < n) {
    size_t end = 0;
    // The alternatives in the pattern's order; the first that matches at i wins.
    const size_t c = contraction(text, i);
    const bool lead_space = text[i] == ' ' && i + 1 < n;
    const size_t body = lead_space ? i + 1 : i;
    if (c) {
      end = i + c;
    } else if (is_letter(text[body])) {
      end = run(body, is_letter);
    } else if (is_digit(text[body])) {
      end = run(body, is_digit);
    } else if (is_other(text[body])) {
      end = run(body, is_other);
    } else {
      // Whitespace: \s+(?!\S) keeps the last space for the next token when a non-space
      // follows (so " word" stays together); a single space before a non-space falls to \s+.
      const size_t ws_end = run(i, is_space);
      end = (ws_end < n && ws_end - i > 1) ? ws_end - 1 : ws_end;
    }
    out.push_back(text.substr(i, end - i));
    i = end;
  }
  return out;
}

}  // namespace tinyloop::api
