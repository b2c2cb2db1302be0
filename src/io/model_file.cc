// The .tinyloop container: memory-map a safetensors file and validate every byte we will use
// (docs/model-format.md, "Layout" and "The loader checks"). The file is untrusted input: every
// size is computed with overflow checks and every offset is checked against the mapping before
// a pointer into it is formed.
#include "tinyloop/model_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "tinyloop/checked.h"
#include "tinyloop/errors.h"

namespace tinyloop {
namespace {

using json = nlohmann::json;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Every FormatError names the file, so a message is useful on its own in a log.
[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw FormatError("model file " + quoted(path) + ": " + msg);
}

[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& msg) {
  fail(path, "tensor " + quoted(name) + ": " + msg);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- the OS side: open, size, map ----

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

int open_readonly(const std::string& path) {
  // c_str() would silently open the path up to the first NUL.
  if (path.find('\0') != std::string::npos)
    throw std::invalid_argument("model path contains a NUL byte: " +
                                quoted(printable_utf8(path.substr(0, path.find('\0'))) + "\\0..."));
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is refused as not
  // a regular file right after); on a regular file the flag changes nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw FileNotFound("cannot open model file " + quoted(path) + ": " + std::strerror(errno));
  return fd;
}

uint64_t regular_file_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw FileNotFound("cannot stat model file " + quoted(path) + ": " + std::strerror(errno));
  // A directory opens fine with O_RDONLY but is no file to read.
  if (!S_ISREG(st.st_mode)) throw FileNotFound("model file " + quoted(path) + " is not a regular file");
  return uint64_t(st.st_size);
}

void* map_file(int fd, uint64_t size, const std::string& path) {
  if (size > uint64_t(std::numeric_limits<size_t>::max())) fail(path, "file too large to map");
  void* p = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(errno));
  return p;
}

// use_mmap = false: the whole file read into a page-aligned heap buffer, so later changes
// to the file on disk (truncation: SIGBUS through a mapping) cannot reach the model.
void* read_file(int fd, uint64_t size, const std::string& path) {
  if (size > uint64_t(std::numeric_limits<size_t>::max()) - 4096) fail(path, "file too large to read");
  const size_t alloc = checked_round_up<FormatError>(size_t(size), size_t(4096), "model file size");
  void* p = std::aligned_alloc(4096, alloc);
  if (!p) throw std::bad_alloc();
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::pread(fd, static_cast<uint8_t*>(p) + got, size_t(size) - got, off_t(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "the file shrank while being read";
      std::free(p);
      fail(path, "read failed after " + std::to_string(got) + " of " + std::to_string(size) + " bytes: " + why);
    }
    got += size_t(n);
  }
  return p;
}

// ---- header: length prefix and JSON ----

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void check_min_size(uint64_t size, const std::string& path) {
  if (size <= kHeaderLenBytes)
    fail(path, "file is " + std::to_string(size) + " bytes, too short for a header (needs more than 8; truncated?)");
}

// Length of the JSON header, checked to fit in the file after the 8-byte prefix.
uint64_t header_length(const uint8_t* bytes, uint64_t size, const std::string& path) {
  const uint64_t n = read_u64_le(bytes);
  // Compare against size - 8 rather than n + 8 > size, which could wrap.
  if (n > size - kHeaderLenBytes)
    fail(path, "header length " + std::to_string(n) + " does not fit in the file (" + std::to_string(size) + " bytes)");
  return n;
}

json parse_header(const uint8_t* begin, uint64_t n, const std::string& path) {
  json j;
  // A key twice in one object (a tensor, __metadata__, a config field) is refused: a JSON
  // parser keeps one of them silently, and which one differs between readers.
  std::vector<std::set<std::string>> keys;  // one set per open object
  const json::parser_callback_t no_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    else if (event == json::parse_event_t::object_end) keys.pop_back();
    else if (event == json::parse_event_t::key && !keys.empty() &&
             !keys.back().insert(parsed.get<std::string>()).second)
      fail(path, "header has the key " + quoted(parsed.get<std::string>()) + " twice" +
                     (depth == 1 ? " (duplicate tensor name)" : ""));
    return true;
  };
  try {
    j = json::parse(begin, begin + n, no_duplicates);
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(path, "header is not a JSON object");
  return j;
}

// ---- metadata ----

std::map<std::string, std::string> read_metadata(const json& header, const std::string& path) {
  const auto it = header.find(kMetadataKey);
  if (it == header.end()) fail(path, "header has no __metadata__ (format, format_version, config)");
  if (!it->is_object()) fail(path, "__metadata__ is not an object of string to string");
  std::map<std::string, std::string> md;
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string()) fail(path, "__metadata__ value of " + quoted(key) + " is not a string");
    md[key] = value.get<std::string>();
  }
  return md;
}

const std::string& required_key(const std::map<std::string, std::string>& md, const char* key,
                                const std::string& path) {
  const auto it = md.find(key);
  if (it == md.end()) fail(path, std::string("__metadata__ is missing ") + quoted(key));
  return it->second;
}

// Checked before the tensors, so a newer file is refused as "unknown version" rather than
// for some dtype or layout this reader happens not to know.
void check_format(const std::map<std::string, std::string>& md, const std::string& path) {
  const std::string& format = required_key(md, kMetaFormat, path);
  if (format != kFormatName)
    fail(path, "__metadata__ " + quoted(kMetaFormat) + " is " + quoted(format) + ", expected " + quoted(kFormatName));
  const std::string& version = required_key(md, kMetaFormatVersion, path);
  std::string known;
  for (const char* v : kFormatVersions) {
    if (version == v) return;
    known += std::string(known.empty() ? "" : " and ") + v;
  }
  fail(path, "unknown format_version " + quoted(version) + " (this reader knows versions " + known + ")");
}

ModelConfig read_config(const std::map<std::string, std::string>& md, const std::string& path) {
  const std::string& text = required_key(md, kMetaConfig, path);
  try {
    return parse_config(text);
  } catch (const FormatError& e) {
    // parse_config's message says "config: <field> ..."; the prefix names where the text was.
    fail(path, "__metadata__ " + quoted(kMetaConfig) + ": " + e.what());
  }
}

// ---- one tensor entry ----

const DTypeInfo* find_dtype(const std::string& name) { return find_dtype_info(name.c_str()); }

// A tensor entry before it is bound to the mapping: offsets relative to the data section.
struct Entry {
  TensorInfo info;
  uint64_t begin = 0;
  uint64_t end = 0;
};

void check_entry_keys(const std::string& name, const json& v, const std::string& path) {
  if (!v.is_object()) fail_tensor(path, name, "entry is not a JSON object");
  for (const auto& [key, value] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail_tensor(path, name, "unknown key " + quoted(key));
}

const json& member(const std::string& name, const json& v, const char* key, const std::string& path) {
  const auto it = v.find(key);
  if (it == v.end()) fail_tensor(path, name, std::string("missing ") + quoted(key));
  return *it;
}

const DTypeInfo& read_dtype(const std::string& name, const json& v, const std::string& path) {
  const json& d = member(name, v, "dtype", path);
  if (!d.is_string()) fail_tensor(path, name, "dtype is not a string");
  const DTypeInfo* info = find_dtype(d.get<std::string>());
  if (!info) fail_tensor(path, name, "unknown dtype " + quoted(d.get<std::string>()));
  return *info;
}

// One shape dimension: a JSON integer in [0, INT64_MAX].
int64_t read_dim(const std::string& name, const json& d, const std::string& path) {
  if (!d.is_number_integer()) fail_tensor(path, name, "shape holds a non-integer");
  if (d.is_number_unsigned()) {
    if (d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      fail_tensor(path, name, "shape dimension too large (size overflow)");
    return d.get<int64_t>();
  }
  const int64_t v = d.get<int64_t>();
  if (v < 0) fail_tensor(path, name, "negative dimension " + std::to_string(v) + " in shape");
  return v;
}

std::vector<int64_t> read_shape(const std::string& name, const json& v, const std::string& path) {
  const json& s = member(name, v, "shape", path);
  if (!s.is_array()) fail_tensor(path, name, "shape is not a list");
  std::vector<int64_t> shape;
  for (const json& d : s) shape.push_back(read_dim(name, d, path));
  return shape;
}

uint64_t read_offset(const std::string& name, const json& d, const std::string& path) {
  if (!d.is_number_unsigned()) fail_tensor(path, name, "data_offsets must be non-negative integers");
  return d.get<uint64_t>();
}

// Byte size of shape x element size, refusing anything that does not fit in 64 bits.
uint64_t checked_nbytes(const std::string& name, const std::vector<int64_t>& shape, uint64_t elem_size,
                        const std::string& path) {
  uint64_t n = elem_size;
  try {
    for (int64_t d : shape) n = checked_mul(n, uint64_t(d), "byte size");
  } catch (const std::overflow_error&) {
    fail_tensor(path, name, "byte size of shape " + shape_str(shape) + " overflows (size overflow)");
  }
  return n;
}

Entry read_entry(const std::string& name, const json& v, uint64_t data_size, const std::string& path) {
  check_entry_keys(name, v, path);
  const DTypeInfo& dt = read_dtype(name, v, path);
  Entry e;
  e.info.name = name;
  e.info.dtype = dt.dtype;
  e.info.dtype_name = dt.name;
  e.info.shape = read_shape(name, v, path);
  e.info.nbytes = checked_nbytes(name, e.info.shape, dt.size, path);

  const json& off = member(name, v, "data_offsets", path);
  if (!off.is_array() || off.size() != 2) fail_tensor(path, name, "data_offsets is not [begin, end]");
  e.begin = read_offset(name, off[0], path);
  e.end = read_offset(name, off[1], path);
  if (e.begin > e.end)
    fail_tensor(path, name,
                "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] end before they begin");
  if (e.end > data_size)
    fail_tensor(path, name,
                "data_offsets end " + std::to_string(e.end) + " beyond the file: past the end of the data section (" +
                    std::to_string(data_size) + " bytes; truncated?)");
  if (e.end - e.begin != e.info.nbytes)
    fail_tensor(path, name,
                "shape " + shape_str(e.info.shape) + " of " + dt.name + " is " + std::to_string(e.info.nbytes) +
                    " bytes but data_offsets span " + std::to_string(e.end - e.begin) + " (size mismatch)");
  return e;
}

// ---- the data section as a whole ----

// Sorted by offset, the tensors must tile [0, data_size) exactly: no overlap, no hole.
void check_tiling(std::vector<const Entry*> entries, uint64_t data_size, const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : entries) {
    if (e->begin < covered)
      fail(path, "tensor " + quoted(e->info.name) + " overlaps tensor " + quoted(prev->info.name));
    if (e->begin > covered)
      fail(path, "hole in the data section: bytes [" + std::to_string(covered) + ", " + std::to_string(e->begin) +
                     ") belong to no tensor (before tensor " + quoted(e->info.name) + ")");
    covered = e->end;
    prev = e;
  }
  if (covered != data_size)
    fail(path, "hole in the data section: bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) +
                   ") at its end are not covered by any tensor");
}

uint64_t element_size(StoredDType t) { return dtype_info(t).size; }

// The engine computes straight from the mapping (page-aligned), so a tensor's file offset
// must be a multiple of its element size or its typed loads would be misaligned.
void check_alignment(const Entry& e, uint64_t data_start, const std::string& path) {
  const uint64_t elem = element_size(e.info.dtype);
  if ((data_start + e.begin) % elem != 0)
    fail_tensor(path, e.info.name,
                "starts at file offset " + std::to_string(data_start + e.begin) +
                    ", not a multiple of its element size " + std::to_string(elem));
}

// ---- tensors against the config ----

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Norm weights and all biases are F32; everything else is a computable weight.
bool must_be_f32(const std::string& name) { return ends_with(name, ".bias") || ends_with(name, "norm.weight"); }

bool is_quant_dtype(StoredDType t) { return dtype_info(t).use == DTypeUse::Quantized; }

// The weights that may be stored int8 / int4: every linear, the embedding and the head.
bool quantizable(const std::string& name) {
  static const char* const kSuffixes[] = {".attn.wq.weight",   ".attn.wk.weight",   ".attn.wv.weight",
                                          ".attn.wqkv.weight", ".attn.wo.weight",   ".mlp.w_gate.weight",
                                          ".mlp.w_up.weight",  ".mlp.w_down.weight"};
  if (name == "inject.weight" || name == "embed.weight" || name == "head.weight") return true;
  for (const char* s : kSuffixes)
    if (ends_with(name, s)) return true;
  return false;
}

// Other float weights may be F32, F16 or BF16; quantized ones are checked by check_quantized
// and dtypes no model uses were refused up front (check_against_config).
void check_dtype(const TensorInfo& t, const std::string& path) {
  if (must_be_f32(t.name) && t.dtype != StoredDType::F32)
    fail_tensor(path, t.name, "dtype " + t.dtype_name + " not supported: norms and biases must be F32");
}

// A quantized weight `name` (expected logical shape [N, K]) and its companions: the stored
// shape ([N, K] for I8, [N, K / 2] for U8), `.scales` (and `.offsets` for U8) F16 or F32
// of one dtype, shaped [N, K / G] with G dividing K (and even for U8).
void check_quantized(const TensorInfo& t, const std::vector<int64_t>& shape,
                     const std::map<std::string, TensorInfo>& tensors, const std::string& path) {
  const bool u4 = t.dtype == StoredDType::U8;
  if (!quantizable(t.name))
    fail_tensor(path, t.name, "dtype " + t.dtype_name + ": only linear, embed and head weights may be quantized");
  const int64_t N = shape.at(0), K = shape.at(1);
  if (u4 && K % 2 != 0)
    fail_tensor(path, t.name, "dtype U8 (int4) needs an even number of columns, the config gives " + std::to_string(K));
  const std::vector<int64_t> stored = {N, u4 ? K / 2 : K};
  if (t.shape != stored)
    fail_tensor(path, t.name,
                "wrong shape: expected " + shape_str(stored) + (u4 ? " (int4: [out, in / 2])" : "") + ", found " +
                    shape_str(t.shape));
  if (!u4 && tensors.count(t.name + ".offsets"))
    fail_tensor(path, t.name + ".offsets", "leftover: an I8 (int8) weight has no offsets");
  // The companions: present with a scale dtype; for int4 the offsets match the scales in
  // dtype and shape; then the groups.
  std::vector<const TensorInfo*> companions;
  for (const char* suffix : {".scales", ".offsets"}) {
    if (!u4 && std::string(suffix) == ".offsets") break;
    const std::string cname = t.name + suffix;
    const auto it = tensors.find(cname);
    if (it == tensors.end()) fail_tensor(path, cname, "missing (the " + t.dtype_name + " weight needs it)");
    if (!dtype_info(it->second.dtype).scale)
      fail_tensor(path, cname, "dtype " + it->second.dtype_name + " not supported: scales and offsets are F16 or F32");
    companions.push_back(&it->second);
  }
  const TensorInfo& scales = *companions[0];
  const TensorInfo* offsets = u4 ? companions[1] : nullptr;
  if (offsets && offsets->dtype != scales.dtype)
    fail_tensor(
        path, offsets->name,
        "dtype " + offsets->dtype_name + " differs from the scales' " + scales.dtype_name + " (they must match)");
  if (scales.shape.size() != 2 || scales.shape[0] != N || scales.shape[1] <= 0 || K % scales.shape[1] != 0)
    fail_tensor(path, scales.name,
                "wrong shape " + shape_str(scales.shape) + ": expected [" + std::to_string(N) +
                    ", K/G] with the group size G dividing K = " + std::to_string(K));
  if (offsets && offsets->shape != scales.shape)
    fail_tensor(path, offsets->name,
                "shape " + shape_str(offsets->shape) + " differs from the scales' " + shape_str(scales.shape) +
                    " (they must match)");
  if (u4 && (K / scales.shape[1]) % 2 != 0)
    fail_tensor(path, scales.name,
                "group size " + std::to_string(K / scales.shape[1]) +
                    " is odd (int4 packs two columns a byte, so it must be even)");
}

// The companion's weight when `name` is "<weight>.scales" / "<weight>.offsets", else "".
std::string companion_base(const std::string& name) {
  for (const char* suffix : {".scales", ".offsets"})
    if (ends_with(name, suffix)) return name.substr(0, name.size() - std::strlen(suffix));
  return "";
}

void check_layer_count(const ModelConfig& c, size_t n_tensors, const std::string& path) {
  // Each layer needs at least 6 tensors (2 norms, qkv, wo, up, down). Refusing early keeps a
  // config with a huge layer count from building a huge expected-name map first.
  const uint64_t layers = uint64_t(c.n_pre_blocks) + uint64_t(c.n_loop_layers) + uint64_t(c.n_post_blocks);
  if (layers > n_tensors / 6)
    fail(path, "config needs " + std::to_string(layers) + " layers but the file holds only " +
                   std::to_string(n_tensors) + " tensors (tensors missing)");
}

void check_against_config(const ModelConfig& c, const std::map<std::string, TensorInfo>& tensors,
                          const std::string& version, const std::string& path) {
  // Before matching names, so a tensor of a dtype no model uses is refused as that even when
  // the config has no place for it.
  for (const auto& [name, info] : tensors)
    if (dtype_info(info.dtype).use == DTypeUse::Unsupported)
      fail_tensor(path, name,
                  "unsupported dtype " + info.dtype_name +
                      " (weights are F32, F16 or BF16, or I8 / U8 with scales under format version 2)");
  if (version == kFormatVersionFloat)
    for (const auto& [name, info] : tensors)
      if (is_quant_dtype(info.dtype))
        fail_tensor(path, name,
                    "dtype " + info.dtype_name +
                        " (quantized weights) not supported by format version 1 (needs format_version 2)");
  check_layer_count(c, tensors.size(), path);
  const auto expected = expected_tensor_shapes(c);
  for (const auto& [name, shape] : expected) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) fail_tensor(path, name, "required by the config but missing");
    if (is_quant_dtype(it->second.dtype)) {
      check_quantized(it->second, shape, tensors, path);
      continue;
    }
    if (it->second.shape != shape)
      fail_tensor(path, name, "wrong shape: expected " + shape_str(shape) + ", found " + shape_str(it->second.shape));
    check_dtype(it->second, path);
  }
  for (const auto& [name, info] : tensors) {
    if (expected.count(name)) continue;
    // A companion is used when its weight is an expected quantized tensor (I8 offsets were
    // refused above by check_quantized).
    const std::string base = companion_base(name);
    const auto w = base.empty() ? tensors.end() : tensors.find(base);
    if (w != tensors.end() && expected.count(base) && is_quant_dtype(w->second.dtype)) continue;
    fail_tensor(path, name, "leftover: not used by the config");
  }
}

}  // namespace

std::shared_ptr<const ModelFile> ModelFile::open(const std::string& path, bool use_mmap) {
  FdGuard fd{open_readonly(path)};
  const uint64_t size = regular_file_size(fd.fd, path);
  check_min_size(size, path);  // also keeps mmap from seeing a zero length

  // Owned from here on, so the destructor unmaps (frees) on every failure below.
  std::shared_ptr<ModelFile> f(new ModelFile());
  f->path_ = path;
  f->size_ = size;
  f->mapped_ = use_mmap;
  f->map_ = use_mmap ? map_file(fd.fd, size, path) : read_file(fd.fd, size, path);
  const auto* bytes = static_cast<const uint8_t*>(f->map_);

  const uint64_t n = header_length(bytes, size, path);
  const json header = parse_header(bytes + kHeaderLenBytes, n, path);
  f->metadata_ = read_metadata(header, path);
  check_format(f->metadata_, path);

  const uint64_t data_start = kHeaderLenBytes + n;
  const uint64_t data_size = size - data_start;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items())
    if (name != kMetadataKey) entries.push_back(read_entry(name, value, data_size, path));
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  check_tiling(order, data_size, path);

  for (Entry& e : entries) {
    check_alignment(e, data_start, path);
    e.info.data = bytes + data_start + e.begin;  // in bounds: end <= data_size was checked
    f->tensors_.emplace(e.info.name, std::move(e.info));
  }
  f->config_ = read_config(f->metadata_, path);
  check_against_config(f->config_, f->tensors_, f->metadata_.at(kMetaFormatVersion), path);
  return f;
}

void ModelFile::release_pages(const void* p, int64_t n) const {
  if (!mapped_ || !p || n <= 0) return;
  const auto base = reinterpret_cast<uintptr_t>(map_), at = reinterpret_cast<uintptr_t>(p);
  if (at < base || at + uint64_t(n) > base + size_) throw std::logic_error("release_pages: range outside the mapping");
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (at + page - 1) / page * page, hi = (at + uint64_t(n)) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // a hint: failure changes nothing
}

ModelFile::~ModelFile() {
  if (map_ && mapped_) ::munmap(map_, size_t(size_));
  if (map_ && !mapped_) std::free(map_);
}

const TensorInfo* ModelFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string ModelFile::tokenizer_json() const {
  const auto it = metadata_.find(kMetaTokenizer);
  return it == metadata_.end() ? std::string() : it->second;
}

std::string ModelFile::chat_template() const {
  const auto it = metadata_.find(kMetaChatTemplate);
  return it == metadata_.end() ? std::string() : it->second;
}

}  // namespace tinyloop
