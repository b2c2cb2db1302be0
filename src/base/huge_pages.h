// Large, long-lived buffers (KV caches, packed weight copies) on transparent huge pages.
//
// Why: a decode step streams these buffers front to back many times a token (every loop
// iteration re-reads its K/V slot and the loop weights). On 4 KiB pages each 2 MiB of them
// costs 512 TLB entries, and on the test machine (Zen 4 VM, THP "madvise") reads through
// 4 KiB pages measured 15-20 % slower than the same bytes on 2 MiB pages (the model file's
// mapping already gets them from the page cache). Buffers of 2 MiB or more are therefore
// 2 MiB aligned, rounded up to whole 2 MiB and madvise(MADV_HUGEPAGE)d; smaller ones are
// plain 64-byte aligned allocations (rounding them up would waste memory for nothing).
// The hint is only a hint: where THP is off the buffer works the same, a little slower.
// Such buffers are also faulted in at allocation (a write every 4 KiB), because with THP
// "madvise" a fault on a madvised range compacts memory to find a free huge page: left to
// the first write, that happened inside decode steps, each time a step opened a new KV
// block on an untouched page, and cost 20-25 ms on a ~12 ms step (EPYC Zen 5, bench
// model, 2026-12-03: `bench/step_latency.py`). Every such buffer is written in full soon
// anyway (a packed weight copy at load; a sequence's private KV pool grows by arenas that a
// helper thread allocates ahead of the writes, model/kv_pool.h), except a serving pool,
// which is made resident at start like vLLM's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tinyloop {

struct HugeFree {
  void operator()(void* p) const;
};
// An owned byte buffer from alloc_huge_pages (freed with std::free).
using HugeBytes = std::unique_ptr<uint8_t[], HugeFree>;

// `bytes` uninitialised bytes (64-byte aligned; see above for >= 2 MiB, resident). Throws
// std::bad_alloc when the memory is not there (a size whose rounding would wrap included).
HugeBytes alloc_huge_pages(size_t bytes);

}  // namespace tinyloop
