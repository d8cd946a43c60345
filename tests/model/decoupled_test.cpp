// DeTransformer's decoupled models (block_parallel in config.json): the
// independent PyTorch reference's fixtures reproduced, and malformed models
// refused with one-line errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/io.h"
#include "model/generate.h"
#include "model/safetensors.h"
#include "model/transformer.h"

#include "fixture_util.h"

namespace tessera::model {
namespace {

using testing::ids_of;
using testing::kData;
using testing::max_abs_diff;

void check_fixture(const std::string& name, bool bert) {
  auto model = Transformer::load(kData + "/" + name);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->config().bp_div, 2);
  EXPECT_TRUE(model->config().decoupled(0));
  EXPECT_FALSE(model->config().decoupled(1));
  auto cases = SafeTensorsFile::open(kData + "/" + name + "/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  int checked = 0;
  for (const std::string& key : cases->names()) {
    if (key.size() < 10 || key.compare(key.size() - 10, 10, ".input_ids") != 0 || key.rfind("generate.", 0) == 0) continue;
    const std::string s = key.substr(0, key.size() - 10);
    ModelInput in;
    in.ids = ids_of(cases->get(key).value());
    if (bert) in.token_types = ids_of(cases->get(s + ".token_type_ids").value());
    ForwardOptions opts;
    opts.all_hidden = true;
    auto out = model->forward(in, opts, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(out->hidden.size()), model->config().layers + 1);
    for (size_t i = 0; i < out->hidden.size(); ++i)
      EXPECT_LT(max_abs_diff(out->hidden[i], cases->get(s + ".hidden." + std::to_string(i)).value()), 1e-4f)
          << name << " " << s << " hidden." << i;
    EXPECT_LT(max_abs_diff(out->logits, cases->get(s + ".logits").value()), 1e-4f) << name << " " << s << " logits";
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

TEST(DecoupledTest, BertBpTinyMatchesTheReference) { check_fixture("bert-bp-tiny", true); }
TEST(DecoupledTest, Gpt2BpTinyMatchesTheReference) { check_fixture("gpt2-bp-tiny", false); }

TEST(DecoupledTest, Gpt2BpGreedyGenerationMatchesTheReference) {
  auto model = Transformer::load(kData + "/gpt2-bp-tiny");
  ASSERT_TRUE(model.ok());
  auto cases = SafeTensorsFile::open(kData + "/gpt2-bp-tiny/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  const auto prompt = ids_of(cases->get("generate.prompt").value());
  const auto want = ids_of(cases->get("generate.output").value());
  GenerateOptions g;
  g.max_new_tokens = static_cast<int64_t>(want.size() - prompt.size());
  auto got = generate(*model, prompt, g, nullptr);  // with the KV cache; the reference recomputed the prefix
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, want);
}

TEST(DecoupledTest, SubBlocksAddUpToTheOriginalMatrices) {
  // Each decoupled layer: the ordinary layer's weight matrices, plus (N-1)(3h+I)
  // more bias values (Q/K/V and FFN-in biases are whole in every sub-block).
  auto c = load_config(kData + "/bert-bp-tiny").value();
  auto store = TensorStore::open_dir(kData + "/bert-bp-tiny").value();
  const int64_t h = c.hidden, I = c.intermediate, N = c.bp_div;
  int64_t decoupled = 0, original = 0;
  for (const std::string& n : store.names()) {
    const int64_t numel = [&] {
      int64_t e = 1;
      for (int64_t d : store.info(n)->shape) e *= d;
      return e;
    }();
    if (n.find("encoder.layer.0.") != std::string::npos) decoupled += numel;
    if (n.find("encoder.layer.1.") != std::string::npos) original += numel;
  }
  EXPECT_EQ(decoupled - original, (N - 1) * (3 * h + I));
}

std::string copy_with(const std::string& name, const std::function<void(nlohmann::json&)>& edit_config,
                      const std::function<void(std::map<std::string, core::Tensor>&)>& edit_tensors = {}) {
  const std::string dir = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  auto j = nlohmann::json::parse(core::read_file(kData + "/bert-bp-tiny/config.json").value());
  edit_config(j);
  EXPECT_TRUE(core::write_file(dir + "/config.json", j.dump()).ok());
  auto f = SafeTensorsFile::open(kData + "/bert-bp-tiny/model.safetensors").value();
  std::map<std::string, core::Tensor> t;
  for (const auto& n : f.names()) t[n] = f.get(n).value().clone();
  if (edit_tensors) edit_tensors(t);
  EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", t).ok());
  return dir;
}

void expect_error(const std::string& dir, const std::string& part) {
  auto m = Transformer::load(dir);
  ASSERT_FALSE(m.ok());
  const std::string msg = m.status().message();
  EXPECT_NE(msg.find(part), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(DecoupledTest, MalformedModelsGetOneLineErrors) {
  expect_error(copy_with("bp_div", [](nlohmann::json& j) { j["block_parallel"]["n_div"] = 3; }), "does not divide");
  expect_error(copy_with("bp_range", [](nlohmann::json& j) { j["block_parallel"]["original_layers"] = {1, 4}; }),
               "original layer 4 outside");
  expect_error(copy_with("bp_neg", [](nlohmann::json& j) { j["block_parallel"]["original_layers"] = {-1}; }),
               "original layer -1 outside");
  expect_error(copy_with("bp_missing", [](nlohmann::json&) {},
                         [](auto& t) { t.erase("bert.encoder.layer.2.blocks.1.intermediate.dense.weight"); }),
               "missing tensor 'bert.encoder.layer.2.blocks.1.intermediate.dense.weight'");
  expect_error(copy_with("bp_shape", [](nlohmann::json&) {},
                         [](auto& t) { t["bert.encoder.layer.0.blocks.0.attention.self.query.weight"] = core::Tensor::zeros_f32({64, 64}); }),
               "tensor 'bert.encoder.layer.0.blocks.0.attention.self.query.weight' has shape");
  // An original layer listed where the checkpoint holds sub-blocks.
  expect_error(copy_with("bp_orig", [](nlohmann::json& j) { j["block_parallel"]["original_layers"] = {0, 1, 3}; }),
               "missing tensor 'bert.encoder.layer.0.attention");
}

}  // namespace
}  // namespace tessera::model
