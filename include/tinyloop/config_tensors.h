// The tensors a config needs, in their documented order (docs/model-format.md, "Tensor
// names"): the one implementation of the naming rules, which the Python package reads
// through tinyloop_py.expected_tensors (python/tinyloop/config.py).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tinyloop/config.h"

namespace tinyloop {

using TensorShapeList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Name -> shape in order: embed, pos_emb, inject, the pre, loop and post layers (each: its
// norms, attention, value embedding, MLP; a weight before its bias), prelude_norm,
// loop_norm, post_loop_norm, post_loop_proj, final_norm, head, exit_gate. Writers keep this
// order within one element size. expected_tensor_shapes (config.h) is the same as a map.
// Throws FormatError when a shape overflows int64.
TensorShapeList expected_tensor_list(const ModelConfig& c);

}  // namespace tinyloop
