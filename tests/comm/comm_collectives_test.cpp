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
  auto st = run_inproc(k, [k](Group& g) -> core::Status {
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
  // 100 KB tiles over 8 Mbit/s links: ~100 ms on the link, so right after the
  // own tile the next one cannot be in yet.
  auto st = run_inproc(
      2,
      [](Group& g) -> core::Status {
        RingAllgather ring(g, AllgatherOptions{5000ms, 0});
        TESSERA_RETURN_IF_ERROR(ring.start(rows_tensor(g.rank(), 100, 250)));
        TESSERA_EXPECT_OR_FAIL(ring.next_ready(), "the own tile is always ready");
        TESSERA_ASSIGN_OR_RETURN(Tile own, ring.next_tile());
        TESSERA_EXPECT_OR_FAIL(!ring.next_ready(), "the other tile is still on the link");
        const auto deadline = std::chrono::steady_clock::now() + 5s;
        while (!ring.next_ready() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
        TESSERA_EXPECT_OR_FAIL(ring.next_ready(), "the other tile never came");
        TESSERA_ASSIGN_OR_RETURN(Tile other, ring.next_tile(0ms));  // ready: no wait needed
        TESSERA_EXPECT_OR_FAIL(other.index == 1 - g.rank(), "ring order");
        TESSERA_EXPECT_OR_FAIL(ring.done() && ring.next_ready(), "none left counts as ready");
        return ring.finish();
      },
      [](GroupOptions& o) { o.links = LinkMatrix::uniform(2, LinkSpec{8e6, 0}); });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, RingOverlapsComputeWithTransfer) {
  // 4 ranks, 500 KB tiles over 40 Mbit/s links: each hop takes ~100 ms. With
  // 100 ms of compute per tile, overlap gives ~400 ms; serial would be ~700.
  const int k = 4;
  auto st = run_inproc(
      k,
      [](Group& g) -> core::Status {
        core::Timer timer;
        RingAllgather ring(g, AllgatherOptions{10000ms, 0});
        TESSERA_RETURN_IF_ERROR(ring.start(core::Tensor::zeros(core::DType::kU8, {500000})));
        while (!ring.done()) {
          TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile());
          std::this_thread::sleep_for(100ms);
        }
        TESSERA_RETURN_IF_ERROR(ring.finish());
        TESSERA_EXPECT_OR_FAIL(timer.ms() < 600, "took " + std::to_string(timer.ms()) + " ms");
        return core::ok_status();
      },
      [](GroupOptions& o) { o.links = LinkMatrix::uniform(4, LinkSpec{40e6, 0}); });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(Collectives, SlowConsumerDoesNotDelayTheRing) {
  // Rank 0 looks at its tiles only after 600 ms; tiles still pass through it
  // at once, so every other rank is done before rank 0 even starts looking.
  const int k = 4;
  std::vector<std::chrono::steady_clock::time_point> at(k);
  auto st = run_inproc(
      k,
      [&](Group& g) -> core::Status {
        RingAllgather ring(g, AllgatherOptions{10000ms, 0});
        TESSERA_RETURN_IF_ERROR(ring.start(rows_tensor(g.rank(), 1000, 125)));  // 500 KB
        if (g.rank() == 0) {
          std::this_thread::sleep_for(600ms);  // a slow consumer, not a synchronisation
          at[0] = std::chrono::steady_clock::now();
        }
        while (!ring.done()) {
          TESSERA_ASSIGN_OR_RETURN(Tile t, ring.next_tile());
          TESSERA_EXPECT_OR_FAIL(t.data.f32()[130] == value_of(t.index, 1, 5), "tile data");
        }
        TESSERA_RETURN_IF_ERROR(ring.finish());
        if (g.rank() != 0) at[g.rank()] = std::chrono::steady_clock::now();
        return core::ok_status();
      },
      [](GroupOptions& o) { o.links = LinkMatrix::uniform(4, LinkSpec{80e6, 0}); });
  ASSERT_TRUE(all_ok(st)) << statuses_to_string(st);
  for (int r = 1; r < k; ++r) EXPECT_LT(at[r], at[0]) << "rank " << r << " waited for the slow consumer";
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
  auto st = run_inproc(3, [](Group& g) -> core::Status {
    if (g.rank() == 2) {
      std::this_thread::sleep_for(600ms);  // never calls the collective
      return core::ok_status();
    }
    core::Timer timer;
    core::Tensor out;
    core::Status s = allgather(g, AllgatherOptions{300ms, 0}, core::Tensor::zeros_f32({1}), &out);
    TESSERA_EXPECT_OR_FAIL(!s.ok(), "must fail");
    TESSERA_EXPECT_OR_FAIL(timer.ms() < 590, "bounded by the timeout: " + std::to_string(timer.ms()));
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
