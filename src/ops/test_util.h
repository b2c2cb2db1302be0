// Helpers shared by the ops tests: deterministic random data and storing float values as a
// WeightView dtype. Test-only (not part of tinyloop_ops).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ops/ops.h"

namespace tinyloop::ops::testing {

// Unit roundoff of float: the relative error of one correctly rounded float operation.
inline constexpr double kU = 1.0 / (1 << 24);

// A contiguous KV slot over caller-owned buffers: k / v [capacity, n_kv_heads, head_dim] in
// the dtype's width, k_scale / v_scale [capacity, n_kv_heads] (I8 only).
inline KvView contiguous_view(KvDType dtype, void* k, void* v, int64_t capacity, int64_t n_kv_heads, int64_t head_dim,
                              float* k_scale = nullptr, float* v_scale = nullptr) {
  KvView kv;
  kv.dtype = dtype;
  kv.k = k;
  kv.v = v;
  kv.capacity = capacity;
  kv.n_kv_heads = n_kv_heads;
  kv.head_dim = head_dim;
  kv.k_scale = k_scale;
  kv.v_scale = v_scale;
  return kv;
}

// The stored bytes of absolute position p in a K/V slot, whatever its addressing and order
// (KvView::index): K of kv heads 0 .. n_kv - 1, then V, then (I8) the K and V scales.
inline std::vector<uint8_t> position_bytes(const KvView& v, int64_t p) {
  const int64_t elem = v.dtype == KvDType::F32 ? 4 : v.dtype == KvDType::F16 ? 2 : 1, hb = v.head_dim * elem;
  int64_t r;
  const KvBlock b = v.block_of(p % v.capacity, &r);
  std::vector<uint8_t> out;
  for (const void* area : {static_cast<const void*>(b.k), static_cast<const void*>(b.v)})
    for (int64_t g = 0; g < v.n_kv_heads; ++g) {
      const auto* x = static_cast<const uint8_t*>(area) + v.index(r, g) * hb;  // [head_dim] in the dtype
      out.insert(out.end(), x, x + hb);
    }
  if (v.dtype == KvDType::I8)
    for (const float* sc : {b.k_scale, b.v_scale})
      for (int64_t g = 0; g < v.n_kv_heads; ++g) {
        const auto* x = reinterpret_cast<const uint8_t*>(sc + v.index(r, g));
        out.insert(out.end(), x, x + sizeof(float));
      }
  return out;
}

// The rows (and I8 scales) of a contiguous position-major slot, all `capacity` of them,
// copied into head-major blocks of B rows ([n_kv, B, head_dim] values, [n_kv, B] scales:
// the KV cache's order, model/kv_pool.h); `view` reads them (B must divide capacity).
// E > 1: the blocks lie in extents of E ([n_kv, E * B, head_dim], KvView::head_rows), the
// table in extent order in even extents (a head's runs of neighbouring table entries follow
// each other in memory: attention joins them) and pairs within odd ones swapped (they do not).
struct HeadMajorBlocks {
  std::vector<uint8_t> k, v;  // the blocks, back to back
  std::vector<float> ks, vs;  // their scales (I8 only)
  std::vector<KvBlock> table;
  KvView view;
  HeadMajorBlocks(const KvView& src, int64_t B, int64_t E = 1) {
    const int64_t elem = src.dtype == KvDType::F32 ? 4 : src.dtype == KvDType::F16 ? 2 : 1;
    const int64_t n_kv = src.n_kv_heads, hb = src.head_dim * elem, cap = src.capacity, nb = cap / B;
    const int64_t slots = (nb + E - 1) / E * E;  // whole extents
    const bool scaled = src.dtype == KvDType::I8;
    k.resize(size_t(slots * B * n_kv * hb));
    v.resize(k.size());
    ks.resize(scaled ? size_t(slots * B * n_kv) : 0);
    vs.resize(ks.size());
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t p = (b / E) % 2 == 1 && (b ^ 1) / E == b / E && (b ^ 1) < nb ? b ^ 1 : b;  // its place
      const int64_t x = p / E * E * B * n_kv, i = p % E * B;  // its extent's first row, its row in it
      table.push_back({k.data() + (x + i) * hb, v.data() + (x + i) * hb, scaled ? ks.data() + x + i : nullptr,
                       scaled ? vs.data() + x + i : nullptr});
    }
    view = src;
    view.k = view.v = nullptr;
    view.k_scale = view.v_scale = nullptr;
    view.block_rows = B;
    view.blocks = table.data();
    view.head_major = true;
    view.head_rows = E * B;
    for (int64_t r = 0; r < cap; ++r)
      for (int64_t g = 0; g < n_kv; ++g) {
        const KvBlock& b = table[size_t(r / B)];
        const int64_t from = src.index(r, g), to = view.index(r % B, g);
        std::memcpy(static_cast<uint8_t*>(b.k) + to * hb, static_cast<const uint8_t*>(src.k) + from * hb, size_t(hb));
        std::memcpy(static_cast<uint8_t*>(b.v) + to * hb, static_cast<const uint8_t*>(src.v) + from * hb, size_t(hb));
        if (scaled) {
          b.k_scale[to] = src.k_scale[from];
          b.v_scale[to] = src.v_scale[from];
        }
      }
  }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A weight matrix stored in `dtype`, plus its exact decoded values (what the kernel sees),
// which the double-precision oracles use.
struct StoredWeight {
  DType dtype;
  std::vector<float> f32;  // [N, K] when dtype == F32
  std::vector<uint16_t> u16;  // [N, K] when dtype is F16 / BF16
  std::vector<double> decoded;  // [N, K]
  int64_t N = 0, K = 0;
  WeightView view() const {
    WeightView w;
    w.dtype = dtype;
    w.data = dtype == DType::F32 ? static_cast<const void*>(f32.data()) : static_cast<const void*>(u16.data());
    w.rows = N;
    w.cols = K;
    return w;
  }
};

inline StoredWeight store_weight(const std::vector<float>& src, int64_t N, int64_t K, DType dtype) {
  StoredWeight s;
  s.dtype = dtype;
  s.N = N;
  s.K = K;
  s.decoded.resize(src.size());
  if (dtype == DType::F32) {
    s.f32 = src;
    for (size_t i = 0; i < src.size(); ++i) s.decoded[i] = src[i];
  } else {
    s.u16.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      s.u16[i] = dtype == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
      s.decoded[i] = dtype == DType::F16 ? f16_to_f32(s.u16[i]) : bf16_to_f32(s.u16[i]);
    }
  }
  return s;
}

}  // namespace tinyloop::ops::testing
