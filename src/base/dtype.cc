// Element sizes / names and the public scalar conversions (bodies in convert_inl.h, shared
// with the kernels so they inline there).
#include "base/dtype.h"

#include "base/convert_inl.h"

namespace tinyloop {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I8: return 1;
    case DType::U4: return 1;
  }
  return 0;  // not reached for a valid enum value
}

int64_t weight_row_bytes(DType t, int64_t cols) { return t == DType::U4 ? cols / 2 : cols * int64_t(dtype_size(t)); }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I8: return "I8";
    case DType::U4: return "U4";
  }
  return "?";
}

namespace ops {
float f16_to_f32(uint16_t h) { return detail::half_to_float(h); }
uint16_t f32_to_f16(float f) { return detail::float_to_half(f); }
float bf16_to_f32(uint16_t h) { return detail::bf16_to_float(h); }
uint16_t f32_to_bf16(float f) { return detail::float_to_bf16(f); }
}  // namespace ops
}  // namespace tinyloop
