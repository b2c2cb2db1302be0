// Kernel-level speed of the CPU backend on the benchmark model's shapes: the SIMD kernels
// against the scalar reference, one thread or the pool. Prints wall-time rates and rates
// per CPU-second of the process: on a shared machine the second says how fast the code is
// when it runs, the first how fast it was this time.
//
//   build-cpu/bench/cpu_kernels_bench            # all cases, threads from TINYLOOP_NUM_THREADS
//   TINYLOOP_NUM_THREADS=1 build-cpu/bench/cpu_kernels_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/huge_pages.h"
#include "bench_timing.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "ops/backend.h"
#include "ops/matmul_bf16dot.h"
#include "ops/reference.h"

namespace {
using namespace tinyloop;

using bench::process_cpu_s;
using bench::time_best;

struct Weight {
  std::vector<float> f32;  // [N, K] when F32
  std::vector<uint16_t> u16;  // [N, K] when F16 / BF16
  ops::WeightView view;
};

Weight random_weight(int64_t N, int64_t K, DType dt, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  Weight w;
  w.view.dtype = dt;
  w.view.rows = N;
  w.view.cols = K;
  if (dt == DType::F32) {
    w.f32.resize(size_t(N * K));
    for (auto& v : w.f32) v = d(rng);
    w.view.data = w.f32.data();
  } else {
    w.u16.resize(size_t(N * K));
    for (auto& v : w.u16) v = dt == DType::F16 ? ops::f32_to_f16(d(rng)) : ops::f32_to_bf16(d(rng));
    w.view.data = w.u16.data();
  }
  return w;
}

void matmul_case(const char* what, int64_t T, int64_t K, int64_t N, DType dt, int reps) {
  std::mt19937 rng(1);
  const Weight w = random_weight(N, K, dt, rng);
  std::vector<float> x(size_t(T * K), 0.5f), y(size_t(T * N));
  const double flops = 2.0 * double(T * N * K), bytes = double(N * K) * double(dtype_size(dt));
  for (bool scalar : {false, true}) {
    const auto [wall, cpu] = time_best(
        [&] {
          if (scalar) ops::ref::matmul(x.data(), T, w.view, nullptr, y.data());
          else cpu::matmul(x.data(), T, w.view, nullptr, y.data());
        },
        reps);
    std::printf(
        "matmul %-8s %-4s T=%-4lld K=%-5lld N=%-6lld %-6s %8.3f ms  %7.1f GFLOP/s  %6.1f GB/s weights"
        "  | per CPU-s: %7.1f GFLOP/s %6.1f GB/s\n",
        what, dtype_name(dt), (long long)T, (long long)K, (long long)N, scalar ? "scalar" : "simd", wall * 1e3,
        flops / wall / 1e9, bytes / wall / 1e9, flops / cpu / 1e9, bytes / cpu / 1e9);
  }
}

// Decode through the benchmark model's loop block as a token does: one x row through the 7
// projections of each of its 2 loop layers (28 MB of F16 weights), 8 iterations over the
// same matrices. The block fits in a 32 MiB L3 only just, so this says how fast the loop
// weights are re-read from cache rather than memory (the "decode" cases above are either
// one small matrix or the head, streamed from memory).
void loop_block_case(int reps) {
  std::mt19937 rng(1);
  const int64_t D = 768, F = 2048;
  std::vector<Weight> ws;  // per layer: q, k, v, o [D, D], gate, up [F, D], down [D, F]
  for (int layer = 0; layer < 2; ++layer) {
    for (int i = 0; i < 4; ++i) ws.push_back(random_weight(D, D, DType::F16, rng));
    for (int i = 0; i < 2; ++i) ws.push_back(random_weight(F, D, DType::F16, rng));
    ws.push_back(random_weight(D, F, DType::F16, rng));
  }
  std::vector<float> x(size_t(F), 0.5f);  // [max(D, F)]
  std::vector<float> y(x.size());  // [max(D, F)]
  double bytes = 0;
  for (const Weight& w : ws) bytes += double(w.view.rows * w.view.cols) * 2.0;
  const auto [wall, cpu] = time_best(
      [&] {
        for (int it = 0; it < 8; ++it)
          for (const Weight& w : ws) cpu::matmul(x.data(), 1, w.view, nullptr, y.data());
      },
      reps);
  std::printf(
      "matmul loop-block F16 T=1 2 layers x 7 (%.1f MB) x 8 iterations %8.3f ms  %6.1f GB/s weights"
      "  | per CPU-s: %6.1f GB/s\n",
      bytes / 1e6, wall * 1e3, 8 * bytes / wall / 1e9, 8 * bytes / cpu / 1e9);
}

// The reduced-precision matmul (ops/matmul_bf16dot.h) on the packed BF16 copy of a BF16
// weight, AVX512-BF16 and portable kernels, beside the exact-f32 kernel on the same weight;
// rounds of the three alternate, best of `reps` each.
void bf16dot_case(const char* what, int64_t T, int64_t K, int64_t N, int reps) {
  std::mt19937 rng(1);
  const Weight w = random_weight(N, K, DType::BF16, rng);
  std::vector<uint32_t> packed(size_t(ops::bf16dot_packed_words(N, K)));  // [N/64, K/2, 64]
  ops::pack_bf16dot(w.view, packed.data());
  ops::WeightView wb = w.view;
  wb.bf16dot = packed.data();
  std::vector<float> x(size_t(T * K), 0.5f), y(size_t(T * N));
  const double flops = 2.0 * double(T * N * K), bytes = double(N * K) * 2.0;
  const char* names[3] = {"f32-fma", "bf16dot", "portable"};
  double wall[3] = {1e30, 1e30, 1e30}, cpu_s[3] = {1e30, 1e30, 1e30};
  for (int round = 0; round < 3; ++round)
    for (int k = 0; k < 3; ++k) {
      cpu::set_bf16dot_portable(k == 2);
      const auto [wl, c] = time_best(
          [&] {
            if (k == 0) cpu::matmul(x.data(), T, w.view, nullptr, y.data());
            else cpu::matmul_bf16dot(x.data(), T, wb, nullptr, y.data());
          },
          reps);
      wall[k] = std::min(wall[k], wl);
      cpu_s[k] = std::min(cpu_s[k], c);
    }
  cpu::set_bf16dot_portable(false);
  for (int k = 0; k < 3; ++k)
    std::printf(
        "matmul %-8s BF16 T=%-4lld K=%-5lld N=%-6lld %-8s %8.3f ms  %7.1f GFLOP/s  %6.1f GB/s weights"
        "  | per CPU-s: %7.1f GFLOP/s\n",
        what, (long long)T, (long long)K, (long long)N, names[k], wall[k] * 1e3, flops / wall[k] / 1e9,
        bytes / wall[k] / 1e9, flops / cpu_s[k] / 1e9);
}

void attention_case(int64_t T, int64_t ctx, int reps) {
  const int64_t H = 12, hd = 64;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<uint16_t> k(size_t(ctx * H * hd)), v(k.size());  // [ctx, H, hd]
  for (auto& e : k) e = ops::f32_to_f16(d(rng));
  for (auto& e : v) e = ops::f32_to_f16(d(rng));
  std::vector<float> q(size_t(T * H * hd)), out(q.size());  // [T, H, hd]
  for (auto& e : q) e = d(rng);
  std::vector<int64_t> q_pos(static_cast<size_t>(T)), k_lo(static_cast<size_t>(T), 0);
  double keys = 0;
  for (int64_t t = 0; t < T; ++t) keys += double(q_pos[size_t(t)] = ctx - T + t) + 1;
  ops::KvView kv;
  kv.dtype = ops::KvDType::F16;
  kv.k = k.data();
  kv.v = v.data();
  kv.capacity = ctx;
  kv.n_kv_heads = H;
  kv.head_dim = hd;
  const double flops = 4.0 * double(H * hd) * keys;  // QK^T and PV
  // The same rows paged as the engine keeps them (model/kv_pool.h): blocks of B positions,
  // head-major (K [H, B, hd] then V), in shuffled order in one arena.
  const int64_t B = 32, nb = (ctx + B - 1) / B, row = H * hd;
  std::vector<uint16_t> arena(size_t(nb * 2 * B * row));
  std::vector<int64_t> order(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) order[size_t(b)] = b;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<ops::KvBlock> table(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    uint16_t* base = arena.data() + order[size_t(b)] * 2 * B * row;
    table[size_t(b)] = {base, base + B * row, nullptr, nullptr};
    for (int64_t r = 0; r < B && b * B + r < ctx; ++r)
      for (int64_t h = 0; h < H; ++h) {
        std::copy_n(k.data() + (b * B + r) * row + h * hd, hd, base + (h * B + r) * hd);
        std::copy_n(v.data() + (b * B + r) * row + h * hd, hd, base + B * row + (h * B + r) * hd);
      }
  }
  ops::KvView paged = kv;
  paged.k = paged.v = nullptr;
  paged.capacity = nb * B;
  paged.block_rows = B;
  paged.blocks = table.data();
  paged.head_major = true;
  double contiguous_ms = 0;
  for (bool pg : {false, true}) {
    const auto [wall, cpu] = time_best(
        [&] { cpu::attention(q.data(), T, H, pg ? paged : kv, q_pos.data(), k_lo.data(), out.data()); }, reps);
    if (!pg) contiguous_ms = wall * 1e3;
    std::printf("attention F16 KV T=%-4lld context=%-5lld %-10s %8.3f ms  %7.1f GFLOP/s%s\n", (long long)T,
                (long long)ctx, pg ? "paged B=32" : "contiguous", wall * 1e3, flops / wall / 1e9,
                pg ? (" (" + std::to_string(contiguous_ms / (wall * 1e3)) + "x contiguous)").c_str() : "");
  }
  if (std::getenv("TINYLOOP_BENCH_ATTENTION_ONLY")) return;
  for (bool scalar : {false, true}) {
    const auto [wall, cpu] = time_best(
        [&] {
          if (scalar) ops::ref::attention(q.data(), T, H, kv, q_pos.data(), k_lo.data(), out.data());
          else cpu::attention(q.data(), T, H, kv, q_pos.data(), k_lo.data(), out.data());
        },
        reps);
    std::printf(
        "attention F16 KV T=%-4lld context=%-5lld 12 heads x 64 %-6s %8.3f ms  %7.1f GFLOP/s"
        "  | per CPU-s: %7.1f GFLOP/s\n",
        (long long)T, (long long)ctx, scalar ? "scalar" : "simd", wall * 1e3, flops / wall / 1e9, flops / cpu / 1e9);
  }
}

// Best (wall, CPU) seconds of one decode query row (the last position, window from 0)
// against `slots` paged slots of nb blocks of B rows each, the slots' block tables back to
// back in `table` ([slots, nb]); head_rows: KvView::head_rows (0: B).
std::pair<double, double> time_decode_slots(const std::vector<ops::KvBlock>& table, int64_t slots, int64_t nb,
                                            int64_t B, int64_t H, int64_t hd, ops::KvDType dt, bool head_major,
                                            int64_t head_rows, int reps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> q(size_t(H * hd)), out(q.size());  // [1, H, hd]
  for (auto& e : q) e = d(rng);
  const int64_t q_pos = nb * B - 1, k_lo = 0;
  std::vector<ops::KvView> views(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    ops::KvView& v = views[size_t(s)];
    v.dtype = dt;
    v.capacity = nb * B;
    v.n_kv_heads = H;
    v.head_dim = hd;
    v.block_rows = B;
    v.blocks = table.data() + s * nb;
    v.head_major = head_major;
    v.head_rows = head_rows;
  }
  return time_best(
      [&] {
        for (const auto& v : views) cpu::attention(q.data(), 1, H, v, &q_pos, &k_lo, out.data());
      },
      reps);
}

// Long-context decode as the engine runs it: one query row against `slots` KV slots of `ctx`
// positions each (the bench model at L = 8 has 18 layer applications, each with its own
// slot), blocks of 32 rows on huge pages in shuffled order, position-major blocks ([rows,
// heads, hd], the cache before 2026-12-03) against head-major ones ([heads, rows, hd], each
// head's rows one stream), F16 or I8 (ops/kv_quant.h: int8 rows, a float scale per row and
// kv head). Every call reads all slots' K and V once: the rate is KV GB/s.
// B: rows a block (32: the serving pool's default; 512: a long prompt's private cache,
// model::private_block_rows). hd: head_dim, with 768 / hd heads (the same bytes a position).
void decode_slots_case(int64_t ctx, int64_t slots, int reps, ops::KvDType dt = ops::KvDType::F16, int64_t B = 32,
                       int64_t hd = 64) {
  const int64_t H = 768 / hd, nb = (ctx + B - 1) / B, row = H * hd;
  const bool i8 = dt == ops::KvDType::I8;
  const int64_t esz = i8 ? 1 : 2;  // bytes per element
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  const size_t block_bytes = size_t(2 * B * row * esz);  // K then V
  const size_t n_blocks = size_t(slots * nb);
  HugeBytes arena = alloc_huge_pages(n_blocks * block_bytes);
  std::vector<float> scales(n_blocks * size_t(2 * B * H));  // [blocks, K then V, B * H] (I8 only)
  for (size_t i = 0; i < n_blocks * block_bytes / size_t(esz); ++i) {
    if (i8) reinterpret_cast<int8_t*>(arena.get())[i] = int8_t(int(rng() % 255) - 127);
    else reinterpret_cast<uint16_t*>(arena.get())[i] = ops::f32_to_f16(d(rng));
  }
  for (auto& e : scales) e = 0.01f + 0.001f * d(rng);
  std::vector<int64_t> order(n_blocks);
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<ops::KvBlock> table(order.size());  // [slots, nb]
  for (size_t i = 0; i < order.size(); ++i) {
    uint8_t* b = arena.get() + size_t(order[i]) * block_bytes;
    float* sc = scales.data() + size_t(order[i]) * size_t(2 * B * H);
    table[i] = {b, b + B * row * esz, i8 ? sc : nullptr, i8 ? sc + B * H : nullptr};
  }
  // K + V bytes (I8: and their scales)
  const double bytes = double(slots) * double(ctx) * (double(row) * double(esz) + (i8 ? 4.0 * double(H) : 0.0)) * 2;
  for (bool hm : {false, true}) {
    const auto [wall, cpu] = time_decode_slots(table, slots, nb, B, H, hd, dt, hm, 0, reps);
    std::printf(
        "decode attention %lld slots x %-5lld positions, %s KV, hd %3lld, %3lld-row %-13s %8.3f ms  %6.1f GB/s KV"
        "  | per CPU-s: %6.1f GB/s\n",
        (long long)slots, (long long)ctx, i8 ? "I8 " : "F16", (long long)hd, (long long)B,
        hm ? "head-major" : "position-major", wall * 1e3, bytes / wall / 1e9, bytes / cpu / 1e9);
  }
}

// decode_slots_case's F16 head-major walk with 32-row blocks as a serving pool with extents
// lays them out (model/kv_pool.h): E blocks of a slot side by side in one extent ([heads,
// E * 32, hd]), so a head's runs of a slot are E * 4 KiB long; the extents in shuffled order.
void decode_extents_case(int64_t ctx, int64_t slots, int reps, int64_t E) {
  const int64_t B = 32, hd = 64, H = 768 / hd, row = H * hd, nb = (ctx + B - 1) / B;
  const int64_t ne = (nb + E - 1) / E;  // extents a slot
  const size_t ext_bytes = size_t(2 * E * B * row * 2);  // K then V, F16
  HugeBytes arena = alloc_huge_pages(size_t(slots * ne) * ext_bytes);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (size_t i = 0; i < size_t(slots * ne) * ext_bytes / 2; ++i)
    reinterpret_cast<uint16_t*>(arena.get())[i] = ops::f32_to_f16(d(rng));
  std::vector<int64_t> order(size_t(slots * ne));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<ops::KvBlock> table(size_t(slots * nb));  // [slots, nb]
  for (int64_t s = 0; s < slots; ++s)
    for (int64_t j = 0; j < nb; ++j) {
      uint8_t* e = arena.get() + size_t(order[size_t(s * ne + j / E)]) * ext_bytes;
      uint8_t* k = e + (j % E) * B * hd * 2;
      table[size_t(s * nb + j)] = {k, k + E * B * row * 2, nullptr, nullptr};
    }
  const double bytes = double(slots) * double(ctx) * double(row) * 2.0 * 2;
  const auto [wall, cpu] = time_decode_slots(table, slots, nb, B, H, hd, ops::KvDType::F16, true, E * B, reps);
  std::printf(
      "decode attention %lld slots x %-5lld positions, F16 KV, hd %3lld,  32-row extents of %2lld %8.3f ms  %6.1f GB/s "
      "KV  | per CPU-s: %6.1f GB/s\n",
      (long long)slots, (long long)ctx, (long long)hd, (long long)E, wall * 1e3, bytes / wall / 1e9, bytes / cpu / 1e9);
}

}  // namespace

int main() {
  // TINYLOOP_NUM_THREADS / TINYLOOP_FORCE_SCALAR are read by the backend layer (ops/backend.h),
  // which calling the cpu kernels directly would skip.
  ops::ensure_backend_defaults();
  std::printf("SIMD target %s, %d threads\n", cpu::simd_target_name().c_str(), cpu::num_threads());
  // TINYLOOP_BENCH_BF16DOT_ONLY=1: only the reduced-precision matmul cases.
  const bool bf16dot_only = std::getenv("TINYLOOP_BENCH_BF16DOT_ONLY") != nullptr;
  // TINYLOOP_BENCH_BATCH_ONLY=1: only the batched-decode shapes of the serving engine (B rows
  // of B sequences through the FFN up projection and the head), F16 weights.
  if (std::getenv("TINYLOOP_BENCH_BATCH_ONLY")) {
    for (int64_t T : {1, 4, 8, 16, 32, 64}) matmul_case("batch", T, 768, 2048, DType::F16, T <= 8 ? 50 : 20);
    // The head: 49 MB of F16 weights, streamed from memory every step.
    for (int64_t T : {1, 5, 8, 16, 64}) matmul_case("batch", T, 768, 32000, DType::F16, 5);
    return 0;
  }
  // TINYLOOP_BENCH_LOOP_BLOCK=1: only the decode of the loop block (loop_block_case).
  if (std::getenv("TINYLOOP_BENCH_LOOP_BLOCK")) {
    loop_block_case(10);
    return 0;
  }
  // TINYLOOP_BENCH_DECODE_SLOTS=1: only long-context decode attention over 18 slots
  // (=i8: only the INT8 rows, 32- and 512-row blocks).
  if (const char* ds = std::getenv("TINYLOOP_BENCH_DECODE_SLOTS")) {
    if (std::string(ds) == "i8") {
      for (int64_t B : {32, 512}) decode_slots_case(512, 2, 400, ops::KvDType::I8, B);
      decode_slots_case(512, 2, 400, ops::KvDType::I8, 512, 128);  // head_dim 128: the generic path
      for (int64_t B : {32, 512}) decode_slots_case(4096, 18, 10, ops::KvDType::I8, B);
      return 0;
    }
    // First from the caches: 1 slot x 128 positions (0.8 MB of F16 K/V, L2) and 2 x 512 (3 MB,
    // L2 / L3) stay there between calls, so these rows are the kernel's own speed, against
    // which the rows from memory below are read (docs/benchmarks.md, History "Decode
    // attention: what bounds the K/V walk").
    decode_slots_case(128, 1, 2000);
    decode_slots_case(512, 2, 200);
    decode_slots_case(512, 2, 200, ops::KvDType::F16, 32, 128);  // head_dim 128: the generic path
    decode_slots_case(512, 2, 200, ops::KvDType::I8);
    for (int64_t ctx : {512, 2048, 4096, 8192}) decode_slots_case(ctx, 18, ctx <= 2048 ? 20 : 8);
    for (int64_t ctx : {4096, 8192}) {  // a serving pool's layout: 32-row blocks, one extent, 512-row blocks
      decode_extents_case(ctx, 18, 8, 16);
      decode_slots_case(ctx, 18, 8, ops::KvDType::F16, 512);
    }
    for (int64_t ctx : {2048, 4096, 8192}) decode_slots_case(ctx, 18, ctx <= 2048 ? 20 : 8, ops::KvDType::I8);
    return 0;
  }
  // TINYLOOP_BENCH_ATTENTION_ONLY=1: only attention, contiguous against paged KV.
  // TINYLOOP_BENCH_PREFILL_SHAPES=1: F16 prefill through every projection shape of the
  // benchmark model (dim 768, ffn 2048): q/k/v/o, gate/up, down. =ouro: Ouro-1.4B's (dim 2048,
  // ffn 5632), the K of a real checkpoint.
  if (const char* shapes = std::getenv("TINYLOOP_BENCH_PREFILL_SHAPES")) {
    using KN = std::pair<int64_t, int64_t>;
    const bool ouro = std::string(shapes) == "ouro";
    const std::vector<KN> kn = ouro ? std::vector<KN>{{2048, 2048}, {2048, 5632}, {5632, 2048}}
                                    : std::vector<KN>{{768, 768}, {768, 2048}, {2048, 768}};
    for (auto [K, N] : kn) matmul_case("prefill", 512, K, N, DType::F16, 3);
    return 0;
  }
  if (std::getenv("TINYLOOP_BENCH_ATTENTION_ONLY")) {
    // TINYLOOP_BENCH_ATTENTION_PREFILL=1: only the 512-row pieces at 2048 and 4096, best of 8
    // (noisy machines: compare builds on these).
    if (std::getenv("TINYLOOP_BENCH_ATTENTION_PREFILL")) {
      for (int64_t ctx : {2048, 4096}) attention_case(512, ctx, 8);
      return 0;
    }
    for (int64_t ctx : {512, 2048, 8192}) attention_case(1, ctx, 50);
    // Prefill pieces: 512 rows (LoopedModel::kPrefillChunk) at the end of a 512-4096 context.
    for (int64_t ctx : {512, 2048, 4096, 16384}) attention_case(512, ctx, ctx <= 512 ? 5 : 2);
    return 0;
  }
  if (!bf16dot_only) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      // Prefill: a 512-token prompt through the up projection (weights reused across rows).
      matmul_case("prefill", 512, 768, 2048, dt, 3);
      // Decode: one token through the FFN up projection (cache-resident: the kernel's speed)
      // and through the 32000 x 768 head (49-98 MB: streamed from memory).
      matmul_case("decode", 1, 768, 2048, dt, 50);
      matmul_case("decode", 1, 768, 32000, dt, 10);
    }
  }
  std::printf("bf16 dot-product kernel: %s\n", cpu::bf16dot_kernel_name().c_str());
  bf16dot_case("prefill", 512, 768, 2048, 3);
  bf16dot_case("prefill", 512, 2048, 768, 3);
  bf16dot_case("decode", 1, 768, 2048, 50);
  bf16dot_case("decode", 1, 2048, 768, 50);
  if (bf16dot_only) return 0;
  attention_case(512, 512, 3);
  attention_case(1, 2048, 20);
  return 0;
}
