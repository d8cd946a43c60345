#include "cli/comm_cmd.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/group.h"
#include "comm/keys.h"
#include "core/io.h"
#include "core/limits.h"

extern char** environ;

namespace tessera::cli {

namespace {

using comm::Millis;
using namespace std::chrono_literals;

struct BenchArgs {
  int ranks = 2;
  std::string op = "allgather";
  int64_t bytes = 4 << 20;
  std::string link;
  int iters = 5;
  int warmup = 1;
  bool json = false;
  bool insecure = false;
  std::string key_file;
  int64_t timeout_ms = 120000;
};

struct RankArgs {
  BenchArgs bench;
  int rank = 0;
  std::string endpoints;
  std::string group_id;
  int listen_fd = -1;  // the socket comm-bench bound for this rank
};

[[noreturn]] void fail_with(const std::string& what, int code = 1) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  throw CLI::RuntimeError(code);
}

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// Bus bandwidth factor (as in nccl-tests): the share of the data each link
// must carry, so that figures are comparable across world sizes.
double bus_factor(const std::string& op, int k) {
  if (op == "allgather" || op == "reduce_scatter") return k > 0 ? static_cast<double>(k - 1) / k : 0;
  if (op == "allreduce") return k > 0 ? 2.0 * (k - 1) / k : 0;
  return 1.0;
}

// --bytes is the total buffer: allgather output, reduce_scatter input,
// allreduce tensor, the sendrecv message. Inputs are built once, outside the
// timed region.
core::Tensor make_input(const BenchArgs& a, int k, int r) {
  if (a.op == "allgather") return core::Tensor::zeros(core::DType::kU8, {comm::even_split(a.bytes, k)[r]});
  if (a.op == "reduce_scatter" || a.op == "allreduce") return core::Tensor::zeros_f32({a.bytes / 4});
  return core::Tensor::zeros(core::DType::kU8, {r == 0 ? a.bytes : 0});
}

core::Status run_op(comm::Group& g, const BenchArgs& a, const core::Tensor& input, Millis timeout) {
  const int k = g.size(), r = g.rank();
  core::Tensor out;
  if (a.op == "allgather") {
    return comm::allgatherv(g, comm::AllgatherOptions{timeout, 0}, input, comm::even_split(a.bytes, k), &out);
  }
  if (a.op == "reduce_scatter") return comm::reduce_scatter(g, comm::ReduceScatterOptions{timeout, 0}, input, &out);
  if (a.op == "allreduce") {
    out = input;
    return comm::allreduce(g, comm::AllreduceOptions{timeout, 0}, &out);
  }
  // sendrecv: rank 0 -> rank 1, acknowledged by an empty message.
  if (r == 0) {
    TESSERA_RETURN_IF_ERROR(g.send(1, 0, input, timeout));
    return g.recv(1, 1, timeout).status();
  }
  if (r == 1) {
    TESSERA_RETURN_IF_ERROR(g.recv(0, 0, timeout).status());
    return g.send(0, 1, input, timeout);
  }
  return core::ok_status();
}

// The child: join the group, run warm-up and timed iterations, print one
// JSON line with the timings and the rank's accounting.
void run_rank(const RankArgs& ra) {
  const BenchArgs& a = ra.bench;
  comm::GroupOptions o;
  o.rank = ra.rank;
  o.endpoints = split_csv(ra.endpoints);
  o.bind_fd = ra.listen_fd;
  o.group_id = ra.group_id;
  o.insecure = a.insecure;
  o.connect_timeout = Millis(30000);
  if (!a.insecure) {
    auto key = comm::read_key_file(a.key_file);
    if (!key.ok()) fail_with(key.status().to_string());
    o.key = *key;
  }
  if (!a.link.empty()) {
    auto links = comm::LinkMatrix::from_arg(a.link, static_cast<int>(o.endpoints.size()));
    if (!links.ok()) fail_with(links.status().to_string());
    o.links = *links;
  }
  auto created = comm::Group::create(o);
  if (!created.ok()) fail_with("rank " + std::to_string(ra.rank) + ": " + created.status().to_string());
  comm::Group& g = **created;
  const Millis timeout(a.timeout_ms);
  auto check = [&](const core::Status& st) {
    if (!st.ok()) fail_with("rank " + std::to_string(ra.rank) + ": " + st.to_string());
  };
  const core::Tensor input = make_input(a, g.size(), g.rank());
  for (int i = 0; i < a.warmup; ++i) check(run_op(g, a, input, timeout));
  g.reset_stats();
  std::vector<double> seconds;
  for (int i = 0; i < a.iters; ++i) {
    check(comm::barrier(g, comm::BarrierOptions{timeout, 1}));
    core::Timer t;
    check(run_op(g, a, input, timeout));
    seconds.push_back(t.ms() / 1000.0);
  }
  check(comm::barrier(g, comm::BarrierOptions{timeout, 1}));
  nlohmann::json out = {{"rank", ra.rank}, {"seconds", seconds}, {"stats", comm::stats_to_json(g.stats())}};
  std::cout << out.dump() << std::endl;
}

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string output;
};

// Removes the temporary key directory whatever happens.
struct TempKey {
  std::string dir, path;
  ~TempKey() {
    if (!path.empty()) ::unlink(path.c_str());
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
};

void check_bench_args(const BenchArgs& a) {
  if (a.ranks < 1 || a.ranks > core::kMaxDevices) fail_with("--ranks must be in 1.." + std::to_string(core::kMaxDevices));
  if (a.bytes < 0) fail_with("--bytes must be >= 0");
  if (a.iters < 1 || a.warmup < 0) fail_with("--iters must be >= 1 and --warmup >= 0");
  if (a.timeout_ms < 1 || a.timeout_ms > 86400000) fail_with("--timeout-ms must be between 1 and 86400000");
  if (a.op == "sendrecv" && a.ranks < 2) fail_with("sendrecv needs --ranks >= 2");
  if (!a.link.empty()) {
    auto links = comm::LinkMatrix::from_arg(a.link, a.ranks);
    if (!links.ok()) fail_with(links.status().to_string());
  }
}

// One process per rank (this binary's hidden comm-bench-rank command), its
// stdout on a pipe and its listening socket inherited.
std::vector<Child> spawn_ranks(const BenchArgs& a, comm::LocalListeners& listeners, const std::string& group_id) {
  std::string endpoints;
  for (const auto& e : listeners.endpoints()) endpoints += (endpoints.empty() ? "" : ",") + e;
  std::vector<Child> children(static_cast<size_t>(a.ranks));
  for (int r = 0; r < a.ranks; ++r) {
    std::vector<std::string> args = {"tessera", "comm-bench-rank", "--rank", std::to_string(r),
                                     "--endpoints", endpoints, "--group-id", group_id,
                                     "--op", a.op, "--bytes", std::to_string(a.bytes),
                                     "--iters", std::to_string(a.iters), "--warmup", std::to_string(a.warmup),
                                     "--timeout-ms", std::to_string(a.timeout_ms),
                                     "--listen-fd", std::to_string(listeners.fd(r))};
    if (!a.link.empty()) args.insert(args.end(), {"--link", a.link});
    if (a.insecure) args.push_back("--insecure");
    else args.insert(args.end(), {"--key", a.key_file});
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) fail_with("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    // The listening socket onto itself: the child keeps it across exec (glibc
    // clears FD_CLOEXEC then).
    if (posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO) != 0 ||
        posix_spawn_file_actions_adddup2(&fa, listeners.fd(r), listeners.fd(r)) != 0)
      fail_with("cannot set up a rank's descriptors");
    pid_t pid;
    const int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    listeners.close(r);  // the child has its copy
    if (rc != 0) {
      ::close(fds[0]);
      for (auto& c : children) {
        if (c.pid > 0) ::kill(c.pid, SIGKILL);
      }
      fail_with(std::string("cannot start a rank: ") + std::strerror(rc));
    }
    children[r].pid = pid;
    children[r].out_fd = fds[0];
  }

  return children;
}

// Every rank's output until EOF within a deadline, then the ranks reaped;
// false when one failed or ran out of time.
bool collect_ranks(const BenchArgs& a, std::vector<Child>& children) {
  const auto deadline = std::chrono::steady_clock::now() + Millis(a.timeout_ms) * (a.iters + a.warmup + 2);
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<Child*> owners;
    for (auto& c : children) {
      if (c.out_fd >= 0) {
        pfds.push_back({c.out_fd, POLLIN, 0});
        owners.push_back(&c);
      }
    }
    if (pfds.empty()) break;
    const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    if (::poll(pfds.data(), pfds.size(), static_cast<int>(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = ::read(pfds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        owners[i]->output.append(buf, static_cast<size_t>(n));
      } else {
        ::close(owners[i]->out_fd);
        owners[i]->out_fd = -1;
      }
    }
  }
  bool all_ok = true;
  for (auto& c : children) {
    if (c.out_fd >= 0) {  // timed out
      ::kill(c.pid, SIGKILL);
      ::close(c.out_fd);
    }
    int st = 0;
    ::waitpid(c.pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) all_ok = false;
  }

  return all_ok;
}

// The sweep's figures: each iteration's time is the slowest rank's.
void report_bench(const BenchArgs& a, const std::vector<Child>& children) {
  std::vector<nlohmann::json> results(static_cast<size_t>(a.ranks));
  std::vector<double> iter_s(static_cast<size_t>(a.iters), 0.0);
  for (int r = 0; r < a.ranks; ++r) {
    nlohmann::json j = nlohmann::json::parse(children[r].output, nullptr, false);
    if (j.is_discarded() || !j.contains("seconds")) fail_with("rank " + std::to_string(r) + " printed no result");
    for (int i = 0; i < a.iters; ++i) iter_s[i] = std::max(iter_s[i], j["seconds"][i].get<double>());
    results[r] = std::move(j);
  }
  double mean = 0;
  for (double s : iter_s) mean += s;
  mean /= a.iters;
  const double min_s = *std::min_element(iter_s.begin(), iter_s.end());
  const double max_s = *std::max_element(iter_s.begin(), iter_s.end());
  const double algbw = mean > 0 ? static_cast<double>(a.bytes) / mean : 0;
  const double busbw = algbw * bus_factor(a.op, a.ranks);

  if (a.json) {
    nlohmann::json out = {{"op", a.op}, {"ranks", a.ranks}, {"bytes", a.bytes}, {"link", a.link},
                          {"secure", !a.insecure}, {"iters", a.iters}, {"seconds_per_iter", iter_s},
                          {"mean_seconds", mean}, {"min_seconds", min_s}, {"max_seconds", max_s},
                          {"algbw_bytes_per_s", algbw}, {"busbw_bytes_per_s", busbw}};
    nlohmann::json per_rank = nlohmann::json::array();
    for (auto& r : results) per_rank.push_back(r["stats"]);
    out["per_rank"] = std::move(per_rank);
    std::cout << out.dump(2) << std::endl;
    return;
  }
  std::printf("comm-bench: %s, %d ranks, %lld bytes, link %s, %s, %d iterations (+%d warm-up)\n", a.op.c_str(),
              a.ranks, static_cast<long long>(a.bytes), a.link.empty() ? "unpaced" : a.link.c_str(),
              a.insecure ? "insecure" : "CURVE", a.iters, a.warmup);
  std::printf("  time/iter  %.3f ms (min %.3f, max %.3f)\n", mean * 1e3, min_s * 1e3, max_s * 1e3);
  std::printf("  algbw      %.1f MB/s (%.1f Mbit/s)   busbw %.1f MB/s\n", algbw / 1e6, algbw * 8 / 1e6, busbw / 1e6);
  std::printf("  %-5s %14s %14s %10s   (timed iterations, payload bytes)\n", "rank", "sent", "received", "blocked s");
  for (int r = 0; r < a.ranks; ++r) {
    const auto& t = results[r]["stats"]["total"];
    std::printf("  %-5d %14llu %14llu %10.3f\n", r, t["bytes_sent"].get<unsigned long long>(),
                t["bytes_received"].get<unsigned long long>(), results[r]["stats"]["blocked_seconds"].get<double>());
  }
}

void run_bench(BenchArgs a) {
  check_bench_args(a);
  auto listeners = comm::bind_local_listeners(a.ranks);
  if (!listeners.ok()) fail_with(listeners.status().to_string());

  TempKey temp;
  if (!a.insecure && a.key_file.empty()) {
    // An ephemeral cluster key, passed by file so it never shows in `ps`.
    char dir[] = "/tmp/tessera-bench-XXXXXX";
    if (::mkdtemp(dir) == nullptr) fail_with("cannot create a temporary directory");
    temp.dir = dir;
    temp.path = temp.dir + "/cluster.key";
    auto key = comm::generate_cluster_key();
    if (!key.ok()) fail_with(key.status().to_string());
    const core::Status st = comm::write_key_file(temp.path, *key);
    if (!st.ok()) fail_with(st.to_string());
    a.key_file = temp.path;
  }
  std::vector<Child> children = spawn_ranks(a, *listeners, "bench-" + std::to_string(::getpid()));
  if (!collect_ranks(a, children)) fail_with("a rank failed (see its message above)");
  report_bench(a, children);
}

void add_bench_options(CLI::App* cmd, BenchArgs* a) {
  cmd->add_option("--op", a->op, "allgather | reduce_scatter | allreduce | sendrecv")
      ->check(CLI::IsMember({"allgather", "reduce_scatter", "allreduce", "sendrecv"}));
  cmd->add_option("--bytes", a->bytes, "Total buffer bytes (allgather output, reduce_scatter input, "
                                       "allreduce tensor, sendrecv message)");
  cmd->add_option("--link", a->link, "Emulated links: '100mbit[,2ms]' or a JSON matrix file");
  cmd->add_option("--iters", a->iters, "Timed iterations");
  cmd->add_option("--warmup", a->warmup, "Untimed iterations first");
  cmd->add_flag("--insecure", a->insecure, "No CURVE encryption/authentication");
  cmd->add_option("--key", a->key_file, "Cluster key file (default: an ephemeral one)");
  cmd->add_option("--timeout-ms", a->timeout_ms, "Per-operation timeout (1..86400000)");
}

}  // namespace

void add_comm_commands(CLI::App& app) {
  auto keygen_out = std::make_shared<std::string>();
  auto keygen_force = std::make_shared<bool>(false);
  CLI::App* keygen = app.add_subcommand("keygen", "Write a new cluster key file (CURVE keypair shared by the cluster)");
  keygen->add_option("--out", *keygen_out, "Key file to create (mode 0600)")->required();
  keygen->add_flag("--force", *keygen_force, "Overwrite an existing file");
  keygen->callback([keygen_out, keygen_force] {
    auto key = comm::generate_cluster_key();
    if (!key.ok()) fail_with(key.status().to_string());
    const core::Status st = comm::write_key_file(*keygen_out, *key, *keygen_force);
    if (!st.ok()) fail_with(st.to_string());
    std::printf("wrote cluster key %s (public %s)\n", keygen_out->c_str(), key->public_z85.c_str());
  });

  auto bench = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("comm-bench", "Measure a collective across K local processes");
  cmd->add_option("--ranks", bench->ranks, "Number of ranks (processes)");
  add_bench_options(cmd, bench.get());
  cmd->add_flag("--json", bench->json, "Print JSON");
  cmd->callback([bench] { run_bench(*bench); });

  auto rank = std::make_shared<RankArgs>();
  CLI::App* child = app.add_subcommand("comm-bench-rank", "");
  child->group("");  // hidden: started by comm-bench
  child->add_option("--rank", rank->rank)->required();
  child->add_option("--endpoints", rank->endpoints)->required();
  child->add_option("--group-id", rank->group_id)->required();
  child->add_option("--listen-fd", rank->listen_fd, "inherited socket bound to this rank's endpoint");
  add_bench_options(child, &rank->bench);
  child->callback([rank] { run_rank(*rank); });
}

}  // namespace tessera::cli
