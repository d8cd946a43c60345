// Every tensor of the Hugging Face reference fixtures, reproduced.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/generate.h"
#include "model/safetensors.h"
#include "model/transformer.h"

#include "fixture_util.h"

namespace tessera::model {
namespace {

using testing::ids_of;
using testing::kData;
using testing::max_abs_diff;

void check_text_case(const Transformer& model, const SafeTensorsFile& cases, const std::string& s, bool bert) {
  ModelInput in;
  in.ids = ids_of(cases.get(s + ".input_ids").value());
  if (bert) in.token_types = ids_of(cases.get(s + ".token_type_ids").value());
  ForwardOptions opts;
  opts.all_hidden = true;
  auto out = model.forward(in, opts, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(static_cast<int64_t>(out->hidden.size()), model.config().layers + 1);
  for (size_t i = 0; i < out->hidden.size(); ++i)
    EXPECT_LT(max_abs_diff(out->hidden[i], cases.get(s + ".hidden." + std::to_string(i)).value()), 1e-4f)
        << s << " hidden." << i;
  EXPECT_LT(max_abs_diff(out->logits, cases.get(s + ".logits").value()), 1e-4f) << s << " logits";
  if (bert) {
    EXPECT_LT(max_abs_diff(out->pooler, cases.get(s + ".pooler_output").value()), 1e-4f) << s << " pooler";
  }
}

TEST(FixtureTest, BertTinyMatchesHuggingFace) {
  auto model = Transformer::load(kData + "/bert-tiny");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto cases = SafeTensorsFile::open(kData + "/bert-tiny/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  for (const char* s : {"s1", "s7", "s33"}) check_text_case(*model, *cases, s, true);
}

TEST(FixtureTest, Gpt2TinyMatchesHuggingFace) {
  auto model = Transformer::load(kData + "/gpt2-tiny");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto cases = SafeTensorsFile::open(kData + "/gpt2-tiny/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  for (const char* s : {"s1", "s13", "s40"}) check_text_case(*model, *cases, s, false);
}

TEST(FixtureTest, VitTinyMatchesHuggingFace) {
  auto model = Transformer::load(kData + "/vit-tiny");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto cases = SafeTensorsFile::open(kData + "/vit-tiny/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  ModelInput in;
  in.pixels = cases->get("c0.pixel_values").value();
  ForwardOptions opts;
  opts.all_hidden = true;
  auto out = model->forward(in, opts, nullptr);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  for (size_t i = 0; i < out->hidden.size(); ++i)
    EXPECT_LT(max_abs_diff(out->hidden[i], cases->get("c0.hidden." + std::to_string(i)).value()), 1e-4f) << i;
  EXPECT_LT(max_abs_diff(out->logits, cases->get("c0.logits").value()), 1e-4f);
}

TEST(FixtureTest, Gpt2GreedyGenerationMatchesHuggingFace) {
  auto model = Transformer::load(kData + "/gpt2-tiny");
  ASSERT_TRUE(model.ok());
  auto cases = SafeTensorsFile::open(kData + "/gpt2-tiny/cases.safetensors");
  ASSERT_TRUE(cases.ok());
  const auto prompt = ids_of(cases->get("generate.prompt").value());
  const auto want = ids_of(cases->get("generate.output").value());
  GenerateOptions g;
  g.max_new_tokens = static_cast<int64_t>(want.size() - prompt.size());
  auto got = generate(*model, prompt, g, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, want);
}

TEST(FixtureTest, KvCacheDecodeEqualsFullForward) {
  auto model = Transformer::load(kData + "/gpt2-tiny");
  ASSERT_TRUE(model.ok());
  std::vector<int64_t> ids = {5, 17, 300, 2, 99, 41, 7};
  ModelInput full{ids, {}, {}};
  auto ref = model->forward(full, {}, nullptr);
  ASSERT_TRUE(ref.ok());
  // Prefill 4 tokens, then decode the rest one at a time.
  KvCache cache = model->make_cache(static_cast<int64_t>(ids.size())).value();
  Workspace ws;
  core::Tensor last;
  for (size_t pos = 0; pos < ids.size();) {
    const size_t n = pos == 0 ? 4 : 1;
    ModelInput step{{ids.begin() + pos, ids.begin() + pos + n}, {}, {}};
    auto x = model->embed(step, static_cast<int64_t>(pos));
    ASSERT_TRUE(x.ok());
    for (int64_t l = 0; l < model->config().layers; ++l) model->layer(l, *x, static_cast<int64_t>(pos), &cache, ws, nullptr);
    model->finish_hidden(*x, nullptr);
    last = *x;
    pos += n;
  }
  const int64_t F = model->config().hidden;
  for (int64_t j = 0; j < F; ++j)
    EXPECT_NEAR(last.f32()[j], ref->hidden.back().f32()[(static_cast<int64_t>(ids.size()) - 1) * F + j], 1e-5f);
}

}  // namespace
}  // namespace tessera::model
