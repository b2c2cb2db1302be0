// tinyloop::Tokenizer (include/tinyloop/tokenizer.h): byte-level BPE read from a Hugging
// Face tokenizer.json. encode = split out special tokens -> (digits isolated, when the
// pre-tokenizer says so) -> GPT-2 pre-tokenizer (api/byte_level.h) -> bytes to stand-in characters -> BPE merges by rank -> vocabulary ids;
// decode maps ids back through the vocabulary and the stand-in characters to bytes.
// Any setting that would change the result and is not implemented is refused at load.
#include "tinyloop/tokenizer.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

#include "api/byte_level.h"

namespace tinyloop {
namespace {

using api::byte_to_char;
using api::chars_to_bytes;
using api::split_gpt2_ascii;
using nlohmann::json;

[[noreturn]] void unsupported(const std::string& what) {
  throw std::invalid_argument("tokenizer: " + what +
                              " is not supported (the C++ tokenizer runs byte-level BPE only, docs/cpp-api.md)");
}

// The "type" of an optional component ("" when null or absent).
std::string component_type(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "";
  if (!j[key].is_object() || !j[key].contains("type") || !j[key]["type"].is_string())
    throw std::invalid_argument(std::string("tokenizer: '") + key + "' has no string 'type'");
  return j[key]["type"].get<std::string>();
}

bool flag(const json& obj, const char* key) {
  return obj.contains(key) && obj[key].is_boolean() && obj[key].get<bool>();
}

// The ByteLevel pre-tokenizer's settings this library implements (GPT-2's regex, no prefix space).
void check_byte_level(const json& pre) {
  if (flag(pre, "add_prefix_space")) unsupported("ByteLevel add_prefix_space=true");
  if (pre.contains("use_regex") && !flag(pre, "use_regex")) unsupported("ByteLevel use_regex=false");
}

// Checks the pipeline is one this library runs exactly. Returns whether the pre-tokenizer
// first isolates every digit: Sequence[Digits(individual_digits=true), ByteLevel], the
// "digits" tokenizer of tools/train/tokenizer.py (each digit one token, for arithmetic).
bool check_pipeline(const json& j) {
  if (component_type(j, "normalizer") != "") unsupported("normalizer " + component_type(j, "normalizer"));
  const std::string pre_type = component_type(j, "pre_tokenizer");
  bool split_digits = false;
  if (pre_type == "ByteLevel") {
    check_byte_level(j["pre_tokenizer"]);
  } else if (pre_type == "Sequence") {
    const json& seq = j["pre_tokenizer"];
    const json* steps =
        seq.contains("pretokenizers") && seq["pretokenizers"].is_array() ? &seq["pretokenizers"] : nullptr;
    const bool digits_then_bytes = steps && steps->size() == 2 && (*steps)[0].is_object() && (*steps)[1].is_object() &&
                                   (*steps)[0].value("type", "") == "Digits" &&
                                   flag((*steps)[0], "individual_digits") &&
                                   (*steps)[1].value("type", "") == "ByteLevel";
    if (!digits_then_bytes)
      unsupported("pre_tokenizer Sequence other than [Digits(individual_digits=true), ByteLevel]");
    check_byte_level((*steps)[1]);
    split_digits = true;
  } else {
    unsupported("pre_tokenizer '" + pre_type + "'");
  }
  if (component_type(j, "decoder") != "ByteLevel") unsupported("decoder '" + component_type(j, "decoder") + "'");
  // A ByteLevel post-processor only trims offsets; any other would add tokens to encode().
  const std::string post = component_type(j, "post_processor");
  if (post != "" && post != "ByteLevel") unsupported("post_processor '" + post + "'");
  if (!j.contains("model") || !j["model"].is_object()) throw std::invalid_argument("tokenizer: no 'model' object");
  const json& m = j["model"];
  if (!m.contains("type") || m["type"] != "BPE") unsupported("model type other than BPE");
  if (flag(m, "byte_fallback")) unsupported("BPE byte_fallback");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty())
      unsupported(std::string("BPE ") + key);
  if (m.contains("dropout") && !m["dropout"].is_null()) unsupported("BPE dropout");
  return split_digits;
}

int32_t checked_id(const json& v, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("tokenizer: id of " + what + " is not a non-negative 32-bit integer");
  return static_cast<int32_t>(v.get<int64_t>());
}

}  // namespace

struct Tokenizer::Impl {
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  std::unordered_map<std::string, int32_t> vocab;  // stand-in characters -> id
  std::unordered_map<std::string, int> merge_rank;  // "left right" -> rank (lower merges first)
  std::vector<std::string> id_bytes;  // [size] the bytes of each id
  std::vector<bool> id_special;  // [size]
  std::vector<Added> added;
  bool split_digits = false;  // every digit its own pre-token before GPT-2's split (check_pipeline)

  int rank(const std::string& a, const std::string& b) const {
    auto it = merge_rank.find(a + " " + b);
    return it == merge_rank.end() ? std::numeric_limits<int>::max() : it->second;
  }

  // BPE over one pre-token: start from one stand-in character per byte and repeatedly merge
  // the adjacent pair of lowest rank (leftmost on ties), as tokenizers' BPE model does.
  void bpe(std::string_view word, size_t offset, std::vector<int32_t>& out) const {
    std::vector<std::string> symbols;
    symbols.reserve(word.size());
    for (char c : word) symbols.push_back(byte_to_char()[static_cast<unsigned char>(c)]);
    while (symbols.size() > 1) {
      int best = std::numeric_limits<int>::max();
      size_t at = 0;
      for (size_t k = 0; k + 1 < symbols.size(); ++k) {
        const int r = rank(symbols[k], symbols[k + 1]);
        if (r < best) best = r, at = k;
      }
      if (best == std::numeric_limits<int>::max()) break;
      symbols[at] += symbols[at + 1];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const std::string& s : symbols) {
      auto it = vocab.find(s);
      if (it == vocab.end())
        throw std::invalid_argument("encode: the text at offset " + std::to_string(offset) +
                                    " has no token in the vocabulary");
      out.push_back(it->second);
    }
  }

  // Plain text (no special tokens): ASCII only, see the header.
  void encode_plain(std::string_view text, size_t offset, std::vector<int32_t>& out) const {
    for (size_t i = 0; i < text.size(); ++i)
      if (static_cast<unsigned char>(text[i]) >= 0x80)
        throw std::invalid_argument("encode: byte " + std::to_string(static_cast<unsigned char>(text[i])) +
                                    " at offset " + std::to_string(offset + i) +
                                    " is not ASCII; the C++ tokenizer splits ASCII text only (docs/cpp-api.md)");
    size_t pos = offset;
    auto gpt2 = [&](std::string_view run) {
      for (std::string_view piece : split_gpt2_ascii(run)) {
        bpe(piece, pos, out);
        pos += piece.size();
      }
    };
    if (!split_digits) return gpt2(text);
    // Digits(individual_digits=true) isolates each digit; GPT-2's split then runs on the text
    // between them, so " 42" becomes " ", "4", "2".
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
      if (i < text.size() && (text[i] < '0' || text[i] > '9')) continue;
      if (i > start) gpt2(text.substr(start, i - start));
      if (i < text.size()) {
        bpe(text.substr(i, 1), pos, out);
        pos += 1;
      }
      start = i + 1;
    }
  }
};

Tokenizer::Tokenizer(std::string_view tokenizer_json) : impl_(std::make_unique<Impl>()) {
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw std::invalid_argument("tokenizer: not a JSON object");
  impl_->split_digits = check_pipeline(j);
  const json& m = j["model"];
  if (!m.contains("vocab") || !m["vocab"].is_object()) throw std::invalid_argument("tokenizer: no BPE 'vocab' object");
  int64_t size = 0;
  for (const auto& [entry, v] : m["vocab"].items()) {
    const int32_t id = checked_id(v, "vocab entry '" + entry + "'");
    impl_->vocab.emplace(entry, id);
    size = std::max<int64_t>(size, int64_t(id) + 1);
  }
  if (m.contains("merges") && m["merges"].is_array()) {
    int r = 0;
    for (const json& mg : m["merges"]) {
      // Older files write "left right", newer ones ["left", "right"].
      if (mg.is_string()) impl_->merge_rank.emplace(mg.get<std::string>(), r++);
      else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
        impl_->merge_rank.emplace(mg[0].get<std::string>() + " " + mg[1].get<std::string>(), r++);
      else throw std::invalid_argument("tokenizer: merge " + std::to_string(r) + " is neither \"a b\" nor [a, b]");
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id"))
        throw std::invalid_argument("tokenizer: an added token lacks 'content' or 'id'");
      const std::string content = a["content"].get<std::string>();
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (flag(a, key)) unsupported(std::string("added token '") + content + "' with " + key);
      const int32_t id = checked_id(a["id"], "added token '" + content + "'");
      if (content.empty()) throw std::invalid_argument("tokenizer: added token " + std::to_string(id) + " is empty");
      impl_->added.push_back({content, id, flag(a, "special")});
      size = std::max<int64_t>(size, int64_t(id) + 1);
    }
  }
  impl_->id_bytes.assign(static_cast<size_t>(size), "");
  impl_->id_special.assign(static_cast<size_t>(size), false);
  for (const auto& [entry, id] : impl_->vocab)
    if (!chars_to_bytes(entry, impl_->id_bytes[id]))
      throw std::invalid_argument("tokenizer: vocab entry " + std::to_string(id) +
                                  " is not byte-level text (a character stands for no byte)");
  // Added tokens decode to their content as written, not through the stand-in characters.
  for (const Impl::Added& a : impl_->added) {
    impl_->id_bytes[a.id] = a.content;
    impl_->id_special[a.id] = a.special;
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int64_t Tokenizer::size() const { return static_cast<int64_t>(impl_->id_bytes.size()); }

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t plain_start = 0, i = 0;
  // Added tokens are cut out first (the longest one starting at the earliest offset), and
  // the text between them goes through the pre-tokenizer and BPE.
  while (i < text.size()) {
    const Impl::Added* match = nullptr;
    for (const Impl::Added& a : impl_->added)
      if (text.substr(i, a.content.size()) == a.content && (!match || a.content.size() > match->content.size()))
        match = &a;
    if (!match) {
      ++i;
      continue;
    }
    impl_->encode_plain(text.substr(plain_start, i - plain_start), plain_start, out);
    out.push_back(match->id);
    i += match->content.size();
    plain_start = i;
  }
  impl_->encode_plain(text.substr(plain_start), plain_start, out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id, bool with_special) const {
  if (id < 0 || id >= size())
    throw std::invalid_argument("token id " + std::to_string(id) + " is outside [0, " + std::to_string(size()) + ")");
  if (impl_->id_special[id] && !with_special) return "";
  return impl_->id_bytes[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool with_special) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id, with_special);
  return out;
}

}  // namespace tinyloop
