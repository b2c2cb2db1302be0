// Test-only helper: build .tinyloop (safetensors) byte buffers in memory, so tests can write a
// valid file and then corrupt exactly one thing in it (docs/model-format.md, "Layout").
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinyloop/config.h"

namespace tinyloop::testing {

// A file before serialisation: the header JSON (tensors + __metadata__) and the data section.
// Tests edit `header` or `data` to make one corruption, then call serialize().
struct RawFile {
  nlohmann::json header;
  std::vector<uint8_t> data;
};

inline uint64_t test_elem_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I64" || dtype == "F64") return 8;
  return 1;
}

// Norms and biases stay F32 whatever dtype the big weights use (the v1 rule).
inline std::string test_dtype_for(const std::string& name, const std::string& weight_dtype) {
  const auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".bias") || ends("norm.weight") ? "F32" : weight_dtype;
}

// A valid file for `c`: every tensor the config needs, weights in `weight_dtype`, laid out
// in order of decreasing element size (so each is aligned), data bytes a fixed pattern.
inline RawFile make_raw_file(const ModelConfig& c, const std::string& weight_dtype = "F32") {
  struct Item {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t elem;
  };
  std::vector<Item> items;
  for (const auto& [name, shape] : expected_tensor_shapes(c)) {
    const std::string dt = test_dtype_for(name, weight_dtype);
    items.push_back({name, dt, shape, test_elem_size(dt)});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.elem > b.elem; });
  RawFile f;
  for (const Item& it : items) {
    uint64_t n = it.elem;
    for (int64_t d : it.shape) n *= uint64_t(d);
    const uint64_t begin = f.data.size();
    for (uint64_t i = 0; i < n; ++i) f.data.push_back(uint8_t((begin + i) * 131 + 7));
    f.header[it.name] = {{"dtype", it.dtype}, {"shape", it.shape}, {"data_offsets", {begin, begin + n}}};
  }
  f.header["__metadata__"] = {{"format", "tinyloop"}, {"format_version", "1"}, {"config", config_to_json(c)}};
  return f;
}

// One tensor of a file being built (data: a fixed byte pattern).
struct TestTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

// Lays `tensors` out in order of decreasing element size (stable), so every tensor is
// aligned, with `metadata` as __metadata__. Tests build a valid list, edit one entry (drop,
// retype, reshape) and build again: the layout stays valid, only the intended check fires.
inline RawFile build_raw_file(std::vector<TestTensor> tensors, const nlohmann::json& metadata) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const TestTensor& a, const TestTensor& b) {
    return test_elem_size(a.dtype) > test_elem_size(b.dtype);
  });
  RawFile f;
  for (const TestTensor& t : tensors) {
    uint64_t n = test_elem_size(t.dtype);
    for (int64_t d : t.shape) n *= uint64_t(d);
    const uint64_t begin = f.data.size();
    for (uint64_t i = 0; i < n; ++i) f.data.push_back(uint8_t((begin + i) * 131 + 7));
    f.header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, begin + n}}};
  }
  f.header["__metadata__"] = metadata;
  return f;
}

// The tensors of `c` with every linear, the embedding and the head quantized (format
// version 2): qdtype "I8" ([N, K]) or "U8" (int4, [N, K / 2]), group size G, companions
// `.scales` (and `.offsets` for U8) of scale_dtype [N, K / G]. Everything else F32.
inline std::vector<TestTensor> quantized_tensors(const ModelConfig& c, const std::string& qdtype, int64_t G,
                                                 const std::string& scale_dtype = "F16") {
  const auto ends = [](const std::string& n, const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  std::vector<TestTensor> out;
  for (const auto& [name, shape] : expected_tensor_shapes(c)) {
    const bool quant =
        shape.size() == 2 &&
        (name == "embed.weight" || name == "head.weight" || name == "inject.weight" || ends(name, "attn.wq.weight") ||
         ends(name, "attn.wk.weight") || ends(name, "attn.wv.weight") || ends(name, "attn.wqkv.weight") ||
         ends(name, "attn.wo.weight") || ends(name, "mlp.w_gate.weight") || ends(name, "mlp.w_up.weight") ||
         ends(name, "mlp.w_down.weight"));
    if (!quant) {
      out.push_back({name, "F32", shape});
      continue;
    }
    const int64_t N = shape[0], K = shape[1];
    out.push_back({name, qdtype, {N, qdtype == "U8" ? K / 2 : K}});
    out.push_back({name + ".scales", scale_dtype, {N, K / G}});
    if (qdtype == "U8") out.push_back({name + ".offsets", scale_dtype, {N, K / G}});
  }
  return out;
}

inline nlohmann::json test_metadata(const ModelConfig& c, const std::string& version) {
  return {{"format", "tinyloop"}, {"format_version", version}, {"config", config_to_json(c)}};
}

// 8-byte little-endian header length, the header padded with spaces to a 64-byte boundary,
// then the data section.
inline std::vector<uint8_t> serialize_header_and_data(const std::string& header_text,
                                                      const std::vector<uint8_t>& data) {
  std::string h = header_text;
  while ((8 + h.size()) % 64 != 0) h.push_back(' ');
  std::vector<uint8_t> out(8 + h.size() + data.size());
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  std::copy(h.begin(), h.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + int64_t(h.size()));
  return out;
}

inline std::vector<uint8_t> serialize(const RawFile& f) { return serialize_header_and_data(f.header.dump(), f.data); }

// A small config that exercises prelude, loop and coda layers with GQA.
inline ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 8;
  c.vocab_size = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.ffn_dim = 12;
  c.n_pre_blocks = 1;
  c.n_loop_layers = 2;
  c.n_post_blocks = 1;
  c.eos_ids = {3};
  return c;
}

// A file under the system temp dir, removed when the object dies.
class TempFile {
 public:
  TempFile() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::temp_directory_path() /
             ("tinyloop_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".tinyloop"))
                .string();
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& write(const std::vector<uint8_t>& bytes) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tinyloop::testing
