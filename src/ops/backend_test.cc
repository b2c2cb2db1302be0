// ops/backend.h: the environment's defaults are read in one place and applied through the
// setters, configure_backend changes what it names and nothing else, backend_info reports
// it, and the weight copies the backend derives change speed, never bits.
#include "ops/backend.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "ops/matmul_bf16dot.h"
#include "ops/matmul_q8act.h"
#include "ops/ops.h"
#include "ops/reference.h"
#include "ops/test_util.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::ops {
namespace {

// Sets an environment variable for the scope of one test.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

BackendSettings threads(int n) {
  BackendSettings s;
  s.num_threads = n;
  return s;
}

BackendSettings scalar(bool on) {
  BackendSettings s;
  s.force_scalar = on;
  return s;
}

TEST(Backend, EnvironmentGivesTheSettings) {
  EXPECT_FALSE(backend_settings_from_env().num_threads.has_value());
  {
    ScopedEnv a("TINYLOOP_NUM_THREADS", "3"), b("TINYLOOP_FORCE_SCALAR", "1"), c("TINYLOOP_DISABLE_AMX", "1"),
        d("TINYLOOP_DISABLE_VNNI", "yes");
    const BackendSettings s = backend_settings_from_env();
    EXPECT_EQ(s.num_threads, 3);
    EXPECT_EQ(s.force_scalar, true);
    EXPECT_EQ(s.amx, false);
    EXPECT_EQ(s.vnni, false);
  }
  for (const char* bad : {"zero", "-2", "0", "3x", ""}) {
    ScopedEnv a("TINYLOOP_NUM_THREADS", bad);
    EXPECT_FALSE(backend_settings_from_env().num_threads.has_value()) << bad;
  }
  ScopedEnv off("TINYLOOP_FORCE_SCALAR", "0");  // "0" counts as unset
  EXPECT_FALSE(backend_settings_from_env().force_scalar.has_value());
}

TEST(Backend, ThreadsDefaultToTheEnvironmentThenTheCores) {
  configure_backend(threads(2));
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(backend_info().num_threads, 2);
  {
    ScopedEnv a("TINYLOOP_NUM_THREADS", "3");
    configure_backend(threads(0));  // < 1: the default, which reads the env again
    EXPECT_EQ(num_threads(), 3);
  }
  configure_backend(threads(0));
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(num_threads(), hw > 0 ? int(hw) : 1);
}

TEST(Backend, ForceScalarIsReportedAndLeavesOtherSettingsAlone) {
  const bool was = force_scalar();  // the suite also runs whole under TINYLOOP_FORCE_SCALAR=1
  configure_backend(threads(2));
  configure_backend(scalar(true));
  EXPECT_TRUE(force_scalar());
  EXPECT_TRUE(backend_info().force_scalar);
  EXPECT_EQ(num_threads(), 2);
  set_force_scalar(false);
  EXPECT_FALSE(backend_info().force_scalar);
  const BackendInfo i = backend_info();
  EXPECT_FALSE(i.simd_target.empty());
  ASSERT_FALSE(i.compiled_targets.empty());
  EXPECT_FALSE(i.q8_kernel.empty());
  EXPECT_EQ(q8act_is_fast(), i.q8_kernel == "amx-int8" || i.q8_kernel == "avx512vnni" || i.q8_kernel == "avx2")
      << i.q8_kernel;
  EXPECT_EQ(i.amx, i.amx_reason.empty());
  configure_backend(threads(0));
  configure_backend(scalar(was));
}

// Odd sizes: a partial 64-column panel and an odd K.
TEST(Backend, Bf16CopiesGiveTheReferenceBitsAndCountTheirBytes) {
  const int64_t N = 70, K = 37, T = 3;
  const auto st = testing::store_weight(testing::random_floats(size_t(N * K), 1), N, K, DType::F16);
  const auto x = testing::random_floats(size_t(T * K), 2);
  WeightView w = st.view(), quant;
  const auto q = testing::store_quant(testing::random_floats(size_t(N * 64), 3), N, 64, DType::I8, 32);
  quant = q.view();
  const WeightCopies c = make_bf16dot_copies({&w, &quant});
  EXPECT_EQ(c.bytes, bf16dot_packed_words(N, K) * 4);
  ASSERT_NE(w.bf16dot, nullptr);
  EXPECT_EQ(quant.bf16dot, nullptr);  // quantized weights keep their own arithmetic
  std::vector<float> got(size_t(T * N)), want(size_t(T * N));
  matmul(x.data(), T, w, nullptr, got.data());
  if (backend_info().bf16_kernel == "amx") ref::matmul_bf16dot_amx(x.data(), T, w, nullptr, want.data());
  else ref::matmul_bf16dot(x.data(), T, w, nullptr, want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
}

TEST(Backend, Q8CopiesChangeNoBitAndSkipViewsWithoutQ8) {
  const int64_t N = 19, K = 96, T = 5;
  const auto st = testing::store_quant(testing::random_floats(size_t(N * K), 4), N, K, DType::U4, 32, DType::F16);
  const auto x = testing::random_floats(size_t(T * K), 5, -2.f, 2.f);
  WeightView w = st.view(), plain = st.view();
  w.q8act = true;
  const WeightCopies c = make_q8act_copies({&w, &plain});
  EXPECT_EQ(plain.q8packed, nullptr);  // q8act off: the exact path, no copy
  EXPECT_EQ(c.bytes, q8act_packed_bytes(w));
  EXPECT_EQ(w.q8packed != nullptr, c.bytes > 0);
  std::vector<float> got(size_t(T * N)), want(size_t(T * N));
  matmul(x.data(), T, w, nullptr, got.data());
  ref::matmul_q8act(x.data(), T, st.view(), nullptr, want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
}

}  // namespace
}  // namespace tinyloop::ops
