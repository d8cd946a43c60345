// The cost model and the partitioners on synthetic profiles (no network, no
// measurement): each expected figure is worked out by hand from the
// equations of docs/planner.md.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include <algorithm>
#include <cmath>
#include <set>

#include "parallel/strategy.h"
#include "planner/cost_model.h"
#include "planner/planner.h"

namespace tessera::planner {
namespace {

using parallel::CollectiveKind;

model::ModelConfig bert_like(int64_t layers = 4) {
  return model::parse_config(R"({"model_type": "bert", "hidden_size": 256, "num_attention_heads": 4,
      "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 128, "num_hidden_layers": )" +
                             std::to_string(layers) + "}")
      .value();
}

// A device whose every kernel runs at `gflops` (GEMM and attention) and
// whose element-wise kernels move `gbps`.
DeviceProfile device(double gflops, double speed = 1.0, int64_t memory = 0) {
  DeviceProfile d;
  d.name = "synthetic";
  d.gemm = {{64, 256, 256, gflops}};
  d.attention_gflops = gflops;
  d.elementwise_gbps = 10;
  d.stream_gbps = 10;
  d.memory_bytes = memory;
  d.speed = speed;
  return d;
}

ClusterProfile cluster(std::vector<DeviceProfile> devs, double latency_ms, double mbps) {
  ClusterProfile p;
  p.devices = std::move(devs);
  const size_t k = p.devices.size();
  p.links.assign(k, std::vector<LinkProfile>(k, LinkProfile{latency_ms, mbps}));
  for (size_t i = 0; i < k; ++i) p.links[i][i] = {};
  return p;
}

const Candidate& row_of(const PlanTable& t, const std::string& strategy) {
  for (const Candidate& c : t.rows)
    if (c.plan.strategy == strategy) return c;
  ADD_FAILURE() << "no row for " << strategy;
  return t.rows.front();
}

TEST(CostModel, OneDeviceIsTheSumOfItsKernels) {
  const model::ModelConfig c = bert_like();
  const int64_t n = 64, F = c.hidden, I = c.intermediate;
  parallel::Plan plan;
  ASSERT_TRUE(parallel::complete_plan(plan, c).ok());
  const auto s = parallel::estimate(plan, c, n);
  ASSERT_TRUE(s.ok());
  const auto p = predict(s.value(), cluster({device(10)}, 0, 0));
  ASSERT_TRUE(p.ok());
  // Per layer: QKV, out, FFN in and out at 10 GFLOP/s, attention (Q K^T and
  // P V) at 10 GFLOP/s, three norms reading and writing n x F floats at 10 GB/s.
  const double gemm = 2.0 * n * (F * 3 * F + F * F + F * I + I * F), att = 4.0 * n * n * F;
  const double norms = 3 * 2.0 * n * F * 4;
  const double per_layer_ms = 1e3 * ((gemm + att) / 10e9 + norms / 10e9);
  EXPECT_NEAR(p.value().latency_ms, c.layers * per_layer_ms, 1e-9);
  EXPECT_NEAR(p.value().compute_ms, p.value().latency_ms, 1e-9);
  EXPECT_EQ(p.value().bottleneck, 0);
  EXPECT_DOUBLE_EQ(p.value().devices[0].memory_bytes,
                   static_cast<double>(s.value().devices[0].weight_bytes + s.value().devices[0].activation_bytes));
}

// Two devices, one phase: device 0 computes a GEMM of 2 GFLOP (200 ms at
// 10 GFLOP/s), device 1 half of it; device 0 sends 1 MB over 10 Mbit/s with
// 5 ms latency (800 ms + 5 ms).
parallel::Schedule two_device_phase(bool overlapped) {
  parallel::Schedule s;
  s.devices.resize(2);
  for (int d = 0; d < 2; ++d) {
    parallel::Phase ph{"p", 0, {parallel::gemm("g", 1000, 1000, d == 0 ? 1000 : 500)}, {}, overlapped};
    ph.transfers.push_back(parallel::transfer(CollectiveKind::kSendRecv, "x", d == 0 ? 250000 : 0, {1 - d}));
    s.devices[static_cast<size_t>(d)].phases.push_back(ph);
  }
  return s;
}

// A mixed file's GEMM: its share in the other type at that type's rate,
// the rest at the main type's, each no faster than its bytes stream in.
TEST(CostModel, AMixedFilesGemmWeighsEachTypeByItsShare) {
  DeviceProfile d = device(10);
  d.gemm = {{1, 256, 256, 10, kernels::WeightType::kQ4_K}, {1, 256, 256, 5, kernels::WeightType::kQ6_K}};
  d.stream_gbps = 1e6;  // no floor
  parallel::Work w = parallel::gemm("ffn_out", 1, 256, 256);
  w.weights = kernels::WeightType::kQ4_K;
  const double q4 = work_ms(w, d);
  EXPECT_NEAR(q4, 1e3 * w.flops / 10e9, 1e-12);
  w.mix = kernels::WeightType::kQ6_K;
  w.mix_share = 0.25;
  EXPECT_NEAR(work_ms(w, d), 0.75 * q4 + 0.25 * 2 * q4, 1e-12);
  // With a floor: each part is its own type's bytes at the stream rate.
  d.stream_gbps = 1e-3;
  const double floor_q4 = 1e3 * 256.0 * static_cast<double>(kernels::row_bytes(kernels::WeightType::kQ4_K, 256)) / 1e6;
  const double floor_q6 = 1e3 * 256.0 * static_cast<double>(kernels::row_bytes(kernels::WeightType::kQ6_K, 256)) / 1e6;
  EXPECT_NEAR(work_ms(w, d), 0.75 * floor_q4 + 0.25 * floor_q6, 1e-9 * floor_q6);
  // A profile without samples of the other type prices the share at the
  // main type's (F32's samples, the fallback, would be far too slow).
  d.stream_gbps = 1e6;
  d.gemm = {{1, 256, 256, 10, kernels::WeightType::kQ4_K}, {1, 256, 256, 0.1}};
  EXPECT_NEAR(work_ms(w, d), q4, 1e-12);
}

TEST(CostModel, SequentialPhaseIsWorkThenTransfer) {
  const auto p = predict(two_device_phase(false), cluster({device(10), device(10)}, 5, 10));
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p.value().latency_ms, 200 + 5 + 800, 1e-6);
  EXPECT_NEAR(p.value().devices[0].comm_ms, 805, 1e-6);
  EXPECT_NEAR(p.value().devices[1].wait_ms, 100, 1e-6);  // its 100 ms GEMM ends first
}

TEST(CostModel, OverlappedPhaseIsTheLongerOfWorkAndTransfer) {
  const auto slow = predict(two_device_phase(true), cluster({device(10), device(10)}, 5, 10));
  ASSERT_TRUE(slow.ok());
  EXPECT_NEAR(slow.value().latency_ms, 805, 1e-6);  // the transfer hides the work
  EXPECT_NEAR(slow.value().devices[0].comm_ms, 605, 1e-6);
  const auto fast = predict(two_device_phase(true), cluster({device(10), device(10)}, 5, 1000));
  ASSERT_TRUE(fast.ok());
  EXPECT_NEAR(fast.value().latency_ms, 200, 1e-6);  // 13 ms of transfer under 200 ms of work
  EXPECT_NEAR(fast.value().devices[0].comm_ms, 0, 1e-6);
}

// Where the transport shares the work's cores (crypto_gbps > 0), an
// overlapped exchange's encryption lengthens the work under it: device 0
// encrypts its 1 MB and decrypts as much (2 GB/s: 1 ms). A sequential
// exchange has it in the measured link already.
TEST(CostModel, EncryptionUnderAnOverlappedExchangeTakesTheWorksCores) {
  ClusterProfile p = cluster({device(10), device(10)}, 5, 1000);
  for (auto& d : p.devices) d.crypto_gbps = 2;
  const auto over = predict(two_device_phase(true), p);
  ASSERT_TRUE(over.ok());
  EXPECT_NEAR(over.value().devices[0].compute_ms, 200 + 1, 1e-6);
  EXPECT_NEAR(over.value().devices[1].compute_ms, 100, 1e-6);  // it sent nothing here
  EXPECT_NEAR(over.value().latency_ms, 201, 1e-6);
  const auto seq = predict(two_device_phase(false), p);
  ASSERT_TRUE(seq.ok());
  EXPECT_NEAR(seq.value().devices[0].compute_ms, 200, 1e-6);
}

// Local devices of one host share its memory bandwidth while they compute
// at once: a step's GEMM on both (4 MB of F32 weights each, 10 GB/s alone:
// 0.4 ms) takes each half of the host's 12 GB/s (0.667 ms); a phase that
// only device 0 computes in streams at its own rate. A partner at half speed
// idles half the time, so device 0 gets 12 / 1.5 = 8 GB/s (0.5 ms).
TEST(CostModel, LocalDevicesStreamingAtOnceShareTheHostsBandwidth) {
  parallel::Schedule s;
  s.devices.resize(2);
  for (int d = 0; d < 2; ++d) {
    s.devices[static_cast<size_t>(d)].phases.push_back({"both", 0, {parallel::gemm("g", 1, 1000, 1000)}, {}, false});
    s.devices[static_cast<size_t>(d)].phases.push_back(
        {"one", 1, d == 0 ? std::vector<parallel::Work>{parallel::gemm("g", 1, 1000, 1000)} : std::vector<parallel::Work>{}, {}, false});
  }
  const auto at = [&](ClusterProfile p) {
    for (auto& d : p.devices) d.gemm = {{1, 1000, 1000, 1e6}};  // bound by the stream alone
    const auto pred = predict(s, p);
    EXPECT_TRUE(pred.ok());
    return pred.ok() ? pred.value().devices[0].compute_ms : -1.0;
  };
  ClusterProfile p = cluster({device(10), device(10)}, 1, 1000);
  for (auto& d : p.devices) d.host_stream_gbps = 12;
  EXPECT_NEAR(at(p), 0.4 + 0.4, 1e-3) << "no host named: each its own";
  for (auto& d : p.devices) d.host = 0;
  EXPECT_NEAR(at(p), 4e6 / 6e9 * 1e3 + 0.4, 1e-3);
  EXPECT_NEAR(shared_stream_gbps(p, 1, {0, 1}), 6, 1e-12);
  EXPECT_NEAR(shared_stream_gbps(p, 1, {1}), 10, 1e-12);
  // A pipeline's overlapped steps: every stage at once, whatever the phases say.
  const ClusterProfile once = streaming_at_once(p);
  for (const auto& d : once.devices) {
    EXPECT_NEAR(d.stream_gbps, 6, 1e-12);
    EXPECT_EQ(d.host, -1);
  }
  p.devices[1].speed = 0.5;
  EXPECT_NEAR(at(p), 4e6 / 8e9 * 1e3 + 0.4, 1e-3);
  p.devices[1].speed = 1;
  p.devices[1].host = 1;
  EXPECT_NEAR(at(p), 0.8, 1e-3) << "another host";
  for (auto& d : p.devices) d.host = 0, d.host_stream_gbps = 30;
  EXPECT_NEAR(at(p), 0.8, 1e-3) << "a host that feeds both at their own rate";
  // Uneven work: the smaller share ends at the shared rate, and the larger
  // one's rest streams alone (processor sharing), not the whole at 6 GB/s.
  {
    p.devices[1].host = 0;
    p.devices[0].host_stream_gbps = p.devices[1].host_stream_gbps = 12;
    const std::vector<parallel::Work> two = {parallel::gemm("g", 1, 1000, 1000), parallel::gemm("g", 1, 1000, 1000)};
    const std::vector<parallel::Work> one = {parallel::gemm("g", 1, 1000, 1000)};
    const std::vector<parallel::Work> none;
    for (auto& d : p.devices) d.gemm = {{1, 1000, 1000, 1e6}};
    const auto ms = phase_work_ms(p, {&two, &one});
    ASSERT_EQ(ms.size(), 2u);
    EXPECT_NEAR(ms[1], 4e6 / 6e9 * 1e3, 1e-9);
    EXPECT_NEAR(ms[0], 4e6 / 6e9 * 1e3 + 4e6 / 10e9 * 1e3, 1e-9);
    const auto alone = phase_work_ms(p, {&two, &none});
    EXPECT_NEAR(alone[0], 0.8, 1e-9);
    EXPECT_EQ(alone[1], 0.0);
    const auto null = phase_work_ms(p, {nullptr, &one});
    EXPECT_EQ(null[0], 0.0);
    EXPECT_NEAR(null[1], 0.4, 1e-9);
    const auto even = phase_work_ms(p, {&one, &one});
    EXPECT_NEAR(even[0], 4e6 / 6e9 * 1e3, 1e-9);
    EXPECT_NEAR(even[1], 4e6 / 6e9 * 1e3, 1e-9);
    // Three devices, work 3:2:1 on a host of 12 GB/s: 4 each, then 6, then 10.
    ClusterProfile three = cluster({device(10), device(10), device(10)}, 1, 1000);
    for (auto& d : three.devices) d.host = 0, d.host_stream_gbps = 12, d.gemm = {{1, 1000, 1000, 1e6}};
    const std::vector<parallel::Work> w3(3, parallel::gemm("g", 1, 1000, 1000));
    const auto m3 = phase_work_ms(three, {&w3, &two, &one});
    const double a = 4e6 / 4e9 * 1e3, b = a + 4e6 / 6e9 * 1e3, c = b + 4e6 / 10e9 * 1e3;
    EXPECT_NEAR(m3[2], a, 1e-9);
    EXPECT_NEAR(m3[1], b, 1e-9);
    EXPECT_NEAR(m3[0], c, 1e-9);
    for (auto& d : p.devices) d.host_stream_gbps = 30;
  }
  // Three on one host, two of them busy: each of those gets half.
  ClusterProfile three = cluster({device(10), device(10), device(10)}, 1, 1000);
  for (auto& d : three.devices) d.host = 0, d.host_stream_gbps = 12;
  EXPECT_NEAR(shared_stream_gbps(three, 0, {0, 2}), 6, 1e-12);
  EXPECT_NEAR(shared_stream_gbps(three, 0, {0, 1, 2}), 4, 1e-12);
  three.devices[0].threads = 2;  // by threads
  EXPECT_NEAR(shared_stream_gbps(three, 0, {0, 1}), 8, 1e-12);
  // Round trip through JSON; a file from before the fields shares nothing;
  // a host below -1 or a negative rate is refused.
  nlohmann::json j = p.devices[0].to_json();
  const auto back = DeviceProfile::from_json(j);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->host, 0);
  EXPECT_EQ(back->host_stream_gbps, 30);
  nlohmann::json old = j;
  old.erase("host");
  old.erase("host_stream_gbps");
  const auto before = DeviceProfile::from_json(old);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->host, -1);
  EXPECT_EQ(before->host_stream_gbps, 0);
  nlohmann::json bad = j;
  bad["host"] = -2;
  EXPECT_FALSE(DeviceProfile::from_json(bad).ok());
  bad = j;
  bad["host_stream_gbps"] = -1;
  EXPECT_FALSE(DeviceProfile::from_json(bad).ok());
}

TEST(CostModel, EmulatedSpeedScalesKernels) {
  const parallel::Work w = parallel::gemm("g", 100, 100, 100);
  EXPECT_NEAR(work_ms(w, device(10, 0.25)), 4 * work_ms(w, device(10)), 1e-12);
}

TEST(CostModel, EveryStrategyLinesUpOnOneToFourDevices) {
  const model::ModelConfig c = bert_like();
  for (const parallel::Strategy* s : parallel::strategies())
    for (int k = 1; k <= 4; ++k) {
      parallel::Plan plan;
      plan.strategy = s->name();
      plan.world = k;
      if (!parallel::complete_plan(plan, c).ok()) continue;  // e.g. single on k > 1
      const auto sched = parallel::estimate(plan, c, 64);
      ASSERT_TRUE(sched.ok());
      const auto p = predict(sched.value(), cluster(std::vector<DeviceProfile>(static_cast<size_t>(k), device(10)), 1, 100));
      ASSERT_TRUE(p.ok()) << s->name() << " " << k << ": " << p.status().message();
      EXPECT_GT(p.value().latency_ms, 0) << s->name();
      for (const auto& d : p.value().devices) EXPECT_GE(d.wait_ms, -1e-9);
    }
}

TEST(Algorithm1, SharesFollowCapacityWithoutBudgets) {
  const double inf = INFINITY;
  const auto r = balance_units(12, {2, 1, 1}, {0, 0, 0}, {1, 1, 1}, {inf, inf, inf});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), (std::vector<int64_t>{6, 3, 3}));
}

TEST(Algorithm1, ExcessMovesToDevicesWithRoomByCapacity) {
  // Device 0 is twice as fast but holds only 2 units: its excess of 4 goes
  // to devices 1 and 2 in the ratio of their capacities (3:1).
  const auto r = balance_units(12, {2, 3, 1}, {0, 0, 0}, {1, 1, 1}, {2, 100, 100});
  ASSERT_TRUE(r.ok());
  // Proportional: 4, 6, 2. Device 0 keeps 2; 2 move 3:1 (rounded: 2, 0).
  EXPECT_EQ(r.value()[0], 2);
  EXPECT_EQ(r.value()[0] + r.value()[1] + r.value()[2], 12);
  EXPECT_GE(r.value()[1], 7);
}

TEST(Algorithm1, CascadesWhenAReceiverOverflows) {
  // Device 1 receives device 0's excess and then overflows itself; the
  // rest lands on device 2.
  const auto r = balance_units(9, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {1, 4, 100});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value()[0], 1);
  EXPECT_LE(r.value()[1], 4);
  EXPECT_EQ(r.value()[0] + r.value()[1] + r.value()[2], 9);
}

TEST(Algorithm1, FailsWhenTheBudgetsCannotHoldTheBlock) {
  const auto r = balance_units(10, {1, 1}, {0, 0}, {1, 1}, {4, 4});
  EXPECT_FALSE(r.ok());
  const auto fixed_over = balance_units(10, {1, 1}, {5, 0}, {1, 1}, {4, 100});
  EXPECT_FALSE(fixed_over.ok());
}

TEST(Planner, EqualDevicesSplitRowsEqually) {
  const model::ModelConfig c = bert_like();
  const ClusterProfile p = cluster({device(10), device(10)}, 0.1, 1000);
  PlannerOptions o;
  o.rows = 64;
  const auto cand = plan_strategy(*parallel::find_strategy("sp"), c, p, {0, 1}, o);
  ASSERT_TRUE(cand.ok());
  const auto rows = parallel::range_sizes(parallel::split_by_ratio(64, cand.value().plan.ratios));
  EXPECT_LE(std::abs(rows[0] - rows[1]), 2);
}

TEST(Planner, SlowDeviceGetsRowsInProportionToSpeed) {
  // Device 1 at half speed; links nearly free: rows balance the kernels,
  // 2:1, so device 1 takes about a third.
  const model::ModelConfig c = bert_like();
  const ClusterProfile p = cluster({device(10), device(10, 0.5)}, 0.001, 1e6);
  PlannerOptions o;
  o.rows = 96;
  const auto cand = plan_strategy(*parallel::find_strategy("sp"), c, p, {0, 1}, o);
  ASSERT_TRUE(cand.ok());
  const auto rows = parallel::range_sizes(parallel::split_by_ratio(96, cand.value().plan.ratios));
  EXPECT_NEAR(static_cast<double>(rows[1]), 32.0, 4.0);
  // And the planned partition beats the equal one.
  parallel::Plan equal;
  equal.strategy = "sp";
  equal.world = 2;
  ASSERT_TRUE(parallel::complete_plan(equal, c).ok());
  const auto eq = predict(parallel::estimate(equal, c, 96).value(), p);
  ASSERT_TRUE(eq.ok());
  EXPECT_LT(cand.value().prediction.latency_ms, eq.value().latency_ms);
}

TEST(Planner, SlowLinkLeavesTheOtherDeviceOut) {
  // 1 Mbit/s and 50 ms: any exchange costs more than the whole model on the
  // terminal, so every strategy keeps to device 0 and says why.
  const model::ModelConfig c = bert_like();
  const ClusterProfile p = cluster({device(10), device(10)}, 50, 1);
  PlannerOptions o;
  o.rows = 64;
  const auto t = plan_all(c, p, o);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const Candidate& ch = t.value().rows[static_cast<size_t>(t.value().chosen)];
  EXPECT_EQ(ch.members, std::vector<int>{0});
  const Candidate& sp = row_of(t.value(), "sp");
  EXPECT_EQ(sp.members, std::vector<int>{0});
  ASSERT_FALSE(sp.notes.empty());
  EXPECT_NE(sp.notes.back().find("device 1 left out"), std::string::npos) << sp.notes.back();
}

TEST(Planner, FastLinkUsesBothEqualDevicesAndBeatsOne) {
  const model::ModelConfig c = bert_like(12);
  const ClusterProfile p = cluster({device(10), device(10)}, 0.01, 1e5);
  PlannerOptions o;
  o.rows = 128;
  const auto t = plan_all(c, p, o);
  ASSERT_TRUE(t.ok());
  const Candidate& ch = t.value().rows[static_cast<size_t>(t.value().chosen)];
  EXPECT_EQ(ch.members.size(), 2u);
  EXPECT_TRUE(ch.exact);
  const Candidate& single = row_of(t.value(), "single");
  EXPECT_LT(ch.prediction.latency_ms, single.prediction.latency_ms);
}

// --wire: a plan's transfers cost what the wire carries (q8 about a quarter
// of f32's bytes), its compute the same; plan_all tries every wire it is
// given but chooses a lossy one only when allowed or named by the user.
TEST(Planner, ALossyWireIsPricedAndChosenOnlyWhenAllowed) {
  const model::ModelConfig c = bert_like(12);
  const ClusterProfile p = cluster({device(10), device(10)}, 0.05, 100);
  PlannerOptions o;
  o.rows = 128;
  PlannerOptions oq = o;
  oq.wire = core::WireType::kQ8;
  const auto f32 = plan_strategy(*parallel::find_strategy("tp"), c, p, {0, 1}, o);
  const auto q8 = plan_strategy(*parallel::find_strategy("tp"), c, p, {0, 1}, oq);
  ASSERT_TRUE(f32.ok() && q8.ok());
  EXPECT_EQ(q8->plan.wire, core::WireType::kQ8);
  EXPECT_TRUE(f32->exact);
  EXPECT_FALSE(q8->exact);
  EXPECT_NEAR(q8->prediction.compute_ms, f32->prediction.compute_ms, 1e-9 + 1e-6 * f32->prediction.compute_ms);
  EXPECT_LT(q8->prediction.comm_ms, 0.5 * f32->prediction.comm_ms);

  o.wires = {core::WireType::kF32, core::WireType::kQ8};
  const auto strict = plan_all(c, p, o);
  ASSERT_TRUE(strict.ok());
  const Candidate& s = strict->rows[static_cast<size_t>(strict->chosen)];
  EXPECT_EQ(s.plan.wire, core::WireType::kF32);
  bool priced_q8 = false;
  for (const Candidate& r : strict->rows) priced_q8 = priced_q8 || r.plan.wire == core::WireType::kQ8;
  EXPECT_TRUE(priced_q8);
  for (const bool named : {false, true}) {
    PlannerOptions ol = o;
    (named ? ol.wire_given : ol.lossy_allowed) = true;
    if (named) ol.wires = {core::WireType::kQ8};
    const auto lossy = plan_all(c, p, ol);
    ASSERT_TRUE(lossy.ok());
    const Candidate& l = lossy->rows[static_cast<size_t>(lossy->chosen)];
    EXPECT_EQ(l.plan.wire, core::WireType::kQ8) << named;
    EXPECT_EQ(l.members.size(), 2u);
    EXPECT_LT(l.prediction.latency_ms, s.prediction.latency_ms) << named;
  }
}

// --lossy may quantize at load: a model that fits no device (nor both) in
// F32 is planned in Q8_0 or Q4_0, and only when lossy plans are allowed.
TEST(Planner, LossyMayQuantizeAModelThatFitsNoDeviceInF32) {
  const model::ModelConfig c = bert_like(12);
  parallel::Plan one;
  ASSERT_TRUE(parallel::complete_plan(one, c).ok());
  const int64_t f32_bytes = parallel::estimate(one, c, 64).value().devices[0].weight_bytes;
  const int64_t budget = f32_bytes * 4 / 10;  // F32 needs at least half on each of two
  const ClusterProfile p = cluster({device(10, 1.0, budget), device(10, 1.0, budget)}, 0.05, 1000);
  PlannerOptions o;
  o.rows = 64;
  EXPECT_FALSE(plan_all(c, p, o).ok());
  o.weight_types = {kernels::WeightType::kF32, kernels::WeightType::kQ8_0, kernels::WeightType::kQ4_0};
  const auto strict = plan_all(c, p, o);
  EXPECT_FALSE(strict.ok());  // priced, not chosen
  o.lossy_allowed = true;
  const auto lossy = plan_all(c, p, o);
  ASSERT_TRUE(lossy.ok()) << lossy.status().to_string();
  const Candidate& ch = lossy->rows[static_cast<size_t>(lossy->chosen)];
  EXPECT_NE(ch.plan.weights, kernels::WeightType::kF32);
  EXPECT_TRUE(ch.feasible);
  EXPECT_FALSE(ch.exact);
  for (const auto& d : ch.prediction.devices) EXPECT_LE(d.memory_bytes, budget);
}

// --max-loss: a lossy row is chosen only when its measured loss meets the
// limit, measured lazily from the fastest; PRISM's rates are priced as rows
// of their own and the highest rate that meets the limit is the one kept.
// The loss here is a stand-in function of the plan (the real measure is
// runtime::FidelityMeter, tested in tests/runtime): rate / 100 for PRISM,
// plus 0.05 for a q8 wire and 0.5 for weights quantized at load.
double fake_loss(const parallel::Plan& plan) {
  double loss = plan.options.is_object() && plan.options.contains("rate") ? plan.options["rate"].get<double>() / 100 : 0.0;
  if (plan.wire == core::WireType::kQ8) loss += 0.05;
  if (plan.weights != kernels::WeightType::kF32) loss += 0.5;
  return loss;
}

// Lossy plans allowed, q8 wires priced; a slow link, where rows that send
// less (PRISM's means, a q8 wire) are faster.
PlannerOptions lossy_options() {
  PlannerOptions o;
  o.rows = 128;
  o.lossy_allowed = true;
  o.wires = {core::WireType::kF32, core::WireType::kQ8};
  return o;
}
const ClusterProfile kSlowPair = cluster({device(10), device(10)}, 0.05, 100);

TEST(Planner, MaxLossChoosesTheFastestLossyRowWithinTheLimit) {
  const model::ModelConfig c = bert_like(12);
  const ClusterProfile& p = kSlowPair;
  PlannerOptions o = lossy_options();
  o.weight_types = {kernels::WeightType::kF32, kernels::WeightType::kQ8_0};
  const auto free_choice = plan_all(c, p, o);  // no measure: every lossy row may be chosen
  ASSERT_TRUE(free_choice.ok());
  const Candidate& fastest = free_choice->rows[static_cast<size_t>(free_choice->chosen)];
  ASSERT_FALSE(fastest.exact);
  EXPECT_LT(fastest.measured_loss, 0);
  std::set<double> rates;
  for (const Candidate& r : free_choice->rows)
    if (r.plan.strategy == "prism" && r.members.size() == 2) rates.insert(r.plan.options["rate"].get<double>());
  EXPECT_EQ(rates, (std::set<double>{2, 4, 8, 16, 32, 64}));

  for (const double limit : {0.0, 0.03, 0.09, 0.2, 1.0}) {
    int calls = 0;
    PlannerOptions og = o;
    og.max_loss = limit;
    og.measure_loss = [&calls](const parallel::Plan& plan) -> core::Result<double> {
      ++calls;
      return fake_loss(plan);
    };
    const auto t = plan_all(c, p, og);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const Candidate& ch = t->rows[static_cast<size_t>(t->chosen)];
    if (!ch.exact) {
      EXPECT_DOUBLE_EQ(ch.measured_loss, fake_loss(ch.plan)) << limit;
      EXPECT_LE(ch.measured_loss, limit);
    }
    // No row within the limit on as many devices is 1% faster than the choice.
    for (const Candidate& r : t->rows) {
      if (!r.feasible || r.members.size() != ch.members.size() || (!r.exact && fake_loss(r.plan) > limit)) continue;
      EXPECT_GE(r.prediction.latency_ms, 0.99 * ch.prediction.latency_ms) << limit << " " << r.plan.to_json().dump();
    }
    // Each measured row was measured once, and no more rows than are lossy.
    int measured = 0, lossy = 0;
    for (const Candidate& r : t->rows) {
      measured += r.measured_loss >= 0 ? 1 : 0;
      lossy += r.exact ? 0 : 1;
    }
    EXPECT_EQ(calls, measured);
    EXPECT_LT(measured, lossy);
    if (limit >= 1.0) {
      EXPECT_EQ(ch.plan.to_json(), fastest.plan.to_json());
    }
    if (limit == 0.0) {
      EXPECT_TRUE(ch.exact);
    }
    // Among PRISM's rows with the choice's wire and weights, the rate kept is
    // the highest that meets the limit.
    if (ch.plan.strategy == "prism") {
      double best_rate = 0;
      for (const Candidate& r : t->rows)
        if (r.plan.strategy == "prism" && r.plan.wire == ch.plan.wire && r.plan.weights == ch.plan.weights &&
            r.members.size() == 2 && fake_loss(r.plan) <= limit)
          best_rate = std::max(best_rate, r.plan.options["rate"].get<double>());
      EXPECT_EQ(ch.plan.options["rate"].get<double>(), best_rate) << limit;
    }
  }
}

// A row whose loss cannot be measured is not chosen; the exact plan is.
TEST(Planner, MaxLossRefusesALossyRowItCannotMeasure) {
  const model::ModelConfig c = bert_like(12);
  const ClusterProfile& p = kSlowPair;
  PlannerOptions o = lossy_options();
  o.measure_loss = [](const parallel::Plan&) -> core::Result<double> { return core::unimplemented("no head"); };
  const auto t = plan_all(c, p, o);
  ASSERT_TRUE(t.ok());
  const Candidate& ch = t->rows[static_cast<size_t>(t->chosen)];
  EXPECT_TRUE(ch.exact);
  bool noted = false;
  for (const Candidate& r : t->rows)
    for (const std::string& n : r.notes) noted = noted || n.find("loss not measured (no head)") != std::string::npos;
  EXPECT_TRUE(noted);
}

// Planning a generation (ctx_size > 0): only a strategy that decodes may be
// chosen, since the prompt's layout keeps the KV caches for the steps; the
// others are priced and say why they were passed over.
TEST(Planner, AGenerationIsPlannedOnlyWithStrategiesThatDecode) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 512, "n_layer": 12})")
                                   .value();
  int forwards_by_non_decoders = 0;
  for (const double mbps : {100.0, 1000.0, 10000.0}) {
    const ClusterProfile p = cluster({device(10), device(10)}, 0.05, mbps);
    PlannerOptions o;
    o.rows = 256;
    const auto fwd = plan_all(c, p, o);
    ASSERT_TRUE(fwd.ok());
    const Candidate& f = fwd->rows[static_cast<size_t>(fwd->chosen)];
    if (!parallel::find_strategy(f.plan.strategy)->decodes()) ++forwards_by_non_decoders;
    o.ctx_size = 512;
    const auto gen = plan_all(c, p, o);
    ASSERT_TRUE(gen.ok());
    const Candidate& g = gen->rows[static_cast<size_t>(gen->chosen)];
    EXPECT_TRUE(parallel::find_strategy(g.plan.strategy)->decodes()) << g.plan.strategy << " " << mbps;
    for (const Candidate& r : gen->rows) {
      if (parallel::find_strategy(r.plan.strategy)->decodes()) continue;
      EXPECT_NE(std::find(r.notes.begin(), r.notes.end(), "not chosen for a generation: " + r.plan.strategy + " has no decoder"),
                r.notes.end());
    }
  }
  EXPECT_GT(forwards_by_non_decoders, 0);  // the case the rule is for
}

TEST(Planner, NeverChoosesAPlanPredictedSlowerThanTheTerminalAlone) {
  const model::ModelConfig c = bert_like();
  for (double mbps : {1.0, 10.0, 100.0, 1000.0}) {
    const ClusterProfile p = cluster({device(10), device(10, 0.5), device(10, 0.25)}, 1, mbps);
    PlannerOptions o;
    o.rows = 64;
    const auto t = plan_all(c, p, o);
    ASSERT_TRUE(t.ok());
    const Candidate& ch = t.value().rows[static_cast<size_t>(t.value().chosen)];
    EXPECT_LE(ch.prediction.latency_ms, row_of(t.value(), "single").prediction.latency_ms + 1e-9) << mbps;
    if (ch.members.size() == 1) {
      EXPECT_EQ(ch.plan.strategy, "single");
    }
  }
}

TEST(Planner, TightBudgetMovesHeadsAndColumnsOffTheSmallDevice) {
  // Device 1's budget holds a quarter of the layers' weights; an equal split
  // of heads and columns needs half.
  const model::ModelConfig c = bert_like();
  const int64_t layer_bytes = parallel::layer_weight_bytes(c, c.hidden, c.intermediate);
  const int64_t budget = c.layers * layer_bytes * 3 / 10;
  ClusterProfile p = cluster({device(10), device(10, 1.0, budget)}, 0.01, 1e5);
  PlannerOptions o;
  o.rows = 64;
  for (const char* name : {"tp", "galaxy"}) {
    parallel::Plan equal;
    equal.strategy = name;
    equal.world = 2;
    ASSERT_TRUE(parallel::complete_plan(equal, c).ok());
    const auto eq = predict(parallel::estimate(equal, c, 64).value(), p);
    ASSERT_TRUE(eq.ok());
    EXPECT_FALSE(eq.value().fits) << name;
    EXPECT_NE(eq.value().why_not.find("device 1"), std::string::npos);

    const auto cand = plan_strategy(*parallel::find_strategy(name), c, p, {0, 1}, o);
    ASSERT_TRUE(cand.ok());
    EXPECT_TRUE(cand.value().feasible) << name << ": " << cand.value().why_not;
    EXPECT_LE(cand.value().prediction.devices[1].memory_bytes, budget);
    // Algorithm 1 balances the MLP block first: the FFN columns move.
    const auto cols = parallel::split_by_ratio(c.intermediate, cand.value().plan.options.at("ffn_ratios").get<std::vector<double>>());
    EXPECT_LT(cols[1].size(), c.intermediate / 2) << name;
  }
}

// A small Llama-style decoder: 8 query heads over 2 K/V heads, 8192 positions.
model::ModelConfig llama_like(int64_t layers) {
  return model::parse_config(R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
      "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
      "max_position_embeddings": 8192, "num_hidden_layers": )" + std::to_string(layers) + "}")
      .value();
}

// estimate() stamps a mixed file's share on every layer GEMM; the LM head
// (head_work) is its own type, with no share.
TEST(CostModel, AMixedFilesShareIsStampedOnItsLayersGemms) {
  model::ModelConfig c = llama_like(2);
  c.weights = c.mix_weights = kernels::WeightType::kQ4_K;
  c.mix_other = c.mix_head = kernels::WeightType::kQ6_K;
  c.mix_other_share = 0.15;
  ASSERT_EQ(c.other_type(), kernels::WeightType::kQ6_K);
  for (const char* strategy : {"single", "tp", "voltage"}) {
    parallel::Plan plan;
    plan.strategy = strategy;
    plan.world = std::string(strategy) == "single" ? 1 : 2;
    ASSERT_TRUE(parallel::complete_plan(plan, c).ok()) << strategy;
    const auto s = parallel::estimate(plan, c, 64);
    ASSERT_TRUE(s.ok()) << s.status().message();
    int gemms = 0;
    for (const auto& dev : s->devices)
      for (const auto& ph : dev.phases)
        for (const auto& w : ph.work)
          if (w.kind == parallel::WorkKind::kGemm) {
            EXPECT_EQ(w.weights, kernels::WeightType::kQ4_K) << strategy << " " << w.what;
            EXPECT_EQ(w.mix, kernels::WeightType::kQ6_K) << strategy << " " << w.what;
            EXPECT_DOUBLE_EQ(w.mix_share, 0.15) << strategy << " " << w.what;
            ++gemms;
          }
    EXPECT_GT(gemms, 0) << strategy;
  }
  int heads = 0;
  for (const auto& w : head_work(c, 1))
    if (w.kind == parallel::WorkKind::kGemm) {
      EXPECT_EQ(w.weights, kernels::WeightType::kQ6_K) << w.what;
      EXPECT_EQ(w.mix_share, 0) << w.what;
      ++heads;
    }
  EXPECT_EQ(heads, 1);
}

// Grouped K/V heads: Algorithm 1 moves whole K/V groups (the counts planned
// are the counts run, no K/V head held twice), and a generation plan counts
// every device's KV caches at the context in its memory.
TEST(Planner, GalaxyPlansWholeKvGroupsAndCountsTheirCaches) {
  const model::ModelConfig c = llama_like(2);
  ASSERT_EQ(c.kv_group(), 4);
  const ClusterProfile p = cluster({device(10), device(30)}, 0.2, 1000);
  PlannerOptions o;
  o.rows = 64;
  const parallel::Strategy& galaxy = *parallel::find_strategy("galaxy");
  const auto plain = plan_strategy(galaxy, c, p, {0, 1}, o);
  o.ctx_size = 4096;
  const auto gen = plan_strategy(galaxy, c, p, {0, 1}, o);
  ASSERT_TRUE(plain.ok() && gen.ok());
  ASSERT_TRUE(gen->feasible) << gen->why_not;
  double sum = 0;
  for (const double h : gen->plan.ratios) {
    EXPECT_EQ(std::fmod(h, 4.0), 0.0) << "whole K/V groups";
    sum += h;
  }
  EXPECT_EQ(sum, 8.0);
  for (int d = 0; d < 2; ++d) {
    const int64_t kv = parallel::kv_cache_bytes(gen->plan, c, d, 4096);
    EXPECT_GT(kv, 0);
    if (gen->plan.ratios == plain->plan.ratios) {
      EXPECT_EQ(gen->prediction.devices[static_cast<size_t>(d)].memory_bytes -
                    plain->prediction.devices[static_cast<size_t>(d)].memory_bytes,
                kv);
    }
  }
  // A budget that holds the weights but not the caches: the generation plan does not fit.
  ClusterProfile tight = p;
  for (int d = 0; d < 2; ++d)
    tight.devices[static_cast<size_t>(d)].memory_bytes = plain->prediction.devices[static_cast<size_t>(d)].memory_bytes + 1024;
  o.ctx_size = 0;
  EXPECT_TRUE(plan_strategy(galaxy, c, tight, {0, 1}, o)->feasible);
  o.ctx_size = 4096;
  EXPECT_FALSE(plan_strategy(galaxy, c, tight, {0, 1}, o)->feasible);
}

// The layer placement of a generation plan counts each layer's KV caches:
// a terminal whose budget holds every layer's weights but not their caches
// hands layers on, and every device's predicted memory fits its budget.
TEST(Planner, PipelineLayersMakeRoomForTheirCaches) {
  const model::ModelConfig c = llama_like(4);
  const parallel::Strategy& pipe = *parallel::find_strategy("pipeline");
  for (const auto solver : {PlannerOptions::LayerSolver::kIlp, PlannerOptions::LayerSolver::kDp}) {
    PlannerOptions o;
    o.rows = 64;
    o.layer_solver = solver;
    const auto alone = plan_strategy(*parallel::find_strategy("single"), c, cluster({device(10)}, 0, 0), {0}, o);
    ASSERT_TRUE(alone.ok() && alone->feasible);
    ClusterProfile p = cluster({device(10), device(10)}, 0.2, 1000);
    const int64_t budget = alone->prediction.devices[0].memory_bytes + 1024;
    for (auto& d : p.devices) d.memory_bytes = budget;
    o.ctx_size = 1024;
    const auto gen = plan_strategy(pipe, c, p, {0, 1}, o);
    ASSERT_TRUE(gen.ok());
    ASSERT_TRUE(gen->feasible) << gen->why_not;
    for (const auto& d : gen->prediction.devices) EXPECT_LE(d.memory_bytes, budget);
    EXPECT_GT(parallel::kv_cache_bytes(gen->plan, c, 1, 1024), 0) << "layers (and their caches) moved to device 1";
  }
}

TEST(Planner, ReasonsNameDevicesAsTheProfileNumbersThem) {
  // Device 1 cannot hold any layer; device 2 can: a row strategy runs on
  // {0, 2}, and the note on device 1 names device 1, not the subset's index.
  const model::ModelConfig c = bert_like();
  const ClusterProfile p = cluster({device(10), device(10, 1.0, 1000), device(10)}, 0.01, 1e5);
  PlannerOptions o;
  o.rows = 64;
  const auto cand = plan_strategy_any_subset(*parallel::find_strategy("sp"), c, p, o);
  ASSERT_TRUE(cand.ok());
  EXPECT_EQ(cand.value().members, (std::vector<int>{0, 2}));
  ASSERT_FALSE(cand.value().notes.empty());
  EXPECT_NE(cand.value().notes.back().find("device 1 left out: with it the plan is not feasible (device 1 needs"),
            std::string::npos)
      << cand.value().notes.back();
}

TEST(Planner, PipelineMapRespectsTheTerminalsBudget) {
  // The terminal, twice as fast, holds its embeddings and only one layer:
  // the dynamic programme puts the other three on device 1, contiguous.
  const model::ModelConfig c = bert_like();
  const int64_t layer_bytes = parallel::layer_weight_bytes(c, c.hidden, c.intermediate);
  const int64_t budget = parallel::terminal_weight_bytes(c) + layer_bytes * 3 / 2 + 8 * (64 * (7 * 256 + 1024) + 64 * 64 * 4);
  const ClusterProfile p = cluster({device(10, 1.0, budget), device(10, 0.5)}, 0.01, 1e5);
  PlannerOptions o;
  o.rows = 64;
  o.layer_solver = PlannerOptions::LayerSolver::kDp;
  const auto cand = plan_strategy(*parallel::find_strategy("pipeline"), c, p, {0, 1}, o);
  ASSERT_TRUE(cand.ok());
  EXPECT_TRUE(cand.value().feasible) << cand.value().why_not;
  const auto map = cand.value().plan.options.at("layer_map").get<std::vector<int>>();
  EXPECT_EQ(map, (std::vector<int>{0, 1, 1, 1}));
  // The ILP (the default) keeps the terminal to one layer too, and is no
  // slower by the cost model than the DP's contiguous map.
  o.layer_solver = PlannerOptions::LayerSolver::kIlp;
  o.ilp_load_time = true;  // the paper's objective, with Tw
  const auto exact = plan_strategy(*parallel::find_strategy("pipeline"), c, p, {0, 1}, o);
  ASSERT_TRUE(exact.ok());
  EXPECT_TRUE(exact.value().feasible) << exact.value().why_not;
  const auto emap = exact.value().plan.options.at("layer_map").get<std::vector<int>>();
  EXPECT_LE(std::count(emap.begin(), emap.end(), 0), 1);
  o.ilp_load_time = false;  // then the ILP's T is the cost model's latency plus the pinned head and embedding
  const auto no_tw = plan_strategy(*parallel::find_strategy("pipeline"), c, p, {0, 1}, o);
  ASSERT_TRUE(no_tw.ok());
  EXPECT_LE(no_tw.value().prediction.latency_ms, cand.value().prediction.latency_ms * (1 + 1e-9));
}

TEST(Profile, RoundTripsThroughJson) {
  ClusterProfile p = cluster({device(10, 0.5, 1000000), device(20)}, 1.5, 250);
  p.links[0][1].bandwidth_mbps = 125;
  const auto back = ClusterProfile::from_json(p.to_json());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value().to_json(), p.to_json());
  EXPECT_DOUBLE_EQ(back.value().link(0, 1).bandwidth_mbps, 125);
  EXPECT_DOUBLE_EQ(back.value().devices[0].speed, 0.5);
  EXPECT_FALSE(ClusterProfile::from_json(nlohmann::json::object()).ok());
  // Step profiles (one row, a batch's rows) round-trip and subset with their devices.
  p.steps.push_back({1, {device(2), device(3)}});
  p.steps.push_back({4, {device(5), device(6)}});
  const auto steps = ClusterProfile::from_json(p.to_json());
  ASSERT_TRUE(steps.ok()) << steps.status().message();
  EXPECT_EQ(steps.value().to_json(), p.to_json());
  ASSERT_NE(steps.value().step(4), nullptr);
  EXPECT_EQ(steps.value().step(2), nullptr);
  EXPECT_EQ(p.subset({1}).step(4)->devices.at(0).to_json(), device(6).to_json());
  // Malformed: a device short, two at the same rows, rows out of range.
  for (const auto& [bad, field] : {std::pair{R"([{"rows": 1, "devices": []}])", "devices"},
                                   std::pair{R"([{"rows": 0, "devices": [{}, {}]}])", "rows"}}) {
    nlohmann::json j = p.to_json();
    j["steps"] = nlohmann::json::parse(bad);
    const auto r = ClusterProfile::from_json(j);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().message();
  }
  nlohmann::json twice = p.to_json();
  twice["steps"][1]["rows"] = 1;
  EXPECT_FALSE(ClusterProfile::from_json(twice).ok());
}

// A quantized model's matrices run on other kernels than F32's: a profile
// keeps their rates apart (JSON: the sample's fifth element), the estimate
// stamps the plan's type on its GEMMs, and the cost model prices each at
// its type's rate, F32's where none was measured.
TEST(Profile, AQuantizedPlansGemmsArePricedAtTheirTypesRate) {
  DeviceProfile d = device(10);
  d.gemm.push_back({64, 256, 256, 40, kernels::WeightType::kQ8_0});
  EXPECT_DOUBLE_EQ(d.gemm_gflops(64, 256, 256), 10);
  EXPECT_DOUBLE_EQ(d.gemm_gflops(64, 256, 256, kernels::WeightType::kQ8_0), 40);
  EXPECT_DOUBLE_EQ(d.gemm_gflops(64, 256, 256, kernels::WeightType::kQ4_0), 10);  // none measured
  const ClusterProfile p = cluster({d}, 0.1, 1000);
  const auto back = ClusterProfile::from_json(p.to_json());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value().to_json(), p.to_json());
  EXPECT_DOUBLE_EQ(back.value().devices[0].gemm_gflops(64, 256, 256, kernels::WeightType::kQ8_0), 40);
  for (const char* bad : {R"([64, 256, 256, 40, "q9_9"])", R"([64, 256, 256, 40, 3])", R"([64, 256, 256, 40, "q8_0", 1])"}) {
    nlohmann::json j = p.to_json();
    j["devices"][0]["gemm"][1] = nlohmann::json::parse(bad);
    EXPECT_FALSE(ClusterProfile::from_json(j).ok()) << bad;
  }
  const model::ModelConfig c = bert_like();
  double gemm_ms[2] = {0, 0};
  int i = 0;
  for (const kernels::WeightType type : {kernels::WeightType::kF32, kernels::WeightType::kQ8_0}) {
    parallel::Plan plan;
    plan.weights = type;
    ASSERT_TRUE(parallel::complete_plan(plan, c).ok());
    const auto s = parallel::estimate(plan, c, 64);
    ASSERT_TRUE(s.ok()) << s.status().message();
    int gemms = 0;
    for (const auto& ph : s.value().devices[0].phases)
      for (const auto& w : ph.work)
        if (w.kind == parallel::WorkKind::kGemm) {
          EXPECT_EQ(w.weights, type) << w.what;
          gemm_ms[i] += work_ms(w, d);
          ++gemms;
        }
    EXPECT_GT(gemms, 0);
    ++i;
  }
  EXPECT_NEAR(gemm_ms[1], gemm_ms[0] / 4, 1e-9 * gemm_ms[0]);
}

// Measuring a quantized model's device adds its type's samples beside F32's,
// at every row count, and caches the profile apart from the F32 model's.
TEST(Profile, MeasuresAQuantizedModelsOwnKernels) {
  model::ModelConfig c = bert_like(1);
  c.weights = kernels::WeightType::kQ8_0;
  const auto d = measure_device(c, 2, 2, nullptr);
  ASSERT_TRUE(d.ok()) << d.status().message();
  std::set<std::pair<int64_t, int64_t>> f32, q8;  // (rows, k) of each type's samples
  for (const GemmSample& g : d.value().gemm) {
    EXPECT_GT(g.gflops, 0);
    (g.type == kernels::WeightType::kF32 ? f32 : q8).insert({g.m, g.k});
    EXPECT_TRUE(g.type == kernels::WeightType::kF32 || g.type == kernels::WeightType::kQ8_0);
  }
  EXPECT_FALSE(q8.empty());
  EXPECT_EQ(q8, f32);
  EXPECT_EQ(d->host, -1);  // a deployment names the host its local devices share
  model::ModelConfig f = c;
  f.weights = kernels::WeightType::kF32;
  EXPECT_NE(device_cache_path(c, 2, 1), device_cache_path(f, 2, 1));
}

// One-row samples and the streaming read go through more bytes than the
// last-level cache holds (twice it), unless the memory available is short.
TEST(Profile, ColdSamplesOutgrowTheLastLevelCache) {
  constexpr int64_t MB = int64_t{1} << 20, GB = int64_t{1} << 30;
  EXPECT_EQ(profile_cold_bytes(260 * MB, 23 * GB), 520 * MB);  // the Intel Xeon's 260 MB L3
  EXPECT_EQ(profile_cold_bytes(32 * MB, 23 * GB), 96 * MB);    // at least 96 MB
  EXPECT_EQ(profile_cold_bytes(260 * MB, 0), 520 * MB);        // memory unknown
  EXPECT_EQ(profile_cold_bytes(260 * MB, 2 * GB), 256 * MB);   // an eighth of the memory
  EXPECT_EQ(profile_cold_bytes(260 * MB, 512 * MB), 96 * MB);  // but never under 96 MB
  EXPECT_GE(profile_cold_bytes(), 96 * MB);
}

TEST(Profile, ParsesSizes) {
  EXPECT_EQ(parse_bytes("512MB").value(), 512000000);
  EXPECT_EQ(parse_bytes("1GiB").value(), 1073741824);
  EXPECT_EQ(parse_bytes("1.5GB").value(), 1500000000);
  EXPECT_FALSE(parse_bytes("12XB").ok());
  EXPECT_FALSE(parse_bytes("-1MB").ok());
}

}  // namespace
}  // namespace tessera::planner

namespace tessera::planner {
namespace {

// A generation is priced as its prompt's forward plus a decode step per
// further token (one row on the one-row profile). Over a range of link
// latencies: every decoding row gets a step, the choice is never predicted
// slower than the terminal alone over the whole generation, and where a
// prompt alone is planned on two devices a long generation may still keep
// to one (each step pays the links' latency per layer).
TEST(Planner, AGenerationIsPricedByItsFirstTokenAndItsDecodeSteps) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  int prompt_on_two_generation_on_one = 0;
  for (const double latency_ms : {0.01, 0.1, 0.5, 2.0}) {
    const ClusterProfile p = cluster({device(10), device(10)}, latency_ms, 10000);
    const ClusterProfile step = cluster({device(2), device(2)}, latency_ms, 10000);  // GEMV: bandwidth-bound
    PlannerOptions o;
    o.rows = 512;
    o.ctx_size = 1024;
    const auto prompt = plan_all(c, p, o);
    ASSERT_TRUE(prompt.ok());
    o.new_tokens = 500;
    o.step_profile = &step;
    const auto gen = plan_all(c, p, o);
    ASSERT_TRUE(gen.ok()) << gen.status().to_string();
    const Candidate& g = gen->rows[static_cast<size_t>(gen->chosen)];
    ASSERT_GT(g.step_ms, 0);
    EXPECT_NEAR(g.generation_ms(500), g.prediction.latency_ms + 499 * g.step_ms, 1e-9);
    for (const Candidate& r : gen->rows) {
      if (!r.feasible || !parallel::find_strategy(r.plan.strategy)->decodes()) continue;
      EXPECT_GT(r.step_ms, 0) << r.plan.strategy;
      // More devices than the choice must have been predicted slower, or not
      // enough faster to be worth them (PlannerOptions::min_gain).
      if (r.members.size() == g.members.size() && r.exact) {
        EXPECT_GE(r.generation_ms(500), g.generation_ms(500) * 0.99 - 1e-9) << r.plan.strategy << " " << latency_ms;
      }
    }
    EXPECT_LE(g.generation_ms(500), row_of(gen.value(), "single").generation_ms(500) * 1.01 + 1e-9) << latency_ms;
    // The prompt alone priced the same rows the same way.
    EXPECT_NEAR(row_of(gen.value(), "tp").prediction.latency_ms, row_of(prompt.value(), "tp").prediction.latency_ms, 1e-9);
    const Candidate& f = prompt->rows[static_cast<size_t>(prompt->chosen)];
    // The generation decodes on the terminal alone (after a prefill on two, or not).
    if (f.members.size() > 1 && g.decode_devices == 1) ++prompt_on_two_generation_on_one;
  }
  EXPECT_GT(prompt_on_two_generation_on_one, 0);  // the case the pricing is for
}

// A step's attention reads the cached positions: the longer the prompt, the
// slower each step, by the K/V bytes read at the streaming rate; a TP shard
// reads its own heads' share, an F16 cache half the bytes.
TEST(Planner, AStepIsPricedWithItsReadOfTheCaches) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  const ClusterProfile p = cluster({device(10), device(10)}, 0.1, 10000);
  auto steps = [&](int64_t prompt, core::DType kv) {
    PlannerOptions o;
    o.rows = prompt;
    o.ctx_size = 1024;
    o.new_tokens = 32;
    o.kv_dtype = kv;
    const auto t = plan_all(c, p, o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::pair{row_of(t.value(), "single").step_ms, row_of(t.value(), "tp").step_ms};
  };
  const auto [single128, tp128] = steps(128, core::DType::kF32);
  const auto [single512, tp512] = steps(512, core::DType::kF32);
  const auto [single512h, tp512h] = steps(512, core::DType::kF16);
  // 384 more keys in each of 12 layers: K and V, 256 floats each, at 10 GB/s.
  const double more_ms = 384.0 * 12 * 2 * 256 * 4 / 10e9 * 1e3;
  EXPECT_NEAR(single512 - single128, more_ms, 1e-6);
  EXPECT_NEAR(tp512 - tp128, more_ms / 2, 1e-6);  // two heads of four each
  EXPECT_NEAR(single512 - single512h, (more_ms / 384 * (512 + 16)) / 2, 1e-6);
}

// serve --max-batch B: a step decodes B sequences' rows together, and each
// row reads its own sequence's caches, so a longer prompt costs every step B
// times the cache reads it costs one sequence. Quantized steps batch at most
// the decode kernels' 8 rows (16 sequences wait two steps a token). (A
// layout whose decoders do not batch: batch_pricing_test.cpp.)
TEST(Planner, ABatchedStepReadsEverySequencesCaches) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  const ClusterProfile p = cluster({device(10), device(10)}, 0.1, 10000);
  auto step = [&](int64_t prompt, int64_t batch, kernels::WeightType w, const std::string& s = "single") {
    PlannerOptions o;
    o.rows = prompt;
    o.ctx_size = 1024;
    o.new_tokens = 32;
    o.decode_batch = batch;
    model::ModelConfig cw = c;
    cw.weights = w;
    const auto t = plan_all(cw, p, o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    const Candidate& r = row_of(t.value(), s);
    const bool batches = parallel::find_strategy(s)->batches_steps();
    const int64_t rows = !batches ? 1 : w == kernels::WeightType::kF32 ? batch : std::min<int64_t>(batch, 8);
    const std::string note = rows == batch ? "steps of " + std::to_string(rows) + " sequences' rows"
                                           : std::to_string(batch) + " sequences in " + std::to_string(batch / rows) +
                                                 " steps of " + std::to_string(rows) + " row(s) a token";
    if (batch > 1) {
      EXPECT_TRUE(std::any_of(r.notes.begin(), r.notes.end(), [&](const std::string& n) { return n.find(note) != std::string::npos; }))
          << s << ": " << note;
    }
    return r.step_ms;
  };
  const double more_ms = 384.0 * 12 * 2 * 256 * 4 / 10e9 * 1e3;  // 384 more keys, one sequence
  const kernels::WeightType f32 = kernels::WeightType::kF32, q8 = kernels::WeightType::kQ8_0;
  EXPECT_NEAR(step(512, 1, f32) - step(128, 1, f32), more_ms, 1e-6);
  EXPECT_NEAR(step(512, 8, f32) - step(128, 8, f32), 8 * more_ms, 1e-6);
  EXPECT_GT(step(128, 8, f32), step(128, 1, f32));  // eight rows through the layers and the head
  EXPECT_NEAR(step(512, 16, q8) - step(128, 16, q8), 16 * more_ms, 1e-6);
  EXPECT_NEAR(step(128, 16, q8), 2 * step(128, 8, q8), 1e-9);
  EXPECT_NEAR(step(512, 8, f32, "tp") - step(128, 8, f32, "tp"), 8 * more_ms / 2, 1e-6);  // two heads of four each
}

// A pipeline's overlapped steps (serve --max-batch): two groups of 4 rows
// in flight on 2 devices, so a call costs the busiest device's time on one
// group and a token two calls. With GEMMs bound by compute and uneven
// stages that is below the price of the 8 rows through the stages in turn
// (the note gives both), but not below half of it; the plan keeps them on.
TEST(Planner, APipelinesOverlappedStepIsPricedOnOneGroupAtEachStage) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  // Memory for about half the weights and caches each: a pipeline must use both devices.
  const ClusterProfile p = cluster({device(10, 1.0, 45'000'000), device(10, 1.0, 45'000'000)}, 0.1, 10000);
  PlannerOptions o;
  o.rows = 128;
  o.ctx_size = 1024;
  o.new_tokens = 32;
  o.decode_batch = 8;
  o.layer_solver = PlannerOptions::LayerSolver::kDp;  // contiguous ranges: the stages are the ranks in order
  const auto t = plan_all(c, p, o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Candidate* row = nullptr;
  for (const Candidate& r : t.value().rows)
    if (r.plan.strategy == "pipeline" && r.members.size() == 2 && !r.plan.decode) row = &r;
  ASSERT_NE(row, nullptr);
  const std::string key = "overlapped: 2 groups of 4 rows, one at each stage (";
  double in_turn = 0;
  for (const std::string& n : row->notes)
    if (const size_t at = n.find(key); at != std::string::npos) in_turn = std::stod(n.substr(at + key.size()));
  ASSERT_GT(in_turn, 0) << "no overlapped price in the notes";
  EXPECT_LT(row->step_ms, in_turn);
  EXPECT_GE(row->step_ms, in_turn / 2);
  EXPECT_EQ(row->plan.options.value("overlap", false), true);
  // Both devices on one host, whose bandwidth feeds them 2 GB/s each at
  // once: the stages computing together now wait on their weights, and the
  // steps cost more (each alone, in turn, still streams at 10).
  ClusterProfile shared = p;
  for (auto& d : shared.devices) d.host = 0, d.host_stream_gbps = 4;
  const auto t2 = plan_all(c, shared, o);
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  bool seen = false;
  for (const Candidate& r : t2.value().rows)
    if (r.plan.strategy == "pipeline" && r.members.size() == 2 && !r.plan.decode) {
      EXPECT_GT(r.step_ms, row->step_ms * 1.01);
      EXPECT_LE(r.step_ms, in_turn + 1e-3);  // the note gives 3 decimals
      seen = true;
    }
  EXPECT_TRUE(seen);
  // One sequence alone never overlaps: its price is a step in turn.
  o.decode_batch = 1;
  const auto alone = plan_all(c, p, o);
  ASSERT_TRUE(alone.ok());
  for (const Candidate& r : alone.value().rows)
    for (const std::string& n : r.notes) EXPECT_EQ(n.find("overlapped"), std::string::npos) << n;
}

// Overlapped steps want even stages, and the terminal's stage also runs the
// LM head: with a head as large as 10 of the 12 layers, a pipeline decoding
// on 2 devices gives the terminal fewer layers than the other device, in
// rank order (so the steps overlap), where the prompt's map would not.
TEST(Planner, OverlappedStepsGiveTheTerminalFewerLayersForItsHead) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
      "n_embd": 256, "n_head": 4, "vocab_size": 32000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  // Neither device holds the model with its caches: the decode takes both.
  const ClusterProfile p = cluster({device(10, 1.0, 70'000'000), device(10, 1.0, 70'000'000)}, 0.1, 10000);
  PlannerOptions o;
  o.rows = 128;
  o.ctx_size = 1024;
  o.new_tokens = 32;
  o.decode_batch = 8;
  o.layer_solver = PlannerOptions::LayerSolver::kDp;
  const auto t = plan_all(c, p, o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  int evened = 0;
  for (const Candidate& r : t.value().rows) {
    const parallel::Plan& d = parallel::decode_plan(r.plan);
    if (!r.feasible || d.strategy != "pipeline" || d.world != 2 || r.step_ms <= 0) continue;
    bool noted = false;
    for (const std::string& n : r.notes) noted = noted || n.find("even its stages out") != std::string::npos;
    if (!noted) continue;
    ++evened;
    const auto map = d.options.at("layer_map").get<std::vector<int>>();
    ASSERT_EQ(map.size(), 12u);
    EXPECT_TRUE(std::is_sorted(map.begin(), map.end())) << "stages out of rank order";
    const auto on0 = std::count(map.begin(), map.end(), 0);
    EXPECT_GE(on0, 1);
    EXPECT_LT(on0, 12 - on0) << r.plan.strategy;
    EXPECT_EQ(d.options.value("overlap", false), true);
    // What the plan runs is what it priced: the decode plan overlaps.
    EXPECT_EQ(parallel::find_strategy("pipeline")->overlapped_stages(d, c), 2);
  }
  EXPECT_GT(evened, 0) << "no pipeline decode was evened out";
}

// A generation's caches are mapped lazily: the first token costs the
// slowest device's cache bytes of the prompt's positions at its rate of
// faulting pages in, whatever the context; the steps cost nothing more; a
// profile without the rate prices none.
TEST(Planner, AGenerationsFirstTokenPaysForZeroingItsCaches) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  PlannerOptions o;
  o.rows = 128;
  o.ctx_size = 1024;
  o.new_tokens = 8;
  const ClusterProfile none = cluster({device(10), device(10)}, 0.1, 10000);
  ClusterProfile zeroing = none;
  zeroing.devices[0].zero_gbps = 5;
  zeroing.devices[1].zero_gbps = 2.5;  // the slower device decides
  for (const int64_t ctx : {1024, 256}) {
    o.ctx_size = ctx;
    const auto a = plan_all(c, none, o), b = plan_all(c, zeroing, o);
    ASSERT_TRUE(a.ok() && b.ok());
    for (const std::string s : {"single", "tp"}) {
      const Candidate &x = row_of(a.value(), s), &y = row_of(b.value(), s);
      double slowest = 0;
      for (int d = 0; d < static_cast<int>(y.members.size()); ++d)
        slowest = std::max(slowest, 1e3 * static_cast<double>(parallel::kv_cache_bytes(y.plan, c, d, o.rows)) /
                                        (zeroing.devices[static_cast<size_t>(y.members[static_cast<size_t>(d)])].zero_gbps * 1e9));
      EXPECT_GT(slowest, 0) << s;
      EXPECT_NEAR(y.prediction.latency_ms - x.prediction.latency_ms, slowest, 1e-9) << s << ", context " << ctx;
      EXPECT_NEAR(y.step_ms, x.step_ms, 1e-12) << s;
    }
  }
}

// The prefill writes the caches layer by layer with the devices in step:
// layers split between devices (a pipeline decode) cost the sum of both
// devices' faults, heads split (tp) only each layer's slower share. So a
// Voltage prefill before a pipeline decode saves no faulting over one
// before a single device's decode.
TEST(Planner, CacheFaultsAddUpLayerByLayer) {
  const model::ModelConfig c = model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
                                   .value();
  ClusterProfile p = cluster({device(10), device(10)}, 0.1, 10000);
  p.devices[0].zero_gbps = 2;
  p.devices[1].zero_gbps = 1;
  const int64_t n = 128;
  auto fault_ms = [&](const std::string& prefill, const std::string& decode, int decode_world) {
    parallel::Plan plan;
    plan.strategy = prefill;
    plan.world = 2;
    parallel::Plan d;
    d.strategy = decode;
    d.world = decode_world;
    plan.decode = std::make_shared<const parallel::Plan>(d);
    EXPECT_TRUE(parallel::complete_plan(plan, c).ok()) << prefill << "+" << decode;
    auto s = parallel::estimate(plan, c, n);
    EXPECT_TRUE(s.ok());
    parallel::add_kv_cache(s.value(), plan, c, n);
    auto base = predict(s.value(), p);
    EXPECT_TRUE(base.ok());
    Prediction with = base.value();
    add_cache_allocation(with, s.value(), p);
    return std::pair(with.latency_ms - base.value().latency_ms, s.value());
  };
  const double layer_ms = 1e3 * static_cast<double>(2 * n * c.kv_width() * 4) / 1e9;  // one layer's K and V at 1 GB/s
  {
    auto [ms, s] = fault_ms("voltage", "single", 1);
    EXPECT_NEAR(ms, 12 * layer_ms / 2, 1e-9) << "the terminal (2 GB/s) holds every layer";
  }
  {
    auto [ms, s] = fault_ms("voltage", "pipeline", 2);
    ASSERT_GT(s.devices[0].kv_bytes(), 0);
    ASSERT_GT(s.devices[1].kv_bytes(), 0);
    const double l0 = static_cast<double>(s.devices[0].kv_bytes()) / static_cast<double>(2 * n * c.kv_width() * 4);
    EXPECT_NEAR(ms, l0 * layer_ms / 2 + (12 - l0) * layer_ms, 1e-9) << "each device's layers in turn";
  }
  {
    auto [ms, s] = fault_ms("voltage", "tp", 2);
    EXPECT_EQ(s.devices[0].kv_bytes(), s.devices[1].kv_bytes());
    EXPECT_NEAR(ms, 12 * layer_ms / 2, 1e-9) << "each layer's half on the slower device (1 GB/s)";
  }
}

// A 12-layer GPT-2 of width 256: a pair's prefill and steps both matter.
model::ModelConfig twelve_layer_gpt2() {
  return model::parse_config(R"({"model_type": "gpt2", "n_embd": 256, "n_head": 4,
      "vocab_size": 1000, "n_positions": 1024, "n_layer": 12})")
      .value();
}

// min_gain weighs the phases a plan runs on more devices: a pair that
// prefills on two and decodes on the terminal must save 10% of the terminal's
// prefill, not of the whole generation, whose steps both run alike.
TEST(Planner, AMoreDevicesMarginWeighsOnlyThePhasesOnMoreDevices) {
  const model::ModelConfig c = twelve_layer_gpt2();
  const ClusterProfile p = cluster({device(10), device(10)}, 0.5, 10000);
  const ClusterProfile step = cluster({device(2), device(2)}, 0.5, 10000);  // GEMV: bandwidth-bound
  int pair_under_a_tenth_of_the_whole = 0;
  for (const int64_t n : {16, 64, 128, 256, 500}) {
    PlannerOptions o;
    o.rows = 512;
    o.ctx_size = 1024;
    o.new_tokens = n;
    o.step_profile = &step;
    const auto gen = plan_all(c, p, o);
    ASSERT_TRUE(gen.ok()) << gen.status().to_string();
    const Candidate& g = gen->rows[static_cast<size_t>(gen->chosen)];
    const Candidate& single = row_of(gen.value(), "single");
    for (const Candidate& r : gen->rows) {
      if (!r.feasible || !r.exact || r.step_ms <= 0 || r.members.size() <= g.members.size()) continue;
      // Not chosen: it saved at most a tenth of the chosen plan's time in the
      // phases it runs on more devices.
      double phases = r.members.size() > g.members.size() ? g.prediction.latency_ms : 0.0;
      if (r.decode_devices > g.decode_devices) phases += static_cast<double>(n - 1) * g.step_ms;
      EXPECT_LE(g.generation_ms(n) - r.generation_ms(n), 0.1 * phases + 1e-9) << parallel::plan_name(r.plan) << " " << n;
    }
    if (g.plan.decode && g.decode_devices == 1) {
      EXPECT_GT(single.generation_ms(n) - g.generation_ms(n), 0.1 * single.prediction.latency_ms) << n;
      if (g.generation_ms(n) > 0.9 * single.generation_ms(n)) ++pair_under_a_tenth_of_the_whole;
    }
  }
  EXPECT_GT(pair_under_a_tenth_of_the_whole, 0);  // the case the rule is for
}

// A pair (Voltage's prefill, the terminal's decode): its first token costs
// Voltage's forward, each step the terminal's, its memory Voltage's weights
// and the terminal's whole KV cache. Where links are fast and steps short,
// auto takes it over both of its halves.
// A 16-token generation after a 512-token prompt, 1024 positions of cache.
PlannerOptions generation_options(const ClusterProfile& step) {
  PlannerOptions o;
  o.rows = 512;
  o.ctx_size = 1024;
  o.new_tokens = 16;
  o.step_profile = &step;
  return o;
}

TEST(Planner, APairIsPricedByItsPrefillAndItsDecodeLayouts) {
  const model::ModelConfig c = twelve_layer_gpt2();
  const ClusterProfile p = cluster({device(10), device(10)}, 0.5, 10000);
  const ClusterProfile step = cluster({device(2), device(2)}, 0.5, 10000);  // GEMV: bandwidth-bound
  const PlannerOptions o = generation_options(step);
  const auto gen = plan_all(c, p, o);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  const Candidate* pair = nullptr;
  std::map<std::string, int> pairs;  // by decode strategy
  const Candidate& voltage = row_of(gen.value(), "voltage");
  for (const Candidate& r : gen->rows) {
    if (!r.plan.decode) continue;
    ++pairs[r.plan.decode->strategy];
    if (r.plan.strategy == "voltage" && r.plan.decode->strategy == "single") pair = &r;
    if (r.plan.strategy == "voltage" && r.plan.decode->strategy == "pipeline") {
      // A pipeline decode on both devices: each holds the caches of its own layers.
      ASSERT_EQ(r.plan.decode->world, 2);
      for (int d = 0; d < 2; ++d)
        EXPECT_EQ(r.prediction.devices[static_cast<size_t>(d)].memory_bytes,
                  voltage.prediction.devices[static_cast<size_t>(d)].memory_bytes +
                      parallel::kv_cache_bytes(*r.plan.decode, c, d, o.ctx_size));
      EXPECT_GT(r.step_ms, 0);
    }
    if (r.plan.strategy == "voltage" && r.plan.decode->strategy == "tp") {
      // A TP decode: each device loads its shard's layers beside Voltage's
      // whole ones (not the terminal's embeddings and head again), and keeps
      // its heads' caches. Its steps are the tp row's.
      ASSERT_EQ(r.plan.decode->world, 2);
      const auto shard = parallel::estimate(*r.plan.decode, c, 1).value();
      for (int d = 0; d < 2; ++d) {
        const int64_t layers = shard.devices[static_cast<size_t>(d)].weight_bytes - (d == 0 ? parallel::terminal_weight_bytes(c) : 0);
        EXPECT_GT(layers, 0);
        EXPECT_EQ(r.prediction.devices[static_cast<size_t>(d)].memory_bytes,
                  voltage.prediction.devices[static_cast<size_t>(d)].memory_bytes + layers +
                      parallel::kv_cache_bytes(*r.plan.decode, c, d, o.ctx_size));
      }
      EXPECT_NEAR(r.step_ms, row_of(gen.value(), "tp").step_ms, 1e-9);
    }
    if (r.plan.strategy == "galaxy") {
      // Galaxy's prefill sends the terminal its K/V heads (a cost on the first
      // token); the terminal loads whole layers beside its shard and keeps
      // every cache, device 1 none (Galaxy's own decode keeps its heads' there).
      const Candidate& galaxy = row_of(gen.value(), "galaxy");
      EXPECT_EQ(r.plan.decode->strategy, "single");
      EXPECT_GT(r.prediction.latency_ms, galaxy.prediction.latency_ms);
      EXPECT_GT(r.prediction.devices[0].memory_bytes,
                galaxy.prediction.devices[0].memory_bytes + parallel::kv_cache_bytes(*r.plan.decode, c, 0, o.ctx_size));
      EXPECT_EQ(r.prediction.devices[1].memory_bytes,
                galaxy.prediction.devices[1].memory_bytes - parallel::kv_cache_bytes(galaxy.plan, c, 1, o.ctx_size));
      EXPECT_NEAR(r.step_ms, row_of(gen.value(), "single").step_ms, 1e-9);
    }
  }
  // voltage's and sp's prefill, each with the terminal's decode, a pipeline's and TP's;
  // galaxy's with the terminal's
  EXPECT_EQ(pairs, (std::map<std::string, int>{{"pipeline", 2}, {"single", 3}, {"tp", 2}}));
  ASSERT_NE(pair, nullptr);
  // Into F16 caches no prefill hands its K/V over (it attends over unrounded
  // ones): no pairs are priced then.
  {
    PlannerOptions half = o;
    half.kv_dtype = core::DType::kF16;
    const auto h = plan_all(c, p, half);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    for (const Candidate& r : h->rows) EXPECT_FALSE(r.plan.decode) << r.plan.to_json().dump();
  }
  const Candidate& single = row_of(gen.value(), "single");
  EXPECT_EQ(pair->plan.strategy, "voltage");
  EXPECT_EQ(pair->plan.decode->world, 1);
  EXPECT_EQ(voltage.step_ms, 0);  // Voltage alone does not decode
  EXPECT_NEAR(pair->prediction.latency_ms, voltage.prediction.latency_ms, 1e-9);
  EXPECT_NEAR(pair->step_ms, single.step_ms, 1e-9);
  const int64_t kv = parallel::kv_cache_bytes(single.plan, c, 0, o.ctx_size);
  ASSERT_GT(kv, 0);
  EXPECT_EQ(pair->prediction.devices[0].memory_bytes, voltage.prediction.devices[0].memory_bytes + kv);
  EXPECT_EQ(pair->prediction.devices[1].memory_bytes, voltage.prediction.devices[1].memory_bytes);
  const Candidate& g = gen->rows[static_cast<size_t>(gen->chosen)];
  EXPECT_TRUE(g.plan.decode) << g.plan.to_json().dump();
  EXPECT_LT(pair->generation_ms(16), single.generation_ms(16));
  // A memory budget that holds Voltage's weights but not the terminal's caches too.
  ClusterProfile tight = p;
  for (auto& d : tight.devices) d.memory_bytes = voltage.prediction.devices[0].memory_bytes + kv / 2 + d.runtime_bytes;
  const auto t = plan_all(c, tight, o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  for (const Candidate& r : t->rows) {
    EXPECT_TRUE(!r.plan.decode || !r.feasible);
  }
}

// On 4 devices, a pair's decode is priced on each prefix of its prefill's
// devices too: TP and a pipeline on the first 2 and 3. The devices past it
// keep no cache, and the planner says where it decodes
// (Candidate::decode_devices).
TEST(Planner, APairsDecodeIsPricedOnTheFirstDevicesOfItsPrefills) {
  const model::ModelConfig c = twelve_layer_gpt2();
  const ClusterProfile p = cluster({device(10), device(10), device(10), device(10)}, 0.5, 10000);
  const ClusterProfile step = cluster({device(2), device(2), device(2), device(2)}, 0.5, 10000);
  const PlannerOptions o = generation_options(step);
  const auto gen = plan_all(c, p, o);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  const Candidate& voltage = row_of(gen.value(), "voltage");
  ASSERT_EQ(voltage.members.size(), 4u);
  std::set<std::pair<std::string, int>> seen;
  for (const Candidate& r : gen->rows) {
    if (!r.plan.decode || r.plan.strategy != "voltage" || r.members != voltage.members) continue;
    const parallel::Plan& d = *r.plan.decode;
    seen.insert({d.strategy, d.world});
    EXPECT_EQ(r.decode_devices, d.world) << r.plan.to_json().dump();
    EXPECT_NEAR(r.prediction.latency_ms, voltage.prediction.latency_ms, 1e-9);
    if (d.world < 2 || d.world == 4) continue;
    EXPECT_TRUE(r.step_ms > 0 && std::isfinite(r.step_ms)) << r.plan.to_json().dump();
    EXPECT_TRUE(r.feasible);
    for (int dev = d.world; dev < 4; ++dev)
      EXPECT_EQ(r.prediction.devices[static_cast<size_t>(dev)].memory_bytes,
                voltage.prediction.devices[static_cast<size_t>(dev)].memory_bytes) << dev;
    EXPECT_GT(r.prediction.devices[0].memory_bytes, voltage.prediction.devices[0].memory_bytes);
  }
  for (const char* s : {"tp", "pipeline"})
    for (int w : {2, 3, 4}) EXPECT_TRUE(seen.count({s, w})) << s << " on " << w;
  EXPECT_TRUE(seen.count({"single", 1}));
}

// A decode may run on devices that are not the first of its prefill's. The
// row is then reordered so that they run first (a decode takes the first
// ranks), the others after in the row's order, and the prefill planned again
// on that order: as fast, since its devices are the same.
bool names_its_devices(const Candidate& r) {
  for (const std::string& n : r.notes)
    if (n.find("which run first") != std::string::npos) return true;
  return false;
}

void expect_reordered(const Candidate& r, const Candidate& row, int first) {
  EXPECT_EQ(r.members[0], 0);
  EXPECT_EQ(r.members[1], first);
  std::vector<int> rest;
  for (int m : row.members)
    if (m != 0 && m != first) rest.push_back(m);
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), r.members.begin() + 2));
  EXPECT_EQ(r.plan.world, static_cast<int>(row.members.size()));
  EXPECT_EQ(r.decode_devices, 2);
  EXPECT_TRUE(r.step_ms > 0 && std::isfinite(r.step_ms));
  EXPECT_NEAR(r.prediction.latency_ms, row.prediction.latency_ms, 1e-6 * row.prediction.latency_ms);
  EXPECT_TRUE(names_its_devices(r));
}

// Where device 1 has room for Voltage's prefill but not for a TP decode beside
// it, the pair decodes on devices 0 and 2.
TEST(Planner, APairsDecodeTakesTheDevicesThatHoldIt) {
  const model::ModelConfig c = twelve_layer_gpt2();
  ClusterProfile p = cluster({device(10), device(10), device(10)}, 0.5, 10000);
  const ClusterProfile step = cluster({device(2), device(2), device(2)}, 0.5, 10000);
  const PlannerOptions o = generation_options(step);
  const auto roomy = plan_all(c, p, o);
  ASSERT_TRUE(roomy.ok()) << roomy.status().to_string();
  const Candidate& v = row_of(roomy.value(), "voltage");
  ASSERT_EQ(v.members, (std::vector<int>{0, 1, 2}));
  p.devices[1].memory_bytes = v.prediction.devices[1].memory_bytes + 1000000;
  const auto t = plan_all(c, p, o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const Candidate& voltage = row_of(t.value(), "voltage");
  ASSERT_TRUE(voltage.feasible) << voltage.why_not;
  ASSERT_EQ(voltage.members, (std::vector<int>{0, 1, 2}));
  const Candidate* on_2 = nullptr;
  for (const Candidate& r : t->rows) {
    if (!r.plan.decode || r.plan.strategy != "voltage" || r.plan.decode->strategy != "tp" || r.plan.decode->world != 2) continue;
    if (r.members[1] == 1) {
      EXPECT_FALSE(r.feasible) << "a TP decode on device 1, which has no room for it";
      EXPECT_FALSE(names_its_devices(r));
    } else {
      on_2 = &r;
    }
  }
  ASSERT_NE(on_2, nullptr) << "no pair decodes on the terminal and device 2";
  EXPECT_TRUE(on_2->feasible) << on_2->why_not;
  expect_reordered(*on_2, voltage, 2);
  // Device 1, now last, keeps the prefill's memory only.
  EXPECT_LE(on_2->prediction.devices[2].memory_bytes, p.devices[1].memory_bytes);
}

// Devices alike at the prompt, of which the last is 4x as fast as the others
// but the terminal at a one-row step: a TP decode on two is fastest on the
// terminal and it. With 4 devices every set of 2 and 3 is priced; with 7 the
// first ones and those whose step with the terminal is priced fastest.
TEST(Planner, APairsDecodeTakesTheDevicesFastestAtAStep) {
  const model::ModelConfig c = twelve_layer_gpt2();
  for (const int k : {4, 7}) {
    SCOPED_TRACE(k);
    const ClusterProfile p = cluster(std::vector<DeviceProfile>(static_cast<size_t>(k), device(10)), 0.5, 10000);
    std::vector<DeviceProfile> slow(static_cast<size_t>(k), device(0.5));
    slow.front() = slow.back() = device(2);
    const ClusterProfile step = cluster(slow, 0.5, 10000);
    const PlannerOptions o = generation_options(step);
    const auto t = plan_all(c, p, o);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const Candidate& voltage = row_of(t.value(), "voltage");
    ASSERT_EQ(voltage.members.size(), static_cast<size_t>(k));
    ASSERT_NE(voltage.members[1], k - 1);
    const Candidate* fastest = nullptr;
    const Candidate* prefix = nullptr;
    for (const Candidate& r : t->rows) {
      if (!r.plan.decode || r.plan.strategy != "voltage" || r.plan.decode->strategy != "tp" || r.plan.decode->world != 2) continue;
      ASSERT_TRUE(r.feasible) << r.why_not;
      if (fastest == nullptr || r.step_ms < fastest->step_ms) fastest = &r;
      if (r.members == voltage.members) prefix = &r;
    }
    ASSERT_NE(fastest, nullptr);
    ASSERT_NE(prefix, nullptr);
    expect_reordered(*fastest, voltage, k - 1);
    EXPECT_LT(fastest->step_ms, prefix->step_ms);
  }
}

}  // namespace
}  // namespace tessera::planner
