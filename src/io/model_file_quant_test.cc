// Format version 2: int8 / int4 weights and their `.scales` / `.offsets` companions load,
// and every inconsistency is refused with an error naming the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/test_file_builder.h"
#include "tinyloop/errors.h"
#include "tinyloop/model_file.h"

namespace tinyloop {
namespace {

using testing::build_raw_file;
using ::testing::HasSubstr;
using testing::quantized_tensors;
using testing::serialize;
using testing::TempFile;
using testing::test_metadata;
using testing::TestTensor;
using testing::tiny_config;

// tiny_config: D = 8, F = 12, H hd = 8, KVH hd = 4, V = 16.
const std::string kW = "loop.0.attn.wq.weight";  // [8, 8]

std::string error_of(const std::vector<TestTensor>& tensors, const std::string& version = "2") {
  TempFile tmp;
  try {
    ModelFile::open(tmp.write(serialize(build_raw_file(tensors, test_metadata(tiny_config(), version)))));
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TestTensor& find(std::vector<TestTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::logic_error("no tensor " + name);
}

void drop(std::vector<TestTensor>& ts, const std::string& name) {
  std::erase_if(ts, [&](const TestTensor& t) { return t.name == name; });
}

TEST(ModelFileQuant, ValidInt8AndInt4Load) {
  for (const char* q : {"I8", "U8"})
    for (const char* sdt : {"F16", "F32"})
      for (int64_t G : {2, 4}) {
        TempFile tmp;
        const auto ts = quantized_tensors(tiny_config(), q, G, sdt);
        auto f = ModelFile::open(tmp.write(serialize(build_raw_file(ts, test_metadata(tiny_config(), "2")))));
        const TensorInfo* w = f->find(kW);
        ASSERT_NE(w, nullptr);
        EXPECT_EQ(w->dtype_name, q);
        EXPECT_EQ(f->find(kW + ".scales")->dtype_name, sdt);
        EXPECT_EQ(f->find(kW + ".scales")->shape, (std::vector<int64_t>{8, 8 / G}));
        EXPECT_EQ(f->find("embed.weight")->dtype_name, q);
      }
}

TEST(ModelFileQuant, VersionOneRefusesQuantized) {
  EXPECT_THAT(error_of(quantized_tensors(tiny_config(), "U8", 4), "1"),
              HasSubstr("dtype U8 (quantized weights) not supported by format version 1"));
}

TEST(ModelFileQuant, VersionTwoStillReadsFloatFiles) {
  std::vector<TestTensor> ts;
  for (const auto& [name, shape] : expected_tensor_shapes(tiny_config())) ts.push_back({name, "F32", shape});
  EXPECT_EQ(error_of(ts, "2"), "");
}

TEST(ModelFileQuant, MissingCompanions) {
  auto ts = quantized_tensors(tiny_config(), "U8", 4);
  drop(ts, kW + ".scales");
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".scales': missing (the U8 weight needs it)"));
  ts = quantized_tensors(tiny_config(), "U8", 4);
  drop(ts, kW + ".offsets");
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".offsets': missing"));
  ts = quantized_tensors(tiny_config(), "I8", 4);
  drop(ts, "embed.weight.scales");
  EXPECT_THAT(error_of(ts), HasSubstr("'embed.weight.scales': missing"));
}

TEST(ModelFileQuant, CompanionDtypes) {
  auto ts = quantized_tensors(tiny_config(), "I8", 4);
  find(ts, kW + ".scales").dtype = "BF16";
  EXPECT_THAT(error_of(ts),
              HasSubstr("'" + kW + ".scales': dtype BF16 not supported: scales and offsets are F16 or F32"));
  ts = quantized_tensors(tiny_config(), "U8", 4, "F16");
  find(ts, kW + ".offsets").dtype = "F32";
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".offsets': dtype F32 differs from the scales' F16"));
}

TEST(ModelFileQuant, CompanionShapesAndGroups) {
  auto ts = quantized_tensors(tiny_config(), "I8", 4);
  find(ts, kW + ".scales").shape = {8, 3};  // 3 does not divide K = 8
  EXPECT_THAT(
      error_of(ts),
      HasSubstr("'" + kW + ".scales': wrong shape [8, 3]: expected [8, K/G] with the group size G dividing K = 8"));
  ts = quantized_tensors(tiny_config(), "I8", 4);
  find(ts, kW + ".scales").shape = {7, 2};
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".scales': wrong shape [7, 2]"));
  ts = quantized_tensors(tiny_config(), "U8", 4);
  find(ts, kW + ".scales").shape = {8, 8};  // G = 1: odd
  find(ts, kW + ".offsets").shape = {8, 8};
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".scales': group size 1 is odd"));
  ts = quantized_tensors(tiny_config(), "U8", 4);
  find(ts, kW + ".offsets").shape = {8, 1};
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".offsets': shape [8, 1] differs from the scales' [8, 2]"));
}

TEST(ModelFileQuant, WeightShapes) {
  auto ts = quantized_tensors(tiny_config(), "U8", 4);
  find(ts, kW).shape = {8, 8};  // int4 stores [N, K / 2]
  EXPECT_THAT(error_of(ts),
              HasSubstr("'" + kW + "': wrong shape: expected [8, 4] (int4: [out, in / 2]), found [8, 8]"));
  ts = quantized_tensors(tiny_config(), "I8", 4);
  find(ts, kW).shape = {8, 4};
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + "': wrong shape: expected [8, 8], found [8, 4]"));
}

TEST(ModelFileQuant, OnlyWeightsMayBeQuantized) {
  auto ts = quantized_tensors(tiny_config(), "I8", 4);
  find(ts, "final_norm.weight").dtype = "I8";
  EXPECT_THAT(error_of(ts),
              HasSubstr("'final_norm.weight': dtype I8: only linear, embed and head weights may be quantized"));
}

TEST(ModelFileQuant, LeftOverCompanions) {
  auto ts = quantized_tensors(tiny_config(), "I8", 4);
  ts.push_back({kW + ".offsets", "F16", {8, 2}});
  EXPECT_THAT(error_of(ts), HasSubstr("'" + kW + ".offsets': leftover: an I8 (int8) weight has no offsets"));
  ts = quantized_tensors(tiny_config(), "I8", 4);
  ts.push_back({"final_norm.weight.scales", "F32", {8, 1}});
  EXPECT_THAT(error_of(ts), HasSubstr("'final_norm.weight.scales': leftover"));
  ts = quantized_tensors(tiny_config(), "I8", 4);
  ts.push_back({"loop.9.attn.wq.weight.scales", "F32", {8, 1}});
  EXPECT_THAT(error_of(ts), HasSubstr("'loop.9.attn.wq.weight.scales': leftover"));
}

}  // namespace
}  // namespace tinyloop
