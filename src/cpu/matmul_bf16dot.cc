// The reduced-precision matmul (ops/matmul_bf16dot.h): x rounded to bf16 once per call, then
// products with the packed BF16 weight copy accumulated in float32 by AMX tiles on a CPU
// with AMX-BF16 (matmul_amx_bf16.cc: the AMX chain, for every T), else by vdpbf16ps
// (AVX512-BF16) when the CPU has it, else by the portable Highway kernel
// (matmul_bf16dot_hwy.cc). The last two give the spec's bits. Highway 1.0.3 has no vdpbf16ps, so this kernel is written with intrinsics
// in functions compiled for that ISA (target attribute) and chosen at run time.
//
// Register tile: up to 6 x rows x one 64-column panel. A step i loads the panel's 4 vectors
// of 16 columns' (even, odd) weight pairs once and multiplies them into every row's 4
// accumulators with that row's x pair broadcast: 24 vdpbf16ps (768 multiply-adds) per 4
// weight loads + 6 broadcasts. Each (row, column) is one accumulator lane running the spec's
// chain from pair 0 to K2 - 1, whatever the tile height: so the tile, the path and the thread
// never change its bits (batch invariance).
//
// Threads: one task per panel (64 output columns); decode streams the packed matrix front to
// back once (panels are contiguous), prefill sweeps every x tile past a panel while it sits
// in L2 (a 768-deep panel is 96 KiB, a 2048-deep one 256 KiB).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/matmul_bf16dot_internal.h"
#include "cpu/matmul_split.h"
#include "base/bf16dot_format.h"

namespace tinyloop::cpu {
namespace {

constexpr int64_t C = ops::kBf16DotPanel;  // 64 columns: 4 vectors of 16 float lanes
static_assert(C == 64, "the AVX-512 tile holds a panel as 4 vectors");

#if defined(__x86_64__) && defined(__GNUC__)
#define TINYLOOP_BF16DOT_X86 1
#define TINYLOOP_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// The AVX512-BF16 tile for MR rows (see the top). Plain arrays of vectors: the loops over
// them are fully unrolled, so every accumulator lives in a register.
template <int MR>
TINYLOOP_AVX512BF16 void TileAvx512Bf16(const uint32_t* xp, int64_t ldx, int64_t K2, const uint32_t* panel,
                                        float* out) {
  __m512 acc[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K2; ++i) {
    const uint32_t* wp = panel + i * C;  // [64] pairs of step i
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 16);
    const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wp + 32);
    const __m512bh w3 = (__m512bh)_mm512_loadu_si512(wp + 48);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(xp[r * ldx + i]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xb, w2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], xb, w3);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(out + r * C + j * 16, acc[r][j]);
}

TINYLOOP_AVX512BF16 void TileAvx512Bf16Any(const uint32_t* xp, int64_t ldx, int64_t mt, int64_t K2,
                                           const uint32_t* panel, float* out) {
  switch (mt) {
    case 1: return TileAvx512Bf16<1>(xp, ldx, K2, panel, out);
    case 2: return TileAvx512Bf16<2>(xp, ldx, K2, panel, out);
    case 3: return TileAvx512Bf16<3>(xp, ldx, K2, panel, out);
    case 4: return TileAvx512Bf16<4>(xp, ldx, K2, panel, out);
    case 5: return TileAvx512Bf16<5>(xp, ldx, K2, panel, out);
    default: return TileAvx512Bf16<6>(xp, ldx, K2, panel, out);
  }
}
static_assert(detail::kBf16DotMaxRows == 6, "TileAvx512Bf16Any covers 1..6 rows");

bool cpu_has_avx512bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return has;
}
#else
bool cpu_has_avx512bf16() { return false; }
#endif

std::atomic<bool> g_force_portable{false};

detail::Bf16DotTileFn tile_fn() {
#ifdef TINYLOOP_BF16DOT_X86
  if (!g_force_portable.load(std::memory_order_relaxed) && cpu_has_avx512bf16()) return &TileAvx512Bf16Any;
#endif
  return detail::bf16dot_tile_portable();
}

// On an AMX-BF16 CPU every call takes the AMX kernel, whatever T: its chain differs from
// vdpbf16ps's (ops/matmul_bf16dot.h), so mixing the two by T would break batch invariance.
bool use_amx() { return !g_force_portable.load(std::memory_order_relaxed) && amx_bf16_active(); }

}  // namespace

void set_bf16dot_portable(bool on) { g_force_portable.store(on); }

bool bf16dot_uses_amx() { return use_amx(); }

std::string bf16dot_kernel_name() {
  if (use_amx()) return "amx";
  return tile_fn() == detail::bf16dot_tile_portable() ? "portable-" + simd_target_name() : "avx512bf16";
}

// x [T, K], w.bf16dot [ceil(N / 64), K2, 64] pairs, bias [N] or null, y [T, N].
void matmul_bf16dot(const float* x, int64_t T, const ops::WeightView& w, const float* bias, float* y) {
  if (!w.bf16dot) throw std::invalid_argument("matmul_bf16dot: the weight view has no bf16 copy");
  if (use_amx()) return matmul_bf16dot_amx(x, T, w, bias, y);
  const int64_t N = w.rows, K = w.cols, K2 = (K + 1) / 2;
  if (T <= 0 || N <= 0) return;
  thread_local std::vector<uint32_t> xp;  // [T, K2] x rounded and paired (read by the workers)
  if (xp.size() < size_t(std::max<int64_t>(T * K2, 1))) xp.resize(size_t(std::max<int64_t>(T * K2, 1)));
  ops::round_rows_bf16dot(x, T, K, xp.data());
  const detail::Bf16DotTileFn fn = tile_fn();
  const uint32_t* xpd = xp.data();
  auto panel_task = [&](int64_t p) {
    const uint32_t* panel = w.bf16dot + p * K2 * C;  // [K2, 64]
    const int64_t n0 = p * C, nc = std::min(C, N - n0);
    alignas(64) float out[detail::kBf16DotMaxRows * C];  // [mt, 64] one tile's sums
    for (int64_t t0 = 0; t0 < T; t0 += detail::kBf16DotMaxRows) {
      const int64_t mt = std::min(detail::kBf16DotMaxRows, T - t0);
      fn(xpd + t0 * K2, K2, mt, K2, panel, out);
      for (int64_t r = 0; r < mt; ++r) {
        float* yr = y + (t0 + r) * N + n0;  // [nc]
        const float* o = out + r * C;  // [64]
        if (bias)
          for (int64_t c = 0; c < nc; ++c) yr[c] = o[c] + bias[n0 + c];
        else std::copy(o, o + nc, yr);
      }
    }
  };
  // One task per 64-row panel: for_row_chunks' chunks are the panels.
  detail::for_row_chunks(T, N, K, C, [&](int64_t n0, int64_t n1) {
    for (int64_t p = n0 / C; p * C < n1; ++p) panel_task(p);
  });
}

}  // namespace tinyloop::cpu
