// Paged KV slots (ops.h KvView::blocks) against contiguous ones holding the same rows:
// kv_write stores the same bytes, attention gives the same bits (dispatched path; the
// scalar reference when the suite runs with TINYLOOP_FORCE_SCALAR=1), for F32, F16 and INT8
// storage, odd head sizes, GQA, windows, blocks placed in shuffled order in one pool and
// blocks a window no longer sees left null; the paged blocks in both orders (position-major,
// and head-major as the KV cache keeps them: KvView::head_major). attention_batch over many groups equals each
// group alone, bit for bit (the serving engine's batched forward rests on it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ops/ops.h"
#include "ops/test_util.h"

namespace tinyloop::ops {
namespace {

using testing::random_floats;

int64_t elem_bytes(KvDType dt) { return dt == KvDType::F32 ? 4 : dt == KvDType::F16 ? 2 : 1; }

// One slot stored twice: contiguous [cap, n_kv, hd] buffers, and `cap / B` blocks of B rows
// scattered over a pool in a random order, position-major or head-major inside a block.
struct TwinSlot {
  KvDType dt;
  int64_t cap, n_kv, hd, B;
  bool head_major;
  std::vector<uint8_t> ck, cv;  // contiguous values
  std::vector<float> cks, cvs;  // contiguous I8 scales [cap, n_kv]
  std::vector<uint8_t> pool;  // [n_blocks][K | V] values
  std::vector<float> pool_scales;  // [n_blocks][K | V][B, n_kv]
  std::vector<KvBlock> table;  // [cap / B]

  TwinSlot(KvDType d, int64_t cap_, int64_t nkv, int64_t h, int64_t B_, uint32_t seed, bool hm)
      : dt(d), cap(cap_), n_kv(nkv), hd(h), B(B_), head_major(hm) {
    const int64_t row = n_kv * hd * elem_bytes(dt), nb = cap / B;
    ck.assign(size_t(cap * row), 0xff);  // unwritten rows: NaN patterns for float dtypes
    cv.assign(size_t(cap * row), 0xff);
    cks.assign(size_t(cap * n_kv), 0.f);
    cvs.assign(size_t(cap * n_kv), 0.f);
    pool.assign(size_t(nb * 2 * B * row), 0xff);
    pool_scales.assign(size_t(nb * 2 * B * n_kv), 0.f);
    std::vector<int64_t> order(static_cast<size_t>(nb));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t id = order[size_t(b)];
      KvBlock k;
      k.k = pool.data() + id * 2 * B * row;
      k.v = pool.data() + id * 2 * B * row + B * row;
      if (dt == KvDType::I8) {
        k.k_scale = pool_scales.data() + id * 2 * B * n_kv;
        k.v_scale = k.k_scale + B * n_kv;
      }
      table.push_back(k);
    }
  }
  KvView contiguous() const {
    KvView v;
    v.dtype = dt;
    v.k = ck.data();
    v.v = cv.data();
    v.capacity = cap;
    v.n_kv_heads = n_kv;
    v.head_dim = hd;
    if (dt == KvDType::I8) {
      v.k_scale = cks.data();
      v.v_scale = cvs.data();
    }
    return v;
  }
  KvView paged() const {
    KvView v;
    v.dtype = dt;
    v.capacity = cap;
    v.n_kv_heads = n_kv;
    v.head_dim = hd;
    v.block_rows = B;
    v.blocks = table.data();
    v.head_major = head_major;
    return v;
  }
  // Writes rows for positions pos[T] into both copies.
  void write(const std::vector<int64_t>& pos, uint32_t seed) {
    const int64_t T = int64_t(pos.size()), row = n_kv * hd;
    const auto kr = random_floats(size_t(T * row), seed, -2.f, 2.f);
    const auto vr = random_floats(size_t(T * row), seed + 7, -2.f, 2.f);
    kv_write(contiguous(), kr.data(), vr.data(), pos.data(), T);
    kv_write(paged(), kr.data(), vr.data(), pos.data(), T);
  }
  // The stored bytes of ring row r, contiguous vs paged.
  bool same_row(int64_t r) const {
    return testing::position_bytes(contiguous(), r) == testing::position_bytes(paged(), r);
  }
};

struct Case {
  KvDType dt;
  int64_t n_heads, n_kv, hd, cap, B, N, window;  // N positions written (> cap: a ring)
  bool head_major = false;
};

void expect_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

void check(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "dtype " << int(c.dt) << " heads " << c.n_heads << "/" << c.n_kv << " hd "
                                    << c.hd << " cap " << c.cap << " B " << c.B << " N " << c.N << " window "
                                    << c.window << " head-major " << c.head_major);
  TwinSlot s(c.dt, c.cap, c.n_kv, c.hd, c.B, uint32_t(c.hd * 31 + c.N), c.head_major);
  std::vector<int64_t> pos;
  for (int64_t p = 0; p < c.N; ++p) pos.push_back(p);
  // Written in a few chunks, as prefill + decode would.
  for (int64_t p0 = 0, i = 0; p0 < c.N; p0 += 5 + 3 * i, ++i) {
    const int64_t n = std::min<int64_t>(5 + 3 * i, c.N - p0);
    s.write(std::vector<int64_t>(pos.begin() + p0, pos.begin() + p0 + n), uint32_t(p0 + 11));
  }
  for (int64_t r = 0; r < c.cap; ++r) ASSERT_TRUE(s.same_row(r)) << "ring row " << r;

  // The last queries: every window lies in the ring (window <= cap when it wraps).
  const int64_t T = std::min<int64_t>(7, c.N);
  std::vector<int64_t> qpos, klo;
  for (int64_t t = c.N - T; t < c.N; ++t) {
    qpos.push_back(t);
    klo.push_back(c.window > 0 ? std::max<int64_t>(0, t - c.window + 1) : 0);
  }
  // A block the window can no longer see is never read: null it in the paged table.
  TwinSlot& m = s;
  const int64_t oldest = klo.front();
  std::vector<KvBlock> saved = m.table;
  if (c.N <= c.cap)
    for (int64_t b = 0; (b + 1) * c.B <= oldest; ++b) m.table[size_t(b)] = KvBlock{};
  const auto q = random_floats(size_t(T * c.n_heads * c.hd), 99, -1.5f, 1.5f);
  std::vector<float> a(q.size(), -1.f), b(q.size(), -2.f);
  attention(q.data(), T, c.n_heads, s.contiguous(), qpos.data(), klo.data(), a.data());
  attention(q.data(), T, c.n_heads, s.paged(), qpos.data(), klo.data(), b.data());
  expect_bits(a, b);
  m.table = saved;
}

TEST(PagedAttention, MatchesContiguousBitForBit) {
  for (KvDType dt : {KvDType::F32, KvDType::F16, KvDType::I8})
    for (bool hm : {false, true}) {
      check({dt, 4, 4, 16, 64, 16, 50, 0, hm});  // MHA, partial last block
      check({dt, 6, 2, 13, 96, 32, 96, 0, hm});  // GQA, odd head_dim, full blocks
      check({dt, 8, 2, 64, 128, 16, 77, 20, hm});  // window inside the sequence, nulled blocks
      check({dt, 3, 1, 7, 32, 8, 70, 24, hm});  // ring: positions wrap the block table
      check({dt, 2, 2, 96, 64, 64, 64, 0, hm});  // one block (paged == one contiguous run)
      check({dt, 4, 1, 128, 256, 32, 250, 0, hm});  // long head_dim, many blocks
      check({dt, 5, 5, 33, 96, 1, 90, 0, hm});  // one-row blocks, head_dim not a vector multiple
    }
}

// attention_batch: groups of rows from different slots (different dtypes' shapes fixed per
// call, lengths, windows) in one call, each row equal to its group computed alone.
TEST(PagedAttention, BatchEqualsEachGroupAlone) {
  for (KvDType dt : {KvDType::F32, KvDType::F16, KvDType::I8}) {
    const int64_t n_heads = 6, n_kv = 3, hd = 24, B = 16;
    std::vector<TwinSlot> slots;
    std::vector<int64_t> lens = {1, 40, 17, 120, 64, 3};
    for (size_t i = 0; i < lens.size(); ++i) {
      slots.emplace_back(dt, 128, n_kv, hd, B, uint32_t(5 + i), i % 2 == 1);  // both orders in one call
      std::vector<int64_t> pos;
      for (int64_t p = 0; p < lens[i]; ++p) pos.push_back(p);
      slots.back().write(pos, uint32_t(100 + i));
    }
    // Group i: its last rows_i positions as queries (a prefill chunk or one decode row).
    std::vector<int64_t> rows = {1, 5, 1, 9, 1, 3};
    std::vector<KvRowGroup> groups;
    std::vector<int64_t> qpos, klo;
    int64_t T = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      KvRowGroup g;
      g.kv = slots[i].paged();
      g.begin = T;
      g.rows = rows[i];
      groups.push_back(g);
      for (int64_t r = 0; r < rows[i]; ++r) {
        const int64_t p = lens[i] - rows[i] + r;
        qpos.push_back(p);
        klo.push_back(i == 3 ? std::max<int64_t>(0, p - 30) : 0);  // one windowed group
      }
      T += rows[i];
    }
    const int64_t w = n_heads * hd;
    const auto q = random_floats(size_t(T * w), 7, -1.f, 1.f);
    std::vector<float> all(size_t(T * w), -3.f);
    attention_batch(q.data(), T, n_heads, groups.data(), int64_t(groups.size()), qpos.data(), klo.data(), all.data());
    for (const KvRowGroup& g : groups) {
      std::vector<float> alone(size_t(g.rows * w), -4.f);
      attention(q.data() + g.begin * w, g.rows, n_heads, g.kv, qpos.data() + g.begin, klo.data() + g.begin,
                alone.data());
      std::vector<float> got(all.begin() + g.begin * w, all.begin() + (g.begin + g.rows) * w);
      expect_bits(alone, got);
    }
  }
}

}  // namespace
}  // namespace tinyloop::ops
