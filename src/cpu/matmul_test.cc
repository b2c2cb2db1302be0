// cpu::matmul against the scalar reference (ops::ref::matmul), on every compiled target, on
// odd sizes (vector tails, ragged micro-kernel tiles, partial thread tasks); and its batch,
// slice and thread-count invariance, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/test_util.h"
#include "cpu/thread_pool.h"
#include "ops/reference.h"
#include "ops/test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::kU;
using ops::testing::random_floats;
using ops::testing::store_weight;
using ops::testing::StoredWeight;

struct Case {
  std::vector<float> x;  // [T, K]
  StoredWeight w;  // [N, K]
  std::vector<float> b;  // [N]
  int64_t T, K, N;
};

Case make_case(int64_t T, int64_t K, int64_t N, DType dt, uint32_t seed) {
  return Case{random_floats(size_t(T * K), seed),
              store_weight(random_floats(size_t(N * K), seed + 1), N, K, dt),
              random_floats(size_t(N), seed + 2),
              T,
              K,
              N};
}

// Both kernels compute a K-term float dot product (+ bias) in some order; each is within
// gamma_{K+2} * (sum |x_k w_k| + |b|) of the exact value (Higham 3.1; FMA only removes
// roundings), so they are within twice that of each other. 2% margin for the gamma_n
// higher-order term. The weights are compared as decoded (exact in float for F16/BF16).
void expect_close_to_reference(const Case& c, bool bias) {
  const float* b = bias ? c.b.data() : nullptr;
  std::vector<float> y(size_t(c.T * c.N), NAN), ref(size_t(c.T * c.N), NAN);
  cpu::matmul(c.x.data(), c.T, c.w.view(), b, y.data());
  ops::ref::matmul(c.x.data(), c.T, c.w.view(), b, ref.data());
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t n = 0; n < c.N; ++n) {
      double mag = bias ? std::fabs(c.b[size_t(n)]) : 0.0;
      for (int64_t k = 0; k < c.K; ++k)
        mag += std::fabs(double(c.x[size_t(t * c.K + k)]) * c.w.decoded[size_t(n * c.K + k)]);
      const double tol = 2.02 * double(c.K + 2) * kU * mag;
      const size_t i = size_t(t * c.N + n);
      ASSERT_NEAR(y[i], ref[i], tol) << "T=" << c.T << " K=" << c.K << " N=" << c.N
                                     << " dtype=" << dtype_name(c.w.dtype) << " t=" << t << " n=" << n;
    }
}

class CpuMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CpuMatmul, OddSizesAgainstReference) {
  testing::for_each_target([&] {
    uint32_t seed = 1;
    // T: the fused path (1..4) and the direct one (5..64, ragged 4-row tiles); K: below, at
    // and around the 4 / 8 / 16 lane widths, and model-sized; N: ragged 4-column tiles and
    // several 32-row tasks.
    for (int64_t T : {1, 2, 3, 4, 5, 7, 9})
      for (int64_t K : {1, 3, 15, 16, 17, 33, 129})
        for (int64_t N : {1, 5, 67})
          for (bool bias : {false, true}) {
            expect_close_to_reference(make_case(T, K, N, GetParam(), seed += 3), bias);
            if (HasFatalFailure()) return;
          }
    // Model-sized rows, several tasks on the pool, tiles of every path (the tiled one from
    // T = 65: matmul_internal.h kDirectMaxRows).
    expect_close_to_reference(make_case(1, 768, 130, GetParam(), 100), true);
    expect_close_to_reference(make_case(13, 768, 70, GetParam(), 101), false);
    expect_close_to_reference(make_case(6, 2051, 21, GetParam(), 102), true);
    expect_close_to_reference(make_case(64, 129, 45, GetParam(), 103), true);
    expect_close_to_reference(make_case(67, 129, 45, GetParam(), 104), false);
    // AVX-512's 8 x 3 prefill tile: a last block of 6 x rows, N = 47 leaving 2 weight rows;
    // K = 2051 on the 4 x 4 tile (one task of 26 rows), and in packed K chunks (512 x 4 + 3)
    // on a task of 36 rows beside one of 4.
    expect_close_to_reference(make_case(70, 130, 47, GetParam(), 105), true);
    expect_close_to_reference(make_case(70, 2051, 26, GetParam(), 106), true);
    expect_close_to_reference(make_case(70, 2051, 40, GetParam(), 107), true);
    // K = 3077 on a task of 36 rows: two column spans of the widened tile (2560, 517).
    expect_close_to_reference(make_case(70, 3077, 40, GetParam(), 108), false);
  });
}

// Row t of a T-row call == the same row alone (decode == prefill == speculative verify), and
// a column computed in an N-slice of W == the same column in the full call: the per-element
// arithmetic depends on K only. Bit-exact.
TEST_P(CpuMatmul, BatchAndSliceInvariant) {
  testing::for_each_target([&] {
    // AVX-512's 8 x 3 prefill tile (T = 70: a last block of 6 rows, N = 75: tasks leaving
    // weight rows to the 4-row tile), in one pass (K < 1024) and in packed K chunks of 512 on
    // the tasks of 36 rows or more: K = 1024 (two whole chunks, no tail), 1030 (512, 512, the
    // 6-float tail), 1300 (the last chunk whole vectors and a tail), 2051 (a first chunk,
    // three middle ones, a last).
    for (int64_t K : {7, 64, 131, 1024, 1030, 1300, 2051}) {
      const int64_t T = 70, N = 75;  // the whole call on the tiled path
      const Case c = make_case(T, K, N, GetParam(), uint32_t(K));
      std::vector<float> y(size_t(T * N));
      cpu::matmul(c.x.data(), T, c.w.view(), c.b.data(), y.data());
      for (int64_t t0 = 0; t0 < T; ++t0)
        for (int64_t rows : {1, 2, 3, 4, 5, 9, 64, 65}) {  // every fused width, direct and tiled calls
          if (t0 + rows > T) continue;
          std::vector<float> yr(size_t(rows * N));
          cpu::matmul(c.x.data() + t0 * K, rows, c.w.view(), c.b.data(), yr.data());
          for (int64_t i = 0; i < rows * N; ++i)
            ASSERT_EQ(yr[size_t(i)], y[size_t(t0 * N + i)]) << "K=" << K << " t0=" << t0 << " rows=" << rows;
        }
      // Columns [n0, n0 + 9) from a 9-row slice of W.
      const int64_t n0 = 31, ns = 9;
      ops::WeightView slice = c.w.view();
      slice.rows = ns;
      slice.data = static_cast<const char*>(slice.data) + n0 * K * int64_t(dtype_size(slice.dtype));
      std::vector<float> ys(size_t(T * ns));
      cpu::matmul(c.x.data(), T, slice, c.b.data() + n0, ys.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < ns; ++j) ASSERT_EQ(ys[size_t(t * ns + j)], y[size_t(t * N + n0 + j)]);
    }
  });
}

// AVX-512's chunked prefill path where K needs more than one column span of the widened
// tile (K = 3077 on tasks of 36 rows: spans of 2560 and 517 columns) and T more than one
// panel of 512 x rows (530: a panel of 512, one of 18 rows, 8-row blocks up to 528 and
// the last 2 rows on the direct tile): the accumulators kept per 8-row block between spans
// give the bits of a one-row call (the fused path) and of a 5-row one (the direct path).
TEST_P(CpuMatmul, LongKSpansAndPanelsMatchRowCalls) {
  testing::for_each_target([&] {
    const int64_t T = 530, K = 3077, N = 40;
    const Case c = make_case(T, K, N, GetParam(), 9);
    std::vector<float> y(size_t(T * N));
    cpu::matmul(c.x.data(), T, c.w.view(), c.b.data(), y.data());
    for (int64_t t0 : {0, 7, 8, 255, 508, 511, 512, 519, 520, 525}) {
      for (int64_t rows : {1, 5}) {
        std::vector<float> yr(size_t(rows * N));
        cpu::matmul(c.x.data() + t0 * K, rows, c.w.view(), c.b.data(), yr.data());
        for (int64_t i = 0; i < rows * N; ++i)
          ASSERT_EQ(yr[size_t(i)], y[size_t(t0 * N + i)]) << "t0=" << t0 << " rows=" << rows << " i=" << i;
      }
    }
  });
}

// The thread count decides which thread computes a column, never how: 1, 2 and 3 threads
// (more than this machine may have) give the same bits, on a call big enough to be split.
TEST_P(CpuMatmul, ThreadCountInvariant) {
  const int before = num_threads();
  for (int64_t T : {1, 9, 70}) {  // fused, direct, tiled
    const Case c = make_case(T, 300, 200, GetParam(), 7);
    std::vector<float> y1(size_t(T * 200)), yn(size_t(T * 200));
    set_num_threads(1);
    cpu::matmul(c.x.data(), T, c.w.view(), c.b.data(), y1.data());
    for (int n : {2, 3}) {
      set_num_threads(n);
      cpu::matmul(c.x.data(), T, c.w.view(), c.b.data(), yn.data());
      ASSERT_EQ(y1, yn) << "threads=" << n << " T=" << T;
    }
  }
  set_num_threads(before);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CpuMatmul, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuMatmulEdge, EmptyKGivesBias) {
  ops::WeightView w;
  w.rows = 3;
  w.cols = 0;
  const float b[3] = {1, 2, 3};
  float y[6];
  cpu::matmul(nullptr, 2, w, b, y);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(y[i], b[i % 3]);
}

TEST(CpuMatmulEdge, InfAndNanPropagateAsReference) {
  // An inf weight times a nonzero x is inf; a nan anywhere in the row makes the row nan.
  const int64_t K = 19, N = 3;
  std::vector<float> x(K, 1.f), w(size_t(N * K), 0.5f);
  w[0 * K + 18] = INFINITY;  // in the vector tail on every target
  w[1 * K + 2] = NAN;
  const auto sw = ops::testing::store_weight(w, N, K, DType::F16);
  testing::for_each_target([&] {
    float y[N];
    cpu::matmul(x.data(), 1, sw.view(), nullptr, y);
    EXPECT_EQ(y[0], INFINITY);
    EXPECT_TRUE(std::isnan(y[1]));
    EXPECT_EQ(y[2], 0.5f * K);
  });
}

}  // namespace
}  // namespace tinyloop::cpu
