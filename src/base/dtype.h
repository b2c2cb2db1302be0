// Element types of weights and KV storage, and scalar conversions between them.
#pragma once
#include <cstdint>
#include <cstddef>
#include <string>

namespace tinyloop {

// Weight storage. I8 and U4 are the quantized formats of model-format version 2: I8 one
// signed byte an element, U4 two unsigned 4-bit elements a byte (column 2b in the low
// nibble of byte b, 2b+1 in the high one), each with per-group scales (and offsets for U4)
// beside them (ops::WeightView).
enum class DType : uint8_t { F32, F16, BF16, I8, U4 };

// Bytes per element of a dtype; U4 (half a byte) reports 1, use weight_row_bytes for rows.
size_t dtype_size(DType t);
// Bytes of one stored row of `cols` elements (U4: cols / 2; cols is even there).
int64_t weight_row_bytes(DType t, int64_t cols);
// "F32" / "F16" / "BF16" / "I8" (the safetensors spelling); "U4" for int4 (stored as U8).
const char* dtype_name(DType t);
// True for I8 and U4.
inline bool is_quantized(DType t) { return t == DType::I8 || t == DType::U4; }

namespace ops {
// IEEE half <-> float, round to nearest even; inf/nan/subnormals handled exactly.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// bfloat16 <-> float, round to nearest even (nan stays nan).
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
}  // namespace ops
}  // namespace tinyloop
