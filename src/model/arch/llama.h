// The Llama-style decoder family: LlamaForCausalLM (Llama 2/3/3.1/3.2,
// TinyLlama, SmolLM2), MistralForCausalLM, Qwen2ForCausalLM and
// Qwen3ForCausalLM. One layer: RMSNorm, attention with rotary positions
// (rotate-half layout) and grouped-query K/V heads (Qwen3: RMSNorm of each
// q and k head first), RMSNorm, a gated SiLU MLP. The differences are
// config flags (biases, q/k norms, head size, tied head, RoPE scaling).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "model/config.h"

namespace tessera::model::arch {

// Does this model_type belong to the family?
bool is_llama_type(const std::string& model_type);
// The family's config.json fields into `c` (family and model type set).
core::Status parse_llama_config(const nlohmann::json& j, const std::string& model_type, ModelConfig& c);
// RoPE frequencies for head size d: rope_theta^(-2i/d), then rope_scaling
// (none/"default", "linear", "llama3"); any other type is an error naming it.
core::Result<std::vector<float>> rope_frequencies(const nlohmann::json& j, int64_t head_dim);

}  // namespace tessera::model::arch
