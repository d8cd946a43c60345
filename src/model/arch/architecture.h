// A model family as a unit: one file under model/arch/ that reads its
// config.json into ModelConfig's recipe (which shared blocks its embedding,
// layers and head are built from, and their shapes) and names its tensors,
// plus one line in registry.cpp. Nothing outside model/arch/ asks which
// family a model is: the loader, the forward pass, the strategies, the cost
// model and the CLI read the recipe. docs/architecture.md, "How to add a
// model family", walks through one.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace tessera::model {

// Hugging Face names of one layer's tensors ("{layers}{l}.{leaf}"), by role.
struct LayerNames {
  bool conv1d = false;  // GPT-2: Conv1D matrices [in, out], Q|K|V fused in one
  std::vector<std::string> qkv_w, qkv_b;        // one fused tensor, or query, key, value
  std::string attn_out_w, attn_out_b;
  std::vector<std::string> ffn_in_w, ffn_in_b;  // one matrix, or gate and up (stacked in that order)
  std::string ffn_out_w, ffn_out_b;
  std::string ln1_g, ln1_b, ln2_g, ln2_b;       // _b empty under RMSNorm
  std::string q_norm, k_norm;                   // per-head q/k RMSNorm (Qwen3)
};

// Names of the tensors around the layers; an empty name: the family has none.
struct BaseNames {
  std::string word, pos, type, emb_ln_g, emb_ln_b;  // token, position, token-type embeddings and their norm
  std::string cls, patch_w, patch_b;                // image input: class token, patch projection
  std::string final_ln_g, final_ln_b;
  std::string project_in, project_out;
  std::string pooler_w = "pooler.dense.weight", pooler_b = "pooler.dense.bias";
  std::string lm_head = "lm_head.weight", classifier_w = "classifier.weight", classifier_b = "classifier.bias";
};

struct TensorNames {
  // What a checkpoint with a head puts before the base model's names
  // ("transformer.", "model."); a bare base model has no prefix.
  std::string wrapper;
  std::string layers;  // layer l's tensors are "{layers}{l}.{leaf}"
  LayerNames layer;
  BaseNames base;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  // The family's name ("gpt2"), shown by `info`, `bench` and `--stats`.
  virtual std::string name() const = 0;
  // config.json model_type values the unit reads ("llama", "mistral", ...).
  virtual std::vector<std::string> model_types() const = 0;
  // config.json "architectures" classes and the head each has.
  virtual std::vector<std::pair<std::string, HeadKind>> classes() const = 0;
  // Reads config.json into `c` (family, arch and model_type already set):
  // dimensions, checked, and the recipe flags. Errors name the field.
  [[nodiscard]] virtual core::Status parse(const nlohmann::json& j, const std::string& model_type, ModelConfig& c) const = 0;
  virtual const TensorNames& names() const = 0;
};

// The registry (registry.cpp lists the built-in families). A family
// registered later with a model_type already taken replaces that entry.
void register_architecture(std::shared_ptr<const Architecture> a);
const Architecture* architecture_for(const std::string& model_type);
std::string architecture_model_types();  // "bert, gpt2, ..." for messages

namespace arch {
// BERT's and ViT's layer: query/key/value under `self`, two post-attention
// dense layers, norms named `ln1` and `ln2`.
LayerNames encoder_layer_names(const std::string& self, const std::string& ln1, const std::string& ln2);
// BERT's and ViT's shared fields: the three dimensions, intermediate_size,
// layer_norm_eps and hidden_act.
core::Status parse_encoder_fields(const nlohmann::json& j, ModelConfig& c);
}  // namespace arch

}  // namespace tessera::model
