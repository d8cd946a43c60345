// One inference on this device: build the model input from what the user
// gave (text, ids, image, pixels), run it, and present or dump the result.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/generate.h"
#include "model/transformer.h"

namespace tessera::runtime {

struct RunRequest {
  std::string model_dir;
  // Exactly one input kind.
  std::string text;
  std::vector<int64_t> ids;
  std::vector<int64_t> token_types;
  std::string image_path;
  std::string pixels_path;  // safetensors with `pixel_values` [1,3,H,W]
  int threads = 1;
  std::string dump_path;  // writes `logits` and `hidden.L`
  int64_t generate_tokens = 0;  // GPT-2: new tokens to generate
  model::GenerateOptions gen;
  kernels::WeightType weights = kernels::WeightType::kF32;  // --quantize
};

struct RunResult {
  model::ModelConfig config;
  std::vector<int64_t> input_ids;
  model::ForwardOutput output;
  std::vector<int64_t> generated;  // new ids only
  std::string generated_text;      // when a tokenizer is present
  double latency_ms = 0.0;         // forward (or generation), model loading excluded
};

// Parses "1,2,3" into ids; rejects anything else with a clear error.
core::Result<std::vector<int64_t>> parse_id_list(const std::string& text);

// Builds the model input from the request (tokenizes text, decodes images).
core::Result<model::ModelInput> build_input(const model::Transformer& model, const RunRequest& req);

core::Result<RunResult> run_single(const RunRequest& req);

// Writes `logits` (when present) and `hidden.L` as [1, N, F].
core::Status write_dump(const std::string& path, const RunResult& r);

std::string format_human(const RunResult& r);
nlohmann::json to_json(const RunResult& r);

}  // namespace tessera::runtime
