// INT8 KV rows: the quantizer, shared by the scalar and SIMD paths (the reference attention
// over I8 slots is the one loop of ops/attention.cc with its I8 row loader).
#include "ops/kv_quant.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>

namespace tinyloop::ops {

float quantize_row_i8(const float* x, int64_t n, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax / 127.f;
  // All zero (or NaN), or amax below 127 x the least subnormal (the scale rounds to 0).
  if (!(scale > 0.f)) {
    std::fill(q, q + n, int8_t{0});
    return 0.f;
  }
  // A row of subnormals (amax < 127 / FLT_MAX) overflows 127 / amax to inf, which would turn
  // its zeros into NaN and then -127: it divides by its (subnormal) scale instead.
  const float inv = 127.f / amax;
  const auto store = [&](const auto& scaled) {
    for (int64_t i = 0; i < n; ++i) {
      // Clamp before converting: |scaled| <= 127 up to rounding; NaN and inf*0 end up in range.
      q[i] = static_cast<int8_t>(std::nearbyint(std::min(127.f, std::max(-127.f, scaled(x[i])))));
    }
  };
  if (std::isinf(inv)) store([&](float v) { return v / scale; });
  else store([&](float v) { return v * inv; });
  return scale;
}

void kv_write_i8(const KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T) {
  const int64_t n_kv = dst.n_kv_heads, hd = dst.head_dim;
  const int64_t row = n_kv * hd;  // elements per position
  for (int64_t t = 0; t < T; ++t) {
    assert(pos[t] >= 0);
    int64_t r;
    const KvBlock b = dst.block_of(pos[t] % dst.capacity, &r);
    if (!b.k_scale || !b.v_scale) throw std::logic_error("kv_write: an int8 KV slot needs its scales");
    auto* k = static_cast<int8_t*>(b.k);
    auto* v = static_cast<int8_t*>(b.v);
    for (int64_t g = 0; g < n_kv; ++g) {
      const int64_t src = t * row + g * hd, i = dst.index(r, g);  // i: (row, kv head)
      b.k_scale[i] = quantize_row_i8(k_rows + src, hd, k + i * hd);
      b.v_scale[i] = quantize_row_i8(v_rows + src, hd, v + i * hd);
    }
  }
}

}  // namespace tinyloop::ops

// ---- store-h rows -----------------------------------------------------------------------

#include "base/convert_inl.h"

namespace tinyloop::ops {

int64_t h_row_bytes(KvDType t, int64_t n) {
  switch (t) {
    case KvDType::H16: return 2 * n;
    case KvDType::H8: return n;
    case KvDType::H4: return (n + 1) / 2;
    default: throw std::logic_error("h_row_bytes: not a store-h dtype");
  }
}

int64_t h_row_scales(KvDType t, int64_t n) {
  switch (t) {
    case KvDType::H16: return 0;
    case KvDType::H8: return 1;
    case KvDType::H4: return (n + kH4Group - 1) / kH4Group;
    default: throw std::logic_error("h_row_scales: not a store-h dtype");
  }
}

void h_row_store(KvDType t, const float* x, int64_t n, void* row, float* scales) {
  if (t == KvDType::H16) {
    auto* d = static_cast<uint16_t*>(row);  // [n]
    for (int64_t i = 0; i < n; ++i) d[i] = detail::float_to_half(x[i]);
    return;
  }
  if (t == KvDType::H8) {
    scales[0] = quantize_row_i8(x, n, static_cast<int8_t*>(row));
    return;
  }
  auto* d = static_cast<uint8_t*>(row);  // [ceil(n / 2)]
  std::fill(d, d + (n + 1) / 2, uint8_t{0});
  for (int64_t g0 = 0, gi = 0; g0 < n; g0 += kH4Group, ++gi) {
    const int64_t g1 = std::min(n, g0 + kH4Group);
    float amax = 0.f;
    for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float inv = amax > 0.f ? 7.f / amax : 0.f;
    scales[gi] = amax > 0.f ? amax / 7.f : 0.f;
    for (int64_t i = g0; i < g1; ++i) {
      const float r = std::min(7.f, std::max(-7.f, x[i] * inv));
      const auto q = static_cast<uint8_t>(static_cast<int>(std::nearbyint(r)) + 8);  // 1..15
      d[i / 2] = static_cast<uint8_t>(d[i / 2] | (i % 2 == 0 ? q : q << 4));
    }
  }
}

void h_row_load(KvDType t, const void* row, const float* scales, int64_t n, float* out) {
  if (t == KvDType::H16) {
    detail::half_row_to_float(static_cast<const uint16_t*>(row), n, out);
    return;
  }
  if (t == KvDType::H8) {
    const auto* q = static_cast<const int8_t*>(row);
    for (int64_t i = 0; i < n; ++i) out[i] = float(q[i]) * scales[0];
    return;
  }
  const auto* d = static_cast<const uint8_t*>(row);
  for (int64_t i = 0; i < n; ++i) {
    const int q = (i % 2 == 0 ? d[i / 2] & 0xF : d[i / 2] >> 4) - 8;
    out[i] = float(q) * scales[i / kH4Group];
  }
}

}  // namespace tinyloop::ops
