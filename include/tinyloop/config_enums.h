// The enum-valued config fields and their names in the config JSON (docs/model-format.md,
// "Config"). One name table per enum, read both ways (parse, write, the schema the Python
// package reads), so the names exist once.
#pragma once
#include <span>

namespace tinyloop {

template <class E>
struct EnumName {
  const char* name;
  E value;
};

enum class NormType { RMSNorm, LayerNorm };
inline constexpr EnumName<NormType> kNormTypeNames[] = {{"rmsnorm", NormType::RMSNorm},
                                                        {"layernorm", NormType::LayerNorm}};

enum class NormPlacement { Pre, HuginnSandwich, OuroSandwich };
inline constexpr EnumName<NormPlacement> kNormPlacementNames[] = {{"pre", NormPlacement::Pre},
                                                                  {"huginn_sandwich", NormPlacement::HuginnSandwich},
                                                                  {"ouro_sandwich", NormPlacement::OuroSandwich}};

enum class PosEncoding { RopeHalf, RopeInterleaved, Learned, None };
inline constexpr EnumName<PosEncoding> kPosEncodingNames[] = {{"rope_half", PosEncoding::RopeHalf},
                                                              {"rope_interleaved", PosEncoding::RopeInterleaved},
                                                              {"learned", PosEncoding::Learned},
                                                              {"none", PosEncoding::None}};

enum class MlpType { SwiGLU, GELU, GELUTanh, ReLU2 };
inline constexpr EnumName<MlpType> kMlpTypeNames[] = {
    {"swiglu", MlpType::SwiGLU}, {"gelu", MlpType::GELU}, {"gelu_tanh", MlpType::GELUTanh}, {"relu2", MlpType::ReLU2}};

enum class InitState { Input, Zeros, Random };
inline constexpr EnumName<InitState> kInitStateNames[] = {
    {"input", InitState::Input}, {"zeros", InitState::Zeros}, {"random", InitState::Random}};

enum class Inject { None, Add, LinearConcat };
inline constexpr EnumName<Inject> kInjectNames[] = {
    {"none", Inject::None}, {"add", Inject::Add}, {"linear_concat", Inject::LinearConcat}};

enum class PostLoopNorm { None, Final, Own };
inline constexpr EnumName<PostLoopNorm> kPostLoopNormNames[] = {
    {"none", PostLoopNorm::None}, {"final", PostLoopNorm::Final}, {"own", PostLoopNorm::Own}};

// How Ouro's learned exit gate picks a token's logits (docs/loop-depth.md, "Exit gate"):
// Off = the last iteration's; Threshold = the first iteration whose exit CDF reaches
// exit_gate_threshold; Step = iteration exit_gate_step; Weighted = the exit distribution's
// mixture of every iteration's logits.
enum class ExitGateMode { Off, Threshold, Step, Weighted };
inline constexpr EnumName<ExitGateMode> kExitGateModeNames[] = {{"off", ExitGateMode::Off},
                                                                {"threshold", ExitGateMode::Threshold},
                                                                {"step", ExitGateMode::Step},
                                                                {"weighted", ExitGateMode::Weighted}};

// enum_names(E{}) finds an enum's table, so generic code (config.cc, the schema) needs no
// per-enum case; a new enum adds its overload here.
constexpr std::span<const EnumName<NormType>> enum_names(NormType) { return kNormTypeNames; }
constexpr std::span<const EnumName<NormPlacement>> enum_names(NormPlacement) { return kNormPlacementNames; }
constexpr std::span<const EnumName<PosEncoding>> enum_names(PosEncoding) { return kPosEncodingNames; }
constexpr std::span<const EnumName<MlpType>> enum_names(MlpType) { return kMlpTypeNames; }
constexpr std::span<const EnumName<InitState>> enum_names(InitState) { return kInitStateNames; }
constexpr std::span<const EnumName<Inject>> enum_names(Inject) { return kInjectNames; }
constexpr std::span<const EnumName<PostLoopNorm>> enum_names(PostLoopNorm) { return kPostLoopNormNames; }
constexpr std::span<const EnumName<ExitGateMode>> enum_names(ExitGateMode) { return kExitGateModeNames; }

// The JSON name of `value` ("?" only for a value outside its enum, which no parse produces).
template <class E>
constexpr const char* enum_name(E value) {
  for (const auto& e : enum_names(E{}))
    if (e.value == value) return e.name;
  return "?";
}

}  // namespace tinyloop
