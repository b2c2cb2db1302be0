// KvCache storage modes: the recurrence-shared slot layout, INT8 slot layout (values +
// scales), copy_row with scales and shared groups, and the shared-prefix refusals.
#include "model/kv_cache.h"

#include "ops/kv_quant.h"

#include <gtest/gtest.h>

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
  const int64_t cap = 7;
  KvCache f32(c, 4, cap, 0, ops::KvDType::F32, nullptr);
  KvCache f16(c, 4, cap, 0, ops::KvDType::F16, nullptr);
  KvCache i8(c, 4, cap, 0, ops::KvDType::I8, nullptr);
  KvCache b1(c, 4, cap, 0, ops::KvDType::F16, nullptr, 0, 1);
  EXPECT_EQ(f32.bytes_per_position_per_slot(), 2 * 10 * 4);
  EXPECT_EQ(f16.bytes_per_position_per_slot(), 2 * 10 * 2);
  EXPECT_EQ(i8.bytes_per_position_per_slot(), 2 * 10 + 2 * 2 * 4);
  EXPECT_GE(i8.bytes(), i8.slot_count() * cap * i8.bytes_per_position_per_slot());
  EXPECT_LT(i8.bytes(), f16.bytes());
  EXPECT_EQ(b1.slot_count(), 4);
  EXPECT_LT(b1.bytes(), f16.bytes());
  EXPECT_THROW(KvCache(c, 4, cap, 0, ops::KvDType::F16, nullptr, 0, -1), std::invalid_argument);
}

TEST(KvCache, Int8WriteViewAndCopyRowCarryScales) {
  const ModelConfig c = small_config();
  KvCache kv(c, 3, 4, 0, ops::KvDType::I8, nullptr);
  std::vector<float> k(10), v(10);  // [n_kv_heads, head_dim] of one position
  for (int i = 0; i < 10; ++i) {
    k[size_t(i)] = float(i - 4) * (i < 5 ? 1.f : 100.f);  // different scales per kv head
    v[size_t(i)] = float(i) * 0.5f;
  }
  const int64_t pos = 6;  // ring row 2
  const int64_t src = kv.layout().loop(0, 1), dst = kv.layout().loop(2, 1);
  kv.write(src, k.data(), v.data(), &pos, 1);
  const ops::KvView a = kv.view(src);
  ASSERT_NE(a.k_scale, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.k_scale) % alignof(float), 0u);
  EXPECT_FLOAT_EQ(a.k_scale[2 * 2 + 0], 4.f / 127.f);
  EXPECT_FLOAT_EQ(a.k_scale[2 * 2 + 1], 500.f / 127.f);
  kv.copy_row(src, dst, pos);
  const ops::KvView b = kv.view(dst);
  EXPECT_EQ(b.k_scale[4], a.k_scale[4]);
  EXPECT_EQ(b.v_scale[5], a.v_scale[5]);
  EXPECT_EQ(0, std::memcmp(static_cast<const int8_t*>(b.k) + 2 * 10,
                           static_cast<const int8_t*>(a.k) + 2 * 10, 10));
  kv.copy_row(src, src, pos);  // same slot (shared group): a no-op, not an overlapping copy
  auto clone = kv.clone();
  EXPECT_EQ(clone->view(dst).v_scale[5], a.v_scale[5]);
}

TEST(KvCache, SharedPrefixRefusesInt8AndSharedGroups) {
  const ModelConfig c = small_config();
  KvCache pre8(c, 2, 4, 0, ops::KvDType::I8, nullptr), tail8(c, 2, 4, 0, ops::KvDType::I8, nullptr);
  EXPECT_THROW(
      {
        try {
          tail8.set_shared_prefix(&pre8);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  KvCache pre(c, 4, 4, 0, ops::KvDType::F16, nullptr, 0, 1);
  KvCache tail(c, 4, 4, 0, ops::KvDType::F16, nullptr, 0, 1);
  EXPECT_THROW(tail.set_shared_prefix(&pre), std::invalid_argument);
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
  EXPECT_EQ(h16.v_data(0), nullptr);
  std::vector<float> x(40), back(40);
  for (int i = 0; i < 40; ++i) x[size_t(i)] = 0.25f * float(i - 20);  // max abs 5
  KvCache h8(c, 2, 6, 0, ops::KvDType::H8, nullptr);
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
  KvCache pre(c, 2, 6, 0, ops::KvDType::H16, nullptr), tail(c, 2, 6, 0, ops::KvDType::H16, nullptr);
  EXPECT_THROW(tail.set_shared_prefix(&pre), std::invalid_argument);
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

