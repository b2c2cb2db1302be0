#include "model/kv_cache.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "ops/kv_quant.h"

namespace tinyloop::model {

KvCache::KvCache(const ModelConfig& c, int64_t loops, int64_t capacity, int64_t window,
                 ops::KvDType dtype, MemoryTracker* tracker, int64_t extra_slots,
                 int64_t loop_slots)
    : layout_(c, loops, loop_slots),
      capacity_(capacity),
      window_(window),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim),
      dim_(c.dim),
      extra_slots_(extra_slots),
      dtype_(dtype),
      tracker_(tracker) {
  if (loops < 1) throw std::invalid_argument("loops must be >= 1, got " + std::to_string(loops));
  if (capacity < 1) throw std::invalid_argument("KV capacity must be >= 1");
  if (extra_slots < 0) throw std::invalid_argument("extra KV slots must be >= 0");
  if (loop_slots < 0)
    throw std::invalid_argument("kv_loop_slots must be >= 0, got " + std::to_string(loop_slots));
  if (ops::is_store_h(dtype)) {
    // Store-h: one area of h rows [capacity, dim] (+ their scales), no separate V.
    areas_ = 1;
    row_bytes_ = ops::h_row_bytes(dtype, dim_);
    row_scales_ = ops::h_row_scales(dtype, dim_);
  } else {
    const int64_t elem = dtype == ops::KvDType::F32 ? 4 : dtype == ops::KvDType::F16 ? 2 : 1;
    areas_ = 2;
    row_bytes_ = n_kv_heads_ * head_dim_ * elem;
    row_scales_ = dtype == ops::KvDType::I8 ? n_kv_heads_ : 0;
  }
  // Scales follow the values, 16-byte aligned; every slot starts 16-byte aligned too.
  auto align16 = [](int64_t n) { return (n + 15) / 16 * 16; };
  scale_off_ = align16(areas_ * capacity_ * row_bytes_);
  const int64_t scale_bytes = areas_ * capacity_ * row_scales_ * int64_t(sizeof(float));
  slot_bytes_ = align16(scale_off_ + scale_bytes);
  bytes_ = slot_bytes_ * (layout_.count() + extra_slots_);
  try {
    data_ = alloc_huge_pages(static_cast<size_t>(bytes_));
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of memory: KV cache of " + std::to_string(bytes_) + " bytes");
  }
  tracked_ = TrackedBytes(tracker, bytes_);
}

void KvCache::truncate(int64_t new_length) {
  if (new_length < 0 || new_length > length_)
    throw std::logic_error("KV truncate to " + std::to_string(new_length) + " of " +
                           std::to_string(length_));
  if (length_ - new_length > capacity_)
    throw std::logic_error("KV truncate past the ring's oldest row");
  length_ = new_length;
}

void KvCache::copy_row(int64_t src_slot, int64_t dst_slot, int64_t p) {
  if (src_slot == dst_slot) return;  // recurrence-shared iterations: already the same rows
  if (row_scales_ > 0) {
    const int64_t r = (p % capacity_) * row_scales_;  // [row_scales] scales of row p
    std::memcpy(k_scale_data(dst_slot) + r, k_scale_data(src_slot) + r, sizeof(float) * row_scales_);
    if (areas_ == 2)
      std::memcpy(v_scale_data(dst_slot) + r, v_scale_data(src_slot) + r, sizeof(float) * row_scales_);
  }
  const int64_t row = (p % capacity_) * row_bytes_;
  if (areas_ == 1) {  // store-h: the h row is all there is
    std::memcpy(static_cast<uint8_t*>(k_data(dst_slot)) + row,
                static_cast<const uint8_t*>(k_data(src_slot)) + row, row_bytes_);
    return;
  }
  std::memcpy(static_cast<uint8_t*>(k_data(dst_slot)) + row,
              static_cast<const uint8_t*>(k_data(src_slot)) + row, row_bytes_);
  std::memcpy(static_cast<uint8_t*>(v_data(dst_slot)) + row,
              static_cast<const uint8_t*>(v_data(src_slot)) + row, row_bytes_);
}

std::unique_ptr<KvCache> KvCache::clone() const {
  auto c = std::unique_ptr<KvCache>(new KvCache(*this, tracker_));
  return c;
}

KvCache::KvCache(const KvCache& o, MemoryTracker* tracker)
    : layout_(o.layout_),
      capacity_(o.capacity_),
      window_(o.window_),
      n_kv_heads_(o.n_kv_heads_),
      head_dim_(o.head_dim_),
      dim_(o.dim_),
      extra_slots_(o.extra_slots_),
      dtype_(o.dtype_),
      row_bytes_(o.row_bytes_),
      areas_(o.areas_),
      row_scales_(o.row_scales_),
      scale_off_(o.scale_off_),
      slot_bytes_(o.slot_bytes_),
      bytes_(o.bytes_),
      length_(o.length_),
      tracker_(tracker) {
  data_ = alloc_huge_pages(static_cast<size_t>(bytes_));
  std::memcpy(data_.get(), o.data_.get(), static_cast<size_t>(bytes_));
  tracked_ = TrackedBytes(tracker, bytes_);
  shared_prefix_ = o.shared_prefix_;  // a clone of a tail still reads the same prefix
}

void KvCache::set_shared_prefix(const KvCache* prefix) {
  // The two-segment attention (ops/attention_segments) reads F32/F16 rows only, and a
  // prefix's shared loop groups would hold the prefix's last iteration where generate of
  // the whole text sees each iteration's own K/V: refuse both rather than differ.
  if (dtype_ == ops::KvDType::I8 || prefix->dtype() == ops::KvDType::I8)
    throw std::invalid_argument(
        "kv_mode 'int8' does not support a shared prefix KV yet (prefix cache, prefix pool, "
        "beam search): use kv_mode 'fp16' or 'fp32'");
  if (ops::is_store_h(dtype_) || ops::is_store_h(prefix->dtype()))
    throw std::invalid_argument(
        "store-h kv_mode (h_fp16, h_int8, h_int4) does not support a shared prefix KV yet "
        "(prefix cache, prefix pool, beam search): use kv_mode 'fp16' or 'fp32'");
  if (layout_.shared() || prefix->layout().shared())
    throw std::invalid_argument(
        "kv_loop_slots (recurrence-shared KV) does not support a shared prefix KV (prefix "
        "cache, prefix pool, beam search)");
  // A window is fine when both segments apply the same one and the prefix never wrapped:
  // attention then reads each prefix position from its own row (beam search with
  // cache_window builds its prompt that way).
  if (length_ != 0 || window_ != prefix->window() || prefix->length() > prefix->capacity() ||
      prefix->layout().count() != layout_.count() || prefix->dtype() != dtype_ ||
      prefix->n_kv_heads() != n_kv_heads_ || prefix->head_dim() != head_dim_)
    throw std::invalid_argument("set_shared_prefix: the prefix does not match this cache");
  shared_prefix_ = prefix;
  length_ = prefix->length();
}

void KvCache::assign_tail_from(const KvCache& src) {
  if (&src == this) return;
  if (!shared_prefix_ || src.shared_prefix_ != shared_prefix_ || src.capacity_ != capacity_ ||
      src.row_bytes_ != row_bytes_ || src.slot_count() != slot_count())
    throw std::logic_error("assign_tail_from: the caches are not tails of one shape over one prefix");
  const int64_t first = shared_prefix_->length();
  if (src.length_ - first > capacity_)
    throw std::logic_error("assign_tail_from: the source tail has wrapped");
  auto& from = const_cast<KvCache&>(src);  // k_data/v_data are not const; nothing is written
  for (int64_t s = 0; s < slot_count(); ++s)
    for (int64_t p = first; p < src.length_; ++p) {
      const int64_t row = (p % capacity_) * row_bytes_;
      std::memcpy(static_cast<uint8_t*>(k_data(s)) + row, static_cast<const uint8_t*>(from.k_data(s)) + row,
                  row_bytes_);
      std::memcpy(static_cast<uint8_t*>(v_data(s)) + row, static_cast<const uint8_t*>(from.v_data(s)) + row,
                  row_bytes_);
    }
  length_ = src.length_;
}

void KvCache::write(int64_t slot, const float* k_rows, const float* v_rows, const int64_t* pos,
                    int64_t T) {
  if (ops::is_store_h(dtype_))
    throw std::invalid_argument(
        "store-h kv_mode (h_fp16, h_int8, h_int4) keeps h, not K/V rows: this feature "
        "(speculative decoding) does not support it yet");
  ops::kv_write(dtype_, k_data(slot), v_data(slot), capacity_, n_kv_heads_, head_dim_, k_rows,
                v_rows, pos, T, k_scale_data(slot), v_scale_data(slot));
}

float* KvCache::k_scale_data(int64_t slot) {
  if (row_scales_ == 0) return nullptr;
  return reinterpret_cast<float*>(data_.get() + slot * slot_bytes_ + scale_off_);
}
float* KvCache::v_scale_data(int64_t slot) {
  if (row_scales_ == 0 || areas_ != 2) return nullptr;
  return k_scale_data(slot) + capacity_ * row_scales_;
}

int64_t KvCache::bytes_per_position_per_slot() const {
  return areas_ * (row_bytes_ + row_scales_ * int64_t(sizeof(float)));
}

void KvCache::write_h(int64_t slot, const float* h, const int64_t* pos, int64_t T) {
  if (!ops::is_store_h(dtype_)) throw std::logic_error("write_h on a K/V cache");
  uint8_t* base = static_cast<uint8_t*>(k_data(slot));  // [capacity, row_bytes]
  float* sc = k_scale_data(slot);                       // [capacity, row_scales] or null
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = pos[t] % capacity_;
    ops::h_row_store(dtype_, h + t * dim_, dim_, base + r * row_bytes_,
                     sc ? sc + r * row_scales_ : nullptr);
  }
}

void KvCache::read_h(int64_t slot, int64_t p, float* out) const {
  KvCache& self = const_cast<KvCache&>(*this);  // read only; the accessors are shared
  const int64_t r = p % capacity_;
  const float* sc = self.k_scale_data(slot);
  ops::h_row_load(dtype_, static_cast<const uint8_t*>(self.k_data(slot)) + r * row_bytes_,
                  sc ? sc + r * row_scales_ : nullptr, dim_, out);
}

void* KvCache::k_data(int64_t slot) { return data_.get() + slot * slot_bytes_; }
void* KvCache::v_data(int64_t slot) {
  if (areas_ != 2) return nullptr;  // store-h keeps no V
  return data_.get() + slot * slot_bytes_ + capacity_ * row_bytes_;
}

ops::KvView KvCache::view(int64_t slot) const {
  ops::KvView v;
  v.dtype = dtype_;
  v.k = data_.get() + slot * slot_bytes_;
  v.v = data_.get() + slot * slot_bytes_ + capacity_ * row_bytes_;
  v.capacity = capacity_;
  v.n_kv_heads = n_kv_heads_;
  v.head_dim = head_dim_;
  if (dtype_ == ops::KvDType::I8) {
    float* base = const_cast<KvCache*>(this)->k_scale_data(slot);  // [2][capacity, n_kv_heads]
    v.k_scale = base;
    v.v_scale = base + capacity_ * n_kv_heads_;
  }
  return v;
}

}  // namespace tinyloop::model
