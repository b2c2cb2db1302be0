// cpu::attention against the scalar reference (ops::ref::attention), on every compiled
// target: MHA and GQA, odd head_dim (vector tails), F16 and F32 KV, ring slots, sliding
// windows, empty windows; batch / thread invariance bit for bit (any grouping of query rows
// into tiles); paged slots bit for bit against contiguous ones, and the batched call over
// many sequences against each alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "cpu/thread_pool.h"
#include "ops/reference.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::kU;
using ops::testing::random_floats;

// A KV slot with positions 0 .. n_pos-1 written (ring: row p % capacity holds the newest).
struct Slot {
  ops::KvDType dtype;
  int64_t capacity, n_kv, hd;
  std::vector<float> kf, vf;  // [capacity, n_kv, hd] when F32
  std::vector<uint16_t> kh, vh;  // [capacity, n_kv, hd] when F16

  // Positions first .. n_pos-1 of the sequence that `seed` defines are written (first > 0:
  // the tail slot of a prefix cache, which never holds the earlier positions).
  Slot(ops::KvDType dt, int64_t cap, int64_t nkv, int64_t d, int64_t n_pos, uint32_t seed, int64_t first = 0)
      : dtype(dt), capacity(cap), n_kv(nkv), hd(d) {
    const size_t n = size_t(cap * nkv * d);
    kf.assign(n, NAN);  // never-written rows are nan: reading one would show
    vf.assign(n, NAN);
    kh.assign(n, 0x7e00);
    vh.assign(n, 0x7e00);
    std::vector<int64_t> pos(static_cast<size_t>(n_pos));
    for (int64_t p = 0; p < n_pos; ++p) pos[size_t(p)] = p;
    const auto kr = random_floats(size_t(n_pos * nkv * d), seed, -2.f, 2.f);
    const auto vr = random_floats(size_t(n_pos * nkv * d), seed + 1);
    const int64_t off = first * nkv * d;
    ops::ref::kv_write(ops::testing::contiguous_view(dt, k(), v(), cap, nkv, d), kr.data() + off, vr.data() + off,
                       pos.data() + first, n_pos - first);
  }
  void* k() { return dtype == ops::KvDType::F32 ? (void*)kf.data() : (void*)kh.data(); }
  void* v() { return dtype == ops::KvDType::F32 ? (void*)vf.data() : (void*)vh.data(); }
  ops::KvView view() {
    ops::KvView kv;
    kv.dtype = dtype;
    kv.k = k();
    kv.v = v();
    kv.capacity = capacity;
    kv.n_kv_heads = n_kv;
    kv.head_dim = hd;
    return kv;
  }
};

// Query rows for positions q_pos, windows [k_lo, q_pos].
struct Queries {
  std::vector<float> q;  // [T, n_heads, hd]
  std::vector<int64_t> q_pos, k_lo;
  int64_t T() const { return int64_t(q_pos.size()); }
};

// |cpu - ref| per element. Each logit is a float dot of hd terms scaled: error <= (hd + 2) u
// * max|q||k| sums (max_qk); each softmax weight carries its own logit's error and the max's
// (relative error ~ 2 (hd + 2) u max_qk, exp itself <= 1-2 ulp in libm and in Highway's Exp);
// the float sums over n keys and the 1/sum add (n + hd + 8) u. The output is a convex
// combination of V rows, so each kernel is within max|v| u (2 (hd + 2) max_qk + n + hd + 8)
// of the exact value; twice that between two kernels, and 2x margin (as ops' own test).
void expect_close(Slot& s, int64_t n_heads, const Queries& qs) {
  const int64_t T = qs.T(), hd = s.hd;
  std::vector<float> out(size_t(T * n_heads * hd), NAN), ref(out.size(), NAN);
  cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), out.data());
  ops::ref::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), ref.data());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = qs.q_pos[size_t(t)] - qs.k_lo[size_t(t)] + 1;
    double max_q = 0;
    for (int64_t i = 0; i < n_heads * hd; ++i)
      max_q = std::max(max_q, double(std::fabs(qs.q[size_t(t * n_heads * hd + i)])));
    // |k| <= 2, |v| <= 1 by construction (F16 rounding keeps the bounds).
    const double max_qk = double(hd) * max_q * 2.0 / std::sqrt(double(hd));
    const double tol = 4 * 1.0 * kU * (2.0 * double(hd + 2) * max_qk + double(std::max<int64_t>(n, 0) + hd + 8));
    for (int64_t i = 0; i < n_heads * hd; ++i) {
      const size_t j = size_t(t * n_heads * hd + i);
      if (n <= 0) {
        ASSERT_EQ(out[j], 0.f);
        continue;
      }
      ASSERT_NEAR(out[j], ref[j], tol) << "t=" << t << " i=" << i << " hd=" << hd << " n=" << n;
    }
  }
}

Queries causal_chunk(int64_t first, int64_t T, int64_t n_heads, int64_t hd, int64_t window, uint32_t seed) {
  Queries qs;
  qs.q = random_floats(size_t(T * n_heads * hd), seed);
  for (int64_t t = 0; t < T; ++t) {
    qs.q_pos.push_back(first + t);
    qs.k_lo.push_back(window > 0 ? std::max<int64_t>(0, first + t - window + 1) : 0);
  }
  return qs;
}

class CpuAttention : public ::testing::TestWithParam<ops::KvDType> {};

TEST_P(CpuAttention, OddShapesAgainstReference) {
  testing::for_each_target([&] {
    uint32_t seed = 1;
    for (int64_t hd : {1, 5, 8, 16, 17, 64, 80, 130})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {6, 3}}) {
        Slot s(GetParam(), 40, n_kv, hd, 37, seed += 2);
        // Decode of the last position, a causal chunk, and sliding windows of 5.
        expect_close(s, n_heads, causal_chunk(36, 1, n_heads, hd, 0, seed += 2));
        expect_close(s, n_heads, causal_chunk(30, 7, n_heads, hd, 0, seed += 2));
        expect_close(s, n_heads, causal_chunk(30, 7, n_heads, hd, 5, seed += 2));
        if (HasFatalFailure()) return;
      }
  });
}

TEST_P(CpuAttention, RingWrapAndLongWindow) {
  testing::for_each_target([&] {
    // 300 positions through a 64-row ring, windows of 64 that start mid-ring and wrap.
    Slot s(GetParam(), 64, 2, 64, 300, 9);
    expect_close(s, 4, causal_chunk(296, 4, 4, 64, 64, 10));
    // 700 keys in one window: long softmax sums.
    Slot big(GetParam(), 700, 1, 32, 700, 11);
    expect_close(big, 2, causal_chunk(699, 1, 2, 32, 0, 12));
  });
}

TEST_P(CpuAttention, EmptyWindowGivesZeros) {
  Slot s(GetParam(), 8, 1, 16, 4, 13);
  Queries qs = causal_chunk(3, 2, 2, 16, 0, 14);
  qs.k_lo[1] = 5;  // k_lo > q_pos
  expect_close(s, 2, qs);
}

// Each query row alone == the same row inside a chunk, and 1 thread == 3 threads. Bit-exact.
TEST_P(CpuAttention, BatchAndThreadInvariant) {
  testing::for_each_target([&] {
    for (int64_t hd : {17, 64}) {
      const int64_t n_heads = 6, T = 9;
      Slot s(GetParam(), 48, 3, hd, 45, 15);
      const Queries qs = causal_chunk(36, T, n_heads, hd, 20, 16);
      const int64_t row = n_heads * hd;
      std::vector<float> all(size_t(T * row));
      cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), all.data());
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> one(static_cast<size_t>(row));
        cpu::attention(qs.q.data() + t * row, 1, n_heads, s.view(), &qs.q_pos[size_t(t)], &qs.k_lo[size_t(t)],
                       one.data());
        for (int64_t i = 0; i < row; ++i) ASSERT_EQ(one[size_t(i)], all[size_t(t * row + i)]) << "t=" << t;
      }
      const int before = num_threads();
      for (int n : {1, 3}) {
        set_num_threads(n);
        std::vector<float> again(all.size());
        cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), again.data());
        ASSERT_EQ(again, all) << "threads=" << n;
      }
      set_num_threads(before);
    }
  });
}

// Query rows that share a tile (cpu/attention.cc: tiles of kTileRows rows share each K/V row)
// give bit for bit what they give alone or in any other grouping: prefill chunks of every
// length (T not a multiple of the tile), rows in any order with unrelated windows (the
// union of a tile's windows has gaps, or is too sparse to share), empty windows inside a
// tile, GQA groups that make more than four (row, head) items per tile; and they stay close
// to the reference.
TEST_P(CpuAttention, TilesAnyRowGroupingBitIdentical) {
  testing::for_each_target([&] {
    uint32_t seed = 301;
    for (int64_t hd : {3, 16, 17, 64, 130})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {8, 1}}) {
        const int64_t N = 50;  // positions 0 .. 49 in a ring of 64
        Slot s(GetParam(), 64, n_kv, hd, N, seed += 2);
        for (int mode = 0; mode < 3; ++mode) {
          Queries qs;
          if (mode == 0) {
            qs = causal_chunk(N - 13, 13, n_heads, hd, 0, seed += 2);  // a causal prefill chunk
          } else if (mode == 1) {
            qs = causal_chunk(N - 13, 13, n_heads, hd, 6, seed += 2);  // sliding windows of 6
          } else {
            // Unrelated rows: random positions and window starts, some windows empty.
            qs.q = random_floats(size_t(13 * n_heads * hd), seed += 2);
            std::mt19937 rng(seed);
            for (int t = 0; t < 13; ++t) {
              const int64_t qp = int64_t(rng() % N);
              qs.q_pos.push_back(qp);
              qs.k_lo.push_back(t % 5 == 3 ? qp + 1 : int64_t(rng() % uint32_t(qp + 1)));
            }
          }
          const int64_t T = qs.T(), row = n_heads * hd;
          expect_close(s, n_heads, qs);
          std::vector<float> all(size_t(T * row), NAN);
          cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), all.data());
          for (int64_t chunk : {1, 2, 3, 5, 6}) {
            std::vector<float> parts(all.size(), NAN);
            for (int64_t t0 = 0; t0 < T; t0 += chunk) {
              const int64_t n = std::min(chunk, T - t0);
              cpu::attention(qs.q.data() + t0 * row, n, n_heads, s.view(), &qs.q_pos[size_t(t0)], &qs.k_lo[size_t(t0)],
                             parts.data() + t0 * row);
            }
            for (size_t i = 0; i < all.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(parts[i]), std::bit_cast<uint32_t>(all[i]))
                  << "hd=" << hd << " heads=" << n_heads << "/" << n_kv << " mode=" << mode << " chunk=" << chunk
                  << " i=" << i;
          }
          if (HasFatalFailure()) return;
        }
      }
  });
}

// Windows that span several key blocks of the online softmax (cpu/attention.cc: kKeyBlock
// absolute positions a block): causal prefill chunks from position 0, sliding windows that
// start and end mid-block, a ring that wraps (the slot holds only the newest positions), in
// every grouping of rows into tiles (1 row = decode; 16 = a whole tile; 17, 40: tiles cut
// anywhere) and in head-major paged blocks of 48 rows (block ends not on key-block ends),
// bit for bit; and close to the reference.
TEST_P(CpuAttention, KeyBlocksAnyRowGroupingBitIdentical) {
  testing::for_each_target([&] {
    uint32_t seed = 701;
    for (int64_t hd : {17, 64})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{2, 2}, {6, 2}}) {
        struct Case {
          int64_t cap, n_pos, first, T, window;
        };
        // 0 .. 400 causal; windows of 150 at 300 .. 420; a 336-row ring over 700 positions.
        for (const Case& c : {Case{432, 400, 0, 400, 0}, Case{432, 420, 300, 120, 150}, Case{336, 700, 620, 80, 250}}) {
          Slot s(GetParam(), c.cap, n_kv, hd, c.n_pos, seed += 2);
          const Queries qs = causal_chunk(c.first, c.T, n_heads, hd, c.window, seed += 2);
          const int64_t T = qs.T(), row = n_heads * hd;
          expect_close(s, n_heads, qs);
          std::vector<float> all(size_t(T * row), NAN);
          cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), all.data());
          const ops::testing::HeadMajorBlocks paged(s.view(), 48, 2);  // block ends not on key-block ends, extents
          for (int64_t chunk : {1, 16, 17, 40}) {
            std::vector<float> parts(all.size(), NAN);
            for (int64_t t0 = 0; t0 < T; t0 += chunk) {
              const int64_t n = std::min(chunk, T - t0);
              cpu::attention(qs.q.data() + t0 * row, n, n_heads, chunk == 17 ? paged.view : s.view(),
                             &qs.q_pos[size_t(t0)], &qs.k_lo[size_t(t0)], parts.data() + t0 * row);
            }
            for (size_t i = 0; i < all.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(parts[i]), std::bit_cast<uint32_t>(all[i]))
                  << "hd=" << hd << " heads=" << n_heads << "/" << n_kv << " cap=" << c.cap << " chunk=" << chunk
                  << " i=" << i;
          }
          if (HasFatalFailure()) return;
        }
      }
  });
}

// A paged view whose blocks of B rows are slices of the slot gives bit for bit what the
// contiguous view gives, on every target, in position-major and head-major blocks: block
// sizes that split windows anywhere (1 row, odd sizes, the whole slot), windows, odd
// head_dim, GQA; and cpu::attention_batch over several such slots (one group each) equals
// each group alone.
TEST_P(CpuAttention, PagedBitIdenticalToContiguous) {
  testing::for_each_target([&] {
    uint32_t seed = 101;
    const int64_t N = 37, cap = 40;  // positions 0 .. 36 in a 40-row slot
    for (int64_t hd : {1, 5, 17, 64, 80, 130})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}}) {
        seed += 2;
        Slot whole(GetParam(), cap, n_kv, hd, N, seed);
        const int64_t esz = GetParam() == ops::KvDType::F32 ? 4 : 2;
        for (int64_t B : {1, 5, 8, 40}) {
          std::vector<ops::KvBlock> table;
          for (int64_t b = 0; b < cap / B; ++b)
            table.push_back({static_cast<char*>(whole.k()) + b * B * n_kv * hd * esz,
                             static_cast<char*>(whole.v()) + b * B * n_kv * hd * esz, nullptr, nullptr});
          ops::KvView paged = whole.view();
          paged.k = paged.v = nullptr;
          paged.block_rows = B;
          paged.blocks = table.data();
          const ops::testing::HeadMajorBlocks hm(whole.view(), B);  // the same rows in head-major blocks
          const ops::KvView& paged_hm = hm.view;
          // And in extents of 3 blocks, some neighbours joined into one run, some not.
          const ops::testing::HeadMajorBlocks hx(whole.view(), B, 3);
          for (int64_t window : {0, 5}) {
            const Queries qs = causal_chunk(30, 7, n_heads, hd, window, seed + 1);
            const int64_t T = qs.T();
            std::vector<float> one(size_t(T * n_heads * hd), NAN), two(one.size(), NAN);
            cpu::attention(qs.q.data(), T, n_heads, whole.view(), qs.q_pos.data(), qs.k_lo.data(), one.data());
            cpu::attention(qs.q.data(), T, n_heads, paged, qs.q_pos.data(), qs.k_lo.data(), two.data());
            for (size_t i = 0; i < one.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(one[i]), std::bit_cast<uint32_t>(two[i]))
                  << "hd=" << hd << " B=" << B << " window=" << window << " i=" << i;
            std::fill(two.begin(), two.end(), NAN);
            cpu::attention(qs.q.data(), T, n_heads, paged_hm, qs.q_pos.data(), qs.k_lo.data(), two.data());
            for (size_t i = 0; i < one.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(one[i]), std::bit_cast<uint32_t>(two[i]))
                  << "head-major: hd=" << hd << " B=" << B << " window=" << window << " i=" << i;
            std::fill(two.begin(), two.end(), NAN);
            cpu::attention(qs.q.data(), T, n_heads, hx.view, qs.q_pos.data(), qs.k_lo.data(), two.data());
            for (size_t i = 0; i < one.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(one[i]), std::bit_cast<uint32_t>(two[i]))
                  << "extents: hd=" << hd << " B=" << B << " window=" << window << " i=" << i;
            // The same rows split into two groups of one batched call, one contiguous, one paged.
            const int64_t h = T / 2, w = n_heads * hd;
            const ops::KvRowGroup groups[3] = {
                {whole.view(), 0, h / 2}, {paged, h / 2, h - h / 2}, {paged_hm, h, T - h}};
            std::vector<float> three(one.size(), NAN);
            cpu::attention_batch(qs.q.data(), T, n_heads, groups, 3, qs.q_pos.data(), qs.k_lo.data(), three.data());
            for (size_t i = 0; i < one.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(one[i]), std::bit_cast<uint32_t>(three[i]))
                  << "batched: hd=" << hd << " B=" << B << " i=" << i << " w=" << w;
          }
          if (HasFatalFailure()) return;
        }
      }
  });
}

// kv_write stores exactly what the reference stores: F16 conversion of every class of value
// (normals, halfway ties, subnormal results, overflow to inf, inf, nan, -0) bit for bit, on
// every target, through a ring.
TEST(CpuKvWrite, BitExactAgainstReference) {
  const int64_t n_kv = 3, hd = 21, row = n_kv * hd, T = 5, cap = 4;
  auto k_rows = random_floats(size_t(T * row), 1, -70000.f, 70000.f);
  auto v_rows = random_floats(size_t(T * row), 2, -1e-4f, 1e-4f);  // half subnormals
  const float specials[] = {INFINITY,         -INFINITY,        NAN,      -0.f,     65504.f, 65520.f, 65519.f,
                            1.f + 1.f / 2048, 1.f + 3.f / 2048, 5.96e-8f, 2.98e-8f, 1e-30f};
  for (size_t i = 0; i < std::size(specials); ++i) k_rows[i * 5] = v_rows[i * 3 + 1] = specials[i];
  const std::vector<int64_t> pos = {3, 4, 5, 6, 7};  // wraps the 4-row ring
  for (auto dt : {ops::KvDType::F16, ops::KvDType::F32}) {
    testing::for_each_target([&] {
      const size_t n = size_t(cap * row) * (dt == ops::KvDType::F16 ? 2 : 4);
      std::vector<unsigned char> k(n, 0xab), v(n, 0xcd), kr(n, 0xab), vr(n, 0xcd);
      cpu::kv_write(ops::testing::contiguous_view(dt, k.data(), v.data(), cap, n_kv, hd), k_rows.data(), v_rows.data(),
                    pos.data(), T);
      ops::ref::kv_write(ops::testing::contiguous_view(dt, kr.data(), vr.data(), cap, n_kv, hd), k_rows.data(),
                         v_rows.data(), pos.data(), T);
      ASSERT_EQ(k, kr);
      ASSERT_EQ(v, vr);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, CpuAttention, ::testing::Values(ops::KvDType::F32, ops::KvDType::F16),
                         [](const auto& info) { return info.param == ops::KvDType::F32 ? "F32" : "F16"; });

}  // namespace
}  // namespace tinyloop::cpu
