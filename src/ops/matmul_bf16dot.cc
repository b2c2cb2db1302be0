// Packing and rounding for the reduced-precision matmul, and its scalar reference
// (ops/matmul_bf16dot.h has the spec). The reference is the spec's loop, run for the 64
// columns of a panel side by side (independent lanes, so GCC vectorizes it without
// reordering any element's sum).
#include "ops/matmul_bf16dot.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/convert_inl.h"

namespace tinyloop::ops {

void pack_bf16dot(const WeightView& w, uint32_t* out) {
  const int64_t N = w.rows, K = w.cols, K2 = (K + 1) / 2;
  if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16)
    throw std::invalid_argument(std::string("bf16 dot-product copy: needs an F32, F16 or BF16 weight, got ") +
                                dtype_name(w.dtype));
  if (N <= 0 || K <= 0 || !w.data)
    throw std::invalid_argument("bf16 dot-product copy: empty weight [" + std::to_string(N) + ", " + std::to_string(K) +
                                "]");
  std::vector<float> row(size_t(K + 1), 0.f);  // [K + 1] one weight row in float, zero-padded
  std::vector<uint16_t> rb(size_t(K + 1), 0);  // [K + 1] the same, rounded
  const int64_t P = (N + kBf16DotPanel - 1) / kBf16DotPanel;
  for (int64_t n = 0; n < P * kBf16DotPanel; ++n) {
    const int64_t p = n / kBf16DotPanel, c = n % kBf16DotPanel;
    uint32_t* dst = out + p * K2 * kBf16DotPanel + c;  // stride kBf16DotPanel, K2 pairs
    if (n >= N) {
      for (int64_t i = 0; i < K2; ++i) dst[i * kBf16DotPanel] = 0;
      continue;
    }
    weight_row_to_f32(w, n, row.data());
    for (int64_t k = 0; k < K; ++k) rb[size_t(k)] = round_bf16_ftz(row[size_t(k)]);
    for (int64_t i = 0; i < K2; ++i)
      dst[i * kBf16DotPanel] = uint32_t(rb[size_t(2 * i)]) | uint32_t(rb[size_t(2 * i + 1)]) << 16;
  }
}

namespace ref {
namespace {

// What both references share: x [T, K] rounded and paired one row at a time, each 64-column
// panel of w.bf16dot [P, K2, 64] given to panel_dot(xp [K2], panel [K2, 64], K2, acc [64]),
// which adds the row's dot products into acc (zeroed), then the bias; y [T, N].
template <typename PanelDot>
void matmul_bf16dot_by_panel(const float* x, int64_t T, const WeightView& w, const float* bias, float* y,
                             PanelDot panel_dot) {
  if (!w.bf16dot) throw std::invalid_argument("matmul_bf16dot: the weight view has no bf16 copy");
  const int64_t N = w.rows, K = w.cols, K2 = (K + 1) / 2;
  if (T <= 0 || N <= 0) return;
  constexpr int64_t C = kBf16DotPanel;
  std::vector<uint32_t> xp(size_t(K2 > 0 ? K2 : 1));  // [K2] one row of x, rounded and paired
  for (int64_t t = 0; t < T; ++t) {
    round_rows_bf16dot(x + t * K, 1, K, xp.data());
    for (int64_t n0 = 0; n0 < N; n0 += C) {
      const uint32_t* panel = w.bf16dot + n0 / C * K2 * C;  // [K2, C]
      float acc[C] = {};
      panel_dot(xp.data(), panel, K2, acc);
      float* yr = y + t * N + n0;  // [min(C, N - n0)]
      for (int64_t c = 0; c < C && n0 + c < N; ++c) yr[c] = bias ? acc[c] + bias[n0 + c] : acc[c];
    }
  }
}

}  // namespace

// x [T, K], w.bf16dot [P, K2, 64], bias [N] or null, y [T, N].
void matmul_bf16dot(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  constexpr int64_t C = kBf16DotPanel;
  matmul_bf16dot_by_panel(x, T, w, bias, y, [](const uint32_t* xp, const uint32_t* panel, int64_t K2, float* acc) {
    for (int64_t i = 0; i < K2; ++i) {
      const float xe = detail::bf16_to_float(uint16_t(xp[i]));
      const float xo = detail::bf16_to_float(uint16_t(xp[i] >> 16));
      const uint32_t* wp = panel + i * C;  // [C] pairs of step i
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float we = detail::bf16_to_float(uint16_t(wp[c]));
        const float wo = detail::bf16_to_float(uint16_t(wp[c] >> 16));
        acc[c] = acc[c] + xo * wo;
        acc[c] = acc[c] + xe * we;
      }
    }
  });
}

// x [T, K], w.bf16dot [P, K2, 64], bias [N] or null, y [T, N]. The AMX chain (header).
void matmul_bf16dot_amx(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  constexpr int64_t C = kBf16DotPanel, B = kBf16DotAmxPairs;
  matmul_bf16dot_by_panel(x, T, w, bias, y, [](const uint32_t* xp, const uint32_t* panel, int64_t K2, float* acc) {
    for (int64_t i0 = 0; i0 < K2; i0 += B) {
      float e[C] = {}, o[C] = {};  // the even and the odd chain of one 16-pair block
      for (int64_t i = i0; i < std::min(i0 + B, K2); ++i) {
        const float xe = detail::bf16_to_float(uint16_t(xp[i]));
        const float xo = detail::bf16_to_float(uint16_t(xp[i] >> 16));
        const uint32_t* wp = panel + i * C;  // [C] pairs of step i
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          e[c] = e[c] + xe * detail::bf16_to_float(uint16_t(wp[c]));
          o[c] = o[c] + xo * detail::bf16_to_float(uint16_t(wp[c] >> 16));
        }
      }
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) acc[c] = acc[c] + (e[c] + o[c]);
    }
  });
}

}  // namespace ref
}  // namespace tinyloop::ops
