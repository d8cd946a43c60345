#include "model/arch/opt.h"

#include "model/arch/fields.h"

namespace tessera::model::arch {

core::Status parse_opt_config(const json& j, ModelConfig& c) {
  constexpr int64_t kMaxDim = 1 << 16;
  TESSERA_ASSIGN_OR_RETURN(c.hidden, int_field(j, "hidden_size", 1, kMaxDim));
  TESSERA_ASSIGN_OR_RETURN(c.heads, int_field(j, "num_attention_heads", 1, 1024));
  TESSERA_ASSIGN_OR_RETURN(c.layers, int_field(j, "num_hidden_layers", 1, 1024));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "ffn_dim", 1, 1 << 20));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
  TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "max_position_embeddings", 1, 1 << 24));
  TESSERA_ASSIGN_OR_RETURN(c.embed_dim, int_field(j, "word_embed_proj_dim", 1, kMaxDim, c.hidden));
  TESSERA_ASSIGN_OR_RETURN(const bool pre, bool_field(j, "do_layer_norm_before", true));
  TESSERA_ASSIGN_OR_RETURN(const bool remove_final, bool_field(j, "_remove_final_layer_norm", false));
  c.post_layernorm = !pre;
  c.final_norm = pre && !remove_final;  // as OPTDecoder builds it
  TESSERA_ASSIGN_OR_RETURN(const bool bias, bool_field(j, "enable_bias", true));
  TESSERA_ASSIGN_OR_RETURN(const bool affine, bool_field(j, "layer_norm_elementwise_affine", true));
  if (!bias) return core::unimplemented("config.json: enable_bias false is not supported for OPT");
  if (!affine) return core::unimplemented("config.json: layer_norm_elementwise_affine false is not supported for OPT");
  const std::string act =
      j.contains("activation_function") && j["activation_function"].is_string() ? j["activation_function"].get<std::string>() : "relu";
  if (act == "relu") c.act = kernels::Activation::kRelu;
  else if (act == "gelu") c.act = kernels::Activation::kGeluErf;
  else return core::unimplemented("config.json: activation_function '" + act + "' is not supported for OPT (relu, gelu)");
  c.eps = 1e-5f;  // nn.LayerNorm's default, which OPT uses
  TESSERA_ASSIGN_OR_RETURN(c.tied_head, bool_field(j, "tie_word_embeddings", true));
  return core::ok_status();
}

}  // namespace tessera::model::arch
