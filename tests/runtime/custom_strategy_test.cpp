// A strategy registered by the test alone runs through the multi-process
// path: this binary is its own worker (Session execs /proc/self/exe with
// `worker-job`, and main() below answers it), as `tessera` is for the
// built-in strategies.
#include <gtest/gtest.h>

#include "worker_main.h"

#include <cstring>
#include <string>

#include "../parallel/fixtures.h"
#include "../parallel/replicate_strategy.h"
#include "runtime/session.h"

namespace tessera {
namespace {

TEST(CustomStrategyTest, RunsAsWorkerProcessesAndEqualsTheSingleDevice) {
  const std::string dir = parallel::testing::kData + "/gpt2-tiny";
  const auto in = parallel::testing::fixture_input("gpt2-tiny", "s13");
  const auto single = model::Transformer::load(dir).value().forward(in, {}, nullptr).value();
  runtime::SessionOptions o;
  o.model_dir = dir;
  o.plan.strategy = "test-replicate";
  o.plan.world = 3;
  o.timeout_ms = 30000;
  auto session = runtime::Session::start(o);
  ASSERT_TRUE(session.ok()) << session.status().to_string();
  runtime::RunRequest req;
  req.ids = in.ids;
  auto got = (*session)->run(req);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_LT(parallel::testing::max_diff(got->output.hidden.back(), single.hidden.back()), 1e-4f);
  const auto& stats = (*session)->last_stats();
  EXPECT_EQ(stats["strategy"], "test-replicate");
  EXPECT_EQ(stats["ranks"].size(), 3u);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::parallel::register_strategy(std::make_unique<tessera::parallel::testing::Replicate>());
  return tessera::runtime::testing::main_with_workers(argc, argv);  // also a worker process of the tests above
}
