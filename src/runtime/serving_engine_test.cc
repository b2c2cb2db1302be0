// The serving engine against generate(): many requests at once (different depths, early
// exit, sampling with seeds, a window, shared slot groups, stop sequences) give exactly the
// tokens each gives alone, in every KV mode; a budget small enough to force preemption
// changes no output; cancel, timeout, queue limits, bad requests and shutdown behave as
// documented, and every KV block is back in the pool afterwards.
#include "runtime/serving_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/test_file_builder.h"
#include "model/kv_pool.h"
#include "runtime/test_random_model.h"

namespace tinyloop::runtime {
namespace {

// Collects a request's output; wait() blocks until on_finish.
class CollectSink : public RequestSink {
 public:
  void on_token(int32_t t, int64_t depth, const TokenLogprobs* lp) override {
    std::lock_guard<std::mutex> l(mu_);
    tokens.push_back(t);
    depths.push_back(depth);
    if (lp) logprobs.push_back(*lp);
  }
  void on_finish(const RequestResult& r) override {
    std::lock_guard<std::mutex> l(mu_);
    result = r;
    done = true;
    cv_.notify_all();
  }
  const RequestResult& wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return done; });
    return result;
  }
  std::vector<int32_t> tokens;
  std::vector<int64_t> depths;
  std::vector<TokenLogprobs> logprobs;
  RequestResult result;
  bool done = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// A sink whose first on_token blocks the engine thread until open() (a slow consumer), so a
// test can hold requests in flight and in the queue however fast the model is.
class GateSink : public CollectSink {
 public:
  void on_token(int32_t t, int64_t depth, const TokenLogprobs* lp) override {
    {
      std::unique_lock<std::mutex> l(gate_mu_);
      gate_cv_.wait(l, [&] { return open_; });
    }
    CollectSink::on_token(t, depth, lp);
  }
  void open() {
    std::lock_guard<std::mutex> l(gate_mu_);
    open_ = true;
    gate_cv_.notify_all();
  }

 private:
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool open_ = false;
};

class ServingEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ModelConfig c = testing::small_runtime_config();
    c.default_loops = 3;
    c.max_seq_len = 256;
    c.eos_ids = {30};
    path_ = testing::write_random_model(file_, c, "F32", 21);
    EngineOptions o;
    o.kv_mode = GetParam();
    engine_ = std::make_shared<Engine>(path_, o);
  }
  // A mix of requests: depths 1..5, sampling with seeds, early exit (both probes), a
  // window, shared slot groups, stop sequences, EOS on and off, prompts of 1..40 tokens.
  std::vector<GenerateRequest> requests(int n) const {
    std::mt19937_64 g(5);
    std::vector<GenerateRequest> out;
    for (int i = 0; i < n; ++i) {
      GenerateRequest r;
      r.prompt.resize(size_t(1 + (i * 7) % 40));
      for (auto& t : r.prompt) t = int32_t(g() % 30);
      r.max_tokens = 4 + (i * 5) % 23;
      r.loops = 1 + i % 5;
      r.stop_at_eos = i % 3 != 0;
      if (i % 2) {
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 20;
        r.sampling.top_p = 0.9f;
        r.seed = uint64_t(100 + i);
      }
      if (i % 4 == 1) {
        r.early_exit.patience = 1;
        r.early_exit.min_L = 1;
        r.early_exit.tau = (i % 8 == 1) ? 0.3 : 1e9;
      }
      if (i % 8 == 3) r.early_exit = {1, 1, 0, 1, 0.5};  // logit-margin probe
      if (i % 7 == 2) r.cache_window = 5;
      if (i % 9 == 4) r.kv_loop_slots = 1;
      if (i % 6 == 5) r.stop_sequences = {{int32_t(g() % 30)}};
      r.sampling.repetition_penalty = i % 5 == 0 ? 1.2f : 1.0f;
      if (i % 10 == 7) r.sampling.presence_penalty = 0.7f, r.sampling.frequency_penalty = 0.4f;
      if (i % 3 == 1) r.logprobs = i % 2 ? 0 : 3;
      out.push_back(r);
    }
    return out;
  }
  void expect_same_as_generate(ServingOptions o, int n) {
    ServingEngine eng(engine_, o);
    auto reqs = requests(n);
    std::vector<std::shared_ptr<CollectSink>> sinks;
    for (const auto& r : reqs) {
      sinks.push_back(std::make_shared<CollectSink>());
      eng.submit(r, sinks.back());
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      const RequestResult& got = sinks[i]->wait();
      const GenerateResult want = generate(*engine_, reqs[i]);
      const std::vector<int32_t> want_new(want.tokens.begin() + int64_t(reqs[i].prompt.size()), want.tokens.end());
      ASSERT_EQ(got.tokens, want_new) << "request " << i;
      ASSERT_EQ(sinks[i]->tokens, want_new) << "request " << i;
      ASSERT_EQ(got.loops_per_token, want.loops_per_token) << "request " << i;
      ASSERT_EQ(got.finish_reason, want.finish_reason) << "request " << i;
      if (reqs[i].logprobs < 0) {
        EXPECT_TRUE(got.logprobs.empty());
        EXPECT_TRUE(sinks[i]->logprobs.empty());
        continue;
      }
      ASSERT_EQ(got.logprobs.size(), got.tokens.size()) << "request " << i;
      ASSERT_EQ(sinks[i]->logprobs.size(), got.tokens.size()) << "request " << i;
      for (size_t t = 0; t < got.tokens.size(); ++t) {
        const TokenLogprobs& lp = got.logprobs[t];
        EXPECT_LE(lp.logprob, 0.0f);
        ASSERT_EQ(lp.top.size(), size_t(reqs[i].logprobs));
        if (!lp.top.empty() && reqs[i].sampling.greedy()) {  // greedy: the token is the top one
          EXPECT_EQ(lp.top[0].first, got.tokens[t]) << "request " << i << " token " << t;
          EXPECT_EQ(lp.top[0].second, lp.logprob);
        }
        for (size_t k = 1; k < lp.top.size(); ++k) EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
      }
    }
    const ServingStats st = eng.stats();
    EXPECT_EQ(st.requests_finished, n);
    EXPECT_EQ(st.kv_blocks_used, st.kv_blocks_cached);  // what is left is the prefix cache
    EXPECT_GT(st.mean_batch_rows(), 1.0);  // requests did share steps
    last_stats_ = st;
  }
  testing::TempFile file_;
  std::string path_;
  std::shared_ptr<Engine> engine_;
  ServingStats last_stats_;
};

TEST_P(ServingEngineTest, BatchedEqualsGenerateAlone) {
  ServingOptions o;
  o.kv_budget_mb = 16;
  o.kv_block_size = 8;
  o.max_batch_tokens = 64;
  o.prefill_chunk = 16;
  expect_same_as_generate(o, 24);
}

// A prompt of kLongPromptRows tokens or more gets kLongBlockRows-row blocks in generate()'s
// private cache (model/kv_pool.h private_block_rows); the bits never depend on the block
// size, so it gives exactly what the serving engine gives with 8-row blocks, in every KV
// mode (under ASan / UBSan too: writes and reads across the long blocks' ends).
TEST_P(ServingEngineTest, LongPromptPrivateBlocksEqualEngineBlocks) {
  EngineOptions eo;
  eo.kv_mode = GetParam();
  eo.max_seq_len = model::kLongPromptRows + model::kLongBlockRows;
  const auto engine = std::make_shared<Engine>(path_, eo);
  ServingOptions o;
  o.kv_budget_mb = 64;
  o.kv_block_size = 8;
  o.max_batch_tokens = 512;
  o.prefill_chunk = 256;
  o.prefix_caching = false;
  ServingEngine eng(engine, o);
  std::mt19937_64 g(9);
  for (const int64_t n : {model::kLongPromptRows, model::kLongPromptRows + model::kLongBlockRows / 2 + 3}) {
    GenerateRequest r;
    r.prompt.resize(size_t(n));
    for (auto& t : r.prompt) t = int32_t(g() % 30);
    r.max_tokens = 5;
    r.loops = 2;
    r.stop_at_eos = false;
    if (n > model::kLongPromptRows) {
      r.sampling.temperature = 0.9f;
      r.seed = 3;
    }
    auto sink = std::make_shared<CollectSink>();
    eng.submit(r, sink);
    const RequestResult& got = sink->wait();
    const GenerateResult want = generate(*engine, r);
    const std::vector<int32_t> want_new(want.tokens.begin() + n, want.tokens.end());
    ASSERT_EQ(got.tokens, want_new) << "prompt " << n;
    ASSERT_EQ(got.loops_per_token, want.loops_per_token) << "prompt " << n;
  }
}

TEST_P(ServingEngineTest, PreemptionChangesNoOutput) {
  ServingOptions o;
  o.kv_block_size = 4;
  o.max_batch_tokens = 48;
  o.prefill_chunk = 8;
  // Room for about two requests at a time: the rest wait, and running ones get preempted
  // when their growth runs into the pool's end.
  const model::KvBlockLayout layout(engine_->config(), engine_->kv_dtype(), 4);
  o.kv_budget_mb = double(layout.bytes) * 17 * 11 * 2 / double(1 << 20);
  expect_same_as_generate(o, 16);
  EXPECT_GT(last_stats_.preemptions, 0);
}

TEST_P(ServingEngineTest, CancelTimeoutAndLimits) {
  ServingOptions o;
  o.kv_budget_mb = 4;
  o.max_queue = 3;
  o.max_num_seqs = 1;
  ServingEngine eng(engine_, o);
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 200;
  r.stop_at_eos = false;
  auto a = std::make_shared<GateSink>();
  auto b = std::make_shared<CollectSink>();
  const uint64_t ida = eng.submit(r, a);  // its first token holds the engine at the gate
  eng.submit(r, b, /*timeout_s=*/0.02);  // waits behind a (max_num_seqs 1), then times out
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  eng.cancel(ida);
  a->open();
  EXPECT_EQ(a->wait().finish_reason, FinishReason::Cancelled);
  EXPECT_EQ(a->wait().tokens.size(), 1u);
  EXPECT_EQ(b->wait().finish_reason, FinishReason::Timeout);
  EXPECT_TRUE(b->wait().tokens.empty());
  eng.cancel(ida);  // already finished: a no-op
  // Bad requests are refused at submit, naming the argument.
  GenerateRequest bad = r;
  bad.max_tokens = 0;
  EXPECT_THROW(eng.submit(bad, a), std::invalid_argument);
  bad = r;
  bad.prompt = {99};
  EXPECT_THROW(eng.submit(bad, a), std::invalid_argument);
  bad = r;
  bad.loops = 4000;  // more KV than the whole budget (within kMaxLoops)
  EXPECT_THROW(
      {
        try {
          eng.submit(bad, a);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("kv_budget_mb"), std::string::npos);
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_THROW(eng.submit(r, nullptr), std::invalid_argument);
  EXPECT_THROW(eng.submit(r, a, -1.0), std::invalid_argument);
  const ServingStats st = eng.stats();
  EXPECT_EQ(st.requests_cancelled, 1);
  EXPECT_EQ(st.requests_timed_out, 1);
  EXPECT_EQ(st.kv_blocks_used, st.kv_blocks_cached);
  // The queue limit: one running (held at the gate), three waiting, the fifth refused.
  auto gate = std::make_shared<GateSink>();
  std::vector<uint64_t> ids = {eng.submit(r, gate)};
  while (eng.stats().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 0; i < 3; ++i) ids.push_back(eng.submit(r, std::make_shared<CollectSink>()));
  EXPECT_THROW(eng.submit(r, std::make_shared<CollectSink>()), QueueFull);
  for (uint64_t id : ids) eng.cancel(id);
  gate->open();
  EXPECT_EQ(gate->wait().finish_reason, FinishReason::Cancelled);
  // Shutdown without drain cancels what is left; later submits are refused.
  eng.shutdown(false);
  EXPECT_THROW(eng.submit(r, a), QueueFull);
  EXPECT_EQ(eng.stats().kv_blocks_used, 0);  // shutdown also drops the prefix cache
}

TEST_P(ServingEngineTest, ShutdownWithDrainFinishesInFlight) {
  ServingOptions o;
  o.kv_budget_mb = 4;
  auto eng = std::make_unique<ServingEngine>(engine_, o);
  GenerateRequest r;
  r.prompt = {4, 5};
  r.max_tokens = 12;
  r.stop_at_eos = false;
  std::vector<std::shared_ptr<CollectSink>> sinks;
  for (int i = 0; i < 5; ++i) {
    sinks.push_back(std::make_shared<CollectSink>());
    eng->submit(r, sinks.back());
  }
  eng->shutdown(true);
  for (auto& s : sinks) {
    EXPECT_EQ(s->wait().finish_reason, FinishReason::Length);
    EXPECT_EQ(s->wait().tokens.size(), 12u);
  }
}

// Automatic prefix caching: requests sharing a prompt prefix share its cached blocks (only
// their own suffix is computed), outputs stay those of generate(); under a budget too small
// to keep everything, cached blocks are evicted before anything is preempted.
TEST_P(ServingEngineTest, PrefixCachingSharesPromptBlocks) {
  std::mt19937_64 g(9);
  std::vector<int32_t> system(37);
  for (auto& t : system) t = int32_t(g() % 30);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    GenerateRequest r;
    r.prompt = system;
    for (int k = 0; k < 1 + i % 4; ++k) r.prompt.push_back(int32_t(g() % 30));
    r.max_tokens = 6;
    r.loops = 2 + i % 2;
    r.stop_at_eos = false;
    if (i == 9) r.cache_window = 8;  // windows never share: computed in full
    reqs.push_back(r);
  }
  for (double budget : {16.0, 0.0}) {
    ServingOptions o;
    o.kv_block_size = 8;
    const model::KvBlockLayout layout(engine_->config(), engine_->kv_dtype(), 8);
    // 0: room for two requests of 8 slots x 6 blocks: the cache must give blocks back.
    o.kv_budget_mb = budget > 0 ? budget : double(layout.bytes) * 8 * 6 * 2 / double(1 << 20);
    ServingEngine eng(engine_, o);
    for (const auto& r : reqs) {  // one after the other: each finds the earlier ones' blocks
      auto sink = std::make_shared<CollectSink>();
      eng.submit(r, sink);
      const RequestResult& got = sink->wait();
      const GenerateResult want = generate(*engine_, r);
      ASSERT_EQ(got.tokens, std::vector<int32_t>(want.tokens.begin() + int64_t(r.prompt.size()), want.tokens.end()));
    }
    const ServingStats st = eng.stats();
    EXPECT_EQ(st.prefix_queries, 9);  // the windowed request does not look
    // loops 2 and 3 cache separately: 8 of the 10 requests find 4 whole blocks of the 37
    // shared tokens (32 positions) computed by an earlier one of the same depth.
    EXPECT_EQ(st.prefix_hits, 7);
    EXPECT_EQ(st.prefix_hit_tokens, 7 * 32);
    EXPECT_EQ(st.kv_blocks_used, st.kv_blocks_cached);
    if (budget == 0) {
      EXPECT_EQ(st.preemptions, 0);
    }
    eng.clear_prefix_cache();
    for (int i = 0; i < 1000 && eng.stats().kv_blocks_used > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(eng.stats().kv_blocks_used, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(KvModes, ServingEngineTest,
                         ::testing::Values("fp32", "fp16", "int8", "h_fp16", "h_int8", "h_int4"));

}  // namespace
}  // namespace tinyloop::runtime
