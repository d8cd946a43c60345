// The block parallelism strategy (DeTransformer): every plan equals the single
// device on decoupled models for K = 1..4, N = 2 and 4, uneven sub-block
// counts, original layers first, last and in between; decoupled layers send
// nothing and original layers exactly their plan's collectives; each device
// loads only what its plan needs; auto is priced on profiles.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>

#include "fixtures.h"
#include "model/gen_model.h"
#include "model/transformer.h"
#include "parallel/strategy.h"
#include "planner/variants.h"
#include "runtime/in_process.h"

namespace tessera::parallel {
namespace {

using testing::kData;
using testing::make_plan;
using testing::max_diff;
using testing::run_threads;

const char* const kPlans[] = {"tp", "sp", "allgather", "auto"};

// A tiny decoupled model written by gen-model (h = 64, 4 heads, FFN 128).
std::string decoupled_model(const std::string& preset, int64_t div, std::vector<int64_t> original) {
  std::string name = preset + "-bp" + std::to_string(div);
  for (int64_t l : original) {
    name += '-';
    name += std::to_string(l);
  }
  // Per process: ctest runs the tests of this file side by side.
  const std::string dir = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "-" + name;
  model::GenModelOptions o;
  o.preset = preset;
  o.out_dir = dir;
  o.layers = 4;
  o.hidden = 64;
  o.heads = 4;
  o.vocab = 512;
  o.intermediate = 128;
  o.labels = 3;
  o.seed = 7;
  o.bp_div = div;
  o.bp_original = std::move(original);
  const auto st = model::gen_model(o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return dir;
}

model::ModelInput ids(int64_t n) {
  model::ModelInput in;
  for (int64_t i = 0; i < n; ++i) in.ids.push_back((i * 37 + 11) % 500);
  return in;
}

TEST(BpTest, EveryPlanEqualsTheSingleDevice) {
  const std::vector<std::string> dirs = {
      kData + "/bert-bp-tiny",                        // N = 2, original 1, 3
      kData + "/gpt2-bp-tiny",                        // N = 2, original 1, 3
      decoupled_model("bert-base", 4, {1, 3}),        // N = 4, the last layer original
      decoupled_model("gpt2", 4, {0, 2}),             // the first layer original, the last decoupled
      decoupled_model("bert-base", 4, {}),            // no original layer
  };
  const std::vector<std::vector<double>> partitions[] = {{{1}}, {{1, 1}, {3, 1}}, {{1, 1, 1}, {1, 0, 2}}, {{1, 1, 1, 1}, {4, 1, 2, 1}}};
  for (const auto& dir : dirs)
    for (int64_t n : {11, 2}) {  // 2 rows: SP leaves devices without rows
      const auto in = ids(n);
      const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
      for (const char* p : kPlans)
        for (int k = 1; k <= 4; ++k)
          for (const auto& ratios : partitions[k - 1]) {
            const auto got = run_threads(dir, make_plan("bp", k, ratios, {{"plan", p}}), in);
            EXPECT_LT(max_diff(got.hidden, single.hidden.back()), 1e-4f)
                << dir << " n=" << n << " plan " << p << " K=" << k << " ratios[0]=" << ratios[0];
          }
    }
}

// ViT comes for free (pre-LN like GPT-2, not causal); no reference fixture, so
// against the single device only.
TEST(BpTest, DecoupledVitEqualsTheSingleDevice) {
  const std::string dir = decoupled_model("vit-base", 2, {1});
  const auto cfg = model::load_config(dir).value();
  model::ModelInput in;
  in.pixels = core::Tensor::zeros_f32({1, cfg.channels, cfg.image_size, cfg.image_size});
  for (int64_t i = 0; i < in.pixels.numel(); ++i) in.pixels.f32()[i] = static_cast<float>((i * 37) % 255) / 127.5f - 1.0f;
  const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  for (const char* p : kPlans)
    EXPECT_LT(max_diff(run_threads(dir, make_plan("bp", 3, {}, {{"plan", p}}), in).hidden, single.hidden.back()), 1e-4f) << p;
}

TEST(BpTest, OrdinaryModelsRunEveryLayerAsOriginal) {
  const std::string dir = kData + "/bert-tiny";
  const auto in = testing::fixture_input("bert-tiny", "s33");
  const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  for (const char* p : kPlans)
    EXPECT_LT(max_diff(run_threads(dir, make_plan("bp", 3, {2, 1, 1}, {{"plan", p}}), in).hidden, single.hidden.back()), 1e-4f) << p;
}

int64_t sent(const SyncStats& s, CollectiveKind k) { return s.elements_sent[static_cast<size_t>(k)]; }

// N = 4, h = 64, K = 2 equal devices (two sub-blocks each), n = 24: a device's
// slices are n*h/2 floats. Layers D O D O (original 1 and 3).
TEST(BpTest, DecoupledLayersSendNothingAndOriginalLayersTheirPlansCollectives) {
  const std::string dir = decoupled_model("bert-base", 4, {1, 3});
  const int64_t n = 24, H = 64, half = n * H / 2;
  const auto in = ids(n);
  using K = CollectiveKind;
  for (const char* p : {"tp", "sp", "allgather"}) {
    const auto got = run_threads(dir, make_plan("bp", 2, {}, {{"plan", p}}), in);
    ASSERT_EQ(got.stats.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const auto& s = got.stats[static_cast<size_t>(r)];
      // Entry: the terminal sends the other device its slices; nothing else scatters.
      EXPECT_EQ(sent(s, K::kScatter), r == 0 ? half : 0) << p << " rank " << r;
      int64_t allgather = 2 * half, allreduce = 0, gather = 0;  // one AllGather of the slices per original layer
      if (std::string(p) == "tp") allreduce = 2 * 2 * n * H;  // two AllReduce per original layer; ring: n*H each for K = 2
      if (std::string(p) == "sp") {
        allgather += 2 * 2 * half + half;  // K and V in both original layers, the output rows after layer 1
        gather = r == 0 ? 0 : half;        // after the last layer, the rows go to the terminal only
      }
      EXPECT_EQ(sent(s, K::kAllgather), allgather) << p << " rank " << r;
      EXPECT_EQ(sent(s, K::kAllreduce), allreduce) << p << " rank " << r;
      EXPECT_EQ(sent(s, K::kGather), gather) << p << " rank " << r;
      EXPECT_EQ(sent(s, K::kBroadcast) + sent(s, K::kReduceScatter) + sent(s, K::kSendRecv), 0) << p;
    }
  }
  // No original layer: the slices go out and come back, nothing else.
  const std::string all_decoupled = decoupled_model("bert-base", 4, {});
  const auto got = run_threads(all_decoupled, make_plan("bp", 2, {}, {{"plan", "tp"}}), in);
  for (int r = 0; r < 2; ++r) {
    const auto& s = got.stats[static_cast<size_t>(r)];
    EXPECT_EQ(s.total_elements(), half) << r;
    EXPECT_EQ(sent(s, K::kScatter), r == 0 ? half : 0);
    EXPECT_EQ(sent(s, K::kGather), r == 0 ? 0 : half);
  }
}

// estimate() sends what run() sends, per rank and collective, for every plan,
// K = 1..4 and uneven shares.
TEST(BpTest, EstimateEqualsTheCountedElements) {
  const std::vector<std::string> dirs = {kData + "/gpt2-bp-tiny", decoupled_model("bert-base", 4, {1, 3}),
                                         decoupled_model("gpt2", 4, {0, 2})};
  const std::vector<double> partitions[] = {{1}, {3, 1}, {1, 0, 2}, {4, 1, 2, 1}};
  const int64_t n = 13;
  for (const auto& dir : dirs) {
    const auto cfg = model::load_config(dir).value();
    for (const char* p : {"tp", "sp", "allgather"})
      for (int k = 1; k <= 4; ++k) {
        Plan plan = make_plan("bp", k, partitions[k - 1], {{"plan", p}});
        ASSERT_TRUE(complete_plan(plan, cfg).ok());
        const auto sched = estimate(plan, cfg, n).value();
        const auto got = run_threads(dir, plan, ids(n));
        ASSERT_EQ(got.stats.size(), static_cast<size_t>(k));
        for (int r = 0; r < k; ++r)
          for (int kind = 0; kind < static_cast<int>(CollectiveKind::kCount); ++kind)
            EXPECT_EQ(got.stats[static_cast<size_t>(r)].elements_sent[static_cast<size_t>(kind)] * 4,
                      sched.devices[static_cast<size_t>(r)].bytes_sent(static_cast<CollectiveKind>(kind)))
                << dir << " " << p << " K=" << k << " rank " << r << " " << collective_name(static_cast<CollectiveKind>(kind));
      }
  }
}

TEST(BpTest, EachDeviceLoadsOnlyWhatItsPlanNeeds) {
  const std::string dir = decoupled_model("bert-base", 4, {1, 3});
  const auto cfg = model::load_config(dir).value();
  size_t bytes[3] = {};
  int64_t estimated[3] = {};
  int i = 0;
  for (const char* p : {"tp", "sp", "allgather"}) {
    Plan plan = make_plan("bp", 3, {}, {{"plan", p}});
    ASSERT_TRUE(complete_plan(plan, cfg).ok());
    auto models = runtime::load_rank_models(dir, plan).value();
    const auto& w = models[1].weights();  // sub-block 2 of 4 (2, 1, 1)
    for (int64_t l : {0, 2})
      for (int64_t b = 0; b < 4; ++b)
        EXPECT_EQ(w.layers[static_cast<size_t>(l)].blocks[static_cast<size_t>(b)].qkv_w.empty(), b != 2) << p << " " << l << " " << b;
    EXPECT_TRUE(w.word_emb.empty());
    estimated[i] = estimate(plan, cfg, 8).value().devices[1].weight_bytes;  // unpacked: panels pad the loaded ones
    bytes[i++] = w.bytes();
  }
  EXPECT_LT(bytes[0], bytes[1]);   // TP: a shard of each original layer
  EXPECT_EQ(bytes[1], bytes[2]);   // SP and AllGather: the whole original layers
  EXPECT_LT(estimated[0], estimated[1]);
  EXPECT_EQ(estimated[1], estimated[2]);
}

TEST(BpTest, AutoIsPricedOnTheProfiles) {
  const std::string dir = decoupled_model("bert-base", 4, {1, 3});
  const auto cfg = model::load_config(dir).value();
  auto profile = [](double mbps, int64_t memory) {
    planner::DeviceProfile d;
    d.gemm = {{64, 256, 256, 0.05}};  // slow devices: compute dominates unless the link is slower
    d.attention_gflops = 0.05;
    d.elementwise_gbps = 10;
    d.stream_gbps = 10;
    d.memory_bytes = memory;
    planner::ClusterProfile p;
    p.devices.assign(2, d);
    p.links.assign(2, std::vector<planner::LinkProfile>(2, planner::LinkProfile{0.1, mbps}));
    p.links[0][0] = p.links[1][1] = {};
    return p;
  };
  Plan plan = make_plan("bp", 2);
  ASSERT_TRUE(complete_plan(plan, cfg).ok());
  EXPECT_EQ(plan.options["plan"], "auto");
  // A slow link: the plan with one AllGather per original layer.
  auto slow = planner::choose_variant(plan, cfg, profile(1, 0), 128);
  ASSERT_TRUE(slow.ok()) << slow.status().to_string();
  EXPECT_EQ(slow->plan.options["plan"], "allgather");
  EXPECT_EQ(slow->sums.size(), 3u);
  for (const auto& s : slow->sums) EXPECT_GE(s.sum_ms, slow->sums[static_cast<size_t>(slow->chosen)].sum_ms);
  EXPECT_TRUE(slow->plan.options["auto_ms"].contains("tp"));
  // A fast link: the work split over the devices wins.
  auto fast = planner::choose_variant(plan, cfg, profile(1e6, 0), 128);
  ASSERT_TRUE(fast.ok());
  EXPECT_NE(fast->plan.options["plan"], "allgather");
  // Memory: a budget only the TP shards fit.
  const auto tp_need = [&] {
    Plan t = make_plan("bp", 2, {}, {{"plan", "tp"}});
    EXPECT_TRUE(complete_plan(t, cfg).ok());
    const auto s = estimate(t, cfg, 128).value();
    return std::max(s.devices[0].weight_bytes + s.devices[0].activation_bytes, s.devices[1].weight_bytes + s.devices[1].activation_bytes);
  }();
  auto tight = planner::choose_variant(plan, cfg, profile(1, tp_need), 128);
  ASSERT_TRUE(tight.ok()) << tight.status().to_string();
  EXPECT_EQ(tight->plan.options["plan"], "tp");
  EXPECT_FALSE(planner::choose_variant(plan, cfg, profile(1, 1000), 128).ok());  // nothing fits
  // Decided plans round-trip and run.
  Plan again = tight->plan;
  ASSERT_TRUE(complete_plan(again, cfg).ok());
  EXPECT_EQ(again.to_json(), tight->plan.to_json());
}

TEST(BpTest, BadPlansAndOtherStrategiesOnDecoupledModels) {
  const auto cfg = model::load_config(kData + "/bert-bp-tiny").value();
  Plan bad = make_plan("bp", 2, {}, {{"plan", "ring"}});
  const auto st = complete_plan(bad, cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tp, sp, allgather or auto"), std::string::npos);
  for (const char* s : {"tp", "sp", "voltage", "galaxy", "prism", "pipeline"}) {
    Plan p = make_plan(s, 2);
    const auto r = complete_plan(p, cfg);
    ASSERT_FALSE(r.ok()) << s;
    EXPECT_NE(r.message().find("decoupled"), std::string::npos) << r.message();
  }
}

}  // namespace
}  // namespace tessera::parallel
