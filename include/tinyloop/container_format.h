// The .tinyloop container's constants and layout rules, declared once for the C++ reader
// (src/io/model_file.cc) and the Python writer and reader, which read them through
// tinyloop_py.container_format() (docs/model-format.md, "Layout").
#pragma once
#include <cstdint>
#include <string>

namespace tinyloop {

// A safetensors file: a little-endian u64 header length N, N bytes of JSON, the data.
inline constexpr uint64_t kHeaderLenBytes = 8;
// Writers pad the header with spaces so the data section starts on a multiple of this (the
// reader needs only each tensor at a multiple of its element size).
inline constexpr uint64_t kDataAlignment = 64;
inline constexpr const char* kMetadataKey = "__metadata__";

// __metadata__ keys (string -> string).
inline constexpr const char* kMetaFormat = "format";  // always kFormatName
inline constexpr const char* kMetaFormatVersion = "format_version";  // "1" or "2"
inline constexpr const char* kMetaConfig = "config";  // the config JSON
inline constexpr const char* kMetaTokenizer = "tokenizer";  // optional tokenizer.json
inline constexpr const char* kMetaChatTemplate = "chat_template";  // optional
inline constexpr const char* kFormatName = "tinyloop";

// Version 1: float weights. Version 2 adds int8 / int4 weights (I8 / U8 tensors with
// `.scales` / `.offsets` companions); writers use 2 only when a file holds one, so float
// models stay readable by version-1 readers.
inline constexpr const char* kFormatVersionFloat = "1";
inline constexpr const char* kFormatVersionQuant = "2";
inline constexpr const char* kFormatVersions[] = {kFormatVersionFloat, kFormatVersionQuant};

// Raw safetensors dtype of a stored tensor.
enum class StoredDType { F32, F16, BF16, I8, U8, I32, I64, F64, Unknown };

// What a dtype may hold: Float = computable weights (norms and biases only F32), Quantized =
// int8 (I8) / int4 two a byte (U8) weights under version 2, Unsupported = a dtype this
// reader names (and sizes, for the layout checks) but refuses.
enum class DTypeUse { Float, Quantized, Unsupported };

struct DTypeInfo {
  const char* name;  // as written in the header
  StoredDType dtype;
  uint64_t size;  // bytes per element
  DTypeUse use;
  bool scale;  // allowed for a quantized weight's `.scales` / `.offsets`
};

inline constexpr DTypeInfo kDTypes[] = {
    {"F32", StoredDType::F32, 4, DTypeUse::Float, true},
    {"F16", StoredDType::F16, 2, DTypeUse::Float, true},
    {"BF16", StoredDType::BF16, 2, DTypeUse::Float, false},
    {"I8", StoredDType::I8, 1, DTypeUse::Quantized, false},
    {"U8", StoredDType::U8, 1, DTypeUse::Quantized, false},
    {"I32", StoredDType::I32, 4, DTypeUse::Unsupported, false},
    {"I64", StoredDType::I64, 8, DTypeUse::Unsupported, false},
    {"F64", StoredDType::F64, 8, DTypeUse::Unsupported, false},
};

// nullptr for a name outside kDTypes.
constexpr const DTypeInfo* find_dtype_info(const char* name) {
  for (const auto& d : kDTypes) {
    const char* a = d.name;
    const char* b = name;
    while (*a && *a == *b) ++a, ++b;
    if (*a == *b) return &d;
  }
  return nullptr;
}

constexpr const DTypeInfo& dtype_info(StoredDType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d;
  return kDTypes[0];  // Unknown never reaches here: read_entry refuses unknown names
}

// The constants above as JSON text, for the Python package.
std::string container_format_json();

}  // namespace tinyloop
