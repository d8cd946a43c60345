// Every strategy equals the single-device outputs on the Hugging Face
// fixtures, for 1..4 ranks as threads (LocalGroup), uneven partitions, N < K;
// and the per-layer communication volume of each strategy.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <thread>

#include "model/safetensors.h"
#include "model/transformer.h"
#include "parallel/local_group.h"
#include "parallel/strategy.h"
#include "fixtures.h"

namespace tessera::parallel {
namespace {

using testing::fixture_input;
using testing::kData;
using testing::max_diff;

struct RunOut {
  core::Tensor hidden;  // as HF's last hidden state
  std::vector<SyncStats> stats;
};

using Wrap = std::function<std::unique_ptr<Synchronizer>(std::unique_ptr<Synchronizer>)>;

// Runs `plan` with one thread per rank, each with its own (sharded) model;
// `wrap`, if given, wraps each rank's synchronizer.
RunOut run_threads(const std::string& dir, Plan plan, const model::ModelInput& in, const Wrap& wrap = nullptr) {
  auto cfg = model::load_config(dir);
  EXPECT_TRUE(cfg.ok());
  EXPECT_TRUE(complete_plan(plan, *cfg).ok());
  LocalGroup group(plan.world);
  RunOut out;
  out.stats.resize(static_cast<size_t>(plan.world));
  std::vector<std::thread> threads;
  std::vector<core::Status> status(static_cast<size_t>(plan.world));
  for (int r = 0; r < plan.world; ++r) {
    threads.emplace_back([&, r] {
      auto sync = wrap ? wrap(group.member(r)) : group.member(r);
      auto m = model::Transformer::load(dir, load_options(plan, *cfg, r));
      if (!m.ok()) {
        status[static_cast<size_t>(r)] = m.status();
        return;
      }
      core::Tensor x;
      int64_t n = 0;
      if (r == 0) {
        x = m->embed(in).value();
      }
      n = in.pixels.empty() ? static_cast<int64_t>(in.ids.size()) : m->config().max_rows();
      auto y = run_layers(*m, plan, *sync, x, n, nullptr);
      if (!y.ok()) {
        status[static_cast<size_t>(r)] = y.status();
        return;
      }
      if (r == 0) {
        m->finish_hidden(*y, nullptr);
        out.hidden = *y;
      }
      out.stats[static_cast<size_t>(r)] = sync->stats();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : status) EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

// Forwards to a LocalGroup member but answers next_tile_ready from a script
// (bit i of `pattern` for the i-th question), so a test can choose which
// tiles seem to be in already and which are still on the link.
class ScriptedArrivals final : public Synchronizer {
 public:
  ScriptedArrivals(std::unique_ptr<Synchronizer> inner, uint64_t pattern, std::atomic<int>* asked)
      : inner_(std::move(inner)), pattern_(pattern), asked_(asked) {}
  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  bool next_tile_ready() const override {
    ++*asked_;
    return (pattern_ >> (mine_++ % 64)) & 1;
  }
  core::Status allgather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all) override {
    return inner_->allgather_rows(mine, counts, cols, all);
  }
  core::Status gather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all,
                           int root) override {
    return inner_->gather_rows(mine, counts, cols, all, root);
  }
  core::Status scatter_rows(const float* all, const std::vector<int64_t>& counts, int64_t cols, float* mine,
                            int root) override {
    return inner_->scatter_rows(all, counts, cols, mine, root);
  }
  core::Status reduce_scatter_rows(const float* full, const std::vector<int64_t>& counts, int64_t cols,
                                   float* mine) override {
    return inner_->reduce_scatter_rows(full, counts, cols, mine);
  }
  core::Status allreduce_sum(float* data, int64_t n) override { return inner_->allreduce_sum(data, n); }
  core::Status broadcast(float* data, int64_t n, int root) override { return inner_->broadcast(data, n, root); }
  core::Status send(int peer, const float* data, int64_t n) override { return inner_->send(peer, data, n); }
  core::Status recv(int peer, float* data, int64_t n) override { return inner_->recv(peer, data, n); }

 private:
  std::unique_ptr<Synchronizer> inner_;
  uint64_t pattern_;
  std::atomic<int>* asked_;  // questions of all ranks
  mutable int mine_ = 0;
};

struct Case {
  const char* family;
  const char* input;
};

// Voltage projects K and V of a block at once or later, depending on whether
// the next block seems to be in; every mix gives the same output.
TEST(StrategyTest, VoltageEqualsSingleDeviceWhicheverTilesAreIn) {
  for (const Case c : {Case{"bert-tiny", "s33"}, Case{"gpt2-tiny", "s13"}}) {
    const std::string dir = kData + "/" + c.family;
    const auto in = fixture_input(c.family, c.input);
    auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    for (int k = 2; k <= 4; ++k)
      for (const uint64_t pattern : {uint64_t{0}, ~uint64_t{0}, uint64_t{0x5555555555555555}, uint64_t{0x3c3c0f0f3c3c0f0f}}) {
        Plan plan;
        plan.strategy = Strategy::kVoltage;
        plan.world = k;
        plan.adaptive_order = false;
        plan.ratios = k == 3 ? std::vector<double>{2, 0, 1} : std::vector<double>{};
        std::atomic<int> asked{0};
        const RunOut got = run_threads(dir, plan, in, [&](std::unique_ptr<Synchronizer> s) {
          return std::make_unique<ScriptedArrivals>(std::move(s), pattern, &asked);
        });
        EXPECT_LT(max_diff(got.hidden, single.hidden.back()), 1e-4f)
            << c.family << " K=" << k << " pattern=" << std::hex << pattern;
        EXPECT_GT(asked.load(), 0) << "Voltage never asked whether a tile was in";
      }
  }
}

class StrategyTest : public ::testing::TestWithParam<Strategy> {};

TEST_P(StrategyTest, EqualsSingleDeviceOnFixtures) {
  const Case cases[] = {{"bert-tiny", "s33"}, {"bert-tiny", "s1"}, {"gpt2-tiny", "s13"}, {"gpt2-tiny", "s1"}, {"vit-tiny", "c0"}};
  for (const auto& c : cases) {
    const std::string dir = kData + "/" + c.family;
    const auto in = fixture_input(c.family, c.input);
    auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    const std::vector<std::vector<double>> partitions[] = {{{1}}, {{1, 1}, {3, 1}}, {{1, 1, 1}, {1, 0, 2}}, {{1, 1, 1, 1}, {4, 1, 2, 1}}};
    for (int k = 1; k <= 4; ++k)
      for (const auto& ratios : partitions[k - 1]) {
        Plan plan;
        plan.strategy = GetParam();
        plan.world = k;
        plan.ratios = ratios;
        const RunOut got = run_threads(dir, plan, in);
        EXPECT_LT(max_diff(got.hidden, single.hidden.back()), 1e-4f)
            << strategy_name(GetParam()) << " " << c.family << " " << c.input << " K=" << k << " ratios[0]=" << ratios[0];
      }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, StrategyTest,
                         ::testing::Values(Strategy::kTp, Strategy::kSp, Strategy::kVoltage, Strategy::kPipeline,
                                           Strategy::kGalaxy),
                         [](const auto& info) { return std::string(strategy_name(info.param)); });

TEST(StrategyTest, VoltageBothOrdersAgree) {
  const std::string dir = kData + "/gpt2-tiny";
  const auto in = fixture_input("gpt2-tiny", "s40");
  auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  for (bool adaptive : {false, true}) {
    Plan plan;
    plan.strategy = Strategy::kVoltage;
    plan.world = 4;  // P = 10 of N = 40: Theorem 2 picks Eq. (8) for F = 64, F_H = 16
    plan.adaptive_order = adaptive;
    EXPECT_TRUE(voltage_prefers_eq8(10, 40, 64, 16));
    EXPECT_LT(max_diff(run_threads(dir, plan, in).hidden, single.hidden.back()), 1e-4f) << adaptive;
  }
}

TEST(StrategyTest, PipelineBackAndForth) {
  const std::string dir = kData + "/bert-tiny";
  const auto in = fixture_input("bert-tiny", "s7");
  auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  Plan plan;
  plan.strategy = Strategy::kPipeline;
  plan.world = 3;
  plan.layers = parse_layer_map("0-0:2,1-1:1", 2, 3).value();
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
    Plan plan;
    plan.world = k;
    plan.strategy = Strategy::kTp;
    auto tp = run_threads(dir, plan, in);
    plan.strategy = Strategy::kSp;
    auto sp = run_threads(dir, plan, in);
    plan.strategy = Strategy::kVoltage;
    auto vo = run_threads(dir, plan, in);
    plan.strategy = Strategy::kGalaxy;
    auto ga = run_threads(dir, plan, in);
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

}  // namespace
}  // namespace tessera::parallel
