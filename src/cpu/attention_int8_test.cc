// INT8 KV (ops/kv_quant.h): the quantizer, the scalar reference attention against a double
// oracle over the dequantized rows, cpu::attention_int8 against the scalar reference on every
// compiled target (odd head_dim, GQA, ring wrap, windows, empty windows), batch / thread
// invariance bit for bit (any grouping of rows into tiles), head-major blocks against the
// contiguous slot bit for bit, and the public dispatch
// (ops::kv_write / ops::attention) on I8.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "cpu/thread_pool.h"
#include "ops/kv_quant.h"
#include "ops/reference.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::kU;
using ops::testing::random_floats;

// An I8 slot with positions 0 .. n_pos-1 written through the public ops::kv_write.
struct I8Slot {
  int64_t capacity, n_kv, hd;
  std::vector<int8_t> k, v;  // [capacity, n_kv, hd]
  std::vector<float> ks, vs;  // [capacity, n_kv]
  I8Slot(int64_t cap, int64_t nkv, int64_t d, int64_t n_pos, uint32_t seed) : capacity(cap), n_kv(nkv), hd(d) {
    k.assign(size_t(cap * nkv * d), 0);
    v.assign(k.size(), 0);
    ks.assign(size_t(cap * nkv), NAN);  // never-written rows: a read shows as nan
    vs.assign(ks.size(), NAN);
    std::vector<int64_t> pos(static_cast<size_t>(n_pos));
    for (int64_t p = 0; p < n_pos; ++p) pos[size_t(p)] = p;
    const auto kr = random_floats(size_t(n_pos * nkv * d), seed, -2.f, 2.f);
    const auto vr = random_floats(size_t(n_pos * nkv * d), seed + 1);
    ops::kv_write(ops::KvDType::I8, k.data(), v.data(), cap, nkv, d, kr.data(), vr.data(), pos.data(), n_pos, ks.data(),
                  vs.data());
  }
  ops::KvView view() const {
    ops::KvView kv;
    kv.dtype = ops::KvDType::I8;
    kv.k = k.data();
    kv.v = v.data();
    kv.capacity = capacity;
    kv.n_kv_heads = n_kv;
    kv.head_dim = hd;
    kv.k_scale = ks.data();
    kv.v_scale = vs.data();
    return kv;
  }
};

struct Queries {
  std::vector<float> q;  // [T, n_heads, hd]
  std::vector<int64_t> q_pos, k_lo;
  int64_t T() const { return int64_t(q_pos.size()); }
};

Queries causal_chunk(int64_t first, int64_t T, int64_t n_heads, int64_t hd, int64_t window, uint32_t seed) {
  Queries qs;
  qs.q = random_floats(size_t(T * n_heads * hd), seed);
  for (int64_t t = 0; t < T; ++t) {
    qs.q_pos.push_back(first + t);
    qs.k_lo.push_back(window > 0 ? std::max<int64_t>(0, first + t - window + 1) : 0);
  }
  return qs;
}

// SIMD vs scalar: the same bound as cpu/attention_test.cc (both kernels are float
// computations of the same convex combination; the int8 widening is exact, the scales add
// one rounding to each logit and each weight, covered by the + 8 of the bound).
void expect_close(const I8Slot& s, int64_t n_heads, const Queries& qs) {
  const int64_t T = qs.T(), hd = s.hd;
  std::vector<float> out(size_t(T * n_heads * hd), NAN), ref(out.size(), NAN);
  cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), out.data());
  ops::ref::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), ref.data());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = qs.q_pos[size_t(t)] - qs.k_lo[size_t(t)] + 1;
    double max_q = 0;
    for (int64_t i = 0; i < n_heads * hd; ++i)
      max_q = std::max(max_q, double(std::fabs(qs.q[size_t(t * n_heads * hd + i)])));
    const double max_qk = double(hd) * max_q * 2.0 / std::sqrt(double(hd));
    const double tol = 4 * kU * (2.0 * double(hd + 2) * max_qk + double(std::max<int64_t>(n, 0) + hd + 8));
    for (int64_t i = 0; i < n_heads * hd; ++i) {
      const size_t j = size_t(t * n_heads * hd + i);
      if (n <= 0) {
        ASSERT_EQ(out[j], 0.f);
        ASSERT_EQ(ref[j], 0.f);
        continue;
      }
      ASSERT_NEAR(out[j], ref[j], tol) << "t=" << t << " i=" << i << " hd=" << hd << " n=" << n;
    }
  }
}

TEST(KvQuant, RowRoundTrip) {
  for (int64_t n : {1, 3, 17, 64, 130}) {
    const auto x = random_floats(size_t(n), uint32_t(n), -3.f, 3.f);
    std::vector<int8_t> q(static_cast<size_t>(n));
    const float scale = ops::quantize_row_i8(x.data(), n, q.data());
    float amax = 0;
    for (float e : x) amax = std::max(amax, std::fabs(e));
    EXPECT_FLOAT_EQ(scale, amax / 127.f);
    int hits = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_LE(std::abs(int(q[size_t(i)])), 127);
      EXPECT_LE(std::fabs(q[size_t(i)] * scale - x[size_t(i)]), 0.5f * scale * (1 + 1e-5f)) << i;
      hits += std::abs(int(q[size_t(i)])) == 127;
    }
    EXPECT_GE(hits, 1);  // the largest element maps to +-127
  }
  std::vector<float> zeros(9, 0.f);
  std::vector<int8_t> q(9, 5);
  EXPECT_EQ(ops::quantize_row_i8(zeros.data(), 9, q.data()), 0.f);
  for (int8_t e : q) EXPECT_EQ(e, 0);
  // Subnormal rows (127 / amax overflows): zeros stay 0 and the rest round as any row's.
  const std::vector<float> tiny = {0.f, 1e-39f, -2e-39f, 0.f, 5e-40f, -0.f};
  std::vector<int8_t> qt(tiny.size());
  const float st = ops::quantize_row_i8(tiny.data(), int64_t(tiny.size()), qt.data());
  EXPECT_EQ(st, 2e-39f / 127.f);
  const std::vector<int8_t> want = {0, 64, -127, 0, 32, 0};  // 63.5 and 31.75 round to even / nearest
  for (size_t i = 0; i < tiny.size(); ++i) EXPECT_EQ(qt[i], want[i]) << i;
  // Below 127 x the least subnormal the scale itself is 0: an all-zero row.
  const std::vector<float> tinier = {1e-44f, -1e-45f};
  std::vector<int8_t> qz(2, 5);
  EXPECT_EQ(ops::quantize_row_i8(tinier.data(), 2, qz.data()), 0.f);
  EXPECT_EQ(qz[0], 0);
  EXPECT_EQ(qz[1], 0);
}

TEST(KvQuant, WriteNeedsScales) {
  std::vector<int8_t> k(8), v(8);
  std::vector<float> rows(8, 1.f);
  const int64_t pos = 0;
  EXPECT_THROW(ops::kv_write(ops::KvDType::I8, k.data(), v.data(), 1, 1, 8, rows.data(), rows.data(), &pos, 1),
               std::logic_error);
}

// The scalar reference equals a double computation over the dequantized rows.
TEST(KvQuant, ReferenceMatchesDequantizedOracle) {
  const int64_t hd = 17, n_kv = 2, n_heads = 6, group = n_heads / n_kv;
  I8Slot s(20, n_kv, hd, 20, 3);
  const Queries qs = causal_chunk(14, 6, n_heads, hd, 9, 4);
  std::vector<float> out(size_t(qs.T() * n_heads * hd));
  ops::ref::attention(qs.q.data(), qs.T(), n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), out.data());
  for (int64_t t = 0; t < qs.T(); ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> w;
      for (int64_t p = qs.k_lo[size_t(t)]; p <= qs.q_pos[size_t(t)]; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i)
          dot += double(qs.q[size_t((t * n_heads + h) * hd + i)]) *
                 double(s.k[size_t(((p % 20) * n_kv + g) * hd + i)]) * s.ks[size_t((p % 20) * n_kv + g)];
        w.push_back(dot / std::sqrt(double(hd)));
      }
      const double m = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (double& e : w) sum += (e = std::exp(e - m));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (size_t j = 0; j < w.size(); ++j) {
          const int64_t p = qs.k_lo[size_t(t)] + int64_t(j);
          o += w[j] * double(s.v[size_t(((p % 20) * n_kv + g) * hd + i)]) * s.vs[size_t((p % 20) * n_kv + g)];
        }
        ASSERT_NEAR(out[size_t((t * n_heads + h) * hd + i)], o / sum, 1e-5) << t << " " << h << " " << i;
      }
    }
}

TEST(CpuAttentionInt8, OddShapesAgainstReference) {
  testing::for_each_target([&] {
    uint32_t seed = 1;
    for (int64_t hd : {1, 5, 8, 16, 17, 64, 80, 130})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {6, 3}}) {
        I8Slot s(40, n_kv, hd, 37, seed += 2);
        expect_close(s, n_heads, causal_chunk(36, 1, n_heads, hd, 0, seed += 2));
        expect_close(s, n_heads, causal_chunk(30, 7, n_heads, hd, 0, seed += 2));
        expect_close(s, n_heads, causal_chunk(30, 7, n_heads, hd, 5, seed += 2));
        if (HasFatalFailure()) return;
      }
  });
}

TEST(CpuAttentionInt8, RingWrapLongWindowAndEmptyWindow) {
  testing::for_each_target([&] {
    I8Slot s(64, 2, 64, 300, 9);  // 300 positions through a 64-row ring
    expect_close(s, 4, causal_chunk(296, 4, 4, 64, 64, 10));
    I8Slot big(700, 1, 33, 700, 11);
    expect_close(big, 2, causal_chunk(699, 1, 2, 33, 0, 12));
    I8Slot small(8, 1, 16, 4, 13);
    Queries qs = causal_chunk(3, 2, 2, 16, 0, 14);
    qs.k_lo[1] = 5;  // k_lo > q_pos: a zero row
    expect_close(small, 2, qs);
  });
}

TEST(CpuAttentionInt8, BatchAndThreadInvariant) {
  testing::for_each_target([&] {
    for (int64_t hd : {17, 64}) {
      const int64_t n_heads = 6, T = 9, row = n_heads * hd;
      I8Slot s(48, 3, hd, 45, 15);
      const Queries qs = causal_chunk(36, T, n_heads, hd, 20, 16);
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

// Any grouping of query rows into calls (so into tiles of the kernel) gives the same bits:
// prefill chunks of 13 rows split 1/2/3/5 at a time, and unrelated rows (random positions
// and windows, some empty); odd head_dim and GQA groups of 1, 3 and 8.
TEST(CpuAttentionInt8, TilesAnyRowGroupingBitIdentical) {
  testing::for_each_target([&] {
    uint32_t seed = 51;
    for (int64_t hd : {5, 64, 130})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {6, 2}, {8, 1}}) {
        const int64_t N = 50;
        I8Slot s(64, n_kv, hd, N, seed += 2);
        for (bool unrelated : {false, true}) {
          Queries qs = causal_chunk(N - 13, 13, n_heads, hd, 0, seed += 2);
          if (unrelated) {
            std::mt19937 rng(seed);
            for (size_t t = 0; t < 13; ++t) {
              qs.q_pos[t] = int64_t(rng() % N);
              qs.k_lo[t] = t % 5 == 3 ? qs.q_pos[t] + 1 : int64_t(rng() % uint32_t(qs.q_pos[t] + 1));
            }
          }
          expect_close(s, n_heads, qs);
          const int64_t T = qs.T(), row = n_heads * hd;
          std::vector<float> all(size_t(T * row), NAN);
          cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), all.data());
          for (int64_t chunk : {1, 2, 3, 5}) {
            std::vector<float> parts(all.size(), NAN);
            for (int64_t t0 = 0; t0 < T; t0 += chunk)
              cpu::attention(qs.q.data() + t0 * row, std::min(chunk, T - t0), n_heads, s.view(), &qs.q_pos[size_t(t0)],
                             &qs.k_lo[size_t(t0)], parts.data() + t0 * row);
            for (size_t i = 0; i < all.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(parts[i]), std::bit_cast<uint32_t>(all[i]))
                  << "hd=" << hd << " heads=" << n_heads << "/" << n_kv << " chunk=" << chunk << " i=" << i;
          }
          if (HasFatalFailure()) return;
        }
      }
  });
}

// Head-major paged blocks (the KV cache's layout: a kv head's rows and scales contiguous,
// which the kernel reads four scales at a time) give bit for bit what the contiguous
// position-major slot gives (scales one at a time): decode rows, whose MHA heads run the
// one-item paths (8 keys a step where head_dim is not 1-4 vectors), and prefill chunks;
// blocks of 8 rows (runs of whole 4- and 8-key steps) and 24 (steps cut by block ends).
TEST(CpuAttentionInt8, HeadMajorBlocksBitIdenticalToContiguous) {
  testing::for_each_target([&] {
    uint32_t seed = 91;
    for (int64_t hd : {16, 40, 64, 80, 130})
      for (auto [n_heads, n_kv] : {std::pair<int64_t, int64_t>{3, 3}, {6, 2}})
        for (int64_t B : {8, 24}) {
          const int64_t cap = 96, N = 90, row = n_heads * hd;
          I8Slot s(cap, n_kv, hd, N, seed += 2);
          const ops::testing::HeadMajorBlocks hm(s.view(), B);
          const ops::testing::HeadMajorBlocks hx(s.view(), B, 4);  // extents: runs joined and not
          for (Queries qs :
               {causal_chunk(N - 1, 1, n_heads, hd, 0, seed + 1), causal_chunk(61, 1, n_heads, hd, 0, seed + 2),
                causal_chunk(N - 1, 1, n_heads, hd, 37, seed + 3),
                causal_chunk(N - 13, 13, n_heads, hd, 0, seed + 4)}) {
            const int64_t T = qs.T();
            std::vector<float> want(size_t(T * row), NAN), got(want.size(), NAN);
            cpu::attention(qs.q.data(), T, n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), want.data());
            cpu::attention(qs.q.data(), T, n_heads, hm.view, qs.q_pos.data(), qs.k_lo.data(), got.data());
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << "hd=" << hd << " heads=" << n_heads << "/" << n_kv << " B=" << B << " T=" << T << " i=" << i;
            std::fill(got.begin(), got.end(), NAN);
            cpu::attention(qs.q.data(), T, n_heads, hx.view, qs.q_pos.data(), qs.k_lo.data(), got.data());
            for (size_t i = 0; i < want.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << "extents: hd=" << hd << " heads=" << n_heads << "/" << n_kv << " B=" << B << " T=" << T
                  << " i=" << i;
          }
        }
  });
}

// kv_write of T rows == T single-row writes (bytes and scales), and the public dispatch runs
// the SIMD kernel, which stays close to attention over the float32 rows it was made from.
TEST(CpuAttentionInt8, DispatchWriteBatchInvariantAndCloseToF32) {
  const int64_t cap = 24, n_kv = 2, hd = 40, n_pos = 24, n_heads = 4;
  const auto kr = random_floats(size_t(n_pos * n_kv * hd), 21, -2.f, 2.f);
  const auto vr = random_floats(size_t(n_pos * n_kv * hd), 22);
  std::vector<int64_t> pos(static_cast<size_t>(n_pos));
  for (int64_t p = 0; p < n_pos; ++p) pos[size_t(p)] = p;
  I8Slot s(cap, n_kv, hd, 0, 1);  // empty
  ops::kv_write(ops::KvDType::I8, s.k.data(), s.v.data(), cap, n_kv, hd, kr.data(), vr.data(), pos.data(), n_pos,
                s.ks.data(), s.vs.data());
  I8Slot one(cap, n_kv, hd, 0, 1);
  for (int64_t p = 0; p < n_pos; ++p)
    ops::kv_write(ops::KvDType::I8, one.k.data(), one.v.data(), cap, n_kv, hd, kr.data() + p * n_kv * hd,
                  vr.data() + p * n_kv * hd, &pos[size_t(p)], 1, one.ks.data(), one.vs.data());
  EXPECT_EQ(s.k, one.k);
  EXPECT_EQ(s.v, one.v);
  EXPECT_EQ(s.ks, one.ks);
  EXPECT_EQ(s.vs, one.vs);

  ops::KvView f32;
  f32.dtype = ops::KvDType::F32;
  f32.k = kr.data();
  f32.v = vr.data();
  f32.capacity = cap;
  f32.n_kv_heads = n_kv;
  f32.head_dim = hd;
  const Queries qs = causal_chunk(18, 6, n_heads, hd, 0, 23);
  std::vector<float> a(size_t(qs.T() * n_heads * hd)), b(a.size());
  ops::attention(qs.q.data(), qs.T(), n_heads, s.view(), qs.q_pos.data(), qs.k_lo.data(), a.data());
  ops::attention(qs.q.data(), qs.T(), n_heads, f32, qs.q_pos.data(), qs.k_lo.data(), b.data());
  double err = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, double(std::fabs(a[i] - b[i])));
  EXPECT_LT(err, 2e-2);  // int8 rounding of |v| <= 1 rows: ~1/254 per element, averaged
  EXPECT_GT(err, 0.0);
}

}  // namespace
}  // namespace tinyloop::cpu
