// cpu::matmul on int8 / int4 weights against the scalar reference (ops::ref::matmul) on
// every compiled target, odd N, K, G (G = K, G = 32, groups that straddle vector chunks),
// both the fused (T <= 4) and the tiled path; and batch, slice and thread-count
// invariance, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "cpu/thread_pool.h"
#include "ops/reference.h"
#include "ops/test_util.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::kU;
using ops::testing::name_of;
using ops::testing::QCase;
using ops::testing::random_floats;
using ops::testing::store_quant;
using ops::testing::StoredQuant;

// K below, at and around the 4 / 8 / 16 lanes and the int4 blocks (8 / 16 / 32 columns);
// G = K (per row), G = 32, and G that cut chunks (odd for int8, 6 / 26 for int4).
const QCase kCases[] = {
    {DType::I8, 1, 1, DType::F32},     {DType::I8, 15, 15, DType::F16},  {DType::I8, 17, 17, DType::F32},
    {DType::I8, 67, 67, DType::F32},   {DType::I8, 129, 43, DType::F16}, {DType::I8, 96, 32, DType::F16},
    {DType::I8, 768, 32, DType::F32},  {DType::I8, 45, 9, DType::F32},   {DType::U4, 2, 2, DType::F32},
    {DType::U4, 30, 30, DType::F16},   {DType::U4, 34, 34, DType::F32},  {DType::U4, 66, 6, DType::F32},
    {DType::U4, 130, 26, DType::F16},  {DType::U4, 96, 32, DType::F16},  {DType::U4, 768, 32, DType::F32},
    {DType::U4, 160, 160, DType::F16},
};

struct Data {
  std::vector<float> x;  // [T, K]
  StoredQuant w;  // [N, K]
  std::vector<float> b;  // [N]
};

Data make(const QCase& c, int64_t T, int64_t N, uint32_t seed) {
  return Data{random_floats(size_t(T * c.K), seed),
              store_quant(random_floats(size_t(N * c.K), seed + 1), N, c.K, c.dtype, c.G, c.scale_dtype),
              random_floats(size_t(N), seed + 2)};
}

// The float dot-product bound of matmul_test.cc between two K-term sums, plus the int4
// weights' fused multiply-add (each SIMD weight within 1 ulp of the reference's): 2 more
// roundings' worth per term.
void expect_close(const QCase& c, const Data& d, int64_t T, int64_t N, bool bias) {
  const float* b = bias ? d.b.data() : nullptr;
  std::vector<float> y(size_t(T * N), NAN), ref(size_t(T * N), NAN);
  cpu::matmul(d.x.data(), T, d.w.view(), b, y.data());
  ops::ref::matmul(d.x.data(), T, d.w.view(), b, ref.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double mag = bias ? std::fabs(d.b[size_t(n)]) : 0.0;
      for (int64_t k = 0; k < c.K; ++k)
        mag += std::fabs(double(d.x[size_t(t * c.K + k)]) * d.w.decoded[size_t(n * c.K + k)]);
      const double tol = 2.02 * double(c.K + 4) * kU * mag;
      const size_t i = size_t(t * N + n);
      ASSERT_NEAR(y[i], ref[i], tol) << name_of(c) << " T=" << T << " N=" << N << " t=" << t << " n=" << n;
    }
}

class CpuQuantMatmul : public ::testing::TestWithParam<QCase> {};

TEST_P(CpuQuantMatmul, AgainstReference) {
  const QCase c = GetParam();
  testing::for_each_target([&] {
    uint32_t seed = 1;
    for (int64_t T : {1, 2, 3, 4, 5, 9})
      for (int64_t N : {1, 5, 67})
        for (bool bias : {false, true}) {
          expect_close(c, make(c, T, N, seed += 3), T, N, bias);
          if (HasFatalFailure()) return;
        }
  });
}

// Row t of a T-row call == the row alone; a column of an N-slice of W == the same column
// of the whole call. Bit-exact, on every target.
TEST_P(CpuQuantMatmul, BatchAndSliceInvariant) {
  const QCase c = GetParam();
  testing::for_each_target([&] {
    const int64_t T = 11, N = 75;
    const Data d = make(c, T, N, 7);
    std::vector<float> y(size_t(T * N));
    cpu::matmul(d.x.data(), T, d.w.view(), d.b.data(), y.data());
    for (int64_t t0 = 0; t0 < T; ++t0)
      for (int64_t rows : {1, 2, 3, 4, 5}) {
        if (t0 + rows > T) continue;
        std::vector<float> yr(size_t(rows * N));
        cpu::matmul(d.x.data() + t0 * c.K, rows, d.w.view(), d.b.data(), yr.data());
        for (int64_t i = 0; i < rows * N; ++i)
          ASSERT_EQ(yr[size_t(i)], y[size_t(t0 * N + i)]) << name_of(c) << " t0=" << t0 << " rows=" << rows;
      }
    const int64_t n0 = 31, ns = 9;
    std::vector<float> ys(size_t(T * ns));
    cpu::matmul(d.x.data(), T, d.w.rows_view(n0, ns), d.b.data() + n0, ys.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < ns; ++j) ASSERT_EQ(ys[size_t(t * ns + j)], y[size_t(t * N + n0 + j)]);
  });
}

INSTANTIATE_TEST_SUITE_P(Formats, CpuQuantMatmul, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return name_of(info.param); });

TEST(CpuQuantMatmulThreads, ThreadCountInvariant) {
  const int before = num_threads();
  for (DType dt : {DType::I8, DType::U4})
    for (int64_t T : {1, 9}) {
      const QCase c{dt, 320, 32, DType::F16};
      const Data d = make(c, T, 200, 11);
      std::vector<float> y1(size_t(T * 200)), yn(size_t(T * 200));
      set_num_threads(1);
      cpu::matmul(d.x.data(), T, d.w.view(), d.b.data(), y1.data());
      for (int n : {2, 3}) {
        set_num_threads(n);
        cpu::matmul(d.x.data(), T, d.w.view(), d.b.data(), yn.data());
        ASSERT_EQ(y1, yn) << dtype_name(dt) << " threads=" << n << " T=" << T;
      }
    }
  set_num_threads(before);
}

}  // namespace
}  // namespace tinyloop::cpu
