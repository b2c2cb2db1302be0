// The model config of a .tinyloop file (docs/model-format.md, "Config").
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

enum class NormType { RMSNorm, LayerNorm };
enum class NormPlacement { Pre, HuginnSandwich, OuroSandwich };
enum class PosEncoding { RopeHalf, RopeInterleaved, Learned, None };
enum class MlpType { SwiGLU, GELU, GELUTanh, ReLU2 };
enum class InitState { Input, Zeros, Random };
enum class Inject { None, Add, LinearConcat };
enum class PostLoopNorm { None, Final, Own };
// How Ouro's learned exit gate picks a token's logits (docs/loop-depth.md, "Exit gate"):
// Off = the last iteration's; Threshold = the first iteration whose exit CDF reaches
// exit_gate_threshold; Step = iteration exit_gate_step; Weighted = the exit distribution's
// mixture of every iteration's logits.
enum class ExitGateMode { Off, Threshold, Step, Weighted };

struct ModelConfig {
  int64_t dim = 0;
  int64_t vocab_size = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t n_pre_blocks = 0;
  int64_t n_loop_layers = 0;
  int64_t n_post_blocks = 0;
  int64_t default_loops = 1;
  int64_t max_seq_len = 2048;
  NormType norm_type = NormType::RMSNorm;
  double norm_eps = 1e-5;
  bool norm_bias = false;
  NormPlacement norm_placement = NormPlacement::Pre;
  bool qkv_fused = false;
  bool attn_qkv_bias = false;
  bool attn_out_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;  // q and k of each head divided by their RMS after RoPE (Parcae)
  // Layers (indices over pre, loop, post layers in order) whose v gets a gated per-token
  // value embedding (Parcae's value_embeds / ve_gate).
  std::vector<int64_t> value_embed_layers;
  PosEncoding pos_encoding = PosEncoding::RopeHalf;
  double rope_theta = 10000.0;
  MlpType mlp = MlpType::SwiGLU;
  double embed_scale = 1.0;
  InitState init_state = InitState::Input;
  double init_state_std = 0.0;
  uint64_t init_state_seed = 0;
  // true: a random initial state is drawn per call from the call's seed (fresh entropy
  // without one), as Huginn's reference draws it per forward; false: init_state_seed,
  // the same state for every call (docs/model-format.md).
  bool init_state_per_call = false;
  bool prelude_norm = false;  // a norm on the loop input, after the pre blocks (Parcae)
  Inject inject = Inject::None;
  bool loop_norm = false;
  PostLoopNorm post_loop_norm = PostLoopNorm::None;
  bool post_loop_proj = false;  // a [D, D] linear on the loop output (Parcae's C)
  bool final_norm = true;
  bool tie_embeddings = false;
  bool exit_gate = false;
  // The gate's default rule, as Ouro's reference reads it from config.json
  // (docs/convert.md, "Ouro"); a call's exit_gate* kwargs override it.
  ExitGateMode exit_gate_mode = ExitGateMode::Off;
  double exit_gate_threshold = 1.0;  // in [0, 1]
  int64_t exit_gate_step = 0;        // 1-based iteration (Step mode needs >= 1)
  std::optional<int64_t> bos_id;
  std::vector<int64_t> eos_ids;

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
  int64_t effective_depth(int64_t loops) const {
    return n_pre_blocks + loops * n_loop_layers + n_post_blocks;
  }
};

// Parse the config JSON text, fill defaults, check consistency (docs/model-format.md).
// Throws tinyloop::FormatError naming the field on any problem (unknown field included).
ModelConfig parse_config(const std::string& json_text);
// The config as JSON text (every field written, so it round-trips).
std::string config_to_json(const ModelConfig& c);

}  // namespace tinyloop

namespace tinyloop {
class ModelFile;
// Every tensor name the config needs, with its shape (docs/model-format.md, "Tensor names").
std::map<std::string, std::vector<int64_t>> expected_tensor_shapes(const ModelConfig& c);
}  // namespace tinyloop
