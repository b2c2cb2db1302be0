// The activation format of the q8 matmul (ops/matmul_q8act.h has the arithmetic): blocks of 32
// columns quantized to int8 as ggml's x86 backend does. Inline and in the bottom layer so the
// scalar reference (src/ops) and the SIMD kernels (src/cpu) quantize with the same code.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include <stdexcept>
#include <string>

#include "base/convert_inl.h"
#include "base/views.h"
#include "base/weight_quant_inl.h"

namespace tinyloop::ops {

constexpr int64_t kQ8Block = 32;  // columns per activation block (ggml QK8_0 / QK8_1)

// The q8 path applies: an int8 / int4 weight whose group is a multiple of 32 (so a block
// of activations never spans two weight groups). Other weights always take the exact path.
inline bool q8act_applies(const WeightView& w) {
  return (w.dtype == DType::I8 || w.dtype == DType::U4) && w.group > 0 && w.group % kQ8Block == 0 &&
         w.cols % w.group == 0;
}

// The guard of every q8 matmul (the reference and each kernel): w is an int8 / int4 weight the
// q8 path applies to, with a consistent layout. Throws std::invalid_argument naming the problem.
inline void require_q8act(const WeightView& w) {
  if (!q8act_applies(w))
    throw std::invalid_argument(
        "q8 activations: need an int8/int4 weight with a group that is a multiple of 32, got group " +
        std::to_string(w.group));
  detail::check_quant_view(w);
}

namespace detail {

// A block's d and s from its max |x| and the integer sum of its q: both rounded through
// fp16, s from the unrounded d (ggml's Q8_1). Every quantizer (this scalar one, the AVX-512
// one of the VNNI kernels) finishes its blocks with this, so their bits agree.
inline void q8_block_scales(float amax, int32_t qsum, float* d, float* s) {
  const float df = amax / 127.f;
  *d = half_to_float(float_to_half(df));
  *s = half_to_float(float_to_half(df * float(qsum)));
}

// 127 / amax, not 1 / d: the x86 path multiplies by this (the generic C one by 1 / d).
// 0 where the quotient overflows (amax == 0, or amax below 127 / FLT_MAX: a block of
// subnormals): the block then quantizes to zeros, as it rounds to under fp16's least d anyway
// (ggml multiplies by inf there, turning every lane to the x86 "integer indefinite").
inline float q8_inverse_scale(float amax) {
  const float id = 127.f / amax;
  return std::isfinite(id) ? id : 0.f;
}

// v = x * q8_inverse_scale(amax) to int32 as cvtps2dq with round-to-nearest-even does it, in
// defined C++. v is either within +-127 (x finite) or inf / NaN (an inf or NaN activation),
// which becomes INT32_MIN, the x86 "integer indefinite". The add-and-subtract of 1.5 * 2^23
// rounds half to even without a libm call on a baseline x86-64 build (no SSE4.1 roundss).
inline int32_t q8_round_like_cvtps(float v) {
  return std::isfinite(v) ? int32_t((v + 12582912.f) - 12582912.f) : INT32_MIN;
}

// One block of 32 activations, as ggml's x86 quantize_row_q8_1 forms it.
//   x [32] in, q [32] out; d, s out (both already rounded through fp16, returned as float).
// q is the low byte of each int32 (as vpmovdb and the AVX2 pack of low bytes keep it) and the
// sum wraps modulo 2^32 (as vpaddd does): only an inf or NaN lane gets there.
inline void quantize_block_q8(const float* x, int8_t* q, float* d, float* s) {
  float amax = 0.f;
  for (int j = 0; j < kQ8Block; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float id = q8_inverse_scale(amax);
  uint32_t sum = 0;
  for (int j = 0; j < kQ8Block; ++j) {
    const int32_t v = q8_round_like_cvtps(x[j] * id);
    q[j] = int8_t(uint8_t(uint32_t(v)));  // the low byte
    sum += uint32_t(v);
  }
  q8_block_scales(amax, int32_t(sum), d, s);
}

// A row x[K] (K a multiple of 32): q [K], d [K / 32], s [K / 32].
inline void quantize_row_q8(const float* x, int64_t K, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < K / kQ8Block; ++b) quantize_block_q8(x + b * kQ8Block, q + b * kQ8Block, d + b, s + b);
}

}  // namespace detail

}  // namespace tinyloop::ops
