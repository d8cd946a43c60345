// The Llama-style decoders (Llama, Qwen2, Qwen3; model/arch/llama.cpp) against
// the independent PyTorch reference fixtures: every hidden state and the
// logits of every case, greedy generation, the GQA KV cache, and config
// errors that name their field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/io.h"
#include "model/gen_model.h"
#include "model/generate.h"
#include "model/tokenizer.h"
#include "model/safetensors.h"
#include "model/transformer.h"

#include "fixture_util.h"

namespace tessera::model {
namespace {

using testing::ids_of;
using testing::kData;
using testing::max_abs_diff;

class DecoderFamilyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DecoderFamilyTest, EveryCaseMatchesTheReference) {
  const std::string dir = kData + "/" + GetParam();
  auto model = Transformer::load(dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_TRUE(model->config().causal_lm());
  auto cases = SafeTensorsFile::open(dir + "/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  int checked = 0;
  for (const char* s : {"s1", "s7", "s37", "s160"}) {
    auto ids = cases->get(std::string(s) + ".input_ids");
    if (!ids.ok()) continue;  // s160: llama3rope-tiny only
    ForwardOptions opts;
    opts.all_hidden = true;
    auto out = model->forward({ids_of(*ids), {}, {}}, opts, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(out->hidden.size()), model->config().layers + 1);
    for (size_t i = 0; i < out->hidden.size(); ++i)
      EXPECT_LT(max_abs_diff(out->hidden[i], cases->get(std::string(s) + ".hidden." + std::to_string(i)).value()), 1e-4f)
          << s << " hidden." << i;
    EXPECT_LT(max_abs_diff(out->logits, cases->get(std::string(s) + ".logits").value()), 1e-4f) << s;
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST_P(DecoderFamilyTest, GreedyGenerationMatchesTheReference) {
  const std::string dir = kData + "/" + GetParam();
  auto model = Transformer::load(dir);
  ASSERT_TRUE(model.ok());
  auto cases = SafeTensorsFile::open(dir + "/cases.safetensors").value();
  const auto prompt = ids_of(cases.get("generate.prompt").value());
  const auto want = ids_of(cases.get("generate.output").value());
  GenerateOptions g;
  g.greedy = true;
  g.max_new_tokens = static_cast<int64_t>(want.size() - prompt.size());
  auto got = generate(*model, prompt, g, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, want);
}

// Prefill then one row at a time through the cache of KV-head width: the
// last row equals the whole sequence's.
TEST_P(DecoderFamilyTest, GroupedKvCacheDecodeEqualsFullForward) {
  auto model = Transformer::load(kData + "/" + GetParam());
  ASSERT_TRUE(model.ok());
  const std::vector<int64_t> ids = {5, 17, 300, 2, 99, 41, 7, 250};
  auto ref = model->forward({ids, {}, {}}, {}, nullptr);
  ASSERT_TRUE(ref.ok());
  KvCache cache = model->make_cache(static_cast<int64_t>(ids.size())).value();
  EXPECT_EQ(cache.k[0].dim(1), model->config().kv_width());  // KV heads x head size
  Workspace ws;
  core::Tensor last;
  for (size_t pos = 0; pos < ids.size();) {
    const size_t n = pos == 0 ? 3 : 1;
    auto x = model->embed({{ids.begin() + pos, ids.begin() + pos + n}, {}, {}}, static_cast<int64_t>(pos));
    ASSERT_TRUE(x.ok());
    for (int64_t l = 0; l < model->config().layers; ++l) model->layer(l, *x, static_cast<int64_t>(pos), &cache, ws, nullptr);
    model->finish_hidden(*x, nullptr);
    last = *x;
    pos += n;
  }
  const int64_t F = last.dim(1), rows = static_cast<int64_t>(ids.size());  // OPT-350m style: the token width
  for (int64_t j = 0; j < F; ++j) EXPECT_NEAR(last.f32()[j], ref->hidden.back().f32()[(rows - 1) * F + j], 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderFamilyTest,
                         ::testing::Values("llama-tiny", "qwen2-tiny", "qwen3-tiny", "qwen3-mqa-tiny", "llama3rope-tiny",
                                           "opt-tiny", "opt-postln-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The fixture's config.json with `patch` merged in, parsed.
core::Result<ModelConfig> patched(const std::string& fixture, const nlohmann::json& patch) {
  auto j = nlohmann::json::parse(core::read_file(kData + "/" + fixture + "/config.json").value());
  if (!patch.is_null()) j.merge_patch(patch);  // {} is null here: nothing to merge
  return parse_config(j.dump());
}

TEST(DecoderConfigTest, FieldsAreReadPerFamily) {
  const ModelConfig q3 = patched("qwen3-tiny", {}).value();
  EXPECT_EQ(q3.head_dim(), 32);  // explicit, not hidden / heads
  EXPECT_EQ(q3.kv_head_count(), 2);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.qkv_width(), (4 + 2 * 2) * 32);
  EXPECT_TRUE(patched("qwen2-tiny", {}).value().attention_bias);
  EXPECT_TRUE(patched("qwen2-tiny", {}).value().tied_head);
  EXPECT_FALSE(patched("llama-tiny", {}).value().attention_bias);
  EXPECT_EQ(q3.head, HeadKind::kLmHead);
  EXPECT_TRUE(q3.causal_lm());
  EXPECT_FALSE(q3.plain_layers());
  // linear scaling divides every frequency by the factor
  const ModelConfig plain = patched("llama-tiny", {}).value();
  const ModelConfig lin = patched("llama-tiny", {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}).value();
  ASSERT_EQ(plain.rope_inv_freq.size(), lin.rope_inv_freq.size());
  for (size_t i = 0; i < lin.rope_inv_freq.size(); ++i) EXPECT_FLOAT_EQ(lin.rope_inv_freq[i], plain.rope_inv_freq[i] / 2);
  // transformers 5's "rope_parameters" (no top-level rope_theta or
  // rope_scaling): the same frequencies as 4's two keys.
  const nlohmann::json llama31 = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  nlohmann::json v4 = {{"rope_theta", 500000.0}, {"rope_scaling", llama31}};
  nlohmann::json params = llama31;
  params["rope_theta"] = 500000.0;
  nlohmann::json v5 = {{"rope_theta", nullptr}, {"rope_scaling", nullptr}, {"rope_parameters", params}};
  const ModelConfig four = patched("llama-tiny", v4).value(), five = patched("llama-tiny", v5).value();
  EXPECT_EQ(five.rope_inv_freq, four.rope_inv_freq);
  EXPECT_NE(five.rope_inv_freq, plain.rope_inv_freq);
  const ModelConfig q3five = patched("qwen3-tiny", {{"rope_theta", nullptr}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}}}).value();
  EXPECT_EQ(q3five.rope_inv_freq, q3.rope_inv_freq);
  // Qwen3's attention_bias covers o_proj too; Mistral has no biases whatever it says.
  EXPECT_TRUE(patched("qwen3-tiny", {{"attention_bias", true}}).value().o_bias);
  EXPECT_FALSE(patched("llama-tiny", {{"model_type", "mistral"}, {"architectures", {"MistralForCausalLM"}}, {"attention_bias", true}})
                   .value()
                   .attention_bias);
}

TEST(DecoderConfigTest, BadFieldsAreNamed) {
  auto expect_error = [](const core::Result<ModelConfig>& r, const std::string& names) {
    ASSERT_FALSE(r.ok()) << names;
    EXPECT_NE(r.status().message().find(names), std::string::npos) << r.status().to_string();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << "one line";
  };
  expect_error(patched("llama-tiny", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}), "yarn");
  expect_error(patched("llama-tiny", {{"num_key_value_heads", 3}}), "num_key_value_heads");
  expect_error(patched("llama-tiny", {{"hidden_size", 66}, {"head_dim", nullptr}}), "head_dim");
  expect_error(patched("llama-tiny", {{"head_dim", 15}}), "head_dim");
  expect_error(patched("llama-tiny", {{"hidden_act", "gelu"}}), "hidden_act");
  expect_error(patched("llama-tiny", {{"model_type", "llama4"}}), "llama4");
  expect_error(patched("llama-tiny", {{"architectures", {"Qwen3ForSequenceClassification"}}}), "Qwen3ForSequenceClassification");
  expect_error(patched("llama-tiny", {{"rope_scaling", {{"rope_type", "llama3"}}}}), "factor");
  expect_error(patched("llama-tiny", {{"rope_parameters", {{"full_attention", {{"rope_theta", 1e4}}}}}}), "per layer type");
  expect_error(patched("llama-tiny", {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}}}), "yarn");
  expect_error(patched("llama-tiny", {{"partial_rotary_factor", 0.5}}), "partial_rotary_factor");
  expect_error(patched("llama-tiny", {{"rope_parameters", 3}}), "rope_parameters");
}

TEST(DecoderConfigTest, MistralsSlidingWindowIsRefusedNotIgnored) {
  auto j = nlohmann::json::parse(core::read_file(kData + "/llama-tiny/config.json").value());
  j["model_type"] = "mistral";
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = 4;
  auto c = parse_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->sliding_window, 4);
  // The llama-tiny weights under a Mistral config: 4 tokens run, 5 do not.
  auto store = TensorStore::open_dir(kData + "/llama-tiny").value();
  ModelConfig cfg = *c;
  auto w = load_weights(store, cfg);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  Transformer m(cfg, std::move(*w));
  EXPECT_TRUE(m.forward({{1, 2, 3, 4}, {}, {}}, {}, nullptr).ok());
  auto longer = m.forward({{1, 2, 3, 4, 5}, {}, {}}, {}, nullptr);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("sliding_window"), std::string::npos) << longer.status().to_string();
  EXPECT_FALSE(m.make_cache(5).ok());
  // No key at all: MistralConfig's 4096; null: no window.
  j.erase("sliding_window");
  EXPECT_EQ(parse_config(j.dump()).value().sliding_window, 4096);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse_config(j.dump()).value().sliding_window, 0);
}

TEST(DecoderConfigTest, MissingAndMisshapedTensorsAreNamed) {
  auto store = TensorStore::open_dir(kData + "/qwen3-tiny").value();
  ModelConfig c = load_config(kData + "/qwen3-tiny").value();
  c.qk_norm = false;  // the checkpoint's q_norm/k_norm are then unexpected
  auto extra = load_weights(store, c);
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("_norm.weight"), std::string::npos) << extra.status().to_string();
  ModelConfig wide = load_config(kData + "/qwen3-tiny").value();
  wide.intermediate += 1;
  auto shaped = load_weights(store, wide);
  ASSERT_FALSE(shaped.ok());
  EXPECT_NE(shaped.status().message().find("mlp."), std::string::npos) << shaped.status().to_string();
  ModelConfig untied = load_config(kData + "/qwen2-tiny").value();
  untied.tied_head = false;
  auto head = load_weights(TensorStore::open_dir(kData + "/qwen2-tiny").value(), untied);
  ASSERT_FALSE(head.ok());
  EXPECT_NE(head.status().message().find("lm_head.weight"), std::string::npos) << head.status().to_string();
}

TEST(DecoderConfigTest, SequencesLongerThanThePositionsAreRefused) {
  auto model = Transformer::load(kData + "/llama-tiny").value();
  std::vector<int64_t> ids(static_cast<size_t>(model.config().max_positions + 1), 3);
  auto r = model.forward({ids, {}, {}}, {}, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_position_embeddings"), std::string::npos);
}

}  // namespace
}  // namespace tessera::model

namespace tessera::model {
namespace {

TEST(DecoderGenModelTest, PresetsHaveTheReleasedShapes) {
  GenModelOptions o;
  o.preset = "llama-3.2-1b";
  const ModelConfig l = parse_config(gen_model_config(o).value().dump()).value();
  EXPECT_EQ(l.hidden, 2048);
  EXPECT_EQ(l.kv_head_count(), 8);
  EXPECT_EQ(l.head_dim(), 64);
  EXPECT_EQ(l.vocab, 128256);
  EXPECT_TRUE(l.tied_head);
  o.preset = "qwen3-0.6b";
  const ModelConfig q = parse_config(gen_model_config(o).value().dump()).value();
  EXPECT_EQ(q.head_dim(), 128);  // != 1024 / 16
  EXPECT_TRUE(q.qk_norm);
  o.preset = "tinyllama-1.1b";
  EXPECT_FALSE(parse_config(gen_model_config(o).value().dump()).value().tied_head);
  o.preset = "opt-350m";  // post-LN, 512-wide embeddings projected to 1024
  const ModelConfig small = parse_config(gen_model_config(o).value().dump()).value();
  EXPECT_FALSE(small.pre_layernorm());
  EXPECT_EQ(small.token_width(), 512);
  o.preset = "opt-2.7b";
  EXPECT_EQ(parse_config(gen_model_config(o).value().dump()).value().hidden, 2560);
  o.preset = "tinyllama-1.1b";
  o.kv_heads = 3;  // 32 heads are not a multiple of 3
  EXPECT_FALSE(gen_model_config(o).ok());
}

TEST(DecoderGenModelTest, EveryDecoderPresetWritesAModelThatRunsAndGenerates) {
  for (const char* preset : {"llama-3.2-1b", "llama-3.2-3b", "tinyllama-1.1b", "qwen3-0.6b", "qwen2.5-1.5b", "opt-350m",
                             "opt-1.3b", "opt-2.7b"}) {
    const bool opt = std::string(preset).rfind("opt-", 0) == 0;
    GenModelOptions o;
    o.preset = preset;
    o.layers = 2;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = opt ? 0 : 2;
    o.intermediate = 96;
    o.vocab = 300;
    o.out_dir = ::testing::TempDir() + "/gen-" + preset;
    ASSERT_TRUE(gen_model(o).ok()) << preset;
    auto m = Transformer::load(o.out_dir);
    ASSERT_TRUE(m.ok()) << preset << ": " << m.status().to_string();
    EXPECT_EQ(m->config().kv_head_count(), opt ? 4 : 2);
    GenerateOptions g;
    g.greedy = true;
    g.max_new_tokens = 3;
    g.eos_token_id = -1;
    auto ids = generate(*m, {1, 2, 3}, g, nullptr);
    ASSERT_TRUE(ids.ok()) << preset << ": " << ids.status().to_string();
    EXPECT_EQ(ids->size(), 6u);
  }
}

TEST(DecoderGenModelTest, ARealTokenizerSizesTheVocabulary) {
  GenModelOptions o;
  o.preset = "qwen3-0.6b";
  o.layers = 1;
  o.hidden = 32;
  o.heads = 2;
  o.kv_heads = 1;
  o.intermediate = 64;
  o.tokenizer_dir = kData + "/gpt2-chat";
  o.out_dir = ::testing::TempDir() + "/gen-with-tokenizer";
  ASSERT_TRUE(gen_model(o).ok());
  auto tok = load_tokenizer(o.out_dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(load_config(o.out_dir).value().vocab, (*tok)->vocab_size());
  EXPECT_EQ(core::read_file(o.out_dir + "/tokenizer_config.json").value(),
            core::read_file(kData + "/gpt2-chat/tokenizer_config.json").value());
  o.vocab = 100;  // two sizes for one vocabulary
  EXPECT_FALSE(gen_model(o).ok());
}

}  // namespace
}  // namespace tessera::model

namespace tessera::model {
namespace {

uint16_t to_bf16(float x) {  // round to nearest even, as torch's .bfloat16()
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A BF16 copy of qwen3-tiny loads to the outputs of its F32 weights rounded
// to BF16 (the loader widens exactly), and stays near the F32 reference.
TEST(DecoderDtypeTest, ABf16CopyLoadsToTheSameOutputsWithinItsRounding) {
  const std::string src = kData + "/qwen3-tiny", bf = ::testing::TempDir() + "/qwen3-bf16",
                    rounded = ::testing::TempDir() + "/qwen3-rounded";
  auto file = SafeTensorsFile::open(src + "/model.safetensors").value();
  std::map<std::string, core::Tensor> bf16, f32;
  for (const std::string& name : file.names()) {
    const core::Tensor t = file.get(name).value();
    core::Tensor b = core::Tensor::zeros(core::DType::kBF16, t.shape()), r = core::Tensor::zeros_f32(t.shape());
    auto* bits = static_cast<uint16_t*>(b.raw());
    for (int64_t i = 0; i < t.numel(); ++i) {
      bits[i] = to_bf16(t.f32()[i]);
      r.f32()[i] = from_bf16(bits[i]);
    }
    bf16[name] = b;
    f32[name] = r;
  }
  for (const auto& [dir, tensors] : {std::pair{bf, bf16}, std::pair{rounded, f32}}) {
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(src + "/config.json", dir + "/config.json", std::filesystem::copy_options::overwrite_existing);
    ASSERT_TRUE(write_safetensors(dir + "/model.safetensors", tensors).ok());
  }
  auto cases = SafeTensorsFile::open(src + "/cases.safetensors").value();
  const ModelInput in{ids_of(cases.get("s37.input_ids").value()), {}, {}};
  const auto a = Transformer::load(bf).value().forward(in, {}, nullptr).value();
  const auto b = Transformer::load(rounded).value().forward(in, {}, nullptr).value();
  EXPECT_LT(max_abs_diff(a.logits, b.logits), 1e-5f);  // the same weights, read as BF16 or F32
  // BF16's 8-bit mantissa moves the logits (up to ~4 here) by a few hundredths, not more.
  const float drift = max_abs_diff(a.logits, cases.get("s37.logits").value());
  EXPECT_GT(drift, 0.0f);
  EXPECT_LT(drift, 0.25f);
}

}  // namespace
}  // namespace tessera::model
