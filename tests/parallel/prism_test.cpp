// PRISM against the fixtures, ranks as threads (run_in_process): with R = 1 every
// segment is one row and PRISM is the exact model; with R > 1 it equals a
// direct single-process reading of the paper (means duplicated per Eq. 11 at
// the positions of the rows they stand for, ordinary causal mask); and the
// traffic is (P-1) L F elements per device per layer.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "parallel/local_group.h"
#include "parallel/prism.h"
#include "parallel/strategy.h"
#include "runtime/in_process.h"
#include "fixtures.h"

namespace tessera::parallel {
namespace {

using testing::fixture_input;
using testing::kData;
using testing::max_diff;
using testing::run_threads;
using testing::RunOut;

struct Case {
  const char* family;
  const char* input;
};
const Case kCases[] = {{"bert-tiny", "s33"}, {"bert-tiny", "s1"}, {"gpt2-tiny", "s13"}, {"gpt2-tiny", "s40"},
                       {"gpt2-tiny", "s1"},  {"vit-tiny", "c0"}};
const std::vector<double> kPartitions[] = {{1, 1}, {3, 1}, {1, 1, 1}, {1, 0, 2}, {2, 1, 3}};

Plan prism_plan(std::vector<double> ratios, double rate, int64_t segments = 0) {
  Plan p;
  p.strategy = "prism";
  p.world = static_cast<int>(ratios.size());
  p.ratios = std::move(ratios);
  if (rate != 0.0) p.options["rate"] = rate;
  if (segments != 0) p.options["segments"] = segments;
  return p;
}

TEST(PrismTest, RateOneEqualsSingleDeviceOnFixtures) {
  for (const auto& c : kCases) {
    const std::string dir = kData + "/" + c.family;
    const auto in = fixture_input(c.family, c.input);
    auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
    for (const auto& ratios : kPartitions) {
      EXPECT_LT(max_diff(run_threads(dir, prism_plan(ratios, 1.0), in).hidden, single.hidden.back()), 1e-4f)
          << c.family << " " << c.input << " P=" << ratios.size() << " ratios[0]=" << ratios[0];
      // As many segments as rows is the same thing.
      EXPECT_LT(max_diff(run_threads(dir, prism_plan(ratios, 0.0, 1000), in).hidden, single.hidden.back()), 1e-4f)
          << c.family << " " << c.input << " segments P=" << ratios.size();
    }
  }
}

// The paper read directly on one process: for partition p, the layer input
// with every other partition's rows replaced by their segment's mean (the
// duplicated matrix of Eq. 11, each copy at the position of the row it stands
// for), then the ordinary layer on p's rows with the ordinary causal mask.
core::Tensor duplicated_reference(const model::Transformer& m, const Plan& plan, core::Tensor x) {
  const auto& c = m.config();
  const int64_t n = x.dim(0), F = c.hidden;
  const PrismLayout lay = prism_layout(plan, n);
  model::Workspace ws;
  for (int64_t l = 0; l < c.layers; ++l) {
    core::Tensor next = x.clone();
    for (int p = 0; p < plan.world; ++p) {
      const Range mine = lay.rows[static_cast<size_t>(p)];
      if (mine.size() == 0) continue;
      core::Tensor tilde = x.clone();
      for (int q = 0; q < plan.world; ++q) {
        if (q == p) continue;
        const Range rq = lay.rows[static_cast<size_t>(q)];
        const auto& segs = lay.segments[static_cast<size_t>(q)];
        std::vector<float> means(segs.size() * static_cast<size_t>(F));
        segment_means_f32(x.f32() + rq.begin * F, F, segs, means.data());
        for (size_t s = 0; s < segs.size(); ++s)
          for (int64_t r = segs[s].begin; r < segs[s].end; ++r)
            std::copy(means.begin() + static_cast<int64_t>(s) * F, means.begin() + static_cast<int64_t>(s + 1) * F,
                      tilde.f32() + (rq.begin + r) * F);
      }
      const auto& w = m.weights().layers[static_cast<size_t>(l)];
      core::Tensor a = core::Tensor::zeros_f32({n, F}), qkv = core::Tensor::zeros_f32({n, 3 * F});
      core::Tensor ctx = core::Tensor::zeros_f32({mine.size(), F});
      m.layer_input(l, tilde.f32(), n, a.f32(), nullptr);
      kernels::linear_rows_f32(nullptr, a.f32(), n, w.qkv_w, w.qkv_b, kernels::Activation::kNone, nullptr, qkv.f32());
      kernels::AttentionArgs at;
      at.q = qkv.f32() + mine.begin * 3 * F; at.ldq = 3 * F; at.k = qkv.f32() + F; at.ldk = 3 * F;
      at.v = qkv.f32() + 2 * F; at.ldv = 3 * F; at.out = ctx.f32(); at.ldo = F;
      at.n_q = mine.size(); at.n_kv = n; at.heads = c.heads; at.head_dim = c.head_dim(); at.scale = m.attention_scale(l);
      at.causal = c.causal(); at.q_pos0 = mine.begin; at.kv_pos0 = 0;
      std::vector<float> scratch(static_cast<size_t>(kernels::attention_scratch_floats(mine.size(), n, c.heads)));
      kernels::attention_f32(nullptr, at, scratch.data(), static_cast<int64_t>(scratch.size()));
      m.layer_tail(l, x.f32() + mine.begin * F, ctx.f32(), mine.size(), next.f32() + mine.begin * F, ws, nullptr);
    }
    x = next;
  }
  m.finish_hidden(x, nullptr);
  return x;
}

TEST(PrismTest, CompressedEqualsTheDuplicatedMatrixReading) {
  float furthest_from_exact = 0;  // the means must matter, or this test shows nothing
  for (const auto& c : kCases) {
    const std::string dir = kData + "/" + c.family;
    const auto in = fixture_input(c.family, c.input);
    const auto m = model::Transformer::load(dir).value();
    const auto exact = m.forward(in, {}, nullptr).value().hidden.back();
    for (const auto& ratios : kPartitions)
      for (double rate : {2.0, 3.0, 4.5}) {
        Plan plan = prism_plan(ratios, rate);
        ASSERT_TRUE(complete_plan(plan, m.config()).ok());
        const core::Tensor want = duplicated_reference(m, plan, m.embed(in).value());
        const RunOut got = run_threads(dir, plan, in);
        EXPECT_LT(max_diff(got.hidden, want), 1e-4f)
            << c.family << " " << c.input << " P=" << ratios.size() << " ratios[0]=" << ratios[0] << " R=" << rate;
        furthest_from_exact = std::max(furthest_from_exact, max_diff(got.hidden, exact));
      }
  }
  EXPECT_GT(furthest_from_exact, 1e-2f);
}

TEST(PrismTest, SegmentsFollowEquationEight) {
  EXPECT_EQ(prism_segments(10, 3), (std::vector<Range>{{0, 3}, {3, 6}, {6, 10}}));  // last takes the remainder
  EXPECT_EQ(prism_segments(4, 4), (std::vector<Range>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(prism_segments(0, 3), std::vector<Range>{});
  EXPECT_EQ(prism_segment_count(64, 8.0, 0), 8);
  EXPECT_EQ(prism_segment_count(64, 9.9, 0), 6);
  EXPECT_EQ(prism_segment_count(5, 64.0, 0), 1);  // at least one mean
  EXPECT_EQ(prism_segment_count(0, 2.0, 0), 0);
  EXPECT_EQ(prism_segment_count(5, 0.0, 8), 5);   // no more means than rows
  EXPECT_EQ(prism_segment_count(50, 0.0, 8), 8);
  // Eq. 16 when partitions are equal: L = floor(N / (CR P)).
  for (int64_t n : {128, 197, 256})
    for (double cr : {2.0, 4.0, 8.0})
      EXPECT_EQ(prism_segment_count(n / 2, cr, 0), static_cast<int64_t>(std::floor(static_cast<double>(n / 2) / cr)));
  const float x[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 5 rows of 2
  float z[4];
  segment_means_f32(x, 2, {{0, 2}, {2, 5}}, z);
  EXPECT_FLOAT_EQ(z[0], 2.0f);
  EXPECT_FLOAT_EQ(z[1], 3.0f);
  EXPECT_FLOAT_EQ(z[2], 7.0f);
  EXPECT_FLOAT_EQ(z[3], 8.0f);
}

TEST(PrismTest, PlanNeedsExactlyOneOfRateAndSegments) {
  const auto cfg = model::load_config(kData + "/bert-tiny").value();
  Plan p = prism_plan({1, 1}, 0.0);
  EXPECT_FALSE(complete_plan(p, cfg).ok());
  p = prism_plan({1, 1}, 4.0, 3);
  EXPECT_FALSE(complete_plan(p, cfg).ok());
  p = prism_plan({1, 1}, 0.5);
  EXPECT_FALSE(complete_plan(p, cfg).ok());
  p = prism_plan({1, 1}, 4.0);
  EXPECT_TRUE(complete_plan(p, cfg).ok());
  p.strategy = "voltage";  // a rate means nothing to other strategies
  EXPECT_FALSE(complete_plan(p, cfg).ok());
  ASSERT_NE(find_strategy("prism"), nullptr);
  EXPECT_FALSE(find_strategy("prism")->exact());
}

// Per layer and device: PRISM (P-1) L F elements, Voltage (P-1) N F / P.
TEST(PrismTest, CommunicationVolumePerLayer) {
  const std::string dir = kData + "/bert-tiny";  // F = 64, 2 layers
  model::ModelInput in;
  for (int i = 0; i < 24; ++i) in.ids.push_back(i + 5);
  const int64_t n = 24, F = 64, layers = 2;
  for (int k : {2, 3}) {
    for (double rate : {1.0, 4.0}) {
      const int64_t np = n / k, l = static_cast<int64_t>(std::floor(static_cast<double>(np) / rate));
      const auto pr = run_threads(dir, prism_plan(std::vector<double>(static_cast<size_t>(k), 1.0), rate), in);
      Plan vplan;
      vplan.strategy = "voltage";
      vplan.world = k;
      const auto vo = run_threads(dir, vplan, in);
      for (int r = 0; r < k; ++r) {
        const auto& p = pr.stats[static_cast<size_t>(r)].elements_sent;
        const auto& v = vo.stats[static_cast<size_t>(r)].elements_sent;
        EXPECT_EQ(p[static_cast<size_t>(CollectiveKind::kAllgather)], (layers - 1) * (k - 1) * l * F) << k << " " << rate;
        EXPECT_EQ(v[static_cast<size_t>(CollectiveKind::kAllgather)], (layers - 1) * (k - 1) * n * F / k) << k;
        // First distribution: the terminal sends each device its rows and the
        // other partitions' means; the last layer's rows go back to it.
        EXPECT_EQ(p[static_cast<size_t>(CollectiveKind::kScatter)], r == 0 ? (k - 1) * (np + (k - 1) * l) * F : 0);
        EXPECT_EQ(p[static_cast<size_t>(CollectiveKind::kGather)], r == 0 ? 0 : np * F);
        EXPECT_EQ(p[static_cast<size_t>(CollectiveKind::kBroadcast)], 0);
      }
      if (rate == 1.0) {  // every segment one row: the same per-layer volume as Voltage
        EXPECT_EQ(pr.stats[1].elements_sent[static_cast<size_t>(CollectiveKind::kAllgather)],
                  vo.stats[1].elements_sent[static_cast<size_t>(CollectiveKind::kAllgather)]);
      }
    }
  }
}

// The estimate's GEMM FLOPs: Q of the own rows, K and V of the keys (own
// rows plus the other partitions' means), attention over them, and the rest
// of the layer on the own rows.
TEST(PrismTest, FlopsPerDeviceShrinkWithTheRate) {
  const auto cfg = model::load_config(kData + "/bert-tiny").value();
  const int64_t n = 24;
  const double F = static_cast<double>(cfg.hidden), I = static_cast<double>(cfg.intermediate);
  auto layer = [&](double rows, double keys) {
    return 2 * rows * F * F + 4 * keys * F * F + 4 * rows * keys * F + 2 * rows * F * F + 4 * rows * F * I;
  };
  Plan one = prism_plan({1, 1}, 1.0), four = prism_plan({1, 1}, 4.0);
  ASSERT_TRUE(complete_plan(one, cfg).ok());
  ASSERT_TRUE(complete_plan(four, cfg).ok());
  // R = 1: keys are all 24 rows, as in Voltage's Eq. (3) order.
  EXPECT_DOUBLE_EQ(estimate(one, cfg, n).value().devices[1].flops(), static_cast<double>(cfg.layers) * layer(12, 24));
  // R = 4: 12 own rows plus 3 means of the other partition.
  EXPECT_DOUBLE_EQ(estimate(four, cfg, n).value().devices[1].flops(), static_cast<double>(cfg.layers) * layer(12, 15));
}

}  // namespace
}  // namespace tessera::parallel
