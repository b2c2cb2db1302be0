// Recursive-descent parser for the byte regex syntax of regex_parser.h.
//   alt    := concat ('|' concat)*
//   concat := (atom quantifier*)*
//   atom   := literal | escape | class | '.' | '(' alt ')' | '(?:' alt ')' | '^' | '$'
#include "grammar/regex_parser.h"

#include <stdexcept>
#include <string>

namespace tinyloop::grammar {
namespace {

[[noreturn]] void fail(const std::string& what, size_t pos) {
  throw std::invalid_argument(what + " at position " + std::to_string(pos));
}

ByteSet range_set(int lo, int hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(b);
  return s;
}

ByteSet digit_set() { return range_set('0', '9'); }
ByteSet word_set() { return range_set('a', 'z') | range_set('A', 'Z') | digit_set() | range_set('_', '_'); }
// Python's \s for bytes patterns: space \t \n \v \f \r.
ByteSet space_set() { return range_set(' ', ' ') | range_set('\t', '\r'); }

bool is_ascii_punct_or_space(unsigned char c) {
  return c == ' ' || (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
         (c >= 0x7b && c <= 0x7e);
}

int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Length of the valid UTF-8 multi-byte character starting at p[0] (>= 0x80), or 0.
// Follows the Unicode table of well-formed sequences (no overlongs, no surrogates).
size_t utf8_char_length(std::string_view s, size_t i) {
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1; };
  auto cont = [&](size_t k, int lo = 0x80, int hi = 0xbf) {
    int c = at(k);
    return c >= lo && c <= hi;
  };
  int b = at(0);
  if (b >= 0xc2 && b <= 0xdf) return cont(1) ? 2 : 0;
  if (b == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (b == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (b == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (b >= 0xf1 && b <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Regex run() {
    int32_t root = parse_alt(0);
    if (pos_ < p_.size()) fail("unbalanced ')'", pos_);  // parse_alt stops only at ')' or the end
    out_.root = root;
    return std::move(out_);
  }

 private:
  bool eof() const { return pos_ >= p_.size(); }
  unsigned char peek() const { return static_cast<unsigned char>(p_[pos_]); }

  int32_t add(RegexNode n) {
    out_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(out_.nodes.size() - 1);
  }
  int32_t add_bytes(const ByteSet& s) {
    RegexNode n;
    n.kind = RegexNode::kBytes;
    n.bytes = s;
    return add(std::move(n));
  }
  int32_t add_list(RegexNode::Kind kind, std::vector<int32_t> items) {
    if (items.empty()) return add(RegexNode{});
    if (items.size() == 1) return items[0];
    RegexNode n;
    n.kind = kind;
    n.children = std::move(items);
    return add(std::move(n));
  }

  int32_t parse_alt(int depth) {
    std::vector<int32_t> alts{parse_concat(depth)};
    while (!eof() && peek() == '|') {
      ++pos_;
      alts.push_back(parse_concat(depth));
    }
    return add_list(RegexNode::kAlt, std::move(alts));
  }

  int32_t parse_concat(int depth) {
    std::vector<int32_t> items;
    while (!eof() && peek() != '|' && peek() != ')') {
      int32_t atom = parse_atom(depth);
      if (atom < 0) {  // an anchor: matches "" and cannot be repeated
        if (!eof() && is_quantifier_start(peek())) fail("nothing to repeat", pos_);
        continue;
      }
      atom = parse_quantifiers(atom);
      items.push_back(atom);
    }
    return add_list(RegexNode::kConcat, std::move(items));
  }

  static bool is_quantifier_start(unsigned char c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

  // One quantifier, an optional lazy '?', then no further quantifier ("a**" is an error,
  // as in Python; "a*?" is lazy and, under whole-output matching, the same language).
  int32_t parse_quantifiers(int32_t atom) {
    if (eof() || !is_quantifier_start(peek())) return atom;
    size_t qpos = pos_;
    int32_t lo = 0, hi = RegexNode::kUnbounded;
    unsigned char c = peek();
    ++pos_;
    if (c == '+') lo = 1;
    else if (c == '?') hi = 1;
    else if (c == '{') parse_braces(qpos, lo, hi);
    RegexNode n;
    n.kind = RegexNode::kRepeat;
    n.children = {atom};
    n.min = lo;
    n.max = hi;
    int32_t rep = add(std::move(n));
    if (!eof() && peek() == '?') ++pos_;
    if (!eof() && is_quantifier_start(peek())) fail("multiple repeat", pos_);
    return rep;
  }

  // After '{' (at brace_pos): m}, m,}, m,n} or ,n}. An unescaped '{' is never a literal.
  void parse_braces(size_t brace_pos, int32_t& lo, int32_t& hi) {
    int64_t m = -1, n = -1;
    auto number = [&]() -> int64_t {
      size_t start = pos_;
      int64_t v = 0;
      while (!eof() && peek() >= '0' && peek() <= '9') {
        v = v * 10 + (peek() - '0');
        if (v > kMaxRepeatCount) fail("repeat count exceeds " + std::to_string(kMaxRepeatCount), start);
        ++pos_;
      }
      return pos_ > start ? v : -1;
    };
    m = number();
    bool comma = false;
    if (!eof() && peek() == ',') {
      comma = true;
      ++pos_;
      n = number();
    }
    if (eof() || peek() != '}') fail("bad repeat: expected {m}, {m,}, {m,n} or {,n}", brace_pos);
    ++pos_;
    if (m < 0 && n < 0) fail("bad repeat: expected {m}, {m,}, {m,n} or {,n}", brace_pos);
    if (!comma) n = m;
    if (m < 0) m = 0;
    if (n >= 0 && m > n) fail("{m,n} with m > n", brace_pos);
    lo = static_cast<int32_t>(m);
    hi = n < 0 ? RegexNode::kUnbounded : static_cast<int32_t>(n);
  }

  // Returns a node index, or -1 for an anchor.
  int32_t parse_atom(int depth) {
    size_t start = pos_;
    unsigned char c = peek();
    switch (c) {
      case '(': {
        if (depth >= kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth), start);
        ++pos_;
        if (!eof() && peek() == '?') {
          if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') pos_ += 2;
          else fail("unsupported group syntax '(?' (only (?:...) is supported)", start);
        }
        int32_t inner = parse_alt(depth + 1);
        if (eof()) fail("missing ')' for the '('", start);
        ++pos_;  // ')'
        return inner;
      }
      case '[': return add_bytes(parse_class());
      case '.': ++pos_; return add_bytes(~range_set('\n', '\n'));
      case '\\': return add_bytes(parse_escape(/*in_class=*/false).set);
      case '*':
      case '+':
      case '?':
      case '{': fail("nothing to repeat", start);
      case '^':
        if (start != 0) fail("'^' is only allowed at the start (matching is anchored; write \\^)", start);
        ++pos_;
        return -1;
      case '$':
        if (start + 1 != p_.size()) fail("'$' is only allowed at the end (matching is anchored; write \\$)", start);
        ++pos_;
        return -1;
      default: break;
    }
    if (c >= 0x80) {
      if (size_t len = utf8_char_length(p_, pos_)) {  // one UTF-8 character = one atom
        std::vector<int32_t> bytes;
        for (size_t k = 0; k < len; ++k)
          bytes.push_back(
              add_bytes(range_set(static_cast<unsigned char>(p_[pos_ + k]), static_cast<unsigned char>(p_[pos_ + k]))));
        pos_ += len;
        return add_list(RegexNode::kConcat, std::move(bytes));
      }
    }
    ++pos_;  // any other byte, including ']' and '}', is itself
    return add_bytes(range_set(c, c));
  }

  struct Escape {
    ByteSet set;
    bool single = false;  // one byte (usable as a range bound)
    unsigned char byte = 0;
  };

  Escape parse_escape(bool in_class) {
    size_t start = pos_;
    ++pos_;  // backslash
    if (eof()) fail("trailing backslash", start);
    unsigned char c = peek();
    ++pos_;
    auto one = [](unsigned char b) {
      Escape e;
      e.set.set(b);
      e.single = true;
      e.byte = b;
      return e;
    };
    auto set = [](ByteSet s) {
      Escape e;
      e.set = s;
      return e;
    };
    switch (c) {
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'd': return set(digit_set());
      case 'D': return set(~digit_set());
      case 'w': return set(word_set());
      case 'W': return set(~word_set());
      case 's': return set(space_set());
      case 'S': return set(~space_set());
      case 'x': {
        int hi = pos_ < p_.size() ? hex_value(static_cast<unsigned char>(p_[pos_])) : -1;
        int lo = pos_ + 1 < p_.size() ? hex_value(static_cast<unsigned char>(p_[pos_ + 1])) : -1;
        if (hi < 0 || lo < 0) fail("bad escape: \\x needs two hex digits", start);
        pos_ += 2;
        return one(static_cast<unsigned char>(hi * 16 + lo));
      }
      default: break;
    }
    if (is_ascii_punct_or_space(c)) return one(c);
    std::string shown = c >= 0x21 && c < 0x7f ? std::string(1, static_cast<char>(c)) : "\\x" + hex_byte(c);
    fail("bad escape \\" + shown + (in_class ? " in a class" : ""), start);
  }

  static std::string hex_byte(unsigned char c) {
    const char* d = "0123456789abcdef";
    return {d[c >> 4], d[c & 15]};
  }

  // One class member: a single byte or a set (\d...). Position is at its first byte.
  Escape parse_class_member() {
    unsigned char c = peek();
    if (c == '\\') return parse_escape(/*in_class=*/true);
    if (c >= 0x80)
      fail("non-ASCII byte 0x" + hex_byte(c) + " in a class (a class holds single bytes: write \\x" + hex_byte(c) +
               ", or an alternation for characters)",
           pos_);
    ++pos_;
    Escape e;
    e.set.set(c);
    e.single = true;
    e.byte = c;
    return e;
  }

  // [ ^? ]? members ] ; a ']' right after '[' or '[^' is a literal (as in Python), '-' is
  // a literal first, last, or right after a range.
  ByteSet parse_class() {
    size_t start = pos_;
    ++pos_;  // '['
    bool negate = false;
    if (!eof() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    ByteSet s;
    bool first = true;
    while (true) {
      if (eof()) fail("unterminated character class", start);
      if (peek() == ']' && !first) break;
      first = false;
      size_t member_pos = pos_;
      // [[:alpha:]], [[.x.]], [[=x=]]: POSIX syntax this dialect does not have. Read as
      // bytes it would silently mean "one of [ : a l p h" then a literal ']'.
      if (peek() == '[' && pos_ + 1 < p_.size() && (p_[pos_ + 1] == ':' || p_[pos_ + 1] == '.' || p_[pos_ + 1] == '='))
        fail(std::string("unsupported POSIX class syntax '[") + p_[pos_ + 1] +
                 "' in a class (write the bytes, e.g. [a-zA-Z] for [:alpha:], or escape the '[')",
             member_pos);
      Escape lo = parse_class_member();
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;  // '-'
        Escape hi = parse_class_member();
        if (!lo.single || !hi.single) fail("bad class range (a range joins two single bytes)", member_pos);
        if (lo.byte > hi.byte) fail("bad class range (start > end)", member_pos);
        s |= range_set(lo.byte, hi.byte);
      } else {
        s |= lo.set;
      }
    }
    ++pos_;  // ']'
    return negate ? ~s : s;
  }

  std::string_view p_;
  size_t pos_ = 0;
  Regex out_;
};

}  // namespace

Regex parse_regex(std::string_view pattern) { return Parser(pattern).run(); }

}  // namespace tinyloop::grammar
