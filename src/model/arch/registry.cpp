// The built-in model families. Adding one: a file under model/arch/ defining
// make_<name>_architecture(), and its name in this list.
#include <algorithm>
#include <mutex>

#include "model/arch/architecture.h"
#include "model/arch/fields.h"

#define TESSERA_FAMILIES(X) X(bert) X(gpt2) X(vit) X(llama) X(opt)

namespace tessera::model {

namespace arch {
#define TESSERA_DECLARE(name) std::shared_ptr<const Architecture> make_##name##_architecture();
TESSERA_FAMILIES(TESSERA_DECLARE)
#undef TESSERA_DECLARE

LayerNames encoder_layer_names(const std::string& self, const std::string& ln1, const std::string& ln2) {
  LayerNames n;
  for (const char* x : {"query", "key", "value"}) {
    n.qkv_w.push_back(self + x + ".weight");
    n.qkv_b.push_back(self + x + ".bias");
  }
  n.attn_out_w = "attention.output.dense.weight";
  n.attn_out_b = "attention.output.dense.bias";
  n.ffn_in_w = {"intermediate.dense.weight"};
  n.ffn_in_b = {"intermediate.dense.bias"};
  n.ffn_out_w = "output.dense.weight";
  n.ffn_out_b = "output.dense.bias";
  n.ln1_g = ln1 + ".weight";
  n.ln1_b = ln1 + ".bias";
  n.ln2_g = ln2 + ".weight";
  n.ln2_b = ln2 + ".bias";
  return n;
}
core::Status parse_encoder_fields(const nlohmann::json& j, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(common_dims(j, c.hidden, c.heads, c.layers));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "intermediate_size", 1, 1 << 18));
  c.eps = j.value("layer_norm_eps", 1e-12f);
  TESSERA_ASSIGN_OR_RETURN(const std::string act, string_field(j, "hidden_act", "gelu"));
  TESSERA_ASSIGN_OR_RETURN(c.act, parse_activation(act));
  return core::ok_status();
}
}  // namespace arch

namespace {

struct Registry {
  std::mutex mu;
  // Units stay alive for the process: configs point at them.
  std::vector<std::shared_ptr<const Architecture>> all;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
#define TESSERA_ADD(name) reg->all.push_back(arch::make_##name##_architecture());
    TESSERA_FAMILIES(TESSERA_ADD)
#undef TESSERA_ADD
    return reg;
  }();
  return *r;
}

}  // namespace

void register_architecture(std::shared_ptr<const Architecture> a) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.all.push_back(std::move(a));  // searched newest first
}

const Architecture* architecture_for(const std::string& model_type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.all.rbegin(); it != r.all.rend(); ++it) {
    const auto types = (*it)->model_types();
    if (std::find(types.begin(), types.end(), model_type) != types.end()) return it->get();
  }
  return nullptr;
}

std::string architecture_model_types() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> seen;
  for (const auto& a : r.all)
    for (const auto& t : a->model_types())
      if (std::find(seen.begin(), seen.end(), t) == seen.end()) seen.push_back(t);
  std::string out;
  for (const auto& t : seen) out += (out.empty() ? "" : ", ") + t;
  return out;
}

}  // namespace tessera::model
