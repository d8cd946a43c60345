// `tessera run --strategy prism` with real worker processes on loopback: with
// R = 1 it equals the single device (causal GPT-2 and uneven partitions
// included), and --stats accounts (P-1) L F elements per device per layer
// plus each device's GFLOPs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/io.h"
#include "model/safetensors.h"
#include "parallel/prism.h"
#include "runtime/job.h"

#include "cli_util.h"

namespace tessera {
namespace {

using testing::CmdResult;
using testing::kBin;
using testing::kData;
using testing::run;
using testing::tmp;
const auto max_diff = testing::dump_max_diff;

struct Input {
  const char* model;
  std::string args;
};

TEST(PrismProcessTest, RateOneEqualsSingleDeviceWithProcesses) {
  auto vit = model::SafeTensorsFile::open(kData + "/vit-tiny/cases.safetensors").value();
  const std::string pixels = tmp("pixels.safetensors");
  ASSERT_TRUE(model::write_safetensors(pixels, {{"pixel_values", vit.get("c0.pixel_values").value()}}).ok());
  const Input inputs[] = {{"bert-tiny", "--ids 3,14,15,92,65,35,89 --token-types 0,0,0,1,1,1,1"},
                          {"gpt2-tiny", "--ids 5,6,7,8,9,10,11,12,13,14,15"},
                          {"gpt2-tiny", "--ids 42"},  // N < K
                          {"vit-tiny", "--pixels " + pixels}};
  for (const auto& in : inputs) {
    const std::string dir = kData + "/" + in.model;
    const std::string ref = tmp("ref.safetensors");
    ASSERT_EQ(run("run --model " + dir + " " + in.args + " --dump " + ref).code, 0);
    for (const std::string& devices : {std::string("2"), std::string("2 --partition 3,1"), std::string("3"),
                                       std::string("3 --partition 1,0,2")}) {
      const std::string got = tmp("got.safetensors");
      auto r = run("run --model " + dir + " " + in.args + " --strategy prism --cr 1 --devices " + devices + " --dump " + got);
      ASSERT_EQ(r.code, 0) << devices << ": " << r.err;
      EXPECT_LT(max_diff(ref, got, "hidden.2"), 1e-4f) << in.model << " " << devices;
      EXPECT_LT(max_diff(ref, got, "logits"), 1e-4f) << in.model << " " << devices;
    }
  }
}

// Per layer and device: PRISM (P-1) L F elements in the AllGather of means,
// Voltage (P-1) N F / P; the last layer is a gather to the terminal in both.
TEST(PrismProcessTest, StatsAccountMeansAndFlops) {
  const int64_t n = 24, F = 64, layers = 2;
  std::string ids;
  for (int i = 0; i < n; ++i) {
    if (i > 0) ids += ',';
    ids += std::to_string(i + 3);
  }
  auto stats = [&](const std::string& args) {
    auto r = run("run --model " + kData + "/bert-tiny --ids " + ids + " " + args + " --stats");
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  for (int k : {2, 3}) {
    std::string dev = " --devices ";
    dev += std::to_string(k);
    const auto vo = stats("--strategy voltage" + dev);
    const auto cr4 = stats("--strategy prism --cr 4" + dev);
    const auto seg2 = stats("--strategy prism --segments 2" + dev);
    const int64_t l4 = n / k / 4;
    for (int rank = 0; rank < k; ++rank) {
      EXPECT_EQ(vo["ranks"][rank]["elements_sent_by_kind"]["allgather"], (layers - 1) * (k - 1) * n * F / k);
      EXPECT_EQ(cr4["ranks"][rank]["elements_sent_by_kind"]["allgather"], (layers - 1) * (k - 1) * l4 * F);
      EXPECT_EQ(cr4["ranks"][rank]["bytes_sent_by_kind"]["allgather"], 4 * (layers - 1) * (k - 1) * l4 * F);
      EXPECT_EQ(seg2["ranks"][rank]["elements_sent_by_kind"]["allgather"], (layers - 1) * (k - 1) * 2 * F);
      EXPECT_GT(cr4["ranks"][rank]["gflops"].get<double>(), 0.0);
      EXPECT_LT(cr4["ranks"][rank]["gflops"].get<double>(), vo["ranks"][rank]["gflops"].get<double>());
      EXPECT_TRUE(cr4["ranks"][rank].contains("bytes_per_layer"));
    }
    EXPECT_EQ(cr4["strategy"], "prism");
  }
  // Exactly one of --cr and --segments.
  EXPECT_NE(run("run --model " + kData + "/bert-tiny --ids " + ids + " --strategy prism --devices 2").code, 0);
  EXPECT_NE(run("run --model " + kData + "/bert-tiny --ids " + ids + " --strategy voltage --cr 2 --devices 2").code, 0);
}

TEST(PrismProcessTest, JobCarriesTheRateToWorkers) {
  runtime::JobSpec job;
  job.endpoints = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"};
  job.insecure = true;
  job.model_dir = "gpt2-tiny";
  job.plan.strategy = "prism";
  job.plan.world = 2;
  job.plan.options = {{"rate", 9.9}};
  auto back = runtime::JobSpec::from_json(job.to_json().dump());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->plan.options["rate"], 9.9);
  const auto cfg = model::load_config(kData + "/gpt2-tiny").value();
  const auto plan = back->completed_plan(cfg);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->strategy, "prism");
  EXPECT_EQ(parallel::prism_rate(plan.value()), 9.9);
  job.plan.options = {{"segments", 4}};
  back = runtime::JobSpec::from_json(job.to_json().dump());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(parallel::prism_segments_option(back->completed_plan(cfg).value()), 4);
  job.plan.options = {{"segments", -1}};
  back = runtime::JobSpec::from_json(job.to_json().dump());
  ASSERT_TRUE(back.ok());  // the job's shape is fine; the strategy refuses the option
  EXPECT_FALSE(back->completed_plan(cfg).ok());
  job.plan.world = 3;  // the plan must cover exactly the job's devices
  EXPECT_FALSE(runtime::JobSpec::from_json(job.to_json().dump()).ok());
}

TEST(PrismProcessTest, FidelityReportsExactAgreementAtRateOne) {
  auto r = run("fidelity --model " + kData + "/gpt2-tiny --strategy prism --cr 1,4 --devices 3 --samples 3 --seq 20 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto nl = r.out.find('\n');
  const auto one = nlohmann::json::parse(r.out.substr(0, nl)), four = nlohmann::json::parse(r.out.substr(nl + 1));
  EXPECT_GT(one["cosine"].get<double>(), 0.999999);
  EXPECT_LT(one["max_abs_err"].get<double>(), 1e-4);
  EXPECT_EQ(one["top1_agreement"].get<double>(), 1.0);
  EXPECT_EQ(four["options"]["rate"].get<double>(), 4.0);
  EXPECT_GT(four["max_abs_err"].get<double>(), 1e-4);  // compression is not free
  EXPECT_EQ(four["samples"], 3);
}

}  // namespace
}  // namespace tessera
