// AMX detection and the Linux permission request (cpu/amx.h).
#include "cpu/amx.h"

#include <atomic>
#include <mutex>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TINYLOOP_AMX_DETECT 1
#endif

namespace tinyloop::cpu {
namespace {

#ifdef TINYLOOP_AMX_DETECT
constexpr int kArchGetXcompPerm = 0x1022;  // arch_prctl codes (asm/prctl.h, Linux >= 5.16)
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;  // XCR0 / XSAVE component of the tile registers

// XCR0 (the OS-enabled XSAVE state), read with xgetbv; 0 when OSXSAVE is off.
uint64_t read_xcr0() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return uint64_t(hi) << 32 | lo;
}

AmxStatus detect() {
  AmxStatus s;
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    s.reason = "no AMX on this CPU (no CPUID leaf 7)";
    return s;
  }
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22), int8 = d & (1u << 25);
  if (!tile) {
    s.reason = "no AMX on this CPU";
    return s;
  }
  const uint64_t xcr0 = read_xcr0();
  if ((xcr0 & (3ull << 17)) != (3ull << 17)) {
    s.reason = "the OS has not enabled the AMX tile state (XCR0 bits 17/18 clear)";
    return s;
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    s.reason = std::string("kernel refused XTILEDATA (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) + ")";
    return s;
  }
  unsigned long perm = 0;  // the granted XSAVE components, as a bit mask
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &perm) != 0 || !(perm & (1ul << kXfeatureXtiledata))) {
    s.reason = "kernel refused XTILEDATA (not in ARCH_GET_XCOMP_PERM)";
    return s;
  }
  s.tile = true;
  s.bf16 = bf16;
  s.int8 = int8;
  if (!bf16) s.reason = "AMX-TILE without AMX-BF16 on this CPU";
  return s;
}
#else
AmxStatus detect() {
  AmxStatus s;
  s.reason = "no AMX in this build (x86-64 Linux with GCC or Clang only)";
  return s;
}
#endif

// On unless set_amx_enabled(false) (ops/backend.h applies TINYLOOP_DISABLE_AMX through it).
std::atomic<bool> g_enabled{true};
std::mutex g_reason_mutex;
std::string g_off_reason = "disabled by set_amx_enabled(false)";  // guarded by g_reason_mutex

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace

const AmxStatus& amx_status() {
  static const AmxStatus s = detect();  // once per process (thread-safe static init)
  return s;
}

bool amx_bf16_active() { return enabled() && amx_status().bf16; }

bool amx_int8_active() { return enabled() && amx_status().int8; }

void set_amx_enabled(bool on, const std::string& off_reason) {
  {
    std::lock_guard<std::mutex> lock(g_reason_mutex);
    g_off_reason = off_reason;
  }
  g_enabled.store(on);
}

std::string amx_inactive_reason() {
  if (!amx_status().bf16) return amx_status().reason.empty() ? "no AMX-BF16" : amx_status().reason;
  if (enabled()) return "";
  std::lock_guard<std::mutex> lock(g_reason_mutex);
  return g_off_reason;
}

}  // namespace tinyloop::cpu
