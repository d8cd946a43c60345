// The one fidelity routine (runtime/fidelity.h) that `tessera fidelity` and
// the planner's --max-loss gate share: exact plans measure no loss, lossy
// ones a loss in range that grows with PRISM's rate on a trained model, and
// calibration files become one input per prompt line.
#include "runtime/fidelity.h"

#include <gtest/gtest.h>
#include <unistd.h>


#include "core/io.h"
#include "model/tokenizer.h"
#include "runtime/deployment.h"
#include "temp_dir.h"

namespace tessera::runtime {
namespace {


const std::string kData = TESSERA_TEST_DATA;

parallel::Plan completed(parallel::Plan p, const model::ModelConfig& c) {
  EXPECT_TRUE(parallel::complete_plan(p, c).ok()) << p.to_json().dump();
  return p;
}

parallel::Plan plan_of(const std::string& strategy, int world, nlohmann::json options = nlohmann::json::object()) {
  parallel::Plan p;
  p.strategy = strategy;
  p.world = world;
  p.options = std::move(options);
  return p;
}

// gpt2-copy is trained (a copy task, docs in its README), so its top-1
// predictions are not the near-ties of random weights.
TEST(Fidelity, ExactPlansLoseNothingAndPrismLosesMoreAtHigherRates) {
  const std::string dir = kData + "/gpt2-copy";
  const model::ModelConfig c = model::load_config(dir).value();
  auto meter = FidelityMeter::create(dir, random_inputs(c, 4, 64, 7));
  ASSERT_TRUE(meter.ok()) << meter.status().to_string();
  EXPECT_EQ(meter->samples(), 4u);

  for (const parallel::Plan& exact : {completed(parallel::single_device_plan(), c), completed(plan_of("tp", 2), c),
                                      completed(plan_of("prism", 2, {{"rate", 1.0}}), c)}) {
    const auto s = meter->measure(exact);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->samples, 4);
    EXPECT_EQ(s->rows, 4 * 64);
    EXPECT_EQ(s->top1_agreement, 1.0) << exact.to_json().dump();
    EXPECT_GT(s->min_cosine, 0.99999) << exact.to_json().dump();
    EXPECT_LT(s->next_token_kl, 1e-6);
    EXPECT_EQ(meter->top1_disagreement(exact).value(), 0.0);
  }
  double last = -1;
  for (const double rate : {4.0, 32.0}) {
    const parallel::Plan p = completed(plan_of("prism", 2, {{"rate", rate}}), c);
    const auto s = meter->measure(p);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_LT(s->cosine, 1.0);
    const double loss = meter->top1_disagreement(p).value();
    EXPECT_DOUBLE_EQ(loss, 1.0 - s->top1_agreement);
    EXPECT_GT(loss, last) << rate;
    EXPECT_LE(loss, 1.0);
    last = loss;
  }
  parallel::Plan q4 = parallel::single_device_plan();
  q4.weights = kernels::WeightType::kQ4_0;
  const auto s = meter->measure(completed(q4, c));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_LT(s->max_abs_err, 10.0);
  EXPECT_GT(s->max_abs_err, 0.0);  // Q4_0 weights move the outputs
}

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("tessera-fidelity-") {}
};

TEST(Fidelity, CalibrationFilesGiveOnePromptPerLine) {
  const TempDir tmp;
  const std::string dir = kData + "/gpt2-chat";
  const auto in = calibration_inputs(dir, tmp.file("cal.txt", "The quick brown fox\n\n   \njumps over the lazy dog\n"));
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_EQ(in->size(), 2u);
  const auto tok = model::load_tokenizer(dir).value();
  EXPECT_EQ(in.value()[0].ids, tok->encode("The quick brown fox").value());
  EXPECT_EQ(in.value()[1].ids, tok->encode("jumps over the lazy dog").value());

  const auto empty = calibration_inputs(dir, tmp.file("empty.txt", "\n  \n"));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no prompt"), std::string::npos);
  EXPECT_FALSE(calibration_inputs(dir, tmp.path.string() + "/missing.txt").ok());
  const auto image = calibration_inputs(kData + "/vit-tiny", tmp.file("cal2.txt", "a\n"));
  ASSERT_FALSE(image.ok());
  EXPECT_NE(image.status().message().find("takes images"), std::string::npos);
}

// The cluster's measure (what deploy and `plan` give the planner) on the
// calibration file's prompts: an exact plan loses nothing.
TEST(Fidelity, TheClustersLossMeasureRunsOnTheCalibrationPrompts) {
  const TempDir tmp;
  ClusterOptions o;
  o.model_dir = kData + "/gpt2-chat";
  o.devices = 2;
  auto cluster = Cluster::open(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  const model::ModelConfig c = model::load_config(o.model_dir).value();
  const auto measure = cluster->loss_measure(c, 16, tmp.file("cal.txt", "Hello there\nHow are you today?\n"));
  ASSERT_TRUE(measure.ok()) << measure.status().to_string();
  auto loss = measure.value()(completed(plan_of("tp", 2), c));
  ASSERT_TRUE(loss.ok()) << loss.status().to_string();
  EXPECT_EQ(*loss, 0.0);
  const auto bad = cluster->loss_measure(c, 16, tmp.path.string() + "/missing.txt");
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace tessera::runtime
