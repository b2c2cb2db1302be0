// The Python Model object: an Engine behind a lock so close() is safe from any thread.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "runtime/engine.h"

namespace tinyloop::py_bind {
namespace py = pybind11;
using runtime::Engine;

class PyModel {
 public:
  PyModel(const std::string& path, std::optional<int64_t> max_seq_len, std::optional<std::string> kv_mode,
          std::optional<std::string> quant_activations = std::nullopt, std::optional<bool> fp16_body = std::nullopt,
          bool use_mmap = true) {
    runtime::EngineOptions o;
    o.use_mmap = use_mmap;
    o.max_seq_len = max_seq_len;
    o.kv_mode = kv_mode;
    o.quant_activations = quant_activations;
    o.fp16_body = fp16_body;
    py::gil_scoped_release nogil;
    engine_ = std::make_shared<Engine>(path, o);
  }

  // The engine, or RuntimeError once closed. Calls in flight keep their own reference, so
  // close() during a call frees the model when that call returns.
  std::shared_ptr<const Engine> engine() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!engine_) throw std::runtime_error("model was closed");
    return engine_;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    engine_.reset();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !engine_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Engine> engine_;
};

using ModelClass = py::class_<PyModel, std::shared_ptr<PyModel>>;

}  // namespace tinyloop::py_bind
