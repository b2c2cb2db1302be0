// The CPU backend's settings, information and weight copies (ops/backend.h). The only place in
// the project that reads the backend's environment variables.
#include "ops/backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/machine_probe.h"
#include "cpu/thread_pool.h"
#include "ops/matmul_bf16dot.h"
#include "ops/matmul_q8act.h"
#include "ops/ops.h"

namespace tinyloop::ops {
namespace {

// A switch variable is on when set to anything but "" or "0".
bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// -1 until the defaults are applied, then 0 (the CPU kernels) or 1 (the scalar reference).
std::atomic<int> g_force_scalar{-1};

void set_threads(int n) {
  if (n < 1) n = backend_settings_from_env().num_threads.value_or(0);  // < 1: hardware concurrency
  cpu::set_num_threads(n);
}

void apply(const BackendSettings& s, const char* amx_off_reason) {
  if (s.force_scalar) g_force_scalar.store(*s.force_scalar ? 1 : 0);
  if (s.num_threads) set_threads(*s.num_threads);
  if (s.amx) cpu::set_amx_enabled(*s.amx, amx_off_reason);
  if (s.vnni) cpu::set_vnni_enabled(*s.vnni);
}

// Packs each view of `todo` with pack(view, dst) into one huge-page arena, size_of(view)
// bytes each (rounded up to 64), and lets set(view, dst) point the view at its copy.
template <class SizeOf, class Pack, class Set>
WeightCopies pack_copies(const std::vector<WeightView*>& todo, SizeOf size_of, Pack pack, Set set) {
  constexpr int64_t kAlign = 64;  // one vector, one cache line
  auto padded = [&](const WeightView* v) { return (size_of(*v) + kAlign - 1) / kAlign * kAlign; };
  int64_t total = 0;
  for (const WeightView* v : todo) total += padded(v);
  WeightCopies c;
  if (total == 0) return c;
  c.arena = alloc_huge_pages(size_t(total));
  uint8_t* next = c.arena.get();
  for (WeightView* v : todo) {
    pack(*v, next);
    set(*v, next);
    c.bytes += size_of(*v);
    next += padded(v);
  }
  return c;
}

}  // namespace

// The environment's defaults, once per process, before any kernel or setting is touched.
void ensure_backend_defaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    BackendSettings s = backend_settings_from_env();
    s.force_scalar = s.force_scalar.value_or(false);
    apply(s, "disabled by TINYLOOP_DISABLE_AMX");
  });
}

BackendSettings backend_settings_from_env() {
  BackendSettings s;
  if (const char* env = std::getenv("TINYLOOP_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) s.num_threads = int(std::min(v, 1024L));
  }
  if (env_on("TINYLOOP_FORCE_SCALAR")) s.force_scalar = true;
  if (env_on("TINYLOOP_DISABLE_AMX")) s.amx = false;
  if (env_on("TINYLOOP_DISABLE_VNNI")) s.vnni = false;
  return s;
}

void configure_backend(const BackendSettings& s) {
  ensure_backend_defaults();
  apply(s, "disabled by set_amx_enabled(false)");
}

void set_force_scalar(bool on) {
  BackendSettings s;
  s.force_scalar = on;
  configure_backend(s);
}

bool force_scalar() {
  int v = g_force_scalar.load(std::memory_order_relaxed);
  if (v < 0) {
    ensure_backend_defaults();
    v = g_force_scalar.load();
  }
  return v == 1;
}

int num_threads() {
  ensure_backend_defaults();
  return cpu::num_threads();
}

bool q8act_is_fast() {
  ensure_backend_defaults();
  return cpu::q8act_packed_available();
}

BackendInfo backend_info() {
  ensure_backend_defaults();
  BackendInfo i;
  i.simd_target = cpu::simd_target_name();
  i.compiled_targets = cpu::compiled_target_names();
  i.force_scalar = force_scalar();
  i.num_threads = cpu::num_threads();
  i.q8_kernel = cpu::q8act_kernel_name();
  i.bf16_kernel = cpu::bf16dot_kernel_name();
  i.amx = cpu::amx_bf16_active();
  i.amx_reason = cpu::amx_inactive_reason();
  return i;
}

MachineBounds probe_machine(int threads, int64_t read_bytes, int reps) {
  const cpu::MachineBounds b = cpu::probe_machine(threads, read_bytes, reps);
  return {b.threads, b.read_gbps, b.fma_gflops, b.simd_target};
}

WeightCopies make_bf16dot_copies(const std::vector<WeightView*>& views) {
  ensure_backend_defaults();
  std::vector<WeightView*> todo(views);
  std::erase_if(todo, [](const WeightView* v) {
    return !v->data || (v->dtype != DType::F32 && v->dtype != DType::F16 && v->dtype != DType::BF16);
  });
  return pack_copies(
      todo, [](const WeightView& v) { return bf16dot_packed_words(v.rows, v.cols) * int64_t(sizeof(uint32_t)); },
      [](const WeightView& v, uint8_t* dst) { pack_bf16dot(v, reinterpret_cast<uint32_t*>(dst)); },
      [](WeightView& v, uint8_t* dst) { v.bf16dot = reinterpret_cast<const uint32_t*>(dst); });
}

WeightCopies make_q8act_copies(const std::vector<WeightView*>& views) {
  ensure_backend_defaults();
  std::vector<WeightView*> todo(views);
  std::erase_if(todo, [](const WeightView* v) { return !v->data || !v->q8act || q8act_packed_bytes(*v) == 0; });
  return pack_copies(
      todo, [](const WeightView& v) { return q8act_packed_bytes(v); },
      [](const WeightView& v, uint8_t* dst) { pack_q8act(v, dst); },
      [](WeightView& v, uint8_t* dst) { v.q8packed = dst; });
}

}  // namespace tinyloop::ops
