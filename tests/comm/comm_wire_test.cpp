// Frame encoding/validation, link specs and pacing, cluster keys, stats JSON.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "comm/keys.h"
#include "comm/link.h"
#include "comm/stats.h"
#include "comm/wire.h"
#include "core/io.h"

using namespace tessera;
using namespace tessera::comm;

namespace {

FrameLimits limits() { return FrameLimits{0, 4, group_hash("g"), 1 << 20}; }

FrameHeader data_header() {
  FrameHeader h;
  h.kind = FrameKind::kData;
  h.op = OpKind::kAllgather;
  h.dtype = core::DType::kF32;
  h.src = 2;
  h.world = 4;
  h.group = group_hash("g");
  h.tag = 7;
  h.shape = {3, 5};
  h.nbytes = 60;
  return h;
}

RejectReason reason_of(const HeaderBytes& b) {
  DecodeResult d = decode_header(b.data(), b.size(), limits());
  EXPECT_FALSE(d.ok);
  return d.reason;
}

template <typename T>
void poke(HeaderBytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

}  // namespace

TEST(Wire, RoundTrip) {
  const HeaderBytes b = encode_header(data_header());
  DecodeResult d = decode_header(b.data(), b.size(), limits());
  ASSERT_TRUE(d.ok) << reject_reason_name(d.reason);
  EXPECT_EQ(d.header.op, OpKind::kAllgather);
  EXPECT_EQ(d.header.dtype, core::DType::kF32);
  EXPECT_EQ(d.header.src, 2u);
  EXPECT_EQ(d.header.tag, 7u);
  EXPECT_EQ(d.header.shape, (core::Shape{3, 5}));
  EXPECT_EQ(d.header.nbytes, 60u);
}

TEST(Wire, ZeroSizedAndScalar) {
  FrameHeader h = data_header();
  h.shape = {0, 5};
  h.nbytes = 0;
  HeaderBytes b = encode_header(h);
  EXPECT_TRUE(decode_header(b.data(), b.size(), limits()).ok);
  h.shape = {};
  h.nbytes = 4;
  b = encode_header(h);
  EXPECT_TRUE(decode_header(b.data(), b.size(), limits()).ok);
}

TEST(Wire, RejectsEachBadField) {
  const HeaderBytes good = encode_header(data_header());
  HeaderBytes b = good;
  EXPECT_EQ(decode_header(b.data(), b.size() - 1, limits()).reason, RejectReason::kHeaderSize);
  EXPECT_EQ(decode_header(nullptr, 0, limits()).reason, RejectReason::kHeaderSize);
  poke<uint32_t>(b, 0, 0xdeadbeef);
  EXPECT_EQ(reason_of(b), RejectReason::kMagic);
  b = good; poke<uint8_t>(b, 4, 9);
  EXPECT_EQ(reason_of(b), RejectReason::kVersion);
  b = good; poke<uint8_t>(b, 5, 0);
  EXPECT_EQ(reason_of(b), RejectReason::kKind);
  b = good; poke<uint8_t>(b, 6, 200);
  EXPECT_EQ(reason_of(b), RejectReason::kOp);
  b = good; poke<uint8_t>(b, 7, 0);
  EXPECT_EQ(reason_of(b), RejectReason::kDType);
  b = good; poke<uint32_t>(b, 8, 4);  // src == world
  EXPECT_EQ(reason_of(b), RejectReason::kRank);
  b = good; poke<uint32_t>(b, 8, 0);  // src == self
  EXPECT_EQ(reason_of(b), RejectReason::kRank);
  b = good; poke<uint32_t>(b, 12, 5);
  EXPECT_EQ(reason_of(b), RejectReason::kWorld);
  b = good; poke<uint64_t>(b, 16, 1);
  EXPECT_EQ(reason_of(b), RejectReason::kGroup);
  b = good; poke<uint32_t>(b, 24, kMaxTag);
  EXPECT_EQ(reason_of(b), RejectReason::kTag);
  b = good; poke<uint32_t>(b, 28, 9);  // ndim > 8
  EXPECT_EQ(reason_of(b), RejectReason::kShape);
  b = good; poke<int64_t>(b, 40, -1);  // negative dim
  EXPECT_EQ(reason_of(b), RejectReason::kShape);
  b = good; poke<int64_t>(b, 40 + 8 * 5, 3);  // unused dim set
  EXPECT_EQ(reason_of(b), RejectReason::kShape);
  b = good; poke<uint64_t>(b, 32, 61);  // byte count disagrees
  EXPECT_EQ(reason_of(b), RejectReason::kSize);
  b = good; poke<int64_t>(b, 40, int64_t{1} << 62);  // product overflows
  EXPECT_EQ(reason_of(b), RejectReason::kSize);
  b = good;  // product would wrap to the right byte count
  poke<uint32_t>(b, 28, 4);
  poke<int64_t>(b, 40, int64_t{1} << 31);
  poke<int64_t>(b, 48, int64_t{1} << 31);
  poke<int64_t>(b, 56, int64_t{1} << 31);
  poke<int64_t>(b, 64, 4);
  EXPECT_EQ(reason_of(b), RejectReason::kSize);
  b = good;  // consistent but over the limit
  poke<int64_t>(b, 40, 1 << 20);
  poke<uint64_t>(b, 32, uint64_t{20} << 20);
  EXPECT_EQ(reason_of(b), RejectReason::kSize);
  FrameHeader hello;
  hello.kind = FrameKind::kHello;
  hello.src = 1;
  hello.world = 4;
  hello.group = group_hash("g");
  b = encode_header(hello);
  EXPECT_TRUE(decode_header(b.data(), b.size(), limits()).ok);
  poke<uint64_t>(b, 32, 8);  // control frames carry nothing
  EXPECT_EQ(reason_of(b), RejectReason::kSize);
}

TEST(Wire, RandomBytesNeverPass) {
  std::mt19937_64 rng(42);
  HeaderBytes b;
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (i % 2) poke<uint32_t>(b, 0, kWireMagic);  // get past the magic half the time
    if (i % 4 == 1) poke<uint8_t>(b, 4, kWireVersion);
    accepted += decode_header(b.data(), b.size(), limits()).ok;
  }
  EXPECT_EQ(accepted, 0);
}

TEST(Wire, RoutingIds) {
  EXPECT_EQ(rank_from_routing_id(routing_id_for(17).data(), routing_id_for(17).size()), 17);
  EXPECT_EQ(rank_from_routing_id("tsr", 3), -1);
  EXPECT_EQ(rank_from_routing_id("tsrx1", 5), -1);
  EXPECT_EQ(rank_from_routing_id("abc12", 5), -1);
  EXPECT_EQ(rank_from_routing_id("tsr99999999999", 14), -1);
  EXPECT_EQ(rank_from_routing_id("tsr0", 4), 0);
  EXPECT_EQ(rank_from_routing_id("tsr01", 5), -1);  // not the canonical spelling of rank 1
  EXPECT_EQ(rank_from_routing_id("tsr007", 6), -1);
}

TEST(Link, ParsesSpecs) {
  auto s = parse_link_spec("500mbit,2ms");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_DOUBLE_EQ(s->bandwidth_bps, 500e6);
  EXPECT_DOUBLE_EQ(s->latency_s, 2e-3);
  s = parse_link_spec("1.5gbit, 250us");
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->bandwidth_bps, 1.5e9);
  EXPECT_DOUBLE_EQ(s->latency_s, 250e-6);
  s = parse_link_spec("100kbit");
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->bandwidth_bps, 1e5);
  EXPECT_EQ(s->latency_s, 0);
  s = parse_link_spec("9600bit");
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->bandwidth_bps, 9600);
  s = parse_link_spec("3ms");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->bandwidth_bps, 0);
  s = parse_link_spec("100mbit,64kb");  // tc tbf's burst units
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->bandwidth_bps, 100e6);
  EXPECT_DOUBLE_EQ(s->burst_bytes, 65536);
  s = parse_link_spec("1gbit,1mb,2ms");
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->burst_bytes, 1048576);
  EXPECT_DOUBLE_EQ(s->latency_s, 2e-3);
  for (const char* bad : {"", "fast", "100", "100mb", "-1mbit", "1mbit,2mbit", "2ms,3ms", "1mbit,", "mbit",
                          "1mbit,2kb,3kb", "64kb,2ms",
                          // Beyond what durations and byte counts hold (a hostile job's link):
                          "1gbit,1e308mb", "1e300s", "1e308gbit", "1gbit,86401s", "999bit", "1e20kbit", "1gbit,2048mb"}) {
    EXPECT_FALSE(parse_link_spec(bad).ok()) << bad;
  }
}

TEST(Link, Matrix) {
  auto m = LinkMatrix::from_json(R"({"bandwidth_bps": [[0, 1e6], [2e6, 0]], "latency_ms": [[0, 5], [1, 0]]})", 2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_DOUBLE_EQ(m->link(0, 1).bandwidth_bps, 1e6);
  EXPECT_DOUBLE_EQ(m->link(1, 0).bandwidth_bps, 2e6);
  EXPECT_DOUBLE_EQ(m->link(0, 1).latency_s, 5e-3);
  EXPECT_FALSE(m->link(0, 0).paced());
  EXPECT_FALSE(LinkMatrix::from_json(R"({"bandwidth_bps": [[0, 1e6]]})", 2).ok());
  EXPECT_FALSE(LinkMatrix::from_json(R"({"latency_ms": [[0, "x"], [1, 0]]})", 2).ok());
  EXPECT_FALSE(LinkMatrix::from_json("not json", 2).ok());
  auto b = LinkMatrix::from_json(R"({"bandwidth_bps": [[0, 1e6], [1e6, 0]], "burst_bytes": [[0, 4096], [0, 0]]})", 2);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_DOUBLE_EQ(b->link(0, 1).burst_bytes, 4096);
  EXPECT_DOUBLE_EQ(b->link(1, 0).burst_bytes, 0);
  auto u = LinkMatrix::from_arg("100mbit,1ms", 3);
  ASSERT_TRUE(u.ok());
  EXPECT_DOUBLE_EQ(u->link(2, 1).bandwidth_bps, 100e6);
  const std::string path = ::testing::TempDir() + "links.json";
  ASSERT_TRUE(core::write_file(path, R"({"bandwidth_bps": [[0, 8e6], [8e6, 0]]})").ok());
  auto f = LinkMatrix::from_arg(path, 2);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_DOUBLE_EQ(f->link(1, 0).bandwidth_bps, 8e6);
}

TEST(Link, PacerSerialisesAndDelays) {
  using namespace std::chrono;
  LinkPacer p(LinkSpec{8e6, 0.010}, 0);  // 1 MB/s, 10 ms
  const auto t0 = steady_clock::now();
  const auto r1 = p.schedule(1000000, t0);  // 1 s on the link
  const auto r2 = p.schedule(500000, t0);   // queued behind it
  EXPECT_NEAR(duration<double>(r1 - t0).count(), 1.010, 1e-6);
  EXPECT_NEAR(duration<double>(r2 - t0).count(), 1.510, 1e-6);
  // After an idle period the link starts fresh.
  const auto r3 = p.schedule(1000, t0 + seconds(10));
  EXPECT_NEAR(duration<double>(r3 - t0).count(), 10.011, 1e-6);
  // tbf's burst: after an idle period the first 64 KiB go at once.
  LinkPacer burst(LinkSpec{8e6, 0, 65536}, 65536);
  const auto t1 = t0 + seconds(20);
  EXPECT_NEAR(duration<double>(burst.schedule(65536 + 100000, t1) - t1).count(), 0.1, 1e-6);
  EXPECT_NEAR(duration<double>(burst.schedule(100000, t1) - t1).count(), 0.2, 1e-6);  // no credit left
  LinkPacer lat(LinkSpec{0, 0.002}, 0);
  EXPECT_NEAR(duration<double>(lat.schedule(1 << 30, t0) - t0).count(), 0.002, 1e-9);
  // Latency delays each message without holding back the next: one posted
  // 1 ms later leaves 1 ms later, not a whole latency after the first.
  EXPECT_NEAR(duration<double>(lat.schedule(1, t0 + milliseconds(1)) - t0).count(), 0.003, 1e-9);
}

TEST(Keys, GenerateWriteRead) {
  auto k = generate_cluster_key();
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_TRUE(validate_cluster_key(*k).ok());
  const std::string path = ::testing::TempDir() + "cluster-" + std::to_string(::getpid()) + ".key";
  std::remove(path.c_str());
  ASSERT_TRUE(write_key_file(path, *k).ok());
  EXPECT_FALSE(write_key_file(path, *k).ok());  // no silent overwrite
  auto back = read_key_file(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->public_z85, k->public_z85);
  EXPECT_EQ(back->secret_z85, k->secret_z85);
  auto other = generate_cluster_key();
  ASSERT_TRUE(other.ok());
  ClusterKey mixed{k->public_z85, other->secret_z85};
  EXPECT_FALSE(validate_cluster_key(mixed).ok());
  ASSERT_TRUE(core::write_file(path, "{\"format\": \"tessera-cluster-key\"}").ok());
  EXPECT_FALSE(read_key_file(path).ok());
  std::remove(path.c_str());
}

TEST(Stats, Json) {
  CommStats s;
  s.rank = 1;
  s.world = 2;
  s.per_peer.resize(2);
  s.per_peer[0].bytes_sent = 10;
  s.op(OpKind::kAllgather).traffic.bytes_sent = 10;
  s.op(OpKind::kAllgather).calls = 1;
  s.rejected_by_reason[static_cast<size_t>(RejectReason::kMagic)] = 3;
  s.frames_rejected = 3;
  const nlohmann::json j = stats_to_json(s);
  EXPECT_EQ(j["per_peer"][0]["bytes_sent"], 10);
  EXPECT_EQ(j["per_op"]["allgather"]["calls"], 1);
  EXPECT_EQ(j["rejected_by_reason"]["magic"], 3);
  EXPECT_FALSE(j["per_op"].contains("broadcast"));
}
