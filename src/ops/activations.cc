// Elementwise activations and the residual add. Plain float math; each element is read
// before its output is written, so the documented aliasing (out == an input) is safe.
#include <cmath>

#include "ops/reference.h"

namespace tinyloop::ops::ref {

// gate [n], up [n], out [n] (out may be gate or up).
void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    // silu(g) = g * sigmoid(g) = g / (1 + e^-g). For very negative g, e^-g overflows to inf
    // and the quotient is -0, the right limit.
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

// x [n], in place.
void gelu(float* x, int64_t n, bool tanh_approx) {
  if (tanh_approx) {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the "gelu_pytorch_tanh" form.
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      x[i] = 0.5f * v * (1.f + std::tanh(k * (v + 0.044715f * v * v * v)));
    }
  } else {
    // Exact form: 0.5 x (1 + erf(x / sqrt(2))).
    const float r = 0.7071067811865476f;  // 1/sqrt(2)
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i];
      x[i] = 0.5f * v * (1.f + std::erf(v * r));
    }
  }
}

// x [n], in place.
void relu_square(float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.f ? x[i] : 0.f;
    x[i] = r * r;
  }
}

// a [n], b [n], y [n] (y may be a or b).
void add(const float* a, const float* b, int64_t n, float* y) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

}  // namespace tinyloop::ops::ref
