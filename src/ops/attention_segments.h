// Causal attention over a sequence whose keys live in two KV slots: a shared, read-only
// prefix segment (positions < split) and a per-call tail segment (positions >= split). Used
// by the prefix cache (runtime/prefix_cache.h, docs/prefix-cache.md) so one prefilled
// prompt serves many continuations without copying its K/V.
#pragma once
#include <cstdint>

#include "ops/ops.h"

namespace tinyloop::ops {

// Same contract as ops::attention, but key position p is read from
//   prefix  (row p % prefix.capacity)  when p <  split
//   tail    (row p % tail.capacity)    when p >= split
// Both views must share dtype, n_kv_heads and head_dim.
//   q   [T, n_heads, head_dim]   (RoPE already applied)
//   out [T, n_heads, head_dim]
// Query t attends to k_lo[t] .. q_pos[t]. Dispatched like ops::attention: the SIMD kernel
// (cpu::attention_segments, the same routine as cpu::attention) unless TINYLOOP_FORCE_SCALAR,
// then ref::attention_segments. Either way the result is bit-identical to ops::attention
// over one slot holding the same rows (the boundary only picks the buffer a row comes from).
void attention_segments(const float* q, int64_t T, int64_t n_heads, const KvView& prefix,
                        int64_t split, const KvView& tail, const int64_t* q_pos,
                        const int64_t* k_lo, float* out);

namespace ref {
// The scalar version: keys visited in position order with the arithmetic of the scalar
// reference (ops/reference.h), so bit-identical to ref::attention over one slot.
void attention_segments(const float* q, int64_t T, int64_t n_heads, const KvView& prefix,
                        int64_t split, const KvView& tail, const int64_t* q_pos,
                        const int64_t* k_lo, float* out);
}  // namespace ref

}  // namespace tinyloop::ops
