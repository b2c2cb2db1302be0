// attention_segments over a prefix slot + a tail slot against attention over one slot holding
// the same rows: bit-identical (scalar vs scalar, dispatched vs dispatched), on odd sizes,
// GQA, F32 and F16 storage. The SIMD kernel per Highway target: src/cpu/attention_test.cc.
#include "ops/attention_segments.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "ops/reference.h"

namespace tinyloop::ops {
namespace {

struct Slot {
  std::vector<uint8_t> k, v;  // [capacity, n_kv, hd] in the dtype's width
  KvView view;
};

Slot make_slot(KvDType dt, int64_t cap, int64_t n_kv, int64_t hd) {
  const size_t bytes = size_t(cap * n_kv * hd) * (dt == KvDType::F32 ? 4 : 2);
  Slot s{std::vector<uint8_t>(bytes), std::vector<uint8_t>(bytes), {}};
  s.view = KvView{dt, s.k.data(), s.v.data(), cap, n_kv, hd};
  return s;
}

void write(Slot& s, const float* k, const float* v, const int64_t* pos, int64_t T) {
  kv_write(s.view.dtype, s.k.data(), s.v.data(), s.view.capacity, s.view.n_kv_heads,
           s.view.head_dim, k, v, pos, T);
}

struct Case {
  KvDType dt;
  int64_t n_heads, n_kv, hd, P, S;  // prefix length P, tail length S
  int64_t tail_cap;                 // tail slot rows (>= S; rows are p % tail_cap)
};

void check(const Case& c) {
  std::mt19937 rng(1234 + uint32_t(c.hd * 7 + c.P));
  std::normal_distribution<float> nd(0.f, 1.5f);
  const int64_t N = c.P + c.S, kw = c.n_kv * c.hd, qw = c.n_heads * c.hd;
  std::vector<float> k(size_t(N * kw)), v(size_t(N * kw));  // [N, n_kv, hd]
  std::vector<float> q(size_t(c.S * qw));                   // [S, n_heads, hd] tail queries
  for (auto* b : {&k, &v, &q})
    for (auto& x : *b) x = nd(rng);
  std::vector<int64_t> pos(static_cast<size_t>(N));  // [N]
  for (int64_t p = 0; p < N; ++p) pos[size_t(p)] = p;

  Slot whole = make_slot(c.dt, N, c.n_kv, c.hd);        // reference: one slot, every row
  Slot pre = make_slot(c.dt, c.P, c.n_kv, c.hd);        // positions 0 .. P-1
  Slot tail = make_slot(c.dt, c.tail_cap, c.n_kv, c.hd);  // positions P .. N-1
  write(whole, k.data(), v.data(), pos.data(), N);
  write(pre, k.data(), v.data(), pos.data(), c.P);
  write(tail, k.data() + c.P * kw, v.data() + c.P * kw, pos.data() + c.P, c.S);

  // Causal queries at P .. N-1, one with a window starting inside the prefix (k_lo > 0).
  std::vector<int64_t> qpos(pos.begin() + c.P, pos.end()), klo(size_t(c.S), 0);  // [S]
  if (c.S > 1) klo[1] = c.P / 2;
  // The scalar two-segment version against the scalar reference over one slot.
  std::vector<float> want(q.size()), got(q.size(), -1.f);  // [S, n_heads, hd]
  ref::attention(q.data(), c.S, c.n_heads, whole.view, qpos.data(), klo.data(), want.data());
  ref::attention_segments(q.data(), c.S, c.n_heads, pre.view, c.P, tail.view, qpos.data(),
                          klo.data(), got.data());
  ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
      << "scalar P=" << c.P << " S=" << c.S << " hd=" << c.hd;

  // The dispatched ops against each other (the SIMD kernel, or the scalar one under
  // TINYLOOP_FORCE_SCALAR=1, the ops_test.scalar_reference run): bit-identical too.
  std::vector<float> one(q.size()), two(q.size(), -1.f);  // [S, n_heads, hd]
  attention(q.data(), c.S, c.n_heads, whole.view, qpos.data(), klo.data(), one.data());
  attention_segments(q.data(), c.S, c.n_heads, pre.view, c.P, tail.view, qpos.data(),
                     klo.data(), two.data());
  ASSERT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)))
      << "dispatched P=" << c.P << " S=" << c.S << " hd=" << c.hd;
}

TEST(AttentionSegments, MatchesSingleSlotF32OddSizes) {
  check({KvDType::F32, 6, 2, 13, 7, 5, 5});
  check({KvDType::F32, 3, 3, 9, 1, 1, 1});
  check({KvDType::F32, 4, 1, 33, 17, 3, 8});  // tail ring rows p % 8
}

TEST(AttentionSegments, MatchesSingleSlotF16) {
  check({KvDType::F16, 6, 2, 13, 7, 5, 5});
  check({KvDType::F16, 2, 1, 64, 31, 9, 11});
}

TEST(AttentionSegments, EmptyWindowGivesZeros) {
  Slot pre = make_slot(KvDType::F32, 3, 1, 5), tail = make_slot(KvDType::F32, 2, 1, 5);
  std::vector<float> q(10, 1.f), out(10, 7.f);  // [1, 2, 5]
  const int64_t qp = 3, lo = 4;
  attention_segments(q.data(), 1, 2, pre.view, 3, tail.view, &qp, &lo, out.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
  std::fill(out.begin(), out.end(), 7.f);
  ref::attention_segments(q.data(), 1, 2, pre.view, 3, tail.view, &qp, &lo, out.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
}

}  // namespace
}  // namespace tinyloop::ops
