// `tessera run --devices K` with real worker processes on loopback: every
// strategy equals the single device, --stats accounts the traffic, a killed
// worker ends the run with a clear error, a wrong key is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/group.h"
#include "comm/keys.h"
#include "core/io.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "comm/control.h"
#include "runtime/job.h"

#include "cli_util.h"

namespace tessera {
namespace {

using testing::CmdResult;
using testing::kBin;
using testing::kData;
using testing::run;
using testing::tmp;

const auto max_diff = testing::dump_max_diff;

// Two `tessera worker` daemons on 127.0.0.1 (control ports base and base+2)
// that serve one job each, and the cluster file naming them (the terminal on
// base+4). Empty when a fork fails.
std::vector<pid_t> one_job_daemons(int base, const std::string& key, const std::string& cluster) {
  const std::vector<std::string> control = {"tcp://127.0.0.1:" + std::to_string(base),
                                            "tcp://127.0.0.1:" + std::to_string(base + 2)};
  const std::string terminal = "tcp://127.0.0.1:" + std::to_string(base + 4);
  if (!core::write_file(cluster, "terminal = \"" + terminal + "\"\nworkers = [\"" + control[0] + "\", \"" + control[1] +
                                     "\"]\n")
           .ok())
    return {};
  std::vector<pid_t> daemons;
  for (const auto& ep : control) {
    const pid_t pid = ::fork();
    if (pid < 0) return {};
    if (pid == 0) {
      ::execl(kBin.c_str(), "tessera", "worker", "--listen", ep.c_str(), "--key", key.c_str(), "--models", kData.c_str(),
              "--jobs", "1", nullptr);
      ::_exit(127);
    }
    daemons.push_back(pid);
  }
  return daemons;
}

// Descendants of `root` whose command line contains `needle`: the test must
// kill its own worker, never one of a test running beside it.
std::vector<pid_t> descendants_whose_cmdline_has(pid_t root, const std::string& needle) {
  std::map<pid_t, pid_t> parent;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid) parent[std::stoi(name)] = ppid;
  }
  std::vector<pid_t> found;
  for (const auto& [child, unused] : parent) {
    bool below = false;
    for (pid_t p = child; p > 1 && !below; p = parent.count(p) ? parent[p] : 0) below = parent.count(p) && parent[p] == root;
    if (!below) continue;
    std::ifstream cmd("/proc/" + std::to_string(child) + "/cmdline");
    std::string text((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (text.find("worker-job") != std::string::npos && text.find(needle) != std::string::npos) found.push_back(child);
  }
  return found;
}

struct Input {
  const char* model;
  std::string args;
};

TEST(DistributedTest, EveryStrategyEqualsSingleDeviceWithProcesses) {
  auto vit = model::SafeTensorsFile::open(kData + "/vit-tiny/cases.safetensors").value();
  const std::string pixels = tmp("pixels.safetensors");
  ASSERT_TRUE(model::write_safetensors(pixels, {{"pixel_values", vit.get("c0.pixel_values").value()}}).ok());
  const Input inputs[] = {{"bert-tiny", "--ids 3,14,15,92,65,35,89 --token-types 0,0,0,1,1,1,1"},
                          {"gpt2-tiny", "--ids 5,6,7,8,9,10,11,12,13,14,15"},
                          {"gpt2-tiny", "--ids 42"},  // N < K
                          {"vit-tiny", "--pixels " + pixels}};
  for (const auto& in : inputs) {
    const std::string dir = kData + "/" + in.model;
    const std::string ref = tmp("ref.safetensors");
    ASSERT_EQ(run("run --model " + dir + " " + in.args + " --dump " + ref).code, 0);
    for (const char* strategy : {"tp", "sp", "voltage", "pipeline", "galaxy"})
      for (const std::string& devices : {std::string("2 --partition 3,1"), std::string("3")}) {
        const std::string got = tmp("got.safetensors");
        auto r = run("run --model " + dir + " " + in.args + " --strategy " + strategy + " --devices " + devices +
                     " --dump " + got);
        ASSERT_EQ(r.code, 0) << strategy << " " << devices << ": " << r.err;
        EXPECT_LT(max_diff(ref, got, "hidden.2"), 1e-4f) << in.model << " " << strategy << " " << devices;
        EXPECT_LT(max_diff(ref, got, "logits"), 1e-4f) << in.model << " " << strategy << " " << devices;
      }
    // Galaxy: uneven heads (A) and FFN columns (B), ring tiles on and off.
    for (const char* extra : {"--partition 1,2 --ffn-partition 3,1", "--ffn-partition 1,3 --no-overlap"}) {
      const std::string got = tmp("got.safetensors");
      auto r = run("run --model " + dir + " " + in.args + " --strategy galaxy --devices 2 " + extra + " --dump " + got);
      ASSERT_EQ(r.code, 0) << extra << ": " << r.err;
      EXPECT_LT(max_diff(ref, got, "hidden.2"), 1e-4f) << in.model << " galaxy " << extra;
      EXPECT_LT(max_diff(ref, got, "logits"), 1e-4f) << in.model << " galaxy " << extra;
    }
  }
}

// The decoder families as processes: Qwen3 with one K/V head for 4 query
// heads (replicated over 3 devices), Llama 3 RoPE scaling, and post-LN OPT
// with projected embeddings; every exact strategy but bp on 3 devices
// equals the PyTorch reference, and tp, galaxy, pipeline and the pairs
// (Voltage's or SP's prefill, the terminal's, a pipeline's or TP's decode;
// Galaxy's, the terminal's) generate its greedy
// continuation.
TEST(DistributedTest, DecoderFamiliesEqualTheReferenceWithProcesses) {
  for (const char* fixture : {"qwen3-mqa-tiny", "llama3rope-tiny", "opt-postln-tiny"}) {
    const std::string dir = kData + "/" + fixture;
    auto cases = model::SafeTensorsFile::open(dir + "/cases.safetensors").value();
    const auto layers = model::load_config(dir).value().layers;
    auto ids_arg = [&](const std::string& name) {
      const core::Tensor t = cases.get(name).value();
      std::string s;
      for (int64_t i = 0; i < t.numel(); ++i) s += (i ? "," : "") + std::to_string(t.i64()[i]);
      return s;
    };
    for (const char* strategy : {"tp", "sp", "voltage", "pipeline", "galaxy"}) {
      const std::string got = tmp("got.safetensors");
      auto r = run("run --model " + dir + " --ids " + ids_arg("s37.input_ids") + " --strategy " + strategy +
                   " --devices 3 --dump " + got);
      ASSERT_EQ(r.code, 0) << fixture << " " << strategy << ": " << r.err;
      auto out = model::SafeTensorsFile::open(got).value();
      for (const std::string& name : {"hidden." + std::to_string(layers), std::string("logits")}) {
        const core::Tensor a = out.get(name).value(), b = cases.get("s37." + name).value();
        ASSERT_EQ(a.numel(), b.numel()) << name;
        float m = 0;
        for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
        EXPECT_LT(m, 1e-4f) << fixture << " " << strategy << " " << name;
      }
    }
    const std::string want = ids_arg("generate.output");
    const std::string prompt = ids_arg("generate.prompt");
    // The pairs too: Voltage's or SP's prefill, the terminal's, a pipeline's or TP's decode.
    for (const char* strategy : {"tp", "galaxy", "pipeline", "voltage --decode-strategy single", "sp --decode-strategy single",
                                 "voltage --decode-strategy pipeline", "voltage --decode-strategy tp",
                                 "sp --decode-strategy tp", "galaxy --decode-strategy single"}) {
      const auto r = run("generate --model " + dir + " --ids " + prompt + " --max-new-tokens 8 --greedy --strategy " +
                         strategy + " --devices 3");
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(prompt + "," + r.out, want + "\n") << fixture << " " << strategy;
    }
    // F16 caches in worker processes (the protocol carries the type) give the
    // single device's F16 tokens; a context too short for the prompt is refused.
    const auto one = run("generate --model " + dir + " --ids " + prompt + " --max-new-tokens 8 --greedy --kv-type f16");
    ASSERT_EQ(one.code, 0) << one.err;
    const auto tp = run("generate --model " + dir + " --ids " + prompt +
                        " --max-new-tokens 8 --greedy --kv-type f16 --strategy tp --devices 3");
    ASSERT_EQ(tp.code, 0) << tp.err;
    EXPECT_EQ(tp.out, one.out) << fixture;
    const auto short_ctx = run("generate --model " + dir + " --ids " + prompt + " --max-new-tokens 8 --ctx-size 2");
    EXPECT_NE(short_ctx.code, 0);
    EXPECT_NE(short_ctx.err.find("--ctx-size"), std::string::npos) << short_ctx.err;
  }
}

// Per layer and device: TP 4(K-1)NF/K elements, SP 2(K-1)NF/K, Voltage
// (K-1)NF/K (its last layer is a gather to the terminal).
TEST(DistributedTest, StatsAccountTheTrafficOfEachStrategy) {
  const int64_t n = 12, F = 64, L = 2, K = 2;
  std::string ids;
  for (int i = 0; i < n; ++i) ids += (i ? "," : "") + std::to_string(i + 3);
  auto stats = [&](const char* strategy) {
    auto r = run("run --model " + kData + "/bert-tiny --ids " + ids + " --strategy " + strategy + " --devices 2 --stats");
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto tp = stats("tp"), sp = stats("sp"), vo = stats("voltage"), ga = stats("galaxy");
  for (int rank = 0; rank < K; ++rank) {
    EXPECT_EQ(tp["ranks"][rank]["elements_sent_by_kind"]["allreduce"], L * 4 * (K - 1) * n * F / K);
    EXPECT_EQ(tp["ranks"][rank]["bytes_sent_by_kind"]["allreduce"], 4 * L * 4 * (K - 1) * n * F / K);
    EXPECT_EQ(sp["ranks"][rank]["elements_sent_by_kind"]["allgather"], L * 2 * (K - 1) * n * F / K);
    EXPECT_EQ(sp["ranks"][rank]["bytes_sent_by_kind"]["allgather"], 4 * L * 2 * (K - 1) * n * F / K);
    EXPECT_EQ(vo["ranks"][rank]["elements_sent_by_kind"]["allgather"], (L - 1) * (K - 1) * n * F / K);
    EXPECT_GT(vo["ranks"][rank]["weight_bytes"].get<int64_t>(), 0);
    // Galaxy: TP's volume, as two ReduceScatters and two AllGathers per layer.
    EXPECT_EQ(ga["ranks"][rank]["elements_sent_by_kind"]["reduce_scatter"], L * 2 * (K - 1) * n * F / K);
    EXPECT_EQ(ga["ranks"][rank]["elements_sent_by_kind"]["allgather"], L * 2 * (K - 1) * n * F / K);
  }
  EXPECT_GT(vo["latency_ms"].get<double>(), 0.0);
  // TP shards: the worker holds about half the layer weights of the terminal.
  EXPECT_LT(tp["ranks"][1]["weight_bytes"].get<int64_t>(), tp["ranks"][0]["weight_bytes"].get<int64_t>());
  EXPECT_EQ(ga["ranks"][1]["weight_bytes"], tp["ranks"][1]["weight_bytes"]);
}

TEST(DistributedTest, KilledWorkerEndsTheRunWithAnErrorWithinTheTimeout) {
  const std::string out = tmp("kill-out.txt"), err = tmp("kill-err.txt");
  std::string ids;
  for (int i = 0; i < 100; ++i) ids += (i ? "," : "") + std::to_string(i + 3);
  // A slow link keeps the run going for seconds; the worker dies meanwhile.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string cmd = kBin + " run --model " + kData + "/gpt2-tiny --ids " + ids +
                            " --strategy voltage --devices 3 --link 200kbit --timeout 10 >" + out + " 2>" + err;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    ::_exit(127);
  }
  // Find a worker (grandchild: sh -> tessera -> worker-job) and kill it.
  bool killed = false;
  for (int i = 0; i < 100 && !killed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (const pid_t worker : descendants_whose_cmdline_has(pid, "\"rank\":2"))
      killed = ::kill(worker, SIGKILL) == 0 || killed;
  }
  ASSERT_TRUE(killed);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string e = core::read_file(err).value();
  EXPECT_EQ(e.rfind("error: ", 0), 0u) << e;
}

TEST(DistributedTest, WorkerWithWrongKeyIsRefused) {
  auto endpoints = comm::pick_local_endpoints(2).value();
  const std::string key_a = tmp("a.key"), key_b = tmp("b.key");
  ASSERT_TRUE(comm::write_key_file(key_a, comm::generate_cluster_key().value(), true).ok());
  ASSERT_TRUE(comm::write_key_file(key_b, comm::generate_cluster_key().value(), true).ok());
  runtime::JobSpec job;
  job.rank = 1;
  job.endpoints = endpoints;
  job.model_dir = kData + "/bert-tiny";
  job.plan.strategy = "voltage";
  job.plan.world = 2;
  job.timeout_ms = 3000;
  // The worker reads key B from an inherited descriptor, as local workers do.
  const auto b = comm::read_key_file(key_b).value();
  const std::string key_text = tmp("b.keytext");
  {
    std::ofstream f(key_text);
    f << b.public_z85 << '\n' << b.secret_z85 << '\n';
  }
  const std::string err = tmp("worker-err.txt");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string cmd =
        kBin + " worker-job --job '" + job.to_json().dump() + "' --key-fd 3 3<" + key_text + " 2>" + err;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    ::_exit(127);
  }
  comm::GroupOptions o;
  o.rank = 0;
  o.endpoints = endpoints;
  o.key = comm::read_key_file(key_a).value();
  o.connect_timeout = std::chrono::milliseconds(3000);
  auto group = comm::Group::create(o);
  EXPECT_FALSE(group.ok());
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_EQ(core::read_file(err).value().rfind("error: ", 0), 0u);
}

// Two worker daemons, a cluster file, a terminal with the key: same result
// as one device; a terminal with another key gets a clear error.
TEST(DistributedTest, WorkerDaemonsServeTerminalsHoldingTheClusterKey) {
  const std::string key = tmp("cluster.key"), other = tmp("other.key"), cluster = tmp("cluster.toml");
  ASSERT_TRUE(comm::write_key_file(key, comm::generate_cluster_key().value(), true).ok());
  ASSERT_TRUE(comm::write_key_file(other, comm::generate_cluster_key().value(), true).ok());
  // Control ports p, data ports p + 1; a per-process base keeps parallel runs
  // apart, below both the kernel's ephemeral ports and pick_local_endpoints'.
  const int base = testing::free_port_window(7000, 10, 900, static_cast<int>(::getpid() % 900), 10);
  const std::vector<pid_t> daemons = one_job_daemons(base, key, cluster);
  ASSERT_EQ(daemons.size(), 2u);
  const std::string dir = kData + "/gpt2-tiny", ids = "--ids 9,8,7,6,5,4,3";
  const std::string ref = tmp("ref.safetensors"), got = tmp("got.safetensors");
  ASSERT_EQ(run("run --model " + dir + " " + ids + " --dump " + ref).code, 0);
  auto bad = run("run --model " + dir + " " + ids + " --strategy voltage --cluster " + cluster + " --key " + other + " --timeout 2");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("refused our key"), std::string::npos) << bad.err;
  auto r = run("run --model " + dir + " " + ids + " --strategy voltage --cluster " + cluster + " --key " + key + " --dump " + got);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_LT(max_diff(ref, got, "hidden.2"), 1e-4f);
  for (pid_t pid : daemons) {  // each served its one job and left
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
}

// `tessera generate` across devices prints the fixture's ids (Hugging Face's
// greedy output), with forked workers and with worker daemons of a cluster.
TEST(DistributedTest, GenerateAcrossDevicesPrintsTheSingleDeviceIds) {
  const std::string dir = kData + "/gpt2-tiny", args = " --ids 218,319,207,49,295 --max-new-tokens 8 --greedy";
  const std::string want = "295,295,295,295,237,237,237,237\n";  // generate.output after its prompt
  const auto single = run("generate --model " + dir + args);
  ASSERT_EQ(single.code, 0) << single.err;
  EXPECT_EQ(single.out, want);
  for (const std::string s : {"tp", "galaxy", "pipeline"}) {
    const auto r = run("generate --model " + dir + args + " --strategy " + s + " --devices 2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, want) << s;
  }
  const auto refused = run("generate --model " + dir + args + " --strategy voltage --devices 2");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("cannot generate across devices"), std::string::npos) << refused.err;
  // A pair: Voltage (or SP) prefills across the processes, the terminal (or
  // TP on every process, its shards loaded beside the whole layers) decodes
  // from the K/V it got.
  for (int k = 2; k <= 4; ++k)
    for (const std::string prefill : {"voltage", "sp"})
      for (const std::string decode : {"single", "tp"}) {
        const auto pair = run("generate --model " + dir + args + " --prefill-strategy " + prefill +
                              " --decode-strategy " + decode + " --devices " + std::to_string(k));
        ASSERT_EQ(pair.code, 0) << pair.err;
        EXPECT_EQ(pair.out, want) << prefill << "+" << decode << " " << k;
      }
  // The decode on the first devices only (the others idle through the steps).
  for (const std::string spec : {"--devices 3 --decode-strategy tp --decode-devices 2",
                                 "--devices 4 --decode-strategy tp --decode-devices 3",
                                 "--devices 4 --decode-strategy pipeline --decode-devices 2"}) {
    const auto pair = run("generate --model " + dir + args + " --prefill-strategy voltage " + spec);
    ASSERT_EQ(pair.code, 0) << pair.err;
    EXPECT_EQ(pair.out, want) << spec;
  }
  const auto no_pair = run("generate --model " + dir + args + " --strategy voltage --devices 3 --decode-devices 2");
  EXPECT_NE(no_pair.code, 0);
  EXPECT_NE(no_pair.err.find("--decode-devices sets a pair's decode"), std::string::npos) << no_pair.err;
  {  // the trained copy model (32 tokens and the separator): its answer is mostly the prompt again, not degenerate
    std::string ids;
    for (int i = 0; i < 32; ++i) ids += std::to_string((i * 37 + 5) % 60) + ",";
    const std::string copy = "generate --model " + kData + "/gpt2-copy --ids " + ids + "61 --max-new-tokens 32 --greedy";
    const auto alone = run(copy);
    ASSERT_EQ(alone.code, 0) << alone.err;
    for (const std::string decode : {"single", "tp"}) {
      const auto pair = run(copy + " --strategy voltage --decode-strategy " + decode + " --devices 3 --partition 1,2,1");
      ASSERT_EQ(pair.code, 0) << pair.err;
      EXPECT_EQ(pair.out, alone.out) << decode;
    }
  }

  const std::string key = tmp("cluster.key"), cluster = tmp("cluster.toml");
  ASSERT_TRUE(comm::write_key_file(key, comm::generate_cluster_key().value(), true).ok());
  const int base = testing::free_port_window(7000, 10, 900, static_cast<int>((::getpid() + 450) % 900), 10);
  const std::vector<pid_t> daemons = one_job_daemons(base, key, cluster);
  ASSERT_EQ(daemons.size(), 2u);
  const auto r = run("generate --model " + dir + args + " --strategy tp --cluster " + cluster + " --key " + key);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, want);
  for (pid_t pid : daemons) {
    int status = 0;
    if (r.code != 0) ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
}

// A key holder that takes a daemon's job and then says nothing loses it
// within a few heartbeat intervals; the daemon then serves a real terminal.
TEST(DistributedTest, SilentTerminalLosesItsJobAndTheDaemonServesTheNext) {
  const std::string key = tmp("silent.key"), cluster = tmp("silent.toml");
  ASSERT_TRUE(comm::write_key_file(key, comm::generate_cluster_key().value(), true).ok());
  const int base = testing::free_port_window(7000, 10, 900, static_cast<int>((::getpid() + 450) % 900), 10) + 6;
  const std::string control = "tcp://127.0.0.1:" + std::to_string(base);
  const std::string data = "tcp://127.0.0.1:" + std::to_string(base + 1);
  const std::string terminal = "tcp://127.0.0.1:" + std::to_string(base + 2);
  ASSERT_TRUE(core::write_file(cluster, "terminal = \"" + terminal + "\"\nworkers = [\"" + control + "\"]\n").ok());
  const std::string daemon_err = tmp("silent-daemon-err.txt");  // before the fork: the name holds our pid
  const pid_t daemon = ::fork();
  ASSERT_GE(daemon, 0);
  if (daemon == 0) {
    if (std::freopen(daemon_err.c_str(), "w", stderr) == nullptr) ::_exit(126);
    ::execl(kBin.c_str(), "tessera", "--log-level", "info", "worker", "--listen", control.c_str(), "--key", key.c_str(),
            "--models", kData.c_str(), nullptr);
    ::_exit(127);
  }
  struct Stop {  // the daemon serves until stopped, whatever this test asserts
    pid_t pid;
    ~Stop() {
      ::kill(pid, SIGTERM);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  } stop{daemon};
  const auto k = comm::read_key_file(key).value();
  // The silent terminal: a valid job, a group that forms, then nothing.
  runtime::JobSpec job;
  job.rank = 1;
  job.endpoints = {"tcp://127.0.0.1:" + std::to_string(base + 3), data};  // the real terminal binds base + 2
  job.model_dir = "gpt2-tiny";
  job.plan.strategy = "voltage";
  job.plan.world = 2;
  job.timeout_ms = 24ll * 3600 * 1000;  // the longest a job may ask for
  std::string answer;
  for (int attempt = 0; attempt < 50; ++attempt) {  // until the daemon listens
    auto a = comm::control_request(control, k, job.to_json().dump(), std::chrono::milliseconds(2000));
    if (a.ok()) {
      answer = *a;
      break;
    }
  }
  ASSERT_NE(answer.find("\"ok\":true"), std::string::npos) << answer;
  comm::GroupOptions o;
  o.rank = 0;
  o.endpoints = job.endpoints;
  o.group_id = job.group_id;
  o.key = k;
  o.connect_timeout = std::chrono::milliseconds(20000);
  auto silent = comm::Group::create(o);
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  // The daemon drops the silent job after 5 missed pings (5 s) and is free
  // again: a real run, started while the silent group is still open, works.
  const std::string dir = kData + "/gpt2-tiny", ids = "--ids 9,8,7,6,5,4,3";
  const std::string ref = tmp("silent-ref.safetensors"), got = tmp("silent-got.safetensors");
  ASSERT_EQ(run("run --model " + dir + " " + ids + " --dump " + ref).code, 0);
  CmdResult r;
  for (int attempt = 0; attempt < 10; ++attempt) {  // busy with the silent job until it is dropped
    r = run("run --model " + dir + " " + ids + " --strategy voltage --cluster " + cluster + " --key " + key +
            " --timeout 3 --dump " + got);
    if (r.code == 0) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  ASSERT_EQ(r.code, 0) << r.err << "daemon: " << core::read_file(daemon_err).value_or("");
  EXPECT_LT(max_diff(ref, got, "hidden.2"), 1e-4f);
  // The daemon says why it dropped the silent job (its log is written as it goes).
  std::string log;
  for (int wait = 0; wait < 100 && log.find("missed its heartbeats") == std::string::npos; ++wait) {
    log = core::read_file(daemon_err).value_or("");
    if (log.find("missed its heartbeats") == std::string::npos) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(log.find("missed its heartbeats"), std::string::npos) << log;
}

}  // namespace
}  // namespace tessera
