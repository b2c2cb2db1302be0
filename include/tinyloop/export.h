// TINYLOOP_API marks what libtinyloop exports. The library is built with hidden visibility
// (src/api/CMakeLists.txt), so only the public API's symbols are visible to a program and
// the runtime's internals cannot clash with a program's own symbols.
#pragma once

#if defined(_WIN32)
#define TINYLOOP_API
#else
#define TINYLOOP_API __attribute__((visibility("default")))
#endif
