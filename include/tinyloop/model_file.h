// A memory-mapped .tinyloop file (safetensors container, docs/model-format.md).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tinyloop/config.h"
#include "tinyloop/container_format.h"

namespace tinyloop {

struct TensorInfo {
  std::string name;
  StoredDType dtype = StoredDType::Unknown;
  std::string dtype_name;  // as written in the header, e.g. "F16"
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  uint64_t nbytes = 0;
};

class ModelFile {
 public:
  // Maps and validates the container, the config, and the config<->tensor consistency
  // (every needed tensor present with the right shape and a supported dtype, quantized
  // weights with consistent companions, none left over), as
  // docs/model-format.md lists. Throws FileNotFound for a missing/unreadable path (or one that
  // is not a regular file: a FIFO or device is refused without blocking),
  // std::invalid_argument for a path holding a NUL byte, FormatError naming the problem
  // otherwise (duplicate JSON keys included).
  // use_mmap = false reads the whole file into memory instead of mapping it: the model then
  // no longer depends on the file (truncating a mapped file gives SIGBUS, rewriting it in
  // place changes the weights under the model; docs/limits.md).
  static std::shared_ptr<const ModelFile> open(const std::string& path, bool use_mmap = true);
  ~ModelFile();
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // true: the weights are the file's mapping; false: a copy read into memory.
  bool mapped() const { return mapped_; }
  const ModelConfig& config() const { return config_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // The tokenizer.json text ("" when the file has none).
  std::string tokenizer_json() const;
  std::string chat_template() const;
  // Tells the kernel that the mapped bytes [p, p + n) will not be read for a while, so their
  // pages stop counting in this process's resident memory (madvise MADV_DONTNEED over the
  // whole pages inside the range): for weights the backend has copied into its own layout.
  // A later read faults them back from the page cache, unchanged (the mapping is private and
  // read-only, never written). Does nothing for a copy read into memory (mapped() false),
  // where it would lose the bytes.
  void release_pages(const void* p, int64_t n) const;

 private:
  ModelFile() = default;
  std::string path_;
  void* map_ = nullptr;  // the mapping, or the heap copy (mapped_ false)
  bool mapped_ = true;
  uint64_t size_ = 0;
  ModelConfig config_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace tinyloop
