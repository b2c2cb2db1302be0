// Issue 16 (hardening), the grammar: POSIX class syntax refused by name, json_pattern's
// depth and size limits (nested arrays double the pattern per level), the pattern size cap.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "grammar/grammar.h"
#include "grammar/patterns.h"
#include "grammar/regex_parser.h"

namespace tinyloop::grammar {
namespace {

using ::testing::HasSubstr;

std::string parse_error(const std::string& pattern) {
  try {
    parse_regex(pattern);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarLimits, PosixClassSyntaxIsRefusedNotReadAsBytes) {
  // Once accepted, meaning "one of [ : a l p h" followed by a literal ']'.
  EXPECT_THAT(parse_error("[[:alpha:]]"), HasSubstr("unsupported POSIX class syntax '[:' in a class"));
  EXPECT_THAT(parse_error("[[:alpha:]]"), HasSubstr("at position 1"));
  EXPECT_THAT(parse_error("x[a[.b.]]"), HasSubstr("POSIX class syntax '[.'"));
  EXPECT_THAT(parse_error("[[=e=]]"), HasSubstr("POSIX class syntax '[='"));
  // A '[' in a class not followed by ':', '.', '=' stays a literal, as before.
  EXPECT_EQ(parse_error("[[a]"), "");
  EXPECT_EQ(parse_error("[\\[:]"), "");
}

JsonShape nested_objects(int depth) {
  JsonShape s = JsonShape::scalar("integer");
  for (int i = 0; i < depth; ++i) {
    JsonShape o;
    o.kind = JsonShape::kObject;
    o.fields.emplace_back("a", std::move(s));
    s = std::move(o);
  }
  return s;
}

TEST(GrammarLimits, JsonShapeDepthIsCapped) {
  EXPECT_NO_THROW(json_pattern(nested_objects(kMaxJsonDepth)));
  try {
    json_pattern(nested_objects(kMaxJsonDepth + 1));
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("nested deeper than 64 levels"));
  }
}

TEST(GrammarLimits, NestedArrayPatternSizeIsCappedBeforeItGrows) {
  JsonShape s = JsonShape::scalar("string");
  size_t last = 0;
  for (int level = 1; level <= 30; ++level) {
    JsonShape a;
    a.kind = JsonShape::kArray;
    a.item.push_back(std::move(s));
    s = std::move(a);
    try {
      last = json_pattern(s).size();
      ASSERT_LE(last, size_t(kMaxPatternBytes));
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("exceeds 1048576 bytes"));
      EXPECT_GT(level, 5);  // a few levels of arrays are fine
      return;
    }
  }
  FAIL() << "30 levels of arrays built a pattern of " << last << " bytes";
}

TEST(GrammarLimits, PatternSizeIsCapped) {
  EXPECT_NO_THROW(Grammar(std::string(1000, 'a')));
  try {
    Grammar(std::string(size_t(kMaxPatternBytes) + 1, 'a'));
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("pattern too large"));
  }
}

}  // namespace
}  // namespace tinyloop::grammar
