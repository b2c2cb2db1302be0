// alloc_huge_pages: a buffer of 2 MiB or more is resident when it is returned (huge_pages.h:
// faulted in at allocation, so no decode step waits for it). Alignment, sizes and sizes that
// cannot exist: kv_cache_test (HugePages.AlignmentAndSizes) and limits_test.
#include "base/huge_pages.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace tinyloop {
namespace {

// Pages of [p, p + bytes) that mincore reports resident, and how many there are.
std::pair<size_t, size_t> resident_pages(const uint8_t* p, size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<uint8_t*>(p), bytes, in.data()), 0);
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return {n, in.size()};
}

TEST(HugePages, LargeBufferIsResident) {
  for (size_t bytes : {size_t(2) << 20, (size_t(5) << 20) + 123}) {
    HugeBytes b = alloc_huge_pages(bytes);
    ASSERT_TRUE(b);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % (size_t(2) << 20), 0u);
    const auto [resident, pages] = resident_pages(b.get(), bytes);
    EXPECT_EQ(resident, pages) << bytes << " bytes: " << pages - resident << " pages not faulted in";
    b[bytes - 1] = 1;  // the whole size is usable
  }
}

}  // namespace
}  // namespace tinyloop
