// Standalone timing (not part of the build, not linked into the engine): oneDNN's bf16 matmul
// against TinyLoop's reduced-precision matmul (ops/matmul_bf16dot.h) on the benchmark model's
// shapes, in one process, alternating, best of several runs each (docs/benchmarks.md,
// "Reduced-precision loop body"). oneDNN gets bf16 x already converted (its reorder from f32
// is not timed) and picks its own weight layout (format "any", reordered once, not timed);
// TinyLoop's time includes rounding x to bf16. Needs libdnnl-dev and a build dir with the
// static libraries:
//
//   g++ -O2 -std=c++20 -Isrc -Iinclude bench/onednn_bf16.cc build-bf16/src/ops/libtinyloop_ops.a \
//       build-bf16/src/cpu/libtinyloop_cpu.a -lhwy -ldnnl -lpthread -o /tmp/onednn_bf16
//   OMP_NUM_THREADS=1 TINYLOOP_NUM_THREADS=1 /tmp/onednn_bf16
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "ops/matmul_bf16dot.h"

namespace {
using namespace tinyloop;

double best_ms(const std::function<void()>& fn, int reps) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void run_case(int64_t M, int64_t K, int64_t N, int reps) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  std::vector<float> x(size_t(M * K)), y(size_t(M * N)), y2(size_t(M * N));  // [M, K], [M, N]
  std::vector<uint16_t> w(size_t(N * K)), xb(size_t(M * K));  // [N, K], [M, K]
  for (auto& v : x) v = d(rng) * 20;
  for (auto& v : w) v = ops::round_bf16_ftz(d(rng));
  for (size_t i = 0; i < x.size(); ++i) xb[i] = ops::round_bf16_ftz(x[i]);

  // TinyLoop: packed copy (load time), x rounded inside the call.
  ops::WeightView wv;
  wv.dtype = DType::BF16;
  wv.data = w.data();
  wv.rows = N;
  wv.cols = K;
  std::vector<uint32_t> packed(size_t(ops::bf16dot_packed_words(N, K)));
  ops::pack_bf16dot(wv, packed.data());
  wv.bf16dot = packed.data();

  // oneDNN: src bf16 [M, K], weights bf16 [K, N] = our [N, K] row-major (tag ba), dst f32.
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  dnnl::memory::desc a_md({M, K}, dt::bf16, tag::ab), b_any({K, N}, dt::bf16, tag::any), c_md({M, N}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), eng);
  dnnl::memory a_mem(a_md, eng, xb.data()), c_mem(c_md, eng, y2.data());
  dnnl::memory b_user({{K, N}, dt::bf16, tag::ba}, eng, w.data());
  dnnl::memory b_mem(pd.weights_desc(), eng);
  dnnl::reorder(b_user, b_mem).execute(s, b_user, b_mem);
  s.wait();
  dnnl::matmul mm(pd);
  auto run_dnnl = [&] {
    mm.execute(s, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    s.wait();
  };
  auto run_ours = [&] { cpu::matmul_bf16dot(x.data(), M, wv, nullptr, y.data()); };
  double ours = 1e30, dnnl_ms = 1e30;
  for (int round = 0; round < 3; ++round) {
    ours = std::min(ours, best_ms(run_ours, reps));
    dnnl_ms = std::min(dnnl_ms, best_ms(run_dnnl, reps));
  }
  // Batch invariance: oneDNN's row 0 of this M-row call against row 0 computed alone.
  int64_t rows_differ = -1;
  if (M > 1) {
    dnnl::memory::desc a1_md({1, K}, dt::bf16, tag::ab), c1_md({1, N}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd1(dnnl::matmul::desc(a1_md, pd.weights_desc(), c1_md), eng);
    std::vector<float> y1(static_cast<size_t>(N));  // [1, N]
    dnnl::memory a1(a1_md, eng, xb.data()), c1(c1_md, eng, y1.data());
    dnnl::matmul(pd1).execute(s, {{DNNL_ARG_SRC, a1}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c1}});
    s.wait();
    rows_differ = 0;
    for (int64_t n = 0; n < N; ++n) rows_differ += y1[size_t(n)] != y2[size_t(n)];
  }
  double max_diff = 0, max_y = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    max_diff = std::max(max_diff, double(std::abs(y[i] - y2[i])));
    max_y = std::max(max_y, double(std::abs(y[i])));
  }
  const double gflop = 2.0 * double(M * N * K) / 1e9;
  std::printf(
      "%4lld x %4lld -> %4lld  tinyloop %s %8.3f ms %6.1f GFLOP/s | oneDNN %8.3f ms %6.1f GFLOP/s "
      "| oneDNN / tinyloop time %.2f | max |diff| %.1e of max |y| %.1e | oneDNN row 0 alone: %s\n",
      (long long)M, (long long)K, (long long)N, cpu::bf16dot_kernel_name().c_str(), ours, gflop / ours * 1e3, dnnl_ms,
      gflop / dnnl_ms * 1e3, dnnl_ms / ours, max_diff, max_y,
      rows_differ < 0 ? "-" : (std::to_string(rows_differ) + " of " + std::to_string(N) + " values differ").c_str());
}

}  // namespace

int main() {
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN %d.%d.%d (cpu runtime %s)\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other");
  run_case(512, 768, 2048, 5);
  run_case(512, 2048, 768, 5);
  run_case(1, 768, 2048, 200);
  run_case(1, 2048, 768, 200);
  return 0;
}
