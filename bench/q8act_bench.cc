// Speed of the q8-activation matmul (ops/matmul_q8act.h) on the benchmark model's shapes:
// the packed AVX512-VNNI kernel, the row-major VNNI kernel, the Highway kernel, the exact
// f32-activation kernel, the packed AVX2 kernel and the packed AMX-INT8 kernel (for every T,
// where the dispatcher starts at amx_int8_min_rows) on the same int8 / int4 weight (G = 32, F16
// scales). They alternate in rounds, best of `reps` each, in one process (the machine is
// shared: compare within a run, and note the load).
//
//   TINYLOOP_NUM_THREADS=1 build/bench/q8act_bench
//   TINYLOOP_Q8_BENCH_ONLY=batch ...   only the cases named so (prefill, decode, batch, smol-pp, smol-tg)
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <vector>

#include "bench_timing.h"
#include "cpu/kernels.h"
#include "cpu/matmul_q8act_packed.h"
#include "cpu/matmul_q8act_vnni.h"
#include "cpu/thread_pool.h"
#include "ops/backend.h"
#include "ops/test_util.h"
#include "ops/weight_quant_test_util.h"

namespace {
using namespace tinyloop;

const char* g_only = nullptr;  // TINYLOOP_Q8_BENCH_ONLY

void q8_case(const char* what, int64_t T, int64_t K, int64_t N, DType dt, int reps) {
  if (g_only && std::strcmp(g_only, what) != 0) return;
  const auto st =
      ops::testing::store_quant(ops::testing::random_floats(size_t(N * K), 1, -0.05f, 0.05f), N, K, dt, 32, DType::F16);
  const ops::WeightView w = st.view();
  const auto x = ops::testing::random_floats(size_t(T * K), 2);  // [T, K]
  std::vector<float> y(size_t(T * N));  // [T, N]
  const bool vnni = cpu::detail::vnni_supported();
  const bool avx2 = cpu::detail::packed_avx2_supported();
  // The packed copy (cpu/matmul_q8act_packed.h), 64-byte aligned: VNNI or AVX2 CPUs.
  const bool packs = vnni || avx2;
  std::vector<uint8_t> packed(size_t(packs ? cpu::detail::q8act_packed_bytes(w) + 64 : 0));
  ops::WeightView wp = w;
  if (packs) {
    wp.q8packed = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
    cpu::detail::pack_q8act(w, const_cast<uint8_t*>(wp.q8packed));
  }
  const char* names[6] = {"packed", "vnni", "highway", "f32-act", "pk-avx2", "pk-amx"};
  const std::function<void()> run[6] = {
      [&] { cpu::detail::matmul_q8act_packed(x.data(), T, wp, nullptr, y.data(), cpu::detail::PackedIsa::Avx512Vnni); },
      [&] { cpu::detail::matmul_q8act_vnni(x.data(), T, w, nullptr, y.data()); },
      [&] { cpu::detail::matmul_q8act_hwy(x.data(), T, w, nullptr, y.data()); },
      [&] { cpu::matmul(x.data(), T, w, nullptr, y.data()); },
      [&] { cpu::detail::matmul_q8act_packed(x.data(), T, wp, nullptr, y.data(), cpu::detail::PackedIsa::Avx2); },
      [&] { cpu::detail::matmul_q8act_packed(x.data(), T, wp, nullptr, y.data(), cpu::detail::PackedIsa::AmxInt8); }};
  // Which run: the VNNI-based ones need VNNI, pk-avx2 AVX2 (both on the packed copy), pk-amx
  // AMX-INT8.
  const bool on[6] = {vnni, vnni, true, true, avx2, vnni && cpu::detail::packed_amx_int8_supported()};
  double wall[6], cpu_s[6];
  std::fill(wall, wall + 6, 1e30), std::fill(cpu_s, cpu_s + 6, 1e30);
  for (int round = 0; round < 3; ++round)  // the kernels alternate: best of each over rounds
    for (int k = 0; k < 6; ++k) {
      if (!on[k]) continue;
      const auto [w_s, c_s] = bench::time_best(run[k], reps);
      wall[k] = std::min(wall[k], w_s);
      cpu_s[k] = std::min(cpu_s[k], c_s);
    }
  const double flops = 2.0 * double(T * N * K);
  for (int k = 0; k < 6; ++k)
    if (on[k])
      std::printf("%-7s %-2s T=%-4lld K=%-5lld N=%-5lld %-8s %8.3f ms  %7.1f GFLOP/s  | per CPU-s %7.1f GFLOP/s\n",
                  what, dtype_name(dt), (long long)T, (long long)K, (long long)N, names[k], wall[k] * 1e3,
                  flops / wall[k] / 1e9, flops / cpu_s[k] / 1e9);
}

}  // namespace

int main() {
  ops::ensure_backend_defaults();  // reads TINYLOOP_NUM_THREADS (ops/backend.h)
  std::printf("%d threads, VNNI %s, AMX-INT8 %s\n", cpu::num_threads(), cpu::detail::vnni_supported() ? "yes" : "no",
              cpu::detail::packed_amx_int8_supported() ? "yes" : "no");
  // TINYLOOP_Q8_BENCH_ONLY=batch (or prefill, decode, smol-...): only the cases of that name.
  g_only = std::getenv("TINYLOOP_Q8_BENCH_ONLY");
  for (DType dt : {DType::I8, DType::U4}) {
    q8_case("prefill", 512, 768, 2048, dt, 3);
    q8_case("prefill", 512, 2048, 768, dt, 3);
    q8_case("decode", 1, 768, 2048, dt, 50);
    q8_case("decode", 1, 2048, 768, dt, 50);
    q8_case("decode", 1, 768, 32000, dt, 10);
    for (int64_t T : {4, 8, 16, 64}) {
      q8_case("batch", T, 768, 2048, dt, 20);
      q8_case("batch", T, 768, 32000, dt, 5);
    }
  }
  // SmolLM2-135M's shapes (hidden 576, FFN 1536, 49152-row tied head; K = 576 is 4.5 units
  // of 128 columns, so the VNNI kernel pads the last one).
  for (DType dt : {DType::I8, DType::U4}) {
    q8_case("smol-pp", 512, 576, 1536, dt, 3);
    q8_case("smol-pp", 512, 1536, 576, dt, 3);
    q8_case("smol-tg", 1, 576, 1536, dt, 50);
    q8_case("smol-tg", 1, 1536, 576, dt, 50);
  }
  q8_case("smol-tg", 1, 576, 49152, DType::I8, 10);
  return 0;
}
