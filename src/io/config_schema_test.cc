// config_schema_json / container_format_json: the tables the Python package reads are the
// ones the C++ reader uses (docs/model-format.md, "Adding a config field").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tinyloop/config.h"
#include "tinyloop/container_format.h"
#include "tinyloop/errors.h"

namespace tinyloop {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json schema() { return json::parse(config_schema_json()); }

std::set<std::string> names_of(const json& fields) {
  std::set<std::string> out;
  for (const json& f : fields) out.insert(f.at("name").get<std::string>());
  return out;
}

// A valid config with only the required fields, built from the schema itself (64 each,
// 4 heads of 16 channels).
json required_only() {
  json j = json::object();
  for (const json& f : schema())
    if (f.at("presence") == "required") j[f.at("name").get<std::string>()] = f.at("name") == "n_heads" ? 4 : 64;
  return j;
}

TEST(ConfigSchema, RequiredOnlyConfigIsValid) { EXPECT_NO_THROW(parse_config(required_only().dump())); }

TEST(ConfigSchema, FieldsAreExactlyTheOnesConfigToJsonWrites) {
  const json written = json::parse(config_to_json(parse_config(required_only().dump())));
  std::set<std::string> keys;
  for (const auto& [k, v] : written.items()) keys.insert(k);
  EXPECT_EQ(names_of(schema()), keys);
  EXPECT_EQ(schema().size(), keys.size());  // no name twice
}

TEST(ConfigSchema, RequiredFieldsAreRefusedWhenMissing) {
  for (const json& f : schema()) {
    if (f.at("presence") != "required") continue;
    json j = required_only();
    const std::string name = f.at("name");
    j.erase(name);
    try {
      parse_config(j.dump());
      ADD_FAILURE() << name << " was not required";
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr("missing required field '" + name + "'"));
    }
  }
}

TEST(ConfigSchema, DefaultsAreTheParsedOnes) {
  const json parsed = json::parse(config_to_json(parse_config(required_only().dump())));
  int optional = 0;
  for (const json& f : schema()) {
    if (f.at("presence") != "optional") {
      EXPECT_TRUE(f.at("default").is_null()) << f.at("name");
      continue;
    }
    ++optional;
    EXPECT_EQ(f.at("default"), parsed.at(f.at("name").get<std::string>())) << f.at("name");
  }
  EXPECT_GT(optional, 30);
}

TEST(ConfigSchema, EnumChoicesAreAcceptedAndOthersRefused) {
  for (const json& f : schema()) {
    if (f.at("kind") != "enum") continue;
    ASSERT_FALSE(f.at("choices").empty()) << f.at("name");
    EXPECT_EQ(f.at("choices")[0], f.at("default")) << f.at("name");  // the tables list it first
    json j = required_only();
    const std::string name = f.at("name");
    j[name] = "no-such-choice";
    try {
      parse_config(j.dump());
      ADD_FAILURE() << name << " accepted an unknown value";
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'" + name + "' has unknown value"));
    }
  }
}

TEST(ConfigSchema, IntRangesAreEnforcedByName) {
  for (const json& f : schema()) {
    if (f.at("kind") != "int") continue;
    const std::string name = f.at("name");
    json j = required_only();
    j[name] = f.at("min").get<int64_t>() - 1;
    try {
      parse_config(j.dump());
      ADD_FAILURE() << name << " accepted min - 1";
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr("'" + name + "' must be >= "));
    }
  }
  const json loops = schema()[9];
  ASSERT_EQ(loops.at("name"), "default_loops");
  EXPECT_EQ(loops.at("max"), kMaxLoops);
}

TEST(ContainerFormat, ConstantsAreTheReadersOnes) {
  const json f = json::parse(container_format_json());
  EXPECT_EQ(f.at("format_name"), "tinyloop");
  EXPECT_EQ(f.at("format_versions"), json({"1", "2"}));
  EXPECT_EQ(f.at("data_alignment"), 64);
  EXPECT_EQ(f.at("dtypes").at("BF16").at("size"), 2);
  EXPECT_EQ(f.at("dtypes").at("U8").at("use"), "quantized");
  EXPECT_EQ(f.at("dtypes").size(), std::size(kDTypes));
  EXPECT_EQ(find_dtype_info("F16")->dtype, StoredDType::F16);
  EXPECT_EQ(find_dtype_info("F1"), nullptr);
  EXPECT_EQ(find_dtype_info("F166"), nullptr);
}

}  // namespace
}  // namespace tinyloop
