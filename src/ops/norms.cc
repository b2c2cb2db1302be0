// RMSNorm and LayerNorm over the last dimension. Statistics are accumulated in float (as
// the PyTorch reference does in fp32), with `omp simd` reductions so they vectorize; the
// statistics of a row are complete before any element of it is written, so y may be x.
#include <cmath>

#include "ops/reference.h"

namespace tinyloop::ops::ref {

// x [T, D], w [D], y [T, D] (y == x allowed).
void rmsnorm(const float* x, int64_t T, int64_t D, const float* w, float eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * D;  // [D]
    float* yr = y + t * D;  // [D]
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    // HF LlamaRMSNorm order: (x * rsqrt(mean + eps)) * w.
    const float inv = 1.f / std::sqrt(ss / float(D) + eps);
    // Elementwise with y[i] written only after x[i] is read: exact aliasing is safe, and
    // there is no dependence between iterations for the pragma to break.
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) yr[i] = (xr[i] * inv) * w[i];
  }
}

// x [T, D], w [D], b [D] or null, y [T, D] (y == x allowed).
void layernorm(const float* x, int64_t T, int64_t D, const float* w, const float* b, float eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * D;  // [D]
    float* yr = y + t * D;  // [D]
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < D; ++i) s += xr[i];
    const float mean = s / float(D);
    // Two passes (mean, then squared deviations) rather than E[x^2] - mean^2, which
    // cancels catastrophically when |mean| >> std.
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (int64_t i = 0; i < D; ++i) {
      const float d = xr[i] - mean;
      v += d * d;
    }
    const float inv = 1.f / std::sqrt(v / float(D) + eps);  // biased variance, as PyTorch
    if (b) {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) yr[i] = (xr[i] - mean) * inv * w[i];
    }
  }
}

}  // namespace tinyloop::ops::ref
