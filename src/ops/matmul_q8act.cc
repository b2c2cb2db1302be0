// Scalar reference of the q8-activation matmul (ops/matmul_q8act.h has the math). Plain
// loops in the order the formula is written: this is what the SIMD kernel is tested against.
#include "ops/matmul_q8act.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "base/weight_quant_inl.h"

namespace tinyloop::ops::ref {

// x [T, K], w [N, K], bias [N] or null, y [T, N].
void matmul_q8act(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  require_q8act(w);
  const int64_t N = w.rows, K = w.cols, nb = K / kQ8Block, ng = K / w.group;
  const int64_t bpg = w.group / kQ8Block;  // activation blocks per weight group
  std::vector<int8_t> q(static_cast<size_t>(K));  // [K] one quantized x row
  std::vector<float> d(static_cast<size_t>(nb)), s(static_cast<size_t>(nb));  // [K / 32] its scales and sums
  for (int64_t t = 0; t < T; ++t) {
    detail::quantize_row_q8(x + t * K, K, q.data(), d.data(), s.data());
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.f, off = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t g = n * ng + b / bpg;
        int32_t isum = 0;
        for (int64_t j = b * kQ8Block; j < (b + 1) * kQ8Block; ++j)
          isum += detail::quant_q(w, n, j) * int32_t(q[size_t(j)]);
        const float dw = detail::quant_param(w.scales, w.scale_dtype, g);
        acc += (dw * d[size_t(b)]) * float(isum);
        if (w.dtype == DType::U4) off += detail::quant_param(w.offsets, w.scale_dtype, g) * s[size_t(b)];
      }
      const float v = acc + off;
      y[t * N + n] = bias ? v + bias[n] : v;
    }
  }
}

}  // namespace tinyloop::ops::ref
