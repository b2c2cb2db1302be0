// Text <-> token ids with the tokenizer a .tinyloop file carries (docs/cpp-api.md, "Text").
// Only byte-level BPE (GPT-2 style, optionally with every digit isolated first: the bundled
// demo model's kind) is supported; other tokenizers are refused when loaded rather than
// approximated.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tinyloop/export.h"

namespace tinyloop {

class TINYLOOP_API Tokenizer {
 public:
  // Parses a Hugging Face tokenizer.json. Throws std::invalid_argument naming what is
  // unsupported or malformed.
  explicit Tokenizer(std::string_view tokenizer_json);
  ~Tokenizer();
  // A moved-from Tokenizer may only be assigned to or destroyed.
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of `text`, as Hugging Face `tokenizers` gives them. Special tokens written in
  // the text (e.g. "<|endoftext|>") become their ids. Only ASCII text is accepted: the
  // pre-tokenizer's letter / number classes are implemented for ASCII, so other bytes are
  // refused (std::invalid_argument with the offset) instead of being split differently.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes the ids stand for (UTF-8 when the ids come from the model). Special tokens are
  // skipped unless with_special; an id outside the vocabulary is std::invalid_argument.
  std::string decode(const std::vector<int32_t>& ids, bool with_special = false) const;
  // The bytes of one token ("" for a special token unless with_special).
  std::string token_bytes(int32_t id, bool with_special = false) const;
  int64_t size() const;  // ids the tokenizer knows (largest id + 1)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tinyloop
