// Writes Hugging Face model folders with seeded random weights, so that
// benchmarks and demos run with no download.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace tessera::model {

struct GenModelOptions {
  std::string preset;  // bert-base, bert-large, distilbert, gpt2, gpt2-medium, gpt2-large, vit-base
  std::string out_dir;
  // Overrides (0: keep the preset's value).
  int64_t layers = 0, hidden = 0, heads = 0, vocab = 0, intermediate = 0, labels = 0;
  uint64_t seed = 0;
  // A DeTransformer decoupled model: N sub-blocks per layer except the
  // original layers (0: an ordinary model).
  int64_t bp_div = 0;
  std::vector<int64_t> bp_original;
};

std::vector<std::string> gen_model_presets();
// The config a preset with overrides describes (validated).
core::Result<nlohmann::json> gen_model_config(const GenModelOptions& opts);
// config.json, model.safetensors and (text models) a tokenizer.json.
core::Status gen_model(const GenModelOptions& opts);

}  // namespace tessera::model
