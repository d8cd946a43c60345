// Collectives over inproc (ranks as threads) against references, world
// sizes 1..8 with uneven and empty parts; the ring-step API; accounting.
#include <gtest/gtest.h>

#include "comm_test_util.h"

using namespace tessera;
using namespace tessera::comm;
using namespace tessera::comm::testing;
using namespace std::chrono_literals;

class CollectivesInproc : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesInproc, MatchReference) {
  const int k = GetParam();
  for (int seed = 0; seed < 3; ++seed) {
    auto st = run_inproc(k, [seed](Group& g) { return check_all_collectives(g, seed); });
    ASSERT_TRUE(all_ok(st)) << "k=" << k << " seed=" << seed << "\n" << statuses_to_string(st);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesInproc, ::testing::Range(1, 9));

TEST(Collectives, RepeatedCallsOnOneTagStayInStep) {
  auto st = run_inproc(4, [](Group& g) -> core::Status {
    for (int i = 0; i < 50; ++i) {
      core::Tensor t = core::Tensor::from_f32({1}, {static_cast<float>(i + g.rank())});
      TESSERA_RETURN_IF_ERROR(allreduce(g, AllreduceOptions{5000ms, 0}, &t));
      TESSERA_EXPECT_OR_FAIL(t.f32()[0] == static_cast<float>(4 * i + 6), "iteration " + std::to_string(i));
      TESSERA_RETURN_IF_ERROR(barrier(g, BarrierOptions{5000ms, 0}));
    }
    return core::ok_status();
  });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, RingAllgatherStepsInRingOrder) {
  const int k = 5;
  auto st = run_inproc(k, [](Group& g) -> core::Status {
    const int r = g.rank();
    RingAllgather ring(g, AllgatherOptions{5000ms, 0});
    TESSERA_RETURN_IF_ERROR(ring.start(rows_tensor(r, r, 2)));  // rank r holds r rows
    std::vector<bool> seen(k, false);
    for (int s = 0; s < k; ++s) {
      TESSERA_EXPECT_OR_FAIL(!ring.done(), "done too early");
      TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile());
      TESSERA_EXPECT_OR_FAIL(t.index == (r - s + k) % k, "ring order");
      TESSERA_EXPECT_OR_FAIL(t.data.dim(0) == t.index, "tile rows");
      if (t.index > 0) TESSERA_EXPECT_OR_FAIL(t.data.f32()[1] == value_of(t.index, 0, 1), "tile data");
      seen[t.index] = true;
      std::this_thread::sleep_for(5ms);  // compute while the next tile arrives
    }
    TESSERA_EXPECT_OR_FAIL(ring.done(), "done");
    TESSERA_EXPECT_OR_FAIL(!ring.next_tile().ok(), "no tile after the last");
    return ring.finish();
  });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, RingAllgatherSaysWhetherTheNextTileIsIn) {
  // Rank 1 starts its ring only after rank 0 has looked: then rank 1's tile
  // cannot be in yet at rank 0, whatever the timing.
  std::atomic<bool> looked{false};
  auto st = run_inproc(
      2,
      [&](Group& g) -> core::Status {
        if (g.rank() == 1) TESSERA_EXPECT_OR_FAIL(compute_until([&] { return looked.load(); }), "rank 0 never looked");
        RingAllgather ring(g, AllgatherOptions{5000ms, 0});
        TESSERA_RETURN_IF_ERROR(ring.start(rows_tensor(g.rank(), 100, 250)));
        TESSERA_EXPECT_OR_FAIL(ring.next_ready(), "the own tile is always ready");
        TESSERA_ASSIGN_OR_RETURN(Tile own, ring.next_tile());
        if (g.rank() == 0) {
          TESSERA_EXPECT_OR_FAIL(!ring.next_ready(), "rank 1 has not sent its tile yet");
          looked = true;
        }
        TESSERA_EXPECT_OR_FAIL(compute_until([&] { return ring.next_ready(); }), "the other tile never came");
        TESSERA_ASSIGN_OR_RETURN(Tile other, ring.next_tile(0ms));  // ready: no wait needed
        TESSERA_EXPECT_OR_FAIL(other.index == 1 - g.rank(), "ring order");
        TESSERA_EXPECT_OR_FAIL(ring.done() && ring.next_ready(), "none left counts as ready");
        return ring.finish();
      },
      [](GroupOptions& o) { o.links = LinkMatrix::uniform(2, LinkSpec{8e6, 0}); });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, RingTilesArriveWhileTheConsumerComputes) {
  // 4 ranks, 500 KB tiles over 40 Mbit/s links (~100 ms a hop). Each rank
  // computes until its next tile is in and only then takes it, with no wait:
  // the ring moves (receives and forwards) while every consumer is busy.
  // (How much time that overlap saves is a speed property, for the
  // benchmarks: bench/strategies.sh runs galaxy with and without it.)
  const int k = 4;
  auto st = run_inproc(
      k,
      [](Group& g) -> core::Status {
        RingAllgather ring(g, AllgatherOptions{10000ms, 0});
        TESSERA_RETURN_IF_ERROR(ring.start(core::Tensor::zeros(core::DType::kU8, {500000})));
        for (int s = 0; !ring.done(); ++s) {
          TESSERA_EXPECT_OR_FAIL(compute_until([&] { return ring.next_ready(); }), "tile " + std::to_string(s) + " never came");
          TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile(0ms));  // ready: no waiting
          TESSERA_EXPECT_OR_FAIL(t.index == (g.rank() - s + k) % k && t.data.nbytes() == 500000, "tile");
        }
        return ring.finish();
      },
      [](GroupOptions& o) { o.links = LinkMatrix::uniform(4, LinkSpec{40e6, 0}); });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, SlowConsumerDoesNotDelayTheRing) {
  // Rank 0 looks at its tiles only once every other rank has finished the
  // whole allgather, which needs rank 0 to forward tiles it has not looked
  // at: the tiles pass through it at once. Were forwarding left to the
  // consumer, the others could not finish and rank 0 would give up waiting.
  const int k = 4;
  std::atomic<int> finished{0};
  auto st = run_inproc(
      k,
      [&](Group& g) -> core::Status {
        RingAllgather ring(g, AllgatherOptions{30000ms, 0});
        TESSERA_RETURN_IF_ERROR(ring.start(rows_tensor(g.rank(), 1000, 125)));  // 500 KB
        if (g.rank() == 0) {
          const bool others_done = compute_until([&] { return finished == k - 1; });
          TESSERA_EXPECT_OR_FAIL(others_done, std::to_string(finished) + " of " + std::to_string(k - 1) +
                                                  " ranks finished while rank 0 had not looked at a tile");
        }
        while (!ring.done()) {
          TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile());
          TESSERA_EXPECT_OR_FAIL(t.data.f32()[130] == value_of(t.index, 1, 5), "tile data");
        }
        TESSERA_RETURN_IF_ERROR(ring.finish());
        if (g.rank() != 0) ++finished;
        return core::ok_status();
      },
      [](GroupOptions& o) { o.links = LinkMatrix::uniform(4, LinkSpec{80e6, 0}); });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, MismatchedArgumentsAreErrorsNotHangs) {
  auto st = run_inproc(3, [](Group& g) -> core::Status {
    // Ranks disagree on the trailing dimension.
    core::Tensor out;
    const int64_t cols = g.rank() == 1 ? 4 : 3;
    std::vector<int64_t> counts = {1, 1, 1};
    core::Status s = allgatherv(g, AllgatherOptions{2000ms, 0}, core::Tensor::zeros_f32({1, cols}), counts, &out);
    TESSERA_EXPECT_OR_FAIL(!s.ok(), "mismatch must fail");
    // Local argument errors.
    s = allgatherv(g, AllgatherOptions{100ms, 1}, core::Tensor::zeros_f32({2, 3}), counts, &out);
    TESSERA_EXPECT_OR_FAIL(s.code() == core::ErrorCode::kInvalidArgument, "rows vs counts");
    core::Tensor i64 = core::Tensor::from_i64({1}, {1});
    s = allreduce(g, AllreduceOptions{100ms, 1}, &i64);
    TESSERA_EXPECT_OR_FAIL(s.code() == core::ErrorCode::kInvalidArgument, "dtype");
    std::vector<int64_t> bad = {1, -1, 1};
    s = reduce_scatterv(g, ReduceScatterOptions{100ms, 1}, core::Tensor::zeros_f32({1, 3}), bad, &out);
    TESSERA_EXPECT_OR_FAIL(s.code() == core::ErrorCode::kInvalidArgument, "negative count");
    return core::ok_status();
  });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, TimeoutWhenARankDoesNotJoin) {
  // Rank 2 never calls the collective and stays in the group until the
  // others have returned, and they stay until both have: their allgather can
  // only end at its timeout (kTimeout). Had it waited for rank 2 instead,
  // rank 2 would leave at its own deadline and the others would see it go
  // (kNetwork).
  std::atomic<int> returned{0};
  auto st = run_inproc(3, [&](Group& g) -> core::Status {
    if (g.rank() == 2) {
      TESSERA_EXPECT_OR_FAIL(compute_until([&] { return returned == 2; }), "the allgather did not end at its timeout");
      return core::ok_status();
    }
    core::Tensor out;
    core::Status s = allgather(g, AllgatherOptions{300ms, 0}, core::Tensor::zeros_f32({1}), &out);
    ++returned;
    TESSERA_EXPECT_OR_FAIL(s.code() == core::ErrorCode::kTimeout, "ended by the timeout: " + s.to_string());
    // Nobody leaves before both have returned: a rank that left first would
    // end the other's allgather as a lost peer (kNetwork) instead.
    TESSERA_EXPECT_OR_FAIL(compute_until([&] { return returned == 2; }), "the other rank's allgather did not end");
    return core::ok_status();
  });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Accounting, AllgatherMovesKMinusOneOverKOfTheTotal) {
  const int k = 4;
  const int64_t part = 250000;  // bytes per rank
  std::vector<CommStats> stats(k);
  auto st = run_inproc(k, [&](Group& g) -> core::Status {
    core::Tensor out;
    TESSERA_RETURN_IF_ERROR(allgather(g, AllgatherOptions{5000ms, 0}, core::Tensor::zeros(core::DType::kU8, {part}), &out));
    TESSERA_RETURN_IF_ERROR(barrier(g, BarrierOptions{5000ms, 0}));
    stats[g.rank()] = g.stats();
    return core::ok_status();
  });
  ASSERT_TRUE(all_ok(st)) << statuses_to_string(st);
  const uint64_t total = static_cast<uint64_t>(k * part);
  for (int r = 0; r < k; ++r) {
    const OpStats& ag = stats[r].op(OpKind::kAllgather);
    EXPECT_EQ(ag.traffic.bytes_sent, total * (k - 1) / k) << "rank " << r;
    EXPECT_EQ(ag.traffic.bytes_received, total * (k - 1) / k) << "rank " << r;
    EXPECT_EQ(ag.traffic.messages_sent, static_cast<uint64_t>(k - 1));
    EXPECT_EQ(ag.calls, 1u);
    EXPECT_EQ(ag.failures, 0u);
    // Ring: everything goes to the right neighbour, comes from the left.
    EXPECT_EQ(stats[r].per_peer[(r + 1) % k].bytes_sent, total * (k - 1) / k);
    EXPECT_EQ(stats[r].per_peer[(r + k - 1) % k].bytes_received, total * (k - 1) / k);
    EXPECT_EQ(stats[r].op(OpKind::kBarrier).calls, 1u);
    EXPECT_EQ(stats[r].frames_rejected, 0u);
    EXPECT_GT(stats[r].blocked_seconds, 0.0);
    EXPECT_EQ(stats[r].total.bytes_sent, ag.traffic.bytes_sent);  // barrier moves no payload
  }
}

TEST(Accounting, ReduceScatterAndAllreduceVolumes) {
  const int k = 4;
  const int64_t n = 1000;  // floats
  std::vector<CommStats> stats(k);
  auto st = run_inproc(k, [&](Group& g) -> core::Status {
    core::Tensor part, t = core::Tensor::zeros_f32({n});
    TESSERA_RETURN_IF_ERROR(reduce_scatter(g, ReduceScatterOptions{5000ms, 0}, t, &part));
    TESSERA_RETURN_IF_ERROR(allreduce(g, AllreduceOptions{5000ms, 0}, &t));
    stats[g.rank()] = g.stats();
    return core::ok_status();
  });
  ASSERT_TRUE(all_ok(st)) << statuses_to_string(st);
  for (int r = 0; r < k; ++r) {
    EXPECT_EQ(stats[r].op(OpKind::kReduceScatter).traffic.bytes_sent, 4u * n * (k - 1) / k);
    EXPECT_EQ(stats[r].op(OpKind::kAllreduce).traffic.bytes_sent, 2u * 4u * n * (k - 1) / k);
  }
}
