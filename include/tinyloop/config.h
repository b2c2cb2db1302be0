// The model config of a .tinyloop file (docs/model-format.md, "Config").
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tinyloop/config_enums.h"

namespace tinyloop {

// Upper limits on what a config or a call may ask for (docs/limits.md).
// Loop depth: far beyond what looped models are trained or tested at (Huginn-0125 up to
// 64-128, Ouro 4), while time and KV grow linearly with depth; it keeps every size computed
// from loops (KV slots x blocks x bytes) far from int64's range.
inline constexpr int64_t kMaxLoops = 4096;
// Positions per sequence (config max_seq_len and Model(max_seq_len=)): 16M, beyond every
// released context length, and far from where positions x rows x bytes could wrap.
inline constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
// qk_norm's epsilon: 2^-23, the float32 epsilon that Parcae's weightless
// F.rms_norm(eps=None) uses on float32 rows (docs/model-format.md).
inline constexpr float kQkNormEps = 1.1920928955078125e-07f;
// Input channels of a value-embedding gate: Parcae's ve_gate reads the first 32 channels of
// the layer's normed input (docs/model-format.md).
inline constexpr int64_t kValueGateDim = 32;

// Whether a TL_INT field of config_fields.def must be given, has a plain default, or has
// a default computed from other fields (config.cc: fill_derived_defaults).
enum class FieldPresence { Required, Optional, Derived };
// The `max` of a TL_INT field without an upper limit.
inline constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Every member is declared in config_fields.def (one line a field, with its default).
struct ModelConfig {
#define TL_INT(name, def, presence, min, max, doc) int64_t name = def;
#define TL_UINT(name, def, doc) uint64_t name = def;
#define TL_FLOAT(name, def, doc) double name = def;
#define TL_BOOL(name, def, doc) bool name = def;
#define TL_ENUM(name, type, def, doc) type name = def;
#define TL_OPT_INT(name, doc) std::optional<int64_t> name;
#define TL_INT_LIST(name, doc) std::vector<int64_t> name;
#include "tinyloop/config_fields.def"

  bool sandwich() const { return norm_placement != NormPlacement::Pre; }
  // Whether layer `index` (over pre, loop, post layers in order) has a value embedding.
  bool has_value_embed(int64_t index) const {
    for (int64_t i : value_embed_layers)
      if (i == index) return true;
    return false;
  }
  bool uses_rope() const {
    return pos_encoding == PosEncoding::RopeHalf || pos_encoding == PosEncoding::RopeInterleaved;
  }
  // Layer applications of one forward at `loops` iterations (= KV slots).
  int64_t effective_depth(int64_t loops) const { return n_pre_blocks + loops * n_loop_layers + n_post_blocks; }
};

// Parse the config JSON text, fill defaults, check consistency (docs/model-format.md).
// Throws tinyloop::FormatError naming the field on any problem (unknown field included).
ModelConfig parse_config(const std::string& json_text);
// The config as JSON text (every field written, so it round-trips).
std::string config_to_json(const ModelConfig& c);
// The field table of config_fields.def as JSON text, for the Python package
// (docs/model-format.md, "Adding a config field"): a list of {"name", "kind" ("int",
// "uint64", "float", "bool", "enum", "int_or_null", "int_list"), "default" (null when
// required or derived), "required", "derived", "min" / "max" (int), "choices" (enum), "doc"}.
std::string config_schema_json();

}  // namespace tinyloop

namespace tinyloop {
class ModelFile;
// Every tensor name the config needs, with its shape (docs/model-format.md, "Tensor names").
std::map<std::string, std::vector<int64_t>> expected_tensor_shapes(const ModelConfig& c);
}  // namespace tinyloop
