// kv_write + attention against a naive double softmax over the full K/V history (kept here
// by absolute position, not through the ring, so the ring indexing is checked too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "ops/ops.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::kU;
using testing::random_floats;

struct Slot {
  KvDType dtype;
  int64_t capacity, n_kv, hd;
  std::vector<float> kf, vf;  // [capacity, n_kv, hd] when F32
  std::vector<uint16_t> kh, vh;  // [capacity, n_kv, hd] when F16
  // History by absolute position: the values as stored (fp16-rounded for F16), [n_kv, hd].
  std::map<int64_t, std::vector<double>> k_hist, v_hist;

  Slot(KvDType dt, int64_t cap, int64_t nkv, int64_t d) : dtype(dt), capacity(cap), n_kv(nkv), hd(d) {
    const size_t n = size_t(cap * nkv * d);
    if (dt == KvDType::F32) {
      kf.assign(n, NAN);  // unwritten rows are nan: reading one would show in the output
      vf.assign(n, NAN);
    } else {
      kh.assign(n, 0x7e00);
      vh.assign(n, 0x7e00);
    }
  }
  void* k() { return dtype == KvDType::F32 ? (void*)kf.data() : (void*)kh.data(); }
  void* v() { return dtype == KvDType::F32 ? (void*)vf.data() : (void*)vh.data(); }
  KvView view() {
    KvView kv;
    kv.dtype = dtype;
    kv.k = k();
    kv.v = v();
    kv.capacity = capacity;
    kv.n_kv_heads = n_kv;
    kv.head_dim = hd;
    return kv;
  }
  double stored(float f) const { return dtype == KvDType::F32 ? f : f16_to_f32(f32_to_f16(f)); }
  // Write T rows for positions pos[T], values random in [-1, 1].
  void write(const std::vector<int64_t>& pos, uint32_t seed) {
    const int64_t T = int64_t(pos.size()), row = n_kv * hd;
    const auto kr = random_floats(size_t(T * row), seed);
    const auto vr = random_floats(size_t(T * row), seed + 1000);
    kv_write(dtype, k(), v(), capacity, n_kv, hd, kr.data(), vr.data(), pos.data(), T);
    for (int64_t t = 0; t < T; ++t) {
      auto& kh_ = k_hist[pos[t]];
      auto& vh_ = v_hist[pos[t]];
      kh_.resize(size_t(row));
      vh_.resize(size_t(row));
      for (int64_t i = 0; i < row; ++i) {
        kh_[i] = stored(kr[t * row + i]);
        vh_[i] = stored(vr[t * row + i]);
      }
    }
  }
};

// Runs attention and compares with the naive double softmax.
//   q [T, n_heads, hd]
void check(Slot& s, int64_t n_heads, const std::vector<float>& q, const std::vector<int64_t>& q_pos,
           const std::vector<int64_t>& k_lo) {
  const int64_t T = int64_t(q_pos.size()), hd = s.hd;
  std::vector<float> out(size_t(T * n_heads * hd), NAN);
  attention(q.data(), T, n_heads, s.view(), q_pos.data(), k_lo.data(), out.data());
  const int64_t group = n_heads / s.n_kv;
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t g = h / group;
      const float* qh = q.data() + (t * n_heads + h) * hd;
      std::vector<double> sc;
      double max_qk = 0, max_v = 0;
      for (int64_t p = k_lo[t]; p <= q_pos[t]; ++p) {
        const auto& kr = s.k_hist.at(p);
        double d = 0, m = 0;
        for (int64_t i = 0; i < hd; ++i) {
          d += qh[i] * kr[g * hd + i];
          m += std::fabs(qh[i] * kr[g * hd + i]);
        }
        sc.push_back(d * scale);
        max_qk = std::max(max_qk, m * scale);
        for (int64_t i = 0; i < hd; ++i) max_v = std::max(max_v, std::fabs(s.v_hist.at(p)[g * hd + i]));
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      const int64_t n = int64_t(sc.size());
      // Logit errors <= (hd + 2) u max_qk (dot + scale); each weight then carries that
      // error twice (its own logit and the max) plus exp/subtract roundings; the float sums
      // over n keys add (n + hd) u. The output is a convex combination of V rows, so the
      // error is <= max|v| * (2 (hd + 2) max_qk + n + hd + 8) u; doubled for margin.
      const double tol = 2 * max_v * kU * (2.0 * double(hd + 2) * max_qk + double(n + hd + 8));
      for (int64_t i = 0; i < hd; ++i) {
        double ref = 0;
        for (int64_t j = 0; j < n; ++j) ref += sc[j] * s.v_hist.at(k_lo[t] + j)[g * hd + i];
        ref /= sum;
        ASSERT_NEAR(out[(t * n_heads + h) * hd + i], ref, tol)
            << "t=" << t << " h=" << h << " i=" << i << " window=[" << k_lo[t] << "," << q_pos[t] << "]";
      }
    }
}

class Attention : public ::testing::TestWithParam<KvDType> {};

TEST_P(Attention, MhaSingleQuery) {
  Slot s(GetParam(), 32, 4, 8);
  s.write({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 1);
  check(s, 4, random_floats(4 * 8, 2), {9}, {0});
}

TEST_P(Attention, GqaCausalChunk) {
  for (int64_t n_kv : {2, 3}) {  // n_heads = 6: groups of 3 and of 2
    Slot s(GetParam(), 16, n_kv, 5);
    s.write({0, 1, 2, 3, 4, 5, 6}, 3);
    // A prefill chunk of 3 new rows after 7 cached ones, causal: each sees up to itself.
    s.write({7, 8, 9}, 4);
    check(s, 6, random_floats(3 * 6 * 5, 5), {7, 8, 9}, {0, 0, 0});
    // Sliding windows with k_lo > 0, different per row.
    check(s, 6, random_floats(3 * 6 * 5, 6), {7, 8, 9}, {4, 6, 9});
  }
}

TEST_P(Attention, RingWrapDecode) {
  // capacity 5, 23 positions decoded one at a time with a window of the last 5 keys: row
  // p % 5 is overwritten every 5 steps; the oracle reads the true history by position.
  Slot s(GetParam(), 5, 2, 4);
  for (int64_t p = 0; p < 23; ++p) {
    s.write({p}, uint32_t(10 + p));
    check(s, 6, random_floats(6 * 4, uint32_t(100 + p)), {p}, {std::max<int64_t>(0, p - 4)});
  }
}

TEST_P(Attention, RingWrapChunk) {
  // Chunks of T = 3 into a ring of 7: after writing a chunk, query t may look back
  // capacity - T = 4 rows before the chunk's first position without reading an overwritten row.
  const int64_t cap = 7, T = 3;
  Slot s(GetParam(), cap, 3, 6);
  for (int64_t p0 = 0; p0 < 20; p0 += T) {
    std::vector<int64_t> pos, lo;
    for (int64_t t = 0; t < T; ++t) {
      pos.push_back(p0 + t);
      lo.push_back(std::max<int64_t>(0, p0 - (cap - T)));
    }
    s.write(pos, uint32_t(200 + p0));
    check(s, 3, random_floats(size_t(T * 3 * 6), uint32_t(300 + p0)), pos, lo);
  }
}

TEST_P(Attention, LargeLogitsAreStable) {
  // Logits in the hundreds (exp overflows float past ~88.7): without the max subtracted the
  // weights would be inf / inf = nan.
  Slot s(GetParam(), 8, 1, 16);
  s.write({0, 1, 2, 3, 4, 5}, 7);
  auto q = random_floats(2 * 16, 8, -1000.f, 1000.f);
  check(s, 2, q, {5}, {0});
}

TEST_P(Attention, EmptyWindowGivesZeros) {
  Slot s(GetParam(), 4, 1, 4);
  s.write({0}, 9);
  const auto q = random_floats(4, 10);
  const int64_t qp = 0, lo = 1;
  std::vector<float> out(4, NAN);
  attention(q.data(), 1, 1, s.view(), &qp, &lo, out.data());
  for (float o : out) EXPECT_EQ(o, 0.f);
}

INSTANTIATE_TEST_SUITE_P(Storage, Attention, ::testing::Values(KvDType::F32, KvDType::F16),
                         [](const auto& info) { return std::string(info.param == KvDType::F32 ? "F32" : "F16"); });

TEST(KvWrite, StoresRoundedRowsAtPosModCapacity) {
  const int64_t cap = 3, nkv = 2, hd = 3, row = nkv * hd;
  const std::vector<int64_t> pos = {4, 5};  // rows 1 and 2
  const auto kr = random_floats(size_t(2 * row), 1), vr = random_floats(size_t(2 * row), 2);
  std::vector<uint16_t> k(size_t(cap * row), 0), v(size_t(cap * row), 0);
  kv_write(KvDType::F16, k.data(), v.data(), cap, nkv, hd, kr.data(), vr.data(), pos.data(), 2);
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_EQ(k[size_t(i)], 0);  // row 0 untouched
    EXPECT_EQ(k[size_t(row + i)], f32_to_f16(kr[size_t(i)]));
    EXPECT_EQ(v[size_t(2 * row + i)], f32_to_f16(vr[size_t(row + i)]));
  }
  std::vector<float> kf(size_t(cap * row), 0), vf(size_t(cap * row), 0);
  kv_write(KvDType::F32, kf.data(), vf.data(), cap, nkv, hd, kr.data(), vr.data(), pos.data(), 2);
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_EQ(kf[size_t(row + i)], kr[size_t(i)]);
    EXPECT_EQ(vf[size_t(2 * row + i)], vr[size_t(row + i)]);
  }
}

}  // namespace
}  // namespace tinyloop::ops
