// SIMD attention over KV slots, contiguous or paged (ops.h KvView), F32, F16 or INT8 storage
// (ops/kv_quant.h); same contracts as ops::attention and ops::attention_batch. The storage
// type is only a row loader (LoadChunk widens a chunk; an int8 row also carries a per-(row,
// kv head) scale, applied to the score and to the softmax weight), so every dtype runs the
// same loops. A window is walked as runs of consecutive positions that lie in one block
// (SplitRange); the run boundaries only decide which buffer a position's row is read from,
// so a paged slot gets exactly the arithmetic of a contiguous one holding the same rows
// (bit-identical, which shared prefix blocks and the batched engine need).
//
// A task is a tile of up to kTileRows query rows and one kv head g: the (row, query head)
// items of the tile (every head of g's group) attend to their row's keys k_lo[t] .. q_pos[t].
// Flash-style, the tile walks the union of its rows' windows once, in key blocks that end
// at multiples of kKeyBlock absolute positions: per block, the scores of every item, an
// online-softmax update, and the weighted V, so each K/V row is loaded and widened once for
// all the tile's items and the scratch is one block of scores per item at any context (a
// long prompt's K/V is read once per tile of rows, not once per row). Per item the
// arithmetic is fixed by its own window and the absolute block ends:
//   score[p] = TransposedSum4(sum over head_dim chunks of MulAdd(q, widen(K[p]))) * scale
//     (four keys' lane sums at once, every key through the same add tree)
//   per block part: m' = max(m, max score), alpha = exp(m - m'), w[p] = Exp(score[p] - m')
//     (vector exp, ~1 ulp), l = alpha l + (lane-wise sum over whole vectors of the part from
//     its first key, -inf padded, then SumOfLanes), o = alpha o + sum over p in order of
//     MulAdd(w[p], widen(V[p]))
//   out = o * (1 / l)
// so a row's result does not depend on T, on the other rows of its tile (keys outside its
// window are skipped, not weighted by 0), nor on where the window is split between slots,
// and tasks may run on any thread: decode (a tile of one row) gives a prefill row's bits.
// INT8 rows (int8 -> int32 -> float, exact) are scaled inside those sums, never dequantized
// into a buffer: score[p] uses k_scale[p] * scale, and V[p]'s weight is w[p] * v_scale[p].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "cpu/simd-inl.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#ifndef TINYLOOP_CPU_ATTENTION_ARGS_
#define TINYLOOP_CPU_ATTENTION_ARGS_
namespace tinyloop::cpu::detail {
// The rows of one sequence (one KvRowGroup of a batch) against their slot.
struct AttnArgs {
  const float* q;  // [T, n_heads, head_dim]
  int64_t T, n_heads;
  ops::KvView kv;  // the slot every row reads
  const int64_t* q_pos;  // [T]
  const int64_t* k_lo;  // [T]
  float* out;  // [T, n_heads, head_dim]
};
// Query rows per task: a tile of up to this many rows shares each K/V row it loads (a speed
// choice only: a row's result does not depend on its tile).
constexpr int64_t kTileRows = 16;
// Keys per block of the online softmax (AttendTileT): a window is cut where an absolute
// position is a multiple of this. Part of the arithmetic (decode and prefill agree on it);
// a tile's scores and one head's K/V of a block (32 KiB F16 at head_dim 64) stay in L1/L2.
constexpr int64_t kKeyBlock = 128;
}  // namespace tinyloop::cpu::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace tinyloop::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// INT8 rows carry a scale per (row, kv head); F32 / F16 rows do not.
template <typename KT>
inline constexpr bool kScaled = std::is_same_v<KT, int8_t>;

// One chunk (Lanes elements starting at c) of a [hd] row, widened to float (int8: via int32,
// exact); the row's tail chunk is zero-padded without reading past the row. kFull: the
// caller knows the chunk is whole (no test).
template <bool kFull = false, class DF, typename KT>
HWY_INLINE hn::Vec<DF> LoadChunk(DF df, const KT* HWY_RESTRICT row, int64_t c, int64_t hd) {
  const int64_t L = int64_t(hn::Lanes(df));
  if constexpr (kScaled<KT>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> di;
    if (kFull || c + L <= hd) return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, row + c)));
    constexpr size_t kMax = hn::MaxLanes(DF());
    alignas(64) int8_t pad[kMax];  // [Lanes] the tail chunk, zero-padded through a stack copy
    std::memset(pad, 0, sizeof(pad));
    std::memcpy(pad, row + c, HWY_MIN(size_t(hd - c), kMax));
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, pad)));
  } else {
    return kFull || c + L <= hd ? LoadF32(df, row + c) : LoadF32Tail(df, row + c, size_t(hd - c));
  }
}

// A run of a window that lies in one block, seen from one kv head g: positions lo .. lo +
// n - 1, rows r0 .. r0 + n - 1 of the block (a run never wraps its block; blocks whose rows
// of head g follow each other in memory, as a pool's extents place them, are one run and
// one "block" here: SplitRange joins them). Row r of
// head g starts at k + r * rs (v likewise) and its I8 scale is ks[r * ss]: rs = hd, ss = 1 in
// a head-major block (each head's rows one contiguous stream), rs = n_kv * hd, ss = n_kv in
// a position-major one (KvView::index).
template <typename KT>
struct Seg {
  const KT* k;  // head g's row 0 of the block
  const KT* v;  // head g's row 0 of the block
  const float* ks;  // head g's row-0 K scale (INT8 only, else null)
  const float* vs;  // head g's row-0 V scale (INT8 only, else null)
  int64_t rs, ss;  // elements / scales from one row of head g to the next
  // Position lo's row in the block (kept: a % per run and pass was ~3 % of a cache-resident
  // decode key with 32-row blocks), the run's first position and length.
  int64_t r0, lo, n;
};

// True when run b's rows of the head come right after run a's in memory (K, V and, INT8,
// both scales), so a's rows r0 .. r0 + a.n + b.n - 1 are a's then b's.
template <typename KT>
HWY_INLINE bool Continues(const Seg<KT>& a, const Seg<KT>& b) {
  const int64_t end = a.r0 + a.n;  // a's first row past the run
  return a.rs == b.rs && a.ss == b.ss && a.k + end * a.rs == b.k + b.r0 * b.rs &&
         a.v + end * a.rs == b.v + b.r0 * b.rs &&
         (!a.ks || (b.ks && a.ks + end * a.ss == b.ks + b.r0 * b.ss && a.vs + end * a.ss == b.vs + b.r0 * b.ss));
}

// Positions lo .. hi of slot kv, kv head g, as runs within one block each (a contiguous ring
// is one block: split only where the ring wraps), runs that continue one another in memory
// joined (a pool's extents, model/kv_pool.h: fewer, longer runs for the walk and its
// prefetch; the arithmetic does not depend on the runs). seg is cleared first; empty when
// lo > hi.
template <typename KT>
HWY_INLINE void SplitRange(const ops::KvView& kv, int64_t g, int64_t lo, int64_t hi, std::vector<Seg<KT>>& seg) {
  seg.clear();
  const int64_t unit = kv.unit_rows(), i0 = kv.index(0, g), ss = kv.row_step(), hd = kv.head_dim;
  int64_t rp = lo % kv.capacity;  // ring row of p
  for (int64_t p = lo; p <= hi;) {
    int64_t row;
    const ops::KvBlock b = kv.block_of(rp, &row);
    const int64_t n = std::min(hi - p + 1, unit - row);
    const Seg<KT> next{static_cast<const KT*>(b.k) + i0 * hd,
                       static_cast<const KT*>(b.v) + i0 * hd,
                       b.k_scale ? b.k_scale + i0 : nullptr,
                       b.v_scale ? b.v_scale + i0 : nullptr,
                       ss * hd,
                       ss,
                       row,
                       p,
                       n};
    if (!seg.empty() && Continues(seg.back(), next)) {
      seg.back().n += n;
    } else {
      seg.push_back(next);
    }
    p += n;
    rp += n;
    if (rp == kv.capacity) rp = 0;
  }
}

// One (query row, query head) pair of a tile: its window lo .. hi, where its scores and
// output go, and its online-softmax state (AttendTileT).
struct Item {
  const float* q;  // [hdp] query row, zero-padded
  float* s;  // scores / weights of the current key block, indexed by position - block start
  float* o;  // [hd] output row: the running sum of w V, then the result
  int64_t lo, hi;  // window
  float m, l;  // running max of the scores so far, running sum of their exps (relative to m)
  float alpha;  // exp(previous m - m) for the current block: the factor on o (and l)
  bool live;  // the window meets the current key block
};

#if HWY_TARGET != HWY_SCALAR
// Lanes [a, b, c, d]: the sums of the four 128-bit-block-local lane sets of a, b, c, d,
// each as (x0 + x2) + (x1 + x3) per block, then the blocks folded in halves
// ((B0 + B2) + (B1 + B3) on AVX-512). Every input goes through the same tree whatever its
// position, so a key's score does not depend on its place in a block of keys.
template <class D>
HWY_INLINE hn::Vec<hn::FixedTag<float, 4>> FoldTo128(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return FoldTo128(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE hn::Vec<hn::FixedTag<float, 4>> TransposedSum4(DF df, V a, V b, V c, V d) {
  const hn::Repartition<uint64_t, DF> d64;
  const V ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const V cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  const V lo = hn::BitCast(df, hn::InterleaveLower(d64, ab64, cd64));  // [a02 b02 c02 d02]
  const V hi = hn::BitCast(df, hn::InterleaveUpper(d64, ab64, cd64));  // [a13 b13 c13 d13]
  return FoldTo128(df, hn::Add(lo, hi));
}
#endif

// dst[k] = (lane sum of a_k) * f[k], k < 4: TransposedSum4 where vectors have 4 lanes or
// more; the one-lane scalar target has nothing to sum.
//   f [4] the scores' factors, dst [4]
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE void StoreScores4(DF df, V a0, V a1, V a2, V a3, const float* f, float* dst) {
#if HWY_TARGET == HWY_SCALAR
  (void)df;
  dst[0] = hn::GetLane(a0) * f[0];
  dst[1] = hn::GetLane(a1) * f[1];
  dst[2] = hn::GetLane(a2) * f[2];
  dst[3] = hn::GetLane(a3) * f[3];
#else
  const hn::FixedTag<float, 4> d4;
  hn::StoreU(hn::Mul(TransposedSum4(df, a0, a1, a2, a3), hn::LoadU(d4, f)), d4, dst);
#endif
}

#if HWY_TARGET != HWY_SCALAR
// StoreScores4 with the factors as a vector.
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE void StoreScores4(DF df, V a0, V a1, V a2, V a3, hn::Vec<hn::FixedTag<float, 4>> f, float* dst) {
  const hn::FixedTag<float, 4> d4;
  hn::StoreU(hn::Mul(TransposedSum4(df, a0, a1, a2, a3), f), d4, dst);
}
// The factors of four keys' scores: f[0 .. 4) as stored, or, where `direct` (four keys
// whose INT8 K scales are contiguous at ks, or F32 / F16 ones), the same values from
// ks[0 .. 4) * scale (or scale) computed as a vector. Why: f is written a float at a
// time, and a vector load of four separate stores waits for them to retire (no store
// forwarding): 15 % of a decode key's time (EPYC Zen 5, INT8 K/V).
template <typename KT, class DF>
HWY_INLINE hn::Vec<hn::FixedTag<float, 4>> Factors4(DF, const float* f, bool direct, const float* ks, float scale) {
  const hn::FixedTag<float, 4> d4;
  if (!direct) return hn::LoadU(d4, f);
  if constexpr (kScaled<KT>) return hn::Mul(hn::LoadU(d4, ks), hn::Set(d4, scale));
  return hn::Set(d4, scale);
}
#else
template <typename KT, class DF>
HWY_INLINE const float* Factors4(DF, const float* f, bool, const float*, float) {
  return f;
}
#endif

// Keys / values this many positions ahead are prefetched. In a position-major slot a kv
// head's rows are n_kv_heads * head_dim elements apart, a strided stream the hardware
// prefetchers follow poorly; head-major blocks (the KV cache's) are contiguous runs of
// block_rows rows, and the cursor crosses into the next block before the walk does.
// Position-major measurement, tinyloop bench tg64 at 2048
// positions, 1 thread, benchmark model (Xeon, 2026-12-01): F16 22.5 t/s without, 26.7 at
// 16 keys ahead, 28.0 at 48, 24.3 at 96; int4 q8 43.6 / 50.9 / 53.8 / 49.9. EPYC Zen 3
// (2026-12-07), 18 head-major slots, one thread, decode attention alone: 48 / 96 / 192 keys
// ahead within the noise of each other (8.5-12.6 GB/s at 2048-8192 positions).
constexpr int64_t kPrefetchKeys = 48;
// The distance per storage type: the same bytes as 48 F16 rows (96 INT8 rows, 24 F32 ones).
// INT8 rows are half as long, so at 48 rows ahead they were fetched too late: 18 slots x
// 4096 head-major INT8 rows, one Zen 5 core, 8.8 ms at 48 keys without the scales'
// prefetch (the same time as F16's twice larger rows), 6.7-6.9 ms at 96 with it; 128 and
// 192 no faster (cpu_kernels_bench, TINYLOOP_BENCH_DECODE_SLOTS=1, 2026-12-03).
template <typename KT>
inline constexpr int64_t kAheadKeys = kPrefetchKeys * 2 / int64_t(sizeof(KT));

// Where V rows are prefetched: INT8 rows (and their scales) as the scores pass reads the same
// key's K row, so the weighted-V pass that follows finds the block's V in cache; F16 / F32
// rows kAheadKeys ahead of the weighted-V walk. 18 slots x 4096 head-major, one Zen 5 core:
// INT8 6.7-6.9 -> 5.6 ms with the scores pass; F16 8.5-8.9 -> 10.5 ms (its twice longer
// rows: more misses in flight than the walk hides), so F16 keeps its own V walk.
template <typename KT>
inline constexpr bool kVWithK = kScaled<KT>;

// Prefetches [n] elements at row (a K or V row of kv head g) and, for INT8, the row's scale
// scales[i] (a separate stream), into L2 (prefetcht1), not L1. Why: a prefetch into L1
// holds one of the core's few L1 miss buffers (about 24 on Zen 4) for the whole memory
// latency, so 48 keys ahead of an F16 walk stalled the loads the kernel itself issues; an
// L2 prefetch is tracked by the L2's larger queue, and the walk's own L1 misses then hit
// L2. 18 slots x 4096 head-major F16, one Zen 4 core: 9-10.5 GB/s into L1, 15-18 GB/s into
// L2; engine tinyloop bench tg32 at 4096 positions, 1 thread: F16 25.8 -> 31.5 t/s, int4
// q8 37.3 -> 59.1 (2026-12-04). Not re-measured on Zen 5 or the Xeon. __builtin_prefetch
// is written here, not in a helper: GCC drops a non-inlined prefetch helper's body when
// it is called from Highway code.
template <typename KT>
HWY_INLINE void PrefetchRow(const KT* row, int64_t n, const float* scales, int64_t i) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < n * int64_t(sizeof(KT)); b += 64) __builtin_prefetch(p + b, 0, 2);
  if constexpr (kScaled<KT>) __builtin_prefetch(scales + i, 0, 2);
}

// A cursor kAheadKeys positions ahead of the walk over a window's runs: it follows the
// walk across block boundaries, so paged slots prefetch as far ahead as contiguous ones, and
// it stops at the window's end (nothing outside the window is touched).
// It holds its row pointers and steps them a row a key (a run never wraps its block): the
// ring row recomputed per key (a multiply, and a % per run), with the run's fields reloaded
// after every store the compiler could not rule out, was most of a decode key's scalar
// work (EPYC Zen 5, INT8 K/V, `TINYLOOP_BENCH_DECODE_SLOTS=i8 cpu_kernels_bench`).
// A cursor walks one area: K (keys) or V.
template <typename KT>
struct Ahead {
  const Seg<KT>* seg;
  int64_t n_seg, j = 0;
  bool keys;  // K rows, else V rows
  int64_t left = 0;  // positions from the cursor to the end of seg[j]
  int64_t rs = 0, ss = 0;  // seg[j]'s row and scale steps
  const KT* row = nullptr;  // the cursor's row of the head
  const float* sc = nullptr;  // its INT8 scale; null for F32 / F16
  Ahead(const Seg<KT>* s, int64_t n, bool k) : seg(s), n_seg(n), keys(k) {
    at(0);
    skip(kAheadKeys<KT>);
  }
  // Prefetches [n] elements from element `from` of the cursor's row (and its scale).
  HWY_INLINE void fetch(int64_t from, int64_t n) const {
    if (j >= n_seg) return;
    PrefetchRow(row + from, n, sc, 0);
  }
  // (The pointers step only onto rows of the run: none is formed past its last row.)
  HWY_INLINE void next() {
    if (j >= n_seg) return;
    if (--left == 0) {
      ++j;
      at(0);
      return;
    }
    row += rs;
    if constexpr (kScaled<KT>) sc += ss;
  }
  // Moves the cursor n positions on (past a key block another cursor walked).
  void skip(int64_t n) {
    if (j >= n_seg) return;
    int64_t off = seg[j].n - left + n;
    while (j < n_seg && off >= seg[j].n) off -= seg[j++].n;
    at(off);
  }

 private:
  // The cursor at position seg[j].lo + off (off < seg[j].n), if j is a run.
  void at(int64_t off) {
    if (j >= n_seg) return;
    const Seg<KT>& s = seg[j];
    const int64_t r = s.r0 + off;  // row in the block
    rs = s.rs;
    ss = s.ss;
    row = (keys ? s.k : s.v) + r * rs;
    if constexpr (kScaled<KT>) sc = (keys ? s.ks : s.vs) + r * ss;
    left = s.n - off;
  }
};

// Scores of every item against the keys of one slot part, four keys at a time:
//   it[i].s[p - ulo] = dot(q_i, K[p]) * scale (INT8: * (k_scale[p] * scale))
// where the dot is acc = MulAdd(q chunk c, K chunk c, acc) over the chunks in order (from
// zero) and then TransposedSum4 over its lanes, the same for every key. Each K row is loaded
// (and widened) once per block and used by every item of the tile. NC > 0: rows of exactly
// NC chunks, the block's K chunks held in registers (kFull: hd == NC * Lanes, no tail
// chunk); NC == 0: any length, the block widened into kf first. A block past the part's end
// reads a zero row instead, and its store writes up to 3 columns past the part (the next
// part overwrites them; the buffers leave room).
//   kf   [8, hdp] scratch
//   zrow [hd] zeros
template <int NC, bool kFull, typename KT>
HWY_INLINE void QkScores(const Seg<KT>& sg, Ahead<KT>& ahead, int64_t hd, int64_t hdp, const Item* it, int64_t n_it,
                         int64_t ulo, float scale, float* kf, const KT* zrow) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t r = sg.r0;  // the first key's row in the block
  // One item (decode of an MHA head) on the generic path: 8 keys a step, so that its scores
  // are 8 independent FMA chains (4 keys left the FMA units idle half the time).
  const bool solo = NC == 0 && n_it == 1;
  const int64_t step = solo ? 8 : 4;
  // The run's fields and the cursor as locals (the cursor's int64_t stores could alias a
  // Seg's fields for the compiler, which then reloaded them after every key), and row
  // pointers of the step's first key, stepped a step at a time (a run never wraps its
  // block) and only onto rows of the run: none is formed past its last row.
  const int64_t rs = sg.rs, ss = sg.ss, n = sg.n;
  const KT* kp = sg.k + r * rs;
  const KT* vp = sg.v + r * rs;
  const float* ksp = nullptr;  // its INT8 K / V scales
  const float* vsp = nullptr;
  if constexpr (kScaled<KT>) {
    ksp = sg.ks + r * ss;
    vsp = sg.vs + r * ss;
  }
  Ahead<KT> ah = ahead;  // a local: its stores cannot alias anything the loop reads
  // Four keys' factors are one vector (Factors4) where their scales are contiguous (or there
  // are none); the array f only for the other steps.
  const bool direct = HWY_TARGET != HWY_SCALAR && (!kScaled<KT> || ss == 1);
  for (int64_t p0 = 0; p0 < n; p0 += step) {
    const KT* kr[8];  // [step] rows of the keys
    alignas(16) float f[8];  // [step] the scores' factors (when !direct or the step is cut)
    const bool fill = !direct || p0 + step > n;
    for (int64_t k = 0; k < step; ++k) {
      if (p0 + k >= n) {  // past the part's end: a zero row
        kr[k] = zrow;
        f[k] = 0.f;
        continue;
      }
      kr[k] = kp + k * rs;
      ah.fetch(0, hd);
      ah.next();
      // This key's V row (and scale), for the weighted-V pass that follows.
      if constexpr (kVWithK<KT>) PrefetchRow(vp + k * rs, hd, vsp, k * ss);
      if (fill) f[k] = kScaled<KT> ? ksp[k * ss] * scale : scale;
    }
    const float* const ks4 = ksp;  // the step's K scales: four contiguous ones where ss == 1
    if (p0 + step < n) {
      kp += step * rs;
      vp += step * rs;
      if constexpr (kScaled<KT>) {
        ksp += step * ss;
        vsp += step * ss;
      }
    }
    const int64_t col = sg.lo + p0 - ulo;
    // The factors of keys p0 .. p0 + 3 (and p0 + 4 .. p0 + 7 for the 8-key step).
    const auto f4 = Factors4<KT>(df, f, p0 + 4 <= n && direct, ks4, scale);
    if constexpr (NC == 0) {
      if (solo) {
        // One item: each K chunk widened into a register and used at once (no round trip
        // through kf, which only pays where several items share the widened rows).
        V a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        const auto chunk = [&](int64_t c, auto full) HWY_ATTR {
          constexpr bool kWhole = decltype(full)::value;
          const V q = hn::LoadU(df, it[0].q + c);
          a0 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[0], c, hd), a0);
          a1 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[1], c, hd), a1);
          a2 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[2], c, hd), a2);
          a3 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[3], c, hd), a3);
          a4 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[4], c, hd), a4);
          a5 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[5], c, hd), a5);
          a6 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[6], c, hd), a6);
          a7 = hn::MulAdd(q, LoadChunk<kWhole>(df, kr[7], c, hd), a7);
        };
        int64_t c = 0;
        for (; c + L <= hd; c += L) chunk(c, std::true_type());
        if (c < hd) chunk(c, std::false_type());  // the zero-padded tail chunk
        StoreScores4(df, a0, a1, a2, a3, f4, it[0].s + col);
        if (p0 + 4 < n) {
          const auto f8 = Factors4<KT>(df, f + 4, p0 + 8 <= n && direct, kScaled<KT> ? ks4 + 4 * ss : nullptr, scale);
          StoreScores4(df, a4, a5, a6, a7, f8, it[0].s + col + 4);
        }
        continue;
      }
      for (int64_t k = 0; k < step; ++k)
        for (int64_t c = 0; c < hdp; c += L) hn::StoreU(LoadChunk(df, kr[k], c, hd), df, kf + k * hdp + c);
      // Two items at a time: 8 independent FMA chains (4 left the FMA units half idle at 4
      // cycles of latency), each K chunk loaded once for both. Per key and item the chain is
      // the same, so the pairing changes no bits.
      int64_t i = 0;
      for (; i + 2 <= n_it; i += 2) {
        V a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int64_t c = 0; c < hdp; c += L) {
          const V q = hn::LoadU(df, it[i].q + c), u = hn::LoadU(df, it[i + 1].q + c);
          V k = hn::LoadU(df, kf + c);
          a0 = hn::MulAdd(q, k, a0), b0 = hn::MulAdd(u, k, b0);
          k = hn::LoadU(df, kf + hdp + c);
          a1 = hn::MulAdd(q, k, a1), b1 = hn::MulAdd(u, k, b1);
          k = hn::LoadU(df, kf + 2 * hdp + c);
          a2 = hn::MulAdd(q, k, a2), b2 = hn::MulAdd(u, k, b2);
          k = hn::LoadU(df, kf + 3 * hdp + c);
          a3 = hn::MulAdd(q, k, a3), b3 = hn::MulAdd(u, k, b3);
        }
        StoreScores4(df, a0, a1, a2, a3, f4, it[i].s + col);
        StoreScores4(df, b0, b1, b2, b3, f4, it[i + 1].s + col);
      }
      if (i < n_it) {
        V a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < hdp; c += L) {
          const V q = hn::LoadU(df, it[i].q + c);
          a0 = hn::MulAdd(q, hn::LoadU(df, kf + c), a0);
          a1 = hn::MulAdd(q, hn::LoadU(df, kf + hdp + c), a1);
          a2 = hn::MulAdd(q, hn::LoadU(df, kf + 2 * hdp + c), a2);
          a3 = hn::MulAdd(q, hn::LoadU(df, kf + 3 * hdp + c), a3);
        }
        StoreScores4(df, a0, a1, a2, a3, f4, it[i].s + col);
      }
    } else {
      // Named registers, not arrays: GCC 12 keeps an array of vectors in memory.
// Macro-generated registers, one statement a line: left as written.
// clang-format off
#define TL_KEY(K_)                                                     \
  const V k##K_##0 = LoadChunk<kFull>(df, kr[K_], 0, hd);                      \
  const V k##K_##1 = NC > 1 ? LoadChunk<kFull>(df, kr[K_], L, hd) : k##K_##0;     \
  const V k##K_##2 = NC > 2 ? LoadChunk<kFull>(df, kr[K_], 2 * L, hd) : k##K_##0; \
  const V k##K_##3 = NC > 3 ? LoadChunk<kFull>(df, kr[K_], 3 * L, hd) : k##K_##0;
      TL_KEY(0) TL_KEY(1) TL_KEY(2) TL_KEY(3)
#undef TL_KEY
          // clang-format on
          for (int64_t i = 0; i < n_it; ++i) {
        const float* q = it[i].q;  // [hdp]
        const V q0 = hn::LoadU(df, q);
        V a0 = hn::MulAdd(q0, k00, hn::Zero(df)), a1 = hn::MulAdd(q0, k10, hn::Zero(df));
        V a2 = hn::MulAdd(q0, k20, hn::Zero(df)), a3 = hn::MulAdd(q0, k30, hn::Zero(df));
        if constexpr (NC > 1) {
          const V q1 = hn::LoadU(df, q + L);
          a0 = hn::MulAdd(q1, k01, a0), a1 = hn::MulAdd(q1, k11, a1);
          a2 = hn::MulAdd(q1, k21, a2), a3 = hn::MulAdd(q1, k31, a3);
        }
        if constexpr (NC > 2) {
          const V q2 = hn::LoadU(df, q + 2 * L);
          a0 = hn::MulAdd(q2, k02, a0), a1 = hn::MulAdd(q2, k12, a1);
          a2 = hn::MulAdd(q2, k22, a2), a3 = hn::MulAdd(q2, k32, a3);
        }
        if constexpr (NC > 3) {
          const V q3 = hn::LoadU(df, q + 3 * L);
          a0 = hn::MulAdd(q3, k03, a0), a1 = hn::MulAdd(q3, k13, a1);
          a2 = hn::MulAdd(q3, k23, a2), a3 = hn::MulAdd(q3, k33, a3);
        }
        StoreScores4(df, a0, a1, a2, a3, f4, it[i].s + col);
      }
    }
  }
  ahead = ah;
}

// The V rows of a key block's runs in position order: fn(p, vr, vs) for each position p,
// with vr its V row of kv head g from element c0 on and vs its INT8 V scale (1 for F32 /
// F16). The ring row advances without a division.
template <typename KT, class Fn>
HWY_INLINE void ForEachVRow(const Seg<KT>* seg, int64_t n_seg, int64_t c0, const Fn& fn) {
  for (int64_t s = 0; s < n_seg; ++s) {
    const Seg<KT>& sg = seg[s];
    int64_t r = sg.r0;  // position p's row in the block (a run never wraps it)
    for (int64_t p = sg.lo; p < sg.lo + sg.n; ++p) {
      float vs = 1.f;
      if constexpr (kScaled<KT>) vs = sg.vs[r * sg.ss];
      fn(p, sg.v + r * sg.rs + c0, vs);
      ++r;
    }
  }
}

// o[c0 .. c0 + NV*L) of up to four items over one key block, the online-softmax update of
// their outputs: o = alpha * o + sum over p of the block's part of the item's window, in
// position order, of w[p] * V[p] (INT8: w[p] * v_scale[p]); on an item's first block o = 0
// and alpha = 0. Each V row of the block is loaded (and widened) once and used by every item
// whose window holds it, so an item's sum is exactly the one it would get alone.
//   seg   [n_seg] the block's runs (kv head g's rows); ahead: a cursor at the block's first key
//   it    [4] items (unused ones are not live); only the first NI are looked at
//   bs    the block's first position (it[i].s is indexed by position - bs)
// kFull: the NV chunks are whole (no tail chunk among them). kAll: the NI items' windows all
// hold the whole block (no per-key window test: the blocks before a prefill tile's diagonal,
// most of a long prompt's). Not inlined: inside AttendTileT GCC 12 kept 4 of AVX2's 8
// accumulators on the stack (the tile's own values held the other registers). prefetch: the first call over
// the block (its first items) prefetches the V rows ahead; the later ones find them fetched.
template <int NV, int NI, bool kFull, bool kAll, typename KT>
HWY_NOINLINE void WeightedV(const Seg<KT>* seg, int64_t n_seg, Ahead<KT> ahead, int64_t hd, const Item* it, int64_t bs,
                            int64_t c0, bool prefetch) {
  static_assert(NV >= 1 && NV <= 4, "up to 4 vectors per pass");
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  // Named accumulators [item][vector], not an array (see QkScores).
  const V z = hn::Zero(df);
  V a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
  V a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
// Macro-generated registers, one statement a line: left as written.
// clang-format off
#define TL_LOAD(i)                                                                          \
  do {                                                                                      \
    if (!(NI > i && it[i].live)) break;                                                     \
    const V al = hn::Set(df, it[i].alpha);                                                  \
    const float* o = it[i].o + c0;                                                          \
    a##i##0 = hn::Mul(LoadChunk<kFull>(df, o, 0, hd - c0), al);                             \
    if constexpr (NV > 1) a##i##1 = hn::Mul(LoadChunk<kFull>(df, o, L, hd - c0), al);       \
    if constexpr (NV > 2) a##i##2 = hn::Mul(LoadChunk<kFull>(df, o, 2 * L, hd - c0), al);   \
    if constexpr (NV > 3) a##i##3 = hn::Mul(LoadChunk<kFull>(df, o, 3 * L, hd - c0), al);   \
  } while (0)
  TL_LOAD(0);
  TL_LOAD(1);
  TL_LOAD(2);
  TL_LOAD(3);
#undef TL_LOAD
  // clang-format on
  const int64_t lo0 = it[0].lo, hi0 = it[0].hi, lo1 = it[1].lo, hi1 = it[1].hi;
  const int64_t lo2 = it[2].lo, hi2 = it[2].hi, lo3 = it[3].lo, hi3 = it[3].hi;
  ForEachVRow(seg, n_seg, c0, [&](int64_t p, const KT* vr, float vsc) HWY_ATTR {
    if constexpr (!kVWithK<KT>) {
      if (prefetch) {
        ahead.fetch(c0, std::min<int64_t>(hd - c0, NV * L));
        ahead.next();
      }
    }
    const V v0 = LoadChunk<kFull>(df, vr, 0, hd - c0);
    const V v1 = NV > 1 ? LoadChunk<kFull>(df, vr, L, hd - c0) : v0;
    const V v2 = NV > 2 ? LoadChunk<kFull>(df, vr, 2 * L, hd - c0) : v0;
    const V v3 = NV > 3 ? LoadChunk<kFull>(df, vr, 3 * L, hd - c0) : v0;
// clang-format off
#define TL_ITEM(i)                                                   \
  if (NI > i && (kAll || (p >= lo##i && p <= hi##i))) {             \
    float w = it[i].s[p - bs];                                       \
    if constexpr (kScaled<KT>) w = w * vsc;                          \
    const V wv = hn::Set(df, w);                                     \
    a##i##0 = hn::MulAdd(wv, v0, a##i##0);                           \
    if constexpr (NV > 1) a##i##1 = hn::MulAdd(wv, v1, a##i##1);     \
    if constexpr (NV > 2) a##i##2 = hn::MulAdd(wv, v2, a##i##2);     \
    if constexpr (NV > 3) a##i##3 = hn::MulAdd(wv, v3, a##i##3);     \
  }
    TL_ITEM(0) TL_ITEM(1) TL_ITEM(2) TL_ITEM(3)
#undef TL_ITEM
        // clang-format on
        (void) vsc;
  });
  // Stored by name: an array of the accumulators indexed in a loop here made GCC 12 keep half
  // of them on the stack through the key loop (a store and a reload a key on their chains).
  const auto store = [&](const Item& t, int v, V acc) HWY_ATTR {
    const int64_t c = c0 + v * L;
    if (c + L <= hd) hn::StoreU(acc, df, t.o + c);
    else StoreTail(df, acc, t.o + c, size_t(hd - c));
  };
// clang-format off
#define TL_STORE(i)                                 \
  if (NI > i && it[i].live) {                       \
    store(it[i], 0, a##i##0);                       \
    if constexpr (NV > 1) store(it[i], 1, a##i##1); \
    if constexpr (NV > 2) store(it[i], 2, a##i##2); \
    if constexpr (NV > 3) store(it[i], 3, a##i##3); \
  }
  TL_STORE(0) TL_STORE(1) TL_STORE(2) TL_STORE(3)
#undef TL_STORE
  // clang-format on
}

// WeightedV for a tile of one item (decode of an MHA head): up to 8 output chunks a pass
// (the whole of head_dim 64 on AVX2, 128 on AVX-512), so each V row is walked once and the
// 8 chunks are 8 independent FMA chains; with 4 chunks a pass each key waited on the
// 4-cycle latency of 4 chains, twice. The arithmetic is WeightedV's for one item: o = alpha
// o + sum over the window's part of the block, in position order, of w[p] V[p].
//   seg [n_seg] the block's runs, ahead: a cursor at the block's first key, bs the block's
//   first position; chunks c0 .. c0 + NV of the output (kFull: all whole).
template <int NV, bool kFull, typename KT>
HWY_NOINLINE void WeightedV1(const Seg<KT>* seg, int64_t n_seg, Ahead<KT> ahead, int64_t hd, const Item& it, int64_t bs,
                             int64_t c0) {
  static_assert(NV >= 1 && NV <= 8, "up to 8 vectors per pass");
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const V al = hn::Set(df, it.alpha);
  const float* o = it.o + c0;  // [hd - c0]
  const V z = hn::Zero(df);
  V a0 = hn::Mul(LoadChunk<kFull>(df, o, 0, hd - c0), al), a1 = z, a2 = z, a3 = z, a4 = z, a5 = z, a6 = z, a7 = z;
  if constexpr (NV > 1) a1 = hn::Mul(LoadChunk<kFull>(df, o, L, hd - c0), al);
  if constexpr (NV > 2) a2 = hn::Mul(LoadChunk<kFull>(df, o, 2 * L, hd - c0), al);
  if constexpr (NV > 3) a3 = hn::Mul(LoadChunk<kFull>(df, o, 3 * L, hd - c0), al);
  if constexpr (NV > 4) a4 = hn::Mul(LoadChunk<kFull>(df, o, 4 * L, hd - c0), al);
  if constexpr (NV > 5) a5 = hn::Mul(LoadChunk<kFull>(df, o, 5 * L, hd - c0), al);
  if constexpr (NV > 6) a6 = hn::Mul(LoadChunk<kFull>(df, o, 6 * L, hd - c0), al);
  if constexpr (NV > 7) a7 = hn::Mul(LoadChunk<kFull>(df, o, 7 * L, hd - c0), al);
  ForEachVRow(seg, n_seg, c0, [&](int64_t p, const KT* vr, float vsc) HWY_ATTR {
    if constexpr (!kVWithK<KT>) {
      ahead.fetch(c0, std::min<int64_t>(hd - c0, NV * L));
      ahead.next();
    }
    if (p < it.lo || p > it.hi) return;
    float w = it.s[p - bs];
    if constexpr (kScaled<KT>) w = w * vsc;
    const V wv = hn::Set(df, w);
    a0 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 0, hd - c0), a0);
    if constexpr (NV > 1) a1 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, L, hd - c0), a1);
    if constexpr (NV > 2) a2 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 2 * L, hd - c0), a2);
    if constexpr (NV > 3) a3 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 3 * L, hd - c0), a3);
    if constexpr (NV > 4) a4 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 4 * L, hd - c0), a4);
    if constexpr (NV > 5) a5 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 5 * L, hd - c0), a5);
    if constexpr (NV > 6) a6 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 6 * L, hd - c0), a6);
    if constexpr (NV > 7) a7 = hn::MulAdd(wv, LoadChunk<kFull>(df, vr, 7 * L, hd - c0), a7);
  });
  const auto store = [&](int v, V acc) HWY_ATTR {
    const int64_t c = c0 + v * L;
    if (c + L <= hd) hn::StoreU(acc, df, it.o + c);
    else StoreTail(df, acc, it.o + c, size_t(hd - c));
  };
  store(0, a0);
  if constexpr (NV > 1) store(1, a1);
  if constexpr (NV > 2) store(2, a2);
  if constexpr (NV > 3) store(3, a3);
  if constexpr (NV > 4) store(4, a4);
  if constexpr (NV > 5) store(5, a5);
  if constexpr (NV > 6) store(6, a6);
  if constexpr (NV > 7) store(7, a7);
}

// Output chunks (vectors) per WeightedV call of 4 items: 4 x NV accumulators + NV V chunks +
// a weight must fit the vector registers. AVX-512 has 32 (4 chunks: 21 live); AVX2 16, where
// 4 chunks spilled accumulators to the stack and each spilled chain went through a store and
// a reload a key: EPYC Zen 3, prefill attention (`TINYLOOP_BENCH_ATTENTION_ONLY=1
// cpu_kernels_bench`, 512 rows at 4096, one thread) 28-31 GFLOP/s. So 2 chunks there (11).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int64_t kVChunks = 4;
#else
constexpr int64_t kVChunks = 2;
#endif

// One tile: query rows rows[0 .. n_rows) (non-empty windows), kv head g; the query heads of
// g's group attend to their row's keys k_lo[t] .. q_pos[t]. Flash-style: the tile walks the
// union of its windows once, in key blocks that end at multiples of kKeyBlock (absolute
// positions), and keeps per (row, head) item an online softmax (running max m, running sum
// l, output o), so its scratch is one block of scores per item at any context, and each K/V
// row is loaded once for all the tile's items. Per item and block (its window's part of it):
//   scores (QkScores), m' = max(m, block max), alpha = exp(m - m'), w = Exp(score - m')
//   (vector exp, ~1 ulp), l = alpha l + (lane-wise sum over whole vectors of the part from
//   its first key, -inf padded, then SumOfLanes), o = alpha o + sum of w V (WeightedV);
//   at the end out = o * (1 / l).
// Every step of an item reads only its own window, cut at the same absolute block ends
// whatever the tile, so the result does not depend on the tile, the thread or where the
// window is split between slots: decode (a tile of one row) gives a prefill row's bits.
template <typename KT>
HWY_NOINLINE void AttendTileT(const detail::AttnArgs& a, const int64_t* rows, int64_t n_rows, int64_t g) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const int64_t L = int64_t(hn::Lanes(df));
  const int64_t hd = a.kv.head_dim, n_kv = a.kv.n_kv_heads;
  const int64_t group = a.n_heads / n_kv;
  const int64_t n_it = n_rows * group;
  int64_t ulo = a.k_lo[rows[0]], uhi = a.q_pos[rows[0]];  // the union of the windows
  for (int64_t i = 1; i < n_rows; ++i) {
    ulo = std::min(ulo, a.k_lo[rows[i]]);
    uhi = std::max(uhi, a.q_pos[rows[i]]);
  }
  const int64_t hdp = (hd + L - 1) / L * L;  // hd padded to whole vectors
  const int64_t ns = (detail::kKeyBlock + 2 * L + 3) / L * L;  // a score row: block + padding + overhang
  thread_local std::vector<float> qbuf, sbuf, kbuf;
  thread_local std::vector<KT> zbuf;
  thread_local std::vector<Item> ibuf;
  if (qbuf.size() < size_t(n_it * hdp)) qbuf.resize(size_t(n_it * hdp));
  if (sbuf.size() < size_t(n_it * ns)) sbuf.resize(size_t(n_it * ns));
  if (kbuf.size() < size_t(8 * hdp)) kbuf.resize(size_t(8 * hdp));
  if (zbuf.size() < size_t(hd)) zbuf.resize(size_t(hd), KT());  // [hd] a zero K row
  if (ibuf.size() < size_t(n_it + 3)) ibuf.resize(size_t(n_it + 3));
  float* qp = qbuf.data();  // [n_it, hdp] query rows, zero-padded
  float* sc = sbuf.data();  // [n_it, ns] one key block's scores, then softmax numerators
  Item* it = ibuf.data();  // [n_it + 3] (3 empty ones for the last batch of WeightedV)
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t t = rows[r];
    const float* qg = a.q + (t * a.n_heads + g * group) * hd;  // [group, hd]
    for (int64_t j = 0; j < group; ++j) {
      const int64_t i = r * group + j;
      std::copy(qg + j * hd, qg + (j + 1) * hd, qp + i * hdp);
      std::fill(qp + i * hdp + hd, qp + (i + 1) * hdp, 0.f);
      float* o = a.out + (t * a.n_heads + g * group + j) * hd;  // [hd]
      std::fill(o, o + hd, 0.f);
      it[i] = {qp + i * hdp, sc + i * ns, o, a.k_lo[t], a.q_pos[t], ninf, 0.f, 0.f, false};
    }
  }
  for (int64_t i = n_it; i < n_it + 3; ++i) it[i] = {nullptr, nullptr, nullptr, 1, 0, ninf, 0.f, 0.f, false};

  thread_local std::vector<Seg<KT>> seg, bseg;  // runs of the union (for the prefetch cursors), of one key block
  SplitRange(a.kv, g, ulo, uhi, seg);
  const int64_t n_seg = int64_t(seg.size());
  const float scale = float(1.0 / std::sqrt(double(hd)));
  Ahead<KT> kahead(seg.data(), n_seg, true), vahead(seg.data(), n_seg, false);  // prefetch cursors of the K and V walks
  for (int64_t bs = ulo; bs <= uhi;) {
    const int64_t be = std::min(uhi, (bs / detail::kKeyBlock + 1) * detail::kKeyBlock - 1);  // block bs .. be
    SplitRange(a.kv, g, bs, be, bseg);
    const int64_t n_bseg = int64_t(bseg.size());

    // Scores: one pass over the block's K rows, each row used by every item.
    for (int64_t s = 0; s < n_bseg; ++s) {
      const bool full = hd == hdp;
      float* kf = kbuf.data();
      const KT* z = zbuf.data();
#define TL_QK(NC, FULL) QkScores<NC, FULL>(bseg[size_t(s)], kahead, hd, hdp, it, n_it, bs, scale, kf, z)
      // Unrolled for rows of up to 4 vectors; the test-free variant only for exactly 4 (head_dim
      // 64 on AVX-512, 32 on AVX2): every variant is compiled per dtype and target.
      switch (hdp / L) {
        case 1: TL_QK(1, false); break;
        case 2: TL_QK(2, false); break;
        case 3: TL_QK(3, false); break;
        case 4: full ? TL_QK(4, true) : TL_QK(4, false); break;
        default: TL_QK(0, false); break;
      }
#undef TL_QK
    }

    // Online softmax of each item over its window's part of the block; the -inf padding exps
    // to exactly 0.
    for (int64_t i = 0; i < n_it; ++i) {
      Item& t = it[i];
      const int64_t lo = std::max(t.lo, bs), hi = std::min(t.hi, be);
      t.live = lo <= hi;
      if (!t.live) continue;
      const int64_t n = hi - lo + 1, np = (n + L - 1) / L * L;
      float* s = t.s + (lo - bs);  // [np] the part's scores, then padding
      std::fill(s + n, s + np, ninf);
      V mx = hn::LoadU(df, s);
      for (int64_t c = L; c < np; c += L) mx = hn::Max(mx, hn::LoadU(df, s + c));
      const float m = std::max(t.m, hn::GetLane(hn::MaxOfLanes(df, mx)));
      t.alpha = std::exp(t.m - m);  // 0 on the item's first block (m was -inf)
      const V mv = hn::Set(df, m);
      V sum = hn::Zero(df);
      for (int64_t c = 0; c < np; c += L) {
        const V e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + c), mv));
        hn::StoreU(e, df, s + c);
        sum = hn::Add(sum, e);
      }
      t.l = t.l * t.alpha + ReduceSumF32(df, sum);
      t.m = m;
    }

    // Weighted V, 4 items and kVChunks chunks of their outputs a call, over the block's keys.
    for (int64_t b = 0; b < n_it; b += 4) {
      bool any = false, all = true;  // some / all 4 items' windows hold the whole block
      for (int64_t i = b; i < b + 4; ++i) {
        any = any || it[i].live;
        all = all && it[i].lo <= bs && it[i].hi >= be;
      }
      if (!any) continue;
      if (n_it == 1) {  // a single item (decode of an MHA head): up to 8 chunks a pass
        for (int64_t c0 = 0; c0 < hd; c0 += 8 * L) {
          const int64_t nv = std::min<int64_t>(8, (hd - c0 + L - 1) / L);
          const bool full = c0 + nv * L <= hd;
#define TL_PV1(NV)                                                            \
  full ? WeightedV1<NV, true>(bseg.data(), n_bseg, vahead, hd, it[0], bs, c0) \
       : WeightedV1<NV, false>(bseg.data(), n_bseg, vahead, hd, it[0], bs, c0)
          switch (nv) {
            case 1: TL_PV1(1); break;
            case 2: TL_PV1(2); break;
            case 3: TL_PV1(3); break;
            case 4: TL_PV1(4); break;
            case 5: TL_PV1(5); break;
            case 6: TL_PV1(6); break;
            case 7: TL_PV1(7); break;
            default: TL_PV1(8); break;
          }
#undef TL_PV1
        }
        continue;
      }
      for (int64_t c0 = 0; c0 < hd; c0 += kVChunks * L) {
        const int64_t nv = std::min<int64_t>(kVChunks, (hd - c0 + L - 1) / L);
        const bool full = c0 + nv * L <= hd;
#define TL_PV(NV, NI, FULL, ALL) WeightedV<NV, NI, FULL, ALL>(bseg.data(), n_bseg, vahead, hd, it + b, bs, c0, b == 0)
        if (nv == kVChunks && full) {  // head_dim a multiple of kVChunks vectors (64 on AVX-512)
          if (all) TL_PV(kVChunks, 4, true, true);
          else TL_PV(kVChunks, 4, true, false);
        } else if (nv == 4) TL_PV(4, 4, false, false);
        else if (nv == 3) TL_PV(3, 4, false, false);
        else if (nv == 2) TL_PV(2, 4, false, false);
        else TL_PV(1, 4, false, false);
#undef TL_PV
      }
    }
    if constexpr (!kVWithK<KT>) vahead.skip(be - bs + 1);  // else the scores pass fetched V
    bs = be + 1;
  }

  // out = o * (1 / l); l >= 1: the max term is exp(0).
  for (int64_t i = 0; i < n_it; ++i) {
    const float inv = 1.f / it[i].l;
    for (int64_t j = 0; j < hd; ++j) it[i].o[j] *= inv;
  }
}

// Rows t0 .. t0 + kTileRows - 1 (those < T) against kv head g. Empty windows give zero rows;
// the others form one tile, unless their windows overlap too little for sharing to pay
// (then one tile per row: the results are the same either way).
template <typename KT>
HWY_INLINE void AttendRowsT(const detail::AttnArgs& a, int64_t t0, int64_t g) {
  const int64_t hd = a.kv.head_dim, group = a.n_heads / a.kv.n_kv_heads;
  int64_t rows[detail::kTileRows];
  int64_t n_rows = 0, lo = 0, hi = -1, sum_n = 0;
  for (int64_t t = t0; t < std::min(t0 + detail::kTileRows, a.T); ++t) {
    const int64_t n = a.q_pos[t] - a.k_lo[t] + 1;
    if (n <= 0) {
      float* og = a.out + (t * a.n_heads + g * group) * hd;  // [group, hd]
      std::fill(og, og + group * hd, 0.f);
      continue;
    }
    lo = n_rows ? std::min(lo, a.k_lo[t]) : a.k_lo[t];
    hi = n_rows ? std::max(hi, a.q_pos[t]) : a.q_pos[t];
    sum_n += n;
    rows[n_rows++] = t;
  }
  if (n_rows == 0) return;
  if ((hi - lo + 1) * n_rows <= 2 * sum_n + 64 * n_rows) return AttendTileT<KT>(a, rows, n_rows, g);
  for (int64_t r = 0; r < n_rows; ++r) AttendTileT<KT>(a, rows + r, 1, g);
}

// dst[n] = f16(src[n]), round to nearest even. With a conversion instruction (F16C,
// AVX-512) that is the hardware's exact IEEE conversion, which rounds, saturates to inf and
// quiets nan exactly as the scalar reference's float_to_half (the tests check every class of
// value bit for bit); without one, the scalar reference's conversion itself.
void FloatToHalfN(const float* HWY_RESTRICT src, int64_t n, uint16_t* HWY_RESTRICT dst) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t L = int64_t(hn::Lanes(df));
  auto* out = reinterpret_cast<hwy::float16_t*>(dst);
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, out + i);
  for (; i < n; ++i) dst[i] = ops::detail::float_to_half(src[i]);
#else
  for (int64_t i = 0; i < n; ++i) dst[i] = ops::detail::float_to_half(src[i]);
#endif
}

// Rows t0 .. t0 + kTileRows - 1 (those < T) against kv head g, the KV storage type picked.
void AttendRows(const detail::AttnArgs& a, int64_t t0, int64_t g) {
  if (a.kv.dtype == ops::KvDType::F16) AttendRowsT<hwy::float16_t>(a, t0, g);
  else if (a.kv.dtype == ops::KvDType::I8) AttendRowsT<int8_t>(a, t0, g);
  else AttendRowsT<float>(a, t0, g);
}

}  // namespace tinyloop::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tinyloop::cpu {
HWY_EXPORT(AttendRows);
HWY_EXPORT(FloatToHalfN);

// k_rows, v_rows [T, n_kv_heads, head_dim]; pos [T]: ring row pos[t] % capacity of dst, in
// dst's order (KvView::index).
void kv_write(const ops::KvView& dst, const float* k_rows, const float* v_rows, const int64_t* pos, int64_t T) {
  const int64_t hd = dst.head_dim, row = dst.n_kv_heads * hd;  // elements per position
  // A position-major row is one run of `row` elements; a head-major one is a run of hd per
  // kv head.
  const int64_t run = dst.head_major ? hd : row, runs = row / run;
  const auto to_half = HWY_DYNAMIC_DISPATCH(FloatToHalfN);
  for (int64_t t = 0; t < T; ++t) {
    int64_t r;
    const ops::KvBlock b = dst.block_of(pos[t] % dst.capacity, &r);
    for (int64_t g = 0; g < runs; ++g) {
      const int64_t src = t * row + g * run, off = dst.index(r, g) * hd;  // g: the run's first kv head
      if (dst.dtype == ops::KvDType::F32) {
        std::memcpy(static_cast<float*>(b.k) + off, k_rows + src, size_t(run) * sizeof(float));
        std::memcpy(static_cast<float*>(b.v) + off, v_rows + src, size_t(run) * sizeof(float));
      } else {
        to_half(k_rows + src, run, static_cast<uint16_t*>(b.k) + off);
        to_half(v_rows + src, run, static_cast<uint16_t*>(b.v) + off);
      }
    }
  }
}

// q [T, n_heads, head_dim], q_pos [T], k_lo [T], out [T, n_heads, head_dim]; groups cover
// the rows in order.
void attention_batch(const float* q, int64_t T, int64_t n_heads, const ops::KvRowGroup* groups, int64_t n_groups,
                     const int64_t* q_pos, const int64_t* k_lo, float* out) {
  if (T <= 0 || n_groups <= 0) return;
  const auto fn = HWY_DYNAMIC_DISPATCH(AttendRows);
  const int64_t n_kv = groups[0].kv.n_kv_heads, hd = groups[0].kv.head_dim, w = n_heads * hd;
  // Tasks: (group, tile of kTileRows of its rows, kv head), one parallel loop for them all.
  struct Tile {
    int64_t group, t0;
  };
  std::vector<detail::AttnArgs> a;
  std::vector<Tile> tl;
  for (int64_t i = 0; i < n_groups; ++i) {
    const ops::KvRowGroup& gr = groups[i];
    const int64_t b = gr.begin;
    a.push_back({q + b * w, gr.rows, n_heads, gr.kv, q_pos + b, k_lo + b, out + b * w});
    for (int64_t t0 = 0; t0 < gr.rows; t0 += detail::kTileRows) tl.push_back({i, t0});
  }
  parallel_for(int64_t(tl.size()) * n_kv, [&](int64_t i) {
    const Tile& t = tl[size_t(i / n_kv)];
    fn(a[size_t(t.group)], t.t0, i % n_kv);
  });
}

void attention(const float* q, int64_t T, int64_t n_heads, const ops::KvView& kv, const int64_t* q_pos,
               const int64_t* k_lo, float* out) {
  if (T <= 0) return;
  const detail::AttnArgs a{q, T, n_heads, kv, q_pos, k_lo, out};
  const auto fn = HWY_DYNAMIC_DISPATCH(AttendRows);
  const int64_t n_kv = kv.n_kv_heads;
  // Tasks: (tile of kTileRows query rows, kv head).
  const int64_t n_tiles = (T + detail::kTileRows - 1) / detail::kTileRows;
  parallel_for(n_tiles * n_kv, [&](int64_t i) { fn(a, i / n_kv * detail::kTileRows, i % n_kv); });
}

}  // namespace tinyloop::cpu
#endif
