// The config field table (include/tinyloop/config_fields.def) as JSON, so the Python
// package builds its field list from the same declaration as the C++ struct
// (docs/model-format.md, "Adding a config field").
#include <nlohmann/json.hpp>

#include "tinyloop/config.h"

namespace tinyloop {
namespace {

using json = nlohmann::ordered_json;

template <class E>
json choices_of() {
  json names = json::array();
  for (const auto& e : enum_names(E{})) names.push_back(e.name);
  return names;
}

const char* presence_name(FieldPresence p) {
  return p == FieldPresence::Required ? "required" : p == FieldPresence::Derived ? "derived" : "optional";
}

// One field's entry; the default is read from a default ModelConfig as config_to_json
// writes it, so it is spelled only in the table.
json entry(const json& defaults, const char* name, const char* kind, FieldPresence presence, const char* doc) {
  json e;
  e["name"] = name;
  e["kind"] = kind;
  e["presence"] = presence_name(presence);
  e["default"] = presence == FieldPresence::Optional ? defaults.at(name) : json(nullptr);
  e["doc"] = doc;
  return e;
}

}  // namespace

std::string config_schema_json() {
  const json defaults = json::parse(config_to_json(ModelConfig{}));
  json fields = json::array();
#define TL_INT(name, def, presence, min, max, doc)                               \
  fields.push_back(entry(defaults, #name, "int", FieldPresence::presence, doc)); \
  fields.back()["min"] = min;                                                    \
  fields.back()["max"] = (max) == kNoLimit ? json(nullptr) : json(max);
#define TL_UINT(name, def, doc) fields.push_back(entry(defaults, #name, "uint64", FieldPresence::Optional, doc));
#define TL_FLOAT(name, def, doc) fields.push_back(entry(defaults, #name, "float", FieldPresence::Optional, doc));
#define TL_BOOL(name, def, doc) fields.push_back(entry(defaults, #name, "bool", FieldPresence::Optional, doc));
#define TL_ENUM(name, type, def, doc)                                             \
  fields.push_back(entry(defaults, #name, "enum", FieldPresence::Optional, doc)); \
  fields.back()["choices"] = choices_of<type>();
#define TL_OPT_INT(name, doc) fields.push_back(entry(defaults, #name, "int_or_null", FieldPresence::Optional, doc));
#define TL_INT_LIST(name, doc) fields.push_back(entry(defaults, #name, "int_list", FieldPresence::Optional, doc));
#include "tinyloop/config_fields.def"
  return fields.dump();
}

}  // namespace tinyloop
