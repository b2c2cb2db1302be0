// The compute backend behind the ops, as the layers above see it. Today there is one: the CPU
// (src/cpu: Highway SIMD kernels picked at run time, a thread pool, AMX tiles and VNNI where
// the CPU has them). A second backend (a GPU) would implement this header and the dispatch of
// ops/dispatch.cc; the model, runtime and frontends would not change.
//
// The backend owns three things, and nothing above it decides them:
//   1. its process-wide settings (threads, the scalar reference, AMX, VNNI), whose defaults
//      come from the environment, read here and nowhere else;
//   2. the copies of weights it derives in the layouts its kernels read fastest, and their
//      memory (the model says which arithmetic a weight uses; the backend decides the layout);
//   3. the choice of kernel for each call.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/huge_pages.h"
#include "base/views.h"

namespace tinyloop::ops {

// Process-wide settings; an unset field leaves the current value alone. The defaults, applied
// once before the first op runs (or the first call of this header), come from the environment:
//   num_threads   TINYLOOP_NUM_THREADS=n      (else the hardware concurrency)
//   force_scalar  TINYLOOP_FORCE_SCALAR=1     (run the scalar reference kernels)
//   amx           TINYLOOP_DISABLE_AMX=1      turns AMX tiles off (they are on where present)
//   vnni          TINYLOOP_DISABLE_VNNI=1     turns the AVX512-VNNI q8 kernels off
// docs/benchmarks.md uses them for A/B runs; a variable set to "" or "0" counts as unset.
struct BackendSettings {
  std::optional<int> num_threads;  // < 1: the default above
  std::optional<bool> force_scalar;
  std::optional<bool> amx;  // only takes effect where the CPU has AMX-BF16
  std::optional<bool> vnni;  // read when the first q8 kernel runs; later changes are ignored
};

// The settings the environment asks for (fields of unset variables stay unset). A malformed
// TINYLOOP_NUM_THREADS (not a positive integer) is ignored, as an unset one.
BackendSettings backend_settings_from_env();

// Applies every field that is set. Threads: waits for a kernel in flight to finish first.
void configure_backend(const BackendSettings& s);

// What the backend runs on and picked (tinyloop_py.cpu_info()).
struct BackendInfo {
  std::string simd_target;  // the Highway target in use, e.g. "AVX3"
  std::vector<std::string> compiled_targets;  // the targets compiled in
  bool force_scalar = false;
  int num_threads = 1;
  std::string q8_kernel;  // quant_activations="q8": "amx-int8", "avx512vnni", "avx2" or "portable-<target>"
  std::string bf16_kernel;  // fp16_body: "amx", "avx512bf16" or "portable-<target>"
  bool amx = false;  // AMX tiles in use
  std::string amx_reason;  // why not, when amx is false
};
BackendInfo backend_info();

// What the machine under the backend can do at best, measured by the backend's own probes
// (cpu/machine_probe.h): the memory read bandwidth and the float32 FMA rate of `threads`
// threads at once. bench/roofline.py sets the engine's speeds beside them. Throws
// std::invalid_argument for threads outside [1, 1024], read_bytes outside [1 MiB, 64 GiB]
// or over half of the machine's memory, reps outside [1, 100].
struct MachineBounds {
  int threads = 0;
  double read_gbps = 0;  // GB/s read from memory by all threads together
  double fma_gflops = 0;  // float32 GFLOP/s of FMAs, all threads together
  std::string simd_target;  // the target the probes ran (the kernels' one)
};
MachineBounds probe_machine(int threads, int64_t read_bytes, int reps);

// Threads the kernels use, the calling thread included (>= 1); set with configure_backend.
int num_threads();

// true when int8 / int4 matmuls with q8 activations run a packed kernel (AVX512-VNNI or
// AVX2): there "q8" is the fast path, elsewhere the portable kernel is slower than "f32".
bool q8act_is_fast();

// Applies the environment's defaults if nothing has yet (idempotent, cheap after the first
// call). Every function of this header and every op does it first; ops/dispatch.cc calls
// it before asking the kernels anything the settings decide.
void ensure_backend_defaults();

// Copies of weights the backend derives at load time, in one buffer it owns (each copy 64-byte
// aligned, the buffer on huge pages: base/huge_pages.h). The views point into it, so it must
// outlive them.
struct WeightCopies {
  HugeBytes arena;  // the copies
  int64_t bytes = 0;  // their sizes summed (what the model counts in its memory)
};

// The reduced-precision loop body (fp16_body, ops/matmul_bf16dot.h): every F32 / F16 / BF16
// view in `views` gets its packed BF16 copy (WeightView::bf16dot), so its matmuls take that
// arithmetic. Other views are left alone.
WeightCopies make_bf16dot_copies(const std::vector<WeightView*>& views);

// quant_activations="q8" (ops/matmul_q8act.h): every view in `views` with q8act set that the
// q8 matmul applies to gets a copy in the layout of this CPU's packed kernel
// (WeightView::q8packed; same bits, faster), where it has one (AVX512-VNNI or AVX2); none
// elsewhere (bytes 0).
WeightCopies make_q8act_copies(const std::vector<WeightView*>& views);

}  // namespace tinyloop::ops
