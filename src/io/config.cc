// The model config of a .tinyloop file: parse, check, serialise, and derive the tensor list
// (docs/model-format.md, "Config" and "Tensor names").
#include "tinyloop/config.h"
#include "tinyloop/config_tensors.h"

#include <cmath>
#include <cstddef>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinyloop/checked.h"
#include "tinyloop/errors.h"

namespace tinyloop {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& msg) { throw FormatError("config: " + msg); }

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// "a string", "a float", ... for the "expected X, got Y" messages.
std::string describe(const json& v) {
  if (v.is_number_float()) return "a float";
  if (v.is_number_integer()) return "an integer";
  if (v.is_boolean()) return "a boolean";
  if (v.is_string()) return "a string";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const char* field, const char* expected, const json& v) {
  fail("field " + quoted(field) + " must be " + expected + ", got " + describe(v));
}

// ---- typed readers: each checks the JSON type and names the field when it is wrong ----

int64_t read_int(const json& v, const char* field) {
  if (!v.is_number_integer()) wrong_type(field, "an integer", v);
  // nlohmann stores integers above INT64_MAX as unsigned; they would wrap in get<int64_t>.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("field " + quoted(field) + " is too large");
  return v.get<int64_t>();
}

uint64_t read_uint(const json& v, const char* field) {
  if (!v.is_number_integer()) wrong_type(field, "a non-negative integer", v);
  if (!v.is_number_unsigned()) fail("field " + quoted(field) + " must be non-negative");
  return v.get<uint64_t>();
}

double read_float(const json& v, const char* field) {
  if (!v.is_number()) wrong_type(field, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail("field " + quoted(field) + " must be finite");
  return d;
}

bool read_bool(const json& v, const char* field) {
  if (!v.is_boolean()) wrong_type(field, "a boolean", v);
  return v.get<bool>();
}

std::optional<int64_t> read_optional_int(const json& v, const char* field) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) wrong_type(field, "an integer or null", v);
  return read_int(v, field);
}

std::vector<int64_t> read_int_list(const json& v, const char* field) {
  if (!v.is_array()) wrong_type(field, "a list of integers", v);
  std::vector<int64_t> out;
  for (const json& e : v) {
    if (!e.is_number_integer()) wrong_type(field, "a list of integers", v);
    out.push_back(read_int(e, field));
  }
  return out;
}

// ---- enums: names from config_enums.h, so parse, write and the schema cannot disagree ----

template <class E>
E read_enum(const json& v, const char* field) {
  if (!v.is_string()) wrong_type(field, "a string", v);
  const std::string s = v.get<std::string>();
  std::string allowed;
  for (const auto& e : enum_names(E{})) {
    if (s == e.name) return e.value;
    allowed += (allowed.empty() ? "" : ", ") + quoted(e.name);
  }
  fail("field " + quoted(field) + " has unknown value " + quoted(s) + " (expected one of " + allowed + ")");
}

// ---- the field table (config_fields.def): name -> reader into ModelConfig ----

struct FieldSpec {
  const char* name;
  void (*read)(const json& v, ModelConfig& c);
  FieldPresence presence;
};

#define TL_READ(name, reader, presence) \
  {#name, [](const json& v, ModelConfig& c) { c.name = reader(v, #name); }, FieldPresence::presence},
#define TL_INT(name, def, presence, min, max, doc) TL_READ(name, read_int, presence)
#define TL_UINT(name, def, doc) TL_READ(name, read_uint, Optional)
#define TL_FLOAT(name, def, doc) TL_READ(name, read_float, Optional)
#define TL_BOOL(name, def, doc) TL_READ(name, read_bool, Optional)
#define TL_ENUM(name, type, def, doc) TL_READ(name, read_enum<type>, Optional)
#define TL_OPT_INT(name, doc) TL_READ(name, read_optional_int, Optional)
#define TL_INT_LIST(name, doc) TL_READ(name, read_int_list, Optional)

const FieldSpec kFields[] = {
#include "tinyloop/config_fields.def"
};

#undef TL_READ

const FieldSpec* find_field(const std::string& name) {
  for (const auto& f : kFields)
    if (name == f.name) return &f;
  return nullptr;
}

// ---- checked arithmetic: a config is untrusted input, so derived sizes must not overflow ----

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  return tinyloop::checked_mul<FormatError>(a, b, std::string("config: ") + what);
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  return tinyloop::checked_add<FormatError>(a, b, std::string("config: ") + what);
}

// ---- parsing ----

json parse_object(const std::string& text) {
  json j;
  // A field given twice is refused by name: a JSON parser would keep one silently.
  std::vector<std::set<std::string>> keys;
  const json::parser_callback_t no_duplicates = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    else if (event == json::parse_event_t::object_end) keys.pop_back();
    else if (event == json::parse_event_t::key && !keys.empty() &&
             !keys.back().insert(parsed.get<std::string>()).second)
      fail("field " + quoted(parsed.get<std::string>()) + " appears twice");
    return true;
  };
  try {
    j = json::parse(text, no_duplicates);
  } catch (const json::exception& e) {
    fail(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail("must be a JSON object, got " + describe(j));
  return j;
}

// Fills the fields present in `j`; returns their names so defaults can tell "absent".
std::set<std::string> read_fields(const json& j, ModelConfig& c) {
  std::set<std::string> present;
  for (const auto& [key, value] : j.items()) {
    const FieldSpec* f = find_field(key);
    if (!f) fail("unknown field " + quoted(key));
    f->read(value, c);
    present.insert(key);
  }
  return present;
}

void check_required(const std::set<std::string>& present) {
  for (const auto& f : kFields)
    if (f.presence == FieldPresence::Required && !present.count(f.name))
      fail("missing required field " + quoted(f.name));
}

// n_kv_heads and head_dim default from other fields, so they are filled after reading.
void fill_derived_defaults(const std::set<std::string>& present, ModelConfig& c) {
  if (!present.count("n_kv_heads")) c.n_kv_heads = c.n_heads;
  if (!present.count("head_dim")) {
    // A truncated dim / n_heads would silently give a model of another width.
    if (c.n_heads > 0 && c.dim % c.n_heads != 0)
      fail("field 'head_dim' is required when 'dim' (" + std::to_string(c.dim) + ") is not a multiple of 'n_heads' (" +
           std::to_string(c.n_heads) + ")");
    if (c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
  }
}

// ---- consistency rules (docs/model-format.md, "Consistency rules") ----

void require_at_least(int64_t value, int64_t min, const char* field) {
  if (value < min)
    fail("field " + quoted(field) + " must be >= " + std::to_string(min) + ", got " + std::to_string(value));
}

void require_at_most(int64_t value, int64_t max, const char* field) {
  if (value > max)
    fail("field " + quoted(field) + " must be <= " + std::to_string(max) + " (docs/limits.md), got " +
         std::to_string(value));
}

// The min / max of every TL_INT field: the table expanded twice, every minimum first (the
// later rules divide by these sizes), then every maximum. Refused at load, not at the first
// call (a file saying default_loops = 2^59 once loaded and then crashed generate()).
void check_sizes(const ModelConfig& c) {
#define TL_INT(name, def, presence, min, max, doc) require_at_least(c.name, min, #name);
#include "tinyloop/config_fields.def"
#define TL_INT(name, def, presence, min, max, doc) \
  if (max != kNoLimit) require_at_most(c.name, max, #name);
#include "tinyloop/config_fields.def"
}

void check_heads(const ModelConfig& c) {
  if (c.n_heads % c.n_kv_heads != 0)
    fail("field 'n_kv_heads' (" + std::to_string(c.n_kv_heads) + ") must divide 'n_heads' (" +
         std::to_string(c.n_heads) + ")");
  if (c.uses_rope() && c.head_dim % 2 != 0)
    fail("field 'head_dim' (" + std::to_string(c.head_dim) + ") must be even with RoPE");
}

void check_floats(const ModelConfig& c) {
  if (c.norm_eps < 0) fail("field 'norm_eps' must be >= 0");
  // Checked even without RoPE, as the Python reader does, so both accept the same files.
  if (c.rope_theta <= 0) fail("field 'rope_theta' must be > 0");
  if (c.init_state_std < 0) fail("field 'init_state_std' must be >= 0");
}

void check_options(const ModelConfig& c) {
  if (c.norm_bias && c.norm_type != NormType::LayerNorm)
    fail("field 'norm_bias' is only allowed with norm_type 'layernorm'");
  if (c.init_state == InitState::Random && !(c.init_state_std > 0))
    fail("field 'init_state_std' must be > 0 when init_state is 'random'");
  if (c.post_loop_norm == PostLoopNorm::Final && !c.final_norm)
    fail("field 'post_loop_norm' is 'final' but 'final_norm' is false");
}

// The gate's default rule needs the gate, a probability threshold and a real iteration.
void check_exit_gate(const ModelConfig& c) {
  if (c.exit_gate_mode != ExitGateMode::Off && !c.exit_gate)
    fail("field 'exit_gate_mode' is not 'off' but 'exit_gate' is false");
  if (c.exit_gate_threshold < 0 || c.exit_gate_threshold > 1)
    fail("field 'exit_gate_threshold' must be in [0, 1], got " + std::to_string(c.exit_gate_threshold));
  if (c.exit_gate_mode == ExitGateMode::Step && c.exit_gate_step < 1)
    fail("field 'exit_gate_step' must be >= 1 when 'exit_gate_mode' is 'step'");
}

// Indices over the pre, loop and post layers, increasing; the gate reads kValueGateDim
// channels of the normed input.
void check_value_embed_layers(const ModelConfig& c) {
  const int64_t n = checked_add(checked_add(c.n_pre_blocks, c.n_loop_layers, "layers"), c.n_post_blocks, "layers");
  for (size_t k = 0; k < c.value_embed_layers.size(); ++k) {
    const int64_t i = c.value_embed_layers[k];
    if (i < 0 || i >= n)
      fail("field 'value_embed_layers' has layer " + std::to_string(i) + " outside [0, " + std::to_string(n) +
           ") (the pre, loop and post layers in order)");
    if (k > 0 && i <= c.value_embed_layers[k - 1]) fail("field 'value_embed_layers' must be increasing");
  }
  if (!c.value_embed_layers.empty() && c.dim < kValueGateDim)
    fail("field 'value_embed_layers': the gate reads " + std::to_string(kValueGateDim) + " channels, 'dim' is " +
         std::to_string(c.dim));
}

void check_token_id(int64_t id, int64_t vocab, const char* field) {
  if (id < 0 || id >= vocab)
    fail("field " + quoted(field) + " has token id " + std::to_string(id) +
         " outside [0, vocab_size=" + std::to_string(vocab) + ")");
}

void check_token_ids(const ModelConfig& c) {
  if (c.bos_id) check_token_id(*c.bos_id, c.vocab_size, "bos_id");
  for (int64_t id : c.eos_ids) check_token_id(id, c.vocab_size, "eos_ids");
}

// Every product the engine will form from the config must fit, or shapes would wrap.
void check_derived_sizes(const ModelConfig& c) {
  const int64_t qkv_heads =
      checked_add(c.n_heads, checked_mul(2, c.n_kv_heads, "2 * n_kv_heads"), "n_heads + 2 * n_kv_heads");
  checked_mul(qkv_heads, c.head_dim, "(n_heads + 2 * n_kv_heads) * head_dim");
  checked_mul(2, c.dim, "2 * dim");
  checked_mul(c.vocab_size, c.dim, "vocab_size * dim");
  checked_mul(c.max_seq_len, c.dim, "max_seq_len * dim");
  checked_mul(c.ffn_dim, c.dim, "ffn_dim * dim");
  const int64_t looped = checked_mul(c.default_loops, c.n_loop_layers, "default_loops * n_loop_layers");
  checked_add(checked_add(c.n_pre_blocks, c.n_post_blocks, "n_pre_blocks + n_post_blocks"), looped, "effective depth");
}

void check_consistency(const ModelConfig& c) {
  check_sizes(c);  // first: the later rules divide by and multiply these
  check_heads(c);
  check_floats(c);
  check_options(c);
  check_exit_gate(c);
  check_value_embed_layers(c);
  check_token_ids(c);
  check_derived_sizes(c);
}

// ---- tensor names ----

// Appends in the order the tensors are added (each name is added once), so the list keeps
// the documented order: `m[name] = shape`.
struct ShapeMap {
  TensorShapeList items;
  std::vector<int64_t>& operator[](const std::string& name) {
    items.emplace_back(name, std::vector<int64_t>{});
    return items.back().second;
  }
};

void add_norm(ShapeMap& m, const ModelConfig& c, const std::string& name) {
  m[name + ".weight"] = {c.dim};
  if (c.norm_bias) m[name + ".bias"] = {c.dim};
}

void add_linear(ShapeMap& m, const std::string& name, int64_t out, int64_t in, bool bias) {
  m[name + ".weight"] = {out, in};
  if (bias) m[name + ".bias"] = {out};
}

void add_attention(ShapeMap& m, const ModelConfig& c, const std::string& p) {
  const int64_t q = checked_mul(c.n_heads, c.head_dim, "n_heads * head_dim");
  const int64_t kv = checked_mul(c.n_kv_heads, c.head_dim, "n_kv_heads * head_dim");
  if (c.qkv_fused) {
    const int64_t qkv = checked_add(q, checked_mul(2, kv, "2 * kv width"), "qkv width");
    add_linear(m, p + "attn.wqkv", qkv, c.dim, c.attn_qkv_bias);
  } else {
    add_linear(m, p + "attn.wq", q, c.dim, c.attn_qkv_bias);
    add_linear(m, p + "attn.wk", kv, c.dim, c.attn_qkv_bias);
    add_linear(m, p + "attn.wv", kv, c.dim, c.attn_qkv_bias);
  }
  add_linear(m, p + "attn.wo", c.dim, q, c.attn_out_bias);
}

void add_mlp(ShapeMap& m, const ModelConfig& c, const std::string& p) {
  if (c.mlp == MlpType::SwiGLU) add_linear(m, p + "mlp.w_gate", c.ffn_dim, c.dim, c.mlp_bias);
  add_linear(m, p + "mlp.w_up", c.ffn_dim, c.dim, c.mlp_bias);
  add_linear(m, p + "mlp.w_down", c.dim, c.ffn_dim, c.mlp_bias);
}

void add_layer(ShapeMap& m, const ModelConfig& c, const std::string& p, bool value_embed) {
  add_norm(m, c, p + "attn_norm");
  if (c.sandwich()) add_norm(m, c, p + "attn_post_norm");
  add_norm(m, c, p + "mlp_norm");
  if (c.sandwich()) add_norm(m, c, p + "mlp_post_norm");
  add_attention(m, c, p);
  if (value_embed) {
    m[p + "attn.value_embed.weight"] = {c.vocab_size, checked_mul(c.n_kv_heads, c.head_dim, "kv width")};
    m[p + "attn.value_gate.weight"] = {c.n_kv_heads, kValueGateDim};
  }
  add_mlp(m, c, p);
}

// `count` layers named prefix0., prefix1., ...; `first` is the first one's index over the
// pre, loop and post layers (value_embed_layers counts that way).
void add_layers(ShapeMap& m, const ModelConfig& c, const char* prefix, int64_t count, int64_t first) {
  for (int64_t i = 0; i < count; ++i) add_layer(m, c, prefix + std::to_string(i) + ".", c.has_value_embed(first + i));
}

}  // namespace

ModelConfig parse_config(const std::string& json_text) {
  const json j = parse_object(json_text);
  ModelConfig c;
  const std::set<std::string> present = read_fields(j, c);
  check_required(present);
  fill_derived_defaults(present, c);
  check_consistency(c);
  return c;
}

std::string config_to_json(const ModelConfig& c) {
  // ordered_json keeps the table's (= the doc's) field order, easier to read in a file's
  // metadata.
  nlohmann::ordered_json j;
#define TL_INT(name, def, presence, min, max, doc) j[#name] = c.name;
#define TL_UINT(name, def, doc) j[#name] = c.name;
#define TL_FLOAT(name, def, doc) j[#name] = c.name;
#define TL_BOOL(name, def, doc) j[#name] = c.name;
#define TL_ENUM(name, type, def, doc) j[#name] = enum_name(c.name);
#define TL_OPT_INT(name, doc) j[#name] = c.name ? nlohmann::ordered_json(*c.name) : nlohmann::ordered_json(nullptr);
#define TL_INT_LIST(name, doc) j[#name] = c.name;
#include "tinyloop/config_fields.def"
  return j.dump();
}

TensorShapeList expected_tensor_list(const ModelConfig& c) {
  ShapeMap m;
  m["embed.weight"] = {c.vocab_size, c.dim};
  if (c.pos_encoding == PosEncoding::Learned) m["pos_emb.weight"] = {c.max_seq_len, c.dim};
  if (c.inject == Inject::LinearConcat) m["inject.weight"] = {c.dim, checked_mul(2, c.dim, "2 * dim")};
  add_layers(m, c, "pre.", c.n_pre_blocks, 0);
  add_layers(m, c, "loop.", c.n_loop_layers, c.n_pre_blocks);
  add_layers(m, c, "post.", c.n_post_blocks, c.n_pre_blocks + c.n_loop_layers);
  if (c.prelude_norm) add_norm(m, c, "prelude_norm");
  if (c.loop_norm) add_norm(m, c, "loop_norm");
  if (c.post_loop_norm == PostLoopNorm::Own) add_norm(m, c, "post_loop_norm");
  if (c.post_loop_proj) m["post_loop_proj.weight"] = {c.dim, c.dim};
  if (c.final_norm) add_norm(m, c, "final_norm");
  if (!c.tie_embeddings) m["head.weight"] = {c.vocab_size, c.dim};
  if (c.exit_gate) {
    m["exit_gate.weight"] = {1, c.dim};
    m["exit_gate.bias"] = {1};
  }
  return std::move(m.items);
}

std::map<std::string, std::vector<int64_t>> expected_tensor_shapes(const ModelConfig& c) {
  const TensorShapeList list = expected_tensor_list(c);
  return {list.begin(), list.end()};
}

}  // namespace tinyloop
