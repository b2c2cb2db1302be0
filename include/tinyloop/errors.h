// Exception types. Frontends map them: std::invalid_argument -> ValueError,
// FormatError -> tinyloop_py.ModelFormatError (a ValueError), FileNotFound ->
// FileNotFoundError, ModelClosed and other std::runtime_error -> RuntimeError.
#pragma once
#include <stdexcept>
#include <string>

namespace tinyloop {

// A model file that is malformed: truncated, bad header, wrong sizes, bad config...
struct FormatError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// The model file path does not exist or cannot be opened.
struct FileNotFound : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tinyloop
