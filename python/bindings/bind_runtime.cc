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

void bind_runtime(py::module_& m) {
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
}

}  // namespace tinyloop::py_bind
