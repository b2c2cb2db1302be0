// The public C++ API (include/tinyloop/tinyloop.h) on the bundled model: the facade gives
// exactly the runtime's tokens for the same request and seed, streams them, batches them
// without changing them, reports errors with the runtime's exception types, and its
// tokenizer reproduces the ids Hugging Face `tokenizers` gives (ids below computed with it).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/test_random_model.h"
#include "tinyloop/tinyloop.h"

namespace tinyloop {
namespace {

const char* kModel = TINYLOOP_DEMO_MODEL;

// "Once upon a time" -> ["On", "ce", " upon", " a", " time"]; ids from Hugging Face tokenizers
// 0.22.1 on the bundled model's tokenizer.json (so are the other pinned ids below).
const std::vector<int32_t> kOnceUponATime = {2136, 338, 815, 259, 677};

// The runtime's own answer for the same request, emitted tokens only.
runtime::GenerateResult runtime_generate(const std::vector<int32_t>& prompt, int64_t max_tokens, float temperature,
                                         uint64_t seed, int64_t loops) {
  static const runtime::Engine engine(kModel, runtime::EngineOptions{});
  runtime::GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = max_tokens;
  req.sampling.temperature = temperature;
  req.sampling.top_k = 40;
  req.seed = seed;
  req.loops = loops;
  return runtime::generate(engine, req);
}

std::vector<int32_t> emitted(const runtime::GenerateResult& r) {
  return {r.tokens.end() - r.tokens_emitted, r.tokens.end()};
}

GenerationOptions options(int64_t max_tokens, float temperature, uint64_t seed, int64_t loops) {
  GenerationOptions o;
  o.max_tokens = max_tokens;
  o.temperature = temperature;
  o.top_k = 40;
  o.seed = seed;
  o.loops = loops;
  return o;
}

TEST(Api, GenerateEqualsTheRuntimeGreedyAndSeeded) {
  const Engine engine(kModel);
  for (float temperature : {0.0f, 0.9f}) {
    for (int64_t loops : {2, 6}) {
      const GenerationResult got = engine.generate(kOnceUponATime, options(24, temperature, 11, loops));
      const runtime::GenerateResult want = runtime_generate(kOnceUponATime, 24, temperature, 11, loops);
      EXPECT_EQ(got.tokens, emitted(want)) << "temperature " << temperature << " loops " << loops;
      EXPECT_EQ(got.loops_per_token, want.loops_per_token);
      EXPECT_STREQ(finish_reason_name(got.finish_reason), runtime::finish_reason_name(want.finish_reason));
      ASSERT_FALSE(got.tokens.empty());
    }
  }
}

TEST(Api, StreamsEveryTokenAndStopsWhenTheCallbackSaysSo) {
  const Engine engine(kModel);
  std::vector<int32_t> streamed;
  const GenerationResult all = engine.generate(kOnceUponATime, options(12, 0.9f, 3, 4), [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  EXPECT_EQ(streamed, all.tokens);
  int calls = 0;
  const GenerationResult cut =
      engine.generate(kOnceUponATime, options(12, 0.9f, 3, 4), [&](int32_t) { return ++calls < 3; });
  EXPECT_EQ(cut.finish_reason, FinishReason::Callback);
  ASSERT_EQ(cut.tokens.size(), 3u);
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(all.tokens.begin(), all.tokens.begin() + 3));
}

TEST(Api, BatchEqualsOneAtATime) {
  EngineOptions eo;
  eo.batch_kv_budget_mb = 64;
  const Engine engine(kModel, eo);
  const std::vector<std::vector<int32_t>> prompts = {kOnceUponATime, {52, 295, 439, 5918}, {40, 73}};
  const GenerationOptions o = options(16, 0.9f, 5, 3);
  const std::vector<GenerationResult> batch = engine.generate_batch(prompts, o);
  ASSERT_EQ(batch.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult one = engine.generate(prompts[i], o);
    EXPECT_EQ(batch[i].tokens, one.tokens) << "prompt " << i;
    EXPECT_EQ(batch[i].loops_per_token, one.loops_per_token) << "prompt " << i;
    EXPECT_EQ(batch[i].finish_reason, one.finish_reason) << "prompt " << i;
  }
}

// The exception's message contains `needle`.
template <typename E, typename F>
void expect_throws(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Api, ErrorsNameTheProblem) {
  expect_throws<FileNotFound>([] { Engine("/nonexistent/model.tinyloop"); }, "/nonexistent/model.tinyloop");
  EngineOptions bad_kv;
  bad_kv.kv_mode = "fp8";
  expect_throws<std::invalid_argument>([&] { Engine(kModel, bad_kv); }, "kv_mode");
  const Engine engine(kModel);
  GenerationOptions o;
  o.temperature = -1;
  expect_throws<std::invalid_argument>([&] { engine.generate(kOnceUponATime, o); }, "temperature");
  expect_throws<std::invalid_argument>([&] { engine.generate({}, {}); }, "prompt");
  GenerationOptions gate;
  gate.exit_gate.mode = "sometimes";
  expect_throws<std::invalid_argument>([&] { engine.generate(kOnceUponATime, gate); }, "exit_gate");
  GenerationOptions too_long;
  too_long.max_tokens = engine.info().max_seq_len;
  expect_throws<std::runtime_error>([&] { engine.generate(kOnceUponATime, too_long); }, "max_seq_len");
  expect_throws<std::invalid_argument>([&] { engine.generate_batch({kOnceUponATime, {1 << 20}}, {}); }, "prompts[1]");
}

TEST(Api, InfoDescribesTheModel) {
  const Engine engine(kModel);
  EXPECT_EQ(engine.info().vocab_size, 8192);
  EXPECT_EQ(engine.info().default_loops, 6);
  EXPECT_EQ(engine.info().eos_ids, std::vector<int32_t>{0});
  EXPECT_FALSE(engine.info().bos_id.has_value());
}

TEST(Tokenizer, EncodesAsHuggingFaceTokenizersDoes) {
  const Engine engine(kModel);
  const Tokenizer* tok = engine.tokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->size(), 8192);
  EXPECT_EQ(tok->encode("Once upon a time"), kOnceUponATime);
  // Contractions, a double space kept apart from the word after it, a newline.
  EXPECT_EQ(tok->encode("Tom's dog didn't  run.\n"),
            (std::vector<int32_t>{52, 295, 439, 5890, 1129, 1234, 221, 1689, 14, 199}));
  // The bundled model's pre-tokenizer isolates every digit before GPT-2's split.
  EXPECT_EQ(tok->encode("1843+0190="), (std::vector<int32_t>{17, 24, 20, 19, 11, 16, 17, 25, 16, 29}));
  EXPECT_EQ(tok->encode("In 1812, 42 ships."),
            (std::vector<int32_t>{1031, 221, 17, 24, 17, 18, 12, 221, 20, 18, 4499, 14}));
  EXPECT_EQ(tok->encode("<|endoftext|>Hi"), (std::vector<int32_t>{0, 40, 73}));
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(Tokenizer, DecodesBytesAndSkipsSpecialTokens) {
  const Engine engine(kModel);
  const Tokenizer& tok = *engine.tokenizer();
  const std::string text = "Tom's dog didn't  run.\n\tOK 42";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_EQ(tok.decode({0, 40, 73}), "Hi");
  EXPECT_EQ(tok.decode({0, 40, 73}, /*with_special=*/true), "<|endoftext|>Hi");
  EXPECT_EQ(tok.token_bytes(815), " upon");
  expect_throws<std::invalid_argument>([&] { tok.decode({8192}); }, "8192");
}

TEST(Tokenizer, RefusesWhatItDoesNotImplement) {
  const Engine engine(kModel);
  expect_throws<std::invalid_argument>([&] { engine.tokenizer()->encode("caf\xc3\xa9"); }, "offset 3");
  expect_throws<std::invalid_argument>([] { Tokenizer("{}"); }, "pre_tokenizer");
  expect_throws<std::invalid_argument>(
      [] { Tokenizer(R"({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}})"); }, "NFC");
  expect_throws<std::invalid_argument>(
      [] { Tokenizer(R"({"pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "ByteLevel"}})"); }, "Metaspace");
  expect_throws<std::invalid_argument>(
      [] {
        Tokenizer(R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits",
                     "individual_digits": false}, {"type": "ByteLevel"}]}, "decoder": {"type": "ByteLevel"}})");
      },
      "Sequence");
  expect_throws<std::invalid_argument>([] { Tokenizer("not json"); }, "not a JSON object");
}

// A model file with no tokenizer, or one this library cannot run, still loads and generates
// from ids; only tokenizer() reports the difference.
TEST(Tokenizer, ModelsWithoutOneOrWithAnUnsupportedOneStillGenerate) {
  const ModelConfig c = testing::small_runtime_config();
  testing::RawFile raw = testing::make_raw_file(c, "F32");
  testing::fill_random_weights(raw, 1);
  testing::TempFile bare;
  const Engine no_tokenizer(bare.write(testing::serialize(raw)));
  EXPECT_EQ(no_tokenizer.tokenizer(), nullptr);
  EXPECT_EQ(no_tokenizer.generate({1, 2, 3}, options(4, 0.0f, 1, 2)).tokens.size(), 4u);

  raw.header["__metadata__"]["tokenizer"] =
      R"({"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "Metaspace"}, "decoder": {"type": "Metaspace"}})";
  testing::TempFile sentencepiece;
  const Engine unsupported(sentencepiece.write(testing::serialize(raw)));
  expect_throws<std::invalid_argument>([&] { unsupported.tokenizer(); }, "Metaspace");
  expect_throws<std::invalid_argument>([&] { unsupported.tokenizer(); }, "Metaspace");  // every call
  EXPECT_EQ(unsupported.generate({1, 2, 3}, options(4, 0.0f, 1, 2)).tokens.size(), 4u);
}

}  // namespace
}  // namespace tinyloop
