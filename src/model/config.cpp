#include "model/config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "core/json.h"
#include "model/arch/fields.h"
#include "model/arch/llama.h"
#include "model/arch/opt.h"

namespace tessera::model {

using core::Result;
using nlohmann::json;

const char* family_name(Family f) {
  switch (f) {
    case Family::kBert: return "bert";
    case Family::kGpt2: return "gpt2";
    case Family::kVit: return "vit";
    case Family::kLlama: return "llama";
    case Family::kOpt: return "opt";
  }
  return "?";
}

int64_t ModelConfig::max_rows() const {
  if (family == Family::kVit) {
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

Result<kernels::Activation> parse_activation(const std::string& name) {
  if (name == "gelu") return kernels::Activation::kGeluErf;
  if (name == "relu") return kernels::Activation::kRelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast")
    return kernels::Activation::kGeluTanh;
  return core::unimplemented("config.json: activation '" + name + "' is not supported (gelu, gelu_new, relu)");
}

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

Result<HeadKind> parse_head(const std::string& arch, Family family) {
  static const struct { const char* name; Family family; HeadKind head; } kArchs[] = {
      {"BertModel", Family::kBert, HeadKind::kNone},
      {"BertForSequenceClassification", Family::kBert, HeadKind::kSequenceClassification},
      {"GPT2Model", Family::kGpt2, HeadKind::kNone},
      {"GPT2LMHeadModel", Family::kGpt2, HeadKind::kLmHead},
      {"ViTModel", Family::kVit, HeadKind::kNone},
      {"ViTForImageClassification", Family::kVit, HeadKind::kImageClassification},
      {"LlamaModel", Family::kLlama, HeadKind::kNone},
      {"LlamaForCausalLM", Family::kLlama, HeadKind::kLmHead},
      {"MistralModel", Family::kLlama, HeadKind::kNone},
      {"MistralForCausalLM", Family::kLlama, HeadKind::kLmHead},
      {"Qwen2Model", Family::kLlama, HeadKind::kNone},
      {"Qwen2ForCausalLM", Family::kLlama, HeadKind::kLmHead},
      {"Qwen3Model", Family::kLlama, HeadKind::kNone},
      {"Qwen3ForCausalLM", Family::kLlama, HeadKind::kLmHead},
      {"OPTModel", Family::kOpt, HeadKind::kNone},
      {"OPTForCausalLM", Family::kOpt, HeadKind::kLmHead},
  };
  for (const auto& a : kArchs)
    if (arch == a.name && family == a.family) return a.head;
  return core::unimplemented("config.json: architecture '" + arch + "' is not supported for model_type '" +
                             family_name(family) + "'");
}

Result<ModelConfig> parse_family_fields(const json& j, ModelConfig c) {
  constexpr int64_t kMaxDim = 1 << 16;
  if (c.family == Family::kGpt2) {
    TESSERA_ASSIGN_OR_RETURN(c.hidden, int_field(j, "n_embd", 1, kMaxDim));
    TESSERA_ASSIGN_OR_RETURN(c.heads, int_field(j, "n_head", 1, 1024));
    TESSERA_ASSIGN_OR_RETURN(c.layers, int_field(j, "n_layer", 1, 1024));
    TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "n_inner", 1, 1 << 18, 4 * c.hidden));
    TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "n_positions", 1, 1 << 20));
    TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
    c.eps = j.value("layer_norm_epsilon", 1e-5f);
    TESSERA_ASSIGN_OR_RETURN(c.act, parse_activation(j.value("activation_function", std::string("gelu_new"))));
    if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_id = j["eos_token_id"].get<int64_t>();
    if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty() &&
        j["eos_token_id"][0].is_number_integer())
      c.eos_token_id = j["eos_token_id"][0].get<int64_t>();
    c.scale_attn_weights = j.value("scale_attn_weights", true);
    c.scale_attn_by_inverse_layer_idx = j.value("scale_attn_by_inverse_layer_idx", false);
    if (j.value("reorder_and_upcast_attn", false)) return core::unimplemented("config.json: reorder_and_upcast_attn is not supported");
    return c;
  }
  TESSERA_ASSIGN_OR_RETURN(c.hidden, int_field(j, "hidden_size", 1, kMaxDim));
  TESSERA_ASSIGN_OR_RETURN(c.heads, int_field(j, "num_attention_heads", 1, 1024));
  TESSERA_ASSIGN_OR_RETURN(c.layers, int_field(j, "num_hidden_layers", 1, 1024));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "intermediate_size", 1, 1 << 18));
  c.eps = j.value("layer_norm_eps", 1e-12f);
  TESSERA_ASSIGN_OR_RETURN(c.act, parse_activation(j.value("hidden_act", std::string("gelu"))));
  if (c.family == Family::kBert) {
    TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "max_position_embeddings", 1, 1 << 20));
    TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
    TESSERA_ASSIGN_OR_RETURN(c.type_vocab, int_field(j, "type_vocab_size", 1, 1 << 16, 2));
    const std::string pos = j.value("position_embedding_type", std::string("absolute"));
    if (pos != "absolute") return core::unimplemented("config.json: position_embedding_type '" + pos + "' is not supported");
    return c;
  }
  TESSERA_ASSIGN_OR_RETURN(c.image_size, int_field(j, "image_size", 1, 1 << 14));
  TESSERA_ASSIGN_OR_RETURN(c.patch_size, int_field(j, "patch_size", 1, 1 << 14));
  TESSERA_ASSIGN_OR_RETURN(c.channels, int_field(j, "num_channels", 1, 64, 3));
  c.qkv_bias = j.value("qkv_bias", true);
  if (c.image_size % c.patch_size != 0) return core::invalid_argument("config.json: image_size is not a multiple of patch_size");
  c.max_positions = c.max_rows();
  return c;
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
    ModelConfig c;
    if (type == "bert") c.family = Family::kBert;
    else if (type == "gpt2") c.family = Family::kGpt2;
    else if (type == "vit") c.family = Family::kVit;
    else if (arch::is_llama_type(type)) c.family = Family::kLlama;
    else if (type == "opt") c.family = Family::kOpt;
    else
      return core::unimplemented("config.json: model_type '" + type +
                                 "' is not supported (bert, gpt2, vit, llama, mistral, qwen2, qwen3, opt)");
    if (c.family == Family::kLlama) {
      TESSERA_RETURN_IF_ERROR(arch::parse_llama_config(j, type, c));
    } else if (c.family == Family::kOpt) {
      TESSERA_RETURN_IF_ERROR(arch::parse_opt_config(j, c));
    } else {
      TESSERA_ASSIGN_OR_RETURN(c, parse_family_fields(j, c));
    }
    if (c.explicit_head_dim == 0 && c.hidden % c.heads != 0)
      return core::invalid_argument("config.json: hidden size " + std::to_string(c.hidden) + " is not divisible by " +
                                    std::to_string(c.heads) + " heads");
    if (!(c.eps > 0.0f) || c.eps > 1.0f) return core::out_of_range("config.json: layer norm epsilon out of range");
    TESSERA_ASSIGN_OR_RETURN(c.labels, parse_labels(j));
    TESSERA_RETURN_IF_ERROR(parse_block_parallel(j, c));
    if (c.bp_div > 0 && (c.llama_style() || c.family == Family::kOpt))
      return core::unimplemented("config.json: block_parallel is for BERT and GPT-2 models, not '" + type + "'");
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
        j["architectures"][0].is_string()) {
      c.architecture = j["architectures"][0].get<std::string>();
      TESSERA_ASSIGN_OR_RETURN(c.head, parse_head(c.architecture, c.family));
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
  TESSERA_ASSIGN_OR_RETURN(std::string text, core::read_file(model_dir + "/config.json"));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig c, parse_config(text));
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
