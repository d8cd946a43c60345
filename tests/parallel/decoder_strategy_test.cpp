// The decoder fixtures (Llama, Qwen2, Qwen3, OPT) under every strategy of the registry, 1..4
// ranks as threads with uneven partitions: a strategy either reproduces the
// reference's last hidden state within 1e-4, or refuses the plan with a
// reason before anything runs. Single, pipeline, tp and galaxy must accept;
// their greedy generation with a grouped KV cache equals the reference's.
#include <gtest/gtest.h>

#include <string>

#include "fixtures.h"
#include "generate_check.h"
#include "model/safetensors.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"

namespace tessera::parallel {
namespace {

using testing::kData;
using testing::make_plan;
using testing::max_diff;
using testing::run_threads;

const char* const kFixtures[] = {"llama-tiny",      "qwen2-tiny", "qwen3-tiny",     "qwen3-mqa-tiny",
                                 "llama3rope-tiny", "opt-tiny",   "opt-postln-tiny"};

class DecoderStrategyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderStrategyTest, ReproducesTheReferenceOrRefusesBeforeRunning) {
  const std::vector<std::vector<double>> partitions[] = {{{1}}, {{1, 1}, {3, 1}}, {{1, 1, 1}, {1, 0, 2}}, {{1, 1, 1, 1}, {4, 1, 2, 1}}};
  int ran = 0;
  for (const char* fixture : kFixtures) {
    const std::string dir = kData + "/" + fixture;
    const auto cfg = model::load_config(dir).value();
    auto cases = model::SafeTensorsFile::open(dir + "/cases.safetensors").value();
    const std::string s = "s37";
    model::ModelInput in;
    in.ids = testing::ids_of(cases.get(s + ".input_ids").value());
    const core::Tensor want = cases.get(s + ".hidden." + std::to_string(cfg.layers)).value();
    const int kmax = GetParam() == "single" ? 1 : 4;
    for (int k = 1; k <= kmax; ++k)
      for (const auto& ratios : partitions[k - 1]) {
        Plan plan = make_plan(GetParam(), k, ratios);
        const core::Status st = complete_plan(plan, cfg);
        if (!st.ok()) {
          EXPECT_NE(GetParam(), "single") << st.to_string();
          EXPECT_NE(GetParam(), "pipeline") << st.to_string();
          EXPECT_EQ(st.message().find('\n'), std::string::npos);
          EXPECT_FALSE(st.message().empty());
          continue;
        }
        const auto got = run_threads(dir, plan, in);
        EXPECT_LT(max_diff(got.hidden, want), 1e-4f) << GetParam() << " " << fixture << " K=" << k << " ratios[0]=" << ratios[0];
        ++ran;
      }
  }
    // Single, pipeline, tp and galaxy run every fixture (tp and galaxy with
  // replicated K/V heads where devices outnumber them: qwen3-mqa-tiny has
  // one); OPT's layers are plain multi-head layers, so every exact strategy
  // runs the OPT ones.
  const std::string s = GetParam();
  if (s == "single") {
    EXPECT_EQ(ran, 7);
  } else if (s == "pipeline" || s == "tp" || s == "galaxy" || s == "sp" || s == "voltage") {
    EXPECT_EQ(ran, 7 * 7);
  } else {
    EXPECT_GE(ran, 2 * 7) << "the OPT fixtures at K = 1..4";
  }
}

std::vector<std::string> exact_strategies() {
  std::vector<std::string> out;
  for (const Strategy* s : strategies())
    if (s->exact()) out.push_back(s->name());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Registry, DecoderStrategyTest, ::testing::ValuesIn(exact_strategies()),
                         [](const auto& info) { return info.param; });

// Every strategy that decodes, K = 2..4: the greedy continuation equals the
// reference's (a GQA KV cache of each device's K/V heads for tp and galaxy).
TEST(DecoderStrategyTest, GreedyGenerationEqualsTheReference) {
  int ran = 0;
  for (const Strategy* strategy : strategies())
  for (const char* fixture : kFixtures) {
    if (!strategy->decodes() || !strategy->exact() || strategy->name() == single_device_plan().strategy) continue;
    const std::string dir = kData + "/" + fixture;
    auto cases = model::SafeTensorsFile::open(dir + "/cases.safetensors").value();
    const auto prompt = testing::ids_of(cases.get("generate.prompt").value());
    const auto want = testing::ids_of(cases.get("generate.output").value());
    model::GenerateOptions opts;
    opts.greedy = true;
    opts.max_new_tokens = static_cast<int64_t>(want.size() - prompt.size());
    for (int k = 2; k <= 4; ++k) {
      Plan plan = make_plan(strategy->name(), k, k == 3 ? std::vector<double>{1, 2, 1} : std::vector<double>{});
      const auto cfg = model::load_config(dir).value();
      if (!complete_plan(plan, cfg).ok()) {
        EXPECT_TRUE(cfg.llama_style()) << strategy->name() << " refused " << fixture;
        continue;
      }
      ++ran;
      auto models = runtime::load_rank_models(dir, plan);
      ASSERT_TRUE(models.ok()) << models.status().to_string();
      auto got = runtime::generate_in_process(plan, *models, prompt, opts);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(*got, want) << strategy->name() << " " << fixture << " K=" << k;
    }
  }
  EXPECT_EQ(ran, 3 * 7 * 3) << "pipeline, tp and galaxy on every fixture";
}

}  // namespace
}  // namespace tessera::parallel

namespace tessera::parallel {
namespace {

// PRISM's segment means have no single rotary position: RoPE models are
// refused with that reason; OPT (learned positions) is accepted.
TEST(DecoderStrategyTest, PrismRefusesRotaryModelsWithTheReason) {
  for (const char* fixture : kFixtures) {
    const auto cfg = model::load_config(kData + "/" + fixture).value();
    Plan plan = make_plan("prism", 2, {}, {{"rate", 2.0}});
    const core::Status st = complete_plan(plan, cfg);
    if (cfg.llama_style()) {
      ASSERT_FALSE(st.ok()) << fixture;
      EXPECT_NE(st.message().find("position"), std::string::npos) << st.to_string();
    } else {
      EXPECT_TRUE(st.ok()) << fixture << ": " << st.to_string();
    }
  }
}

}  // namespace
}  // namespace tessera::parallel
