// Internal to the ops and the CPU kernels (bottom layer, src/base): scalar access to int8 /
// int4 weights (ops::WeightView, docs/model-format.md version 2). Header-only and inline, like convert_inl.h, so the
// scalar reference and the SIMD kernels' scalar edges read scales the same way.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "base/convert_inl.h"
#include "base/views.h"

namespace tinyloop::ops::detail {

// A quantized view's layout is consistent (the loader guarantees it for model weights; this
// guards direct callers): throws std::invalid_argument naming the field.
inline void check_quant_view(const WeightView& w) {
  const bool u4 = w.dtype == DType::U4;
  if (w.group <= 0 || w.cols % w.group != 0)
    throw std::invalid_argument("quantized weight: group " + std::to_string(w.group) + " does not divide cols " +
                                std::to_string(w.cols));
  if (u4 && (w.group % 2 != 0))
    throw std::invalid_argument("int4 weight: group " + std::to_string(w.group) + " is odd");
  if (w.scale_dtype != DType::F32 && w.scale_dtype != DType::F16)
    throw std::invalid_argument("quantized weight: scales must be F32 or F16");
  if (!w.scales || (u4 && !w.offsets))
    throw std::invalid_argument(u4 ? "int4 weight: scales or offsets missing" : "int8 weight: scales missing");
}

// Element i of a scales / offsets array stored as F32 or F16.
inline float quant_param(const void* p, DType t, int64_t i) {
  return t == DType::F16 ? half_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// q of column k of row n (int8: -128..127, int4: 0..15).
inline int32_t quant_q(const WeightView& w, int64_t n, int64_t k) {
  if (w.dtype == DType::I8) return static_cast<const int8_t*>(w.data)[n * w.cols + k];
  const uint8_t b = static_cast<const uint8_t*>(w.data)[n * (w.cols / 2) + k / 2];
  return (k & 1) ? (b >> 4) : (b & 0x0f);
}

// out[K] = row n of a quantized W, dequantized: s * q (+ o), product and sum each rounded
// to float (the definition the Python reference uses too).
inline void dequantize_row(const WeightView& w, int64_t n, float* out) {
  const int64_t K = w.cols, G = w.group, n_groups = K / G;
  for (int64_t g = 0; g < n_groups; ++g) {
    const float s = quant_param(w.scales, w.scale_dtype, n * n_groups + g);
    const float o = w.dtype == DType::U4 ? quant_param(w.offsets, w.scale_dtype, n * n_groups + g) : 0.f;
    for (int64_t k = g * G; k < (g + 1) * G; ++k) {
      const float p = s * float(quant_q(w, n, k));  // rounded once here...
      out[k] = w.dtype == DType::U4 ? p + o : p;  // ...and once more for the offset
    }
  }
}

}  // namespace tinyloop::ops::detail
