// A model family defined and registered here, in this file alone: an
// Architecture unit with its own model_type, config fields and tensor names,
// built from the shared blocks (pre-LN decoder layers, learned positions, a
// tied head). Its checkpoint is gpt2-tiny's weights renamed into its layout
// (Linear [out, in] matrices, separate q/k/v), so its outputs must be the
// reference's: on one device, under tp and pipeline as threads, and under
// the plan the planner chooses for it. Nothing outside this file knows it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>

#include "fixtures.h"
#include "generate_check.h"
#include "model/arch/architecture.h"
#include "model/arch/fields.h"
#include "model/safetensors.h"
#include "planner/planner.h"

namespace tessera::parallel {
namespace {

using testing::kData;
using testing::make_plan;
using testing::max_diff;
using testing::run_threads;

class ToyDecoder final : public model::Architecture {
 public:
  std::string name() const override { return "toy"; }
  std::vector<std::string> model_types() const override { return {"toy-decoder"}; }
  std::vector<std::pair<std::string, model::HeadKind>> classes() const override {
    return {{"ToyDecoderLM", model::HeadKind::kLmHead}};
  }
  core::Status parse(const nlohmann::json& j, const std::string&, model::ModelConfig& c) const override {
    using model::arch::int_field;
    TESSERA_ASSIGN_OR_RETURN(c.hidden, int_field(j, "width", 1, 1 << 16));
    TESSERA_ASSIGN_OR_RETURN(c.heads, int_field(j, "n_heads", 1, 1024));
    TESSERA_ASSIGN_OR_RETURN(c.layers, int_field(j, "depth", 1, 1024));
    TESSERA_ASSIGN_OR_RETURN(c.intermediate, int_field(j, "mlp_width", 1, 1 << 18));
    TESSERA_ASSIGN_OR_RETURN(c.vocab, int_field(j, "vocab", 1, 1 << 24));
    TESSERA_ASSIGN_OR_RETURN(c.max_positions, int_field(j, "context", 1, 1 << 20));
    c.eps = 1e-5f;
    c.act = kernels::Activation::kGeluTanh;
    c.causal_attention = c.learned_positions = c.final_norm = c.tied_head = true;
    return core::ok_status();
  }
  const model::TensorNames& names() const override {
    static const model::TensorNames n = [] {
      model::TensorNames t;
      t.wrapper = "net.";
      t.layers = "blocks.";
      model::LayerNames& l = t.layer;
      l.qkv_w = {"attn.wq.weight", "attn.wk.weight", "attn.wv.weight"};
      l.qkv_b = {"attn.wq.bias", "attn.wk.bias", "attn.wv.bias"};
      l.attn_out_w = "attn.wo.weight";
      l.attn_out_b = "attn.wo.bias";
      l.ffn_in_w = {"mlp.up.weight"};
      l.ffn_in_b = {"mlp.up.bias"};
      l.ffn_out_w = "mlp.down.weight";
      l.ffn_out_b = "mlp.down.bias";
      l.ln1_g = "norm1.weight";
      l.ln1_b = "norm1.bias";
      l.ln2_g = "norm2.weight";
      l.ln2_b = "norm2.bias";
      t.base.word = "tokens.weight";
      t.base.pos = "positions.weight";
      t.base.final_ln_g = "norm_out.weight";
      t.base.final_ln_b = "norm_out.bias";
      return t;
    }();
    return n;
  }
};

core::Tensor transposed(const core::Tensor& t) {
  core::Tensor out = core::Tensor::zeros_f32({t.dim(1), t.dim(0)});
  for (int64_t i = 0; i < t.dim(0); ++i)
    for (int64_t j = 0; j < t.dim(1); ++j) out.f32()[j * t.dim(0) + i] = t.f32()[i * t.dim(1) + j];
  return out;
}

// gpt2-tiny's weights under the toy family's names, in a temporary folder.
std::string write_toy_checkpoint() {
  const std::string src = kData + "/gpt2-tiny";
  const auto cfg = model::load_config(src).value();
  auto file = model::SafeTensorsFile::open(src + "/model.safetensors").value();
  auto get = [&](const std::string& n) { return file.get_f32("transformer." + n).value().clone(); };
  const int64_t F = cfg.hidden;
  std::map<std::string, core::Tensor> out;
  out["net.tokens.weight"] = get("wte.weight");
  out["net.positions.weight"] = get("wpe.weight");
  out["net.norm_out.weight"] = get("ln_f.weight");
  out["net.norm_out.bias"] = get("ln_f.bias");
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".", b = "net.blocks." + std::to_string(l) + ".";
    const core::Tensor qkv = transposed(get(h + "attn.c_attn.weight")), qkv_b = get(h + "attn.c_attn.bias");
    const char* part[3] = {"wq", "wk", "wv"};
    for (int64_t p = 0; p < 3; ++p) {
      out[b + "attn." + part[p] + ".weight"] = qkv.rows(p * F, (p + 1) * F).clone();
      out[b + "attn." + part[p] + ".bias"] = qkv_b.rows(p * F, (p + 1) * F).clone();
    }
    out[b + "attn.wo.weight"] = transposed(get(h + "attn.c_proj.weight"));
    out[b + "attn.wo.bias"] = get(h + "attn.c_proj.bias");
    out[b + "mlp.up.weight"] = transposed(get(h + "mlp.c_fc.weight"));
    out[b + "mlp.up.bias"] = get(h + "mlp.c_fc.bias");
    out[b + "mlp.down.weight"] = transposed(get(h + "mlp.c_proj.weight"));
    out[b + "mlp.down.bias"] = get(h + "mlp.c_proj.bias");
    for (const char* n : {"1", "2"}) {
      out[b + "norm" + n + ".weight"] = get(h + "ln_" + n + ".weight");
      out[b + "norm" + n + ".bias"] = get(h + "ln_" + n + ".bias");
    }
  }
  const std::string dir = ::testing::TempDir() + "/toy-decoder-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(model::write_safetensors(dir + "/model.safetensors", out).ok());
  std::ofstream(dir + "/config.json") << nlohmann::json{{"model_type", "toy-decoder"},
                                                        {"architectures", {"ToyDecoderLM"}},
                                                        {"width", F},
                                                        {"n_heads", cfg.heads},
                                                        {"depth", cfg.layers},
                                                        {"mlp_width", cfg.intermediate},
                                                        {"vocab", cfg.vocab},
                                                        {"context", cfg.max_positions}}
                                             .dump();
  return dir;
}

TEST(CustomFamilyTest, ARegisteredFamilyRunsSingleTpPipelineAndThePlannersChoice) {
  model::register_architecture(std::make_shared<ToyDecoder>());
  const std::string dir = write_toy_checkpoint();
  auto cfg = model::load_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->family, "toy");
  EXPECT_EQ(cfg->head, model::HeadKind::kLmHead);

  auto cases = model::SafeTensorsFile::open(kData + "/gpt2-tiny/cases.safetensors").value();
  for (const std::string s : {"s13", "s40"}) {
    model::ModelInput in;
    in.ids = testing::ids_of(cases.get(s + ".input_ids").value());
    const core::Tensor want_hidden = cases.get(s + ".hidden." + std::to_string(cfg->layers)).value();
    const core::Tensor want_logits = cases.get(s + ".logits").value();

    // One device: the unit's names and recipe give the reference's logits.
    auto m = model::Transformer::load(dir);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto f = m->forward(in, {}, nullptr);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_LT(max_diff(f->logits, want_logits), 1e-4f) << s;

    // tp and pipeline on 2..3 threads with uneven shares.
    for (const std::string strategy : {"tp", "pipeline"})
      for (const std::vector<double>& ratios : {std::vector<double>{3, 1}, std::vector<double>{1, 2, 1}}) {
        const auto got = run_threads(dir, make_plan(strategy, static_cast<int>(ratios.size()), ratios), in);
        EXPECT_LT(max_diff(got.hidden, want_hidden), 1e-4f) << strategy << " K=" << ratios.size() << " " << s;
      }

    // The planner prices every strategy for the family and its choice runs exactly.
    planner::ClusterProfile p;
    for (int d = 0; d < 2; ++d) {
      planner::DeviceProfile dev;
      dev.name = "synthetic";
      dev.gemm = {{64, 256, 256, 20.0}};
      dev.attention_gflops = 20;
      dev.elementwise_gbps = dev.stream_gbps = 10;
      p.devices.push_back(dev);
    }
    p.links.assign(2, std::vector<planner::LinkProfile>(2, planner::LinkProfile{0.2, 1000}));
    planner::PlannerOptions o;
    o.rows = static_cast<int64_t>(in.ids.size());
    const auto table = planner::plan_all(*cfg, p, o);
    ASSERT_TRUE(table.ok()) << table.status().to_string();
    ASSERT_GE(table->chosen, 0);
    int priced = 0;
    for (const auto& row : table->rows) priced += row.feasible ? 1 : 0;
    EXPECT_GE(priced, 3) << "single, tp and pipeline at least";
    const Plan chosen = table->rows[static_cast<size_t>(table->chosen)].plan;
    const auto got = run_threads(dir, chosen, in);
    EXPECT_LT(max_diff(got.hidden, want_hidden), 1e-4f) << "the planner's " << chosen.strategy << " " << s;
  }
  std::filesystem::remove_all(dir);
}

// A unit whose names do not fit the layer its recipe builds (a gated MLP
// named with one input tensor) is refused when a config is read, not
// indexed out of range when the weights are.
class MisnamedDecoder final : public model::Architecture {
 public:
  std::string name() const override { return "misnamed"; }
  std::vector<std::string> model_types() const override { return {"misnamed-decoder"}; }
  std::vector<std::pair<std::string, model::HeadKind>> classes() const override { return {}; }
  core::Status parse(const nlohmann::json& j, const std::string& t, model::ModelConfig& c) const override {
    TESSERA_RETURN_IF_ERROR(toy_.parse(j, t, c));
    c.llama_layers = true;
    return core::ok_status();
  }
  const model::TensorNames& names() const override { return toy_.names(); }

 private:
  ToyDecoder toy_;
};

TEST(CustomFamilyTest, AUnitWhoseNamesDoNotFitItsLayersIsRefused) {
  model::register_architecture(std::make_shared<MisnamedDecoder>());
  const auto c = model::parse_config(
      R"({"model_type": "misnamed-decoder", "width": 64, "n_heads": 4, "depth": 1, "mlp_width": 128, "vocab": 100, "context": 32})");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tensor names do not fit"), std::string::npos) << c.status().to_string();
}

}  // namespace
}  // namespace tessera::parallel
