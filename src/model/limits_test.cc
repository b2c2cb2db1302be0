// Issue 16 (hardening), the model layer: sizes that once wrapped are refused. The
// huge-page allocator's rounding (a size near SIZE_MAX became a tiny buffer), KV block and
// slot sizes computed from the config and the call, the windowed pool size.
#include <gtest/gtest.h>

#include <limits>
#include <new>
#include <stdexcept>

#include "base/huge_pages.h"
#include "model/kv_cache.h"
#include "model/kv_pool.h"

namespace tinyloop::model {
namespace {

ModelConfig config() {
  ModelConfig c;
  c.dim = 8;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.n_pre_blocks = 1;
  c.n_loop_layers = 2;
  c.n_post_blocks = 1;
  return c;
}

TEST(ModelLimits, HugePageRoundingCannotWrap) {
  for (size_t bytes : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() - (size_t(1) << 20),
                       std::numeric_limits<size_t>::max() / 2 + 1})
    EXPECT_THROW(alloc_huge_pages(bytes), std::bad_alloc) << bytes;
  EXPECT_NE(alloc_huge_pages(3 << 20).get(), nullptr);
}

TEST(ModelLimits, KvRowBytesOverflowIsRefused) {
  ModelConfig c = config();
  c.n_kv_heads = int64_t(1) << 40;
  c.head_dim = int64_t(1) << 30;
  EXPECT_THROW(KvBlockLayout(c, ops::KvDType::F32, 32), std::exception);
}

TEST(ModelLimits, KvSlotCountOverflowIsRefused) {
  ModelConfig c = config();
  c.n_loop_layers = int64_t(1) << 62;
  EXPECT_THROW(KvCache(c, 8, 16, 0, ops::KvDType::F16, nullptr), std::overflow_error);
}

TEST(ModelLimits, HugeCapacityOrWindowIsRefusedOrBounded) {
  const ModelConfig c = config();
  EXPECT_THROW(KvCache(c, 4096, int64_t(1) << 62, 0, ops::KvDType::F16, nullptr), std::runtime_error);
  // A window longer than any sequence: a small private pool, not a wrapped size.
  KvCache kv(c, 2, 64, std::numeric_limits<int64_t>::max(), ops::KvDType::F16, nullptr);
  EXPECT_LE(kv.bytes(), int64_t(1) << 20);
  EXPECT_GT(KvCache::window_blocks(std::numeric_limits<int64_t>::max(), 32), 0);
}

}  // namespace
}  // namespace tinyloop::model
