// ModelFile::open on valid files and on one corruption at a time (docs/model-format.md,
// "The loader checks"), plus a deterministic fuzz over the header bytes.
#include "tinyloop/model_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "io/test_file_builder.h"
#include "tinyloop/errors.h"

namespace tinyloop {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::make_raw_file;
using testing::RawFile;
using testing::serialize;
using testing::serialize_header_and_data;
using testing::TempFile;
using testing::tiny_config;

// The FormatError message of opening `bytes`, or "" if it opened. Other exceptions propagate
// and fail the test.
std::string format_error_of(const std::vector<uint8_t>& bytes) {
  TempFile tmp;
  try {
    ModelFile::open(tmp.write(bytes));
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

std::string format_error_of(const RawFile& f) { return format_error_of(serialize(f)); }

// A valid file with one tensor's header entry edited.
RawFile with_entry(RawFile f, const std::string& name, const std::string& key, const json& value) {
  f.header[name][key] = value;
  return f;
}

// Give tensor `name` a new dtype and shape in place: resize its byte range and shift every
// later tensor, so the data section stays tiled and only the intended check can fire.
void retype_tensor(RawFile& f, const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape) {
  uint64_t n = testing::test_elem_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  const uint64_t b = f.header[name]["data_offsets"][0];
  const uint64_t e = f.header[name]["data_offsets"][1];
  f.data.erase(f.data.begin() + int64_t(b), f.data.begin() + int64_t(e));
  f.data.insert(f.data.begin() + int64_t(b), n, uint8_t(0x5a));
  for (auto& [other, t] : f.header.items()) {
    if (other == "__metadata__") continue;
    const uint64_t tb = t["data_offsets"][0], te = t["data_offsets"][1];
    if (tb >= e && other != name) t["data_offsets"] = {tb - (e - b) + n, te - (e - b) + n};
  }
  f.header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, b + n}}};
}

// Remove tensor `name` and its bytes, keeping the rest tiled.
void drop_tensor(RawFile& f, const std::string& name) {
  retype_tensor(f, name, "F32", {0});
  f.header.erase(name);
}

// ---- valid files ----

TEST(ModelFileOpen, LoadsValidFileAndPointsAtTheRightBytes) {
  const ModelConfig c = tiny_config();
  const RawFile raw = make_raw_file(c);
  TempFile tmp;
  const auto f = ModelFile::open(tmp.write(serialize(raw)));
  EXPECT_EQ(f->path(), tmp.path());
  EXPECT_EQ(f->file_size(), std::filesystem::file_size(tmp.path()));
  EXPECT_EQ(config_to_json(f->config()), config_to_json(c));
  EXPECT_EQ(f->tensors().size(), expected_tensor_shapes(c).size());
  for (const auto& [name, entry] : raw.header.items()) {
    if (name == "__metadata__") continue;
    const TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->name, name);
    EXPECT_EQ(t->dtype, StoredDType::F32);
    EXPECT_EQ(t->dtype_name, "F32");
    EXPECT_EQ(t->shape, entry["shape"].get<std::vector<int64_t>>());
    const uint64_t begin = entry["data_offsets"][0];
    const uint64_t end = entry["data_offsets"][1];
    ASSERT_EQ(t->nbytes, end - begin);
    EXPECT_EQ(std::memcmp(t->data, raw.data.data() + begin, t->nbytes), 0) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 4, 0u) << name;
  }
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_EQ(f->tokenizer_json(), "");
  EXPECT_EQ(f->chat_template(), "");
}

TEST(ModelFileOpen, MixedDtypesAndEveryOptionalTensor) {
  ModelConfig c = tiny_config();
  c.norm_type = NormType::LayerNorm;
  c.norm_bias = true;
  c.norm_placement = NormPlacement::OuroSandwich;
  c.qkv_fused = true;
  c.attn_qkv_bias = c.attn_out_bias = c.mlp_bias = true;
  c.pos_encoding = PosEncoding::Learned;
  c.max_seq_len = 5;
  c.inject = Inject::LinearConcat;
  c.loop_norm = true;
  c.post_loop_norm = PostLoopNorm::Own;
  c.exit_gate = true;
  for (const char* dt : {"F16", "BF16"}) {
    const RawFile raw = make_raw_file(c, dt);
    TempFile tmp;
    const auto f = ModelFile::open(tmp.write(serialize(raw)));
    EXPECT_EQ(f->find("loop.0.attn.wqkv.weight")->dtype_name, dt);
    EXPECT_EQ(f->find("loop.0.attn.wqkv.bias")->dtype, StoredDType::F32);
    EXPECT_EQ(f->find("final_norm.bias")->dtype, StoredDType::F32);
    const TensorInfo* inj = f->find("inject.weight");
    ASSERT_NE(inj, nullptr);
    const uint64_t begin = raw.header["inject.weight"]["data_offsets"][0];
    EXPECT_EQ(std::memcmp(inj->data, raw.data.data() + begin, inj->nbytes), 0);
  }
}

TEST(ModelFileOpen, TokenizerAndChatTemplateFromMetadata) {
  RawFile raw = make_raw_file(tiny_config());
  raw.header["__metadata__"]["tokenizer"] = R"({"model": {"type": "BPE"}})";
  raw.header["__metadata__"]["chat_template"] = "{{ messages }}";
  TempFile tmp;
  const auto f = ModelFile::open(tmp.write(serialize(raw)));
  EXPECT_EQ(f->tokenizer_json(), R"({"model": {"type": "BPE"}})");
  EXPECT_EQ(f->chat_template(), "{{ messages }}");
  EXPECT_EQ(f->metadata().at("format"), "tinyloop");
}

TEST(ModelFileOpen, EmptyLeftoverTensorIsLeftOverNotACrash) {
  // A zero-byte tensor sits at an offset another tensor starts at: the tiling accepts it, and
  // the config check names it as unused.
  RawFile raw = make_raw_file(tiny_config());
  raw.header["extra"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  EXPECT_THAT(format_error_of(raw), HasSubstr("'extra': leftover"));
}

// ---- the OS side ----

TEST(ModelFileOpen, MissingPathIsFileNotFound) {
  EXPECT_THROW(ModelFile::open("/nonexistent/dir/model.tinyloop"), FileNotFound);
}

TEST(ModelFileOpen, DirectoryIsFileNotFound) {
  EXPECT_THROW(ModelFile::open(std::filesystem::temp_directory_path().string()), FileNotFound);
}

// ---- one corruption at a time ----

TEST(ModelFileCorrupt, TooShort) {
  EXPECT_THAT(format_error_of(std::vector<uint8_t>{}), HasSubstr("too short"));
  EXPECT_THAT(format_error_of(std::vector<uint8_t>(8, 0)), HasSubstr("too short"));
}

TEST(ModelFileCorrupt, HeaderLengthLargerThanFile) {
  std::vector<uint8_t> bytes = serialize(make_raw_file(tiny_config()));
  for (int i = 0; i < 8; ++i) bytes[i] = 0xff;  // 2^64 - 1: must not wrap in the check
  EXPECT_THAT(format_error_of(bytes), HasSubstr("does not fit in the file"));
  bytes[7] = 0;
  bytes[6] = 0;  // still huge but not near the wrap
  EXPECT_THAT(format_error_of(bytes), HasSubstr("does not fit in the file"));
}

TEST(ModelFileCorrupt, HeaderNotJson) {
  EXPECT_THAT(format_error_of(serialize_header_and_data("{\"a\": ", {})), HasSubstr("not valid JSON"));
}

TEST(ModelFileCorrupt, HeaderNotObject) {
  EXPECT_THAT(format_error_of(serialize_header_and_data("[1, 2]", {})), HasSubstr("not a JSON object"));
}

TEST(ModelFileCorrupt, MetadataMissingOrNotStringMap) {
  RawFile raw = make_raw_file(tiny_config());
  RawFile no_md = raw;
  no_md.header.erase("__metadata__");
  EXPECT_THAT(format_error_of(no_md), HasSubstr("no __metadata__"));
  RawFile not_obj = raw;
  not_obj.header["__metadata__"] = "tinyloop";
  EXPECT_THAT(format_error_of(not_obj), HasSubstr("__metadata__ is not an object"));
  RawFile not_str = raw;
  not_str.header["__metadata__"]["format_version"] = 1;
  EXPECT_THAT(format_error_of(not_str), HasSubstr("value of 'format_version' is not a string"));
}

TEST(ModelFileCorrupt, MissingFormatVersionOrConfig) {
  for (const char* key : {"format", "format_version", "config"}) {
    RawFile raw = make_raw_file(tiny_config());
    raw.header["__metadata__"].erase(key);
    EXPECT_THAT(format_error_of(raw), HasSubstr(std::string("missing '") + key + "'")) << key;
  }
}

TEST(ModelFileCorrupt, WrongFormatOrUnknownVersion) {
  RawFile raw = make_raw_file(tiny_config());
  raw.header["__metadata__"]["format"] = "gguf";
  EXPECT_THAT(format_error_of(raw), HasSubstr("'format' is 'gguf', expected 'tinyloop'"));
  raw = make_raw_file(tiny_config());
  raw.header["__metadata__"]["format_version"] = "3";
  EXPECT_THAT(format_error_of(raw), HasSubstr("unknown format_version '3'"));
}

TEST(ModelFileCorrupt, UnknownDtype) {
  const RawFile raw = with_entry(make_raw_file(tiny_config()), "embed.weight", "dtype", "F8_E4M3");
  EXPECT_THAT(format_error_of(raw), HasSubstr("'embed.weight': unknown dtype 'F8_E4M3'"));
}

TEST(ModelFileCorrupt, MalformedEntry) {
  RawFile raw = make_raw_file(tiny_config());
  EXPECT_THAT(format_error_of(with_entry(raw, "embed.weight", "extra", 1)), HasSubstr("unknown key 'extra'"));
  EXPECT_THAT(format_error_of(with_entry(raw, "embed.weight", "shape", "16x8")), HasSubstr("shape is not a list"));
  EXPECT_THAT(format_error_of(with_entry(raw, "embed.weight", "shape", {16, 8.5})), HasSubstr("non-integer"));
  EXPECT_THAT(format_error_of(with_entry(raw, "embed.weight", "data_offsets", {0})), HasSubstr("not [begin, end]"));
  EXPECT_THAT(format_error_of(with_entry(raw, "embed.weight", "data_offsets", {-4, 0})), HasSubstr("non-negative"));
  RawFile not_obj = raw;
  not_obj.header["embed.weight"] = 3;
  EXPECT_THAT(format_error_of(not_obj), HasSubstr("'embed.weight': entry is not a JSON object"));
  RawFile no_dtype = raw;
  no_dtype.header["embed.weight"].erase("dtype");
  EXPECT_THAT(format_error_of(no_dtype), HasSubstr("'embed.weight': missing 'dtype'"));
}

TEST(ModelFileCorrupt, ShapeOffsetSizeMismatch) {
  const RawFile raw = with_entry(make_raw_file(tiny_config()), "embed.weight", "shape", {16, 7});
  const std::string msg = format_error_of(raw);
  EXPECT_THAT(msg, HasSubstr("'embed.weight'"));
  EXPECT_THAT(msg, HasSubstr("size mismatch"));
}

TEST(ModelFileCorrupt, NegativeDim) {
  const RawFile raw = with_entry(make_raw_file(tiny_config()), "embed.weight", "shape", {-16, -8});
  EXPECT_THAT(format_error_of(raw), HasSubstr("'embed.weight': negative dimension -16"));
}

TEST(ModelFileCorrupt, SizeOverflow) {
  const uint64_t big = uint64_t(1) << 40;
  RawFile raw = with_entry(make_raw_file(tiny_config()), "embed.weight", "shape", {big, big});
  EXPECT_THAT(format_error_of(raw), HasSubstr("size overflow"));
  raw = with_entry(make_raw_file(tiny_config()), "embed.weight", "shape", {uint64_t(1) << 63});
  EXPECT_THAT(format_error_of(raw), HasSubstr("size overflow"));
}

TEST(ModelFileCorrupt, OffsetsBeyondFile) {
  RawFile raw = make_raw_file(tiny_config());
  const uint64_t end = raw.data.size();
  const std::string name = "embed.weight";
  const uint64_t n =
      raw.header[name]["data_offsets"][1].get<uint64_t>() - raw.header[name]["data_offsets"][0].get<uint64_t>();
  raw = with_entry(raw, name, "data_offsets", {end, end + n});
  EXPECT_THAT(format_error_of(raw), HasSubstr("'embed.weight': data_offsets end"));
  EXPECT_THAT(format_error_of(raw), HasSubstr("beyond the file"));
  raw = with_entry(raw, name, "data_offsets", {18446744073709551615ull, 0});
  EXPECT_THAT(format_error_of(raw), HasSubstr("end before they begin"));
}

TEST(ModelFileCorrupt, OverlappingTensors) {
  RawFile raw = make_raw_file(tiny_config());
  // Point head.weight at embed.weight's bytes (same size), leaving a hole where head was.
  raw.header["head.weight"]["data_offsets"] = raw.header["embed.weight"]["data_offsets"];
  const std::string msg = format_error_of(raw);
  EXPECT_THAT(msg, HasSubstr("overlap"));
  EXPECT_THAT(msg, HasSubstr("'embed.weight'"));
  EXPECT_THAT(msg, HasSubstr("'head.weight'"));
}

TEST(ModelFileCorrupt, HoleInDataSection) {
  RawFile raw = make_raw_file(tiny_config());
  raw.data.insert(raw.data.end(), 4, 0);  // trailing bytes no tensor owns
  EXPECT_THAT(format_error_of(raw), HasSubstr("hole in the data section"));
  RawFile mid = make_raw_file(tiny_config());
  // Shift every tensor up by 4 bytes: bytes [0, 4) belong to nobody.
  for (auto& [name, e] : mid.header.items()) {
    if (name == "__metadata__") continue;
    e["data_offsets"] = {e["data_offsets"][0].get<uint64_t>() + 4, e["data_offsets"][1].get<uint64_t>() + 4};
  }
  mid.data.insert(mid.data.begin(), 4, 0);
  EXPECT_THAT(format_error_of(mid), HasSubstr("bytes [0, 4) belong to no tensor"));
}

TEST(ModelFileCorrupt, MisalignedTensor) {
  // F16 weights followed by an F32 norm placed at an odd 2-byte boundary.
  RawFile raw = make_raw_file(tiny_config());
  for (auto& [name, e] : raw.header.items()) {
    if (name == "__metadata__") continue;
    e["data_offsets"] = {e["data_offsets"][0].get<uint64_t>() + 2, e["data_offsets"][1].get<uint64_t>() + 2};
  }
  raw.header["pad"] = {{"dtype", "F16"}, {"shape", {1}}, {"data_offsets", {0, 2}}};
  raw.data.insert(raw.data.begin(), 2, 0);
  EXPECT_THAT(format_error_of(raw), HasSubstr("not a multiple of its element size 4"));
}

TEST(ModelFileCorrupt, ConfigErrorsFromParseConfig) {
  RawFile raw = make_raw_file(tiny_config());
  raw.header["__metadata__"]["config"] = R"({"dim": 8})";
  EXPECT_THAT(format_error_of(raw), HasSubstr("config: missing required field 'vocab_size'"));
  raw.header["__metadata__"]["config"] = "not json";
  EXPECT_THAT(format_error_of(raw), HasSubstr("config: not valid JSON"));
  json cfg = json::parse(config_to_json(tiny_config()));
  cfg["n_kv_head"] = 1;
  raw.header["__metadata__"]["config"] = cfg.dump();
  EXPECT_THAT(format_error_of(raw), HasSubstr("unknown field 'n_kv_head'"));
}

TEST(ModelFileCorrupt, TensorTheConfigNeedsIsMissing) {
  RawFile raw = make_raw_file(tiny_config());
  drop_tensor(raw, "head.weight");
  EXPECT_THAT(format_error_of(raw), HasSubstr("'head.weight': required by the config but missing"));
  raw = make_raw_file(tiny_config());
  drop_tensor(raw, "loop.1.mlp.w_gate.weight");
  EXPECT_THAT(format_error_of(raw), HasSubstr("'loop.1.mlp.w_gate.weight': required by the config but missing"));
}

TEST(ModelFileCorrupt, HugeLayerCountIsRefusedCheaply) {
  RawFile raw = make_raw_file(tiny_config());
  json cfg = json::parse(config_to_json(tiny_config()));
  cfg["n_loop_layers"] = 1000000000000LL;
  raw.header["__metadata__"]["config"] = cfg.dump();
  EXPECT_THAT(format_error_of(raw), HasSubstr("tensors missing"));
}

TEST(ModelFileCorrupt, WrongShapeSaysExpectedAndFound) {
  RawFile raw = make_raw_file(tiny_config());
  raw.header["embed.weight"]["shape"] = {8, 16};  // same byte size, transposed
  EXPECT_THAT(format_error_of(raw), HasSubstr("'embed.weight': wrong shape: expected [16, 8], found [8, 16]"));
}

TEST(ModelFileCorrupt, LeftOverTensor) {
  RawFile raw = make_raw_file(tiny_config());
  const uint64_t end = raw.data.size();
  raw.header["loop.5.attn.wq.weight"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {end, end + 8}}};
  raw.data.insert(raw.data.end(), 8, 0);
  EXPECT_THAT(format_error_of(raw), HasSubstr("'loop.5.attn.wq.weight': leftover: not used by the config"));
}

TEST(ModelFileCorrupt, WeightDtypeV1CannotCompute) {
  for (const char* dt : {"I8", "U8"}) {
    RawFile raw = make_raw_file(tiny_config());
    retype_tensor(raw, "loop.0.attn.wq.weight", dt, {8, 8});
    EXPECT_THAT(format_error_of(raw), HasSubstr(std::string("'loop.0.attn.wq.weight': dtype ") + dt +
                                                " (quantized weights) not supported by format version 1"))
        << dt;
  }
  RawFile raw = make_raw_file(tiny_config());
  retype_tensor(raw, "loop.0.attn.wq.weight", "I32", {8, 8});
  EXPECT_THAT(format_error_of(raw), HasSubstr("'loop.0.attn.wq.weight': unsupported dtype I32"));
}

TEST(ModelFileCorrupt, NormsAndBiasesMustBeF32) {
  ModelConfig c = tiny_config();
  c.mlp_bias = true;
  for (const char* name : {"final_norm.weight", "pre.0.attn_norm.weight", "post.0.mlp.w_up.bias"}) {
    RawFile raw = make_raw_file(c);
    const auto shape = raw.header[name]["shape"].get<std::vector<int64_t>>();
    retype_tensor(raw, name, "F16", shape);
    EXPECT_THAT(format_error_of(raw),
                HasSubstr(std::string("'") + name + "': dtype F16 not supported: norms and biases must be F32"))
        << name;
  }
}

// ---- fuzz: never crash, only succeed or throw FormatError ----

enum class Mutation { RawBytes, KeepJsonShape };

// Mutates 1-4 bytes of the length prefix + header. RawBytes writes any byte (mostly breaks the
// JSON); KeepJsonShape swaps a digit for a digit or a letter for a letter, so the header
// usually stays JSON and the later checks (sizes, offsets, names, config) get exercised.
void mutate_header(std::vector<uint8_t>& bytes, uint64_t header_end, Mutation m, std::mt19937_64& rng) {
  const int count = 1 + int(rng() % 4);
  for (int k = 0; k < count; ++k) {
    const uint64_t pos = rng() % header_end;
    uint8_t& b = bytes[pos];
    if (m == Mutation::RawBytes) b = (rng() % 2) ? uint8_t(rng()) : uint8_t(b ^ (1u << (rng() % 8)));
    else if (b >= '0' && b <= '9') b = uint8_t('0' + rng() % 10);
    else if (b >= 'a' && b <= 'z') b = uint8_t('a' + rng() % 26);
    else if (b >= 'A' && b <= 'Z') b = uint8_t('A' + rng() % 26);
  }
  if (rng() % 4 == 0) bytes.resize(rng() % (bytes.size() + 1));
}

// Opens `bytes`; true if it opened (after touching every byte it hands out), false on
// FormatError. Anything else (another exception, a crash, a sanitizer report) fails the test.
bool opens(const std::vector<uint8_t>& bytes, TempFile& tmp) {
  try {
    const auto f = ModelFile::open(tmp.write(bytes));
    uint64_t sum = 0;
    for (const auto& [name, t] : f->tensors())
      for (uint64_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
    (void)sum;
    return true;
  } catch (const FormatError&) {
    return false;
  }
}

TEST(ModelFileFuzz, MutatedAndTruncatedHeadersNeverCrash) {
  ModelConfig c = tiny_config();
  c.qkv_fused = true;
  c.attn_qkv_bias = true;
  RawFile raw = make_raw_file(c, "F16");
  raw.header["__metadata__"]["tokenizer"] = "{}";  // free text in which mutations are harmless
  const std::vector<uint8_t> valid = serialize(raw);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | valid[i];
  std::mt19937_64 rng(12345);
  TempFile tmp;
  for (Mutation m : {Mutation::RawBytes, Mutation::KeepJsonShape}) {
    int opened = 0;
    for (int iter = 0; iter < 300; ++iter) {
      std::vector<uint8_t> bytes = valid;
      mutate_header(bytes, 8 + header_len, m, rng);
      opened += opens(bytes, tmp);
    }
    EXPECT_LT(opened, 300) << "mutations never caught, mode " << int(m);
  }
}

TEST(ModelFileFuzz, DataSectionBytesAreNotValidated) {
  // Weights are arbitrary bits: flipping data bytes must never make a valid file fail.
  const RawFile raw = make_raw_file(tiny_config());
  std::vector<uint8_t> bytes = serialize(raw);
  const uint64_t data_start = bytes.size() - raw.data.size();
  std::mt19937_64 rng(7);
  for (int k = 0; k < 64; ++k) bytes[data_start + rng() % raw.data.size()] = uint8_t(rng());
  TempFile tmp;
  EXPECT_TRUE(opens(bytes, tmp));
}

}  // namespace
}  // namespace tinyloop
