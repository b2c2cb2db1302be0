// AMX-BF16 tiles against the AVX512-BF16 kernel (vdpbf16ps) and the exact F16 kernel, on
// the benchmark model's matmul shapes (dim 768, FFN 2048, vocab 32000) at T = 1, 4, 16, 64
// (batched decode) and 512 (prefill), 1 and 2 threads. The three kernels alternate inside
// every round (best of `reps` calls each, best of 3 rounds); prints a Markdown table.
//
//   build/amx/bench/amx_bench                       # all shapes, 1 and 2 threads
//   TINYLOOP_BENCH_AMX_THREADS=1 build/amx/bench/amx_bench
//
// "amx" and "avx512bf16" run cpu::matmul_bf16dot with AMX on / off (cpu::set_amx_enabled),
// on the packed bf16 copy of the weight; "f16" runs cpu::matmul on the F16 weight itself
// (float32 activations: the default path). GFLOP/s = 2 T N K / wall time.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "base/dtype.h"
#include "ops/matmul_bf16dot.h"

namespace {
using namespace tinyloop;

double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

void run_case(int64_t T, int64_t K, int64_t N, int threads) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  std::vector<uint16_t> wf16(size_t(N * K));  // [N, K] F16 weight
  for (auto& v : wf16) v = ops::f32_to_f16(d(rng));
  ops::WeightView w;
  w.dtype = DType::F16;
  w.data = wf16.data();
  w.rows = N;
  w.cols = K;
  std::vector<uint32_t> packed(size_t(ops::bf16dot_packed_words(N, K)));  // [N/64, K/2, 64]
  ops::pack_bf16dot(w, packed.data());
  ops::WeightView wb = w;
  wb.bf16dot = packed.data();
  std::vector<float> x(size_t(T * K)), y(size_t(T * N));  // [T, K], [T, N]
  std::uniform_real_distribution<float> dx(-2.f, 2.f);
  for (auto& v : x) v = dx(rng);

  cpu::set_num_threads(threads);
  const bool has_amx = cpu::amx_status().bf16;
  const char* names[3] = {"amx", "avx512bf16", "f16"};
  double best[3] = {1e30, 1e30, 1e30};
  const double flops = 2.0 * double(T) * double(N) * double(K);
  // ~20 ms of work a timing, at least 3 calls.
  const int reps = int(std::clamp(2e-2 / (flops / 100e9), 3.0, 200.0));
  for (int round = 0; round < 3; ++round)
    for (int k = 0; k < 3; ++k) {
      if (k == 0 && !has_amx) continue;
      cpu::set_amx_enabled(k == 0);
      const auto [wall, cpu_s] = bench::time_best(
          [&] {
            if (k == 2) cpu::matmul(x.data(), T, w, nullptr, y.data());
            else cpu::matmul_bf16dot(x.data(), T, wb, nullptr, y.data());
          },
          reps);
      (void)cpu_s;
      best[k] = std::min(best[k], wall);
    }
  cpu::set_amx_enabled(true);
  std::printf("| %d | %lld | %lld -> %lld |", threads, (long long)T, (long long)K, (long long)N);
  for (int k = 0; k < 3; ++k) {
    if (best[k] >= 1e30) std::printf(" - |");
    else std::printf(" %.3f ms, %.0f |", best[k] * 1e3, flops / best[k] / 1e9);
  }
  if (has_amx) std::printf(" %.2f | %.2f |\n", best[1] / best[0], best[2] / best[0]);
  else std::printf(" - | - |\n");
  std::fflush(stdout);
  (void)names;
}

}  // namespace

int main() {
  const auto& s = cpu::amx_status();
  std::printf("AMX: %s; bf16 dot kernel now: %s; load average %.2f\n", s.bf16 ? "AMX-BF16 usable" : s.reason.c_str(),
              cpu::bf16dot_kernel_name().c_str(), load_average());
  std::vector<int> threads = {1, 2};
  if (const char* e = std::getenv("TINYLOOP_BENCH_AMX_THREADS")) threads = {std::atoi(e)};
  std::printf(
      "\n| threads | T | K -> N | amx (ms, GFLOP/s) | avx512bf16 | f16 exact | avx512bf16 / amx | f16 / amx |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|\n");
  for (int th : threads)
    for (int64_t T : {1, 4, 16, 64, 512}) {
      run_case(T, 768, 2048, th);  // FFN gate / up
      run_case(T, 2048, 768, th);  // FFN down
      run_case(T, 768, 768, th);  // attention Q / O
      if (T <= 64) run_case(T, 768, 32000, th);  // the head (batched decode)
    }
  std::printf("\nload average at the end %.2f\n", load_average());
  return 0;
}
