// Planning time from a synthetic profile: plan_all over every registered
// strategy with the device-subset search, for K devices with mixed speeds and
// links and a model of L layers (BERT-large widths).
#include <benchmark/benchmark.h>

#include "planner/planner.h"

namespace {

using namespace tessera;

planner::ClusterProfile synthetic(int k) {
  planner::ClusterProfile p;
  for (int d = 0; d < k; ++d) {
    planner::DeviceProfile dev;
    dev.gemm = {{16, 1024, 1024, 20}, {128, 1024, 4096, 40}, {128, 4096, 1024, 40}};
    dev.attention_gflops = 10;
    dev.elementwise_gbps = 5;
    dev.stream_gbps = 10;
    dev.speed = d % 2 == 0 ? 1.0 : 0.5;
    dev.memory_bytes = int64_t{2} << 30;
    p.devices.push_back(dev);
  }
  p.links.assign(static_cast<size_t>(k), std::vector<planner::LinkProfile>(static_cast<size_t>(k)));
  for (int a = 0; a < k; ++a)
    for (int b = 0; b < k; ++b)
      if (a != b) p.links[static_cast<size_t>(a)][static_cast<size_t>(b)] = {1.0, (a + b) % 3 == 0 ? 125.0 : 1000.0};
  return p;
}

void BM_PlanAll(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  model::ModelConfig c;
  c.family = model::Family::kBert;
  c.hidden = 1024;
  c.heads = 16;
  c.layers = state.range(1);
  c.intermediate = 4096;
  c.vocab = 30522;
  c.max_positions = 512;
  c.type_vocab = 2;
  const planner::ClusterProfile p = synthetic(k);
  planner::PlannerOptions o;
  o.rows = 128;
  for (auto _ : state) {
    auto t = planner::plan_all(c, p, o);
    if (!t.ok()) state.SkipWithError(t.status().message().c_str());
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_PlanAll)->Args({2, 12})->Args({4, 24})->Args({8, 48})->Unit(benchmark::kMillisecond);

}  // namespace
