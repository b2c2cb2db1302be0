// The packed q8-activation matmul (cpu/matmul_q8act_packed.h) against the scalar reference
// ops::ref::matmul_q8act, bit for bit (the sign of zero included): int8 / int4 weights, N
// around the 16-row groups and 32-row tasks, K odd multiples of 32, groups of 32 and larger,
// F16 / F32 params, 1 to 9 x rows and large T, bias or none, full-scale and zero values, a
// weight big enough for every pool thread; and the errors. Each kernel the CPU runs
// (AVX512-VNNI, AVX2, AMX-INT8 for every T, every tile edge: 1..33 rows around the 4-row
// float steps and 16-row tiles, odd block counts for its two-block pipeline) is checked;
// skipped on CPUs that run none. Without AMX-INT8 the run ends with a line
// "[ AMX      ] NOT TESTED: the AMX-INT8 kernel (<reason>)".
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/amx.h"
#include "cpu/kernels.h"
#include "cpu/matmul_q8act_packed.h"
#include "cpu/matmul_q8act_packed_internal.h"
#include "cpu/matmul_q8act_vnni.h"
#include "ops/matmul_q8act.h"
#include "base/q8act_format.h"
#include "ops/test_util.h"
#include "ops/weight_quant_test_util.h"

namespace tinyloop::cpu {
namespace {

using ops::testing::random_floats;
using ops::testing::store_quant;

// A packed copy that owns its 64-byte aligned bytes, and the view that points at it.
struct Packed {
  std::vector<uint8_t> bytes;
  ops::WeightView view;
  explicit Packed(const ops::WeightView& w) : view(w) {
    bytes.resize(size_t(detail::q8act_packed_bytes(w) + 64));
    uint8_t* p = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    detail::pack_q8act(w, p);
    view.q8packed = p;
  }
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Prints, after all tests, whether the AMX-INT8 kernel was exercised (GTEST_SKIP lines scroll by).
class AmxSummary : public ::testing::Environment {
 public:
  void TearDown() override {
    if (detail::packed_amx_int8_supported()) std::printf("[ AMX      ] AMX-INT8 kernel tested on this CPU\n");
    else
      std::printf("[ AMX      ] NOT TESTED: the AMX-INT8 kernel (%s)\n",
                  amx_status().int8
                      ? amx_inactive_reason().c_str()
                      : (amx_status().reason.empty() ? "no AMX-INT8 on this CPU" : amx_status().reason.c_str()));
  }
};
[[maybe_unused]] ::testing::Environment* const g_summary = ::testing::AddGlobalTestEnvironment(new AmxSummary);

// The packed kernels this CPU runs.
std::vector<detail::PackedIsa> isas() {
  std::vector<detail::PackedIsa> v;
  if (detail::vnni_supported()) v.push_back(detail::PackedIsa::Avx512Vnni);
  if (detail::packed_avx2_supported()) v.push_back(detail::PackedIsa::Avx2);
  if (detail::packed_amx_int8_supported()) v.push_back(detail::PackedIsa::AmxInt8);
  return v;
}

const char* isa_name(detail::PackedIsa isa) {
  switch (isa) {
    case detail::PackedIsa::Avx2: return "avx2";
    case detail::PackedIsa::AmxInt8: return "amx-int8";
    default: return "avx512vnni";
  }
}

// Every packed kernel (and the dispatcher) == reference, bitwise.
void check_exact(const ops::testing::StoredQuant& st, const std::vector<float>& x, int64_t T, const float* bias) {
  const int64_t N = st.N;
  const Packed pk(st.view());
  std::vector<float> got(size_t(T * N)), want(size_t(T * N)), disp(size_t(T * N));
  ops::ref::matmul_q8act(x.data(), T, st.view(), bias, want.data());
  cpu::matmul_q8act(x.data(), T, pk.view, bias, disp.data());
  for (int64_t i = 0; i < T * N; ++i)
    ASSERT_EQ(bits(disp[size_t(i)]), bits(want[size_t(i)])) << "dispatched t=" << i / N << " n=" << i % N;
  for (detail::PackedIsa isa : isas()) {
    std::fill(got.begin(), got.end(), -1.f);
    detail::matmul_q8act_packed(x.data(), T, pk.view, bias, got.data(), isa);
    for (int64_t i = 0; i < T * N; ++i)
      ASSERT_EQ(bits(got[size_t(i)]), bits(want[size_t(i)]))
          << isa_name(isa) << " t=" << i / N << " n=" << i % N << " got " << got[size_t(i)] << " want "
          << want[size_t(i)];
  }
}

using Case = ops::testing::Q8Case;

TEST(CpuQ8ActPacked, BitForBitTheReference) {
  if (isas().empty()) GTEST_SKIP() << "this CPU runs neither packed kernel";
  const std::vector<Case> cases = ops::testing::q8_kernel_cases();
  for (const Case& c : cases)
    for (int64_t T : {1, 2, 3, 4, 5, 7, 9, 70})
      for (int64_t N : {1, 3, 16, 17, 33, 67}) {
        SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " K=" + std::to_string(c.K) + " G=" + std::to_string(c.G) +
                     " " + dtype_name(c.sd) + " T=" + std::to_string(T) + " N=" + std::to_string(N));
        const auto x = random_floats(size_t(T * c.K), uint32_t(c.K + T), -2.f, 2.f);
        const auto st = store_quant(random_floats(size_t(N * c.K), uint32_t(9 + N)), N, c.K, c.dtype, c.G, c.sd);
        const auto bias = random_floats(size_t(N), 11);
        check_exact(st, x, T, (N + T) % 2 ? bias.data() : nullptr);
        if (HasFatalFailure()) return;
      }
}

// The AMX-INT8 tiles' edges: T around the 4-row float steps and the 16-row tiles (and the
// 64-row x chunks), block counts 1..5 (the two-block pipeline's odd tails), N around the
// 16-row groups and 32-row tasks, int8 / int4, F16 / F32 params. Runs the other kernels too.
TEST(CpuQ8ActPacked, AmxTileEdges) {
  if (!detail::packed_amx_int8_supported()) GTEST_SKIP() << "no AMX-INT8: " << amx_inactive_reason();
  for (DType dt : {DType::I8, DType::U4})
    for (DType sd : {DType::F16, DType::F32})
      for (int64_t K : {32, 64, 96, 160})
        for (int64_t T : {1, 3, 4, 5, 8, 12, 13, 15, 16, 17, 20, 31, 32, 33, 63, 64, 65, 80})
          for (int64_t N : {5, 16, 31, 48, 70}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(sd) + " K=" + std::to_string(K) +
                         " T=" + std::to_string(T) + " N=" + std::to_string(N));
            const auto x = random_floats(size_t(T * K), uint32_t(3 * K + T), -3.f, 3.f);
            const auto st = store_quant(random_floats(size_t(N * K), uint32_t(N + K)), N, K, dt, 32, sd);
            const auto bias = random_floats(size_t(N), 12);
            check_exact(st, x, T, T % 2 ? bias.data() : nullptr);
            if (HasFatalFailure()) return;
          }
}

// Batch invariance across the VNNI / AMX switch: a row alone (VNNI) equals the same row in
// calls of 2..40 rows (AMX from amx_int8_min_rows), through the dispatcher, at any position.
TEST(CpuQ8ActPacked, RowAloneEqualsRowInABatch) {
  if (isas().empty()) GTEST_SKIP() << "this CPU runs no packed kernel";
  const int64_t K = 320, N = 40;
  for (DType dt : {DType::I8, DType::U4}) {
    const auto st = store_quant(random_floats(size_t(N * K), 21), N, K, dt, 64, DType::F16);
    const Packed pk(st.view());
    const int64_t Tmax = 40;
    const auto x = random_floats(size_t(Tmax * K), 22, -2.f, 2.f);
    std::vector<float> alone(size_t(Tmax * N)), batch(size_t(Tmax * N));
    for (int64_t t = 0; t < Tmax; ++t) cpu::matmul_q8act(x.data() + t * K, 1, pk.view, nullptr, alone.data() + t * N);
    for (int64_t T : {2, 7, 8, 9, 16, 17, 33, 40}) {
      cpu::matmul_q8act(x.data(), T, pk.view, nullptr, batch.data());
      for (int64_t i = 0; i < T * N; ++i)
        ASSERT_EQ(bits(batch[size_t(i)]), bits(alone[size_t(i)])) << dtype_name(dt) << " T=" << T << " i=" << i;
    }
  }
}

// Every int8 value -128..127 and int4 value 0..15 in the weight (the +128 flip and the
// nibble split), x rows with full-scale +-127 entries, zeros and all-zero blocks (sums of
// -0 / +0), no bias.
TEST(CpuQ8ActPacked, ExactOnExtremeValues) {
  if (isas().empty()) GTEST_SKIP() << "this CPU runs neither packed kernel";
  const int64_t K = 288, N = 37, T = 6;
  std::vector<float> wf(size_t(N * K));  // [N, K]
  for (int64_t i = 0; i < N * K; ++i) wf[size_t(i)] = float(int(i * 7919 % 256) - 128) / 128.f;
  std::vector<float> x(size_t(T * K), 0.f);  // [T, K]: row 0 stays zero
  for (int64_t k = 0; k < K; ++k) {
    x[size_t(1 * K + k)] = (k % 2 ? -1.f : 1.f) * 1000.f;  // full scale, both signs
    x[size_t(2 * K + k)] = k < 32 ? 0.f : float(k % 13) - 6.f;  // a zero block first
    x[size_t(3 * K + k)] = -1e-30f * float(k % 5);  // tiny negatives
    x[size_t(4 * K + k)] = k % 32 == 0 ? 3.f : 0.f;  // one nonzero per block
    x[size_t(5 * K + k)] = float(k) - 140.f;
  }
  for (DType dt : {DType::I8, DType::U4})
    for (DType sd : {DType::F16, DType::F32}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(sd));
      check_exact(store_quant(wf, N, K, dt, 32, sd), x, T, nullptr);
      if (HasFatalFailure()) return;
    }
}

// 16389 rows (not a multiple of 16 or 32): every pool thread takes tasks, the decode
// prefetch runs past the end; each T 1..5 (and 24: AMX tiles) equals the reference, so any
// split gives the same.
TEST(CpuQ8ActPacked, BigWeightEveryThread) {
  if (isas().empty()) GTEST_SKIP() << "this CPU runs neither packed kernel";
  const int64_t N = 16389, K = 256;
  for (DType dt : {DType::I8, DType::U4}) {
    const auto st = store_quant(random_floats(size_t(N * K), 5), N, K, dt, 32, DType::F16);
    const auto bias = random_floats(size_t(N), 6);
    for (int64_t T : {1, 2, 3, 4, 5, 24}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T=" + std::to_string(T));
      check_exact(st, random_floats(size_t(T * K), uint32_t(T)), T, bias.data());
      if (HasFatalFailure()) return;
    }
  }
}

// The AVX2 kernel's own quantizer against the scalar one, bit for bit (q, d, s): random
// rows, ties (amax 127 makes id 1, so x = k + 0.5 rounds half to even), zeros of both signs,
// an all-zero block, subnormals (127 / amax overflows: q = 0), 1e38, a block with two infs
// and a NaN (the x86 integer indefinite, its sum wrapping), and blocks whose amax sits in each
// of the 32 lanes.
TEST(CpuQ8ActPacked, Avx2QuantizerIsTheReference) {
  if (!detail::packed_avx2_supported()) GTEST_SKIP() << "no AVX2 + FMA + F16C";
  const int64_t nb = 40, K = nb * 32;
  std::vector<float> x = random_floats(size_t(K), 31, -5.f, 5.f);  // [K]
  for (int64_t k = 0; k < 32; ++k) {
    x[size_t(k)] = k == 7 ? 127.f : float(k % 9) - 4.5f;  // block 0: ties
    x[size_t(32 + k)] = k % 2 ? -0.f : 0.f;  // block 1: all zero
    x[size_t(64 + k)] = k % 3 ? 1e-40f : -1e-39f;  // block 2: subnormals
    x[size_t(96 + k)] = k == 31 ? -1e38f : float(k);  // block 3: near the float max
  }
  for (int64_t b = 4; b < 36; ++b) x[size_t(b * 32 + (b - 4))] = -50.f;  // amax in lane b - 4
  x[size_t(36 * 32 + 3)] = INFINITY, x[size_t(36 * 32 + 9)] = -INFINITY, x[size_t(36 * 32 + 20)] = NAN;
  std::vector<int8_t> q(static_cast<size_t>(K)), qr(static_cast<size_t>(K));
  const size_t nbs = static_cast<size_t>(nb);
  std::vector<float> d(nbs), s(nbs), dr(nbs), sr(nbs);
  ops::detail::quantize_row_q8(x.data(), K, qr.data(), dr.data(), sr.data());
  detail::quantize_row_q8_avx2(x.data(), K, q.data(), d.data(), s.data());
  for (int64_t k = 0; k < K; ++k) ASSERT_EQ(q[size_t(k)], qr[size_t(k)]) << "k=" << k;
  for (int64_t k = 64; k < 96; ++k) ASSERT_EQ(qr[size_t(k)], 0) << "subnormal block, k=" << k;
  EXPECT_EQ(dr[2], 0.f);  // fp16 has no d that small
  EXPECT_FALSE(std::isfinite(sr[36]));  // the non-finite block poisons its sum, not a wrong finite
  for (int64_t b = 0; b < nb; ++b) {
    ASSERT_EQ(bits(d[size_t(b)]), bits(dr[size_t(b)])) << "d, block " << b;
    ASSERT_EQ(bits(s[size_t(b)]), bits(sr[size_t(b)])) << "s, block " << b;
  }
}

TEST(CpuQ8ActPacked, Errors) {
  const auto st8 = store_quant(random_floats(size_t(4 * 64), 1), 4, 64, DType::I8, 32, DType::F16);
  // Groups of 16 columns straddle the 32-column activation blocks: not packable.
  const auto st16 = store_quant(random_floats(size_t(4 * 64), 1), 4, 64, DType::I8, 16, DType::F16);
  EXPECT_EQ(detail::q8act_packed_bytes(st16.view()), 0);
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(detail::pack_q8act(st16.view(), buf.data()), std::invalid_argument);
  std::vector<float> x(64), y(4);
  EXPECT_THROW(detail::matmul_q8act_packed(x.data(), 1, st8.view(), nullptr, y.data(), detail::PackedIsa::Avx2),
               std::invalid_argument);
  if (!detail::packed_amx_int8_supported() && !isas().empty()) {  // asking for AMX where it is not: named
    const Packed pk(st8.view());
    try {
      detail::matmul_q8act_packed(x.data(), 1, pk.view, nullptr, y.data(), detail::PackedIsa::AmxInt8);
      ADD_FAILURE() << "no throw";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("AMX-INT8"), std::string::npos) << e.what();
    }
  }
  if (!isas().empty()) {
    EXPECT_EQ(detail::q8act_packed_bytes(st8.view()), 1 * 2 * (512 + 32));  // 1 group, 2 blocks, F16 params
  } else {
    EXPECT_EQ(detail::q8act_packed_bytes(st8.view()), 0);  // the copy is only for the packed kernels
  }
}

}  // namespace
}  // namespace tinyloop::cpu
