// A worker daemon (a real `tessera worker` process on 127.0.0.1) against
// peers that hold the cluster key and misbehave: it answers or drops what
// they send, never exits because of it, keeps its memory bounded, binds
// only the interface it was told to, and then serves a legitimate terminal.
#include <gtest/gtest.h>

#include <limits>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "comm/control.h"
#include "comm/group.h"
#include "comm/keys.h"
#include "core/io.h"
#include "model/safetensors.h"
#include "parallel/strategy.h"
#include "planner/profile.h"
#include "runtime/cluster_profile.h"
#include "runtime/cluster_file.h"
#include "runtime/protocol.h"
#include "runtime/job.h"

#include "cli_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string kData = TESSERA_TEST_DATA;
const std::string kBin = TESSERA_BIN;

std::string tmp(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/" + info->name() + "-" + std::to_string(::getpid()) + "-" + name;
}

// Ports [2000, 7000): clear of distributed_test (7000..16000) and of
// pick_local_endpoints (16384 and up); each test of this file takes its own.
int port_base(int test_slot) {
  return testing::free_port_window(2000 + test_slot * 10, 40, 100, static_cast<int>(::getpid() % 100), 10);
}
std::string local(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

// A `tessera worker` writing its log to `log`; stopped (SIGTERM) on scope exit.
class Daemon {
 public:
  Daemon(int port, const std::string& key, const std::string& log) : port_(port), log_(log) {
    // Emptied before the fork: an earlier process's log of the same name is never read as this one's.
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_ = ::fork();
    if (pid_ != 0 && fd >= 0) ::close(fd);
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      // A small ASan quarantine, so that freed buffers do not count as
      // resident memory in the sanitizer build (no effect in Release).
      const char* prev = std::getenv("ASAN_OPTIONS");
      const std::string asan = std::string(prev ? prev : "") + ":quarantine_size_mb=8:thread_local_quarantine_size_kb=64";
      ::setenv("ASAN_OPTIONS", asan.c_str(), 1);
      const std::string ep = local(port);
      ::execl(kBin.c_str(), "tessera", "worker", "--listen", ep.c_str(), "--key", key.c_str(), "--models", kData.c_str(),
              nullptr);
      ::_exit(127);
    }
  }
  ~Daemon() {
    if (pid_ > 0 && alive()) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  bool alive() {
    int status = 0;
    return ::waitpid(pid_, &status, WNOHANG) == 0;
  }
  pid_t pid() const { return pid_; }
  std::string endpoint() const { return local(port_); }
  std::string data_endpoint() const { return local(port_ + 1); }
  std::string log() const {
    auto r = core::read_file(log_);
    return r.ok() ? *r : std::string();
  }

 private:
  int port_;
  std::string log_;
  pid_t pid_ = -1;
};

// Waits (polling, with a deadline) until the daemon answers control requests.
bool wait_until_serving(const Daemon& d, const comm::ClusterKey& key) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    if (comm::control_request(d.endpoint(), key, runtime::kPingRequest, milliseconds(1000)).ok()) return true;
  }
  return false;
}

// A request as raw frames (a well-behaved client sends exactly one); the
// reply, or "" when none comes within `timeout`.
std::string raw_request(const std::string& ep, const comm::ClusterKey& key, const std::vector<std::string>& frames,
                        milliseconds timeout) {
  zmq::context_t ctx(1);
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.set(zmq::sockopt::curve_serverkey, key.public_z85);
  req.set(zmq::sockopt::curve_publickey, key.public_z85);
  req.set(zmq::sockopt::curve_secretkey, key.secret_z85);
  req.set(zmq::sockopt::rcvtimeo, static_cast<int>(timeout.count()));
  req.connect(ep);
  for (size_t i = 0; i < frames.size(); ++i)
    req.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  zmq::message_t m;
  if (!req.recv(m)) return "";
  return m.to_string();
}

int64_t status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size()));
  return -1;
}

// Local addresses ("0100007F:1F90") of the TCP sockets `pid` listens on,
// from /proc/net/tcp and tcp6 matched against the process's socket inodes.
std::vector<std::string> listening_addresses(pid_t pid) {
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local_addr, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local_addr >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state == "0A" && inodes.count(inode)) out.push_back(local_addr);  // 0A: LISTEN
    }
  }
  return out;
}

runtime::JobSpec job_for(const Daemon& d, const std::string& terminal, int64_t timeout_ms) {
  runtime::JobSpec job;
  job.rank = 1;
  job.endpoints = {terminal, d.data_endpoint()};
  job.model_dir = "gpt2-tiny";  // a name under the daemon's --models root
  job.plan.strategy = "voltage";
  job.plan.world = 2;
  job.timeout_ms = timeout_ms;
  return job;
}

json answer(const std::string& ep, const comm::ClusterKey& key, const std::string& request) {
  auto a = comm::control_request(ep, key, request, milliseconds(20000));
  if (!a.ok()) return json{{"no_answer", a.status().to_string()}};
  return json::parse(*a, nullptr, false);
}

comm::ClusterKey make_key(const std::string& path) {
  const comm::ClusterKey key = comm::generate_cluster_key().value();
  EXPECT_TRUE(comm::write_key_file(path, key, true).ok());
  return key;
}

// Found by fuzz_cluster: U+02DA made toml++ 3.3 reach __builtin_unreachable.
TEST(ClusterFileTest, NonAsciiIsRefusedBeforeTheTomlParserSeesIt) {
  const std::string crash = core::read_file(kData + "/../fuzz/corpus/fuzz_cluster/crash-toml-unreachable")
                                .value()
                                .substr(1);  // the fuzzer's selector byte
  auto c = runtime::parse_cluster_file(crash, "crash.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not ASCII"), std::string::npos) << c.status().to_string();
  EXPECT_FALSE(runtime::parse_cluster_file("terminal = \"tcp://h:1\" \u02da\n", "x.toml").ok());
  auto ok = runtime::parse_cluster_file("terminal = \"tcp://127.0.0.1:7100\"\nworkers = [\"tcp://127.0.0.1:7070\"]\n", "ok.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->workers.size(), 1u);
}

// The per-worker schema: [[worker]] entries with optional budgets, a
// [terminal] table with its own, and the old short form beside them.
TEST(ClusterFileTest, WorkerEntriesCarryBudgets) {
  auto c = runtime::parse_cluster_file(R"(
[terminal]
endpoint = "tcp://127.0.0.1:7100"
memory = "1GB"

[[worker]]
endpoint = "tcp://127.0.0.1:7070"
memory = "512MB"

[[worker]]
endpoint = "tcp://127.0.0.1:7080"
)",
                                       "c.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->terminal, "tcp://127.0.0.1:7100");
  EXPECT_EQ(c->workers, (std::vector<std::string>{"tcp://127.0.0.1:7070", "tcp://127.0.0.1:7080"}));
  const int64_t gb = planner::parse_bytes("1GB").value(), mb512 = planner::parse_bytes("512MB").value();
  EXPECT_EQ(c->memory, (std::vector<int64_t>{gb, mb512, 0}));
  const auto limits = c->memory_limits();
  ASSERT_EQ(limits.size(), 3u);
  EXPECT_EQ(limits[1], mb512);
  EXPECT_EQ(limits[2], std::numeric_limits<int64_t>::max());  // no budget

  auto old = runtime::parse_cluster_file("terminal = \"tcp://127.0.0.1:7100\"\nworkers = [\"tcp://127.0.0.1:7070\"]\n", "o.toml");
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  EXPECT_TRUE(old->memory_limits().empty());

  // Each mistake gets its own one-line error.
  const std::pair<const char*, const char*> bad[] = {
      {"terminal = \"tcp://h:1\"\n[[worker]]\nmemory = \"1GB\"\n", "needs endpoint"},
      {"terminal = \"tcp://h:1\"\n[[worker]]\nendpoint = \"tcp://h:2\"\nmemory = \"lots\"\n", "memory"},
      {"terminal = \"tcp://h:1\"\n[[worker]]\nendpoint = \"tcp://h:2\"\nmemory = 5\n", "memory must be a string"},
      {"terminal = \"tcp://h:1\"\n", "no workers"},
      {"[terminal]\nmemory = \"1GB\"\n[[worker]]\nendpoint = \"tcp://h:2\"\n", "[terminal] needs endpoint"},
      {"terminal = \"tcp://h:1\"\nworker = 3\n", "[[worker]] tables"},
  };
  for (const auto& [text, want] : bad) {
    auto r = runtime::parse_cluster_file(text, "bad.toml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().to_string();
  }
}

// Audit defect 6: a two-frame request made the daemon exit (EFSM on reply).
TEST(DaemonTest, MultiFrameRequestsDoNotStopTheDaemon) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = make_key(key_path);
  Daemon d(port_base(0), key_path, tmp("daemon.log"));
  ASSERT_TRUE(wait_until_serving(d, key)) << d.log();
  for (size_t frames : {2, 3, 7}) {
    const std::string reply = raw_request(d.endpoint(), key, std::vector<std::string>(frames, "{}"), milliseconds(20000));
    EXPECT_NE(reply.find("one frame"), std::string::npos) << frames << " frames: '" << reply << "'";
    ASSERT_TRUE(d.alive()) << d.log();
  }
  // Still serving: a bad job gets its answer.
  const json a = answer(d.endpoint(), key, "{}");
  EXPECT_EQ(a.value("ok", true), false) << a.dump();
  EXPECT_TRUE(d.alive());
  EXPECT_NE(d.log().find("malformed request"), std::string::npos) << d.log();
  EXPECT_EQ(answer(d.endpoint(), key, runtime::kPingRequest).value("ok", false), true);  // the terminal's probe
}

// Audit defect 8: the data port bound tcp://*:PORT whatever --listen said.
TEST(DaemonTest, DataPortListensOnlyOnTheListenInterface) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = make_key(key_path);
  const int base = port_base(1);
  Daemon d(base, key_path, tmp("daemon.log"));
  ASSERT_TRUE(wait_until_serving(d, key)) << d.log();
  // The data port exists while a job runs: a job whose terminal never comes.
  const json a = answer(d.endpoint(), key, job_for(d, local(base + 4), 5000).to_json().dump());
  ASSERT_EQ(a.value("ok", false), true) << a.dump();
  std::vector<std::string> listening;
  for (const auto deadline = Clock::now() + std::chrono::seconds(20); Clock::now() < deadline;) {
    listening = listening_addresses(d.pid());
    if (listening.size() >= 2) break;
  }
  ASSERT_EQ(listening.size(), 2u) << "control and data sockets";
  for (const auto& addr : listening) {
    EXPECT_EQ(addr.rfind("0100007F:", 0), 0u) << addr << " is not 127.0.0.1";
    EXPECT_NE(addr.rfind("00000000:", 0), 0u) << addr << " is bound to 0.0.0.0";
  }
  // Free again once the job's timeout passes; and never exited.
  EXPECT_TRUE(answer(d.endpoint(), key, "{}").contains("ok"));
  EXPECT_TRUE(d.alive());
}

// The hostile-peer test of issue 17: one daemon, a key holder sending every
// malformed request class, then a legitimate terminal.
TEST(DaemonTest, HostileKeyHolderCannotStopExhaustOrHoldTheDaemon) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = make_key(key_path);
  const int base = port_base(2);
  Daemon d(base, key_path, tmp("daemon.log"));
  ASSERT_TRUE(wait_until_serving(d, key)) << d.log();
  const int64_t start_rss_kib = status_kib(d.pid(), "VmRSS:");
  ASSERT_GT(start_rss_kib, 0);
  const uint64_t cap = comm::GroupOptions{}.max_unmatched_bytes_per_peer;  // one hostile peer
  const std::string hostile_terminal = local(base + 4);
  const json good = job_for(d, hostile_terminal, 2000).to_json();
  auto refused = [&](const json& job, const std::string& what) {
    const json a = answer(d.endpoint(), key, job.dump());
    EXPECT_EQ(a.value("ok", true), false) << what << ": " << a.dump();
  };
  struct HostileCase {
    std::string name;
    std::function<void()> send;
  };
  // A terminal that joins and then stops its heartbeats is
  // DistributedTest.SilentTerminalLosesItsJobAndTheDaemonServesTheNext.
  const std::vector<HostileCase> cases = {
      {"multi-frame request",
       [&] {
         const std::string r = raw_request(d.endpoint(), key, {good.dump(), good.dump()}, milliseconds(20000));
         EXPECT_NE(r.find("one frame"), std::string::npos) << r;
       }},
      {"oversized request",  // over the 1 MiB control limit: ZeroMQ drops the connection
       [&] { EXPECT_EQ(raw_request(d.endpoint(), key, {std::string(2 << 20, '{')}, milliseconds(1000)), ""); }},
      {"bad field types",
       [&] {
         for (const auto& [field, value] :
              std::vector<std::pair<std::string, json>>{{"rank", "1"},      {"endpoints", 5},        {"threads", true},
                                                        {"timeout_ms", json::array({1})}, {"group_id", json::object()},
                                                        {"plan", 5}, {"model", 7}, {"heartbeat_ms", "1s"},
                                                        {"insecure", "no"}}) {
           json j = good;
           j[field] = value;
           refused(j, field);
         }
         refused(json::array(), "array");
         refused(json("job"), "string");
       }},
      {"out-of-range numbers",
       [&] {
         for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
                  {"rank", 1e300},          {"rank", 4294967297ll},   {"rank", -1},           {"rank", 2},
                  {"threads", 100000},      {"threads", 0},           {"timeout_ms", -5},     {"timeout_ms", 1e20},
                  {"timeout_ms", 86400001}, {"heartbeat_ms", 5}}) {
           json j = good;
           j[field] = value;
           refused(j, field + " = " + value.dump());
         }
         json many = good;
         many["endpoints"] = std::vector<std::string>(100, d.data_endpoint());
         refused(many, "100 endpoints");
         // The plan's options are checked against the model before the job is taken.
         for (const json& plan : {json{{"strategy", "prism"}, {"world", 2}, {"options", {{"rate", -1.0}}}},
                                  json{{"strategy", "prism"}, {"world", 2}, {"options", {{"rate", 1e308}}}},
                                  json{{"strategy", "prism"}, {"world", 2}, {"options", {{"segments", -3}}}},
                                  json{{"strategy", "pipeline"}, {"world", 2}, {"options", {{"layer_map", {99, 0}}}}},
                                  json{{"strategy", "voltage"}, {"world", 2}, {"ratios", {1e308, -1e308}}},
                                  json{{"strategy", "warp"}, {"world", 2}}}) {
           json j = good;
           j["plan"] = plan;
           refused(j, "plan " + plan.dump());
         }
       }},
      {"paths outside the allowed roots",  // jobs carry data: model names and inline links only
       [&] {
         for (const std::string& model : {std::string("../../etc"), std::string("/etc"), kData + "/gpt2-tiny",
                                          std::string("gpt2-tiny/../../.."), std::string("missing")}) {
           json j = good;
           j["model"] = model;
           refused(j, "model " + model);
         }
         for (const char* link : {"@/dev/zero", "/dev/zero", "@/etc/passwd", "links.json"}) {
           json j = good;
           j["link"] = link;
           refused(j, std::string("link ") + link);
         }
       }},
      {"bad profile requests",  // the profile side of the control channel (runtime/cluster_profile.h)
       [&] {
         runtime::ProfileJob dev;
         dev.model = "gpt2-tiny";
         dev.rows = 8;
         runtime::ProfileJob links;
         links.part = runtime::ProfileJob::Part::kLinks;
         links.endpoints = {hostile_terminal, d.data_endpoint()};
         links.group_id = "hostile-profile";
         const json good_dev = dev.to_json(), good_links = links.to_json();
         const std::vector<std::pair<json, std::pair<std::string, json>>> bad = {
             {good_dev, {"part", "everything"}},  {good_dev, {"part", 3}},
             {good_dev, {"model", "../../etc"}},  {good_dev, {"model", "/etc"}},
             {good_dev, {"model", ""}},           {good_dev, {"model", "missing"}},
             {good_dev, {"threads", 0}},          {good_dev, {"threads", 100000}},
             {good_dev, {"rows", 0}},             {good_dev, {"rows", 1e300}},
             {good_dev, {"rows", 100000}},  // beyond the model's positions
             {good_dev, {"reprofile", "yes"}},
             {good_links, {"rank", 0}},           {good_links, {"rank", 2}},
             {good_links, {"endpoints", json::array({hostile_terminal})}},
             {good_links, {"endpoints", std::vector<std::string>(100, hostile_terminal)}},
             {good_links, {"group_id", ""}},      {good_links, {"link", "@/etc/passwd"}},
             {good_links, {"link", "/dev/zero"}}, {good_links, {"timeout_ms", -1}},
         };
         for (const auto& [base_request, change] : bad) {
           json j = base_request;
           j["profile"][change.first] = change.second;
           refused(j, "profile " + change.first + " = " + change.second.dump());
         }
         refused(json{{"profile", 5}}, "profile 5");
         // A good one is answered with a profile the terminal can read.
         const json a = answer(d.endpoint(), key, good_dev.dump());
         ASSERT_EQ(a.value("ok", false), true) << a.dump();
         auto p = planner::DeviceProfile::from_json(a["profile"]);
         ASSERT_TRUE(p.ok()) << p.status().to_string();
         EXPECT_FALSE(p->gemm.empty());
         // The encryption's CPU rate is measured where the job's threads take
         // every core (the transport then shares them), and left 0 where a
         // core is to spare. The daemon runs on this process's cores.
         cpu_set_t set;
         CPU_ZERO(&set);
         ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
         const int cores = CPU_COUNT(&set);
         if (cores > 1) {
           EXPECT_EQ(p->crypto_gbps, 0) << "1 thread of " << cores << " cores";
         }
         json all_cores = good_dev;
         all_cores["profile"]["threads"] = cores;
         const json b = answer(d.endpoint(), key, all_cores.dump());
         ASSERT_EQ(b.value("ok", false), true) << b.dump();
         auto q = planner::DeviceProfile::from_json(b["profile"]);
         ASSERT_TRUE(q.ok()) << q.status().to_string();
         EXPECT_GT(q->crypto_gbps, 0);
       }},
      {"silent terminal",  // accepted, then never joins: the daemon waits the job's timeout, no more
       [&] {
         const json a = answer(d.endpoint(), key, good.dump());
         EXPECT_EQ(a.value("ok", false), true) << a.dump();
       }},
      {"a batched step past a slot's cache",  // refused before any collective: the job ends, the daemon stays
       [&] {
         runtime::JobSpec job = job_for(d, hostile_terminal, 20000);
         job.plan.strategy = "tp";
         const json a = answer(d.endpoint(), key, job.to_json().dump());
         ASSERT_EQ(a.value("ok", false), true) << a.dump();
         comm::GroupOptions o;
         o.rank = 0;
         o.endpoints = {hostile_terminal, d.data_endpoint()};
         o.group_id = job.group_id;
         o.key = key;
         o.connect_timeout = milliseconds(20000);
         auto g = comm::Group::create(o);
         ASSERT_TRUE(g.ok()) << g.status().to_string();
         const milliseconds t(20000);
         auto ready = runtime::recv_from_worker(**g, 1, t);
         ASSERT_TRUE(ready.ok() && std::holds_alternative<runtime::msg::Ready>(*ready));
         // A generation in slot 0 with an 8-position cache, ended at once (the slot keeps it).
         ASSERT_TRUE(runtime::send_to_worker(**g, 1, runtime::msg::Generate{8, false, 0, false}, t).ok());
         ASSERT_TRUE(runtime::send_to_worker(**g, 1, runtime::msg::End{}, t).ok());
         auto done = runtime::recv_from_worker(**g, 1, t);
         ASSERT_TRUE(done.ok() && std::holds_alternative<runtime::msg::Done>(*done)) << done.status().to_string();
         // Position 8 of an 8-position cache.
         ASSERT_TRUE(runtime::send_to_worker(**g, 1, runtime::msg::Step{{0}, {8}, {}}, t).ok());
         EXPECT_EQ(runtime::recv_from_worker(**g, 1, t).status().code(), core::ErrorCode::kNetwork);
       }},
      {"flood of unmatched frames",
       [&] {
         const json a = answer(d.endpoint(), key, job_for(d, hostile_terminal, 20000).to_json().dump());
         ASSERT_EQ(a.value("ok", false), true) << a.dump();
         comm::GroupOptions o;
         o.rank = 0;
         o.endpoints = {hostile_terminal, d.data_endpoint()};
         o.group_id = good["group_id"].get<std::string>();
         o.key = key;
         o.connect_timeout = milliseconds(20000);
         o.close_timeout = milliseconds(60000);  // closing waits until every frame has left
         auto g = comm::Group::create(o);
         ASSERT_TRUE(g.ok()) << g.status().to_string();
         ASSERT_TRUE((*g)->recv(1, 1, milliseconds(20000)).ok());  // the worker's "ready"
         // 48 x 4 MiB on a tag nobody receives: 192 MiB, over the cap.
         for (int i = 0; i < 48; ++i)
           ASSERT_TRUE((*g)->send(1, 77, core::Tensor::zeros(core::DType::kU8, {4 << 20}), milliseconds(20000)).ok());
         // Then "stop" on the worker's own tag: frames from one peer arrive in
         // order, so the worker has filed or dropped the whole flood when it
         // reads this. Its job ends and the daemon logs the mailbox figures.
         const std::string stop = R"({"op":"stop"})";
         core::Tensor t = core::Tensor::zeros(core::DType::kU8, {static_cast<int64_t>(stop.size())});
         std::memcpy(t.raw(), stop.data(), stop.size());
         ASSERT_TRUE((*g)->send(1, 2, t, milliseconds(60000)).ok());
         // Stay until the worker leaves (it says goodbye after "stop"):
         // closing first could cut frames still on their way.
         EXPECT_EQ((*g)->recv(1, 3, milliseconds(120000)).status().code(), core::ErrorCode::kNetwork);
       }},
  };
  for (const auto& c : cases) {
    c.send();
    ASSERT_TRUE(d.alive()) << "after " << c.name << ":\n" << d.log();
  }
  // Back in its loop (the flood's job has ended and been logged): it answers,
  // which it cannot while a job holds it.
  ASSERT_TRUE(answer(d.endpoint(), key, "{}").contains("ok")) << d.log();

  // Every job's buffered peak stayed under the cap, and the flood was cut.
  const std::string log = d.log();
  uint64_t peaks = 0, dropped = 0;
  for (size_t at = log.find("unmatched bytes peak "); at != std::string::npos;
       at = log.find("unmatched bytes peak ", at + 1)) {
    std::istringstream f(log.substr(at + 21));
    uint64_t peak = 0, frames = 0;
    std::string comma;
    f >> peak >> comma >> frames;
    EXPECT_LE(peak, cap) << log;
    dropped += frames;
    ++peaks;
  }
  EXPECT_GE(peaks, 2u) << log;  // the silent terminal's job and the flood's
  EXPECT_NE(log.find("a batched step at position 8 of a 8-position cache"), std::string::npos) << log;
  EXPECT_GT(dropped, 0u) << log;
  const int64_t rss_kib = status_kib(d.pid(), "VmRSS:");
  EXPECT_LE(rss_kib - start_rss_kib, static_cast<int64_t>(cap / 1024) + 50 * 1024)
      << "RSS from " << start_rss_kib << " KiB to " << rss_kib << " KiB";

  // A legitimate terminal is served, correctly: the run (which gives up on a
  // daemon that does not answer and join within its --timeout of 5 s)
  // succeeds, and its job is the next one the daemon finishes. How fast is
  // not this test's business: the daemon's answer above shows nothing holds it.
  auto finished_jobs = [&] {
    const std::string log = d.log();
    size_t n = 0;
    for (size_t at = log.find("job of group "); at != std::string::npos; at = log.find("job of group ", at + 1)) {
      const size_t eol = log.find('\n', at);
      if (log.substr(at, eol == std::string::npos ? std::string::npos : eol - at).find(" finished (") != std::string::npos)
        ++n;
    }
    return n;
  };
  const size_t finished_before = finished_jobs();
  const std::string cluster = tmp("cluster.toml"), ref = tmp("ref.safetensors"), got = tmp("got.safetensors");
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"" + local(base + 5) + "\"\nworkers = [\"" + d.endpoint() + "\"]\n").ok());
  const std::string model = kData + "/gpt2-tiny", ids = " --ids 9,8,7,6,5,4,3";
  const std::string err = tmp("run.err");
  const int rc = std::system((kBin + " run --model " + model + ids + " --strategy voltage --cluster " + cluster + " --key " +
                              key_path + " --timeout 5 --dump " + got + " 2>" + err)
                                 .c_str());
  ASSERT_EQ(rc, 0) << core::read_file(err).value() << "\n" << d.log();
  // The daemon logs the job once the terminal has left: wait for that line.
  for (const auto deadline = Clock::now() + std::chrono::seconds(30);
       finished_jobs() == finished_before && Clock::now() < deadline;)
    std::this_thread::sleep_for(milliseconds(10));  // polling the log, bounded by the deadline
  EXPECT_EQ(finished_jobs(), finished_before + 1) << d.log();
  ASSERT_EQ(std::system((kBin + " run --model " + model + ids + " --dump " + ref + " >/dev/null").c_str()), 0);
  auto a = model::SafeTensorsFile::open(ref).value().get("hidden.2").value();
  auto b = model::SafeTensorsFile::open(got).value().get("hidden.2").value();
  ASSERT_EQ(a.shape(), b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.f32()[i], b.f32()[i], 1e-4f);
  EXPECT_TRUE(d.alive());
}

// `tessera profile --cluster`: the terminal and two daemons measure
// themselves with the same code as local devices, the links are measured
// through the group they form (with the emulation), the cluster file's
// budgets apply, and `plan` and `run --strategy auto` work from it. A
// terminal budget too small for the whole model makes auto use the daemons;
// the result equals one device.
TEST(DaemonTest, ProfilePlanAndAutoRunThroughDaemons) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = make_key(key_path);
  const int base = port_base(3);
  Daemon a(base, key_path, tmp("a.log")), b(base + 2, key_path, tmp("b.log"));
  ASSERT_TRUE(wait_until_serving(a, key)) << a.log();
  ASSERT_TRUE(wait_until_serving(b, key)) << b.log();
  const std::string cluster = tmp("cluster.toml");
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"" + local(base + 4) + "\"\n[[worker]]\nendpoint = \"" + a.endpoint() +
                                            "\"\nmemory = \"300MB\"\n[[worker]]\nendpoint = \"" + b.endpoint() + "\"\n")
                  .ok());
  const std::string env = "XDG_CACHE_HOME=" + tmp("cache");
  const std::string model = " --model " + kData + "/bert-tiny", on_cluster = " --cluster " + cluster + " --key " + key_path;
  const std::string prof = tmp("profile.json");

  const testing::CmdResult r =
      testing::run("profile" + model + on_cluster + " --link 100mbit,5ms --seq 16 --out " + prof, env);
  ASSERT_EQ(r.code, 0) << r.err << a.log() << b.log();
  const auto p = planner::ClusterProfile::load(prof);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 3);
  for (const auto& d : p->devices) {
    EXPECT_FALSE(d.gemm.empty());
    EXPECT_GT(d.attention_gflops, 0);
    EXPECT_GT(d.memory_bytes, 0);
  }
  EXPECT_NE(p->devices[1].name.find(a.endpoint()), std::string::npos) << p->devices[1].name;
  EXPECT_NE(p->devices[2].name.find(b.endpoint()), std::string::npos) << p->devices[2].name;
  EXPECT_EQ(p->devices[1].memory_bytes, 300000000);  // the cluster file's budget
  // The terminal and daemon b share this host's memory three ways.
  EXPECT_LT(p->devices[0].memory_bytes, static_cast<int64_t>(core::available_memory_bytes() / 2));
  EXPECT_LT(p->devices[2].memory_bytes, static_cast<int64_t>(core::available_memory_bytes() / 2));
  // And its memory bandwidth: one host for all three (whatever a daemon says).
  for (const auto& d : p->devices) EXPECT_EQ(d.host, 0) << d.name;
  for (int from = 0; from < 3; ++from)
    for (int to = 0; to < 3; ++to) {
      if (from == to) continue;
      const planner::LinkProfile& l = p->link(from, to);
      EXPECT_GE(l.latency_ms, 4.9) << from << "->" << to;  // every message waits 5 ms
      EXPECT_GT(l.bandwidth_mbps, 0) << from << "->" << to;
      EXPECT_LE(l.bandwidth_mbps, 200) << from << "->" << to;  // paced, not loopback
    }
  // The daemon logs its part once the terminal has its figures: wait for it.
  for (const auto deadline = Clock::now() + std::chrono::seconds(30);
       a.log().find("link profile of group") == std::string::npos && Clock::now() < deadline;)
    std::this_thread::sleep_for(milliseconds(10));  // polling the log, bounded by the deadline
  EXPECT_NE(a.log().find("link profile of group"), std::string::npos) << a.log();

  // Without the key the terminal says what is missing.
  const testing::CmdResult keyless = testing::run("profile" + model + " --cluster " + cluster + " --out " + tmp("x.json"), env);
  EXPECT_NE(keyless.code, 0);
  EXPECT_NE(keyless.err.find("--key"), std::string::npos) << keyless.err;

  // The plan table, measured through the daemons again; then a terminal
  // budget under which the plan must use a daemon, and the run with it.
  const testing::CmdResult planned = testing::run("plan" + model + on_cluster + " --seq 10 --json", env);
  ASSERT_EQ(planned.code, 0) << planned.err;
  EXPECT_EQ(json::parse(planned.out, nullptr, false)["rows"].size(), parallel::strategies().size()) << planned.out;
  const int64_t terminal_bytes =
      testing::terminal_budget_that_needs_a_worker(model + on_cluster + " --seq 10", ",300MB,1GB", env);  // the request's rows
  ASSERT_GT(terminal_bytes, 0);
  const std::string ids = " --ids 101,205,203,137,321,110,209,203,207,102";
  const std::string got = tmp("got.safetensors"), ref = tmp("ref.safetensors");
  const testing::CmdResult run = testing::run(
      "run" + model + on_cluster + ids + " --strategy auto --stats --dump " + got + " --memory-limit " +
          std::to_string(terminal_bytes) + ",300MB,1GB",
      env);
  ASSERT_EQ(run.code, 0) << run.err << a.log() << b.log();
  const json stats = json::parse(run.out, nullptr, false);
  ASSERT_TRUE(stats.is_object()) << run.out;
  EXPECT_GE(stats["devices"].get<int>(), 2) << run.out;
  EXPECT_TRUE(stats.contains("predicted_ms")) << run.out;
  ASSERT_EQ(testing::run("run" + model + ids + " --dump " + ref).code, 0);
  EXPECT_LE(testing::dump_max_diff(ref, got, "hidden.2"), 1e-4f);
  EXPECT_TRUE(a.alive());
  EXPECT_TRUE(b.alive());
}

}  // namespace
}  // namespace tessera
