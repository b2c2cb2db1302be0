// libFuzzer: parse_config on arbitrary text (the config JSON of a model file). Every input
// must end in a FormatError or parse; a parsed config must round-trip through
// config_to_json unchanged, and (when its layer count is small) give its tensor list.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tinyloop/config.h"
#include "tinyloop/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tinyloop::ModelConfig c;
  try {
    c = tinyloop::parse_config(text);
  } catch (const tinyloop::FormatError&) {
    return 0;
  }
  const std::string once = tinyloop::config_to_json(c);
  const std::string twice = tinyloop::config_to_json(tinyloop::parse_config(once));
  if (once != twice) std::abort();  // the round trip must be exact
  // The model file refuses layer counts its tensors cannot hold before building this map.
  if (c.n_pre_blocks + c.n_loop_layers + c.n_post_blocks <= 64) {
    try {
      (void)tinyloop::expected_tensor_shapes(c);
    } catch (const tinyloop::FormatError&) {}
  }
  return 0;
}
