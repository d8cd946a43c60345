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
  std::string preset;  // gen_model_presets(): bert-base, ..., gpt2, ..., vit-base, llama-3.2-1b, qwen3-0.6b, ...
  std::string out_dir;
  // Overrides (0: keep the preset's value).
  int64_t layers = 0, hidden = 0, heads = 0, vocab = 0, intermediate = 0, labels = 0;
  int64_t kv_heads = 0, head_dim = 0;  // Llama-style presets
  // A real tokenizer's folder: its tokenizer.json and tokenizer_config.json
  // are copied and the vocabulary is sized to it (the --vocab override is
  // then an error).
  std::string tokenizer_dir;
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
