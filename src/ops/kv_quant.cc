// INT8 KV rows: the quantizer (shared by the scalar and SIMD paths) and the scalar reference
// attention over an I8 slot, which is the one reference loop (ops/attention_segments.cc)
// with its I8 row loader: the int8 values are widened and scaled inside the dot products,
// never dequantized into a buffer.
#include "ops/kv_quant.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>

#include "ops/attention_segments.h"

namespace tinyloop::ops {

float quantize_row_i8(const float* x, int64_t n, int8_t* q) {
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0.f)) {  // all zero (or NaN): nothing to scale
    std::fill(q, q + n, int8_t{0});
    return 0.f;
  }
  const float inv = 127.f / amax;
  for (int64_t i = 0; i < n; ++i) {
    // Clamp before converting: |x * inv| <= 127 up to rounding; NaN and inf*0 end up in range.
    const float r = std::min(127.f, std::max(-127.f, x[i] * inv));
    q[i] = static_cast<int8_t>(std::nearbyint(r));
  }
  return amax / 127.f;
}

void kv_write_i8(int8_t* k, int8_t* v, float* k_scale, float* v_scale, int64_t capacity,
                 int64_t n_kv_heads, int64_t head_dim, const float* k_rows, const float* v_rows,
                 const int64_t* pos, int64_t T) {
  if (!k_scale || !v_scale) throw std::logic_error("kv_write: an int8 KV slot needs its scales");
  const int64_t row = n_kv_heads * head_dim;  // elements per position
  for (int64_t t = 0; t < T; ++t) {
    assert(pos[t] >= 0);
    const int64_t r = pos[t] % capacity;
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      const int64_t src = t * row + g * head_dim, dst = r * row + g * head_dim;
      k_scale[r * n_kv_heads + g] = quantize_row_i8(k_rows + src, head_dim, k + dst);
      v_scale[r * n_kv_heads + g] = quantize_row_i8(v_rows + src, head_dim, v + dst);
    }
  }
}

namespace ref {

// q [T, n_heads, head_dim], q_pos [T], k_lo [T], out [T, n_heads, head_dim]. The reference
// loop of ops/attention_segments.cc with split 0; its I8 row loader widens and scales.
void attention_i8(const float* q, int64_t T, int64_t n_heads, const KvView& kv,
                  const int64_t* q_pos, const int64_t* k_lo, float* out) {
  assert(kv.dtype == KvDType::I8 && kv.k_scale && kv.v_scale);
  ref::attention_segments(q, T, n_heads, kv, 0, kv, q_pos, k_lo, out);
}

}  // namespace ref
}  // namespace tinyloop::ops

// ---- store-h rows -----------------------------------------------------------------------

#include "ops/convert_inl.h"

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
