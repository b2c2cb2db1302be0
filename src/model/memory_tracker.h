// Live bytes a model holds beyond its weights (KV caches, per-call workspaces), so that
// vram_usage_mb() can report weights + caches + workspace (docs/generation.md, "Memory").
#pragma once
#include <atomic>
#include <cstdint>

namespace tinyloop::model {

struct MemoryTracker {
  std::atomic<int64_t> live_bytes{0};
  std::atomic<int64_t> peak_bytes{0};
  void add(int64_t n) {
    int64_t now = live_bytes.fetch_add(n) + n;
    int64_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {}
  }
  void sub(int64_t n) { live_bytes.fetch_sub(n); }
};

// RAII registration of `bytes` with a tracker (which may be null).
class TrackedBytes {
 public:
  TrackedBytes() = default;
  TrackedBytes(MemoryTracker* t, int64_t bytes) : t_(t), bytes_(bytes) {
    if (t_) t_->add(bytes_);
  }
  ~TrackedBytes() {
    if (t_) t_->sub(bytes_);
  }
  TrackedBytes(const TrackedBytes&) = delete;
  TrackedBytes& operator=(const TrackedBytes&) = delete;
  TrackedBytes(TrackedBytes&& o) noexcept : t_(o.t_), bytes_(o.bytes_) { o.t_ = nullptr; }
  TrackedBytes& operator=(TrackedBytes&& o) noexcept {
    if (this != &o) {
      if (t_) t_->sub(bytes_);
      t_ = o.t_;
      bytes_ = o.bytes_;
      o.t_ = nullptr;
    }
    return *this;
  }

 private:
  MemoryTracker* t_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace tinyloop::model
