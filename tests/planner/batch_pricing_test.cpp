// The planner's price of a batched decode step for a layout whose decoders
// do not batch (Strategy::batches_steps false: step_rows runs the sequences
// one after another). Every built-in strategy that decodes batches, so a
// test-only strategy, registered the way a new one is, stands for one that
// does not; it has a binary of its own so the other planner tests keep the
// built-in registry.
#include <gtest/gtest.h>

#include "parallel/strategy.h"
#include "planner/planner.h"

namespace tessera::planner {
namespace {

// The one-device layout's schedule, with decoders that would step their
// sequences in turn.
class OneByOne final : public parallel::Strategy {
 public:
  std::string name() const override { return "test-one-by-one"; }
  std::string summary() const override { return "test only: the terminal's layout, steps not batched"; }
  core::Status complete(parallel::Plan& plan, const model::ModelConfig&) const override {
    if (plan.world != 1) return core::invalid_argument("test-one-by-one runs on one device");
    return parallel::only_options(plan, {});
  }
  core::Result<core::Tensor> run(const model::Transformer&, const parallel::Plan&, parallel::Synchronizer&, core::Tensor,
                                 int64_t, core::ThreadPool*) const override {
    return core::unimplemented("test-one-by-one is priced, never run");
  }
  bool decodes() const override { return true; }
  parallel::Schedule estimate(const parallel::Plan&, const model::ModelConfig& c, int64_t n) const override {
    parallel::Plan one = parallel::single_device_plan();
    EXPECT_TRUE(parallel::complete_plan(one, c).ok());
    return parallel::estimate(one, c, n).value();
  }
};

TEST(BatchPricing, ALayoutWhoseStepsDoNotBatchIsPricedAsOneSequenceAfterAnother) {
  parallel::register_strategy(std::make_unique<OneByOne>());
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  DeviceProfile d;
  d.name = "synthetic";
  // GEMMs bound by reading the weights at a few rows: 8 rows cost what one does.
  d.gemm = {{1, 256, 256, 1}, {8, 256, 256, 8}, {128, 256, 256, 10}};
  d.attention_gflops = 10;
  d.elementwise_gbps = 10;
  d.stream_gbps = 10;
  ClusterProfile p;
  p.devices = {d};
  p.links = {{LinkProfile{}}};
  auto steps = [&](int64_t batch) {
    PlannerOptions o;
    o.rows = 128;
    o.ctx_size = 1024;
    o.new_tokens = 32;
    o.decode_batch = batch;
    const auto t = plan_all(c, p, o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    std::map<std::string, double> out;
    for (const Candidate& r : t.value().rows) out[r.plan.strategy] = r.step_ms;
    return out;
  };
  const auto one = steps(1), eight = steps(8);
  ASSERT_GT(one.at("test-one-by-one"), 0);
  // Alone, a step is the terminal's; with 8 sequences, 8 of them a token.
  EXPECT_NEAR(one.at("test-one-by-one"), one.at("single"), 1e-9);
  EXPECT_NEAR(eight.at("test-one-by-one"), 8 * one.at("single"), 1e-9);
  // The terminal's own decoders batch: its 8 rows read the weights once.
  EXPECT_LT(eight.at("single"), 8 * one.at("single"));
}

}  // namespace
}  // namespace tessera::planner
