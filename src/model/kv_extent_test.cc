// KV pools laid out in extents (model/kv_pool.h): E blocks share one head-major extent, so a
// kv head's runs of blocks side by side are one stream. Checked here: every block's parts
// are its own bytes (no two blocks overlap, whatever the dtype, extent or odd head size),
// block i + 1's run of a head follows block i's, the pool keeps a slot's blocks side by
// side (allocate's `after`), its free lists against a plain model under random traffic, and
// caches on such a pool: writes, copy_row, copy-on-write and a clone read back exactly.
#include "model/kv_cache.h"
#include "model/kv_pool.h"

#include "ops/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace tinyloop::model {
namespace {

ModelConfig config(int64_t n_kv, int64_t hd) {
  ModelConfig c;
  c.n_kv_heads = n_kv;
  c.head_dim = hd;
  c.n_pre_blocks = 1;
  c.n_loop_layers = 2;
  c.n_post_blocks = 1;
  return c;
}

int64_t elem_bytes(ops::KvDType t) { return t == ops::KvDType::F32 ? 4 : t == ops::KvDType::F16 ? 2 : 1; }

// Every byte a block owns: each kv head's run of values (K and V) and of scales (I8), as
// [begin, end) byte ranges.
std::vector<std::pair<const uint8_t*, const uint8_t*>> block_ranges(const KvBlockLayout& l, const ops::KvBlock& b) {
  const int64_t hb = l.head_dim * elem_bytes(l.dtype), run = l.rows * hb;
  std::vector<std::pair<const uint8_t*, const uint8_t*>> out;
  for (int64_t g = 0; g < l.n_kv_heads; ++g) {
    for (const void* area : {b.k, b.v}) {
      const auto* p = static_cast<const uint8_t*>(area) + g * l.head_rows() * hb;
      out.push_back({p, p + run});
    }
    if (l.dtype == ops::KvDType::I8)
      for (const float* sc : {b.k_scale, b.v_scale}) {
        const auto* p = reinterpret_cast<const uint8_t*>(sc + g * l.head_rows());
        out.push_back({p, p + l.rows * int64_t(sizeof(float))});
      }
  }
  return out;
}

// No two blocks of a pool share a byte, and all of them lie inside its arenas' bytes (the
// pool's arena_bytes in all), for extents of 1, 3 and 16 blocks, every K/V dtype and an odd
// head size.
TEST(KvExtent, BlocksOwnTheirBytes) {
  for (auto dt : {ops::KvDType::F32, ops::KvDType::F16, ops::KvDType::I8})
    for (int64_t E : {1, 3, 16})
      for (int64_t rows : {1, 5, 32}) {
        const KvBlockLayout l(config(3, 7), dt, rows, E);
        EXPECT_EQ(l.head_rows(), E * rows);
        KvPool pool(l, 2 * E, 2 * E, nullptr);
        ASSERT_EQ(pool.max_blocks(), 2 * E);
        std::vector<std::pair<const uint8_t*, const uint8_t*>> all;
        for (int64_t i = 0; i < 2 * E; ++i) {
          const auto r = block_ranges(l, pool.block(pool.allocate()));
          all.insert(all.end(), r.begin(), r.end());
        }
        std::sort(all.begin(), all.end());
        int64_t owned = 0;
        for (size_t i = 0; i < all.size(); ++i) {
          owned += all[i].second - all[i].first;
          if (i > 0) {
            EXPECT_LE(all[i - 1].second, all[i].first) << "dtype " << int(dt) << " E " << E;
          }
        }
        EXPECT_LE(all.back().second - all.front().first, pool.arena_bytes());
        EXPECT_EQ(owned, 2 * E * rows * l.bytes_per_position());
      }
}

// Block i + 1 of an extent continues block i's run of every kv head (values and scales), and
// a pool's blocks are handed out so that a slot's blocks are such neighbours: `after`'s next
// block while it is free and in after's extent, else a wholly free extent's first block, else
// the most recently freed block.
TEST(KvExtent, SlotBlocksSideBySide) {
  const KvBlockLayout l(config(2, 4), ops::KvDType::I8, 8, 4);
  KvPool pool(l, 18, 18, nullptr);  // a budget rounds down to whole extents
  EXPECT_EQ(pool.max_blocks(), 16);
  const int32_t a0 = pool.allocate(), b0 = pool.allocate();  // two slots start two extents
  EXPECT_EQ(a0, 0);
  EXPECT_EQ(b0, 4);
  const int32_t a1 = pool.allocate(a0), b1 = pool.allocate(b0), a2 = pool.allocate(a1);
  EXPECT_EQ(a1, 1);
  EXPECT_EQ(b1, 5);
  EXPECT_EQ(a2, 2);
  for (int32_t id : {a0, a1}) {
    const ops::KvBlock x = pool.block(id), y = pool.block(id + 1);
    for (int64_t g = 0; g < 2; ++g) {
      const int64_t hr = l.head_rows(), hb = 4;  // int8 values: head_dim bytes a row
      EXPECT_EQ(static_cast<uint8_t*>(x.k) + (g * hr + 8) * hb, static_cast<uint8_t*>(y.k) + g * hr * hb);
      EXPECT_EQ(static_cast<uint8_t*>(x.v) + (g * hr + 8) * hb, static_cast<uint8_t*>(y.v) + g * hr * hb);
      EXPECT_EQ(x.k_scale + g * hr + 8, y.k_scale + g * hr);
      EXPECT_EQ(x.v_scale + g * hr + 8, y.v_scale + g * hr);
    }
  }
  const int32_t a3 = pool.allocate(a2);
  EXPECT_EQ(a3, 3);
  EXPECT_EQ(pool.allocate(a3), 8);  // extent 0 is full: the next wholly free extent
  EXPECT_EQ(pool.allocate(), 12);
  pool.release(b1);  // block 5 is free again, beside b0
  EXPECT_EQ(pool.allocate(b0), 5);
  // No wholly free extent left: the most recently freed block, wherever it is.
  pool.release(a1);
  EXPECT_EQ(pool.allocate(), a1);
  // A block past its extent's end is never `after`'s neighbour.
  EXPECT_NE(pool.allocate(a3), 4);
  // A fresh pool's extent 0, freed whole, is wholly free again.
  for (int32_t id : {a0, a1, a2, a3}) pool.release(id);
  EXPECT_EQ(pool.allocate(), 0);
}

// Random traffic (allocations with and without `after`, retains, releases) against a plain
// model: every allocate returns a block no one holds, counts agree, the budget holds, and
// once everything is released every block can be allocated again exactly once.
TEST(KvExtent, FreeListsAgainstAModel) {
  for (int64_t E : {1, 4, 7}) {
    const KvBlockLayout l(config(1, 8), ops::KvDType::F16, 4, E);
    KvPool pool(l, 8 * E, 8 * E, nullptr);
    const int64_t n = pool.max_blocks();
    std::map<int32_t, int> refs;  // held blocks and their holders
    std::mt19937 gen{uint32_t(E)};
    for (int step = 0; step < 4000; ++step) {
      const int op = int(gen() % 4);
      if (op <= 1) {
        if (int64_t(refs.size()) == n) {
          EXPECT_THROW(pool.allocate(), KvPoolExhausted);
          continue;
        }
        int32_t after = -1;
        if (op == 1 && !refs.empty()) after = std::next(refs.begin(), long(gen() % refs.size()))->first;
        const int32_t id = pool.allocate(after);
        ASSERT_TRUE(id >= 0 && id < n);
        ASSERT_EQ(refs.count(id), 0u) << "block " << id << " handed out twice";
        refs[id] = 1;
      } else if (!refs.empty()) {
        auto it = std::next(refs.begin(), long(gen() % refs.size()));
        if (op == 2) {
          pool.retain(it->first);
          ++it->second;
        } else {
          pool.release(it->first);
          if (--it->second == 0) refs.erase(it);
        }
      }
      ASSERT_EQ(pool.used_blocks(), int64_t(refs.size()));
      ASSERT_EQ(pool.free_blocks(), n - int64_t(refs.size()));
    }
    for (const auto& [id, r] : refs)
      for (int i = 0; i < r; ++i) pool.release(id);
    std::set<int32_t> again;
    for (int64_t i = 0; i < n; ++i) again.insert(pool.allocate(i % 3 == 0 ? -1 : int32_t(i - 1)));
    EXPECT_EQ(int64_t(again.size()), n);
    EXPECT_THROW(pool.allocate(), KvPoolExhausted);
  }
}

// An unbounded pool with extents grows by whole extents; blocks never move.
TEST(KvExtent, UnboundedPoolGrowsByWholeExtents) {
  const KvBlockLayout l(config(2, 8), ops::KvDType::F16, 4, 5);
  KvPool pool(l, 0, 3, nullptr);
  EXPECT_EQ(pool.arena_bytes(), 5 * l.bytes);
  std::vector<int32_t> ids;
  std::vector<uint8_t*> addr;
  int32_t prev = -1;
  for (int i = 0; i < 23; ++i) {
    ids.push_back(prev = pool.allocate(prev));
    addr.push_back(pool.data(ids.back()));
  }
  EXPECT_EQ(pool.arena_bytes() % (5 * l.bytes), 0);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(pool.data(ids[i]), addr[i]);
  for (size_t i = 1; i < ids.size(); ++i)  // one slot's blocks: neighbours within each extent
    if (ids[i - 1] % 5 != 4) {
      EXPECT_EQ(ids[i], ids[i - 1] + 1);
    }
}

// Caches on one pool with extents: rows written through the cache read back at their
// positions (position_bytes addresses them through KvView::index and head_rows), a copied
// row and a copy-on-write block carry values and scales, a clone reads the same bytes, and
// the cache refuses a prefix laid out differently.
TEST(KvExtent, CachesOnAnExtentPool) {
  const ModelConfig c = config(3, 5);
  for (auto dt : {ops::KvDType::F16, ops::KvDType::I8}) {
    const KvBlockLayout l(c, dt, 4, 3);
    auto pool = std::make_shared<KvPool>(l, 0, 0, nullptr);
    KvCache pre(c, 2, 40, 0, dt, nullptr, 0, 0, pool, 0, 4);
    const int64_t T = 22, W = 15;  // positions, K/V row width (3 heads of 5)
    const auto k = ops::testing::random_floats(size_t(T * W), 1), v = ops::testing::random_floats(size_t(T * W), 2);
    std::vector<int64_t> pos(T);
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = t;
    for (int64_t s = 0; s < pre.slot_count(); ++s) pre.write(s, k.data(), v.data(), pos.data(), T);
    pre.advance(T);
    // The same rows in a cache of single blocks (its own pool) are the reference bytes.
    KvCache flat(c, 2, 40, 0, dt, nullptr, 0, 0, nullptr, 0, 4);
    for (int64_t s = 0; s < flat.slot_count(); ++s) flat.write(s, k.data(), v.data(), pos.data(), T);
    for (int64_t s = 0; s < pre.slot_count(); ++s)
      for (int64_t p = 0; p < T; ++p)
        ASSERT_EQ(ops::testing::position_bytes(pre.view(s), p), ops::testing::position_bytes(flat.view(s), p))
            << "slot " << s << " position " << p;
    // A slot's blocks were placed side by side: block 1 continues block 0's run of head 0.
    int64_t r;
    const auto* b0 = static_cast<const uint8_t*>(pre.view(0).block_of(0, &r).k);
    const auto* b1 = static_cast<const uint8_t*>(pre.view(0).block_of(4, &r).k);
    EXPECT_EQ(b0 + 4 * 5 * elem_bytes(dt), b1);
    // copy_row between slots, then a tail sharing the prefix writes into its last block.
    pre.copy_row(0, 1, 7);
    EXPECT_EQ(ops::testing::position_bytes(pre.view(1), 7), ops::testing::position_bytes(flat.view(0), 7));
    KvCache tail(c, 2, 40, 0, dt, nullptr, 0, 0, pool, T, 4);
    tail.share_prefix(pre);
    const std::vector<float> z(size_t(W), 3.f);
    const int64_t p21 = 21;
    tail.write(2, z.data(), z.data(), &p21, 1);
    EXPECT_NE(tail.view(2).block_of(20, &r).k, pre.view(2).block_of(20, &r).k);  // copied
    for (int64_t p = 16; p < 21; ++p)
      EXPECT_EQ(ops::testing::position_bytes(tail.view(2), p), ops::testing::position_bytes(flat.view(2), p));
    EXPECT_EQ(ops::testing::position_bytes(pre.view(2), 21), ops::testing::position_bytes(flat.view(2), 21));
    auto fork = tail.clone();
    for (int64_t p = 0; p < T; ++p)
      EXPECT_EQ(ops::testing::position_bytes(fork->view(3), p), ops::testing::position_bytes(flat.view(3), p));
    KvCache other(c, 2, 40, 0, dt, nullptr, 0, 0, nullptr, 0, 4);  // single blocks
    EXPECT_THROW(other.share_prefix(pre), std::invalid_argument);
  }
}

}  // namespace
}  // namespace tinyloop::model
