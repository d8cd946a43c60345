// Hardening of the comm layer against a key holder: bounded mailboxes for
// messages nobody receives, key files of the wrong shape, and control
// requests of more than one frame.
#include <gtest/gtest.h>

#include <thread>
#include <zmq.hpp>

#include "comm/control.h"
#include "comm/keys.h"
#include "comm_test_util.h"

namespace tessera::comm {
namespace {

using testing::all_ok;
using testing::run_inproc;
using testing::statuses_to_string;

// Audit: 100 frames of 4 MiB on a tag nobody receives took a daemon from
// 12 MB to 423 MB. Now the mailboxes stop at the cap and count the rest.
TEST(UnmatchedCapTest, FramesBeyondTheCapAreDroppedAndCounted) {
  constexpr uint64_t kCap = 64 * 1024;
  constexpr int64_t kBytes = 4096;
  constexpr int kSent = 100;
  const uint64_t cost = kBytes + kMailboxOverhead;
  const int fit = static_cast<int>(kCap / cost);
  auto st = run_inproc(
      2,
      [&](Group& g) -> core::Status {
        if (g.rank() == 1) {
          for (int i = 0; i < kSent; ++i) {
            core::Tensor t = core::Tensor::zeros(core::DType::kU8, {kBytes});
            static_cast<uint8_t*>(t.raw())[0] = static_cast<uint8_t>(i);
            TESSERA_RETURN_IF_ERROR(g.send(0, 7, t, Millis(10000)));
          }
          TESSERA_RETURN_IF_ERROR(g.send(0, 8, core::Tensor::zeros(core::DType::kU8, {1}), Millis(10000)));
          return g.recv(0, 9, Millis(10000)).status();  // stay until rank 0 has looked
        }
        // Frames from one peer arrive in order: once tag 8 is here, every
        // tag 7 frame has been filed or dropped.
        TESSERA_RETURN_IF_ERROR(g.recv(1, 8, Millis(10000)).status());
        const CommStats s = g.stats();
        EXPECT_LE(s.unmatched_bytes_peak, kCap);
        EXPECT_EQ(s.unmatched_bytes, static_cast<uint64_t>(fit) * cost);
        EXPECT_EQ(s.unmatched_frames_dropped, static_cast<uint64_t>(kSent - fit));
        EXPECT_EQ(s.unmatched_bytes_dropped, static_cast<uint64_t>(kSent - fit) * cost);
        // The first `fit` messages were kept, in order, and can be received.
        for (int i = 0; i < fit; ++i) {
          auto t = g.recv(1, 7, Millis(10000));
          if (!t.ok()) return t.status();
          EXPECT_EQ(static_cast<const uint8_t*>(t->raw())[0], static_cast<uint8_t>(i));
        }
        EXPECT_EQ(g.stats().unmatched_bytes, 0u);
        // The figures survive a reset of the per-run counters.
        g.reset_stats();
        EXPECT_EQ(g.stats().unmatched_frames_dropped, static_cast<uint64_t>(kSent - fit));
        return g.send(1, 9, core::Tensor::zeros(core::DType::kU8, {1}), Millis(10000));
      },
      [&](GroupOptions& o) {
        o.max_unmatched_bytes_per_peer = kCap;
        o.max_unmatched_bytes = 4 * kCap;
      });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

TEST(UnmatchedCapTest, TheGroupCapBoundsAllPeersTogether) {
  constexpr uint64_t kCap = 32 * 1024;
  auto st = run_inproc(
      3,
      [&](Group& g) -> core::Status {
        if (g.rank() != 0) {
          TESSERA_RETURN_IF_ERROR(g.recv(0, 4, Millis(10000)).status());
          for (int i = 0; i < 40; ++i)
            TESSERA_RETURN_IF_ERROR(g.send(0, 5, core::Tensor::zeros(core::DType::kU8, {1024}), Millis(10000)));
          TESSERA_RETURN_IF_ERROR(g.send(0, 6, core::Tensor::zeros(core::DType::kU8, {1}), Millis(10000)));
          return g.recv(0, 9, Millis(10000)).status();
        }
        // The closing messages are posted for first: arriving unmatched,
        // they would be dropped over the full cap like the rest.
        RecvHandle last[2] = {g.irecv(1, 6), g.irecv(2, 6)};
        for (int p = 1; p <= 2; ++p)
          TESSERA_RETURN_IF_ERROR(g.send(p, 4, core::Tensor::zeros(core::DType::kU8, {1}), Millis(10000)));
        for (auto& h : last) TESSERA_RETURN_IF_ERROR(h.wait(Millis(10000)).status());
        const CommStats s = g.stats();
        EXPECT_LE(s.unmatched_bytes_peak, kCap);
        EXPECT_GT(s.unmatched_frames_dropped, 0u);
        for (int p = 1; p <= 2; ++p)
          TESSERA_RETURN_IF_ERROR(g.send(p, 9, core::Tensor::zeros(core::DType::kU8, {1}), Millis(10000)));
        return core::ok_status();
      },
      [&](GroupOptions& o) {
        o.max_unmatched_bytes_per_peer = kCap;  // each peer alone could fill it
        o.max_unmatched_bytes = kCap;
      });
  EXPECT_TRUE(all_ok(st)) << statuses_to_string(st);
}

// Audit defect 1: {"format":1} threw nlohmann::type_error out of the reader.
TEST(KeyFileTest, WrongTypesAreParseErrorsNotExceptions) {
  const ClusterKey key = generate_cluster_key().value();
  const std::string path = ::testing::TempDir() + "/bad-key-" + std::to_string(::getpid()) + ".json";
  const std::string good_rest = R"(,"curve_public":")" + key.public_z85 + R"(","curve_secret":")" + key.secret_z85 + "\"}";
  for (const std::string& text : std::vector<std::string>{std::string(R"({"format":1})"), std::string(R"({"format":null})"), std::string(R"({"format":["x"]})"),
        std::string(R"({"format":{"a":1}})"), std::string("[1,2]"), std::string("\"tessera-cluster-key\""),
        R"({"format":"tessera-cluster-key","curve_public":1,"curve_secret":2})",
        R"({"format":"tessera-cluster-key","curve_public":")" + key.public_z85 + R"(","curve_secret":true})",
        R"({"format":"tessera-cluster-key","format":"tessera-cluster-key")" + good_rest}) {
    ASSERT_TRUE(core::write_file(path, text).ok());
    auto r = read_key_file(path);
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), core::ErrorCode::kParseError) << text << ": " << r.status().to_string();
  }
  std::string nul = key.secret_z85;
  nul[5] = '\0';
  EXPECT_FALSE(validate_cluster_key(ClusterKey{key.public_z85, nul}).ok());
  ASSERT_TRUE(core::write_file(path, R"({"format":"tessera-cluster-key")" + good_rest).ok());
  EXPECT_TRUE(read_key_file(path).ok());
  ::unlink(path.c_str());
}

// Audit defect 6 at the socket level: a two-frame request left the REP
// socket unable to reply (EFSM). It is answered with an error and the
// server goes on answering.
TEST(ControlTest, MultiFrameRequestsAreAnsweredAndCounted) {
  const ClusterKey key = generate_cluster_key().value();
  const std::string ep = "ipc://" + ::testing::TempDir() + "/ctl-" + std::to_string(::getpid());
  auto server = ControlServer::bind(ep, key);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  std::thread serve([&] {
    for (int i = 0; i < 2; ++i) {  // only the good request comes out of receive()
      auto req = (*server)->receive(Millis(20000));
      if (!req.ok()) return;
      EXPECT_EQ(*req, "hello");
      EXPECT_TRUE((*server)->reply("echo " + *req).ok());
    }
  });
  zmq::context_t ctx(1);
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.set(zmq::sockopt::curve_serverkey, key.public_z85);
  req.set(zmq::sockopt::curve_publickey, key.public_z85);
  req.set(zmq::sockopt::curve_secretkey, key.secret_z85);
  req.set(zmq::sockopt::rcvtimeo, 20000);
  req.connect(ep);
  for (int round = 0; round < 2; ++round) {
    req.send(zmq::str_buffer("{\"a\":"), zmq::send_flags::sndmore);
    req.send(zmq::str_buffer("1}"), zmq::send_flags::none);
    zmq::message_t m;
    ASSERT_TRUE(req.recv(m));
    EXPECT_NE(m.to_string().find("one frame"), std::string::npos) << m.to_string();
    req.send(zmq::str_buffer("hello"), zmq::send_flags::none);
    ASSERT_TRUE(req.recv(m));
    EXPECT_EQ(m.to_string(), "echo hello");
  }
  serve.join();
  EXPECT_EQ((*server)->malformed_requests(), 2u);
}

}  // namespace
}  // namespace tessera::comm
