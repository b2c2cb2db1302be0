// Test-only: float weights stored as int8 / int4 WeightViews (round to nearest; int8
// symmetric, int4 min/max per group, as python/tinyloop/quantize.py), with their exact
// dequantized values (the scalar reference's definition) for the double oracles.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "ops/ops.h"
#include "base/weight_quant_inl.h"

namespace tinyloop::ops::testing {

// A q8-activation matmul test shape: weight dtype (I8 / U4), K, group G, param dtype.
struct Q8Case {
  DType dtype;
  int64_t K, G;
  DType sd;
};

// The shapes the SIMD q8 kernels are checked on: K odd multiples of 32 up to 736 (partial
// 128-column units), groups of 32 and larger, F16 and F32 params, int8 and int4.
inline std::vector<Q8Case> q8_kernel_cases() {
  return {{DType::I8, 32, 32, DType::F32},   {DType::I8, 96, 32, DType::F16},  {DType::I8, 224, 32, DType::F32},
          {DType::I8, 736, 32, DType::F16},  {DType::I8, 192, 64, DType::F16}, {DType::I8, 480, 96, DType::F32},
          {DType::I8, 160, 160, DType::F32}, {DType::U4, 32, 32, DType::F32},  {DType::U4, 96, 32, DType::F16},
          {DType::U4, 224, 32, DType::F16},  {DType::U4, 576, 64, DType::F16}, {DType::U4, 480, 96, DType::F32},
          {DType::U4, 288, 96, DType::F16},  {DType::U4, 160, 160, DType::F32}};
}

struct StoredQuant {
  DType dtype = DType::I8;
  int64_t N = 0, K = 0, G = 0;
  DType scale_dtype = DType::F32;
  std::vector<uint8_t> q;  // I8: [N, K] (int8 bits); U4: [N, K / 2]
  std::vector<float> s32, o32;  // [N, K / G] when F32
  std::vector<uint16_t> s16, o16;  // [N, K / G] when F16
  std::vector<double> decoded;  // [N, K]
  WeightView view() const {
    WeightView w;
    w.dtype = dtype;
    w.data = q.data();
    w.rows = N;
    w.cols = K;
    w.group = G;
    w.scale_dtype = scale_dtype;
    const bool f16 = scale_dtype == DType::F16;
    w.scales = f16 ? static_cast<const void*>(s16.data()) : static_cast<const void*>(s32.data());
    if (dtype == DType::U4)
      w.offsets = f16 ? static_cast<const void*>(o16.data()) : static_cast<const void*>(o32.data());
    return w;
  }
  // Rows [n0, n0 + rows) as their own view (pointers into this storage).
  WeightView rows_view(int64_t n0, int64_t rows) const {
    WeightView w = view();
    const int64_t ng = K / G, ps = scale_dtype == DType::F16 ? 2 : 4;
    w.rows = rows;
    w.data = q.data() + n0 * weight_row_bytes(dtype, K);
    w.scales = static_cast<const char*>(w.scales) + n0 * ng * ps;
    if (w.offsets) w.offsets = static_cast<const char*>(w.offsets) + n0 * ng * ps;
    return w;
  }
};

// Parameter as stored (rounded to F16 when asked), returned as the float the kernel reads.
inline float store_param(float v, DType sd, std::vector<float>& f32, std::vector<uint16_t>& f16) {
  if (sd == DType::F16) {
    f16.push_back(f32_to_f16(v));
    return f16_to_f32(f16.back());
  }
  f32.push_back(v);
  return v;
}

inline StoredQuant store_quant(const std::vector<float>& src, int64_t N, int64_t K, DType dtype, int64_t G,
                               DType scale_dtype = DType::F32) {
  StoredQuant s;
  s.dtype = dtype, s.N = N, s.K = K, s.G = G, s.scale_dtype = scale_dtype;
  const bool u4 = dtype == DType::U4;
  s.q.assign(size_t(u4 ? N * K / 2 : N * K), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < K / G; ++g) {
      const float* w = src.data() + n * K + g * G;  // [G]
      float lo = w[0], hi = w[0], amax = 0.f;
      for (int64_t j = 0; j < G; ++j)
        lo = std::min(lo, w[j]), hi = std::max(hi, w[j]), amax = std::max(amax, std::fabs(w[j]));
      if (!u4) {
        const float sc = store_param(amax / 127.f, scale_dtype, s.s32, s.s16);
        for (int64_t j = 0; j < G; ++j) {
          const float q = sc > 0 ? std::clamp(std::nearbyint(w[j] / sc), -127.f, 127.f) : 0.f;
          s.q[size_t(n * K + g * G + j)] = uint8_t(int8_t(q));
        }
      } else {
        const float sc = store_param((hi - lo) / 15.f, scale_dtype, s.s32, s.s16);
        const float off = store_param(lo, scale_dtype, s.o32, s.o16);
        for (int64_t j = 0; j < G; ++j) {
          const int64_t k = g * G + j;
          const float q = sc > 0 ? std::clamp(std::nearbyint((w[j] - off) / sc), 0.f, 15.f) : 0.f;
          s.q[size_t(n * K / 2 + k / 2)] |= uint8_t(uint8_t(q) << ((k & 1) * 4));
        }
      }
    }
  s.decoded.resize(size_t(N * K));
  std::vector<float> row(static_cast<size_t>(K));
  const WeightView v = s.view();
  for (int64_t n = 0; n < N; ++n) {
    detail::dequantize_row(v, n, row.data());
    for (int64_t k = 0; k < K; ++k) s.decoded[size_t(n * K + k)] = row[size_t(k)];
  }
  return s;
}

// One parameterised case of the quantized matmul tests: weight type, K, group, scale type.
struct QCase {
  DType dtype;
  int64_t K, G;
  DType scale_dtype;
};

inline std::string name_of(const QCase& c) {
  return std::string(dtype_name(c.dtype)) + "_K" + std::to_string(c.K) + "_G" + std::to_string(c.G) + "_" +
         dtype_name(c.scale_dtype);
}

}  // namespace tinyloop::ops::testing
