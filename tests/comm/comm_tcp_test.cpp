// Real processes over tcp (forked ranks, CURVE on): collectives against the
// reference, accounting, link pacing, and a rank killed or stopped
// mid-allgather.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include "comm_test_util.h"

using namespace tessera;
using namespace tessera::comm;
using namespace tessera::comm::testing;
using namespace std::chrono_literals;

namespace {

struct TcpSetup {
  std::vector<std::string> endpoints;
  ClusterKey key;
  std::string group_id;
};

TcpSetup make_setup(int k) {
  TcpSetup s;
  auto eps = pick_local_endpoints(k);
  EXPECT_TRUE(eps.ok()) << eps.status().to_string();
  if (eps.ok()) s.endpoints = *eps;
  auto key = generate_cluster_key();
  EXPECT_TRUE(key.ok());
  if (key.ok()) s.key = *key;
  s.group_id = "tcp-test-" + std::to_string(::getpid());
  return s;
}

GroupOptions tcp_options(const TcpSetup& s, int rank) {
  GroupOptions o;
  o.rank = rank;
  o.endpoints = s.endpoints;
  o.key = s.key;
  o.group_id = s.group_id;
  o.connect_timeout = 20000ms;
  return o;
}

int report(int rank, const core::Status& st, int code_on_error = 1) {
  if (st.ok()) return 0;
  std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
  return code_on_error;
}

// Blocks until `n` bytes came through the pipe or 30 s passed.
bool read_ready(int fd, int n) {
  int got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) return false;
    char buf[16];
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r <= 0) return false;
    got += static_cast<int>(r);
  }
  return true;
}

}  // namespace

class CollectivesTcp : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTcp, MatchReferenceAcrossProcesses) {
  const int k = GetParam();
  const TcpSetup setup = make_setup(k);
  Children c = fork_ranks(k, [&](int r) {
    auto g = Group::create(tcp_options(setup, r));
    if (!g.ok()) return report(r, g.status());
    core::Status st = check_all_collectives(**g, k);
    if (!st.ok()) return report(r, st);
    // Accounting: an even allgather moves (K-1)/K of the total per rank.
    (*g)->reset_stats();
    // Nobody sends allgather data before everyone has reset its counters.
    st = barrier(**g, BarrierOptions{20000ms, 99});
    if (!st.ok()) return report(r, st);
    core::Tensor out;
    const int64_t part = 100000;
    st = allgather(**g, AllgatherOptions{20000ms, 0}, core::Tensor::zeros(core::DType::kU8, {part}), &out);
    if (!st.ok()) return report(r, st);
    const CommStats s = (*g)->stats();
    const uint64_t want = static_cast<uint64_t>(part * (k - 1));
    if (s.op(OpKind::kAllgather).traffic.bytes_sent != want || s.op(OpKind::kAllgather).traffic.bytes_received != want) {
      std::fprintf(stderr, "rank %d: allgather sent %llu, received %llu bytes, want %llu\n", r,
                   static_cast<unsigned long long>(s.op(OpKind::kAllgather).traffic.bytes_sent),
                   static_cast<unsigned long long>(s.op(OpKind::kAllgather).traffic.bytes_received),
                   static_cast<unsigned long long>(want));
      return 2;
    }
    if (s.frames_rejected != 0 || s.handshake_failures != 0) return 3;
    return 0;
  });
  const auto codes = wait_children(c, 90s);
  for (int r = 0; r < k; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " of " << k;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTcp, ::testing::Values(1, 2, 3, 4, 5, 8));

// A lower bound only (the link cannot carry 10 MB at 100 Mbit/s in less than
// 0.8 s); that pacing adds nothing beyond the rate is Link.PacerSerialisesAndDelays,
// and throughput is `tessera comm-bench --link`'s to measure.
TEST(Tcp, PacedTenMegabytes) {
  const TcpSetup setup = make_setup(2);
  Children c = fork_ranks(2, [&](int r) {
    GroupOptions o = tcp_options(setup, r);
    o.links = LinkMatrix::uniform(2, LinkSpec{100e6, 0});
    auto g = Group::create(o);
    if (!g.ok()) return report(r, g.status());
    Group& grp = **g;
    if (r == 1) {
      auto t = grp.recv(0, 0, 10000ms);
      if (!t.ok()) return report(r, t.status());
      if (t->nbytes() != 10000000) return 2;
      return report(r, grp.send(0, 1, core::Tensor::zeros(core::DType::kU8, {0}), 5000ms));
    }
    core::Timer timer;
    core::Status st = grp.send(1, 0, core::Tensor::zeros(core::DType::kU8, {10000000}), 10000ms);
    if (st.ok()) st = grp.recv(1, 1, 10000ms).status();
    if (!st.ok()) return report(r, st);
    const double s = timer.ms() / 1000.0;
    std::printf("10 MB over tcp paced at 100mbit: %.3f s\n", s);
    return s > 0.6 ? 0 : 3;
  });
  const auto codes = wait_children(c, 60s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// A forked rank is SIGKILLed (or SIGSTOPped) while every rank is inside an
// allgather that cannot finish without it: the victim's links out have an
// hour of latency, so its own part (and whatever it forwards) never leaves
// it. Each rank tells the parent once its allgather has moved a message (it
// is inside, and cannot have finished); only then is the victim stopped.
// The survivors must fail because the rank is lost (kNetwork), not at the
// collective's 30 s timeout (kTimeout): the status says which, no clock.
static void lose_rank_mid_allgather(int sig) {
  const int k = 3, victim = 2;
  const TcpSetup setup = make_setup(k);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  Children c = fork_ranks(k, [&](int r) {
    ::close(fds[0]);
    GroupOptions o = tcp_options(setup, r);
    auto links = LinkMatrix::from_json(R"({"latency_ms": [[0, 0, 0], [0, 0, 0], [3600000, 3600000, 0]]})", k);
    if (!links.ok()) return report(r, links.status());
    o.links = *links;
    o.heartbeat_interval = 200ms;
    o.heartbeat_timeout = 1000ms;
    auto g = Group::create(o);
    if (!g.ok()) return report(r, g.status());
    std::atomic<bool> returned{false};
    std::thread inside([&, grp = g->get()] {
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      while (!returned && std::chrono::steady_clock::now() < deadline) {
        const TrafficCounters t = grp->stats().op(OpKind::kAllgather).traffic;
        if (t.messages_sent + t.messages_received > 0) {
          [[maybe_unused]] ssize_t n = ::write(fds[1], "x", 1);
          return;
        }
        std::this_thread::sleep_for(1ms);  // polling a state, bounded by the deadline
      }
    });
    core::Timer timer;
    core::Tensor out;
    core::Status st = allgather(**g, AllgatherOptions{30000ms, 0}, core::Tensor::zeros(core::DType::kU8, {2000000}), &out);
    returned = true;
    inside.join();
    std::fprintf(stderr, "rank %d: allgather returned after %.0f ms: %s\n", r, timer.ms(), st.to_string().c_str());
    if (r == victim) return 0;  // never gets here
    if (st.ok()) return 3;
    return st.code() == core::ErrorCode::kNetwork ? 0 : 4;
  });
  ::close(fds[1]);
  const bool inside = read_ready(fds[0], k);
  ::close(fds[0]);
  if (!inside) {
    for (pid_t p : c.pids) ::kill(p, SIGKILL);
    wait_children(c, 5s);
    FAIL() << "the ranks did not all enter the allgather";
  }
  ::kill(c.pids[victim], sig);
  // Collect the survivors first. Their deadline is past the collective's
  // timeout, so what decides is their status, not how long they took.
  Children survivors{{c.pids[0], c.pids[1]}};
  const auto codes = wait_children(survivors, 60s);
  Children lost{{c.pids[victim]}};
  ::kill(c.pids[victim], SIGKILL);
  wait_children(lost, 5s);
  EXPECT_EQ(codes[0], 0) << "4: the allgather ended at its timeout, not at the loss";
  EXPECT_EQ(codes[1], 0) << "4: the allgather ended at its timeout, not at the loss";
}

TEST(Tcp, KilledRankMakesOthersFailFast) { lose_rank_mid_allgather(SIGKILL); }

TEST(Tcp, StoppedRankIsDetectedByHeartbeats) { lose_rank_mid_allgather(SIGSTOP); }

// A launch's ports are held from the pick until each rank's group takes its
// socket over: nobody else can bind one meanwhile (the race that made a
// worker fail with "Address already in use", or connect to another launch's
// rank), and the ranks still form a group and talk over them.
TEST(Tcp, LocalListenersHoldTheirPortsUntilTheRanksTakeThem) {
  auto l = bind_local_listeners(3);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  ASSERT_EQ(l->endpoints().size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_GE(l->fd(r), 0);
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::router);
    s.set(zmq::sockopt::linger, 0);
    EXPECT_THROW(s.bind(l->endpoints()[static_cast<size_t>(r)]), zmq::error_t) << "rank " << r << "'s port was free";
  }
  const TcpSetup setup = make_setup(3);
  Children c = fork_ranks(3, [&](int r) {
    GroupOptions o = tcp_options(setup, r);
    o.endpoints = l->endpoints();
    o.bind_fd = l->release(r);
    l->close_all();  // the other ranks' copies (a fork, no exec)
    auto g = Group::create(o);
    if (!g.ok()) return report(r, g.status());
    return report(r, check_all_collectives(**g, 3));
  });
  l->close_all();  // the children have theirs
  const auto codes = wait_children(c, 90s);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// The group owns the socket it is given, also when create() fails: before
// ZeroMQ took it (a bad option), after (a peer that never comes), and when it
// is not a socket listening at the rank's endpoint.
TEST(Tcp, AGroupThatFailsToFormClosesTheSocketItWasGiven) {
  auto closed = [](int fd) {
    errno = 0;
    const int rc = ::fcntl(fd, F_GETFD);
    const int err = errno;
    return rc == -1 && err == EBADF;
  };
  auto l = bind_local_listeners(4);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  GroupOptions o;
  o.insecure = true;
  o.endpoints = {l->endpoints()[0]};
  o.rank = 5;  // outside the group
  o.bind_fd = l->release(0);
  EXPECT_FALSE(Group::create(o).ok());
  EXPECT_TRUE(closed(o.bind_fd));

  o.endpoints = {l->endpoints()[1], l->endpoints()[2]};  // rank 1 never comes
  o.rank = 0;
  o.connect_timeout = 300ms;
  o.close_timeout = 300ms;  // no flushing the hello nobody takes
  o.bind_fd = l->release(1);
  const auto lonely = Group::create(o);
  EXPECT_EQ(lonely.status().code(), core::ErrorCode::kTimeout) << lonely.status().to_string();
  EXPECT_TRUE(closed(o.bind_fd));

  o.endpoints = {l->endpoints()[2], l->endpoints()[1]};
  o.bind_fd = l->release(3);  // listening, but at another port
  const auto wrong = Group::create(o);
  EXPECT_EQ(wrong.status().code(), core::ErrorCode::kInvalidArgument) << wrong.status().to_string();
  EXPECT_TRUE(closed(o.bind_fd));
}
