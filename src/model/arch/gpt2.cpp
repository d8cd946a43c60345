// GPT-2 (GPT2Model, GPT2LMHeadModel): pre-LN decoder layers with Conv1D
// matrices ([in, out], Q|K|V fused), learned positions, a final LayerNorm
// and an LM head tied to the token embeddings.
#include "model/arch/architecture.h"
#include "model/arch/fields.h"

namespace tessera::model::arch {
namespace {

class Gpt2 final : public Architecture {
 public:
  std::string name() const override { return "gpt2"; }
  std::vector<std::string> model_types() const override { return {"gpt2"}; }
  std::vector<std::pair<std::string, HeadKind>> classes() const override {
    return {{"GPT2Model", HeadKind::kNone}, {"GPT2LMHeadModel", HeadKind::kLmHead}};
  }
  core::Status parse(const json& j, const std::string&, ModelConfig& c) const override {
    TESSERA_ASSIGN_OR_RETURN(c.hidden, int_field(j, "n_embd", 1, 1 << 16));
    TESSERA_ASSIGN_OR_RETURN(c.heads, int_field(j, "n_head", 1, 1024));
    TESSERA_ASSIGN_OR_RETURN(c.layers, int_field(j, "n_layer", 1, 1024));
    TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "n_inner", 1, 1 << 18, 4 * c.hidden));
    TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "n_positions", 1, 1 << 20));
    TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
    c.eps = j.value("layer_norm_epsilon", 1e-5f);
    TESSERA_ASSIGN_OR_RETURN(const std::string act, string_field(j, "activation_function", "gelu_new"));
    TESSERA_ASSIGN_OR_RETURN(c.act, parse_activation(act));
    if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_id = j["eos_token_id"].get<int64_t>();
    if (j.contains("eos_token_id") && j["eos_token_id"].is_array() && !j["eos_token_id"].empty() &&
        j["eos_token_id"][0].is_number_integer())
      c.eos_token_id = j["eos_token_id"][0].get<int64_t>();
    TESSERA_ASSIGN_OR_RETURN(c.scale_attn_weights, bool_field(j, "scale_attn_weights", true));
    TESSERA_ASSIGN_OR_RETURN(c.scale_attn_by_inverse_layer_idx, bool_field(j, "scale_attn_by_inverse_layer_idx", false));
    TESSERA_ASSIGN_OR_RETURN(const bool reorder, bool_field(j, "reorder_and_upcast_attn", false));
    if (reorder) return core::unimplemented("config.json: reorder_and_upcast_attn is not supported");
    // Hugging Face always ties GPT-2's head; a checkpoint that stores
    // lm_head.weight anyway is read from it.
    c.causal_attention = c.learned_positions = c.final_norm = c.tied_head = c.decouplable = true;
    return core::ok_status();
  }
  const TensorNames& names() const override {
    static const TensorNames n = [] {
      TensorNames t;
      t.wrapper = "transformer.";
      t.layers = "h.";
      LayerNames& l = t.layer;
      l.conv1d = true;
      l.qkv_w = {"attn.c_attn.weight"};
      l.qkv_b = {"attn.c_attn.bias"};
      l.attn_out_w = "attn.c_proj.weight";
      l.attn_out_b = "attn.c_proj.bias";
      l.ffn_in_w = {"mlp.c_fc.weight"};
      l.ffn_in_b = {"mlp.c_fc.bias"};
      l.ffn_out_w = "mlp.c_proj.weight";
      l.ffn_out_b = "mlp.c_proj.bias";
      l.ln1_g = "ln_1.weight";
      l.ln1_b = "ln_1.bias";
      l.ln2_g = "ln_2.weight";
      l.ln2_b = "ln_2.bias";
      t.base.word = "wte.weight";
      t.base.pos = "wpe.weight";
      t.base.final_ln_g = "ln_f.weight";
      t.base.final_ln_b = "ln_f.bias";
      return t;
    }();
    return n;
  }
};

}  // namespace

std::shared_ptr<const Architecture> make_gpt2_architecture() { return std::make_shared<Gpt2>(); }

}  // namespace tessera::model::arch
