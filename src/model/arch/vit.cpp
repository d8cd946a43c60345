// ViT (ViTModel, ViTForImageClassification): an image cut into patches,
// projected, after a class token, with learned positions; pre-LN encoder
// layers; a LayerNorm and a classifier on the class row.
#include "model/arch/architecture.h"
#include "model/arch/fields.h"

namespace tessera::model::arch {
namespace {

class Vit final : public Architecture {
 public:
  std::string name() const override { return "vit"; }
  std::vector<std::string> model_types() const override { return {"vit"}; }
  std::vector<std::pair<std::string, HeadKind>> classes() const override {
    return {{"ViTModel", HeadKind::kNone}, {"ViTForImageClassification", HeadKind::kImageClassification}};
  }
  core::Status parse(const json& j, const std::string&, ModelConfig& c) const override {
    TESSERA_RETURN_IF_ERROR(parse_encoder_fields(j, c));
    TESSERA_ASSIGN_OR_RETURN(c.image_size, int_field(j, "image_size", 1, 1 << 14));
    TESSERA_ASSIGN_OR_RETURN(c.patch_size, int_field(j, "patch_size", 1, 1 << 14));
    TESSERA_ASSIGN_OR_RETURN(c.channels, int_field(j, "num_channels", 1, 64, 3));
    TESSERA_ASSIGN_OR_RETURN(c.qkv_bias, bool_field(j, "qkv_bias", true));
    if (c.image_size % c.patch_size != 0) return core::invalid_argument("config.json: image_size is not a multiple of patch_size");
    c.images = c.final_norm = c.decouplable = true;
    c.max_positions = c.max_rows();
    return core::ok_status();
  }
  const TensorNames& names() const override {
    static const TensorNames n = [] {
      TensorNames t;
      t.wrapper = "vit.";
      t.layers = "encoder.layer.";
      t.layer = encoder_layer_names("attention.attention.", "layernorm_before", "layernorm_after");
      t.base.cls = "embeddings.cls_token";
      t.base.pos = "embeddings.position_embeddings";
      t.base.patch_w = "embeddings.patch_embeddings.projection.weight";
      t.base.patch_b = "embeddings.patch_embeddings.projection.bias";
      t.base.final_ln_g = "layernorm.weight";
      t.base.final_ln_b = "layernorm.bias";
      return t;
    }();
    return n;
  }
};

}  // namespace

std::shared_ptr<const Architecture> make_vit_architecture() { return std::make_shared<Vit>(); }

}  // namespace tessera::model::arch
