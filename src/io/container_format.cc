// include/tinyloop/container_format.h as JSON, so the Python writer and reader take the
// container's constants from the same declaration as the C++ reader.
#include "tinyloop/container_format.h"

#include <nlohmann/json.hpp>

namespace tinyloop {

std::string container_format_json() {
  nlohmann::ordered_json j;
  j["header_len_bytes"] = kHeaderLenBytes;
  j["data_alignment"] = kDataAlignment;
  j["metadata_key"] = kMetadataKey;
  j["format_name"] = kFormatName;
  j["metadata_keys"] = {{"format", kMetaFormat},
                        {"format_version", kMetaFormatVersion},
                        {"config", kMetaConfig},
                        {"tokenizer", kMetaTokenizer},
                        {"chat_template", kMetaChatTemplate}};
  j["format_version_float"] = kFormatVersionFloat;
  j["format_version_quant"] = kFormatVersionQuant;
  j["format_versions"] = nlohmann::ordered_json::array();
  for (const char* v : kFormatVersions) j["format_versions"].push_back(v);
  nlohmann::ordered_json dtypes = nlohmann::ordered_json::object();
  for (const auto& d : kDTypes) {
    const char* use = d.use == DTypeUse::Float ? "float" : d.use == DTypeUse::Quantized ? "quantized" : "unsupported";
    dtypes[d.name] = {{"size", d.size}, {"use", use}, {"scale", d.scale}};
  }
  j["dtypes"] = dtypes;
  return j.dump();
}

}  // namespace tinyloop
