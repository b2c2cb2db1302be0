// The Python PrefixCache object, shared by the prefix cache and prefix pool bindings (a pool
// takes PrefixCaches in and hands them back).
#pragma once
#include <memory>

#include "runtime/prefix_cache.h"

namespace tinyloop::py_bind {

// Opaque to Python; the C++ cache is immutable, so every call shares it (never copied).
struct PyPrefixCache {
  std::shared_ptr<const runtime::PrefixCache> c;
};

}  // namespace tinyloop::py_bind
