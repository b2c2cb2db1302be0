// parse_config / config_to_json / expected_tensor_shapes against docs/model-format.md.
#include "tinyloop/config.h"
#include "tinyloop/config_tensors.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tinyloop/errors.h"

namespace tinyloop {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

// The five required fields; tests add or override the rest.
json minimal() { return {{"dim", 8}, {"vocab_size", 16}, {"n_heads", 2}, {"ffn_dim", 12}, {"n_loop_layers", 1}}; }

// The FormatError message of parse_config(j), or "" if it did not throw that.
std::string error_of(const json& j) {
  try {
    parse_config(j.dump());
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

json with(json j, const std::string& key, const json& value) {
  j[key] = value;
  return j;
}

TEST(ParseConfig, DefaultsFollowTheDocTable) {
  const ModelConfig c = parse_config(minimal().dump());
  EXPECT_EQ(c.dim, 8);
  EXPECT_EQ(c.n_kv_heads, 2);  // = n_heads
  EXPECT_EQ(c.head_dim, 4);  // = dim / n_heads
  EXPECT_EQ(c.n_pre_blocks, 0);
  EXPECT_EQ(c.n_post_blocks, 0);
  EXPECT_EQ(c.default_loops, 1);
  EXPECT_EQ(c.max_seq_len, 2048);
  EXPECT_EQ(c.norm_type, NormType::RMSNorm);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_FALSE(c.norm_bias);
  EXPECT_EQ(c.norm_placement, NormPlacement::Pre);
  EXPECT_FALSE(c.qkv_fused);
  EXPECT_FALSE(c.attn_qkv_bias);
  EXPECT_FALSE(c.attn_out_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.value_embed_layers.empty());
  EXPECT_EQ(c.pos_encoding, PosEncoding::RopeHalf);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.mlp, MlpType::SwiGLU);
  EXPECT_DOUBLE_EQ(c.embed_scale, 1.0);
  EXPECT_EQ(c.init_state, InitState::Input);
  EXPECT_DOUBLE_EQ(c.init_state_std, 0.0);
  EXPECT_EQ(c.init_state_seed, 0u);
  EXPECT_FALSE(c.prelude_norm);
  EXPECT_EQ(c.inject, Inject::None);
  EXPECT_FALSE(c.loop_norm);
  EXPECT_EQ(c.post_loop_norm, PostLoopNorm::None);
  EXPECT_FALSE(c.post_loop_proj);
  EXPECT_TRUE(c.final_norm);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_FALSE(c.exit_gate);
  EXPECT_FALSE(c.bos_id.has_value());
  EXPECT_TRUE(c.eos_ids.empty());
}

TEST(ParseConfig, EnumsFromTheirStrings) {
  json j = minimal();
  j["norm_type"] = "layernorm";
  j["norm_bias"] = true;
  j["norm_placement"] = "huginn_sandwich";
  j["pos_encoding"] = "rope_interleaved";
  j["mlp"] = "gelu_tanh";
  j["init_state"] = "random";
  j["init_state_std"] = 0.5;
  j["init_state_seed"] = 18446744073709551615ull;  // the whole uint64 range is a valid seed
  j["inject"] = "linear_concat";
  j["post_loop_norm"] = "own";
  const ModelConfig c = parse_config(j.dump());
  EXPECT_EQ(c.norm_type, NormType::LayerNorm);
  EXPECT_TRUE(c.norm_bias);
  EXPECT_EQ(c.norm_placement, NormPlacement::HuginnSandwich);
  EXPECT_EQ(c.pos_encoding, PosEncoding::RopeInterleaved);
  EXPECT_EQ(c.mlp, MlpType::GELUTanh);
  EXPECT_EQ(c.init_state, InitState::Random);
  EXPECT_EQ(c.init_state_seed, 18446744073709551615ull);
  EXPECT_EQ(c.inject, Inject::LinearConcat);
  EXPECT_EQ(c.post_loop_norm, PostLoopNorm::Own);
}

TEST(ParseConfig, RoundTripsThroughConfigToJson) {
  json j = minimal();
  j["n_kv_heads"] = 1;
  j["head_dim"] = 6;
  j["norm_eps"] = 1e-6;
  j["norm_placement"] = "ouro_sandwich";
  j["rope_theta"] = 500000.0;
  j["embed_scale"] = 2.8284271247461903;
  j["bos_id"] = 1;
  j["eos_ids"] = {2, 15};
  j["exit_gate"] = true;
  j["mlp"] = "relu2";
  j["qk_norm"] = true;
  j["prelude_norm"] = true;
  j["post_loop_proj"] = true;
  j["dim"] = 36;  // a value-embedding gate reads 32 channels
  j["n_heads"] = 6;
  j["value_embed_layers"] = {0};
  const ModelConfig a = parse_config(j.dump());
  const ModelConfig b = parse_config(config_to_json(a));
  EXPECT_EQ(config_to_json(a), config_to_json(b));
  EXPECT_EQ(b.head_dim, 6);
  EXPECT_EQ(b.bos_id, std::optional<int64_t>(1));
  EXPECT_EQ(b.eos_ids, (std::vector<int64_t>{2, 15}));
  EXPECT_DOUBLE_EQ(b.embed_scale, 2.8284271247461903);
  EXPECT_EQ(b.norm_placement, NormPlacement::OuroSandwich);
  EXPECT_EQ(b.mlp, MlpType::ReLU2);
  EXPECT_TRUE(b.qk_norm && b.prelude_norm && b.post_loop_proj);
  EXPECT_EQ(b.value_embed_layers, (std::vector<int64_t>{0}));
}

TEST(ParseConfig, ValueEmbedLayersAreIncreasingLayerIndices) {
  json j = minimal();  // one loop layer, dim 8
  j["dim"] = 32;
  j["n_pre_blocks"] = 1;
  j["n_post_blocks"] = 1;
  EXPECT_EQ(parse_config(with(j, "value_embed_layers", {0, 2}).dump()).value_embed_layers,
            (std::vector<int64_t>{0, 2}));
  EXPECT_THAT(error_of(with(j, "value_embed_layers", {3})), HasSubstr("layer 3 outside [0, 3)"));
  EXPECT_THAT(error_of(with(j, "value_embed_layers", {2, 1})), HasSubstr("must be increasing"));
  EXPECT_THAT(error_of(with(j, "value_embed_layers", {1, 1})), HasSubstr("must be increasing"));
  EXPECT_THAT(error_of(with(minimal(), "value_embed_layers", {0})), HasSubstr("the gate reads 32"));
}

TEST(ParseConfig, ExitGateRuleNeedsTheGateAndSaneValues) {
  json gated = with(minimal(), "exit_gate", true);
  const ModelConfig c = parse_config(with(with(gated, "exit_gate_mode", "step"), "exit_gate_step", 2).dump());
  EXPECT_EQ(c.exit_gate_mode, ExitGateMode::Step);
  EXPECT_EQ(c.exit_gate_step, 2);
  EXPECT_EQ(parse_config(config_to_json(c)).exit_gate_step, 2);
  EXPECT_THAT(error_of(with(minimal(), "exit_gate_mode", "threshold")), HasSubstr("'exit_gate' is false"));
  EXPECT_THAT(error_of(with(gated, "exit_gate_mode", "sometimes")), HasSubstr("'exit_gate_mode'"));
  EXPECT_THAT(error_of(with(gated, "exit_gate_threshold", 1.5)), HasSubstr("'exit_gate_threshold' must be in [0, 1]"));
  EXPECT_THAT(error_of(with(gated, "exit_gate_mode", "step")), HasSubstr("'exit_gate_step' must be >= 1"));
}

TEST(ParseConfig, ConfigToJsonWritesEveryField) {
  const json j = json::parse(config_to_json(parse_config(minimal().dump())));
  EXPECT_EQ(j.size(), json::parse(config_schema_json()).size());  // every field of the table
  EXPECT_TRUE(j.at("bos_id").is_null());
  EXPECT_EQ(j.at("norm_type"), "rmsnorm");
}

TEST(ParseConfig, NotJsonOrNotObject) {
  EXPECT_THROW(parse_config("{"), FormatError);
  EXPECT_THAT(error_of(json::array({1, 2})), HasSubstr("must be a JSON object"));
}

TEST(ParseConfig, UnknownFieldIsNamed) {
  EXPECT_THAT(error_of(with(minimal(), "n_head", 2)), HasSubstr("unknown field 'n_head'"));
}

TEST(ParseConfig, MissingRequiredFieldIsNamed) {
  for (const char* f : {"dim", "vocab_size", "n_heads", "ffn_dim", "n_loop_layers"}) {
    json j = minimal();
    j.erase(f);
    EXPECT_THAT(error_of(j), HasSubstr(std::string("missing required field '") + f + "'")) << f;
  }
}

TEST(ParseConfig, WrongTypeNamesFieldAndExpectedType) {
  EXPECT_THAT(error_of(with(minimal(), "dim", "8")), HasSubstr("field 'dim' must be an integer, got a string"));
  EXPECT_THAT(error_of(with(minimal(), "dim", 8.0)), HasSubstr("field 'dim' must be an integer"));
  EXPECT_THAT(error_of(with(minimal(), "norm_eps", "x")), HasSubstr("field 'norm_eps' must be a number"));
  EXPECT_THAT(error_of(with(minimal(), "qkv_fused", 1)), HasSubstr("field 'qkv_fused' must be a boolean"));
  EXPECT_THAT(error_of(with(minimal(), "mlp", 3)), HasSubstr("field 'mlp' must be a string"));
  EXPECT_THAT(error_of(with(minimal(), "bos_id", "1")), HasSubstr("field 'bos_id' must be an integer or null"));
  EXPECT_THAT(error_of(with(minimal(), "eos_ids", 2)), HasSubstr("field 'eos_ids' must be a list of integers"));
  EXPECT_THAT(error_of(with(minimal(), "eos_ids", {1, "x"})), HasSubstr("field 'eos_ids' must be a list of integers"));
  EXPECT_THAT(error_of(with(minimal(), "init_state_seed", -1)), HasSubstr("'init_state_seed' must be non-negative"));
  EXPECT_THAT(error_of(with(minimal(), "dim", 18446744073709551615ull)), HasSubstr("'dim' is too large"));
}

TEST(ParseConfig, UnknownEnumValueListsAllowed) {
  const std::string msg = error_of(with(minimal(), "norm_type", "batchnorm"));
  EXPECT_THAT(msg, HasSubstr("'norm_type' has unknown value 'batchnorm'"));
  EXPECT_THAT(msg, HasSubstr("'rmsnorm', 'layernorm'"));
}

TEST(ParseConfig, SizesMustBePositive) {
  for (const char* f : {"dim", "vocab_size", "n_heads", "ffn_dim", "n_loop_layers", "n_kv_heads", "head_dim",
                        "default_loops", "max_seq_len"}) {
    EXPECT_THAT(error_of(with(minimal(), f, 0)), HasSubstr(std::string("'") + f + "' must be >= 1")) << f;
  }
  EXPECT_THAT(error_of(with(minimal(), "n_pre_blocks", -1)), HasSubstr("'n_pre_blocks' must be >= 0"));
  EXPECT_NO_THROW(parse_config(with(minimal(), "n_post_blocks", 0).dump()));
}

TEST(ParseConfig, ConsistencyRules) {
  EXPECT_THAT(error_of(with(minimal(), "n_kv_heads", 3)), HasSubstr("'n_kv_heads' (3) must divide 'n_heads' (2)"));
  EXPECT_THAT(error_of(with(minimal(), "head_dim", 5)), HasSubstr("'head_dim' (5) must be even"));
  json no_rope = with(with(minimal(), "head_dim", 5), "pos_encoding", "none");
  EXPECT_NO_THROW(parse_config(no_rope.dump()));
  EXPECT_THAT(error_of(with(minimal(), "norm_bias", true)),
              HasSubstr("'norm_bias' is only allowed with norm_type 'layernorm'"));
  EXPECT_THAT(error_of(with(minimal(), "init_state", "random")), HasSubstr("'init_state_std' must be > 0"));
  EXPECT_THAT(error_of(with(with(minimal(), "post_loop_norm", "final"), "final_norm", false)),
              HasSubstr("'post_loop_norm' is 'final' but 'final_norm' is false"));
  EXPECT_THAT(error_of(with(minimal(), "bos_id", 16)),
              HasSubstr("'bos_id' has token id 16 outside [0, vocab_size=16)"));
  EXPECT_THAT(error_of(with(minimal(), "eos_ids", {0, -1})), HasSubstr("'eos_ids' has token id -1"));
  EXPECT_THAT(error_of(with(minimal(), "norm_eps", -1.0)), HasSubstr("'norm_eps' must be >= 0"));
  EXPECT_THAT(error_of(with(with(minimal(), "rope_theta", 0), "pos_encoding", "none")),
              HasSubstr("'rope_theta' must be > 0"));
}

TEST(ParseConfig, HeadDimDefaultNeedsDivisibleDim) {
  EXPECT_THAT(error_of(with(minimal(), "n_heads", 3)), HasSubstr("'head_dim' is required"));
  json j = with(with(minimal(), "n_heads", 3), "head_dim", 4);
  EXPECT_NO_THROW(parse_config(j.dump()));
}

TEST(ParseConfig, DerivedSizesMustNotOverflow) {
  json j = minimal();
  j["dim"] = int64_t(1) << 62;
  j["n_heads"] = 1;
  j["head_dim"] = 2;
  EXPECT_THAT(error_of(j), HasSubstr("overflows"));
  json k = with(minimal(), "default_loops", 4096);
  k["n_loop_layers"] = int64_t(1) << 62;
  EXPECT_THAT(error_of(k), HasSubstr("overflows"));
}

// ---- expected_tensor_shapes ----

ModelConfig base() { return parse_config(minimal().dump()); }  // D=8, V=16, H=KVH=2, hd=4, F=12

TEST(ExpectedShapes, PlainPreNormModel) {
  const auto m = expected_tensor_shapes(base());
  const std::map<std::string, Shape> want = {
      {"embed.weight", {16, 8}},           {"loop.0.attn_norm.weight", {8}},
      {"loop.0.mlp_norm.weight", {8}},     {"loop.0.attn.wq.weight", {8, 8}},
      {"loop.0.attn.wk.weight", {8, 8}},   {"loop.0.attn.wv.weight", {8, 8}},
      {"loop.0.attn.wo.weight", {8, 8}},   {"loop.0.mlp.w_gate.weight", {12, 8}},
      {"loop.0.mlp.w_up.weight", {12, 8}}, {"loop.0.mlp.w_down.weight", {8, 12}},
      {"final_norm.weight", {8}},          {"head.weight", {16, 8}},
  };
  EXPECT_EQ(m, want);
}

TEST(ExpectedShapes, LayerPrefixes) {
  ModelConfig c = base();
  c.n_pre_blocks = 2;
  c.n_loop_layers = 3;
  c.n_post_blocks = 1;
  const auto m = expected_tensor_shapes(c);
  for (const char* p : {"pre.0.", "pre.1.", "loop.0.", "loop.1.", "loop.2.", "post.0."})
    EXPECT_TRUE(m.count(std::string(p) + "attn.wo.weight")) << p;
  EXPECT_FALSE(m.count("pre.2.attn.wo.weight"));
  EXPECT_FALSE(m.count("post.1.attn.wo.weight"));
  EXPECT_EQ(m.size(), 1 + 6 * 9 + 2u);
}

TEST(ExpectedShapes, FusedGqaQkvWithBiases) {
  ModelConfig c = base();
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.head_dim = 2;
  c.qkv_fused = true;
  c.attn_qkv_bias = true;
  c.attn_out_bias = true;
  c.mlp_bias = true;
  const auto m = expected_tensor_shapes(c);
  EXPECT_EQ(m.at("loop.0.attn.wqkv.weight"), (Shape{12, 8}));  // (4 + 2*1) * 2
  EXPECT_EQ(m.at("loop.0.attn.wqkv.bias"), (Shape{12}));
  EXPECT_FALSE(m.count("loop.0.attn.wq.weight"));
  EXPECT_EQ(m.at("loop.0.attn.wo.weight"), (Shape{8, 8}));
  EXPECT_EQ(m.at("loop.0.attn.wo.bias"), (Shape{8}));
  EXPECT_EQ(m.at("loop.0.mlp.w_gate.bias"), (Shape{12}));
  EXPECT_EQ(m.at("loop.0.mlp.w_up.bias"), (Shape{12}));
  EXPECT_EQ(m.at("loop.0.mlp.w_down.bias"), (Shape{8}));
}

TEST(ExpectedShapes, SplitQkvBiasAndGqaShapes) {
  ModelConfig c = base();
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 3;
  c.pos_encoding = PosEncoding::None;
  c.attn_qkv_bias = true;
  const auto m = expected_tensor_shapes(c);
  EXPECT_EQ(m.at("loop.0.attn.wq.weight"), (Shape{12, 8}));
  EXPECT_EQ(m.at("loop.0.attn.wk.weight"), (Shape{6, 8}));
  EXPECT_EQ(m.at("loop.0.attn.wv.weight"), (Shape{6, 8}));
  EXPECT_EQ(m.at("loop.0.attn.wq.bias"), (Shape{12}));
  EXPECT_EQ(m.at("loop.0.attn.wv.bias"), (Shape{6}));
  EXPECT_EQ(m.at("loop.0.attn.wo.weight"), (Shape{8, 12}));
  EXPECT_FALSE(m.count("loop.0.attn.wo.bias"));
}

TEST(ExpectedShapes, SandwichLayerNormWithBias) {
  ModelConfig c = base();
  c.norm_type = NormType::LayerNorm;
  c.norm_bias = true;
  c.norm_placement = NormPlacement::HuginnSandwich;
  const auto m = expected_tensor_shapes(c);
  for (const char* n : {"attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm"}) {
    EXPECT_EQ(m.at(std::string("loop.0.") + n + ".weight"), (Shape{8})) << n;
    EXPECT_EQ(m.at(std::string("loop.0.") + n + ".bias"), (Shape{8})) << n;
  }
  EXPECT_EQ(m.at("final_norm.bias"), (Shape{8}));
}

TEST(ExpectedShapes, GeluHasNoGate) {
  ModelConfig c = base();
  c.mlp = MlpType::GELU;
  const auto m = expected_tensor_shapes(c);
  EXPECT_FALSE(m.count("loop.0.mlp.w_gate.weight"));
  EXPECT_TRUE(m.count("loop.0.mlp.w_up.weight"));
}

TEST(ExpectedShapes, Relu2HasNoGate) {
  ModelConfig c = base();
  c.mlp = MlpType::ReLU2;
  const auto m = expected_tensor_shapes(c);
  EXPECT_FALSE(m.count("loop.0.mlp.w_gate.weight"));
  EXPECT_TRUE(m.count("loop.0.mlp.w_up.weight"));
}

TEST(ExpectedShapes, PreludeNormAndPostLoopProj) {
  ModelConfig c = base();
  c.prelude_norm = true;
  c.post_loop_proj = true;
  c.qk_norm = true;  // weightless: adds no tensor
  const auto m = expected_tensor_shapes(c);
  EXPECT_EQ(m.at("prelude_norm.weight"), (Shape{8}));
  EXPECT_EQ(m.at("post_loop_proj.weight"), (Shape{8, 8}));
  EXPECT_FALSE(m.count("post_loop_proj.bias"));
  EXPECT_EQ(m.size(), expected_tensor_shapes(base()).size() + 2);
}

TEST(ExpectedShapes, ValueEmbeddingsOnTheListedLayers) {
  json j = minimal();
  j["dim"] = 32;
  j["n_kv_heads"] = 1;
  j["n_pre_blocks"] = 1;
  j["n_post_blocks"] = 1;
  j["value_embed_layers"] = {1, 2};  // loop.0 and post.0
  const auto m = expected_tensor_shapes(parse_config(j.dump()));
  EXPECT_FALSE(m.count("pre.0.attn.value_embed.weight"));
  for (const char* p : {"loop.0.", "post.0."}) {
    EXPECT_EQ(m.at(std::string(p) + "attn.value_embed.weight"), (Shape{16, 16})) << p;  // [V, KVH hd]
    EXPECT_EQ(m.at(std::string(p) + "attn.value_gate.weight"), (Shape{1, 32})) << p;  // [KVH, 32]
  }
}

TEST(ExpectedShapes, GlobalOptionalTensors) {
  ModelConfig c = base();
  c.pos_encoding = PosEncoding::Learned;
  c.max_seq_len = 32;
  c.inject = Inject::LinearConcat;
  c.loop_norm = true;
  c.post_loop_norm = PostLoopNorm::Own;
  c.tie_embeddings = true;
  c.exit_gate = true;
  const auto m = expected_tensor_shapes(c);
  EXPECT_EQ(m.at("pos_emb.weight"), (Shape{32, 8}));
  EXPECT_EQ(m.at("inject.weight"), (Shape{8, 16}));
  EXPECT_EQ(m.at("loop_norm.weight"), (Shape{8}));
  EXPECT_EQ(m.at("post_loop_norm.weight"), (Shape{8}));
  EXPECT_EQ(m.at("exit_gate.weight"), (Shape{1, 8}));
  EXPECT_EQ(m.at("exit_gate.bias"), (Shape{1}));
  EXPECT_FALSE(m.count("head.weight"));
  EXPECT_FALSE(m.count("inject.bias"));
}

TEST(ExpectedShapes, PostLoopNormFinalReusesFinalNormAndNoFinalNorm) {
  ModelConfig c = base();
  c.post_loop_norm = PostLoopNorm::Final;
  auto m = expected_tensor_shapes(c);
  EXPECT_FALSE(m.count("post_loop_norm.weight"));
  EXPECT_TRUE(m.count("final_norm.weight"));
  c.post_loop_norm = PostLoopNorm::None;
  c.final_norm = false;
  m = expected_tensor_shapes(c);
  EXPECT_FALSE(m.count("final_norm.weight"));
}

// The list is the documented order (docs/model-format.md, "Tensor names"), each name once,
// and the map is the same content.
TEST(ExpectedShapes, ListKeepsTheDocumentedOrder) {
  ModelConfig c = base();
  c.n_pre_blocks = 1;
  c.n_post_blocks = 1;
  c.norm_type = NormType::LayerNorm;
  c.norm_bias = true;
  c.prelude_norm = true;
  c.exit_gate = true;
  const TensorShapeList list = expected_tensor_list(c);
  std::vector<std::string> names;
  for (const auto& [name, shape] : list) names.push_back(name);
  const auto pos = [&](const std::string& n) {
    const auto it = std::find(names.begin(), names.end(), n);
    EXPECT_NE(it, names.end()) << n;
    return it - names.begin();
  };
  EXPECT_EQ(pos("embed.weight"), 0);
  EXPECT_LT(pos("pre.0.mlp.w_down.weight"), pos("loop.0.attn_norm.weight"));
  EXPECT_LT(pos("loop.0.attn_norm.weight"), pos("loop.0.attn_norm.bias"));  // weight, then bias
  EXPECT_LT(pos("loop.0.attn.wo.weight"), pos("loop.0.mlp.w_gate.weight"));
  EXPECT_LT(pos("post.0.mlp.w_down.weight"), pos("prelude_norm.weight"));
  EXPECT_LT(pos("final_norm.bias"), pos("head.weight"));
  EXPECT_EQ(names.back(), "exit_gate.bias");
  const auto map = expected_tensor_shapes(c);
  EXPECT_EQ(map.size(), list.size());  // no name twice
  for (const auto& [name, shape] : list) EXPECT_EQ(map.at(name), shape) << name;
}

}  // namespace
}  // namespace tinyloop
