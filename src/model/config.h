// Hugging Face config.json for the three supported families, validated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/elementwise.h"

namespace tessera::model {

enum class Family { kBert, kGpt2, kVit };
enum class HeadKind { kNone, kSequenceClassification, kLmHead, kImageClassification };

const char* family_name(Family f);

struct ModelConfig {
  Family family = Family::kBert;
  std::string architecture;  // e.g. "BertForSequenceClassification"
  HeadKind head = HeadKind::kNone;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t layers = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;          // text models
  int64_t max_positions = 0;  // text models: longest sequence
  int64_t type_vocab = 0;     // BERT
  float eps = 1e-12f;
  kernels::Activation act = kernels::Activation::kGeluErf;
  std::vector<std::string> labels;  // id2label, in id order
  // ViT
  int64_t image_size = 0, patch_size = 0, channels = 3;
  bool qkv_bias = true;
  // GPT-2
  int64_t eos_token_id = -1;
  // Every id that ends a generation: config.json's eos_token_id (a number or
  // a list) and generation_config.json's, ids outside the vocabulary left
  // out; sorted (load_config).
  std::vector<int64_t> eos_token_ids;
  bool ends_generation(int64_t id) const;
  bool scale_attn_weights = true;
  bool scale_attn_by_inverse_layer_idx = false;
  // DeTransformer decoupled model ("block_parallel" in config.json): every
  // layer not in bp_original is bp_div sub-blocks, sub-block i reading and
  // writing residual features [i*h/N, (i+1)*h/N). bp_div = 0: ordinary model.
  int64_t bp_div = 0;
  std::vector<int64_t> bp_original;  // sorted, distinct

  int64_t head_dim() const { return hidden / heads; }
  int64_t num_labels() const { return static_cast<int64_t>(labels.size()); }
  // Longest input the model accepts, in rows (ViT: patches + CLS).
  int64_t max_rows() const;
  bool causal() const { return family == Family::kGpt2; }
  bool pre_layernorm() const { return family != Family::kBert; }
  bool decoupled(int64_t l) const;          // layer l is sub-blocks
  int64_t block_width() const { return bp_div > 0 ? hidden / bp_div : hidden; }  // h/N
};

core::Result<ModelConfig> parse_config(const std::string& json_text);
core::Result<ModelConfig> load_config(const std::string& model_dir);

}  // namespace tessera::model
