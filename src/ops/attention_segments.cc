// Two-segment causal attention (see attention_segments.h): the dispatch, and the scalar
// version (the SIMD one is cpu::attention_segments in src/cpu/attention.cc, which also serves
// one-slot attention).
//
// Why not an online-softmax merge (max/sum per segment, rescaled at the join)? The rescale
// multiplies the first segment's partial sums by exp(m1 - m), which rounds differently from
// computing every weight against the global max, so its outputs would only be close to
// single-segment attention. Here the segment boundary only decides which buffer a row is
// read from: scores of the whole window go into one [group, n] buffer, then the global max,
// the exp-sum and the weighted V are accumulated in position order exactly as the scalar
// reference does. The scratch is the same [group, n] floats the reference uses.
//
// The SIMD side is one routine for one and two slots. The scalar loop below still repeats
// ref::attention's (ops/attention.cc); ref::attention could become this with split = 0 the
// same way, left for when that file is not being changed for the other KV modes.
#include "ops/attention_segments.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cpu/kernels.h"
#include "ops/convert_inl.h"

namespace tinyloop::ops {
namespace {

// The two views of one sequence and where the second begins.
struct Segments {
  const KvView& prefix;
  int64_t split;
  const KvView& tail;
};

// One [head_dim] row of kv head g for absolute position p (K when keys, else V), as float.
// F32 storage returns the stored row; F16 decodes into tmp [head_dim].
const float* seg_row(const Segments& s, bool keys, int64_t p, int64_t g, float* tmp) {
  const KvView& kv = p < s.split ? s.prefix : s.tail;
  const void* base = keys ? kv.k : kv.v;  // [capacity, n_kv_heads, head_dim]
  const int64_t off = ((p % kv.capacity) * kv.n_kv_heads + g) * kv.head_dim;
  if (kv.dtype == KvDType::F32) return static_cast<const float*>(base) + off;
  detail::half_row_to_float(static_cast<const uint16_t*>(base) + off, kv.head_dim, tmp);
  return tmp;
}

// a [n], b [n]; the same reduction as the scalar reference's dot.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void ref::attention_segments(const float* q, int64_t T, int64_t n_heads, const KvView& prefix,
                        int64_t split, const KvView& tail, const int64_t* q_pos,
                        const int64_t* k_lo, float* out) {
  assert(prefix.dtype == tail.dtype && prefix.n_kv_heads == tail.n_kv_heads &&
         prefix.head_dim == tail.head_dim);
  const Segments seg{prefix, split, tail};
  const int64_t hd = tail.head_dim;
  const int64_t n_kv = tail.n_kv_heads;
  assert(n_kv > 0 && n_heads % n_kv == 0);
  const int64_t group = n_heads / n_kv;  // query heads per kv head
  const float scale = float(1.0 / std::sqrt(double(hd)));

  std::vector<float> scores;                               // [group, n] logits, then weights
  std::vector<float> ktmp(static_cast<size_t>(hd));        // [hd] decoded K row (F16)
  std::vector<float> vtmp(static_cast<size_t>(hd));        // [hd] decoded V row (F16)
  std::vector<float> inv_sum(static_cast<size_t>(group));  // [group]

  for (int64_t t = 0; t < T; ++t) {
    const int64_t lo = k_lo[t], hi = q_pos[t];
    const int64_t n = hi - lo + 1;  // window length, across both segments
    if (n <= 0) {
      std::fill(out + t * n_heads * hd, out + (t + 1) * n_heads * hd, 0.f);
      continue;
    }
    // Each segment's part of the window must fit its slot (no wrapped-away rows).
    assert(lo >= 0 && std::min(hi, split - 1) - lo < prefix.capacity);
    assert(hi - std::max(lo, split) < tail.capacity);
    scores.resize(size_t(group * n));

    for (int64_t g = 0; g < n_kv; ++g) {
      const float* qg = q + (t * n_heads + g * group) * hd;  // [group, hd]
      float* og = out + (t * n_heads + g * group) * hd;      // [group, hd]
      for (int64_t p = lo; p <= hi; ++p) {
        const float* kr = seg_row(seg, true, p, g, ktmp.data());  // [hd]
        for (int64_t j = 0; j < group; ++j)
          scores[size_t(j * n + (p - lo))] = dot(qg + j * hd, kr, hd) * scale;
      }
      // Softmax against the max of the whole window (both segments).
      for (int64_t j = 0; j < group; ++j) {
        float* s = scores.data() + j * n;  // [n]
        const float m = *std::max_element(s, s + n);
        float sum = 0.f;
        for (int64_t i = 0; i < n; ++i) {
          s[i] = std::exp(s[i] - m);
          sum += s[i];
        }
        inv_sum[size_t(j)] = 1.f / sum;  // sum >= 1: the max term is exp(0)
      }
      std::fill(og, og + group * hd, 0.f);
      for (int64_t p = lo; p <= hi; ++p) {
        const float* vr = seg_row(seg, false, p, g, vtmp.data());  // [hd]
        for (int64_t j = 0; j < group; ++j) {
          const float wgt = scores[size_t(j * n + (p - lo))];
          float* o = og + j * hd;  // [hd]
#pragma omp simd
          for (int64_t i = 0; i < hd; ++i) o[i] += wgt * vr[i];
        }
      }
      for (int64_t j = 0; j < group; ++j) {
        float* o = og + j * hd;  // [hd]
        const float is = inv_sum[size_t(j)];
#pragma omp simd
        for (int64_t i = 0; i < hd; ++i) o[i] *= is;
      }
    }
  }
}

void attention_segments(const float* q, int64_t T, int64_t n_heads, const KvView& prefix,
                        int64_t split, const KvView& tail, const int64_t* q_pos,
                        const int64_t* k_lo, float* out) {
  assert(prefix.dtype == tail.dtype && prefix.n_kv_heads == tail.n_kv_heads &&
         prefix.head_dim == tail.head_dim);
  // Both versions read F32 and F16 rows only; another storage mode must not be misread.
  if (tail.dtype != KvDType::F32 && tail.dtype != KvDType::F16)
    throw std::invalid_argument("attention_segments (prefix cache): this KV storage mode is not supported yet");
  if (force_scalar())
    return ref::attention_segments(q, T, n_heads, prefix, split, tail, q_pos, k_lo, out);
  cpu::attention_segments(q, T, n_heads, prefix, split, tail, q_pos, k_lo, out);
}

}  // namespace tinyloop::ops
