// Element types of weights and KV storage, and scalar conversions between them.
#pragma once
#include <cstdint>
#include <cstddef>
#include <string>

namespace tinyloop {

enum class DType : uint8_t { F32, F16, BF16 };

// Bytes per element of a dtype.
size_t dtype_size(DType t);
// "F32" / "F16" / "BF16" (the safetensors spelling).
const char* dtype_name(DType t);

namespace ops {
// IEEE half <-> float, round to nearest even; inf/nan/subnormals handled exactly.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// bfloat16 <-> float, round to nearest even (nan stays nan).
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
}  // namespace ops
}  // namespace tinyloop
