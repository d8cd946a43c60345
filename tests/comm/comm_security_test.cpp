// CURVE with the cluster key: a rank or intruder without the key gets
// nothing accepted; a fuzzing peer never crashes a rank and every bad frame
// is counted.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "comm/control.h"
#include "comm_test_util.h"

using namespace tessera;
using namespace tessera::comm;
using namespace tessera::comm::testing;
using namespace std::chrono_literals;

namespace {

GroupOptions tcp_options(const std::vector<std::string>& eps, int rank, const std::optional<ClusterKey>& key,
                         const std::string& group) {
  GroupOptions o;
  o.rank = rank;
  o.endpoints = eps;
  o.key = key;
  o.insecure = !key.has_value();
  o.group_id = group;
  o.connect_timeout = 20000ms;
  o.close_timeout = 500ms;
  return o;
}

// Creates ranks `ranks` of a tcp group on threads and waits for all.
std::vector<std::unique_ptr<Group>> create_on_threads(const std::vector<GroupOptions>& opts,
                                                      std::vector<core::Status>* statuses) {
  std::vector<std::unique_ptr<Group>> groups(opts.size());
  statuses->assign(opts.size(), core::ok_status());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < opts.size(); ++i) {
    threads.emplace_back([&, i] {
      auto g = Group::create(opts[i]);
      if (g.ok()) groups[i] = std::move(g).value();
      else (*statuses)[i] = g.status();
    });
  }
  for (auto& t : threads) t.join();
  return groups;
}

zmq::message_t header_msg(const FrameHeader& h) {
  const HeaderBytes b = encode_header(h);
  return zmq::message_t(b.data(), b.size());
}

FrameHeader base_header(FrameKind kind, uint32_t src, uint32_t world, const std::string& group) {
  FrameHeader h;
  h.kind = kind;
  h.src = src;
  h.world = world;
  h.group = group_hash(group);
  h.dtype = core::DType::kU8;
  return h;
}

uint64_t accepted_frames(const CommStats& s) { return s.control_bytes_received / kHeaderSize; }

// The connection events of one of our own raw sockets (libzmq's socket
// monitor), so a test can see what the rank it talks to did to it.
class Events {
 public:
  Events(zmq::context_t& ctx, zmq::socket_t& s, const std::string& name) : pair_(ctx, zmq::socket_type::pair) {
    const std::string ep = "inproc://events-" + name;
    if (zmq_socket_monitor(s.handle(), ep.c_str(), ZMQ_EVENT_ALL) != 0) throw zmq::error_t();
    pair_.set(zmq::sockopt::linger, 0);
    pair_.connect(ep);
  }
  // Waits (at most `limit`) for an event in `mask`; the first such event, or 0.
  // Returns 0 at once if an event in `never` comes first.
  int wait_for(int mask, int never = 0, std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return 0;
      pair_.set(zmq::sockopt::rcvtimeo, static_cast<int>(left.count()));
      zmq::message_t ev;
      if (!pair_.recv(ev)) return 0;
      uint16_t event = 0;
      if (ev.size() >= sizeof(event)) std::memcpy(&event, ev.data(), sizeof(event));
      while (ev.more()) {  // the endpoint frame
        zmq::message_t rest;
        if (!pair_.recv(rest) || !rest.more()) break;
      }
      seen_ |= event;
      if (event & never) return 0;
      if (event & mask) return event;
    }
  }
  int seen() const { return seen_; }
  void close() { pair_.close(); }  // before the context is closed

 private:
  zmq::socket_t pair_;
  int seen_ = 0;
};

constexpr int kRefused = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED;

}  // namespace

TEST(Security, RankWithWrongKeyCannotJoin) {
  const int k = 3;
  auto eps = pick_local_endpoints(k);
  ASSERT_TRUE(eps.ok());
  auto good = generate_cluster_key();
  auto bad = generate_cluster_key();
  ASSERT_TRUE(good.ok() && bad.ok());
  const std::string group = "wrong-key-" + std::to_string(::getpid());
  Children c = fork_ranks(k, [&](int r) {
    GroupOptions o = tcp_options(*eps, r, r == 2 ? *bad : *good, group);
    o.connect_timeout = 3000ms;
    auto g = Group::create(o);
    if (g.ok()) return 1;  // must not form
    std::fprintf(stderr, "rank %d: %s\n", r, g.status().to_string().c_str());
    return g.status().code() == core::ErrorCode::kUnauthenticated ? 0 : 2;
  });
  const auto codes = wait_children(c, 30s);
  for (int r = 0; r < k; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// A terminal whose key differs from the daemon's learns it from the failed
// handshakes, not from a whole --timeout of silence; the daemon counts (and
// logs) the refusals.
TEST(Security, ControlRequestWithAWrongKeyIsRefusedNotTimedOut) {
  const std::string ep = pick_local_endpoints(1).value()[0];
  const ClusterKey a = generate_cluster_key().value(), b = generate_cluster_key().value();
  auto server = ControlServer::bind(ep, a).value();
  std::atomic<bool> stop{false};
  std::thread serve([&] {
    while (!stop) {
      auto r = server->receive(50ms);
      if (r.ok()) (void)server->reply("pong");
    }
  });
  const auto wrong = control_request(ep, b, "ping", 60000ms);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), core::ErrorCode::kUnauthenticated) << wrong.status().to_string();
  const auto right = control_request(ep, a, "ping", 60000ms);
  ASSERT_TRUE(right.ok()) << right.status().to_string();
  EXPECT_EQ(right.value(), "pong");
  stop = true;
  serve.join();
  EXPECT_GE(server->auth_rejections(), 1u);
}

TEST(Security, IntruderFramesAreNeverAccepted) {
  auto eps = pick_local_endpoints(2);
  ASSERT_TRUE(eps.ok());
  auto key = generate_cluster_key();
  ASSERT_TRUE(key.ok());
  const std::string group = "intruder-" + std::to_string(::getpid());
  std::vector<core::Status> st;
  auto groups = create_on_threads({tcp_options(*eps, 0, *key, group), tcp_options(*eps, 1, *key, group)}, &st);
  ASSERT_TRUE(all_ok(st)) << statuses_to_string(st);
  const CommStats before = groups[0]->stats();

  // Intruders send perfectly formed frames posing as rank 1: one knows the
  // cluster's public key but not its secret, one uses no security at all,
  // one uses the right key as server key with the public key as its own.
  auto intruder_key = generate_cluster_key();
  ASSERT_TRUE(intruder_key.ok());
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> socks;
  std::vector<std::unique_ptr<Events>> events;
  for (int variant = 0; variant < 3; ++variant) {
    socks.emplace_back(ctx, zmq::socket_type::dealer);
    zmq::socket_t& s = socks.back();
    events.push_back(std::make_unique<Events>(ctx, s, "intruder-" + std::to_string(variant)));
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::routing_id, "tsr1");
    if (variant == 0) {
      s.set(zmq::sockopt::curve_serverkey, key->public_z85);
      s.set(zmq::sockopt::curve_publickey, intruder_key->public_z85);
      s.set(zmq::sockopt::curve_secretkey, intruder_key->secret_z85);
    } else if (variant == 2) {
      s.set(zmq::sockopt::curve_serverkey, key->public_z85);
      s.set(zmq::sockopt::curve_publickey, key->public_z85);
      s.set(zmq::sockopt::curve_secretkey, intruder_key->secret_z85);  // does not match
    }
    s.connect((*eps)[0]);
    FrameHeader h = base_header(FrameKind::kData, 1, 2, group);
    h.shape = {4};
    h.nbytes = 4;
    s.send(header_msg(h), zmq::send_flags::sndmore);
    s.send(zmq::str_buffer("evil"), zmq::send_flags::none);
  }
  // Rank 0 has refused every intruder: each sees its handshake fail or its
  // connection dropped, never a completed handshake, so none of their frames
  // can reach the group. (Variant 0 is refused by the key check, which
  // counts it before it answers: auth_rejections below.)
  for (int variant = 0; variant < 3; ++variant) {
    EXPECT_NE(events[variant]->wait_for(kRefused, ZMQ_EVENT_HANDSHAKE_SUCCEEDED), 0)
        << "intruder " << variant << " was not refused (events 0x" << std::hex << events[variant]->seen() << ")";
  }
  auto r = groups[0]->recv(1, 0, 200ms);
  EXPECT_EQ(r.status().code(), core::ErrorCode::kTimeout) << "an intruder's frame was accepted";
  const CommStats after = groups[0]->stats();
  EXPECT_EQ(after.total.messages_received, before.total.messages_received);
  EXPECT_GE(after.auth_rejections, 1u);  // the key check refused variant 0
  events.clear();
  for (auto& s : socks) s.close();
  ctx.close();

  // The real rank 1 is unaffected.
  ASSERT_TRUE(groups[1]->send(0, 0, core::Tensor::from_f32({1}, {42}), 5000ms).ok());
  auto real = groups[0]->recv(1, 0, 5000ms);
  ASSERT_TRUE(real.ok()) << real.status().to_string();
  EXPECT_EQ(real->f32()[0], 42);
}

TEST(Security, FuzzedFramesAreCountedNeverCrash) {
  // Rank 2 of a 3-rank insecure group is a raw socket that introduces itself
  // properly, then sends garbage as "rank 2" to rank 0.
  auto eps = pick_local_endpoints(3);
  ASSERT_TRUE(eps.ok());
  const std::string group = "fuzz-" + std::to_string(::getpid());
  zmq::context_t ctx(1);
  zmq::socket_t to0(ctx, zmq::socket_type::dealer), to1(ctx, zmq::socket_type::dealer);
  for (auto* s : {&to0, &to1}) {
    s->set(zmq::sockopt::linger, 0);
    s->set(zmq::sockopt::routing_id, "tsr2");
    s->set(zmq::sockopt::sndhwm, 0);
  }
  to0.connect((*eps)[0]);
  to1.connect((*eps)[1]);
  to0.send(header_msg(base_header(FrameKind::kHello, 2, 3, group)), zmq::send_flags::none);
  to1.send(header_msg(base_header(FrameKind::kHello, 2, 3, group)), zmq::send_flags::none);

  std::vector<GroupOptions> opts = {tcp_options(*eps, 0, std::nullopt, group), tcp_options(*eps, 1, std::nullopt, group)};
  for (auto& o : opts) o.max_message_bytes = 1 << 20;
  std::vector<core::Status> st;
  auto groups = create_on_threads(opts, &st);
  ASSERT_TRUE(all_ok(st)) << statuses_to_string(st);

  std::mt19937_64 rng(1234);
  auto rnd = [&](uint64_t n) { return rng() % n; };
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  };
  FrameHeader valid = base_header(FrameKind::kData, 2, 3, group);
  valid.dtype = core::DType::kF32;
  valid.shape = {2, 3};
  valid.nbytes = 24;
  const HeaderBytes valid_bytes = encode_header(valid);

  const int kMessages = 6000;
  for (int i = 0; i < kMessages; ++i) {
    std::vector<std::string> frames;
    switch (i % 7) {
      case 0:  // one random frame
        frames.push_back(random_bytes(rnd(300)));
        break;
      case 1:  // several random frames
        for (uint64_t f = 0, n = 1 + rnd(5); f < n; ++f) frames.push_back(random_bytes(rnd(200)));
        break;
      case 2: {  // a valid header with a few random bytes changed, payload as claimed
        std::string h(valid_bytes.begin(), valid_bytes.end());
        for (uint64_t m = 0, n = 1 + rnd(4); m < n; ++m) h[rnd(h.size())] = static_cast<char>(rng());
        frames.push_back(h);
        frames.push_back(random_bytes(24));
        break;
      }
      case 3:  // a valid header with the wrong payload size
        frames.push_back(std::string(valid_bytes.begin(), valid_bytes.end()));
        frames.push_back(random_bytes(rnd(2) ? 23 : 25 + rnd(100)));
        break;
      case 4: {  // huge dimensions whose product overflows to the stated byte count
        FrameHeader h = valid;
        h.shape = {int64_t{1} << 40, int64_t{1} << 40, 4};
        h.nbytes = 0;
        const HeaderBytes b = encode_header(h);
        frames.push_back(std::string(b.begin(), b.end()));
        frames.push_back("");
        break;
      }
      case 5: {  // consistent but far over the size limit, no payload behind it
        FrameHeader h = valid;
        h.dtype = core::DType::kU8;
        h.shape = {int64_t{1} << 40};
        h.nbytes = uint64_t{1} << 40;
        const HeaderBytes b = encode_header(h);
        frames.push_back(std::string(b.begin(), b.end()));
        frames.push_back("x");
        break;
      }
      case 6: {  // a second hello, or a data header without its payload
        const HeaderBytes b = encode_header(rnd(2) ? base_header(FrameKind::kHello, 2, 3, group) : valid);
        frames.push_back(std::string(b.begin(), b.end()));
        break;
      }
    }
    for (size_t f = 0; f < frames.size(); ++f) {
      to0.send(zmq::buffer(frames[f]), f + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  // Every message is either rejected or (rarely, a mutation that happens to be
  // valid) accepted; wait until rank 0 has looked at all of them.
  const uint64_t expected = kMessages + 2;  // + the two hellos
  CommStats s;
  for (int wait = 0; wait < 400; ++wait) {
    s = groups[0]->stats();
    if (s.frames_rejected + accepted_frames(s) >= expected) break;
    std::this_thread::sleep_for(25ms);
  }
  EXPECT_EQ(s.frames_rejected + accepted_frames(s), expected);
  EXPECT_GT(s.frames_rejected, static_cast<uint64_t>(kMessages * 0.95));
  for (auto r : {RejectReason::kFrameCount, RejectReason::kHeaderSize, RejectReason::kPayload, RejectReason::kSize,
                 RejectReason::kUnexpected}) {
    EXPECT_GT(s.rejected_by_reason[static_cast<size_t>(r)], 0u) << reject_reason_name(r);
  }

  // A frame over the size limit: libzmq drops that connection before
  // allocating it. The sender sees its connection dropped, and rank 0's
  // frame checks never saw the frame (nothing rejected, nothing received).
  // Were the limit not applied, the frame would reach them (one more
  // rejection) and the connection would stay up.
  const CommStats before_huge = groups[0]->stats();
  zmq::socket_t huge(ctx, zmq::socket_type::dealer);
  huge.set(zmq::sockopt::linger, 0);
  huge.set(zmq::sockopt::routing_id, "huge");
  Events huge_events(ctx, huge, "huge");
  huge.connect((*eps)[0]);
  huge.send(zmq::buffer(std::string(2 << 20, 'z')), zmq::send_flags::none);
  EXPECT_NE(huge_events.wait_for(ZMQ_EVENT_DISCONNECTED), 0)
      << "rank 0 kept the connection (events 0x" << std::hex << huge_events.seen() << ")";
  const CommStats after_huge = groups[0]->stats();
  EXPECT_EQ(after_huge.frames_rejected, before_huge.frames_rejected);
  EXPECT_EQ(after_huge.total.messages_received, before_huge.total.messages_received);

  // Ranks 0 and 1 still work.
  ASSERT_TRUE(groups[1]->send(0, 5, core::Tensor::from_f32({2}, {1, 2}), 5000ms).ok());
  auto got = groups[0]->recv(1, 5, 5000ms);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->f32()[1], 2);
  ASSERT_TRUE(groups[0]->send(1, 5, core::Tensor::from_f32({1}, {3}), 5000ms).ok());
  EXPECT_TRUE(groups[1]->recv(0, 5, 5000ms).ok());
  to0.close();
  to1.close();
  huge.close();
  huge_events.close();
  groups.clear();
  ctx.close();
}
