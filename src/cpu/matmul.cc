// The matmul driver: picks the kernel for the weight dtype (and, through Highway, for the
// CPU), splits the output features N into tasks and runs them on the thread pool.
//
// Splitting N (never K, never T) keeps every output element inside one task computed by one
// kernel call: threads change which core computes a column, not how (batch invariance and
// run-to-run determinism whatever the thread count).
#include <algorithm>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/matmul_internal.h"
#include "cpu/matmul_split.h"
#include "base/weight_quant_inl.h"

namespace tinyloop::cpu {
namespace {

detail::MatmulRangeFn kernel_for(DType t) {
  switch (t) {
    case DType::F16: return detail::matmul_range_f16();
    case DType::BF16: return detail::matmul_range_bf16();
    case DType::I8: return detail::matmul_range_i8();
    case DType::U4: return detail::matmul_range_u4();
    case DType::F32: break;
  }
  return detail::matmul_range_f32();
}

// x [T, K] -> xp [T, Kp] with every block of 2B columns reordered to [its B even columns,
// its B odd columns], zero-padded (Kp = K rounded up to 2B): the column order the int4
// kernels consume the low and high nibbles in (matmul_internal.h).
void permute_for_int4(const float* x, int64_t T, int64_t K, int64_t B, int64_t Kp, float* xp) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * K;  // [K]
    float* out = xp + t * Kp;  // [Kp]
    for (int64_t c0 = 0; c0 < Kp; c0 += 2 * B)
      for (int64_t j = 0; j < B; ++j) {
        const int64_t ke = c0 + 2 * j;  // K is even, so ke < K implies ke + 1 < K
        out[c0 + j] = ke < K ? xr[ke] : 0.f;
        out[c0 + B + j] = ke < K ? xr[ke + 1] : 0.f;
      }
  }
}

}  // namespace

// x [T, K], w [N, K], bias [N] or null, y [T, N].
void matmul(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y) {
  const int64_t N = w.rows, K = w.cols;
  if (T <= 0 || N <= 0) return;
  if (K <= 0) {  // empty sum, as the reference
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) y[t * N + n] = bias ? bias[n] : 0.f;
    return;
  }
  detail::MatmulArgs a{x, T, w.data, N, K, bias, y};
  thread_local std::vector<float> xp;  // [T, Kp] int4: x in the kernels' column order
  if (is_quantized(w.dtype)) {
    ops::detail::check_quant_view(w);
    a.group = w.group;
    a.scale_f16 = w.scale_dtype == DType::F16;
    a.scales = w.scales;
    a.offsets = w.offsets;
    if (w.dtype == DType::U4) {
      const int64_t B = detail::int4_block_bytes();
      const int64_t Kp = (K + 2 * B - 1) / (2 * B) * (2 * B);
      if (xp.size() < size_t(T * Kp)) xp.resize(size_t(T * Kp));
      permute_for_int4(x, T, K, B, Kp, xp.data());
      a.x = xp.data();
      a.ldx = Kp;
    }
  }
  const detail::MatmulRangeFn fn = kernel_for(w.dtype);
  const int64_t rows =
      T <= detail::kFusedMaxRows ? detail::stream_task_rows(N) : detail::tiled_task_rows(K, !is_quantized(w.dtype));
  detail::for_row_chunks(T, N, K, rows, [&](int64_t n0, int64_t n1) { fn(a, n0, n1); });
}

}  // namespace tinyloop::cpu
