// BERT (BertModel, BertForSequenceClassification): post-LN encoder layers,
// word + position + token-type embeddings with a LayerNorm, and a
// classifier over the tanh pooler of the [CLS] row.
#include "model/arch/architecture.h"
#include "model/arch/fields.h"

namespace tessera::model::arch {
namespace {

class Bert final : public Architecture {
 public:
  std::string name() const override { return "bert"; }
  std::vector<std::string> model_types() const override { return {"bert"}; }
  std::vector<std::pair<std::string, HeadKind>> classes() const override {
    return {{"BertModel", HeadKind::kNone}, {"BertForSequenceClassification", HeadKind::kSequenceClassification}};
  }
  core::Status parse(const json& j, const std::string&, ModelConfig& c) const override {
    TESSERA_RETURN_IF_ERROR(parse_encoder_fields(j, c));
    TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "max_position_embeddings", 1, 1 << 20));
    TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab_size", 1, 1 << 24));
    TESSERA_ASSIGN_OR_RETURN(c.type_vocab, int_field(j, "type_vocab_size", 1, 1 << 16, 2));
    TESSERA_ASSIGN_OR_RETURN(const std::string pos, string_field(j, "position_embedding_type", "absolute"));
    if (pos != "absolute") return core::unimplemented("config.json: position_embedding_type '" + pos + "' is not supported");
    c.learned_positions = c.embed_norm = c.pooled_head = c.post_layernorm = c.decouplable = true;
    return core::ok_status();
  }
  const TensorNames& names() const override {
    static const TensorNames n = [] {
      TensorNames t;
      t.wrapper = "bert.";
      t.layers = "encoder.layer.";
      t.layer = encoder_layer_names("attention.self.", "attention.output.LayerNorm", "output.LayerNorm");
      t.base.word = "embeddings.word_embeddings.weight";
      t.base.pos = "embeddings.position_embeddings.weight";
      t.base.type = "embeddings.token_type_embeddings.weight";
      t.base.emb_ln_g = "embeddings.LayerNorm.weight";
      t.base.emb_ln_b = "embeddings.LayerNorm.bias";
      return t;
    }();
    return n;
  }
};

}  // namespace

std::shared_ptr<const Architecture> make_bert_architecture() { return std::make_shared<Bert>(); }

}  // namespace tessera::model::arch
