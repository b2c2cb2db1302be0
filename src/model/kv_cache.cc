#include "model/kv_cache.h"

#include <stdexcept>
#include <string>

namespace tinyloop::model {

KvCache::KvCache(const ModelConfig& c, int64_t loops, int64_t capacity, int64_t window,
                 ops::KvDType dtype, MemoryTracker* tracker)
    : layout_(c, loops),
      capacity_(capacity),
      window_(window),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim),
      dtype_(dtype) {
  if (loops < 1) throw std::invalid_argument("loops must be >= 1, got " + std::to_string(loops));
  if (capacity < 1) throw std::invalid_argument("KV capacity must be >= 1");
  const int64_t elem = dtype == ops::KvDType::F16 ? 2 : 4;
  row_bytes_ = n_kv_heads_ * head_dim_ * elem;
  slot_bytes_ = 2 * capacity_ * row_bytes_;
  bytes_ = slot_bytes_ * layout_.count();
  try {
    data_.reset(new uint8_t[static_cast<size_t>(bytes_)]);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of memory: KV cache of " + std::to_string(bytes_) + " bytes");
  }
  tracked_ = TrackedBytes(tracker, bytes_);
}

void* KvCache::k_data(int64_t slot) { return data_.get() + slot * slot_bytes_; }
void* KvCache::v_data(int64_t slot) { return data_.get() + slot * slot_bytes_ + capacity_ * row_bytes_; }

ops::KvView KvCache::view(int64_t slot) const {
  ops::KvView v;
  v.dtype = dtype_;
  v.k = data_.get() + slot * slot_bytes_;
  v.v = data_.get() + slot * slot_bytes_ + capacity_ * row_bytes_;
  v.capacity = capacity_;
  v.n_kv_heads = n_kv_heads_;
  v.head_dim = head_dim_;
  return v;
}

}  // namespace tinyloop::model
