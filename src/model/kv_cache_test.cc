// KvCache storage modes and paging: the recurrence-shared slot layout, INT8 blocks (values +
// scales), copy_row with scales and shared groups, blocks on demand, the pool's budget and
// reference counts, copy-on-write sharing, window release.
#include "model/kv_cache.h"

#include "ops/kv_quant.h"
#include "ops/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

namespace tinyloop::model {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.n_kv_heads = 2;
  c.head_dim = 5;  // odd: scales must still land 4-byte aligned
  c.n_pre_blocks = 1;
  c.n_loop_layers = 2;
  c.n_post_blocks = 1;
  return c;
}

TEST(SlotLayout, GroupsMapIterationsModuloB) {
  const ModelConfig c = small_config();
  const SlotLayout exact(c, 6), b1(c, 6, 1), b4(c, 6, 4), big(c, 6, 9);
  EXPECT_EQ(exact.count(), 1 + 6 * 2 + 1);
  EXPECT_FALSE(exact.shared());
  EXPECT_EQ(big.groups, 6);  // B >= L is the exact layout
  EXPECT_EQ(big.count(), exact.count());
  EXPECT_EQ(b1.count(), 1 + 2 + 1);
  EXPECT_TRUE(b1.shared());
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(b1.loop(i, 1), 2);
    EXPECT_EQ(b4.loop(i, 0), 1 + (i % 4) * 2);
    EXPECT_EQ(exact.loop(i, 1), big.loop(i, 1));
  }
  EXPECT_EQ(b4.post(0), 1 + 4 * 2);
  EXPECT_EQ(b1.post(0), 3);
}

TEST(KvCache, BytesPerModeAndSharedGroups) {
  const ModelConfig c = small_config();
  const int64_t cap = 64;
  KvCache f32(c, 4, cap, 0, ops::KvDType::F32, nullptr);
  KvCache f16(c, 4, cap, 0, ops::KvDType::F16, nullptr);
  KvCache i8(c, 4, cap, 0, ops::KvDType::I8, nullptr);
  KvCache b1(c, 4, cap, 0, ops::KvDType::F16, nullptr, 0, 1);
  EXPECT_EQ(f32.bytes_per_position_per_slot(), 2 * 10 * 4);
  EXPECT_EQ(f16.bytes_per_position_per_slot(), 2 * 10 * 2);
  EXPECT_EQ(i8.bytes_per_position_per_slot(), 2 * 10 + 2 * 2 * 4);
  for (KvCache* kv : {&f32, &f16, &i8, &b1}) kv->reserve(cap);  // blocks come on first use
  EXPECT_GE(i8.bytes(), i8.slot_count() * cap * i8.bytes_per_position_per_slot());
  EXPECT_LT(i8.bytes(), f16.bytes());
  EXPECT_EQ(b1.slot_count(), 4);
  EXPECT_LT(b1.bytes(), f16.bytes());
  EXPECT_THROW(KvCache(c, 4, cap, 0, ops::KvDType::F16, nullptr, 0, -1), std::invalid_argument);
}

TEST(KvCache, Int8WriteViewAndCopyRowCarryScales) {
  const ModelConfig c = small_config();
  KvCache kv(c, 3, 8, 0, ops::KvDType::I8, nullptr, 0, 0, nullptr, 0, /*block_rows=*/4);
  std::vector<float> k(10), v(10);  // [n_kv_heads, head_dim] of one position
  for (int i = 0; i < 10; ++i) {
    k[size_t(i)] = float(i - 4) * (i < 5 ? 1.f : 100.f);  // different scales per kv head
    v[size_t(i)] = float(i) * 0.5f;
  }
  const int64_t pos = 6;  // block 1, row 2
  const int64_t src = kv.layout().loop(0, 1), dst = kv.layout().loop(2, 1);
  kv.write(src, k.data(), v.data(), &pos, 1);
  int64_t row = -1;
  const ops::KvBlock a = kv.view(src).block_of(pos, &row);
  EXPECT_EQ(row, 2);
  ASSERT_NE(a.k_scale, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.k_scale) % alignof(float), 0u);
  // Head-major blocks: (row 2, kv head g) is index g * 4 + 2.
  const ops::KvView va = kv.view(src);
  EXPECT_EQ(va.index(2, 1), 1 * 4 + 2);
  EXPECT_FLOAT_EQ(a.k_scale[va.index(2, 0)], 4.f / 127.f);
  EXPECT_FLOAT_EQ(a.k_scale[va.index(2, 1)], 500.f / 127.f);
  const int64_t other = 5;  // the same block's row 1 in dst: copying row 2 leaves it alone
  kv.write(dst, v.data(), k.data(), &other, 1);
  const auto other_bytes = ops::testing::position_bytes(kv.view(dst), other);
  EXPECT_NE(ops::testing::position_bytes(kv.view(dst), pos), ops::testing::position_bytes(va, pos));
  kv.copy_row(src, dst, pos);
  EXPECT_EQ(ops::testing::position_bytes(kv.view(dst), pos), ops::testing::position_bytes(va, pos));
  EXPECT_EQ(ops::testing::position_bytes(kv.view(dst), other), other_bytes);
  kv.copy_row(src, src, pos);  // same slot (shared group): a no-op, not an overlapping copy
  auto clone = kv.clone();
  EXPECT_EQ(ops::testing::position_bytes(clone->view(dst), pos), ops::testing::position_bytes(va, pos));
}

// Position p of a slot is row p % block_rows of its block p / block_rows; writes allocate
// blocks on demand; positions past the capacity are refused.
TEST(KvCache, BlocksAllocatedOnDemand) {
  const ModelConfig c = small_config();
  KvCache kv(c, 2, 10, 0, ops::KvDType::F32, nullptr, 0, 0, nullptr, 0, 4);
  EXPECT_EQ(kv.blocks_held(), 0);
  EXPECT_EQ(kv.blocks_needed(5), kv.slot_count() * 2);  // positions 0..4: blocks 0 and 1
  kv.reserve(5);
  EXPECT_EQ(kv.blocks_held(), kv.slot_count() * 2);
  EXPECT_EQ(kv.blocks_needed(5), 0);
  std::vector<float> k(10, 1.f), v(10, 2.f);
  const int64_t p9 = 9, p10 = 10;
  kv.write(0, k.data(), v.data(), &p9, 1);  // block 2 of slot 0 only
  EXPECT_EQ(kv.blocks_held(), kv.slot_count() * 2 + 1);
  EXPECT_THROW(kv.write(0, k.data(), v.data(), &p10, 1), std::logic_error);
  EXPECT_THROW(kv.reserve(11), std::logic_error);
  kv.release_all();
  EXPECT_EQ(kv.blocks_held(), 0);
  EXPECT_EQ(kv.pool()->used_blocks(), 0);
}

// A standalone sequence's private cache: long blocks for a long prompt without a window,
// the default otherwise (kv_pool.h private_block_rows), and a cache built with them has
// the block table its capacity needs.
TEST(KvCache, LongPromptsGetLongPrivateBlocks) {
  EXPECT_EQ(private_block_rows(kLongPromptRows, 0), kLongBlockRows);
  EXPECT_EQ(private_block_rows(kLongPromptRows + 5000, 0), kLongBlockRows);
  EXPECT_EQ(private_block_rows(kLongPromptRows - 1, 0), 0);
  EXPECT_EQ(private_block_rows(1, 0), 0);
  EXPECT_EQ(private_block_rows(kLongPromptRows, 64), 0);  // windowed: blocks slide away
  const ModelConfig c = small_config();
  const int64_t P = kLongPromptRows + 7;
  KvCache kv(c, 2, P + 3, 0, ops::KvDType::F16, nullptr, 0, 0, nullptr, 0, private_block_rows(P, 0));
  EXPECT_EQ(kv.block_rows(), kLongBlockRows);
  EXPECT_EQ(kv.block_count(), (P + 3 + kLongBlockRows - 1) / kLongBlockRows);
  KvCache short_kv(c, 2, 20, 0, ops::KvDType::F16, nullptr, 0, 0, nullptr, 0, private_block_rows(17, 0));
  EXPECT_EQ(short_kv.block_rows(), 20);  // the default: the capacity when under kDefaultBlockRows
}

// A budgeted pool hands out at most its blocks, reuses freed ones, and says what ran out.
TEST(KvPool, BudgetRefcountsAndReuse) {
  const ModelConfig c = small_config();
  const KvBlockLayout layout(c, ops::KvDType::F16, 8);
  EXPECT_EQ(layout.bytes % 64, 0);
  EXPECT_GE(layout.bytes, 2 * 8 * 10 * 2);
  auto pool = std::make_shared<KvPool>(layout, 3, 3, nullptr);
  EXPECT_EQ(pool->arena_bytes(), 3 * layout.bytes);
  const int32_t a = pool->allocate(), b = pool->allocate(), d = pool->allocate();
  EXPECT_FALSE(pool->can_allocate(1));
  EXPECT_THROW(
      {
        try {
          pool->allocate();
        } catch (const KvPoolExhausted& e) {
          EXPECT_NE(std::string(e.what()).find("exhausted"), std::string::npos);
          throw;
        }
      },
      KvPoolExhausted);
  pool->retain(a);
  EXPECT_TRUE(pool->shared(a));
  pool->release(a);
  EXPECT_FALSE(pool->shared(a));
  pool->release(b);
  EXPECT_EQ(pool->free_blocks(), 1);
  EXPECT_EQ(pool->allocate(), b);  // the freed block comes back
  EXPECT_THROW(pool->release(-1), std::out_of_range);
  pool->release(a), pool->release(b), pool->release(d);
  EXPECT_THROW(pool->release(d), std::logic_error);  // already free
  EXPECT_EQ(pool->used_blocks(), 0);
  // An unbounded pool grows, and its blocks never move.
  auto grow = std::make_shared<KvPool>(layout, 0, 1, nullptr);
  const int32_t first = grow->allocate();
  uint8_t* addr = grow->data(first);
  for (int i = 0; i < 40; ++i) grow->allocate();
  EXPECT_EQ(grow->data(first), addr);
  EXPECT_EQ(grow->used_blocks(), 41);
}

// A private pool grown ahead: reserve_free adds one arena for a forward's blocks; running
// low starts the next arena on a helper thread, which allocate() takes when it runs out;
// blocks never move; the helper stops at the limit and allocate() still grows past it.
TEST(KvPool, GrowAheadOnAHelperThread) {
  const ModelConfig c = small_config();
  const KvBlockLayout layout(c, ops::KvDType::F16, 8);
  EXPECT_THROW(KvPool(layout, 3, 3, nullptr).grow_ahead_to(10), std::logic_error);  // a budget
  EXPECT_THROW(KvPool(layout, 3, 3, nullptr).reserve_free(1), std::logic_error);
  MemoryTracker tracker;
  const int64_t min_ahead = std::max<int64_t>(16, ((int64_t(4) << 20) + layout.bytes - 1) / layout.bytes);
  const int64_t limit = 10 + min_ahead + 5;
  auto pool = std::make_shared<KvPool>(layout, 0, 0, &tracker);
  pool->grow_ahead_to(limit);
  EXPECT_EQ(pool->arena_bytes(), 0);  // nothing to grow ahead of yet
  pool->reserve_free(10);
  EXPECT_EQ(pool->arena_bytes(), 10 * layout.bytes);
  EXPECT_EQ(tracker.live_bytes.load(), 10 * layout.bytes);
  std::vector<int32_t> ids;
  std::vector<uint8_t*> addr;
  for (int i = 0; i < 10; ++i) {  // the 8th leaves 2 of 10 free: the helper starts
    ids.push_back(pool->allocate());
    addr.push_back(pool->data(ids.back()));
  }
  EXPECT_EQ(pool->arena_bytes(), 10 * layout.bytes);  // the helper's arena is not attached yet
  ids.push_back(pool->allocate());  // out of blocks: waits for the helper's arena
  EXPECT_EQ(pool->arena_bytes(), (10 + min_ahead) * layout.bytes);
  EXPECT_EQ(tracker.live_bytes.load(), (10 + min_ahead) * layout.bytes);
  while (int64_t(ids.size()) < limit + 20) ids.push_back(pool->allocate());  // past the limit: grows itself
  EXPECT_EQ(pool->used_blocks(), limit + 20);
  for (size_t i = 0; i < addr.size(); ++i) EXPECT_EQ(pool->data(ids[i]), addr[i]);
  std::vector<uint8_t*> all;
  for (int32_t id : ids) all.push_back(pool->data(id));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());  // every block its own
  for (int32_t id : ids) pool->release(id);
  EXPECT_EQ(pool->used_blocks(), 0);
  pool.reset();
  EXPECT_EQ(tracker.live_bytes.load(), 0);
}

// Copy-on-write: a cache sharing another's blocks (a prefix, a clone) reads them in place
// and copies a block only when it writes into it; the owner never sees the write.
TEST(KvCache, SharedBlocksCopyOnWrite) {
  const ModelConfig c = small_config();
  for (auto dt : {ops::KvDType::F32, ops::KvDType::I8}) {
    KvCache pre(c, 2, 6, 0, dt, nullptr, 0, 0, nullptr, 0, 4);
    std::vector<float> k(60), v(60);  // [6 positions, 10]
    for (int i = 0; i < 60; ++i) k[size_t(i)] = float(i % 13) - 6.f, v[size_t(i)] = float(i % 7);
    std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
    for (int64_t s = 0; s < pre.slot_count(); ++s) pre.write(s, k.data(), v.data(), pos.data(), 6);
    pre.advance(6);
    const int64_t held = pre.blocks_held();
    KvCache tail(c, 2, 12, 0, dt, nullptr, 0, 0, nullptr, 6, 4);
    tail.share_prefix(pre);
    EXPECT_EQ(tail.length(), 6);
    EXPECT_EQ(tail.blocks_held(), held);  // nothing copied yet
    EXPECT_EQ(tail.blocks_needed(8), tail.slot_count());  // the shared partial block 1 only
    int64_t r0, r1;
    EXPECT_EQ(tail.view(0).block_of(0, &r0).k, pre.view(0).block_of(0, &r1).k);  // same memory
    // Overwrite position 5 in the tail: pre keeps its bytes, the tail has a copy of block 1
    // with position 4 intact.
    std::vector<float> z(10, 99.f);
    const int64_t p5 = 5;
    tail.write(0, z.data(), z.data(), &p5, 1);
    EXPECT_NE(tail.view(0).block_of(5, &r0).k, pre.view(0).block_of(5, &r1).k);
    auto bytes_at = [&](const KvCache& kv, int64_t p) { return ops::testing::position_bytes(kv.view(0), p); };
    EXPECT_EQ(bytes_at(tail, 4), bytes_at(pre, 4));
    EXPECT_NE(bytes_at(tail, 5), bytes_at(pre, 5));
    // The prefix can go first: the tail keeps the blocks it shares alive.
    auto fork = tail.clone();
    tail.release_all();
    EXPECT_EQ(bytes_at(*fork, 4), bytes_at(pre, 4));
  }
  // The recurrence-shared layout cannot share a prefix (it would differ from generate()).
  KvCache pre(c, 4, 4, 0, ops::KvDType::F16, nullptr, 0, 1);
  KvCache tail(c, 4, 4, 0, ops::KvDType::F16, nullptr, 0, 1);
  EXPECT_THROW(tail.share_prefix(pre), std::invalid_argument);
}

// A windowed cache releases blocks no later query can see: what it holds stays bounded
// however long the sequence grows.
TEST(KvCache, WindowReleasesOldBlocks) {
  const ModelConfig c = small_config();
  const int64_t W = 8, B = 4;
  KvCache kv(c, 1, 1000, W, ops::KvDType::F16, nullptr, 0, 0, nullptr, 0, B);
  std::vector<float> k(10, 0.5f);
  int64_t most = 0;
  for (int64_t p = 0; p < 1000; ++p) {
    for (int64_t s = 0; s < kv.slot_count(); ++s) kv.write(s, k.data(), k.data(), &p, 1);
    kv.advance(1);
    most = std::max(most, kv.blocks_held());
  }
  const int64_t per_slot = (W + KvCache::kWindowSlack) / B + 2;
  EXPECT_LE(most, kv.slot_count() * per_slot);
  EXPECT_THROW(kv.truncate(100), std::logic_error);  // released long ago
  kv.truncate(990);  // within the slack: fine
}

// Store-h rows: every precision round-trips within half a quantization step on odd lengths
// (the last int4 group shorter), int4 packs two values per byte low nibble first.
TEST(StoreHRows, RoundTripWithinHalfAStep) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3.f, 3.f);
  for (auto t : {ops::KvDType::H16, ops::KvDType::H8, ops::KvDType::H4})
    for (int64_t n : {1, 3, 32, 33, 64, 65}) {
      std::vector<float> x(static_cast<size_t>(n)), back(x.size());
      for (auto& e : x) e = d(rng);
      std::vector<uint8_t> row(static_cast<size_t>(ops::h_row_bytes(t, n)));
      std::vector<float> sc(static_cast<size_t>(ops::h_row_scales(t, n)) + 1, NAN);
      ops::h_row_store(t, x.data(), n, row.data(), sc.data());
      ops::h_row_load(t, row.data(), sc.data(), n, back.data());
      for (int64_t i = 0; i < n; ++i) {
        float step = 0;  // the quantization step of element i
        if (t == ops::KvDType::H16) step = std::ldexp(1.f, std::ilogb(x[size_t(i)]) - 10);
        if (t == ops::KvDType::H8) step = sc[0];
        if (t == ops::KvDType::H4) step = sc[size_t(i / ops::kH4Group)];
        EXPECT_LE(std::fabs(back[size_t(i)] - x[size_t(i)]), 0.5f * step * 1.0001f)
            << int(t) << " n=" << n << " i=" << i;
      }
      EXPECT_TRUE(std::isnan(sc.back()));  // wrote no more scales than h_row_scales says
    }
  EXPECT_EQ(ops::h_row_bytes(ops::KvDType::H4, 65), 33);
  EXPECT_EQ(ops::h_row_scales(ops::KvDType::H4, 65), 3);
  const float x[3] = {7.f, -7.f, 0.f};  // scale 1: q = 7, -7, 0 -> stored 15, 1, 8
  uint8_t row[2];
  float sc = 0;
  ops::h_row_store(ops::KvDType::H4, x, 3, row, &sc);
  EXPECT_EQ(sc, 1.f);
  EXPECT_EQ(row[0], 0x1F);
  EXPECT_EQ(row[1], 0x08);
}

TEST(KvCache, StoreHKeepsHRowsOnly) {
  ModelConfig c = small_config();
  c.dim = 40;  // 2 kv heads x 5 = 10 K/V values per position, h is 40 wide
  KvCache h4(c, 2, 6, 0, ops::KvDType::H4, nullptr);
  EXPECT_EQ(h4.bytes_per_position_per_slot(), 20 + 2 * 4);  // 40 nibbles + 2 group scales
  KvCache h16(c, 2, 6, 0, ops::KvDType::H16, nullptr);
  EXPECT_EQ(h16.bytes_per_position_per_slot(), 80);
  std::vector<float> x(40), back(40);
  for (int i = 0; i < 40; ++i) x[size_t(i)] = 0.25f * float(i - 20);  // max abs 5
  KvCache h8(c, 2, 10, 0, ops::KvDType::H8, nullptr, 0, 0, nullptr, 0, 4);
  const int64_t pos = 9, src = h8.layout().loop(0, 0), dst = h8.layout().loop(1, 0);
  h8.write_h(src, x.data(), &pos, 1);
  h8.read_h(src, pos, back.data());
  for (int i = 0; i < 40; ++i) EXPECT_NEAR(back[size_t(i)], x[size_t(i)], 5.f / 127.f / 2 * 1.001f);
  h8.copy_row(src, dst, pos);
  std::vector<float> copied(40);
  h8.read_h(dst, pos, copied.data());
  EXPECT_EQ(copied, back);
  std::vector<float> kv_rows(10);
  EXPECT_THROW(h8.write(src, kv_rows.data(), kv_rows.data(), &pos, 1), std::invalid_argument);
  // Store-h slots share prefix blocks like any other mode.
  KvCache tail(c, 2, 12, 0, ops::KvDType::H8, nullptr, 0, 0, nullptr, 0, 4);
  h8.advance(10);
  tail.share_prefix(h8);
  tail.read_h(dst, pos, copied.data());
  EXPECT_EQ(copied, back);
}

// Large buffers land 2 MiB aligned (so THP can back them with huge pages), small ones
// 64-byte aligned, and every size - 0 and non-multiples included - is writable end to end
// (ASan checks the bounds).
TEST(HugePages, AlignmentAndSizes) {
  for (size_t bytes : {size_t(0), size_t(1), size_t(100), size_t(2) << 20, (size_t(3) << 20) + 7}) {
    HugeBytes p = alloc_huge_pages(bytes);
    ASSERT_NE(p.get(), nullptr);
    const size_t align = bytes >= (size_t(2) << 20) ? (size_t(2) << 20) : 64;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % align, 0u) << bytes;
    if (bytes) {
      std::memset(p.get(), 7, bytes);
      EXPECT_EQ(p[0], 7);
      EXPECT_EQ(p[bytes - 1], 7);
    }
  }
}

}  // namespace
}  // namespace tinyloop::model
