// libFuzzer: ModelFile::open on arbitrary bytes (the .tinyloop container: header length,
// JSON header, tensor entries, config, tiling, alignment, config <-> tensors). Every input
// must end in a FormatError (or open); any other exception, crash, leak, hang or sanitizer
// report is a finding. The bytes go through a memfd, so open() sees a regular file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tinyloop/errors.h"
#include "tinyloop/model_file.h"

namespace {

int memfd() {
  static const int fd = [] {
    const int f = ::memfd_create("tinyloop_fuzz_model", 0);
    if (f < 0) std::abort();
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd();
  if (::ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  for (bool use_mmap : {true, false}) {
    try {
      auto f = tinyloop::ModelFile::open(path, use_mmap);
      // A file that opens: every tensor lies inside it.
      for (const auto& [name, t] : f->tensors()) {
        volatile uint8_t sink = 0;
        if (t.nbytes) sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
      }
    } catch (const tinyloop::FormatError&) {}
    if (size % 2) break;  // half the inputs also take the read-into-memory path
  }
  return 0;
}
