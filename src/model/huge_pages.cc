#include "model/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace tinyloop::model {

void HugeFree::operator()(void* p) const { std::free(p); }

HugeBytes alloc_huge_pages(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  constexpr size_t kLine = 64;
  const bool huge = bytes >= kHuge;
  const size_t align = huge ? kHuge : kLine;
  // aligned_alloc wants a multiple of the alignment (and a non-zero size).
  const size_t rounded = bytes == 0 ? align : (bytes + align - 1) / align * align;
  HugeBytes p(static_cast<uint8_t*>(std::aligned_alloc(align, rounded)));
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p.get(), rounded, MADV_HUGEPAGE);  // a hint: failure only costs speed
#endif
  return p;
}

}  // namespace tinyloop::model
