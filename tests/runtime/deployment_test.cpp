// The deployment unit (runtime/deployment.h): a cluster parsed once with its
// budgets and speeds, a plan deployed over any subset of its devices (the
// members, the daemons in rank order, each member's budget and speed), the
// planner's choice mapped back to the cluster's devices, and the errors a
// user sees for a wrong setup. No process is started and nothing is measured:
// profiles come from a file.
#include "runtime/deployment.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <limits>

#include "core/io.h"
#include "temp_dir.h"

namespace tessera::runtime {
namespace {


// Budgets are decimal, as parse_bytes reads them.
constexpr int64_t kGB = 1000 * 1000 * 1000;
constexpr int64_t kMB = 1000 * 1000;

const std::string kModel = std::string(TESSERA_TEST_DATA) + "/bert-tiny";

// Its folder for the test's files.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("tessera-deploy-") {}
};

// A device whose kernels all run at `gflops`.
planner::DeviceProfile device(double gflops) {
  planner::DeviceProfile d;
  d.name = "synthetic";
  d.gemm = {{64, 256, 256, gflops}};
  d.attention_gflops = gflops;
  d.elementwise_gbps = 10;
  d.stream_gbps = 10;
  d.memory_bytes = int64_t{1} << 34;
  return d;
}

std::string profile_file(const TempDir& dir, int k) {
  planner::ClusterProfile p;
  for (int d = 0; d < k; ++d) p.devices.push_back(device(10));
  p.links.assign(static_cast<size_t>(k), std::vector<planner::LinkProfile>(static_cast<size_t>(k), {0.1, 1000}));
  for (int d = 0; d < k; ++d) p.links[static_cast<size_t>(d)][static_cast<size_t>(d)] = {};
  const std::string path = (dir.path / "profile.json").string();
  EXPECT_TRUE(p.save(path).ok());
  return path;
}

const char* kClusterToml = R"(
[terminal]
endpoint = "tcp://127.0.0.1:7100"
memory = "1GB"
[[worker]]
endpoint = "tcp://127.0.0.1:7070"
memory = "512MB"
[[worker]]
endpoint = "tcp://127.0.0.1:7080"
[[worker]]
endpoint = "tcp://127.0.0.1:7090"
memory = "2GB"
)";

TEST(DeploymentTest, ClusterFileParsedOnceWithBudgetsAndDevices) {
  TempDir dir;
  ClusterOptions o;
  o.model_dir = kModel;
  o.cluster_file = dir.file("c.toml", kClusterToml);
  o.insecure = true;
  auto c = Cluster::open(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->size(), 4);
  EXPECT_TRUE(c->has_daemons());
  EXPECT_EQ(c->devices()[0].name, "terminal");
  EXPECT_EQ(c->devices()[2].endpoint, "tcp://127.0.0.1:7080");
  const int64_t none = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(c->memory_limits(), (std::vector<int64_t>{kGB, 512 * kMB, none, 2 * kGB}));
  EXPECT_EQ(c->active(), (std::vector<int>{0, 1, 2, 3}));
  c->set_active(2, false);
  EXPECT_EQ(c->active(), (std::vector<int>{0, 1, 3}));

  // --memory-limit overrides the file's budgets, one per device.
  o.memory_limit = "1GB,1GB,1GB,1GB";
  auto over = Cluster::open(o);
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->memory_limits(), std::vector<int64_t>(4, kGB));
  o.memory_limit = "1GB,1GB";
  EXPECT_FALSE(Cluster::open(o).ok());

  // A secure cluster's daemons cannot be profiled without the key; the error says so.
  o.memory_limit.clear();
  o.insecure = false;
  auto keyless = Cluster::open(o);
  ASSERT_TRUE(keyless.ok()) << keyless.status().to_string();
  auto cfg = model::load_config(kModel);
  ASSERT_TRUE(cfg.ok());
  auto profile = keyless->profile(*cfg, 8);
  ASSERT_FALSE(profile.ok());
  EXPECT_NE(profile.status().message().find("--key"), std::string::npos);
}

// kClusterToml's four devices, the speeds 1, 0.5, 0.25, 1.
ClusterOptions four_devices(TempDir& dir) {
  ClusterOptions o;
  o.model_dir = kModel;
  o.cluster_file = dir.file("c.toml", kClusterToml);
  o.insecure = true;
  o.device_speed = "1,0.5,0.25,1";
  return o;
}

TEST(DeploymentTest, AFixedPlanRunsOnTheDevicesOfferedInRankOrder) {
  TempDir dir;
  ClusterOptions o = four_devices(dir);
  auto c = Cluster::open(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto cfg = model::load_config(kModel);
  ASSERT_TRUE(cfg.ok());
  DeployRequest r;
  r.plan.strategy = "tp";
  r.rows = 8;
  auto d = deploy(*c, *cfg, r, {0, 3, 1});
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->plan.world, 3);
  EXPECT_EQ(d->members, (std::vector<int>{0, 3, 1}));
  EXPECT_FALSE(d->chosen.has_value());
  const SessionOptions& s = d->session;
  EXPECT_EQ(s.model_dir, kModel);
  EXPECT_EQ(s.budget_rows, 8);
  ASSERT_TRUE(s.cluster.has_value());
  EXPECT_EQ(s.cluster->workers, (std::vector<std::string>{"tcp://127.0.0.1:7090", "tcp://127.0.0.1:7070"}));
  EXPECT_EQ(s.cluster->memory, (std::vector<int64_t>{kGB, 2 * kGB, 512 * kMB}));
  EXPECT_EQ(s.memory_limits, (std::vector<int64_t>{kGB, 2 * kGB, 512 * kMB}));
  EXPECT_EQ(s.device_speeds, (std::vector<double>{1, 1, 0.5}));
  EXPECT_EQ(s.plan.weights, kernels::WeightType::kF32);
  // Weights held quantized (--quantize on a folder): a fixed plan loads them
  // so on every rank (it ran in F32 before), unless it names a type itself.
  model::ModelConfig q8 = *cfg;
  q8.weights = kernels::WeightType::kQ8_0;
  auto quantized = deploy(*c, q8, r, {0, 3, 1});
  ASSERT_TRUE(quantized.ok()) << quantized.status().to_string();
  EXPECT_EQ(quantized->plan.weights, kernels::WeightType::kQ8_0);
  EXPECT_EQ(quantized->session.plan.weights, kernels::WeightType::kQ8_0);
  r.plan.weights = kernels::WeightType::kQ4_0;
  quantized = deploy(*c, q8, r, {0, 3, 1});
  ASSERT_TRUE(quantized.ok()) << quantized.status().to_string();
  EXPECT_EQ(quantized->plan.weights, kernels::WeightType::kQ4_0);
  r.plan.weights = kernels::WeightType::kF32;

  // The terminal alone: no daemon in the session.
  r.plan = parallel::single_device_plan();
  auto alone = deploy(*c, *cfg, r, {0});
  ASSERT_TRUE(alone.ok()) << alone.status().to_string();
  EXPECT_FALSE(alone->session.cluster.has_value());
  EXPECT_EQ(alone->session.plan.world, 1);

  // A pair's decode on more devices than are offered (after a failover) runs on all of them.
  r.plan.strategy = "voltage";
  parallel::Plan dp;
  dp.strategy = "tp";
  dp.world = 3;
  dp.ratios = {1, 1, 1};
  r.plan.decode = std::make_shared<const parallel::Plan>(dp);
  auto pair = deploy(*c, *cfg, r, {0, 3, 1});
  ASSERT_TRUE(pair.ok()) << pair.status().to_string();
  ASSERT_TRUE(pair->plan.decode);
  EXPECT_EQ(pair->plan.decode->world, 3);
  pair = deploy(*c, *cfg, r, {0, 1});
  ASSERT_TRUE(pair.ok()) << pair.status().to_string();
  EXPECT_EQ(pair->plan.decode->world, 2);
  EXPECT_TRUE(pair->plan.decode->ratios.empty());
  r.plan.decode.reset();

  // A partition must name every device; a deployment starts at the terminal.
  r.plan.strategy = "tp";
  r.plan.ratios = {0.5, 0.5};
  EXPECT_FALSE(deploy(*c, *cfg, r, {0, 1, 2}).ok());
  r.plan.ratios.clear();
  EXPECT_FALSE(deploy(*c, *cfg, r, {1, 2}).ok());
  EXPECT_FALSE(deploy(*c, *cfg, r, {0, 7}).ok());
}

// --device-order sets the order in which the devices take ranks (a pair
// decodes on the first): the active devices, a plan's members and their
// budgets and speeds follow it, a dropped device leaves it, and an order
// that is not every device once with the terminal first is refused.
TEST(DeploymentTest, DeviceOrderSetsTheRanks) {
  TempDir dir;
  ClusterOptions o = four_devices(dir);
  o.device_order = "0,3,1,2";
  auto c = Cluster::open(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->active(), (std::vector<int>{0, 3, 1, 2}));
  auto cfg = model::load_config(kModel);
  ASSERT_TRUE(cfg.ok());
  DeployRequest r;
  r.plan.strategy = "voltage";
  parallel::Plan dp;
  dp.strategy = "tp";
  dp.world = 2;
  r.plan.decode = std::make_shared<const parallel::Plan>(dp);
  r.rows = 8;
  auto d = deploy(*c, *cfg, r);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->members, (std::vector<int>{0, 3, 1, 2}));
  EXPECT_EQ(d->plan.decode->world, 2);
  ASSERT_TRUE(d->session.cluster.has_value());
  EXPECT_EQ(d->session.cluster->workers,
            (std::vector<std::string>{"tcp://127.0.0.1:7090", "tcp://127.0.0.1:7070", "tcp://127.0.0.1:7080"}));
  EXPECT_EQ(d->session.device_speeds, (std::vector<double>{1, 1, 0.5, 0.25}));
  const int64_t none = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(d->session.memory_limits, (std::vector<int64_t>{kGB, 2 * kGB, 512 * kMB, none}));
  c->set_active(3, false);
  EXPECT_EQ(c->active(), (std::vector<int>{0, 1, 2}));
  for (const char* bad : {"1,0,2,3", "0,1,1,2", "0,1,2", "0,1,2,4", "0,a,1,2"}) {
    o.device_order = bad;
    const auto refused = Cluster::open(o);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("--device-order"), std::string::npos) << refused.status().message();
  }
}

TEST(DeploymentTest, AutoMapsThePlannersMembersToTheClustersDevices) {
  TempDir dir;
  ClusterOptions o;
  o.model_dir = kModel;
  o.profile_file = profile_file(dir, 4);  // without a cluster file, the profile names the devices
  auto c = Cluster::open(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->size(), 4);
  EXPECT_FALSE(c->has_daemons());
  auto cfg = model::load_config(kModel);
  ASSERT_TRUE(cfg.ok());
  DeployRequest r;
  r.plan.strategy = "auto";
  r.rows = 16;
  // Devices 1 and 2 are down: the planner sees the terminal and device 3.
  c->set_active(1, false);
  c->set_active(2, false);
  auto d = deploy(*c, *cfg, r);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(d->chosen.has_value());
  EXPECT_EQ(d->chosen->members, d->members);
  EXPECT_EQ(d->members.front(), 0);
  for (int m : d->members) EXPECT_TRUE(m == 0 || m == 3) << m;
  EXPECT_EQ(d->plan.world, static_cast<int>(d->members.size()));
  EXPECT_EQ(d->planner_json()["members"], d->members);
  EXPECT_FALSE(d->session.cluster.has_value());

  // The plan table covers every device.
  planner::PlannerOptions po;
  po.rows = 16;
  auto t = plan_table(*c, *cfg, po);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_GE(t->chosen, 0);
}

TEST(DeploymentTest, InProcessOnlyForOnePlainLocalDevice) {
  ClusterOptions o;
  const std::string single = parallel::single_device_plan().strategy;
  EXPECT_TRUE(runs_in_process(o, single));
  EXPECT_FALSE(runs_in_process(o, "tp"));
  EXPECT_FALSE(runs_in_process(o, "auto"));
  o.device_speed = "0.5";  // the emulated speed is a session's
  EXPECT_FALSE(runs_in_process(o, single));
  o.device_speed.clear();
  o.memory_limit = "1GB";
  EXPECT_FALSE(runs_in_process(o, single));
  o.memory_limit.clear();
  o.devices = 2;
  EXPECT_FALSE(runs_in_process(o, single));
}

TEST(DeploymentTest, ListsAndRows) {
  EXPECT_EQ(parse_device_speeds("1,0.5", 2).value(), (std::vector<double>{1, 0.5}));
  EXPECT_FALSE(parse_device_speeds("1,0", 2).ok());
  EXPECT_FALSE(parse_device_speeds("1,0.001", 2).ok());  // below kMinDeviceSpeed: a kernel would idle 999 times its length
  EXPECT_TRUE(parse_device_speeds("1,0.01", 2).ok());
  EXPECT_FALSE(parse_device_speeds("1", 2).ok());
  EXPECT_FALSE(parse_memory_limits("1GB,x", 2).ok());
  auto cfg = model::load_config(kModel);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ(plan_rows(*cfg, 0), std::min<int64_t>(128, cfg->max_rows()));
  EXPECT_EQ(plan_rows(*cfg, 5), 5);
  EXPECT_EQ(request_rows(kModel, *cfg, "", 7).value(), 7);
  EXPECT_FALSE(request_rows(kModel, *cfg, "", 0).ok());
}

}  // namespace
}  // namespace tessera::runtime
