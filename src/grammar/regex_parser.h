// Byte regular expression -> Regex (regex_ast.h). The accepted syntax and every decision
// about edge cases is in docs/grammar.md; the short version:
//   literals; escapes \n \t \r \f \v \xHH, \ before any ASCII punctuation or space;
//   \d \w \s \D \W \S; classes [a-z0-9_] and [^...]; `.` = any byte except \n;
//   * + ? {m} {m,} {m,n} {,n} (a trailing ? = lazy, accepted, same language);
//   | ( ) (?: ); ^ only as the first byte and $ only as the last (no-ops: the whole
//   output must match anyway). The empty pattern (and empty alternatives) match "".
// Raw bytes >= 0x80 outside a class that form one valid UTF-8 character are one atom, so
// "é+" repeats the whole character; inside a class they are rejected (write \xHH).
#pragma once
#include <string_view>

#include "grammar/regex_ast.h"

namespace tinyloop::grammar {

// Limits that keep a hostile pattern from exhausting the stack or memory.
inline constexpr int kMaxRepeatCount = 10000;  // m and n in {m,n}
inline constexpr int kMaxGroupDepth = 200;  // nested ( ... )

// Throws std::invalid_argument("<problem> at position N"), N the 0-based byte offset of
// the offending byte in `pattern` (for an unclosed '(' or '[': the opening byte).
Regex parse_regex(std::string_view pattern);

}  // namespace tinyloop::grammar
