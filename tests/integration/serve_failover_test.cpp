// `tessera serve` failing over: worker daemons killed or stopped during a
// completion, streamed or batched; the requests are replayed on the devices
// left with the tokens they would have had, and /metrics counts the failovers.
#include <gtest/gtest.h>

#include <future>

#include "comm/control.h"
#include "comm/keys.h"
#include "runtime/protocol.h"
#include "serve_harness.h"

namespace tessera {
namespace {

using namespace serve_testing;

// Ports [1100, 1950): clear of the other integration tests' ranges.
int port_base() {  // 15 ports each, below daemon_test's 2000
  return testing::free_port_window(1100, 15, 60, static_cast<int>(::getpid() % 60), 15);
}
std::string local(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

std::unique_ptr<Proc> daemon(int port, const std::string& key, const std::string& log) {
  return std::make_unique<Proc>(
      std::vector<std::string>{"worker", "--listen", local(port), "--key", key, "--models", kData}, log);
}

bool serving(int port, const comm::ClusterKey& key) {
  for (const auto end = Clock::now() + std::chrono::seconds(60); Clock::now() < end;)
    if (comm::control_request(local(port), key, runtime::kPingRequest, std::chrono::milliseconds(500)).ok()) return true;
  return false;
}

// Part 3 of issue 15: a worker daemon killed while a completion streams.
// The stream completes with the right tokens; the next request fails over
// to the devices left (counted in /metrics); a daemon that comes back is
// re-admitted before a later request.
TEST(ServeFailoverTest, WorkerKilledDuringAStreamedCompletion) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = comm::generate_cluster_key().value();
  ASSERT_TRUE(comm::write_key_file(key_path, key, true).ok());
  const int base = port_base();
  auto d1 = daemon(base, key_path, tmp("d1.log"));
  auto d2 = daemon(base + 2, key_path, tmp("d2.log"));
  ASSERT_TRUE(serving(base, key) && serving(base + 2, key)) << d1->log() << d2->log();
  const std::string cluster = tmp("cluster.toml");
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"" + local(base + 4) + "\"\nworkers = [\"" + local(base) + "\", \"" +
                                            local(base + 2) + "\"]\n")
                  .ok());
  // 5 ms links: every token crosses them, so the stream is still running
  // when the kill lands after its first token.
  Server s({"--model", kData + "/gpt2-tiny", "--cluster", cluster, "--key", key_path, "--strategy", "tp", "--link",
            "100mbit,5ms"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  ASSERT_EQ(s.health()["devices"].size(), 3u);

  const auto want = reference_tokens(kPrompt, 60);
  const Stream st = stream_completion(s, {{"prompt", kPrompt}, {"max_tokens", 60}, {"temperature", 0}, {"stream", true}},
                                      [&] { d1.reset(); });  // SIGKILL
  EXPECT_EQ(st.tokens, want) << s.proc().log();
  EXPECT_EQ(st.finish, "length");
  EXPECT_TRUE(st.done);
  {  // the generation itself failed over (devices generate now: Session::generate) and resumed
    auto during = s.client().Get("/metrics");
    ASSERT_TRUE(during);
    EXPECT_NE(during->body.find("tessera_failovers_total 1"), std::string::npos) << during->body << s.proc().log();
  }

  // The next forward runs on the devices left.
  const auto m = load("gpt2-tiny");
  auto r = s.post("/v1/embeddings", {{"input", kPrompt}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << s.proc().log();
  core::ThreadPool pool(1);
  const core::Tensor h = m.forward({kPrompt, {}, {}}, {}, &pool).value().hidden.back();
  std::vector<float> mean(static_cast<size_t>(h.dim(1)), 0.0f);
  for (int64_t i = 0; i < h.dim(0); ++i)
    for (int64_t f = 0; f < h.dim(1); ++f) mean[static_cast<size_t>(f)] += h.f32()[i * h.dim(1) + f] / static_cast<float>(h.dim(0));
  const std::vector<float> got = embedding_of(json::parse(r->body)["data"][0]["embedding"]);
  ASSERT_EQ(got.size(), mean.size());
  for (size_t f = 0; f < mean.size(); ++f) EXPECT_NEAR(got[f], mean[f], 1e-4f);
  json health = s.health();
  EXPECT_EQ(health["status"], "degraded") << health.dump();
  EXPECT_EQ(health["devices"][1]["state"], "dropped") << health.dump();
  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("tessera_failovers_total 1"), std::string::npos) << metrics->body;
  EXPECT_NE(s.proc().log().find("failover #1"), std::string::npos) << s.proc().log();
  {  // only the killed daemon was dropped: the survivor's lost connection is no proof, its answer to the probe is
    const std::string log = s.proc().log();
    const size_t at = log.find("failover #1");
    const std::string line = at == std::string::npos ? "" : log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find("dropped " + health["devices"][1]["name"].get<std::string>()), std::string::npos) << line;
    EXPECT_EQ(line.find(health["devices"][2]["name"].get<std::string>()), std::string::npos) << line;
  }

  // The daemon comes back: re-admitted before a later request.
  d1 = daemon(base, key_path, tmp("d1-again.log"));
  ASSERT_TRUE(serving(base, key));
  bool readmitted = false;
  for (const auto end = Clock::now() + std::chrono::seconds(60); !readmitted && Clock::now() < end;) {
    r = s.post("/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 5}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["token_ids"].get<std::vector<int64_t>>(),
              std::vector<int64_t>(want.begin(), want.begin() + 5));
    health = s.health();
    readmitted = health["status"] == "ok";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(readmitted) << health.dump() << s.proc().log();
  s.proc().signal(SIGTERM);
  EXPECT_EQ(s.proc().wait_exit(), 0) << s.proc().log();
}


// A worker killed while batched streams decode: the batch's session fails
// over once, and every stream completes on the devices left with the tokens
// one device gives it alone (each replays from the tokens it had).
void killed_during_batched_streams(std::vector<std::string> plan, int devices = 3) {
  std::vector<std::string> args{"--model", kData + "/gpt2-tiny", "--devices", std::to_string(devices), "--max-batch", "4",
                                "--link", "100mbit,5ms", "--failover-timeout", "5000"};
  args.insert(args.end(), plan.begin(), plan.end());
  Server s(args);
  ASSERT_TRUE(s.up()) << s.proc().log();
  const auto workers = s.proc().children();
  ASSERT_EQ(workers.size(), static_cast<size_t>(devices - 1)) << s.proc().log();
  const auto prompts = batch_prompts();
  const int64_t n = 40;
  std::vector<Stream> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      got[i] = stream_completion(s, {{"prompt", prompts[i]}, {"max_tokens", n}, {"temperature", 0}, {"stream", true}},
                                 [&, i] {
                                   if (i == 0) ::kill(workers.back(), SIGKILL);
                                 });
    });
  for (auto& c : clients) c.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, reference_tokens(prompts[i], n)) << "stream " << i << "\n" << s.proc().log();
    EXPECT_EQ(got[i].finish, "length") << "stream " << i;
    EXPECT_TRUE(got[i].done);
  }
  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metric(metrics->body, "tessera_failovers_total"), 1) << metrics->body << s.proc().log();
  EXPECT_EQ(s.health()["status"], "degraded");
  s.proc().signal(SIGTERM);
  EXPECT_EQ(s.proc().wait_exit(), 0) << s.proc().log();
}

TEST(ServeFailoverTest, WorkerKilledDuringBatchedStreams) { killed_during_batched_streams({"--strategy", "tp"}); }

// The same with a pipeline's overlapped steps on 2 devices (a group of
// streams in flight at each stage when the worker dies).
TEST(ServeFailoverTest, WorkerKilledDuringOverlappedPipelineStreams) {
  killed_during_batched_streams({"--strategy", "pipeline"}, 2);
}

// The same with a pair (Voltage's prefill, TP's decode on its 3 devices):
// every stream completes with its own tokens after the failover.
TEST(ServeFailoverTest, WorkerKilledDuringAPairsBatchedStreams) {
  killed_during_batched_streams({"--strategy", "voltage", "--decode-strategy", "tp", "--decode-devices", "3"});
}

// A daemon that falls silent (stopped, as a partitioned device would be)
// during a request: the run's waits end after --failover-timeout, the
// request is replayed on the devices that answer and equals the single
// device; once the daemon answers again it is re-admitted.
// A local worker stopped (SIGSTOP) is dropped after --failover-timeout and
// killed at once (Session::abandon; it used to hold the failover for 5 s),
// and the request is answered on the devices left with the same tokens.
TEST(ServeFailoverTest, StoppedLocalWorkerIsDroppedAndTheRequestReplayed) {
  Server s({"--model", kData + "/gpt2-tiny", "--devices", "2", "--strategy", "tp", "--failover-timeout", "500"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const auto want = reference_tokens(kPrompt, 8);
  const json body = {{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 0}};
  auto r = s.post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto workers = s.proc().children();
  ASSERT_EQ(workers.size(), 1u) << s.proc().log();
  ::kill(workers[0], SIGSTOP);
  r = s.post("/v1/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << s.proc().log();
  EXPECT_EQ(json::parse(r->body)["choices"][0]["token_ids"].get<std::vector<int64_t>>(), want);
  EXPECT_NE(s.proc().log().find("(timeout); dropped local-1"), std::string::npos) << s.proc().log();
  // Killed and reaped before the answer, not left stopped: no longer serve's child.
  const auto now = s.proc().children();
  EXPECT_EQ(std::find(now.begin(), now.end(), workers[0]), now.end());
  ::kill(workers[0], SIGCONT);  // in case it was not (a no-op otherwise)
}

TEST(ServeFailoverTest, SilentDaemonIsDroppedAndTheRequestReplayed) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = comm::generate_cluster_key().value();
  ASSERT_TRUE(comm::write_key_file(key_path, key, true).ok());
  const int base = port_base() + 5;
  auto d1 = daemon(base, key_path, tmp("d1.log"));
  auto d2 = daemon(base + 2, key_path, tmp("d2.log"));
  ASSERT_TRUE(serving(base, key) && serving(base + 2, key)) << d1->log() << d2->log();
  const std::string cluster = tmp("cluster.toml");
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"" + local(base + 4) + "\"\nworkers = [\"" + local(base) + "\", \"" +
                                            local(base + 2) + "\"]\n")
                  .ok());
  Server s({"--model", kData + "/bert-tiny", "--cluster", cluster, "--key", key_path, "--strategy", "tp", "--timeout", "5"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const std::vector<int64_t> ids = {101, 11, 12, 13, 102};
  const core::Tensor want = reference_forward("bert-tiny", {ids, {}, {}}).pooler;
  auto r = s.post("/v1/embeddings", {{"input", ids}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  d1->signal(SIGSTOP);
  r = s.post("/v1/embeddings", {{"input", ids}});
  d1->signal(SIGCONT);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << s.proc().log();
  expect_near(embedding_of(json::parse(r->body)["data"][0]["embedding"]), want);
  // Dropped for its silence: the terminal's own timeout, or the other
  // daemon leaving first because it waited on the silent one.
  EXPECT_NE(s.proc().log().find("; dropped tcp://"), std::string::npos) << s.proc().log();
  EXPECT_NE(s.health()["status"], "ok");
  bool readmitted = false;
  for (const auto end = Clock::now() + std::chrono::seconds(60); !readmitted && Clock::now() < end;) {
    r = s.post("/v1/embeddings", {{"input", ids}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    expect_near(embedding_of(json::parse(r->body)["data"][0]["embedding"]), want);
    readmitted = s.health()["status"] == "ok";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(readmitted) << s.health().dump() << s.proc().log();
}

// --strategy auto on a cluster: the devices are profiled through their
// daemons before serving; a terminal budget a byte short of one device makes
// the plan use a daemon; when a daemon it uses falls silent, the planner
// plans again over the profiles of the devices left and the request is
// replayed there, equal to the single device.
TEST(ServeFailoverTest, AutoPlansAgainOverTheDevicesLeft) {
  const std::string key_path = tmp("cluster.key");
  const comm::ClusterKey key = comm::generate_cluster_key().value();
  ASSERT_TRUE(comm::write_key_file(key_path, key, true).ok());
  const int base = port_base() + 10;
  std::unique_ptr<Proc> d[2] = {daemon(base, key_path, tmp("d1.log")), daemon(base + 2, key_path, tmp("d2.log"))};
  ASSERT_TRUE(serving(base, key) && serving(base + 2, key)) << d[0]->log() << d[1]->log();
  const std::string cluster = tmp("cluster.toml");
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"" + local(base + 4) + "\"\nworkers = [\"" + local(base) + "\", \"" +
                                            local(base + 2) + "\"]\n")
                  .ok());
  const std::string env = "XDG_CACHE_HOME=" + tmp("cache");
  const int64_t terminal_bytes = testing::terminal_budget_that_needs_a_worker(
      "--model " + kData + "/bert-tiny --cluster " + cluster + " --key " + key_path, ",1GB,1GB", env);
  ASSERT_GT(terminal_bytes, 0);

  ::setenv("XDG_CACHE_HOME", tmp("cache").c_str(), 1);  // the server reads the same device profiles
  Server s({"--model", kData + "/bert-tiny", "--cluster", cluster, "--key", key_path, "--strategy", "auto", "--timeout", "5",
            "--memory-limit", std::to_string(terminal_bytes) + ",1GB,1GB"});
  ASSERT_TRUE(s.up()) << s.proc().log();
  const std::vector<int64_t> ids = {101, 11, 12, 13, 102};
  const core::Tensor want = reference_forward("bert-tiny", {ids, {}, {}}).pooler;
  auto r = s.post("/v1/embeddings", {{"input", ids}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << s.proc().log();
  expect_near(embedding_of(json::parse(r->body)["data"][0]["embedding"]), want);
  const json health = s.health();
  const int used = health["devices"][1]["state"] == "active" ? 0 : 1;
  ASSERT_EQ(health["devices"][1 + used]["state"], "active") << health.dump();  // a daemon takes part

  d[used]->signal(SIGSTOP);
  r = s.post("/v1/embeddings", {{"input", ids}});
  d[used]->signal(SIGCONT);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << s.proc().log();
  expect_near(embedding_of(json::parse(r->body)["data"][0]["embedding"]), want);
  EXPECT_NE(s.proc().log().find("failover #1"), std::string::npos) << s.proc().log();
  const json after = s.health();
  EXPECT_EQ(after["devices"][1 + used]["state"], "dropped") << after.dump();
  EXPECT_EQ(after["devices"][2 - used]["state"], "active") << after.dump();  // the plan moved to the other daemon
}

}  // namespace
}  // namespace tessera
