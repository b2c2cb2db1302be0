// The two fixed pieces of a byte-level BPE tokenizer (GPT-2; Hugging Face tokenizers'
// ByteLevel pre-tokenizer and decoder), used by src/api/tokenizer.cc:
//  - every byte has a printable stand-in character, so vocabulary entries are text;
//  - text is split into pre-tokens before BPE by the GPT-2 pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    which is implemented here for ASCII text only (letters A-Z a-z, digits 0-9, whitespace
//    \t \n \v \f \r and space); callers refuse other bytes.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace tinyloop::api {

// byte -> its stand-in character, UTF-8 encoded ([256]).
const std::array<std::string, 256>& byte_to_char();
// The bytes a vocabulary entry stands for. Returns false when `entry` holds a character that
// is no byte's stand-in (then `out` is unspecified).
bool chars_to_bytes(std::string_view entry, std::string& out);

// The pre-tokens of ASCII `text` (views into it), in order; their concatenation is `text`.
std::vector<std::string_view> split_gpt2_ascii(std::string_view text);

}  // namespace tinyloop::api
