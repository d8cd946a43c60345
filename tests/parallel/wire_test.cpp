// A compressed wire (--wire f16|q8, core/wire_format.h) with ranks as
// threads: the trained copy model keeps its task when tp, galaxy and
// pipeline generate with every activation sent as f16 or q8 (decode steps
// included); every rank of an AllReduce holds the same bits; and a plan
// carries its wire in JSON only when it is not f32.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "fixtures.h"
#include "generate_check.h"
#include "model/generate.h"
#include "parallel/local_group.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"

namespace tessera::parallel {
namespace {

using core::WireType;
using testing::kData;
using testing::make_plan;

// The copy task on `plan`, ranks as threads.
double copy_accuracy(const Plan& plan, int cases) {
  auto models = runtime::load_rank_models(kData + "/gpt2-copy", plan);
  EXPECT_TRUE(models.ok()) << models.status().to_string();
  if (!models.ok()) return 0.0;
  return testing::copy_accuracy(cases, [&](const std::vector<int64_t>& prompt, const model::GenerateOptions& opts) {
    return runtime::generate_in_process(plan, *models, prompt, opts);
  });
}

TEST(Wire, TheTrainedCopyModelKeepsItsTaskOnALossyWire) {
  const auto cfg = model::load_config(kData + "/gpt2-copy").value();
  for (const WireType w : {WireType::kF16, WireType::kQ8})
    for (const std::string strategy : {"tp", "galaxy", "pipeline"}) {
      Plan plan = make_plan(strategy, 3, {1, 2, 1});
      plan.wire = w;
      ASSERT_TRUE(complete_plan(plan, cfg).ok());
      const double acc = copy_accuracy(plan, 6);
      std::printf("copy accuracy %s wire %s: %.4f\n", strategy.c_str(), core::wire_type_name(w), acc);
      EXPECT_GE(acc, 0.99) << strategy << " " << core::wire_type_name(w);
    }
}

// Every rank ends an AllReduce, an AllGather and a broadcast with the same
// values (the sender keeps what the others decode), and the sum is within
// the encoding's error of the exact one.
TEST(Wire, EveryRankHoldsTheSameBits) {
  const int k = 3;
  const int64_t n = 96;
  for (const WireType w : {WireType::kF16, WireType::kQ8}) {
    LocalGroup group(k);
    std::vector<std::vector<float>> sums(k), gathered(k), bcast(k);
    std::vector<std::thread> threads;
    for (int r = 0; r < k; ++r)
      threads.emplace_back([&, r] {
        auto sync = group.member(r);
        sync->set_wire(w);
        auto& s = sums[static_cast<size_t>(r)];
        for (int64_t i = 0; i < n; ++i) s.push_back(std::sin(static_cast<float>(r * n + i)) * (1.0f + static_cast<float>(r)));
        EXPECT_TRUE(sync->allreduce_sum(s).ok());
        std::vector<float> mine(32, 0.1f * static_cast<float>(r + 1) + 0.013f);
        auto& all = gathered[static_cast<size_t>(r)];
        all.assign(static_cast<size_t>(32 * k), 0.0f);
        EXPECT_TRUE(sync->allgather_rows(mine, {1, 1, 1}, 32, all).ok());
        auto& b = bcast[static_cast<size_t>(r)];
        b.assign(40, 0.0f);
        if (r == 1)
          for (size_t i = 0; i < b.size(); ++i) b[i] = 0.37f * static_cast<float>(i) - 3.0f;
        EXPECT_TRUE(sync->broadcast(b, 1).ok());
      });
    for (auto& t : threads) t.join();
    for (int r = 1; r < k; ++r) {
      EXPECT_EQ(sums[static_cast<size_t>(r)], sums[0]) << core::wire_type_name(w);
      EXPECT_EQ(gathered[static_cast<size_t>(r)], gathered[0]) << core::wire_type_name(w);
      EXPECT_EQ(bcast[static_cast<size_t>(r)], bcast[0]) << core::wire_type_name(w);
    }
    float worst = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      float exact = 0.0f;
      for (int r = 0; r < k; ++r) exact += std::sin(static_cast<float>(r * n + i)) * (1.0f + static_cast<float>(r));
      worst = std::max(worst, std::fabs(exact - sums[0][static_cast<size_t>(i)]));
    }
    // Three ranks' values below 6 in magnitude: q8 steps of about 6/127.
    EXPECT_LT(worst, w == WireType::kQ8 ? 0.1f : 0.01f) << core::wire_type_name(w);
    EXPECT_GT(worst, 0.0f) << "a lossy wire that changed nothing: " << core::wire_type_name(w);
  }
}

TEST(Wire, PlansCarryTheirWire) {
  Plan plan = make_plan("tp", 2);
  EXPECT_FALSE(plan.to_json().contains("wire"));
  plan.wire = WireType::kQ8;
  const auto j = plan.to_json();
  EXPECT_EQ(j.at("wire"), "q8");
  EXPECT_EQ(Plan::from_json(j).value().wire, WireType::kQ8);
  auto bad = j;
  bad["wire"] = "q3";
  EXPECT_FALSE(Plan::from_json(bad).ok());
  bad["wire"] = 8;
  EXPECT_FALSE(Plan::from_json(bad).ok());
}

}  // namespace
}  // namespace tessera::parallel
