#include "runtime/cluster_profile.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "comm/control.h"
#include "comm/keys.h"
#include "comm/link.h"
#include "core/io.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/logging.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"
#include "runtime/daemon.h"
#include "runtime/job.h"
#include "runtime/protocol.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using nlohmann::json;
using planner::DeviceProfile;
using planner::LinkProfile;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kProbeTag = 0;     // .. kProbeTag + the probes of a pass: one pair's messages
constexpr int kRowTag = 100;     // a rank's measured row, to rank 0
constexpr int kAckTag = 101;     // rank 0: every row is in
constexpr int64_t kBulkFloats = 256 * 1024;  // 1 MiB
// The largest believable link: 10 Tbit/s. A row beyond it is a peer's error.
constexpr double kMaxMbps = 1e7;

// One pass over a pair: `small` round trips of a 4-byte message (the first a
// warm-up), then `bulk` of 1 MiB (the first `bulk_warmups` warm-ups).
struct Probes {
  int small, bulk_warmups, bulk;
};
// The links are measured in two passes over every pair, the first a warm-up:
// on a fresh group the first pair read worse than the same pair a pass later
// (0.54-0.97 ms against 0.45-0.60, 1 Gbit/s at 0.2 ms, two local ranks on 2
// cores), and the first two 1 MiB transfers of a connection took 21-32 ms
// where the rest took 11-12. The latency is the median of the small round
// trips: with 7 a link read 0.45 and 1.34 ms a minute apart, and `run
// --strategy auto` chose differently from run to run. The bandwidth is from
// the fastest bulk one: one direction of a group sometimes stayed at 15 ms a
// transfer throughout, so a median of three read 370-610 Mbit/s on the link
// whose other direction read 780.
constexpr Probes kWarmPass{4, 2, 0};
constexpr Probes kMeasurePass{21, 1, 4};

// Latency and bandwidth of pair (rank, peer) as the sender `a` sees them
// (zero from a pass without bulk probes).
Result<LinkProfile> measure_pair(comm::Group& g, int a, int peer, comm::Millis timeout, Probes n) {
  std::vector<double> rtt, bulk_s;
  const bool sender = g.rank() == a;
  for (int i = 0; i < n.small + n.bulk_warmups + n.bulk; ++i) {
    const bool bulk = i >= n.small;
    const int tag = kProbeTag + i;
    const auto t0 = Clock::now();
    if (sender) {
      TESSERA_RETURN_IF_ERROR(g.isend(peer, tag, core::Tensor::zeros_f32({bulk ? kBulkFloats : 1})).wait(timeout));
      TESSERA_RETURN_IF_ERROR(g.irecv(peer, tag).wait(timeout).status());
    } else {
      TESSERA_RETURN_IF_ERROR(g.irecv(peer, tag).wait(timeout).status());
      TESSERA_RETURN_IF_ERROR(g.isend(peer, tag, core::Tensor::zeros_f32({1})).wait(timeout));
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i == 0 || (bulk && i < n.small + n.bulk_warmups)) continue;  // warm-ups
    (bulk ? bulk_s : rtt).push_back(s);
  }
  LinkProfile l;
  if (rtt.empty() || bulk_s.empty()) return l;
  const double small = core::median(rtt);
  l.latency_ms = 1e3 * small / 2;
  // The fastest bulk transfer less the fastest small round trip: both
  // minima, so the difference is never below the paced time of 1 MiB (a
  // median round trip inflated by noise would make the link read faster
  // than it is).
  const double fastest = *std::min_element(bulk_s.begin(), bulk_s.end());
  const double quickest = *std::min_element(rtt.begin(), rtt.end());
  l.bandwidth_mbps = std::min(kMaxMbps, static_cast<double>(kBulkFloats * 4 * 8) / std::max(fastest - quickest, 1e-6) / 1e6);
  return l;
}

Result<std::vector<LinkProfile>> row_from_tensor(const core::Tensor& t, int K, int from) {
  if (t.dtype() != core::DType::kF32 || t.numel() != 2 * static_cast<int64_t>(K))
    return core::invalid_argument("rank " + std::to_string(from) + " sent a link row of the wrong shape");
  std::vector<LinkProfile> row(static_cast<size_t>(K));
  for (int b = 0; b < K; ++b) {
    const double lat = t.f32()[2 * b], bw = t.f32()[2 * b + 1];
    if (!std::isfinite(lat) || !std::isfinite(bw) || lat < 0 || bw < 0 || lat > 1e6 || bw > kMaxMbps)
      return core::invalid_argument("rank " + std::to_string(from) + " sent a link figure out of range");
    if (b != from) row[static_cast<size_t>(b)] = {lat, bw};
  }
  return row;
}

double process_cpu_s() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Rank 0's result of body(group) run by K ranks of a group over loopback,
// one thread each, CURVE with a throwaway key unless !secure; the first
// rank's error if any failed.
template <typename T>
Result<T> on_local_group(int K, bool secure, const std::string& group_id, const comm::LinkMatrix& links,
                         const std::function<Result<T>(comm::Group&)>& body) {
  TESSERA_ASSIGN_OR_RETURN(comm::LocalListeners listeners, comm::bind_local_listeners(K));
  std::optional<comm::ClusterKey> key;
  if (secure) {
    TESSERA_ASSIGN_OR_RETURN(key, comm::generate_cluster_key());
  }
  std::vector<Result<T>> results(static_cast<size_t>(K), core::internal_error("not run"));
  auto rank_main = [&](int rank) -> Result<T> {
    comm::GroupOptions o;
    o.rank = rank;
    o.endpoints = listeners.endpoints();
    o.bind_fd = listeners.release(rank);  // distinct elements: safe across the ranks' threads
    o.group_id = group_id;
    o.insecure = !secure;
    o.key = key;
    o.links = links;
    TESSERA_ASSIGN_OR_RETURN(auto g, comm::Group::create(o));
    return body(*g);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < K; ++r) threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = rank_main(r); });
  for (auto& t : threads) t.join();
  for (const auto& r : results)
    if (!r.ok()) return r.status();
  return std::move(results[0]);
}

// This process's CPU seconds (all its threads, the transport's included)
// to move kCryptoReps tensors of kBulkFloats from one rank to another over
// loopback, with CURVE or without.
constexpr int kCryptoReps = 8;
Result<double> transfer_cpu_s(bool secure) {
  const comm::Millis wait(60000);
  return on_local_group<double>(2, secure, "tessera-crypto", {}, [&](comm::Group& g) -> Result<double> {
    // Both connected and idle before the clock starts; the ack after the
    // last tensor stops it.
    if (g.rank() == 1) {
      TESSERA_RETURN_IF_ERROR(g.send(0, kProbeTag, core::Tensor::zeros_f32({1}), wait));
      for (int i = 0; i < kCryptoReps; ++i) TESSERA_RETURN_IF_ERROR(g.recv(0, kProbeTag + 1, wait).status());
      TESSERA_RETURN_IF_ERROR(g.send(0, kAckTag, core::Tensor::zeros_f32({1}), wait));
      return 0.0;
    }
    const core::Tensor bulk = core::Tensor::zeros_f32({kBulkFloats});
    TESSERA_RETURN_IF_ERROR(g.recv(1, kProbeTag, wait).status());
    const double t0 = process_cpu_s();
    for (int i = 0; i < kCryptoReps; ++i) TESSERA_RETURN_IF_ERROR(g.send(1, kProbeTag + 1, bulk, wait));
    TESSERA_RETURN_IF_ERROR(g.recv(1, kAckTag, wait).status());
    return process_cpu_s() - t0;
  });
}

// A device's crypto_gbps. The transport encrypts on the device's cores; it
// takes time from an overlapped exchange's work only where that work holds
// every core this process may use. With one to spare, it runs there: 0.
double crypto_gbps_if_shared(bool encrypted, int threads) {
  return !encrypted || threads < core::usable_cpus() ? 0.0 : crypto_gbps_or_zero();
}

Result<json> ask(const std::string& endpoint, const ClusterProfileOptions& o, const ProfileJob& job) {
  TESSERA_ASSIGN_OR_RETURN(const std::string answer, comm::control_request(endpoint, o.key, to_text(job), o.timeout));
  return daemon_answer(endpoint, answer, "profile");
}

}  // namespace

Result<DeviceProfile> device_profile(const model::ModelConfig& c, int64_t rows, int threads, bool reprofile) {
  if (threads < 1 || threads > 256) return core::invalid_argument("profile: threads must be in [1, 256]");
  const std::string path = planner::device_cache_path(c, rows, threads);
  if (!reprofile && core::file_exists(path)) {
    auto text = core::read_file(path);
    if (text.ok()) {
      auto j = core::parse_json(text.value(), path);
      if (j.ok()) {
        auto d = DeviceProfile::from_json(j.value());
        if (d.ok()) {
          d.value().memory_bytes = static_cast<int64_t>(core::available_memory_bytes());  // memory changes; speed does not
          return d;
        }
      }
    }
  }
  kernels::set_blas_threads(threads);
  core::ThreadPool pool(threads);
  TESSERA_ASSIGN_OR_RETURN(DeviceProfile d, planner::measure_device(c, rows, 8, &pool));
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  // A cache: failing to write it costs only time. Replaced whole, since other
  // processes (the workers of a local cluster, concurrent runs) read it.
  if (!ec) (void)core::replace_file(path, d.to_json().dump(1) + "\n");
  return d;
}

Result<LinkProfiles> measure_links(comm::Group& g, comm::Millis timeout) {
  const int K = g.size(), rank = g.rank();
  std::vector<LinkProfile> row(static_cast<size_t>(K));
  // Every rank walks the same pair list and takes part in its own pairs.
  for (const Probes& pass : {kWarmPass, kMeasurePass})
    for (int a = 0; a < K; ++a)
      for (int b = 0; b < K; ++b) {
        if (a == b || (rank != a && rank != b)) continue;
        TESSERA_ASSIGN_OR_RETURN(const LinkProfile l, measure_pair(g, a, rank == a ? b : a, timeout, pass));
        if (rank == a) row[static_cast<size_t>(b)] = l;
      }
  if (rank != 0) {
    core::Tensor t = core::Tensor::zeros_f32({2 * static_cast<int64_t>(K)});
    for (int b = 0; b < K; ++b) {
      t.f32()[2 * b] = static_cast<float>(row[static_cast<size_t>(b)].latency_ms);
      t.f32()[2 * b + 1] = static_cast<float>(row[static_cast<size_t>(b)].bandwidth_mbps);
    }
    TESSERA_RETURN_IF_ERROR(g.send(0, kRowTag, std::move(t), timeout));
    // Leaving before rank 0 has the row could drop it with the connection.
    TESSERA_RETURN_IF_ERROR(g.recv(0, kAckTag, timeout).status());
    return LinkProfiles{};
  }
  LinkProfiles out(static_cast<size_t>(K));
  out[0] = row;
  for (int r = 1; r < K; ++r) {
    TESSERA_ASSIGN_OR_RETURN(const core::Tensor t, g.recv(r, kRowTag, timeout));
    TESSERA_ASSIGN_OR_RETURN(out[static_cast<size_t>(r)], row_from_tensor(t, K, r));
  }
  for (int r = 1; r < K; ++r) TESSERA_RETURN_IF_ERROR(g.send(r, kAckTag, core::Tensor::zeros_f32({1}), timeout));
  return out;
}

Result<double> measure_crypto_gbps() {
  // The median of 3 differences: another process's burst is no guide. A
  // difference that burst swallowed (CURVE no dearer than the clear) is
  // measured again, up to 9 pairs in all: 0 would price encryption as free.
  std::vector<double> gbps;
  for (int rep = 0; rep < 9 && gbps.size() < 3; ++rep) {
    TESSERA_ASSIGN_OR_RETURN(const double plain, transfer_cpu_s(false));
    TESSERA_ASSIGN_OR_RETURN(const double curve, transfer_cpu_s(true));
    // Each byte is encrypted once and decrypted once.
    const double bytes = 2.0 * kCryptoReps * kBulkFloats * 4;
    if (curve > plain) gbps.push_back(bytes / (curve - plain) / 1e9);
  }
  return gbps.empty() ? 0.0 : core::median(gbps);
}

double crypto_gbps_or_zero() {
  const auto gbps = measure_crypto_gbps();
  if (!gbps.ok()) spdlog::warn("measuring the encryption's CPU rate: {}", gbps.status().to_string());
  return gbps.ok() ? gbps.value() : 0.0;
}

Result<LinkProfiles> measure_local_links(int K, const std::string& link, bool secure) {
  if (K < 2) return LinkProfiles(static_cast<size_t>(std::max(K, 0)), std::vector<LinkProfile>(static_cast<size_t>(std::max(K, 0))));
  comm::LinkMatrix links;
  if (!link.empty()) {
    TESSERA_ASSIGN_OR_RETURN(links, comm::LinkMatrix::from_arg(link, K));
  }
  const comm::Millis wait(120000);
  auto out = on_local_group<LinkProfiles>(K, secure, "tessera-profile", links,
                                          [&](comm::Group& g) { return measure_links(g, wait); });
  if (!out.ok()) return out.status().with_context("measuring the links");
  return out;
}

json ProfileJob::to_json() const {
  json p = {{"part", part == Part::kDevice ? "device" : "links"}};
  if (part == Part::kDevice) {
    p.update({{"model", model}, {"threads", threads}, {"rows", rows}, {"reprofile", reprofile}});
  } else {
    p.update({{"rank", rank}, {"endpoints", endpoints}, {"group_id", group_id}, {"link", link}, {"timeout_ms", timeout_ms}});
  }
  return {{"profile", p}};
}

Result<ProfileJob> ProfileJob::from_json(const json& request) {
  if (!request.is_object() || !request.contains("profile") || !request["profile"].is_object())
    return core::invalid_argument("profile request: 'profile' must be an object");
  const json& j = request["profile"];
  ProfileJob p;
  TESSERA_ASSIGN_OR_RETURN(const std::string part, core::json_field_string(j, "part"));
  if (part == "device") {
    p.part = Part::kDevice;
    TESSERA_ASSIGN_OR_RETURN(p.model, core::json_field_string(j, "model"));
    if (p.model.empty() || p.model.size() > 4096) return core::invalid_argument("profile request: model must be 1..4096 bytes");
    TESSERA_ASSIGN_OR_RETURN(const int64_t threads, core::json_field_int(j, "threads", 1, 256));
    p.threads = static_cast<int>(threads);
    TESSERA_ASSIGN_OR_RETURN(p.rows, core::json_field_int(j, "rows", 1, 1 << 20));
    TESSERA_ASSIGN_OR_RETURN(p.reprofile, core::json_field_bool(j, "reprofile", false));
    return p;
  }
  if (part != "links") return core::invalid_argument("profile request: part must be 'device' or 'links'");
  p.part = Part::kLinks;
  if (!j.contains("endpoints") || !j["endpoints"].is_array() || j["endpoints"].size() < 2 ||
      j["endpoints"].size() > static_cast<size_t>(core::kMaxDevices))
    return core::invalid_argument("profile request: 2.." + std::to_string(core::kMaxDevices) + " endpoints required");
  for (const json& e : j["endpoints"]) {
    if (!e.is_string() || e.get_ref<const std::string&>().empty() || e.get_ref<const std::string&>().size() > 256)
      return core::invalid_argument("profile request: endpoints must be short strings");
    p.endpoints.push_back(e.get<std::string>());
  }
  const int world = static_cast<int>(p.endpoints.size());
  TESSERA_ASSIGN_OR_RETURN(const int64_t rank, core::json_field_int(j, "rank", 1, world - 1));
  p.rank = static_cast<int>(rank);
  TESSERA_ASSIGN_OR_RETURN(p.group_id, core::json_field_string(j, "group_id"));
  if (p.group_id.empty() || p.group_id.size() > 256) return core::invalid_argument("profile request: group id must be 1..256 bytes");
  TESSERA_ASSIGN_OR_RETURN(p.link, core::json_field_string(j, "link", std::string()));
  if (p.link.size() > (64u << 10)) return core::invalid_argument("profile request: link matrix larger than 64 KiB");
  TESSERA_RETURN_IF_ERROR(job_links(p.link, world).status());
  TESSERA_ASSIGN_OR_RETURN(p.timeout_ms, core::json_field_int(j, "timeout_ms", 1, 24ll * 3600 * 1000));
  return p;
}

json daemon_device_profile(const ProfileJob& job, const std::vector<std::string>& roots, bool encrypted) {
  auto measured = [&]() -> Result<DeviceProfile> {
    TESSERA_ASSIGN_OR_RETURN(const std::string dir, resolve_model(job.model, roots));
    TESSERA_ASSIGN_OR_RETURN(const model::ModelConfig c, model::load_config(dir));
    if (job.rows > c.max_rows())
      return core::invalid_argument("profile request: " + std::to_string(job.rows) + " rows, the model takes at most " +
                                    std::to_string(c.max_rows()));
    TESSERA_ASSIGN_OR_RETURN(DeviceProfile d, device_profile(c, job.rows, job.threads, job.reprofile));
    d.crypto_gbps = crypto_gbps_if_shared(encrypted, job.threads);
    return d;
  }();
  if (!measured.ok()) return refusal(measured.status().to_string());
  json a = ok_answer();
  a["profile"] = measured->to_json();
  return a;
}

Status daemon_link_profile(const ProfileJob& job, const WorkerEnv& env) {
  comm::GroupOptions o;
  o.rank = job.rank;
  o.endpoints = job.endpoints;
  o.bind_endpoint = env.bind_endpoint;
  o.group_id = job.group_id;
  o.insecure = !env.key.has_value();  // the daemon's own setting
  o.key = env.key;
  const comm::Millis timeout(job.timeout_ms);
  o.connect_timeout = env.max_connect.count() > 0 ? std::min(timeout, env.max_connect) : timeout;
  TESSERA_ASSIGN_OR_RETURN(o.links, job_links(job.link, static_cast<int>(job.endpoints.size())));
  TESSERA_ASSIGN_OR_RETURN(auto g, comm::Group::create(o));
  return measure_links(*g, std::min(timeout, comm::Millis(120000))).status();
}

Result<planner::ClusterProfile> profile_cluster(const ClusterProfileOptions& o, const model::ModelConfig& c) {
  if (!o.insecure && !o.key) return core::invalid_argument("profiling a cluster needs --key (the workers' key file) or --insecure");
  const int world = 1 + static_cast<int>(o.cluster.workers.size());
  if (world > core::kMaxDevices)
    return core::invalid_argument("a cluster has at most " + std::to_string(core::kMaxDevices) + " devices");
  // Every daemon answers first: one that is down, or holds another key,
  // fails here in seconds rather than after a device profile's timeout.
  for (const std::string& ep : o.cluster.workers) {
    const auto probe = comm::control_request(ep, o.key, kPingRequest, std::min(o.timeout, comm::Millis(10000)));
    if (!probe.ok())
      return core::network_error("worker " + ep + " does not answer (" + probe.status().message() +
                                 "): is its daemon running, with the same key?");
  }
  planner::ClusterProfile p;
  // Devices one at a time: devices that share a machine (or its cooling)
  // would otherwise measure each other.
  TESSERA_ASSIGN_OR_RETURN(DeviceProfile terminal, device_profile(c, o.rows, o.threads, o.reprofile));
  terminal.crypto_gbps = crypto_gbps_if_shared(!o.insecure, o.threads);
  terminal.name = o.cluster.terminal + " (" + terminal.name + ")";
  p.devices.push_back(std::move(terminal));
  ProfileJob dev;
  dev.part = ProfileJob::Part::kDevice;
  dev.model = daemon_model_name(o.model_dir);
  dev.threads = o.threads;
  dev.rows = o.rows;
  dev.reprofile = o.reprofile;
  for (const std::string& ep : o.cluster.workers) {
    TESSERA_ASSIGN_OR_RETURN(const json a, ask(ep, o, dev));
    if (!a.contains("profile")) return core::network_error("worker " + ep + " answered without a profile");
    auto d = DeviceProfile::from_json(a["profile"]);
    if (!d.ok()) return core::network_error("worker " + ep + " sent a bad profile: " + d.status().message());
    d->name = ep + " (" + d->name + ")";
    p.devices.push_back(std::move(*d));
  }
  // Devices behind the same host share its memory, and its memory bandwidth
  // while they compute at once (each measured the host's figure with the
  // CPUs it may use); a host named by a daemon is not taken.
  std::vector<std::string> hosts;
  TESSERA_ASSIGN_OR_RETURN(hosts.emplace_back(), endpoint_host(o.cluster.terminal));
  for (const std::string& ep : o.cluster.workers) {
    TESSERA_ASSIGN_OR_RETURN(hosts.emplace_back(), endpoint_host(ep));
  }
  std::map<std::string, int> sharing;
  for (const std::string& h : hosts) ++sharing[h];
  std::map<std::string, int> host_ids;
  for (int d = 0; d < world; ++d) {
    const std::string& h = hosts[static_cast<size_t>(d)];
    DeviceProfile& dev = p.devices[static_cast<size_t>(d)];
    dev.memory_bytes /= sharing[h];
    dev.host = sharing[h] > 1 ? host_ids.emplace(h, static_cast<int>(host_ids.size())).first->second : -1;
  }

  // The links: every daemon joins one group with the terminal.
  ProfileJob lj;
  lj.part = ProfileJob::Part::kLinks;
  lj.endpoints.push_back(o.cluster.terminal);
  for (const std::string& ep : o.cluster.workers) {
    TESSERA_ASSIGN_OR_RETURN(std::string data, next_port_endpoint(ep));
    lj.endpoints.push_back(data);
  }
  lj.group_id = "tessera-profile-" + std::to_string(::getpid()) + "-" + std::to_string(Clock::now().time_since_epoch().count());
  TESSERA_ASSIGN_OR_RETURN(lj.link, inline_link_arg(o.link, world));
  lj.timeout_ms = o.timeout.count();
  for (int r = 1; r < world; ++r) {
    lj.rank = r;
    TESSERA_RETURN_IF_ERROR(ask(o.cluster.workers[static_cast<size_t>(r - 1)], o, lj).status());
  }
  comm::GroupOptions g;
  g.rank = 0;
  g.endpoints = lj.endpoints;
  TESSERA_ASSIGN_OR_RETURN(g.bind_endpoint, bind_form(o.cluster.terminal));
  g.group_id = lj.group_id;
  g.insecure = o.insecure;
  g.key = o.key;
  g.connect_timeout = o.timeout;
  TESSERA_ASSIGN_OR_RETURN(g.links, job_links(lj.link, world));
  TESSERA_ASSIGN_OR_RETURN(auto group, comm::Group::create(g));
  auto links = measure_links(*group, std::min(o.timeout, comm::Millis(120000)));
  if (!links.ok()) return links.status().with_context("measuring the links");
  p.links = std::move(*links);
  return p;
}

}  // namespace tessera::runtime
