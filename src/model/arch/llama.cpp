// The Llama-style decoder family: LlamaForCausalLM (Llama 2/3/3.1/3.2,
// TinyLlama, SmolLM2), MistralForCausalLM, Qwen2ForCausalLM and
// Qwen3ForCausalLM. One layer: RMSNorm, attention with rotary positions
// (rotate-half layout) and grouped-query K/V heads (Qwen3: RMSNorm of each
// q and k head first), RMSNorm, a gated SiLU MLP. The differences are
// config flags (biases, q/k norms, head size, tied head, RoPE scaling).
#include <cmath>

#include "model/arch/architecture.h"
#include "model/arch/fields.h"

namespace tessera::model::arch {

namespace {

// RoPE frequencies for head size d: rope_theta^(-2i/d), then rope_scaling
// (none/"default", "linear", "llama3"); any other type is an error naming it.
core::Result<std::vector<float>> rope_frequencies(const json& j, int64_t d) {
  if (d % 2 != 0) return core::invalid_argument("config.json: head_dim " + std::to_string(d) + " is odd; RoPE needs pairs");
  // transformers 5 writes theta and scaling in one "rope_parameters" object
  // (and neither top-level key); 4 wrote "rope_theta" and "rope_scaling".
  const json* params = nullptr;
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    if (!j["rope_parameters"].is_object()) return core::parse_error("config.json: 'rope_parameters' is not an object");
    params = &j["rope_parameters"];
    for (const auto& [key, v] : params->items())
      if (v.is_object())  // one per layer type ("full_attention", "sliding_attention")
        return core::unimplemented("config.json: rope_parameters per layer type ('" + key.substr(0, 32) + "') are not supported");
  }
  for (const json* o : {&j, params}) {
    if (o == nullptr || !o->contains("partial_rotary_factor") || (*o)["partial_rotary_factor"].is_null()) continue;
    TESSERA_ASSIGN_OR_RETURN(const double part, number_field(*o, "partial_rotary_factor", 0.0, 1.0, 1.0));
    if (part != 1.0) return core::unimplemented("config.json: partial_rotary_factor " + std::to_string(part) + " is not supported (1)");
  }
  const json& theta_from = params != nullptr && params->contains("rope_theta") ? *params : j;
  TESSERA_ASSIGN_OR_RETURN(const double theta, number_field(theta_from, "rope_theta", 1.0, 1e12, 10000.0));
  // As Hugging Face forms them: fp32 exponents 2i/d, then 1 / theta^e.
  std::vector<float> f(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(d);
    f[static_cast<size_t>(i)] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(e)));
  }
  if (params == nullptr && (!j.contains("rope_scaling") || j["rope_scaling"].is_null())) return f;
  const json& s = params != nullptr ? *params : j["rope_scaling"];
  if (!s.is_object()) return core::parse_error("config.json: 'rope_scaling' is not an object");
  std::string type;
  for (const char* key : {"rope_type", "type"})
    if (s.contains(key) && s[key].is_string()) {
      type = s[key].get<std::string>();
      break;
    }
  if (type.empty() || type == "default") return f;
  TESSERA_ASSIGN_OR_RETURN(const double factor, number_field(s, "factor", 1e-6, 1e6, -1.0));
  if (factor <= 0) return core::parse_error("config.json: rope_scaling '" + type + "' needs a 'factor'");
  if (type == "linear") {  // positions divided by the factor: the same as frequencies
    for (float& x : f) x = static_cast<float>(x / factor);
    return f;
  }
  if (type != "llama3")
    return core::unimplemented("config.json: rope_scaling type '" + type + "' is not supported (linear, llama3)");
  // Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a
  // smooth blend between (transformers' _compute_llama3_parameters).
  TESSERA_ASSIGN_OR_RETURN(const double low, number_field(s, "low_freq_factor", 1e-6, 1e6, 1.0));
  TESSERA_ASSIGN_OR_RETURN(const double high, number_field(s, "high_freq_factor", 1e-6, 1e6, 4.0));
  TESSERA_ASSIGN_OR_RETURN(const int64_t old_ctx, int_field(s, "original_max_position_embeddings", 1, 1 << 24, 8192));
  if (!(high > low)) return core::invalid_argument("config.json: rope_scaling high_freq_factor must exceed low_freq_factor");
  const double low_wavelen = static_cast<double>(old_ctx) / low, high_wavelen = static_cast<double>(old_ctx) / high;
  for (float& x : f) {
    const double wavelen = 2 * M_PI / x;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      x = static_cast<float>(x / factor);
      continue;
    }
    const double smooth = (static_cast<double>(old_ctx) / wavelen - low) / (high - low);
    x = static_cast<float>((1 - smooth) * x / factor + smooth * x);
  }
  return f;
}

core::Status parse_llama(const json& j, const std::string& type, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(common_dims(j, c.hidden, c.heads, c.layers));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "intermediate_size", 1, 1 << 20));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
  TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "max_position_embeddings", 1, 1 << 24));
  TESSERA_ASSIGN_OR_RETURN(c.kv_heads, int_field(j, "num_key_value_heads", 1, 1024, c.heads));
  if (c.heads % c.kv_heads != 0)
    return core::invalid_argument("config.json: num_attention_heads " + std::to_string(c.heads) +
                                  " is not a multiple of num_key_value_heads " + std::to_string(c.kv_heads));
  TESSERA_ASSIGN_OR_RETURN(c.explicit_head_dim, int_field(j, "head_dim", 1, 4096, 0));
  if (c.explicit_head_dim == 0 && c.hidden % c.heads != 0)
    return core::invalid_argument("config.json: hidden_size " + std::to_string(c.hidden) + " is not divisible by " +
                                  std::to_string(c.heads) + " heads and there is no head_dim");
  TESSERA_ASSIGN_OR_RETURN(const double eps, number_field(j, "rms_norm_eps", 1e-12, 1.0, 1e-6));
  c.eps = static_cast<float>(eps);
  const std::string act = j.contains("hidden_act") && j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : "silu";
  if (act != "silu" && act != "swish") return core::unimplemented("config.json: hidden_act '" + act + "' is not supported (silu)");
  TESSERA_ASSIGN_OR_RETURN(c.rope_inv_freq, rope_frequencies(j, c.head_dim()));
  TESSERA_ASSIGN_OR_RETURN(c.tied_head, bool_field(j, "tie_word_embeddings", false));
  TESSERA_ASSIGN_OR_RETURN(c.mlp_bias, bool_field(j, "mlp_bias", false));
  TESSERA_ASSIGN_OR_RETURN(const bool attention_bias, bool_field(j, "attention_bias", false));
  // Qwen2 always has q/k/v biases and none on o_proj; Llama's and Qwen3's
  // attention_bias covers all four; Mistral has none, whatever it says.
  c.attention_bias = type == "qwen2" || (type != "mistral" && attention_bias);
  c.o_bias = (type == "llama" || type == "qwen3") && attention_bias;
  c.qk_norm = type == "qwen3";
  // A sliding window is a mask this family does not build: sequences longer
  // than the window are refused (Transformer::validate_input).
  bool sliding = type == "mistral";
  if (type == "qwen2" || type == "qwen3") {
    TESSERA_ASSIGN_OR_RETURN(sliding, bool_field(j, "use_sliding_window", false));
  }
  if (sliding && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    TESSERA_ASSIGN_OR_RETURN(c.sliding_window, int_field(j, "sliding_window", 1, 1 << 24));
  } else if (type == "mistral" && !j.contains("sliding_window")) {
    c.sliding_window = 4096;  // MistralConfig's default; only null means none
  }
  c.act = kernels::Activation::kNone;  // the gate's SiLU is swiglu_f32's
  c.causal_attention = c.llama_layers = c.final_norm = true;
  return core::ok_status();
}

class Llama final : public Architecture {
 public:
  std::string name() const override { return "llama"; }
  std::vector<std::string> model_types() const override { return {"llama", "mistral", "qwen2", "qwen3"}; }
  std::vector<std::pair<std::string, HeadKind>> classes() const override {
    std::vector<std::pair<std::string, HeadKind>> out;
    for (const char* f : {"Llama", "Mistral", "Qwen2", "Qwen3"}) {
      out.push_back({std::string(f) + "Model", HeadKind::kNone});
      out.push_back({std::string(f) + "ForCausalLM", HeadKind::kLmHead});
    }
    return out;
  }
  core::Status parse(const json& j, const std::string& type, ModelConfig& c) const override { return parse_llama(j, type, c); }
  const TensorNames& names() const override {
    static const TensorNames n = [] {
      TensorNames t;
      t.wrapper = "model.";
      t.layers = "layers.";
      LayerNames& l = t.layer;
      for (const char* x : {"q_proj", "k_proj", "v_proj"}) {
        l.qkv_w.push_back(std::string("self_attn.") + x + ".weight");
        l.qkv_b.push_back(std::string("self_attn.") + x + ".bias");
      }
      l.attn_out_w = "self_attn.o_proj.weight";
      l.attn_out_b = "self_attn.o_proj.bias";
      l.ffn_in_w = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
      l.ffn_in_b = {"mlp.gate_proj.bias", "mlp.up_proj.bias"};
      l.ffn_out_w = "mlp.down_proj.weight";
      l.ffn_out_b = "mlp.down_proj.bias";
      l.ln1_g = "input_layernorm.weight";
      l.ln2_g = "post_attention_layernorm.weight";
      l.q_norm = "self_attn.q_norm.weight";
      l.k_norm = "self_attn.k_norm.weight";
      t.base.word = "embed_tokens.weight";
      t.base.final_ln_g = "norm.weight";
      return t;
    }();
    return n;
  }
};

}  // namespace

std::shared_ptr<const Architecture> make_llama_architecture() { return std::make_shared<Llama>(); }

}  // namespace tessera::model::arch
