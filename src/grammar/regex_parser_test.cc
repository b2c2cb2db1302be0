// Syntax: what each construct matches (through the whole pipeline, whole-string matching)
// and the error, with its byte position, for each kind of bad pattern.
#include "grammar/regex_parser.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace tinyloop::grammar {
namespace {

struct Case {
  std::string pattern;
  std::vector<std::string> yes, no;
};

void check(const Case& c) {
  Grammar g(c.pattern);
  for (const std::string& s : c.yes) EXPECT_TRUE(g.matches(s)) << c.pattern << " should match '" << s << "'";
  for (const std::string& s : c.no) EXPECT_FALSE(g.matches(s)) << c.pattern << " should not match '" << s << "'";
}

TEST(RegexSyntax, LiteralsAndAnchoring) {
  check({"abc", {"abc"}, {"", "ab", "abcd", "xabc"}});
  check({"", {""}, {"a"}});
  check({"^abc$", {"abc"}, {"abcd"}});
  check({"a]b}", {"a]b}"}, {}});
}

TEST(RegexSyntax, Escapes) {
  check({"\\n\\t\\r\\f\\v", {"\n\t\r\f\v"}, {"ntrfv"}});
  check({"\\\\\\.\\\"\\{\\}\\[\\]\\(\\)\\*\\+\\?\\|\\/\\-\\^\\$", {"\\.\"{}[]()*+?|/-^$"}, {}});
  check({"\\x41\\x00\\xff", {std::string("A\0\xff", 3)}, {"A"}});
  check({"\\d+", {"0", "1234567890"}, {"", "a", "1a"}});
  check({"\\D", {"a", "\n", "\xff"}, {"5"}});
  check({"\\w+", {"aZ_09"}, {"-", " "}});
  check({"\\W", {"-", " "}, {"a", "_"}});
  check({"\\s*", {" \t\n\r\f\v", ""}, {"a"}});
  check({"\\S", {"a"}, {" ", "\n"}});
  check({"\\ \\,\\:", {" ,:"}, {}});
}

TEST(RegexSyntax, DotExcludesNewlineOnly) { check({".", {"a", "\r", std::string(1, '\0'), "\xff"}, {"\n", "", "ab"}}); }

TEST(RegexSyntax, Classes) {
  check({"[a-c_]", {"a", "b", "c", "_"}, {"d", "-"}});
  check({"[^a-c]", {"d", "\n", "\xff"}, {"a", "c"}});
  check({"[]a]", {"]", "a"}, {"b"}});
  check({"[^]a]", {"b"}, {"]", "a"}});
  check({"[-a]", {"-", "a"}, {"b"}});
  check({"[a-]", {"-", "a"}, {"b"}});
  check({"[a-c-e]", {"a", "b", "-", "e"}, {"d"}});
  check({"[\\d\\s]", {"5", " "}, {"a"}});
  check({"[\\]\\-\\\\]", {"]", "-", "\\"}, {"a"}});
  check({"[.*+?(){}|^$]", {".", "*", "+", "?", "(", ")", "{", "}", "|", "^", "$"}, {"a"}});
  check({"[\\x00-\\x1f]", {std::string(1, '\0'), "\x1f"}, {" "}});
  check({"[\\n-\\r]", {"\n", "\v", "\r"}, {"\t"}});
}

TEST(RegexSyntax, Quantifiers) {
  check({"a*", {"", "a", "aaaa"}, {"b"}});
  check({"a+", {"a", "aaa"}, {""}});
  check({"a?", {"", "a"}, {"aa"}});
  check({"a{3}", {"aaa"}, {"aa", "aaaa"}});
  check({"a{2,}", {"aa", "aaaaa"}, {"a"}});
  check({"a{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"}});
  check({"a{,2}", {"", "a", "aa"}, {"aaa"}});
  check({"a{0}", {""}, {"a"}});
  check({"a{0,0}b", {"b"}, {"ab"}});
  check({"a*?b+?c??d{1,2}?", {"bd", "aabbcdd"}, {"ad"}});
  check({"(ab){2}", {"abab"}, {"ab", "aab"}});
  check({"(?:a|bc)+", {"a", "bcabc"}, {"", "b"}});
}

TEST(RegexSyntax, AlternationAndGroups) {
  check({"yes|no", {"yes", "no"}, {"yesno", "ye", ""}});
  check({"a|", {"a", ""}, {"aa"}});
  check({"()", {""}, {"a"}});
  check({"(?:)", {""}, {"a"}});
  check({"a(b|c)d", {"abd", "acd"}, {"ad", "abcd"}});
  check({"((a|b)(c|d))*", {"", "ac", "bdad"}, {"a"}});
  check({"(a*)*", {"", "aaa"}, {"b"}});
  check({"(|a)+", {"", "a", "aa"}, {"b"}});
}

TEST(RegexSyntax, Utf8CharacterIsOneAtom) {
  check({"é+", {"é", "éé"}, {"é\xa9", "\xc3"}});
  check({"(?:é)?x", {"x", "éx"}, {}});
  check({"\\xc3+", {"\xc3\xc3"}, {"é"}});  // \xHH is a single byte
  check({"\xff+", {"\xff\xff"}, {}});  // not UTF-8: one byte
}

TEST(RegexSyntax, SpecPattern) {
  check({R"(\{\"name\":\"[a-z]+\"\})", {R"({"name":"abc"})"}, {R"({"name":""})", R"({"name":"Abc"})"}});
}

void expect_error(const std::string& pattern, const std::string& message) {
  try {
    parse_regex(pattern);
    ADD_FAILURE() << "'" << pattern << "' should be rejected with: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message) << "pattern '" << pattern << "'";
  }
}

TEST(RegexSyntax, ErrorsNameTheProblemAndPosition) {
  expect_error("(ab)cd)e", "unbalanced ')' at position 6");
  expect_error(")", "unbalanced ')' at position 0");
  expect_error("ab(cd", "missing ')' for the '(' at position 2");
  expect_error("a{3,2}", "{m,n} with m > n at position 1");
  expect_error("*a", "nothing to repeat at position 0");
  expect_error("a|+", "nothing to repeat at position 2");
  expect_error("(?:*)", "nothing to repeat at position 3");
  expect_error("^*", "nothing to repeat at position 1");
  expect_error("a**", "multiple repeat at position 2");
  expect_error("a*?+", "multiple repeat at position 3");
  expect_error("a{2}{3}", "multiple repeat at position 4");
  expect_error("a\\q", "bad escape \\q at position 1");
  expect_error("\\1", "bad escape \\1 at position 0");
  expect_error("[\\b]", "bad escape \\b in a class at position 1");
  expect_error("ab\\", "trailing backslash at position 2");
  expect_error("\\x4", "bad escape: \\x needs two hex digits at position 0");
  expect_error("\\xg0", "bad escape: \\x needs two hex digits at position 0");
  expect_error("a[bc", "unterminated character class at position 1");
  expect_error("[]", "unterminated character class at position 0");
  expect_error("[z-a]", "bad class range (start > end) at position 1");
  expect_error("[\\d-z]", "bad class range (a range joins two single bytes) at position 1");
  expect_error("[é]",
               "non-ASCII byte 0xc3 in a class (a class holds single bytes: write \\xc3, or an "
               "alternation for characters) at position 1");
  expect_error("a{", "bad repeat: expected {m}, {m,}, {m,n} or {,n} at position 1");
  expect_error("a{}", "bad repeat: expected {m}, {m,}, {m,n} or {,n} at position 1");
  expect_error("a{,}", "bad repeat: expected {m}, {m,}, {m,n} or {,n} at position 1");
  expect_error("a{1,x}", "bad repeat: expected {m}, {m,}, {m,n} or {,n} at position 1");
  expect_error("a{10001}", "repeat count exceeds 10000 at position 2");
  expect_error("(?=a)", "unsupported group syntax '(?' (only (?:...) is supported) at position 0");
  expect_error("a^", "'^' is only allowed at the start (matching is anchored; write \\^) at position 1");
  expect_error("$a", "'$' is only allowed at the end (matching is anchored; write \\$) at position 0");
  expect_error(std::string(201, '(') + std::string(201, ')'), "groups nested deeper than 200 at position 200");
}

TEST(RegexSyntax, DeepButAllowedNesting) {
  std::string p = std::string(200, '(') + "a" + std::string(200, ')');
  EXPECT_TRUE(Grammar(p).matches("a"));
}

}  // namespace
}  // namespace tinyloop::grammar
