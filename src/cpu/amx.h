// Intel AMX (Advanced Matrix Extensions) on this CPU and in this process: detection, the
// Linux permission request, and the AMX-BF16 matmul of the reduced-precision loop body
// (the AMX-INT8 q8-activation kernel is matmul_amx_int8.cc, behind cpu::matmul_q8act).
//
// AMX is usable when (1) CPUID reports AMX-TILE and AMX-BF16 (AMX-INT8 is reported
// separately), (2) the OS enabled the tile state in XCR0 (XTILECFG, bit 17, and XTILEDATA,
// bit 18), and (3) Linux granted this process XTILEDATA: since kernel 5.16 a process must ask
// once, arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), before any thread touches a
// tile register, or the first tile instruction kills it with SIGILL. amx_status() does all
// three on its first call (a function-local static: once per process, thread-safe); the
// permission covers every thread of the process, current and future. Each thread still
// loads its own tile configuration (ldtilecfg) before using tiles: the kernels do it at the
// start of every task and release the tiles (tilerelease) at its end, so a thread that other
// code in the process (oneDNN, PyTorch) also runs AMX on never sees a stale shape.
#pragma once
#include <cstdint>
#include <string>

#include "base/views.h"

namespace tinyloop::cpu {

struct AmxStatus {
  bool tile = false;  // AMX-TILE on the CPU and the permission granted: tiles usable
  bool bf16 = false;  // tile && AMX-BF16 (TDPBF16PS)
  bool int8 = false;  // tile && AMX-INT8 (TDPBSSD/TDPBUSD/...)
  std::string reason;  // empty when tile; else why not, e.g. "no AMX on this CPU"
};

// The hardware and OS answer, computed (and the permission requested) on the first call.
const AmxStatus& amx_status();

// true when the bf16 matmul uses AMX now: amx_status().bf16 and not turned off by
// set_amx_enabled(false) (ops/backend.h calls it for TINYLOOP_DISABLE_AMX=1).
bool amx_bf16_active();
// true when the q8-activation matmul may use AMX-INT8 tiles now (matmul_amx_int8.cc):
// amx_status().int8 and not turned off by set_amx_enabled(false).
bool amx_int8_active();
// Turns AMX off or back on for this process (tests, benchmarks A/B in one run); it can only
// turn it on where amx_status() allows it. off_reason is what amx_inactive_reason() says
// while it is off.
void set_amx_enabled(bool on, const std::string& off_reason = "disabled by set_amx_enabled(false)");
// "" when AMX is active, else the reason it is not (the off_reason of set_amx_enabled, e.g.
// "disabled by TINYLOOP_DISABLE_AMX", or amx_status().reason).
std::string amx_inactive_reason();

// The AMX-BF16 matmul: y[T, N] = bf16(x)[T, K] @ Wb^T (+ bias) on the packed copy w.bf16dot
// (ops/matmul_bf16dot.h: its panels are TDPBF16PS "B" tiles as they are), with the AMX
// chain of ops::ref::matmul_bf16dot_amx (not vdpbf16ps's chain: see that header). Any
// T >= 1, N, K (T = 1: the same chain on AVX-512 vectors, faster for one row); panels of 64
// columns split across the pool. Throws std::logic_error when
// amx_status().bf16 is false, std::invalid_argument when w.bf16dot is null.
void matmul_bf16dot_amx(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y);

}  // namespace tinyloop::cpu
