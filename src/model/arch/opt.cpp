// OPTForCausalLM (Meta's OPT; the Galaxy paper's OPT-L and OPT-XL): GPT-2's
// layer shape with separate q/k/v projections, learned positions read at
// position + 2, ReLU, pre-LN (do_layer_norm_before) or post-LN, and
// project_in/project_out when word_embed_proj_dim differs from the hidden
// size (OPT-350m). Its layers are plain multi-head layers, so every strategy
// runs it.
#include "model/arch/architecture.h"
#include "model/arch/fields.h"

namespace tessera::model::arch {

namespace {

core::Status parse_opt(const json& j, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(common_dims(j, c.hidden, c.heads, c.layers));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "ffn_dim", 1, 1 << 20));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
  TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "max_position_embeddings", 1, 1 << 24));
  TESSERA_ASSIGN_OR_RETURN(c.embed_dim, int_field(j, "word_embed_proj_dim", 1, 1 << 16, c.hidden));
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
  c.causal_attention = c.learned_positions = true;
  c.position_offset = 2;  // fairseq's padding offset: the table starts 2 rows in
  return core::ok_status();
}

class Opt final : public Architecture {
 public:
  std::string name() const override { return "opt"; }
  std::vector<std::string> model_types() const override { return {"opt"}; }
  std::vector<std::pair<std::string, HeadKind>> classes() const override {
    return {{"OPTModel", HeadKind::kNone}, {"OPTForCausalLM", HeadKind::kLmHead}};
  }
  core::Status parse(const json& j, const std::string&, ModelConfig& c) const override { return parse_opt(j, c); }
  const TensorNames& names() const override {
    static const TensorNames n = [] {
      TensorNames t;
      t.wrapper = "model.";
      t.layers = "decoder.layers.";
      LayerNames& l = t.layer;
      for (const char* x : {"q_proj", "k_proj", "v_proj"}) {
        l.qkv_w.push_back(std::string("self_attn.") + x + ".weight");
        l.qkv_b.push_back(std::string("self_attn.") + x + ".bias");
      }
      l.attn_out_w = "self_attn.out_proj.weight";
      l.attn_out_b = "self_attn.out_proj.bias";
      l.ffn_in_w = {"fc1.weight"};
      l.ffn_in_b = {"fc1.bias"};
      l.ffn_out_w = "fc2.weight";
      l.ffn_out_b = "fc2.bias";
      l.ln1_g = "self_attn_layer_norm.weight";  // before attention (pre-LN) or after it (post-LN)
      l.ln1_b = "self_attn_layer_norm.bias";
      l.ln2_g = "final_layer_norm.weight";
      l.ln2_b = "final_layer_norm.bias";
      t.base.word = "decoder.embed_tokens.weight";
      t.base.pos = "decoder.embed_positions.weight";
      t.base.final_ln_g = "decoder.final_layer_norm.weight";
      t.base.final_ln_b = "decoder.final_layer_norm.bias";
      t.base.project_in = "decoder.project_in.weight";
      t.base.project_out = "decoder.project_out.weight";
      return t;
    }();
    return n;
  }
};

}  // namespace

std::shared_ptr<const Architecture> make_opt_architecture() { return std::make_shared<Opt>(); }

}  // namespace tessera::model::arch
