// Pattern builders: escaping round-trips, and the JSON sub-grammars on hand-picked valid and
// invalid texts.
#include "grammar/patterns.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "grammar/grammar.h"

namespace tinyloop::grammar {
namespace {

TEST(Patterns, EscapeLiteralMatchesExactlyItself) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  for (const std::string& s : {std::string("a.b*c"), std::string("{\"x\": [1]}"), std::string("é ü\\|^$"), all}) {
    Grammar g(escape_literal(s));
    EXPECT_TRUE(g.matches(s));
    EXPECT_FALSE(g.matches(s + "x"));
    EXPECT_FALSE(g.matches(s.substr(0, s.size() - 1)));
  }
}

TEST(Patterns, Digits) {
  Grammar g(digits_pattern(2, 4));
  EXPECT_TRUE(g.matches("12"));
  EXPECT_TRUE(g.matches("0123"));
  EXPECT_FALSE(g.matches("1"));
  EXPECT_FALSE(g.matches("12345"));
  EXPECT_FALSE(g.matches("1a"));
  Grammar open(digits_pattern(1, std::nullopt));
  EXPECT_TRUE(open.matches(std::string(500, '7')));
  EXPECT_FALSE(open.matches(""));
  EXPECT_THROW(digits_pattern(-1, std::nullopt), std::invalid_argument);
  EXPECT_THROW(digits_pattern(3, 2), std::invalid_argument);
  EXPECT_THROW(digits_pattern(0, 0), std::invalid_argument);
}

TEST(Patterns, Choice) {
  Grammar g(choice_pattern({"yes", "no", "maybe?", "a|b", ""}));
  for (const char* s : {"yes", "no", "maybe?", "a|b", ""}) EXPECT_TRUE(g.matches(s)) << s;
  for (const char* s : {"maybe", "a", "yesno"}) EXPECT_FALSE(g.matches(s)) << s;
  EXPECT_THROW(choice_pattern({}), std::invalid_argument);
}

TEST(Patterns, JsonString) {
  Grammar g(json_string_pattern());
  for (const char* s :
       {R"("")", R"("abc")", R"("a\"b\\c\/\n\t\u00e9")", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""})
    EXPECT_TRUE(g.matches(s)) << s;
  for (const char* s :
       {R"(")", R"("a"b")", R"("\x")", R"("\u12")", "\"a\nb\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\""})
    EXPECT_FALSE(g.matches(s)) << s;
}

TEST(Patterns, JsonNumbers) {
  Grammar i(json_integer_pattern());
  for (const char* s : {"0", "-0", "7", "-123"}) EXPECT_TRUE(i.matches(s)) << s;
  for (const char* s : {"", "-", "01", "1.0", "+1"}) EXPECT_FALSE(i.matches(s)) << s;
  Grammar n(json_number_pattern());
  for (const char* s : {"0", "-1.5", "2e10", "3.25E-7", "0.0e+1"}) EXPECT_TRUE(n.matches(s)) << s;
  for (const char* s : {"1.", ".5", "1e", "01.5", "1.5.5"}) EXPECT_FALSE(n.matches(s)) << s;
}

TEST(Patterns, JsonObject) {
  JsonShape obj;
  obj.kind = JsonShape::kObject;
  obj.fields.push_back({"name", JsonShape::scalar("string")});
  obj.fields.push_back({"age", JsonShape::scalar("integer")});
  JsonShape tags;
  tags.kind = JsonShape::kArray;
  tags.item.push_back(JsonShape::scalar("boolean"));
  obj.fields.push_back({"ok", tags});
  Grammar g(json_pattern(obj));
  for (const char* s : {R"({"name":"Ann","age":31,"ok":[]})", R"({"name": "Ann", "age": 31, "ok": [true, false]})",
                        R"({ "name" : "", "age" : -2 , "ok" : [ true ] })"})
    EXPECT_TRUE(g.matches(s)) << s;
  for (const char* s : {R"({"age":31,"name":"Ann","ok":[]})", R"({"name":"Ann","age":31})",
                        R"({"name":"Ann",  "age":31,"ok":[]})", R"({"name":"Ann","age":3.5,"ok":[]})",
                        R"({"name":"Ann","age":31,"ok":[,]})", "{\"name\":\"Ann\",\n\"age\":31,\"ok\":[]}"})
    EXPECT_FALSE(g.matches(s)) << s;
  JsonShape empty;
  empty.kind = JsonShape::kObject;
  Grammar e(json_pattern(empty));
  EXPECT_TRUE(e.matches("{}"));
  EXPECT_TRUE(e.matches("{ }"));
  EXPECT_FALSE(e.matches("{  }"));
  EXPECT_THROW(JsonShape::scalar("date"), std::invalid_argument);
}

TEST(Patterns, JsonKeysAreEscaped) {
  JsonShape obj;
  obj.kind = JsonShape::kObject;
  obj.fields.push_back({"a\"b\\c.d\n", JsonShape::scalar("null")});
  Grammar g(json_pattern(obj));
  EXPECT_TRUE(g.matches(R"({"a\"b\\c.d\u000a":null})"));
}

}  // namespace
}  // namespace tinyloop::grammar
