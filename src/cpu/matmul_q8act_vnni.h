// The two implementations behind cpu::matmul_q8act (same contract, ops/matmul_q8act.h has the
// math): the portable Highway kernel (matmul_q8act.cc, int8 widened to int16 + pmaddwd) and
// the AVX512-VNNI one (matmul_q8act_vnni.cc, vpdpbusd on the int8 / int4 bytes directly).
// cpu::matmul_q8act picks VNNI when the CPU has it and TINYLOOP_DISABLE_VNNI is unset; the
// tests call both directly.
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace tinyloop::cpu::detail {

// x [T, K], w [N, K] (ops::q8act_applies), bias [N] or null, y [T, N].
void matmul_q8act_hwy(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

// True when this CPU (and OS) runs AVX512 F/BW/VL + VNNI and the kernel was compiled (x86-64).
bool vnni_supported();

// The VNNI kernel; call only when vnni_supported(). Same contract as matmul_q8act_hwy.
void matmul_q8act_vnni(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

}  // namespace tinyloop::cpu::detail
