// Local links are measured through the transport the run will use: CURVE
// encrypted unless the run is insecure (encrypting and decrypting a message
// is part of its transfer time), paced by the emulated link either way.
#include "runtime/cluster_profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "runtime/deployment.h"

namespace tessera::runtime {
namespace {

TEST(LocalLinksTest, MeasuredEncryptedOrNotAndNeverFasterThanTheEmulatedLink) {
  for (const bool secure : {true, false}) {
    auto links = measure_local_links(3, "1gbit,0.2ms", secure);
    ASSERT_TRUE(links.ok()) << secure << ": " << links.status().to_string();
    ASSERT_EQ(links->size(), 3u);
    for (size_t a = 0; a < 3; ++a) {
      ASSERT_EQ((*links)[a].size(), 3u);
      for (size_t b = 0; b < 3; ++b) {
        if (a == b) continue;
        const planner::LinkProfile& l = (*links)[a][b];
        // Pacing only ever delays a message: a slow machine measures less, never more.
        EXPECT_GE(l.latency_ms, 0.2 * 0.95) << secure << " " << a << "->" << b;
        EXPECT_GT(l.bandwidth_mbps, 0) << secure;
        EXPECT_LE(l.bandwidth_mbps, 1000 * 1.05) << secure << " " << a << "->" << b;
      }
    }
  }
}

// Encrypting costs CPU time: the rate is positive and no faster than a
// memory copy could be (1 TB/s bounds any machine here).
TEST(LocalLinksTest, EncryptionHasACpuRate) {
  const auto gbps = measure_crypto_gbps();
  ASSERT_TRUE(gbps.ok()) << gbps.status().to_string();
  EXPECT_GT(gbps.value(), 0);
  EXPECT_LT(gbps.value(), 1000);
}

// --lossy on an F32 model may plan weights quantized at load: local devices
// are profiled with those types' kernels as well, every device with the
// same samples, and the F32 ones are the plain profile's. A --profile file
// is taken as it is.
TEST(LocalProfileTest, LossyTypesAddTheirOwnRatesOnEveryLocalDevice) {
  ClusterOptions o;
  o.model_dir = std::string(TESSERA_TEST_DATA) + "/gpt2-tiny";
  o.devices = 2;
  o.insecure = true;
  auto c = Cluster::open(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto cfg = model::load_config(o.model_dir);
  ASSERT_TRUE(cfg.ok());
  auto plain = c->profile(*cfg, 4);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  const std::vector<kernels::WeightType> types = {kernels::WeightType::kF32, kernels::WeightType::kQ8_0,
                                                  kernels::WeightType::kQ4_0};
  auto typed = c->profile(*cfg, 4, types);
  ASSERT_TRUE(typed.ok()) << typed.status().to_string();
  ASSERT_EQ(typed->size(), 2);
  for (int d = 0; d < 2; ++d) {
    std::set<kernels::WeightType> seen;
    size_t f32 = 0;
    for (const planner::GemmSample& g : typed->devices[static_cast<size_t>(d)].gemm) {
      seen.insert(g.type);
      f32 += g.type == kernels::WeightType::kF32;
    }
    EXPECT_EQ(seen, std::set<kernels::WeightType>(types.begin(), types.end())) << d;
    EXPECT_EQ(f32, plain->devices[static_cast<size_t>(d)].gemm.size()) << d;
    for (const planner::GemmSample& g : plain->devices[static_cast<size_t>(d)].gemm) EXPECT_EQ(g.type, kernels::WeightType::kF32);
  }
  EXPECT_EQ(typed->devices[0].to_json()["gemm"], typed->devices[1].to_json()["gemm"]);
  // A profile file: as it is.
  const std::string file = (std::filesystem::temp_directory_path() / ("tessera-typed-" + std::to_string(::getpid()) + ".json")).string();
  ASSERT_TRUE(plain->save(file).ok());
  o.profile_file = file;
  auto given = Cluster::open(o);
  ASSERT_TRUE(given.ok()) << given.status().to_string();
  auto read = given->profile(*cfg, 4, types);
  std::filesystem::remove(file);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  for (const auto& dev : read->devices)
    for (const planner::GemmSample& g : dev.gemm) EXPECT_EQ(g.type, kernels::WeightType::kF32);
}

// A generation's prefill and decode step are priced on profiles of
// different row counts: local links are measured once for both, so the two
// plans see one link (two measurements of an emulated link differ), and one
// host.
TEST(LocalProfileTest, EveryRowCountsProfileHasTheSameLinks) {
  ClusterOptions o;
  o.model_dir = std::string(TESSERA_TEST_DATA) + "/gpt2-tiny";
  o.devices = 3;
  o.insecure = true;
  o.link = "1gbit,0.2ms";
  auto c = Cluster::open(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto cfg = model::load_config(o.model_dir);
  ASSERT_TRUE(cfg.ok());
  auto prefill = c->profile(*cfg, 8);
  auto step = c->profile(*cfg, 1);
  ASSERT_TRUE(prefill.ok()) << prefill.status().to_string();
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  ASSERT_EQ(prefill->links.size(), 3u);
  for (size_t a = 0; a < 3; ++a)
    for (size_t b = 0; b < 3; ++b) {
      if (a == b) continue;
      EXPECT_GE(prefill->links[a][b].latency_ms, 0.2 * 0.95) << a << "->" << b;
      EXPECT_EQ(prefill->links[a][b].latency_ms, step->links[a][b].latency_ms) << a << "->" << b;
      EXPECT_EQ(prefill->links[a][b].bandwidth_mbps, step->links[a][b].bandwidth_mbps) << a << "->" << b;
    }
  // They share this machine's memory bandwidth, which each profile measured.
  for (const auto* p : {&prefill.value(), &step.value()})
    for (const auto& d : p->devices) {
      EXPECT_EQ(d.host, 0);
      EXPECT_GT(d.host_stream_gbps, 0);
    }
}

}  // namespace
}  // namespace tessera::runtime
