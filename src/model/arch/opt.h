// OPTForCausalLM (Meta's OPT; the Galaxy paper's OPT-L and OPT-XL): GPT-2's
// layer shape with separate q/k/v projections, learned positions read at
// position + 2, ReLU, pre-LN (do_layer_norm_before) or post-LN, and
// project_in/project_out when word_embed_proj_dim differs from the hidden
// size (OPT-350m). Its layers are plain multi-head layers, so every strategy
// runs it.
#pragma once

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"

namespace tessera::model::arch {

// OPT's learned position table starts 2 rows in (fairseq's padding offset).
constexpr int64_t kOptPositionOffset = 2;

core::Status parse_opt_config(const nlohmann::json& j, ModelConfig& c);

}  // namespace tessera::model::arch
