#include "model/config.h"

#include <algorithm>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "core/json.h"
#include "model/arch/architecture.h"
#include "model/arch/fields.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

namespace tessera::model {

using core::Result;
using nlohmann::json;

int64_t ModelConfig::max_rows() const {
  if (images) {
    const int64_t side = image_size / patch_size;
    return side * side + 1;
  }
  return max_positions;
}

bool ModelConfig::decoupled(int64_t l) const {
  return bp_div > 0 && !std::binary_search(bp_original.begin(), bp_original.end(), l);
}

namespace {

// Integer fields within [lo, hi]; `fallback` when absent (<0: required).
using arch::int_field;

Result<std::vector<std::string>> parse_labels(const json& j) {
  std::vector<std::string> labels;
  if (j.contains("id2label") && j["id2label"].is_object()) {
    const size_t n = j["id2label"].size();
    if (n > 1000000) return core::out_of_range("config.json: too many labels");
    labels.resize(n);
    for (auto it = j["id2label"].begin(); it != j["id2label"].end(); ++it) {
      // Plain decimal only: stoul would also take " 1", "+1" or "01", so two
      // spellings could name one id and leave another empty.
      const std::string& key = it.key();
      const bool canonical = !key.empty() && key.size() <= 7 && key.find_first_not_of("0123456789") == std::string::npos &&
                             (key.size() == 1 || key[0] != '0');
      if (!canonical) return core::parse_error("config.json: id2label key '" + key.substr(0, 32) + "' is not an integer");
      const size_t id = std::stoul(key);
      if (id >= n || !it.value().is_string()) return core::parse_error("config.json: id2label is not a dense 0..n-1 map");
      labels[id] = it.value().get<std::string>();
    }
  } else if (j.contains("num_labels")) {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, int_field(j, "num_labels", 1, 1000000));
    for (int64_t i = 0; i < n; ++i) labels.push_back("LABEL_" + std::to_string(i));
  }
  return labels;
}

Result<HeadKind> parse_head(const std::string& cls, const Architecture& a, const std::string& type) {
  for (const auto& [name, head] : a.classes())
    if (cls == name) return head;
  return core::unimplemented("config.json: architecture '" + cls + "' is not supported for model_type '" + type + "'");
}

// A unit's names must fit the layer its recipe builds: the loader indexes
// them by role. A mismatch is the unit author's mistake, said at parse time.
core::Status check_unit(const Architecture& a, const ModelConfig& c) {
  const LayerNames& n = a.names().layer;
  const size_t qkv = n.conv1d ? 1 : 3, ffn_in = c.llama_style() ? 2 : 1;
  if (n.qkv_w.size() != qkv || n.qkv_b.size() != qkv || n.ffn_in_w.size() != ffn_in || n.ffn_in_b.size() != ffn_in ||
      (n.conv1d && c.llama_style()) || a.names().layers.empty())
    return core::internal_error("model family '" + a.name() + "': its tensor names do not fit its layers (" +
                                std::to_string(qkv) + " Q/K/V and " + std::to_string(ffn_in) + " FFN-input tensors expected)");
  return core::ok_status();
}

// "block_parallel": {"n_div": N, "original_layers": [...]}.
core::Status parse_block_parallel(const json& j, ModelConfig& c) {
  if (!j.contains("block_parallel") || j["block_parallel"].is_null()) return core::ok_status();
  const json& bp = j["block_parallel"];
  if (!bp.is_object()) return core::parse_error("config.json: 'block_parallel' is not an object");
  TESSERA_ASSIGN_OR_RETURN(c.bp_div, int_field(bp, "n_div", 1, 1 << 16));
  if (c.hidden % c.bp_div != 0)
    return core::invalid_argument("config.json: block_parallel n_div " + std::to_string(c.bp_div) +
                                  " does not divide the hidden size " + std::to_string(c.hidden));
  if (bp.contains("original_layers")) {
    const json& ol = bp["original_layers"];
    if (!ol.is_array() || ol.size() > 4096) return core::parse_error("config.json: block_parallel 'original_layers' is not a list");
    for (const json& v : ol) {
      if (!v.is_number_integer()) return core::parse_error("config.json: block_parallel 'original_layers' holds a non-integer");
      const int64_t l = v.get<int64_t>();
      if (l < 0 || l >= c.layers)
        return core::out_of_range("config.json: block_parallel original layer " + std::to_string(l) + " outside the model's " +
                                  std::to_string(c.layers) + " layers");
      c.bp_original.push_back(l);
    }
  }
  std::sort(c.bp_original.begin(), c.bp_original.end());
  if (std::adjacent_find(c.bp_original.begin(), c.bp_original.end()) != c.bp_original.end())
    return core::invalid_argument("config.json: block_parallel 'original_layers' lists a layer twice");
  return core::ok_status();
}

}  // namespace

Result<ModelConfig> parse_config(const std::string& text) {
  auto parsed = core::parse_json(text, "config.json");
  // Invalid documents keep the message users know; duplicates and depth say what they are.
  if (!parsed.ok() && parsed.status().message() == "config.json is not valid JSON")
    return core::parse_error("config.json is not a valid JSON object");
  if (!parsed.ok()) return parsed.status();
  json& j = *parsed;
  if (!j.is_object()) return core::parse_error("config.json is not a valid JSON object");
  try {
    if (!j.contains("model_type") || !j["model_type"].is_string()) return core::parse_error("config.json: missing 'model_type'");
    const std::string type = j["model_type"].get<std::string>();
    const Architecture* a = architecture_for(type);
    if (a == nullptr)
      return core::unimplemented("config.json: model_type '" + type + "' is not supported (" + architecture_model_types() + ")");
    ModelConfig c;
    c.family = a->name();
    c.arch = a;
    TESSERA_RETURN_IF_ERROR(a->parse(j, type, c));
    TESSERA_RETURN_IF_ERROR(check_unit(*a, c));
    if (c.explicit_head_dim == 0 && c.hidden % c.heads != 0)
      return core::invalid_argument("config.json: hidden size " + std::to_string(c.hidden) + " is not divisible by " +
                                    std::to_string(c.heads) + " heads");
    if (!(c.eps > 0.0f) || c.eps > 1.0f) return core::out_of_range("config.json: layer norm epsilon out of range");
    TESSERA_ASSIGN_OR_RETURN(c.labels, parse_labels(j));
    TESSERA_RETURN_IF_ERROR(parse_block_parallel(j, c));
    if (c.bp_div > 0 && !c.decouplable)
      return core::unimplemented("config.json: block_parallel is not defined for model_type '" + type + "'");
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
        j["architectures"][0].is_string()) {
      c.architecture = j["architectures"][0].get<std::string>();
      TESSERA_ASSIGN_OR_RETURN(c.head, parse_head(c.architecture, *a, type));
    }
    if ((c.head == HeadKind::kSequenceClassification || c.head == HeadKind::kImageClassification) && c.labels.empty())
      c.labels = {"LABEL_0", "LABEL_1"};  // HF's default num_labels
    return c;
  } catch (const json::exception& e) {
    return core::parse_error(std::string("config.json: ") + e.what());
  }
}

namespace {

// The ids of an eos_token_id field (a number or a list); `what` labels errors.
core::Status add_eos_ids(const json& j, const std::string& what, const ModelConfig& c, std::vector<int64_t>& ids) {
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return core::ok_status();
  const json list = it->is_array() ? *it : json::array({*it});
  for (const json& v : list) {
    if (!v.is_number_integer()) return core::parse_error(what + ": eos_token_id must be token ids");
    // An id outside the vocabulary never comes out of the model (tiny test
    // models keep GPT-2's 50256 over 512 tokens): nothing to stop at.
    const int64_t id = v.get<int64_t>();
    if (id >= 0 && (c.vocab <= 0 || id < c.vocab)) ids.push_back(id);
  }
  return core::ok_status();
}

}  // namespace

bool ModelConfig::ends_generation(int64_t id) const {
  return std::binary_search(eos_token_ids.begin(), eos_token_ids.end(), id);
}

Result<ModelConfig> load_config(const std::string& model_dir) {
  std::string text;
  std::optional<GgufFile> gguf;
  if (is_gguf_path(model_dir)) {  // config.json's fields from the metadata
    TESSERA_ASSIGN_OR_RETURN(gguf, GgufFile::open(model_dir));
    TESSERA_ASSIGN_OR_RETURN(text, gguf_config_json(*gguf));
  } else {
    TESSERA_ASSIGN_OR_RETURN(text, core::read_file(model_dir + "/config.json"));
  }
  TESSERA_ASSIGN_OR_RETURN(ModelConfig c, parse_config(text));
  if (gguf) TESSERA_RETURN_IF_ERROR(gguf_adjust_config(*gguf, c));  // its weight type, rope_freqs
  // Every end-of-generation id: config.json's, then generation_config.json's.
  const json cj = json::parse(text, nullptr, false);
  if (cj.is_object()) TESSERA_RETURN_IF_ERROR(add_eos_ids(cj, "config.json", c, c.eos_token_ids));
  const std::string gen_path = model_dir + "/generation_config.json";
  if (core::file_exists(gen_path)) {
    TESSERA_ASSIGN_OR_RETURN(const std::string gen_text, core::read_file(gen_path));
    TESSERA_ASSIGN_OR_RETURN(const json g, core::parse_json(gen_text, "generation_config.json"));
    if (!g.is_object()) return core::parse_error("generation_config.json: not a JSON object");
    TESSERA_RETURN_IF_ERROR(add_eos_ids(g, "generation_config.json", c, c.eos_token_ids));
  }
  std::sort(c.eos_token_ids.begin(), c.eos_token_ids.end());
  c.eos_token_ids.erase(std::unique(c.eos_token_ids.begin(), c.eos_token_ids.end()), c.eos_token_ids.end());
  return c;
}

}  // namespace tessera::model
