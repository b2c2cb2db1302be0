// Scalar reference matmul: y[T, N] = x[T, K] @ W[N, K]^T (+ bias), W in F32 / F16 / BF16,
// or int8 / int4 (dequantized row by row into the same float block buffer, base/weight_quant_inl.h).
//
// Layout of the loops (outer to inner):
//   1. blocks of x rows small enough to stay in L2 (so a long prefill does not stream all of
//      x from memory once per weight block);
//   2. blocks of weight rows: F16/BF16 rows are decoded to float ONCE per (x block, weight
//      block) into a small buffer that stays in L1, then reused for every x row; F32 rows are
//      used in place;
//   3. a 2 x 4 micro-kernel: 2 rows of x against 4 weight rows, 8 independent float
//      accumulators in one `omp simd` reduction loop, so GCC vectorizes it (reassociation
//      is allowed by the pragma, no -ffast-math) and the adds of different accumulators
//      overlap instead of waiting on one dependency chain.
//
// Determinism: every output element is produced by the same kernel code with its own
// accumulator (ragged edges are padded by repeating a valid row, and the padded results are
// thrown away). So y[t, n] depends only on x[t, :], W[n, :] and K: not on T, N, the
// blocking, or where the row falls in a block. A batched prefill and a one-token decode of
// the same row give bit-identical results.
#include <algorithm>
#include <cstring>
#include <vector>

#include "base/convert_inl.h"
#include "ops/reference.h"
#include "base/weight_quant_inl.h"

namespace tinyloop::ops::ref {
namespace {

constexpr int64_t kMr = 2;  // x rows per micro-kernel
constexpr int64_t kNr = 4;  // weight rows per micro-kernel
constexpr int64_t kWBlockBytes = 16 << 10;  // decoded weight block: half of a 32 KiB L1d
constexpr int64_t kWBlockMaxRows = 64;
constexpr int64_t kXBlockBytes = 256 << 10;  // x rows kept hot in L2 per pass over W

// out[i * kNr + j] = dot(x_i[K], w_j[K]) for i < 2, j < 4.
//   x0, x1      [K]
//   w0 .. w3    [K]
//   out         [kMr * kNr]
// Row pointers may repeat (padding); they are only read.
inline void kernel_2x4(const float* x0, const float* x1, const float* w0, const float* w1, const float* w2,
                       const float* w3, int64_t K, float* out) {
  float a00 = 0.f, a01 = 0.f, a02 = 0.f, a03 = 0.f;
  float a10 = 0.f, a11 = 0.f, a12 = 0.f, a13 = 0.f;
#pragma omp simd reduction(+ : a00, a01, a02, a03, a10, a11, a12, a13)
  for (int64_t k = 0; k < K; ++k) {
    const float u = x0[k], v = x1[k];
    const float b0 = w0[k], b1 = w1[k], b2 = w2[k], b3 = w3[k];
    a00 += u * b0;
    a01 += u * b1;
    a02 += u * b2;
    a03 += u * b3;
    a10 += v * b0;
    a11 += v * b1;
    a12 += v * b2;
    a13 += v * b3;
  }
  out[0] = a00, out[1] = a01, out[2] = a02, out[3] = a03;
  out[4] = a10, out[5] = a11, out[6] = a12, out[7] = a13;
}

// Decode rows [n0, n0 + nb) of a 16-bit or quantized weight into buf[nb, K].
//   buf  [nb, K]
void decode_rows(const WeightView& w, int64_t n0, int64_t nb, float* buf) {
  const int64_t K = w.cols;
  if (is_quantized(w.dtype)) {
    for (int64_t r = 0; r < nb; ++r) detail::dequantize_row(w, n0 + r, buf + r * K);
    return;
  }
  const auto* src = static_cast<const uint16_t*>(w.data) + n0 * K;  // [nb, K]
  if (w.dtype == DType::F16) {
    detail::half_row_to_float(src, nb * K, buf);
  } else {
    detail::bf16_row_to_float(src, nb * K, buf);
  }
}

}  // namespace

// x [T, K], w [N, K], bias [N] or null, y [T, N].
void matmul(const float* x, int64_t T, const WeightView& w, const float* bias, float* y) {
  const int64_t N = w.rows, K = w.cols;
  if (T <= 0 || N <= 0) return;
  if (K <= 0) {  // empty sum
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) y[t * N + n] = bias ? bias[n] : 0.f;
    return;
  }
  if (is_quantized(w.dtype)) detail::check_quant_view(w);

  // Weight rows per block: as many whole micro-kernel groups as fit the L1 budget.
  const int64_t nb_max = std::clamp<int64_t>(kWBlockBytes / (K * 4) / kNr * kNr, kNr, kWBlockMaxRows);
  // x rows per block: fill the L2 budget, at least a few micro-kernel rows.
  const int64_t tb_max = std::max<int64_t>(kXBlockBytes / (K * 4) / kMr * kMr, 8 * kMr);

  const bool f32 = w.dtype == DType::F32;
  std::vector<float> buf(f32 ? 0 : size_t(nb_max * K));  // [nb_max, K] decoded weights
  const float* wf32 = f32 ? static_cast<const float*>(w.data) : nullptr;  // [N, K]

  for (int64_t t0 = 0; t0 < T; t0 += tb_max) {
    const int64_t tb = std::min(tb_max, T - t0);
    for (int64_t n0 = 0; n0 < N; n0 += nb_max) {
      const int64_t nb = std::min(nb_max, N - n0);
      const float* wblk;  // [nb, K]
      if (f32) {
        wblk = wf32 + n0 * K;
      } else {
        decode_rows(w, n0, nb, buf.data());
        wblk = buf.data();
      }
      for (int64_t t = t0; t < t0 + tb; t += kMr) {
        const int64_t mt = std::min(kMr, t0 + tb - t);
        const float* xr0 = x + t * K;
        const float* xr1 = x + (t + mt - 1) * K;  // == xr0 when padding
        for (int64_t j = 0; j < nb; j += kNr) {
          const int64_t mj = std::min(kNr, nb - j);
          const float* wr[kNr];
          for (int64_t q = 0; q < kNr; ++q) wr[q] = wblk + (j + std::min(q, mj - 1)) * K;
          float acc[kMr * kNr];
          kernel_2x4(xr0, xr1, wr[0], wr[1], wr[2], wr[3], K, acc);
          for (int64_t i = 0; i < mt; ++i) {
            float* yr = y + (t + i) * N + n0 + j;  // [mj] of row t+i
            for (int64_t q = 0; q < mj; ++q) yr[q] = bias ? acc[i * kNr + q] + bias[n0 + j + q] : acc[i * kNr + q];
          }
        }
      }
    }
  }
}

// w [N, K], out [K].
void weight_row_to_f32(const WeightView& w, int64_t row, float* out) {
  const int64_t K = w.cols;
  switch (w.dtype) {
    case DType::F32: std::memcpy(out, static_cast<const float*>(w.data) + row * K, size_t(K) * sizeof(float)); return;
    case DType::F16: detail::half_row_to_float(static_cast<const uint16_t*>(w.data) + row * K, K, out); return;
    case DType::BF16: detail::bf16_row_to_float(static_cast<const uint16_t*>(w.data) + row * K, K, out); return;
    case DType::I8:
    case DType::U4: detail::dequantize_row(w, row, out); return;
  }
}

}  // namespace tinyloop::ops::ref
