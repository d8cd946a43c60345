// Every strategy of the registry equals the single-device outputs on the
// Hugging Face fixtures, for 1..4 ranks as threads (run_in_process), uneven
// partitions, N < K; the per-layer communication volume of each strategy;
// and a test-only strategy added with one registration line runs like the
// built-in ones.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "fixtures.h"
#include "replicate_strategy.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"

namespace tessera::parallel {
namespace {

using testing::fixture_input;
using testing::kData;
using testing::max_diff;
using testing::run_threads;
using testing::RunOut;
using testing::make_plan;

std::vector<std::string> exact_strategies() {
  std::vector<std::string> out;
  for (const Strategy* s : strategies())
    if (s->exact()) out.push_back(s->name());
  return out;
}

struct Case {
  const char* family;
  const char* input;
};

class StrategyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StrategyTest, EqualsSingleDeviceOnFixtures) {
  const Case cases[] = {{"bert-tiny", "s33"}, {"bert-tiny", "s1"}, {"gpt2-tiny", "s13"}, {"gpt2-tiny", "s1"}, {"vit-tiny", "c0"}};
  for (const auto& c : cases) {
    const std::string dir = kData + "/" + c.family;
    const auto in = fixture_input(c.family, c.input);
    auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    const std::vector<std::vector<double>> partitions[] = {{{1}}, {{1, 1}, {3, 1}}, {{1, 1, 1}, {1, 0, 2}}, {{1, 1, 1, 1}, {4, 1, 2, 1}}};
    const int kmax = GetParam() == "single" ? 1 : 4;
    for (int k = 1; k <= kmax; ++k)
      for (const auto& ratios : partitions[k - 1]) {
        const RunOut got = run_threads(dir, make_plan(GetParam(), k, ratios), in);
        EXPECT_LT(max_diff(got.hidden, single.hidden.back()), 1e-4f)
            << GetParam() << " " << c.family << " " << c.input << " K=" << k << " ratios[0]=" << ratios[0];
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, StrategyTest, ::testing::ValuesIn(exact_strategies()),
                         [](const auto& info) { return info.param; });

TEST(StrategyTest, VoltageBothOrdersAgree) {
  const std::string dir = kData + "/gpt2-tiny";
  const auto in = fixture_input("gpt2-tiny", "s40");
  auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  for (bool adaptive : {false, true})
    for (bool overlap : {false, true}) {
      // P = 10 of N = 40: Theorem 2 picks Eq. (8) for F = 64, F_H = 16.
      EXPECT_TRUE(voltage_prefers_eq8(10, 40, 64, 16));
      const Plan plan = make_plan("voltage", 4, {}, {{"adaptive_order", adaptive}, {"overlap", overlap}});
      EXPECT_LT(max_diff(run_threads(dir, plan, in).hidden, single.hidden.back()), 1e-4f) << adaptive << overlap;
    }
}

TEST(StrategyTest, PipelineBackAndForth) {
  const std::string dir = kData + "/bert-tiny";
  const auto in = fixture_input("bert-tiny", "s7");
  auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  const Plan plan = make_plan("pipeline", 3, {}, {{"layer_map", "0-0:2,1-1:1"}});
  EXPECT_LT(max_diff(run_threads(dir, plan, in).hidden, single.hidden.back()), 1e-4f);
}

// Per layer and device: TP 4(K-1)NF/K, SP 2(K-1)NF/K, Voltage (K-1)NF/K;
// Galaxy as TP, in two ReduceScatters and two AllGathers.
TEST(StrategyTest, CommunicationVolumePerLayer) {
  const std::string dir = kData + "/bert-tiny";  // F = 64, 2 layers
  model::ModelInput in;
  for (int i = 0; i < 24; ++i) in.ids.push_back(i + 5);
  const int64_t n = 24, F = 64, L = 2;
  for (int k : {2, 3, 4}) {
    auto tp = run_threads(dir, make_plan("tp", k), in);
    auto sp = run_threads(dir, make_plan("sp", k), in);
    auto vo = run_threads(dir, make_plan("voltage", k), in);
    auto ga = run_threads(dir, make_plan("galaxy", k), in);
    for (int r = 0; r < k; ++r) {
      const auto& t = tp.stats[static_cast<size_t>(r)].elements_sent;
      const auto& s = sp.stats[static_cast<size_t>(r)].elements_sent;
      const auto& v = vo.stats[static_cast<size_t>(r)].elements_sent;
      EXPECT_EQ(t[static_cast<size_t>(CollectiveKind::kAllreduce)], L * 4 * (k - 1) * n * F / k) << k;
      EXPECT_EQ(s[static_cast<size_t>(CollectiveKind::kAllgather)], L * 2 * (k - 1) * n * F / k) << k;
      // Voltage: one AllGather per layer but the last, which is a gather to the terminal.
      EXPECT_EQ(v[static_cast<size_t>(CollectiveKind::kAllgather)], (L - 1) * (k - 1) * n * F / k) << k;
      EXPECT_EQ(v[static_cast<size_t>(CollectiveKind::kGather)], r == 0 ? 0 : n * F / k) << k;
      const auto& g = ga.stats[static_cast<size_t>(r)].elements_sent;
      EXPECT_EQ(g[static_cast<size_t>(CollectiveKind::kAllgather)], L * 2 * (k - 1) * n * F / k) << k;
      EXPECT_EQ(g[static_cast<size_t>(CollectiveKind::kReduceScatter)], L * 2 * (k - 1) * n * F / k) << k;
      EXPECT_EQ(g[static_cast<size_t>(CollectiveKind::kAllgather)] + g[static_cast<size_t>(CollectiveKind::kReduceScatter)],
                t[static_cast<size_t>(CollectiveKind::kAllreduce)]) << k;
    }
  }
}

TEST(StrategyTest, PlanRoundTripsThroughJson) {
  auto cfg = model::load_config(kData + "/bert-tiny").value();
  for (const Strategy* s : strategies()) {
    Plan p = make_plan(s->name(), s->name() == "single" ? 1 : 3, s->name() == "single" ? std::vector<double>{} : std::vector<double>{2, 1, 1});
    if (s->name() == "prism") p.options = {{"rate", 2.0}};
    ASSERT_TRUE(complete_plan(p, cfg).ok()) << s->name();
    auto back = Plan::from_json(nlohmann::json::parse(p.to_json().dump()));
    ASSERT_TRUE(back.ok()) << s->name();
    EXPECT_EQ(back->to_json(), p.to_json()) << s->name();
    Plan again = *back;
    ASSERT_TRUE(complete_plan(again, cfg).ok()) << s->name();
    EXPECT_EQ(again.to_json(), p.to_json()) << s->name() << ": completing twice changes the plan";
  }
}

TEST(StrategyTest, PlansAreCheckedByTheirStrategy) {
  auto cfg = model::load_config(kData + "/bert-tiny").value();
  Plan unknown = make_plan("warp", 2);
  EXPECT_FALSE(complete_plan(unknown, cfg).ok());
  Plan foreign = make_plan("sp", 2, {}, {{"rate", 4}});  // PRISM's option
  EXPECT_FALSE(complete_plan(foreign, cfg).ok());
  Plan single_many = make_plan("single", 2);
  EXPECT_FALSE(complete_plan(single_many, cfg).ok());
  Plan bad_ratios = make_plan("voltage", 2, {1, -1});
  EXPECT_FALSE(complete_plan(bad_ratios, cfg).ok());
  Plan huge_ratios = make_plan("tp", 2, {1e308, 1e308});  // their sum is infinite
  EXPECT_FALSE(complete_plan(huge_ratios, cfg).ok());
  Plan bad_type = make_plan("voltage", 2, {}, {{"overlap", "yes"}});
  EXPECT_FALSE(complete_plan(bad_type, cfg).ok());
  for (int chunks : {0, kMaxTileStreams + 1}) {
    Plan bad_chunks = make_plan("voltage", 2, {}, {{"chunks", chunks}});
    EXPECT_FALSE(complete_plan(bad_chunks, cfg).ok()) << chunks;
  }
  EXPECT_FALSE(Plan::from_json(nlohmann::json{{"strategy", 3}, {"world", 2}}).ok());
  EXPECT_FALSE(Plan::from_json(nlohmann::json{{"strategy", "tp"}, {"world", 1000}}).ok());
  EXPECT_FALSE(Plan::from_json(nlohmann::json{{"strategy", "tp"}, {"world", 2}, {"options", 5}}).ok());
}

TEST(StrategyTest, TheSingleDevicePlanIsTheRegistrysOneDeviceStrategy) {
  auto cfg = model::load_config(kData + "/bert-tiny").value();
  Plan one = single_device_plan();
  EXPECT_EQ(one.world, 1);
  EXPECT_NE(find_strategy(one.strategy), nullptr);
  EXPECT_TRUE(is_single_device(one));
  ASSERT_TRUE(complete_plan(one, cfg).ok());
  EXPECT_TRUE(is_single_device(one));
  EXPECT_FALSE(is_single_device(make_plan("tp", 1)));
  Plan many = single_device_plan();
  many.world = 2;
  EXPECT_FALSE(is_single_device(many));
}

TEST(StrategyTest, ATestOnlyStrategyRunsInProcess) {
  register_strategy(std::make_unique<testing::Replicate>());
  ASSERT_NE(find_strategy("test-replicate"), nullptr);
  const std::string dir = kData + "/gpt2-tiny";
  const auto in = fixture_input("gpt2-tiny", "s13");
  auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  const RunOut got = run_threads(dir, make_plan("test-replicate", 3), in);
  EXPECT_LT(max_diff(got.hidden, single.hidden.back()), 1e-4f);
  auto sched = estimate(make_plan("test-replicate", 3), model::load_config(dir).value(), 13);
  ASSERT_TRUE(sched.ok());
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(sched->devices[static_cast<size_t>(r)].bytes_sent(),
              4 * got.stats[static_cast<size_t>(r)].elements_sent[static_cast<size_t>(CollectiveKind::kBroadcast)]);
}

}  // namespace
}  // namespace tessera::parallel
