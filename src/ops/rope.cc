// Rotary position embedding, in place. The angle of pair i at position p is
// p * theta^(-2i/head_dim), computed in double (so large positions keep their precision)
// and its cos/sin rounded to float once; the rotation itself is float.
#include <cassert>
#include <cmath>
#include <vector>

#include "ops/reference.h"

namespace tinyloop::ops::ref {

// x [T, n_heads, head_dim] (in place), pos [T].
void rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const int64_t* pos, float theta, RopeLayout layout) {
  assert(head_dim % 2 == 0);
  const int64_t half = head_dim / 2;
  // cos/sin of one position, shared by all heads of that row.
  std::vector<float> cs(size_t(2 * half));  // [2, half]: cos then sin
  float* c = cs.data();
  float* s = cs.data() + half;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = std::pow(double(theta), -2.0 * double(i) / double(head_dim)) * double(pos[t]);
      c[i] = float(std::cos(a));
      s[i] = float(std::sin(a));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + (t * n_heads + h) * head_dim;  // [head_dim]
      if (layout == RopeLayout::Half) {
        // HF rotate_half: out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin.
        float* x1 = xh;  // [half]
        float* x2 = xh + half;  // [half]
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * c[i] - b * s[i];
          x2[i] = b * c[i] + a * s[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float a = xh[2 * i], b = xh[2 * i + 1];
          xh[2 * i] = a * c[i] - b * s[i];
          xh[2 * i + 1] = b * c[i] + a * s[i];
        }
      }
    }
  }
}

}  // namespace tinyloop::ops::ref
