// The two implementations behind cpu::matmul_q8act (same contract, ops/matmul_q8act.h has the
// math): the portable Highway kernel (matmul_q8act.cc, int8 widened to int16 + pmaddwd) and
// the AVX512-VNNI one (matmul_q8act_vnni.cc, vpdpbusd on the int8 / int4 bytes directly).
// cpu::matmul_q8act picks VNNI when the CPU has it and TINYLOOP_DISABLE_VNNI is unset; the
// tests call both directly.
#pragma once
#include <cstdint>

#include "base/views.h"

namespace tinyloop::cpu::detail {

// x [T, K], w [N, K] (ops::q8act_applies), bias [N] or null, y [T, N].
void matmul_q8act_hwy(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

// True when this CPU (and OS) runs AVX512 F/BW/VL + VNNI and the kernel was compiled (x86-64).
bool vnni_supported();

// The VNNI kernel; call only when vnni_supported(). Same contract as matmul_q8act_hwy.
void matmul_q8act_vnni(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

// Where quantize_row_q8_avx512 puts a row's int8 values: Natural = column order; the unit
// layouts are matmul_q8act_vnni's (128 columns = 4 blocks a unit, see its file comment).
enum class Q8RowLayout { Natural, UnitInt8, UnitInt4 };

// One x row x [K] (K a multiple of 32) quantized bit for bit as ops::detail::quantize_row_q8
// does, with AVX-512: out [K] int8 (unit layouts: [ceil(K / 128) * 128], zeroed by the
// caller), amax [K / 32] the block maxima and qsum [K / 32] the integer block sums (the
// caller forms d = fp16(amax / 127) and s = fp16(d_f32 * qsum) in plain code, as the
// reference). UnitInt8 also writes corr [ceil(K / 128) * 16]. Call only when vnni_supported().
void quantize_row_q8_avx512(const float* x, int64_t K, Q8RowLayout layout, int8_t* out, float* amax, int32_t* qsum,
                            int32_t* corr);

}  // namespace tinyloop::cpu::detail
