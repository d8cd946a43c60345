// The ILP against an exact reference (every assignment), and the unit chain
// of a model against the strategy's own estimates.
#include "planner/ilp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "parallel/strategy.h"
#include "planner/cost_model.h"

namespace tessera::planner {
namespace {

// A random instance priced with Eq. 1-3: device speeds (GFLOP/s) and memory
// bandwidths, links (latency, bandwidth, some pairs without a link), units
// (FLOPs, weights, output bytes), and budgets from roomy to impossible.
IlpProblem random_problem(std::mt19937_64& rng) {
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); };
  IlpProblem pr;
  pr.devices = pick(2, 4);
  const int units = pick(3, 10);
  std::vector<double> gflops, gbps;
  for (int d = 0; d < pr.devices; ++d) gflops.push_back(uni(1, 100)), gbps.push_back(uni(1, 20));
  std::vector<std::vector<double>> lat(pr.devices, std::vector<double>(pr.devices)), mbps = lat;
  for (int a = 0; a < pr.devices; ++a)
    for (int b = 0; b < pr.devices; ++b) lat[a][b] = uni(0.05, 5), mbps[a][b] = pick(0, 9) == 0 ? 0 : uni(50, 2000);
  auto add = [&](std::string name, int pin, double gflop, int64_t weights, int64_t out) {
    IlpUnit u;
    u.name = std::move(name);
    u.pinned = pin;
    u.model_unit = pin < 0 ? static_cast<int64_t>(pr.units.size()) : -1;
    u.weight_bytes = weights;
    u.out_bytes = out;
    for (int d = 0; d < pr.devices; ++d) {
      u.compute_ms.push_back(gflop / gflops[static_cast<size_t>(d)] * 1e3);
      u.load_ms.push_back(static_cast<double>(weights) / (gbps[static_cast<size_t>(d)] * 1e9) * 1e3);
    }
    pr.units.push_back(std::move(u));
  };
  const int64_t in = pick(1, 100) * 1000;
  add("source", 0, 0, 0, in);
  add("embedding", 0, uni(0, 0.5), pick(0, 50) << 20, pick(1, 100) << 14);
  int64_t total = 0;
  for (int l = 0; l < units; ++l) {
    const int64_t w = static_cast<int64_t>(uni(1, 60)) << 20;
    total += w;
    add("unit " + std::to_string(l), -1, uni(0.1, 20), w, static_cast<int64_t>(uni(1, 400)) << 10);
  }
  add("head", 0, uni(0, 5), 0, 4096);
  add("destination", 0, 0, 0, 0);
  pr.xfer_ms.assign(pr.units.size() - 1, std::vector<std::vector<double>>(pr.devices, std::vector<double>(pr.devices, 0.0)));
  for (size_t l = 0; l + 1 < pr.units.size(); ++l)
    for (int a = 0; a < pr.devices; ++a)
      for (int b = 0; b < pr.devices; ++b)
        if (a != b)
          pr.xfer_ms[l][a][b] = mbps[a][b] > 0 ? lat[a][b] + static_cast<double>(pr.units[l].out_bytes) * 8 / (mbps[a][b] * 1e6) * 1e3
                                               : std::numeric_limits<double>::infinity();
  // Budgets: a share of the total between "about a device's fair part" and
  // "everything"; sometimes negative (activations alone do not fit) or none.
  const double scale = uni(0.15, 1.2);
  for (int d = 0; d < pr.devices; ++d) {
    const int kind = pick(0, 9);
    if (kind == 0) pr.budget.push_back(std::numeric_limits<double>::infinity());
    else if (kind == 1) pr.budget.push_back(-1.0);
    else pr.budget.push_back(static_cast<double>(total) * scale * uni(0.5, 1.0) + static_cast<double>(pr.units[1].weight_bytes) * (d == 0));
  }
  return pr;
}

TEST(Ilp, EqualsBruteForceOn200RandomInstances) {
  std::mt19937_64 rng(13);
  int infeasible = 0, split = 0;
  for (int i = 0; i < 200; ++i) {
    const IlpProblem pr = random_problem(rng);
    const IlpResult ref = brute_force(pr);
    auto got = solve_ilp(pr, {});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    SCOPED_TRACE("instance " + std::to_string(i) + ": " + std::to_string(pr.devices) + " devices, " +
                 std::to_string(pr.units.size()) + " units; " + got->summary());
    if (ref.status == IlpStatus::kInfeasible) {
      ++infeasible;
      EXPECT_EQ(got->status, IlpStatus::kInfeasible);
      continue;
    }
    ASSERT_EQ(got->status, IlpStatus::kOptimal);
    ASSERT_TRUE(assignment_feasible(pr, got->device_of_unit));
    // Both sides' T recomputed from their assignments, not CBC's objective.
    const double t_ilp = assignment_cost(pr, got->device_of_unit).total();
    const double t_ref = assignment_cost(pr, ref.device_of_unit).total();
    EXPECT_NEAR(t_ilp, t_ref, 1e-9 * t_ref);
    for (int d : got->device_of_unit) split += d != 0;
  }
  // The generator covers both outcomes, and plans that use other devices.
  EXPECT_GT(infeasible, 5);
  EXPECT_LT(infeasible, 150);
  EXPECT_GT(split, 50);
}

TEST(Ilp, WarmStartAndTimeLimitKeepTheOptimum) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) {
    const IlpProblem pr = random_problem(rng);
    const IlpResult ref = brute_force(pr);
    if (ref.status != IlpStatus::kOptimal) continue;
    IlpOptions o;
    o.warm_start = ref.device_of_unit;
    auto got = solve_ilp(pr, o);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->status, IlpStatus::kOptimal);
    EXPECT_NEAR(got->objective_ms, ref.objective_ms, 1e-9 * ref.objective_ms);
  }
}

TEST(Ilp, PinnedUnitsOverTheirDeviceBudgetAreInfeasible) {
  std::mt19937_64 rng(3);
  IlpProblem pr = random_problem(rng);
  pr.budget[0] = static_cast<double>(pr.units[1].weight_bytes) - 1;  // the embedding does not fit
  auto got = solve_ilp(pr, {});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, IlpStatus::kInfeasible);
  EXPECT_EQ(brute_force(pr).status, IlpStatus::kInfeasible);
}

TEST(Ilp, MalformedProblemIsAnError) {
  IlpProblem pr;
  pr.devices = 2;
  EXPECT_FALSE(solve_ilp(pr, {}).ok());
  std::mt19937_64 rng(5);
  pr = random_problem(rng);
  pr.units[2].compute_ms.pop_back();
  EXPECT_FALSE(solve_ilp(pr, {}).ok());
}

model::ModelConfig gpt2_config(int64_t layers) {
  return model::parse_config(R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4,
      "n_inner": 256, "vocab_size": 1000, "n_positions": 128, "n_layer": )" + std::to_string(layers) + "}")
      .value();
}

ClusterProfile two_devices(double speed1, double mbps) {
  ClusterProfile p;
  for (int d = 0; d < 2; ++d) {
    DeviceProfile dev;
    dev.gemm = {{32, 64, 64, 10}, {32, 64, 256, 20}};
    dev.attention_gflops = 5;
    dev.elementwise_gbps = 5;
    dev.stream_gbps = 10;
    dev.speed = d == 0 ? 1.0 : speed1;
    p.devices.push_back(dev);
  }
  p.links = {{{}, {1.0, mbps}}, {{1.0, mbps}, {}}};
  return p;
}

TEST(UnitChain, PseudoLayersArePinnedAndUnitsComeFromTheEstimate) {
  const auto c = gpt2_config(3);
  const auto* pipe = parallel::find_strategy("pipeline");
  ASSERT_NE(pipe, nullptr);
  for (const auto g : {UnitGranularity::kLayers, UnitGranularity::kBlocks}) {
    auto pr = build_unit_chain(*pipe, c, two_devices(0.5, 1000), 32, g);
    ASSERT_TRUE(pr.ok()) << pr.status().to_string();
    const size_t model_units = g == UnitGranularity::kBlocks ? 6 : 3;
    ASSERT_EQ(pr->units.size(), model_units + 4);
    for (size_t i : {size_t{0}, size_t{1}, pr->units.size() - 2, pr->units.size() - 1}) EXPECT_EQ(pr->units[i].pinned, 0);
    // Every model unit's FLOPs, weights and output: the strategy's estimate of
    // the whole model on device 1 has their sums.
    parallel::Plan plan;
    plan.strategy = "pipeline";
    plan.world = 2;
    pipe->apply_partition(plan, {{}, {}, std::vector<int>(model_units, 1), g == UnitGranularity::kBlocks});
    ASSERT_TRUE(parallel::complete_plan(plan, c).ok());
    const auto s = parallel::estimate(plan, c, 32);
    ASSERT_TRUE(s.ok());
    double ms = 0;
    for (const auto& ph : s->devices[1].phases)
      for (const auto& w : ph.work) ms += work_ms(w, two_devices(0.5, 1000).devices[1]);
    double sum_ms = 0;
    int64_t sum_w = 0;
    for (const auto& u : pr->units)
      if (u.model_unit >= 0) {
        sum_ms += u.compute_ms[1];
        sum_w += u.weight_bytes;
        EXPECT_EQ(u.out_bytes, 32 * 64 * 4);
        EXPECT_GT(u.compute_ms[1], u.compute_ms[0]);  // device 1 runs at half speed
      }
    EXPECT_NEAR(sum_ms, ms, 1e-9 * ms);
    if (g == UnitGranularity::kLayers) EXPECT_EQ(sum_w, s->devices[1].weight_bytes);
    else EXPECT_GE(sum_w, s->devices[1].weight_bytes);  // a block alone carries its layer's norms
    // The head's LM projection is ~2·rows·F·vocab FLOPs on the terminal.
    EXPECT_GT(pr->units[pr->units.size() - 2].compute_ms[0], 0);
  }
}

TEST(UnitChain, SlowLinkKeepsEverythingOnTheTerminalAndFastLinkUsesAFasterDevice) {
  const auto c = gpt2_config(4);
  const auto* pipe = parallel::find_strategy("pipeline");
  // Device 1 is 4x faster than the terminal (speed 1 vs 0.25 on device 0).
  auto fast_helper = [&](double mbps) {
    ClusterProfile p = two_devices(1.0, mbps);
    p.devices[0].speed = 0.25;
    auto pr = build_unit_chain(*pipe, c, p, 32, UnitGranularity::kLayers).value();
    return solve_ilp(pr, {}).value();
  };
  const IlpResult slow = fast_helper(0.01), fast = fast_helper(100000);
  EXPECT_EQ(slow.status, IlpStatus::kOptimal);
  for (int d : slow.device_of_unit) EXPECT_EQ(d, 0);
  int on1 = 0;
  for (int d : fast.device_of_unit) on1 += d == 1;
  EXPECT_EQ(on1, 4);
}

TEST(UnitChain, BudgetsForceASplitThatNoDeviceAloneCanHold) {
  const auto c = gpt2_config(6);
  const auto* pipe = parallel::find_strategy("pipeline");
  ClusterProfile p = two_devices(1.0, 1000);
  auto roomy = build_unit_chain(*pipe, c, p, 32, UnitGranularity::kLayers).value();
  int64_t layer_bytes = 0;
  for (const auto& u : roomy.units) layer_bytes += u.model_unit >= 0 ? u.weight_bytes : 0;
  const int64_t term = roomy.units[1].weight_bytes;
  // Each device holds a bit more than half of the layers (the terminal also its own weights).
  for (int d = 0; d < 2; ++d) p.devices[d].memory_bytes = layer_bytes * 6 / 10 + (d == 0 ? term : 0) + (128 << 10);  // + activations
  auto pr = build_unit_chain(*pipe, c, p, 32, UnitGranularity::kLayers).value();
  auto got = solve_ilp(pr, {}).value();
  ASSERT_EQ(got.status, IlpStatus::kOptimal);
  EXPECT_NEAR(got.objective_ms, brute_force(pr).objective_ms, 1e-9 * got.objective_ms);
  int on1 = 0;
  for (int d : got.device_of_unit) on1 += d == 1;
  EXPECT_GE(on1, 2);
  EXPECT_LE(on1, 4);
}

TEST(UnitChain, WritesTheModelInLpFormat) {
  const auto c = gpt2_config(2);
  auto pr = build_unit_chain(*parallel::find_strategy("pipeline"), c, two_devices(1.0, 1000), 32, UnitGranularity::kLayers).value();
  IlpOptions o;
  o.lp_file = ::testing::TempDir() + "/ilp_test_model.lp";
  auto got = solve_ilp(pr, o);
  ASSERT_TRUE(got.ok());
  FILE* f = std::fopen(o.lp_file.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_NE(text.find("x_2_1"), std::string::npos);
  EXPECT_NE(text.find("y_0_0_1"), std::string::npos);
}

}  // namespace
}  // namespace tessera::planner
