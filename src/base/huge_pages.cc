#include "base/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>
#include <stdexcept>

#include "tinyloop/checked.h"

namespace tinyloop {

void HugeFree::operator()(void* p) const { std::free(p); }

HugeBytes alloc_huge_pages(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  constexpr size_t kLine = 64;
  const bool huge = bytes >= kHuge;
  const size_t align = huge ? kHuge : kLine;
  // aligned_alloc wants a multiple of the alignment (and a non-zero size). Rounding a size
  // near SIZE_MAX up would wrap to a tiny buffer: no such memory exists, so bad_alloc. Nor
  // does any buffer past the 47-bit user address space (x86-64, AArch64 with 4 KiB pages):
  // refused here, since some allocators (AddressSanitizer's) abort on such a request
  // instead of returning null.
  constexpr size_t kMaxBytes = size_t(1) << 47;
  if (bytes > kMaxBytes) throw std::bad_alloc();
  size_t rounded;
  try {
    rounded = bytes == 0 ? align : checked_round_up(bytes, align, "buffer size");
  } catch (const std::overflow_error&) {
    throw std::bad_alloc();
  }
  HugeBytes p(static_cast<uint8_t*>(std::aligned_alloc(align, rounded)));
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p.get(), rounded, MADV_HUGEPAGE);  // a hint: failure only costs speed
#endif
  // Fault the pages in now (header: a decode step's first write into a KV block must not
  // wait for the kernel to compact and zero a huge page).
  if (huge)
    for (size_t i = 0; i < rounded; i += 4096) p.get()[i] = 0;
  return p;
}

}  // namespace tinyloop
