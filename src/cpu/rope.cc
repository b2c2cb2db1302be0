// SIMD rotary position embedding, exactly the contract and the bits of ops::ref::rope
// (ops/rope.cc): the angle of pair i at position p is theta^(-2i/head_dim) * p in double,
// its cos / sin rounded to float once, and each pair rotated as the reference does,
//   x1' = x1 * c - x2 * s,   x2' = x2 * c + x1 * s
// in float, two products and one add per element, never fused (this file is compiled with
// -ffp-contract=off, so the compiler does not turn a product and an add into an FMA either).
// So the output is bit-identical to the reference on every target.
//
// The cos / sin rows are what costs (the reference spends pow + cos + sin per pair per call,
// and a step ropes q and k of every layer application at the same positions; store-h slots
// re-rope their whole window every step). They are kept per thread in a direct-mapped cache
// of kRopeSlots positions, tagged by position, for one (theta, head_dim) at a time: a row is
// the same function of its position whether it was cached or not, so cached and uncached
// calls give the same bits.
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rotates the n_heads heads of one row by the angles of one position.
//   x  [n_heads, hd] in place
//   cs [2, hd / 2] cos then sin of the position's angles
//   ex [2, hd] scratch (interleaved layout only)
void RotateRow(float* HWY_RESTRICT x, int64_t n_heads, int64_t hd, const float* HWY_RESTRICT cs, bool interleaved,
               float* HWY_RESTRICT ex) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t half = hd / 2;
  const float* c = cs;  // [half]
  const float* s = cs + half;  // [half]
  if (!interleaved) {
    // HF rotate_half: pairs (i, i + half), both halves contiguous.
    for (int64_t h = 0; h < n_heads; ++h) {
      float* x1 = x + h * hd;  // [half]
      float* x2 = x1 + half;  // [half]
      int64_t i = 0;
      for (; i + L <= half; i += L) {
        const V a = hn::LoadU(df, x1 + i), b = hn::LoadU(df, x2 + i);
        const V cv = hn::LoadU(df, c + i), sv = hn::LoadU(df, s + i);
        hn::StoreU(hn::Sub(hn::Mul(a, cv), hn::Mul(b, sv)), df, x1 + i);
        hn::StoreU(hn::Add(hn::Mul(b, cv), hn::Mul(a, sv)), df, x2 + i);
      }
      for (; i < half; ++i) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
    return;
  }
  // Interleaved: pairs (2i, 2i + 1). With cc = [c0 c0 c1 c1 ..], ss = [-s0 s0 -s1 s1 ..] and
  // the pair-swapped row w = [x1 x0 x3 x2 ..]: x * cc + w * ss gives x0 c0 + x1 (-s0) (the
  // same value as x0 c0 - x1 s0: negation is exact) and x1 c0 + x0 s0, the reference's sums.
  int64_t j0 = 0;  // elements before j0 go through vectors
#if HWY_TARGET != HWY_SCALAR
  float* cc = ex;  // [hd]
  float* ss = ex + hd;  // [hd]
  for (int64_t i = 0; i < half; ++i) {
    cc[2 * i] = cc[2 * i + 1] = c[i];
    ss[2 * i] = -s[i];
    ss[2 * i + 1] = s[i];
  }
  j0 = hd / L * L;  // L is even, so whole pairs
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * hd;  // [hd]
    for (int64_t j = 0; j < j0; j += L) {
      const V v = hn::LoadU(df, xh + j);
      const V w = hn::Shuffle2301(v);  // swaps the two lanes of every pair
      hn::StoreU(hn::Add(hn::Mul(v, hn::LoadU(df, cc + j)), hn::Mul(w, hn::LoadU(df, ss + j))), df, xh + j);
    }
  }
#else
  (void)ex;
  (void)L;
#endif
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * hd;  // [hd]
    for (int64_t i = j0 / 2; i < half; ++i) {
      const float a = xh[2 * i], b = xh[2 * i + 1];
      xh[2 * i] = a * c[i] - b * s[i];
      xh[2 * i + 1] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(RotateRow);

namespace {

// Positions whose cos / sin rows a thread keeps (direct-mapped by position % kRopeSlots):
// a whole prompt or context of up to this many positions stays cached from one layer
// application to the next. 1 MiB at head_dim 64.
constexpr int64_t kRopeSlots = 4096;

struct RopeCache {
  uint32_t theta_bits = 0;
  int64_t hd = -1;
  std::vector<double> inv_freq;  // [hd / 2] theta^(-2i/hd), as the reference computes it
  std::vector<int64_t> tag;  // [kRopeSlots] position held by each slot (or none)
  std::vector<float> cs;  // [kRopeSlots, 2, hd / 2] cos then sin
  std::vector<float> ex;  // [2, hd] RotateRow scratch
};

// The cache, (re)keyed to theta and hd.
RopeCache& cache_for(float theta, int64_t hd) {
  thread_local RopeCache rc;
  uint32_t bits;
  std::memcpy(&bits, &theta, sizeof(bits));
  if (rc.hd != hd || rc.theta_bits != bits) {
    const int64_t half = hd / 2;
    rc.theta_bits = bits;
    rc.hd = hd;
    rc.inv_freq.resize(size_t(half));
    for (int64_t i = 0; i < half; ++i) rc.inv_freq[size_t(i)] = std::pow(double(theta), -2.0 * double(i) / double(hd));
    rc.tag.assign(size_t(kRopeSlots), std::numeric_limits<int64_t>::min());
    rc.cs.resize(size_t(kRopeSlots * hd));
    rc.ex.resize(size_t(2 * hd));
  }
  return rc;
}

// [2, hd / 2] cos then sin of position p's angles: exactly the reference's
// float(cos(theta^(-2i/hd) * p)) and float(sin(...)), computed in double.
const float* cos_sin_row(RopeCache& rc, int64_t p) {
  const int64_t half = rc.hd / 2;
  const int64_t slot = ((p % kRopeSlots) + kRopeSlots) % kRopeSlots;
  float* row = rc.cs.data() + slot * rc.hd;  // [2, half]
  if (rc.tag[size_t(slot)] != p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = rc.inv_freq[size_t(i)] * double(p);
      row[i] = float(std::cos(a));
      row[half + i] = float(std::sin(a));
    }
    rc.tag[size_t(slot)] = p;
  }
  return row;
}

}  // namespace

// x [T, n_heads, head_dim] (in place), pos [T].
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos, float theta,
          ops::RopeLayout layout) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    throw std::invalid_argument("rope: head_dim must be even and positive, got " + std::to_string(head_dim));
  RopeCache& rc = cache_for(theta, head_dim);
  const auto rotate = HWY_DYNAMIC_DISPATCH(RotateRow);
  const bool interleaved = layout == ops::RopeLayout::Interleaved;
  for (int64_t t = 0; t < T; ++t)
    rotate(x + t * n_heads * head_dim, n_heads, head_dim, cos_sin_row(rc, pos[t]), interleaved, rc.ex.data());
}

}  // namespace tinyloop::cpu
#endif
