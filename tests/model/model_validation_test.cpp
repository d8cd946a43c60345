// Configs, checkpoints and inputs that must be rejected with a clear error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "model/config.h"
#include "model/gen_model.h"
#include "model/transformer.h"

namespace tessera::model {
namespace {

const std::string kData = TESSERA_TEST_DATA;

nlohmann::json bert_tiny_config() { return nlohmann::json::parse(core::read_file(kData + "/bert-tiny/config.json").value()); }

TEST(ConfigTest, ParsesTheFixtures) {
  auto c = load_config(kData + "/gpt2-tiny");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->family, "gpt2");
  EXPECT_EQ(c->head, HeadKind::kLmHead);
  EXPECT_EQ(c->act, kernels::Activation::kGeluTanh);
  auto v = load_config(kData + "/vit-tiny");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->max_rows(), 17);
  EXPECT_EQ(v->num_labels(), 10);
}

TEST(ConfigTest, RejectsBadConfigs) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* message_part;
  } cases[] = {
      {"model_type", "llama", "not supported"},
      {"architectures", nlohmann::json::array({"BertForMaskedLM"}), "not supported"},
      {"hidden_size", 65, "not divisible"},
      {"num_hidden_layers", 0, "outside"},
      {"hidden_act", "swish", "not supported"},
      {"vocab_size", "many", "not an integer"},
      {"max_position_embeddings", nullptr, "missing"},
  };
  for (const auto& c : cases) {
    auto j = bert_tiny_config();
    j[c.key] = c.value;
    auto r = parse_config(j.dump());
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_NE(r.status().message().find(c.message_part), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(parse_config("{\"model_type\": ").ok());
  EXPECT_FALSE(parse_config("[]").ok());
}

// A copy of bert-tiny whose weights are replaced by `tensors`.
std::string broken_model(const std::string& name, const std::map<std::string, core::Tensor>& tensors) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::system(("mkdir -p " + dir + " && cp " + kData + "/bert-tiny/config.json " + dir + "/").c_str());
  EXPECT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

std::map<std::string, core::Tensor> bert_tiny_tensors() {
  auto f = SafeTensorsFile::open(kData + "/bert-tiny/model.safetensors").value();
  std::map<std::string, core::Tensor> t;
  for (const auto& n : f.names()) t[n] = f.get(n).value();
  return t;
}

TEST(WeightsTest, RejectsMissingExtraAndMisshapenTensors) {
  auto missing = bert_tiny_tensors();
  missing.erase("bert.encoder.layer.1.output.dense.weight");
  auto r = Transformer::load(broken_model("missing", missing));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing tensor 'bert.encoder.layer.1.output.dense.weight'"), std::string::npos);

  auto extra = bert_tiny_tensors();
  extra["bert.encoder.layer.9.mystery"] = core::Tensor::from_f32({1}, {0.0f});
  r = Transformer::load(broken_model("extra", extra));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unexpected tensor"), std::string::npos);

  auto shape = bert_tiny_tensors();
  shape["classifier.weight"] = core::Tensor::zeros_f32({2, 64});
  r = Transformer::load(broken_model("shape", shape));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has shape [2,64], expected [3,64]"), std::string::npos);

  auto dtype = bert_tiny_tensors();
  dtype["classifier.bias"] = core::Tensor::from_i64({3}, {1, 2, 3});
  r = Transformer::load(broken_model("dtype", dtype));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dtype I64"), std::string::npos);
}

TEST(InputTest, RejectsBadInputs) {
  auto m = Transformer::load(kData + "/bert-tiny");
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->validate_input({}).message().find("empty input"), std::string::npos);
  ModelInput too_long{std::vector<int64_t>(129, 5), {}, {}};
  EXPECT_NE(m->validate_input(too_long).message().find("longer than max_position_embeddings"), std::string::npos);
  ModelInput oov{{1, 512}, {}, {}};
  EXPECT_NE(m->validate_input(oov).message().find("outside the vocabulary"), std::string::npos);
  ModelInput bad_types{{1, 2}, {0, 2}, {}};
  EXPECT_NE(m->validate_input(bad_types).message().find("token type 2"), std::string::npos);
  ModelInput short_types{{1, 2}, {0}, {}};
  EXPECT_FALSE(m->validate_input(short_types).ok());
  EXPECT_FALSE(m->forward(oov, {}, nullptr).ok());

  auto vit = Transformer::load(kData + "/vit-tiny");
  ASSERT_TRUE(vit.ok());
  ModelInput wrong_image;
  wrong_image.pixels = core::Tensor::zeros_f32({1, 3, 16, 16});
  EXPECT_NE(vit->validate_input(wrong_image).message().find("expected [1,3,32,32]"), std::string::npos);
}

TEST(GenModelTest, WritesLoadableModelsForOverriddenPresets) {
  for (const char* preset : {"bert-base", "gpt2", "vit-base", "distilbert"}) {
    GenModelOptions o;
    o.preset = preset;
    o.out_dir = ::testing::TempDir() + "/gen-" + preset;
    o.layers = 2;
    o.hidden = 32;
    o.heads = 4;
    o.vocab = 300;
    ASSERT_TRUE(gen_model(o).ok()) << preset;
    auto m = Transformer::load(o.out_dir);
    ASSERT_TRUE(m.ok()) << preset << ": " << m.status().to_string();
    EXPECT_EQ(m->config().layers, 2);
    EXPECT_EQ(m->config().hidden, 32);
  }
  // Missing parent folders are created (mkdir -p); a file in the way is an error.
  GenModelOptions nested;
  nested.preset = "gpt2";
  nested.out_dir = ::testing::TempDir() + "/gen-nested/a/b/c";
  nested.layers = 1;
  nested.hidden = 32;
  nested.heads = 4;
  nested.vocab = 300;
  const core::Status made = gen_model(nested);
  ASSERT_TRUE(made.ok()) << made.to_string();
  EXPECT_TRUE(Transformer::load(nested.out_dir).ok());
  ASSERT_TRUE(core::write_file(::testing::TempDir() + "/gen-file", "").ok());
  nested.out_dir = ::testing::TempDir() + "/gen-file/c";
  EXPECT_FALSE(gen_model(nested).ok());
  GenModelOptions bad;
  bad.preset = "llama";
  bad.out_dir = ::testing::TempDir() + "/gen-bad";
  EXPECT_FALSE(gen_model(bad).ok());
  bad.preset = "bert-base";
  bad.hidden = 30;
  bad.heads = 4;
  EXPECT_FALSE(gen_model(bad).ok());
}

}  // namespace
}  // namespace tessera::model
