// Process-wide runtime settings of the CPU backend: the thread pool size and the kernel
// choice (SIMD or the scalar reference), plus what the dispatcher picked. Settings, not
// model state, so they live on the module (tinyloop_py.set_num_threads(n), ...).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "runtime/backend_settings.h"

namespace tinyloop::py_bind {
namespace py = pybind11;

void bind_runtime(py::module_& m, py::module_& testing) {
  m.def(
      "set_num_threads",
      [](int n) {
        py::gil_scoped_release nogil;  // waits for a kernel in flight on another thread
        runtime::set_num_threads(n);
      },
      py::arg("n"),
      "Threads the CPU kernels use, process-wide (the calling thread included). n < 1 "
      "restores the default: env TINYLOOP_NUM_THREADS, else the hardware concurrency. "
      "Calls made from several Python threads at once share the pool: a call that finds it "
      "busy runs on its own thread, so the machine is never oversubscribed by the pool.");
  m.def("get_num_threads", &runtime::num_threads, "Threads the CPU kernels use.");
  m.def("set_force_scalar", &runtime::set_force_scalar, py::arg("scalar"),
        "True: run the scalar reference kernels instead of the SIMD ones, process-wide "
        "(benchmarks, debugging; default from env TINYLOOP_FORCE_SCALAR=1).");
  m.def(
      "cpu_info",
      [] {
        py::dict d;
        const runtime::BackendInfo i = runtime::backend_info();
        d["simd_target"] = i.simd_target;
        d["compiled_targets"] = i.compiled_targets;
        d["force_scalar"] = i.force_scalar;
        d["num_threads"] = i.num_threads;
        d["q8_kernel"] = i.q8_kernel;
        d["bf16_kernel"] = i.bf16_kernel;
        d["amx"] = i.amx;
        d["amx_reason"] = i.amx_reason;
        return d;
      },
      "The CPU backend's state: the SIMD target in use (e.g. 'AVX3'), the targets compiled "
      "in, whether the scalar reference is forced, the thread count, and the kernel of "
      "quant_activations='q8' matmuls ('amx-int8', 'avx512vnni' or 'avx2': int8/int4 weights get a "
      "repacked copy at load, counted in vram_usage_mb; else 'portable-<target>'), the kernel "
      "of the bf16 loop body (fp16_body=True: 'amx', 'avx512bf16' or 'portable-<target>'), "
      "whether AMX tiles are in use and, when not, why ('no AMX on this CPU', 'disabled by "
      "TINYLOOP_DISABLE_AMX', ...).");
  testing.def(
      "machine_bounds",
      [](int threads, int64_t read_mib, int reps) {
        if (read_mib < 1 || read_mib > 65536)
          throw py::value_error("machine_bounds: read_mib must be in [1, 65536], got " + std::to_string(read_mib));
        runtime::MachineBounds b;
        {
          py::gil_scoped_release nogil;  // seconds of probing
          b = runtime::probe_machine(threads, read_mib << 20, reps);
        }
        py::dict d;
        d["threads"] = b.threads;
        d["read_gbps"] = b.read_gbps;
        d["fma_gflops"] = b.fma_gflops;
        d["simd_target"] = b.simd_target;
        return d;
      },
      py::arg("threads") = 1, py::arg("read_mib") = 1024, py::arg("reps") = 5,
      "What the machine can do at best with `threads` threads at once (bench/roofline.py): "
      "{'threads', 'read_gbps' (memory read bandwidth over a read_mib MiB buffer, best of "
      "reps), 'fma_gflops' (float32 FMA rate, on the kernels' SIMD target), 'simd_target'}. "
      "ValueError for threads outside [1, 1024], read_mib outside [1, 65536] or over half of "
      "the machine's memory, reps outside [1, 100].");
}

}  // namespace tinyloop::py_bind
