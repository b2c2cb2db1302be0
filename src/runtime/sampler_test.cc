// Sampler tests on hand-made logits (docs/generation.md "Sampling"; HF transformers conventions).
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace tinyloop::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

SamplingParams sampling(float temperature, int top_k = 50, float top_p = 1.0f, float penalty = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.repetition_penalty = penalty;
  return p;
}

std::vector<float> dist(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<float> probs;
  sampling_distribution(logits.data(), static_cast<int64_t>(logits.size()), p, probs);
  return probs;
}

void expect_probs(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  double sum = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0.0) EXPECT_EQ(got[i], 0.0f) << "id " << i << " must be removed exactly";
    else EXPECT_NEAR(got[i], want[i], tol) << "id " << i;
    sum += got[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

// Expects std::invalid_argument whose message starts with `prefix`.
template <typename F>
void expect_invalid(F&& f, const std::string& prefix) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected one starting with '" << prefix << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
  }
}

// ---------------------------------------------------------------------------------------
// validate()

TEST(Validate, DefaultsAndGoodValuesPass) {
  EXPECT_NO_THROW(validate(SamplingParams{}));
  EXPECT_NO_THROW(validate(sampling(0.8f, 50, 0.9f, 1.3f)));
  EXPECT_NO_THROW(validate(sampling(0.011f, 1, 1.0f, 0.5f)));
  EXPECT_NO_THROW(validate(sampling(0.8f, 1, 1e-6f, kInf)));  // HF allows +inf penalty
}

TEST(Validate, Temperature) {
  expect_invalid([] { validate(sampling(-0.5f)); }, "temperature must be >= 0, got -0.5");
  expect_invalid([] { validate(sampling(-1e-9f)); }, "temperature");
  expect_invalid([] { validate(sampling(kNaN)); }, "temperature");
  expect_invalid([] { validate(sampling(-kInf)); }, "temperature");
  EXPECT_NO_THROW(validate(sampling(kInf)));  // HF accepts it (uniform over the kept tokens)
}

TEST(Validate, TopKOnlyWhenSampling) {
  expect_invalid([] { validate(sampling(0.8f, 0)); }, "top_k");
  expect_invalid([] { validate(sampling(0.8f, -3)); }, "top_k");
  expect_invalid([] { validate(sampling(0.011f, 0)); }, "top_k");
  EXPECT_NO_THROW(validate(sampling(0.0f, 0)));  // greedy: top_k is ignored
  EXPECT_NO_THROW(validate(sampling(0.01f, -5)));  // 0.01 is still greedy
}

TEST(Validate, TopP) {
  for (float bad : {0.0f, -0.1f, 1.0001f, 2.0f, kNaN, kInf, -kInf}) {
    expect_invalid([bad] { validate(sampling(0.8f, 50, bad)); }, "top_p");
    expect_invalid([bad] { validate(sampling(0.011f, 50, bad)); }, "top_p");
    EXPECT_NO_THROW(validate(sampling(0.0f, 50, bad)));  // greedy: top_p is ignored
  }
  expect_invalid([] { validate(sampling(0.8f, 50, 0.0f)); }, "top_p must be in (0, 1] when sampling, got 0");
  EXPECT_NO_THROW(validate(sampling(0.8f, 50, 1.0f)));
  EXPECT_NO_THROW(validate(sampling(0.8f, 50, 1e-30f)));
}

TEST(Validate, RepetitionPenalty) {
  for (float bad : {0.0f, -1.0f, -kInf, kNaN}) {
    expect_invalid([bad] { validate(sampling(0.8f, 50, 1.0f, bad)); }, "repetition_penalty");
    expect_invalid([bad] { validate(sampling(0.0f, 50, 1.0f, bad)); }, "repetition_penalty");
  }
  expect_invalid([] { validate(sampling(0.0f, 50, 1.0f, -2.0f)); }, "repetition_penalty must be > 0, got -2");
}

TEST(Validate, PresenceAndFrequencyPenalties) {
  for (float bad : {-2.01f, 2.5f, kInf, -kInf, kNaN}) {
    SamplingParams p;
    p.presence_penalty = bad;
    expect_invalid([&] { validate(p); }, "presence_penalty must be in [-2, 2]");
    p.presence_penalty = 0.0f;
    p.frequency_penalty = bad;
    expect_invalid([&] { validate(p); }, "frequency_penalty must be in [-2, 2]");
  }
  SamplingParams ok;
  ok.presence_penalty = -2.0f;
  ok.frequency_penalty = 2.0f;
  validate(ok);
}

TEST(Validate, CalledBySampleNextAndDistribution) {
  std::vector<float> logits = {0.0f, 1.0f};
  Rng rng(1);
  expect_invalid([&] { sample_next(logits.data(), 2, sampling(-1.0f), {}, rng); }, "temperature");
  expect_invalid([&] { sample_next(logits.data(), 2, sampling(0.5f, 0), {}, rng); }, "top_k");
  expect_invalid([&] { dist(logits, sampling(0.5f, 50, 0.0f)); }, "top_p");
  // sampling_distribution requires a sampling temperature.
  expect_invalid([&] { dist(logits, sampling(0.0f)); }, "temperature");
  expect_invalid([&] { dist(logits, sampling(0.01f)); }, "temperature");
}

// ---------------------------------------------------------------------------------------
// Rng

TEST(Rng, SameSeedSameDraws) {
  Rng a(1234), b(1234), c(1235);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    differs |= x != c.next_u64();
  }
  EXPECT_TRUE(differs);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(a.uniform(), b.uniform());
}

TEST(Rng, Mt19937_64Semantics) {
  // The 10000th output of a default-constructed mt19937_64 (seed 5489) is fixed by the
  // standard: 9981545732273789042.
  Rng r(5489);
  uint64_t x = 0;
  for (int i = 0; i < 10000; ++i) x = r.next_u64();
  EXPECT_EQ(x, 9981545732273789042ULL);
  // uniform() = (next_u64() >> 11) * 2^-53.
  Rng a(7), b(7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.uniform(), static_cast<double>(b.next_u64() >> 11) * 0x1.0p-53);
}

TEST(Rng, UniformRange) {
  Rng r(42);
  double sum = 0.0;
  for (int i = 0; i < 100000; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

TEST(Rng, FromEntropyProducesDraws) {
  Rng a = Rng::from_entropy();
  Rng b = Rng::from_entropy();
  // Two fresh entropy seeds collide with probability ~2^-64 per draw pair.
  bool differs = false;
  for (int i = 0; i < 4; ++i) differs |= a.next_u64() != b.next_u64();
  EXPECT_TRUE(differs);
}

// ---------------------------------------------------------------------------------------
// Repetition penalty

TEST(RepetitionPenalty, DividesPositiveMultipliesNegative) {
  std::vector<float> l = {2.0f, -2.0f, 0.0f, 3.0f, -1.0f};
  apply_repetition_penalty(l.data(), 5, {0, 1, 2}, 2.0f);
  EXPECT_EQ(l[0], 1.0f);  // 2 / 2
  EXPECT_EQ(l[1], -4.0f);  // -2 * 2
  EXPECT_EQ(l[2], 0.0f);  // 0 / 2 (HF: score < 0 is false)
  EXPECT_EQ(l[3], 3.0f);  // not seen
  EXPECT_EQ(l[4], -1.0f);  // not seen
}

TEST(RepetitionPenalty, PenaltyBelowOneBoosts) {
  std::vector<float> l = {2.0f, -2.0f};
  apply_repetition_penalty(l.data(), 2, {0, 1}, 0.5f);
  EXPECT_EQ(l[0], 4.0f);
  EXPECT_EQ(l[1], -1.0f);
}

TEST(RepetitionPenalty, OncePerDistinctId) {
  std::vector<float> l = {8.0f, -8.0f, 1.0f};
  apply_repetition_penalty(l.data(), 3, {0, 0, 0, 1, 1, 0}, 2.0f);
  EXPECT_EQ(l[0], 4.0f);  // not 8 / 2^4
  EXPECT_EQ(l[1], -16.0f);  // not -8 * 2^2
  EXPECT_EQ(l[2], 1.0f);
}

TEST(RepetitionPenalty, OutOfRangeIdsIgnored) {
  std::vector<float> l = {8.0f, -8.0f};
  apply_repetition_penalty(l.data(), 2, {-1, 2, 1000, std::numeric_limits<int32_t>::min()}, 2.0f);
  EXPECT_EQ(l[0], 8.0f);
  EXPECT_EQ(l[1], -8.0f);
}

TEST(RepetitionPenalty, OneIsNoOpAndInfKept) {
  std::vector<float> l = {3.0f, -3.0f, -kInf};
  apply_repetition_penalty(l.data(), 3, {0, 1, 2}, 1.0f);
  EXPECT_EQ(l[0], 3.0f);
  EXPECT_EQ(l[1], -3.0f);
  apply_repetition_penalty(l.data(), 3, {2}, 1.5f);
  EXPECT_EQ(l[2], -kInf);  // a masked token stays masked
  expect_invalid([&] { apply_repetition_penalty(l.data(), 3, {0}, 0.0f); }, "repetition_penalty");
}

TEST(RepetitionPenalty, ChangesTheGreedyChoice) {
  std::vector<float> l = {2.0f, 1.5f, -1.0f};
  Rng rng(0);
  // 2 / 1.5 = 1.333 < 1.5: token 1 wins once token 0 is penalised.
  EXPECT_EQ(sample_next(l.data(), 3, sampling(0.0f, 50, 1.0f, 1.5f), {0}, rng), 1);
  EXPECT_FLOAT_EQ(l[0], 2.0f / 1.5f);  // modified in place
  // apply_penalty = false leaves the logits alone (the caller already applied it).
  std::vector<float> m = {2.0f, 1.5f, -1.0f};
  EXPECT_EQ(sample_next(m.data(), 3, sampling(0.0f, 50, 1.0f, 1.5f), {0}, rng, false), 0);
  EXPECT_EQ(m[0], 2.0f);
}

// ---------------------------------------------------------------------------------------
// argmax / greedy

TEST(PresenceFrequency, SubtractsPresenceOncePlusFrequencyPerCount) {
  std::vector<float> l = {1.0f, 2.0f, -1.0f, 0.5f};
  apply_presence_frequency(l.data(), 4, {{1, 3}, {2, 1}, {9, 2}, {-1, 1}}, 0.5f, 0.25f);
  EXPECT_EQ(l, (std::vector<float>{1.0f, 2.0f - 0.5f - 0.75f, -1.0f - 0.5f - 0.25f, 0.5f}));
  std::vector<float> same = {1.0f, 2.0f};
  apply_presence_frequency(same.data(), 2, {{0, 5}}, 0.0f, 0.0f);
  EXPECT_EQ(same, (std::vector<float>{1.0f, 2.0f}));
  std::vector<float> neg = {0.0f, 0.0f};  // negative penalties encourage repeats
  apply_presence_frequency(neg.data(), 2, {{1, 2}}, -1.0f, -0.5f);
  EXPECT_EQ(neg, (std::vector<float>{0.0f, 2.0f}));
}

TEST(TokenLogprobs, LogSoftmaxInDoubleAndTopOrder) {
  const std::vector<float> l = {0.5f, 2.0f, -kInf, 2.0f, -1.0f, kNaN, 1.0f};
  double z = 0;
  for (float x : l)
    if (std::isfinite(x)) z += std::exp(double(x));
  const TokenLogprobs lp = token_logprobs(l.data(), 7, 6, 4);
  EXPECT_NEAR(lp.logprob, 1.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].first, 1);  // tie with id 3: the lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 6);
  EXPECT_EQ(lp.top[3].first, 0);
  EXPECT_NEAR(lp.top[3].second, 0.5 - std::log(z), 1e-6);
  EXPECT_EQ(token_logprobs(l.data(), 7, 2, 0).logprob, -kInf);  // masked
  EXPECT_TRUE(token_logprobs(l.data(), 7, 2, 0).top.empty());
  // More requested than the vocabulary: every id, masked ones last.
  const TokenLogprobs all = token_logprobs(l.data(), 7, 0, 20);
  ASSERT_EQ(all.top.size(), 7u);
  EXPECT_EQ(all.top[5].second, -kInf);
  expect_invalid([&] { token_logprobs(l.data(), 7, 7, 0); }, "token_logprobs: token 7");
  expect_invalid([&] { token_logprobs(l.data(), 7, 0, 21); }, "logprobs must be in [0, 20]");
}

TEST(Argmax, TiesToLowestId) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f};
  EXPECT_EQ(argmax(l.data(), 5), 1);
  std::vector<float> all = {0.5f, 0.5f, 0.5f};
  EXPECT_EQ(argmax(all.data(), 3), 0);
}

TEST(Argmax, NaNNeverWinsAndAllMaskedIsZero) {
  std::vector<float> l = {kNaN, -5.0f, kNaN, -4.0f};
  EXPECT_EQ(argmax(l.data(), 4), 3);
  std::vector<float> nan_first = {kNaN, kNaN, -kInf, -100.0f};
  EXPECT_EQ(argmax(nan_first.data(), 4), 3);
  std::vector<float> masked = {-kInf, -kInf, -kInf};
  EXPECT_EQ(argmax(masked.data(), 3), 0);
  std::vector<float> nans = {kNaN, kNaN};
  EXPECT_EQ(argmax(nans.data(), 2), 0);
  std::vector<float> pinf = {1.0f, kInf, kInf};
  EXPECT_EQ(argmax(pinf.data(), 3), 1);
  std::vector<float> one = {-kInf};
  EXPECT_EQ(argmax(one.data(), 1), 0);
  expect_invalid([&] { argmax(one.data(), 0); }, "logits");
}

TEST(Greedy, TemperatureThreshold) {
  std::vector<float> l = {0.0f, 0.0f, 0.0f, 0.0f};  // flat: sampling would spread
  Rng rng(99);
  for (float t : {0.0f, 0.005f, 0.01f}) {
    for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_next(l.data(), 4, sampling(t), {}, rng), 0) << "t=" << t;
  }
  // Greedy consumes no draws from the generator.
  Rng fresh(99), used(99);
  std::vector<float> g = {0.0f, 1.0f};
  sample_next(g.data(), 2, sampling(0.0f), {}, used);
  EXPECT_EQ(fresh.next_u64(), used.next_u64());
  // 0.011 samples: a flat distribution over 4 tokens shows every one of them.
  std::vector<int> seen(4, 0);
  for (int i = 0; i < 400; ++i) ++seen[sample_next(l.data(), 4, sampling(0.011f), {}, rng)];
  for (int c : seen) EXPECT_GT(c, 0);
}

TEST(Greedy, TopK1EqualsGreedyWhateverTheTemperature) {
  std::vector<float> l = {0.3f, -1.0f, 2.5f, 2.4f, 0.0f, -kInf, 1.0f};
  const int32_t g = argmax(l.data(), 7);
  ASSERT_EQ(g, 2);
  Rng rng(5);
  for (float t : {0.02f, 0.5f, 1.0f, 5.0f, 100.0f, 1e6f}) {
    std::vector<float> d = dist(l, sampling(t, 1));
    for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], i == 2 ? 1.0f : 0.0f) << t;
    for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_next(l.data(), 7, sampling(t, 1), {}, rng), g);
  }
}

// ---------------------------------------------------------------------------------------
// sampling_distribution: hand-computed cases

TEST(Distribution, TemperatureOne) {
  // logits ln1, ln2, ln3, ln4: exp gives 1, 2, 3, 4 (sum 10) -> 0.1, 0.2, 0.3, 0.4.
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  expect_probs(dist(l, sampling(1.0f)), {0.1, 0.2, 0.3, 0.4});
}

TEST(Distribution, TemperatureScalesInDouble) {
  // T = 0.5: logits {0, ln2/2, ln3/2} / 0.5 = {0, ln2, ln3} -> {1, 2, 3} / 6.
  std::vector<float> l = {0.0f, 0.5f * std::log(2.0f), 0.5f * std::log(3.0f)};
  expect_probs(dist(l, sampling(0.5f)), {1.0 / 6, 2.0 / 6, 3.0 / 6});
  // T = 2: logits {0, 2 ln2} / 2 = {0, ln2} -> {1, 2} / 3.
  std::vector<float> m = {0.0f, 2.0f * std::log(2.0f)};
  expect_probs(dist(m, sampling(2.0f)), {1.0 / 3, 2.0 / 3});
  // Large logits do not overflow: {1000, 1000 + ln3} -> {1, 3} / 4.
  std::vector<float> big = {1000.0f, 1000.0f + std::log(3.0f)};
  expect_probs(dist(big, sampling(1.0f)), {0.25, 0.75}, 1e-4);  // 1000+ln3 rounds in float
}

TEST(Distribution, TopK) {
  // {1,2,3,4}/10 with top_k = 2: keep ln3, ln4 -> {3, 4} / 7.
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  expect_probs(dist(l, sampling(1.0f, 2)), {0.0, 0.0, 3.0 / 7, 4.0 / 7});
  // top_k >= V keeps all.
  expect_probs(dist(l, sampling(1.0f, 4)), {0.1, 0.2, 0.3, 0.4});
  expect_probs(dist(l, sampling(1.0f, 1000)), {0.1, 0.2, 0.3, 0.4});
}

TEST(Distribution, TopKKeepsAllTiedAtTheBoundary) {
  // logits {1, 3, 2, 2, 0}, top_k = 2: the 2nd largest is 2, and HF removes only
  // `scores < 2`, so ids 1, 2, 3 stay: e^3, e^2, e^2 over e^2 (e + 2) -> e/(e+2), 1/(e+2) x2.
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
  const double e = std::exp(1.0);
  expect_probs(dist(l, sampling(1.0f, 2)), {0.0, e / (e + 2), 1 / (e + 2), 1 / (e + 2), 0.0});
  // top_k = 1 with a tie at the top keeps both tied tokens (each 1/2).
  std::vector<float> t = {5.0f, 1.0f, 5.0f};
  expect_probs(dist(t, sampling(0.7f, 1)), {0.5, 0.0, 0.5});
}

TEST(Distribution, TopP) {
  // {0.1, 0.2, 0.3, 0.4}, top_p = 0.6: ascending cumulative 0.1, 0.3, 0.6, 1.0; remove
  // cumulative <= 1 - 0.6 = 0.4 -> ids 0, 1 go; keep {0.3, 0.4} / 0.7 = {3, 4} / 7.
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  expect_probs(dist(l, sampling(1.0f, 50, 0.6f)), {0.0, 0.0, 3.0 / 7, 4.0 / 7});
  // top_p = 0.75: remove cumulative <= 0.25 -> only id 0 (0.1); keep {2, 3, 4} / 9.
  expect_probs(dist(l, sampling(1.0f, 50, 0.75f)), {0.0, 2.0 / 9, 3.0 / 9, 4.0 / 9});
  // top_p = 0.35: remove cumulative <= 0.65 -> ids 0, 1, 2 (0.1, 0.3, 0.6); keep id 3 alone.
  expect_probs(dist(l, sampling(1.0f, 50, 0.35f)), {0.0, 0.0, 0.0, 1.0});
}

TEST(Distribution, TopPSoSmallOnlyOneSurvives) {
  std::vector<float> l = {0.1f, 0.4f, 0.35f, -2.0f, 0.39f};
  for (float tp : {1e-6f, 0.01f, 1e-30f}) {
    expect_probs(dist(l, sampling(1.0f, 50, tp)), {0.0, 1.0, 0.0, 0.0, 0.0});
    Rng rng(3);
    for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_next(l.data(), 5, sampling(1.0f, 50, tp), {}, rng), 1);
  }
  // With the top tied, the survivor is the lower id, as in argmax: top_p -> 0 is greedy.
  std::vector<float> tie = {0.0f, 2.0f, 1.0f, 2.0f};
  expect_probs(dist(tie, sampling(1.0f, 50, 1e-6f)), {0.0, 1.0, 0.0, 0.0});
}

TEST(Distribution, TopPTiesOrderedById) {
  // Four equal tokens (0.25 each), top_p = 0.5: cumulative 0.25, 0.5, 0.75, 1 from the
  // least probable; remove <= 0.5 -> two go. Among ties the higher id ranks as less
  // probable, so ids 3, 2 go first; keep ids 0, 1 at 0.5 each. Deterministic every call.
  std::vector<float> l = {1.0f, 1.0f, 1.0f, 1.0f};
  for (int rep = 0; rep < 3; ++rep) expect_probs(dist(l, sampling(1.0f, 50, 0.5f)), {0.5, 0.5, 0.0, 0.0});
}

TEST(Distribution, TopPOneKeepsAll) {
  std::vector<float> l = {-30.0f, 0.0f, std::log(2.0f), 5.0f};
  const std::vector<float> a = dist(l, sampling(1.0f, 50, 1.0f));
  for (float x : a) EXPECT_GT(x, 0.0f);  // e^-35 ~ 6e-16 is tiny but kept
  // Top-p after top-k: {0.1,0.2,0.3,0.4}, top_k = 3 -> {2,3,4}/9; top_p = 0.6: cumulative
  // 2/9 = 0.222 <= 0.4 removed, 5/9 = 0.556 kept -> {3, 4} / 7.
  std::vector<float> m = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  expect_probs(dist(m, sampling(1.0f, 3, 1.0f)), {0.0, 2.0 / 9, 3.0 / 9, 4.0 / 9});
  expect_probs(dist(m, sampling(1.0f, 3, 0.6f)), {0.0, 0.0, 3.0 / 7, 4.0 / 7});
}

TEST(Distribution, MaskedAndNaNLogitsGetZero) {
  // {0, -inf, ln3, NaN} -> e^0, 0, e^ln3, 0 = {1, 0, 3, 0} / 4.
  std::vector<float> l = {0.0f, -kInf, std::log(3.0f), kNaN};
  expect_probs(dist(l, sampling(1.0f)), {0.25, 0.0, 0.75, 0.0});
  // top_k larger than the unmasked count: the k-th largest is -inf, nothing else removed.
  expect_probs(dist(l, sampling(1.0f, 3)), {0.25, 0.0, 0.75, 0.0});
  Rng rng(11);
  for (int i = 0; i < 2000; ++i) {
    const int32_t id = sample_next(l.data(), 4, sampling(3.0f, 50, 0.99f), {}, rng);
    EXPECT_TRUE(id == 0 || id == 2) << id;
  }
  // Logits are not modified by sampling_distribution.
  EXPECT_EQ(l[1], -kInf);
  EXPECT_EQ(l[2], std::log(3.0f));
}

TEST(Distribution, DegenerateRows) {
  // Everything masked: all mass on argmax (id 0), like the greedy rule.
  expect_probs(dist({-kInf, -kInf, kNaN}, sampling(1.0f)), {1.0, 0.0, 0.0});
  // +inf logits share the mass equally.
  expect_probs(dist({0.0f, kInf, 3.0f, kInf}, sampling(1.0f)), {0.0, 0.5, 0.0, 0.5});
  // temperature = +inf (HF accepts it): every finite logit becomes 0, so top-k ties keep
  // them all -> uniform over the unmasked tokens {1, 1, 1, 0} / 3.
  expect_probs(dist({1.0f, 2.0f, 3.0f, -kInf}, sampling(kInf, 2)), {1.0 / 3, 1.0 / 3, 1.0 / 3, 0.0});
  // A single token.
  expect_probs(dist({-3.0f}, sampling(1.0f, 1, 0.1f)), {1.0});
}

// ---------------------------------------------------------------------------------------
// sample_from

TEST(SampleFrom, InverseCdf) {
  // u = (x >> 11) * 2^-53 decides; compute u from a copy of the generator.
  const std::vector<float> probs = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f, 0.0f};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Rng a(seed), b(seed);
    const double u = b.uniform();
    const int32_t want = u < 0.25 ? 1 : (u < 0.75 ? 3 : 4);
    EXPECT_EQ(sample_from(probs, a), want) << "u=" << u;
  }
}

TEST(SampleFrom, ZeroProbNeverDrawnAndUnnormalisedOk) {
  const std::vector<float> probs = {0.0f, 3.0f, 0.0f, 1.0f, 0.0f};  // total 4: {0.75, 0.25}
  Rng rng(17);
  int ones = 0;
  for (int i = 0; i < 10000; ++i) {
    const int32_t id = sample_from(probs, rng);
    ASSERT_TRUE(id == 1 || id == 3);
    ones += id == 1;
  }
  EXPECT_NEAR(ones / 10000.0, 0.75, 0.02);
  Rng r2(1);
  expect_invalid([&] { sample_from({0.0f, 0.0f}, r2); }, "probs");
  expect_invalid([&] { sample_from({}, r2); }, "probs");
}

// ---------------------------------------------------------------------------------------
// Statistics: sample_next against sampling_distribution.

TEST(Statistics, ChiSquareAgainstDistribution) {
  // T = 0.8, top_k = 5 (removes id 5), top_p = 0.95: probabilities after top-k are about
  // {0.495, 0.265, 0.142, 0.076, 0.0218}; ascending cumulative 0.0218 <= 0.05 removes id 4,
  // 0.0977 > 0.05 keeps the rest -> 4 categories, 3 degrees of freedom.
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, -0.5f, -2.0f};
  const SamplingParams p = sampling(0.8f, 5, 0.95f);
  const std::vector<float> probs = dist(logits, p);
  ASSERT_EQ(probs[4], 0.0f);
  ASSERT_EQ(probs[5], 0.0f);
  for (int i = 0; i < 4; ++i) ASSERT_GT(probs[i], 0.05f);

  constexpr int kDraws = 20000;
  std::vector<int> counts(6, 0);
  Rng rng(20240607);
  for (int i = 0; i < kDraws; ++i) {
    std::vector<float> l = logits;  // sample_next may modify in place
    ++counts[sample_next(l.data(), 6, p, {}, rng)];
  }
  EXPECT_EQ(counts[4], 0) << "top-p removed token drawn";
  EXPECT_EQ(counts[5], 0) << "top-k removed token drawn";

  double chi2 = 0.0;
  int categories = 0;
  for (int i = 0; i < 6; ++i) {
    if (probs[i] == 0.0f) continue;
    const double expected = kDraws * static_cast<double>(probs[i]);
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++categories;
  }
  ASSERT_EQ(categories, 4);
  // 0.999 quantile of chi-square with 3 degrees of freedom.
  constexpr double kChi2_999_df3 = 16.266;
  EXPECT_LT(chi2, kChi2_999_df3) << "counts " << counts[0] << " " << counts[1] << " " << counts[2] << " " << counts[3];
}

TEST(Statistics, SampleNextMatchesSampleFromDrawForDraw) {
  // With the penalty: sample_next == sample_from(sampling_distribution(penalised logits))
  // at the same seed, every draw.
  const std::vector<float> logits = {1.0f, -0.5f, 0.7f, 0.69f, -kInf, 2.0f, 0.1f};
  const std::vector<int32_t> seen = {5, 1, 5};
  const SamplingParams p = sampling(1.3f, 4, 0.9f, 1.4f);
  std::vector<float> pen = logits;
  apply_repetition_penalty(pen.data(), 7, seen, 1.4f);
  const std::vector<float> probs = dist(pen, p);
  EXPECT_EQ(probs[4], 0.0f);
  Rng a(77), b(77);
  for (int i = 0; i < 500; ++i) {
    std::vector<float> l = logits;
    const int32_t x = sample_next(l.data(), 7, p, seen, a);
    EXPECT_EQ(x, sample_from(probs, b));
    EXPECT_GT(probs[x], 0.0f);
  }
}

TEST(Statistics, SameSeedSameTokens) {
  const std::vector<float> logits = {0.2f, 0.1f, 0.0f, -0.1f, 0.3f, 0.25f};
  const SamplingParams p = sampling(1.5f, 6, 0.97f, 1.2f);
  auto run = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> seen, out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> l = logits;
      const int32_t id = sample_next(l.data(), 6, p, seen, rng);
      seen.push_back(id);
      out.push_back(id);
    }
    return out;
  };
  EXPECT_EQ(run(9), run(9));
  EXPECT_NE(run(9), run(10));
}

// ---------------------------------------------------------------------------------------
// StopMatcher

TEST(StopMatcher, RejectsBadSequences) {
  expect_invalid([] { StopMatcher({{1}, {}}, 10); }, "stop_sequences");
  expect_invalid([] { StopMatcher({{1, 10}}, 10); }, "stop_sequences");
  expect_invalid([] { StopMatcher({{-1}}, 10); }, "stop_sequences");
  EXPECT_NO_THROW(StopMatcher({{0, 9}}, 10));
  StopMatcher none({}, 10);
  EXPECT_TRUE(none.empty());
  EXPECT_FALSE(none.matches({1, 2, 3}));
  EXPECT_FALSE(none.matches({}));
}

TEST(StopMatcher, MatchesOnlyAtTheTail) {
  StopMatcher m({{198, 198}}, 50257);
  EXPECT_FALSE(m.empty());
  EXPECT_EQ(m.max_length(), 2u);
  EXPECT_FALSE(m.matches({}));
  EXPECT_FALSE(m.matches({198}));
  EXPECT_TRUE(m.matches({198, 198}));
  EXPECT_TRUE(m.matches({5, 6, 198, 198}));
  EXPECT_FALSE(m.matches({198, 198, 7}));  // earlier occurrence is not a match
  EXPECT_FALSE(m.matches({198, 7, 198}));
}

TEST(StopMatcher, ShorterThenFirstListedWins) {
  StopMatcher m({{1, 2, 3}, {3}, {2, 3}, {3}}, 10);
  EXPECT_EQ(m.match_index({1, 2, 3}), 1);  // all match; the shortest, first listed of those
  EXPECT_EQ(m.match_index({2, 3}), 1);
  EXPECT_EQ(m.match_index({3}), 1);
  EXPECT_EQ(m.match_index({3, 4}), -1);
  StopMatcher n({{4, 5}, {9, 5}, {5, 5, 5}}, 10);
  EXPECT_EQ(n.match_index({9, 5}), 1);
  EXPECT_EQ(n.match_index({4, 5}), 0);
  EXPECT_EQ(n.match_index({5, 5, 5}), 2);
  EXPECT_EQ(n.match_index({5, 5}), -1);
}

TEST(StopMatcher, NeverReachesIntoThePrompt) {
  // The prompt ended with 13; the first emitted token is 13 too. The caller passes only the
  // emitted tokens, so [13, 13] cannot match after one token, [13] can.
  StopMatcher m({{13, 13}}, 100);
  const std::vector<int32_t> prompt = {7, 13};
  std::vector<int32_t> emitted = {13};
  EXPECT_FALSE(m.matches(emitted));
  std::vector<int32_t> joined = prompt;
  joined.insert(joined.end(), emitted.begin(), emitted.end());
  EXPECT_TRUE(m.matches(joined));  // what matching the prompt would wrongly do
  emitted.push_back(13);
  EXPECT_TRUE(m.matches(emitted));
}

}  // namespace
}  // namespace tinyloop::runtime
