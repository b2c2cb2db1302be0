// Issue 16 (hardening), the io layer: the checked-arithmetic helper, the config's upper
// limits, and model files that once hung (a FIFO), opened the wrong path (a NUL byte),
// were accepted with a duplicate key, or produced a message that is not UTF-8; plus
// ModelFile::open(path, use_mmap = false). docs/limits.md lists what each gets.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <vector>
#include <string>

#include "io/test_file_builder.h"
#include "tinyloop/checked.h"
#include "tinyloop/errors.h"
#include "tinyloop/model_file.h"

namespace tinyloop {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using testing::make_raw_file;
using testing::serialize;
using testing::serialize_header_and_data;
using testing::TempFile;
using testing::tiny_config;

// ---- checked.h ----

TEST(Checked, MulAddRoundCastThrowNamingTheQuantity) {
  EXPECT_EQ(checked_mul<std::overflow_error>(int64_t(3), int64_t(4), "x"), 12);
  EXPECT_EQ(checked_add(uint64_t(3), uint64_t(4), "x"), 7u);
  EXPECT_EQ(checked_round_up(size_t(65), size_t(64), "x"), 128u);
  EXPECT_EQ(checked_round_up(size_t(128), size_t(64), "x"), 128u);
  try {
    checked_mul(int64_t(1) << 40, int64_t(1) << 40, "KV bytes");
    FAIL() << "no throw";
  } catch (const std::overflow_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("KV bytes overflows: 1099511627776 x 1099511627776"));
  }
  EXPECT_THROW(checked_add(std::numeric_limits<int64_t>::max(), int64_t(1), "n"), std::overflow_error);
  EXPECT_THROW(checked_add(std::numeric_limits<int64_t>::min(), int64_t(-1), "n"), std::overflow_error);
  EXPECT_THROW(checked_mul(int64_t(-1), std::numeric_limits<int64_t>::min(), "n"), std::overflow_error);
  // The rounding that once wrapped in the huge-page allocator.
  EXPECT_THROW(checked_round_up(std::numeric_limits<size_t>::max() - 5, size_t(1) << 21, "bytes"), std::overflow_error);
  EXPECT_THROW(checked_mul<FormatError>(uint64_t(1) << 63, uint64_t(2), "tensor bytes"), FormatError);
  EXPECT_EQ(checked_cast<int32_t>(int64_t(5), "id"), 5);
  EXPECT_THROW(checked_cast<int32_t>(int64_t(1) << 31, "id"), std::overflow_error);
  EXPECT_THROW(checked_cast<uint64_t>(int64_t(-1), "n"), std::overflow_error);
  EXPECT_THROW(checked_cast<int64_t>(~uint64_t(0), "n"), std::overflow_error);
}

// ---- errors.h ----

TEST(PrintableUtf8, EscapesExactlyTheBytesThatAreNotUtf8) {
  EXPECT_EQ(printable_utf8("plain"), "plain");
  EXPECT_EQ(printable_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(printable_utf8("a\xff"
                           "b"),
            "a\\xffb");
  EXPECT_EQ(printable_utf8("\xc3"), "\\xc3");  // truncated sequence
  EXPECT_EQ(printable_utf8("\xc0\xaf"), "\\xc0\\xaf");  // overlong
  EXPECT_EQ(printable_utf8("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(std::string(FormatError("x\xfe").what()), "x\\xfe");
}

TEST(ModelFileHardening, NonUtf8HeaderByteGivesAPrintableFormatError) {
  const std::string header = "{\"__metadata__\":\xff\xfe}";
  TempFile tmp;
  try {
    ModelFile::open(tmp.write(serialize_header_and_data(header, {})));
    FAIL() << "opened";
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("not valid JSON"));
    EXPECT_EQ(printable_utf8(what), what) << "message is not valid UTF-8";
  }
}

// ---- config limits ----

std::string config_error(const json& j) {
  try {
    parse_config(j.dump());
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

json minimal_config() {
  return {{"dim", 8}, {"vocab_size", 16}, {"n_heads", 2}, {"ffn_dim", 12}, {"n_loop_layers", 1}};
}

TEST(ConfigLimits, DefaultLoopsAndMaxSeqLenAreCappedAtLoad) {
  json j = minimal_config();
  j["default_loops"] = kMaxLoops;
  j["max_seq_len"] = kMaxSeqLen;
  EXPECT_EQ(config_error(j), "");
  j["default_loops"] = int64_t(1) << 59;  // once loaded, then crashed the first call
  EXPECT_THAT(config_error(j), HasSubstr("'default_loops' must be <= 4096"));
  j["default_loops"] = 1;
  j["max_seq_len"] = kMaxSeqLen + 1;
  EXPECT_THAT(config_error(j), HasSubstr("'max_seq_len' must be <= 16777216"));
}

TEST(ConfigLimits, DuplicateFieldIsRefused) {
  try {
    parse_config(R"({"dim": 8, "vocab_size": 16, "n_heads": 2, "ffn_dim": 12, "n_loop_layers": 1, "dim": 16})");
    FAIL() << "accepted";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("field 'dim' appears twice"));
  }
}

// ---- opening ----

TEST(ModelFileHardening, FifoIsRefusedWithoutBlocking) {
  const std::string fifo =
      (std::filesystem::temp_directory_path() / ("tinyloop_fifo_" + std::to_string(::getpid()))).string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      ModelFile::open(fifo);
    } catch (const FileNotFound& e) {
      return e.what();
    }
    return "opened";
  });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    std::fprintf(stderr, "ModelFile::open blocked on a FIFO\n");
    std::_Exit(1);  // the blocked thread cannot be joined
  }
  EXPECT_THAT(result.get(), HasSubstr("is not a regular file"));
  ::unlink(fifo.c_str());
}

TEST(ModelFileHardening, NulInThePathIsRefused) {
  TempFile tmp;
  const std::string path = tmp.write(serialize(make_raw_file(tiny_config())));
  EXPECT_NO_THROW(ModelFile::open(path));
  try {
    ModelFile::open(path + std::string("\0.bak", 5));
    FAIL() << "opened the path before the NUL";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("NUL byte"));
  }
}

std::string open_error(const std::string& header_text, const std::vector<uint8_t>& data) {
  TempFile tmp;
  try {
    ModelFile::open(tmp.write(serialize_header_and_data(header_text, data)));
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(ModelFileHardening, DuplicateTensorKeyIsRefused) {
  const auto f = make_raw_file(tiny_config());
  const std::string text = f.header.dump();
  ASSERT_EQ(open_error(text, f.data), "");
  // The last tensor's entry written a second time: a JSON parser keeps one silently.
  std::string last;
  for (const auto& [name, v] : f.header.items())
    if (name != "__metadata__") last = name;
  const std::string dup = "{" + json({{last, f.header[last]}}).dump().substr(1, std::string::npos);
  const std::string twice = dup.substr(0, dup.size() - 1) + "," + text.substr(1);
  EXPECT_THAT(open_error(twice, f.data), HasSubstr("the key '" + last + "' twice (duplicate tensor name)"));
}

TEST(ModelFileHardening, DuplicateMetadataKeyIsRefused) {
  const auto f = make_raw_file(tiny_config());
  std::string text = f.header.dump();
  const size_t at = text.find("\"format\":");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"format\":\"tinyloop\",");
  EXPECT_THAT(open_error(text, f.data), HasSubstr("the key 'format' twice"));
}

TEST(ModelFileHardening, ReadIntoMemorySurvivesTruncation) {
  TempFile tmp;
  tmp.write(serialize(make_raw_file(tiny_config())));
  auto mapped = ModelFile::open(tmp.path());
  auto copy = ModelFile::open(tmp.path(), /*use_mmap=*/false);
  EXPECT_TRUE(mapped->mapped());
  EXPECT_FALSE(copy->mapped());
  std::map<std::string, std::vector<uint8_t>> want;
  for (const auto& [name, t] : mapped->tensors()) want[name].assign(t.data, t.data + t.nbytes);
  mapped.reset();  // a mapping would SIGBUS once the file is truncated
  ASSERT_EQ(::truncate(tmp.path().c_str(), 0), 0);
  ASSERT_EQ(copy->tensors().size(), want.size());
  for (const auto& [name, t] : copy->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u) << name;  // the buffer is page-aligned
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), want[name]) << name;
  }
  EXPECT_EQ(copy->config().dim, tiny_config().dim);
}

}  // namespace
}  // namespace tinyloop
