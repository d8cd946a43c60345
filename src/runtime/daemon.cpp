// The worker daemon and the terminal's cluster file.
#include <toml++/toml.h>

#include <filesystem>
#include <limits>

#include "comm/control.h"
#include "core/io.h"
#include "core/json.h"
#include "core/logging.h"
#include "planner/profile.h"
#include "runtime/cluster_profile.h"
#include "runtime/distributed.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using nlohmann::json;

namespace {

struct Endpoint {
  std::string scheme_host;  // "tcp://host"
  int port = 0;
};

Result<Endpoint> split_endpoint(const std::string& ep) {
  const size_t colon = ep.rfind(':');
  if (ep.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon < 6)
    return core::invalid_argument("endpoint '" + ep + "' is not tcp://HOST:PORT");
  Endpoint e;
  e.scheme_host = ep.substr(0, colon);
  try {
    size_t used = 0;
    e.port = std::stoi(ep.substr(colon + 1), &used);
    if (used != ep.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (...) {
    return core::invalid_argument("endpoint '" + ep + "' has no valid port");
  }
  if (e.port < 1 || e.port > 65534) return core::invalid_argument("endpoint '" + ep + "' port out of range");
  return e;
}

}  // namespace

Result<std::string> next_port_endpoint(const std::string& endpoint) {
  TESSERA_ASSIGN_OR_RETURN(Endpoint e, split_endpoint(endpoint));
  return e.scheme_host + ":" + std::to_string(e.port + 1);
}

std::string daemon_model_name(const std::string& model_dir) {
  const std::filesystem::path p = std::filesystem::path(model_dir).lexically_normal();
  const std::string name = p.filename().string();
  return name.empty() ? p.parent_path().filename().string() : name;  // "dir/" has an empty filename
}

Result<std::string> endpoint_host(const std::string& endpoint) {
  TESSERA_ASSIGN_OR_RETURN(const Endpoint e, split_endpoint(endpoint));
  return e.scheme_host.substr(6);  // after "tcp://"
}

Result<json> daemon_answer(const std::string& endpoint, const std::string& answer, const std::string& what) {
  const json a = json::parse(answer, nullptr, false);
  if (a.is_object() && a.contains("ok") && a["ok"] == true) return a;
  const bool has_error = a.is_object() && a.contains("error") && a["error"].is_string();
  return core::network_error("worker " + endpoint + " refused to " + what + ": " +
                             (has_error ? a["error"].get<std::string>() : std::string("bad answer")));
}

Result<std::string> bind_form(const std::string& endpoint) {
  TESSERA_ASSIGN_OR_RETURN(Endpoint e, split_endpoint(endpoint));
  return "tcp://*:" + std::to_string(e.port);
}

std::vector<int64_t> ClusterFile::memory_limits() const {
  bool any = false;
  for (int64_t m : memory) any = any || m > 0;
  if (!any) return {};
  std::vector<int64_t> out;
  for (int64_t m : memory) out.push_back(m > 0 ? m : std::numeric_limits<int64_t>::max());
  return out;
}

Result<ClusterFile> load_cluster_file(const std::string& path) {
  // read_file refuses FIFOs and devices, which toml::parse_file would block on.
  TESSERA_ASSIGN_OR_RETURN(const std::string text, core::read_file(path));
  return parse_cluster_file(text, path);
}

Result<ClusterFile> parse_cluster_file(const std::string& text, const std::string& path) {
  // ASCII only: the file holds endpoints, and toml++ 3.3's tables of
  // non-ASCII whitespace reach __builtin_unreachable for some characters
  // (found by fuzz_cluster), which is undefined behaviour.
  for (size_t i = 0; i < text.size(); ++i)
    if (static_cast<unsigned char>(text[i]) >= 0x80)
      return core::parse_error("cluster file '" + path + "': byte " + std::to_string(i) + " is not ASCII");
  toml::table t;
  try {
    t = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    return core::parse_error("cluster file '" + path + "': " + std::string(e.description()));
  }
  ClusterFile c;
  const std::string where = "cluster file '" + path + "': ";
  // A budget ("512MB"); absent: none (0).
  auto memory_of = [&](const toml::node_view<toml::node>& n, const std::string& what) -> Result<int64_t> {
    if (!n) return int64_t{0};
    const auto text = n.value<std::string>();
    if (!text) return core::parse_error(where + what + " memory must be a string such as \"512MB\"");
    auto bytes = planner::parse_bytes(*text);
    if (!bytes.ok()) return core::parse_error(where + what + " memory: " + bytes.status().message());
    return *bytes;
  };
  auto add_worker = [&](const std::optional<std::string>& ep, int64_t memory) -> Status {
    if (!ep) return core::parse_error(where + "workers must be endpoint strings");
    TESSERA_RETURN_IF_ERROR(split_endpoint(*ep).status());
    c.workers.push_back(*ep);
    c.memory.push_back(memory);
    return core::ok_status();
  };
  // terminal = "tcp://HOST:PORT", or a [terminal] table with endpoint and memory.
  c.memory.push_back(0);
  if (const toml::table* term = t["terminal"].as_table()) {
    const auto ep = (*term)["endpoint"].value<std::string>();
    if (!ep) return core::parse_error(where + "[terminal] needs endpoint = \"tcp://HOST:PORT\"");
    c.terminal = *ep;
    TESSERA_ASSIGN_OR_RETURN(c.memory[0], memory_of(t["terminal"]["memory"], "[terminal]"));
  } else {
    const auto terminal = t["terminal"].value<std::string>();
    if (!terminal) return core::parse_error(where + "missing terminal = \"tcp://HOST:PORT\"");
    c.terminal = *terminal;
  }
  TESSERA_RETURN_IF_ERROR(split_endpoint(c.terminal).status());
  // The short form, workers = ["tcp://...", ...], and [[worker]] entries.
  if (t.contains("workers")) {
    const toml::array* workers = t["workers"].as_array();
    if (workers == nullptr) return core::parse_error(where + "workers must be a list of endpoints");
    for (const auto& w : *workers) TESSERA_RETURN_IF_ERROR(add_worker(w.value<std::string>(), 0));
  }
  if (t.contains("worker")) {
    const toml::array* entries = t["worker"].as_array();
    if (entries == nullptr) return core::parse_error(where + "worker entries must be [[worker]] tables");
    for (size_t i = 0; i < entries->size(); ++i) {
      const toml::table* w = (*entries)[i].as_table();
      const std::string what = "[[worker]] " + std::to_string(i + 1);
      if (w == nullptr) return core::parse_error(where + what + " is not a table");
      const auto ep = (*w)["endpoint"].value<std::string>();
      if (!ep) return core::parse_error(where + what + " needs endpoint = \"tcp://HOST:PORT\"");
      TESSERA_ASSIGN_OR_RETURN(const int64_t memory, memory_of(t["worker"][i]["memory"], what));
      TESSERA_RETURN_IF_ERROR(add_worker(ep, memory));
    }
  }
  if (c.workers.empty()) return core::parse_error(where + "no workers: add [[worker]] entries or workers = [...]");
  if (c.workers.size() > 63) return core::invalid_argument("cluster file: at most 63 workers");
  return c;
}

bool is_ping(const json& request) { return request.is_object() && request.size() == 1 && request.contains("ping"); }

Status run_worker_daemon(const DaemonOptions& opts) {
  std::optional<comm::ClusterKey> key;
  if (!opts.insecure) {
    if (opts.key_file.empty()) return core::invalid_argument("a worker needs --key FILE (tessera keygen) or --insecure");
    TESSERA_ASSIGN_OR_RETURN(key, comm::read_key_file(opts.key_file));
  }
  // The data port listens on the interface --listen names (127.0.0.1 stays
  // on loopback); only a wildcard --listen binds every interface.
  TESSERA_ASSIGN_OR_RETURN(std::string data_bind, next_port_endpoint(opts.listen));
  TESSERA_ASSIGN_OR_RETURN(auto server, comm::ControlServer::bind(opts.listen, key));
  spdlog::info("worker listening for jobs on {} (data on {})", opts.listen, data_bind);
  // Nothing a peer sends ends this loop: bad requests are answered or
  // dropped, and a socket left in a bad state is reset. Only local failures
  // (the endpoint cannot be bound again) return.
  auto answer = [&](const json& j) -> Status {
    const Status st = server->reply(j.dump());
    if (st.ok()) return st;
    spdlog::warn("control: reply failed ({}); resetting the control socket", st.to_string());
    return server->reset();
  };
  for (int done = 0; opts.jobs == 0 || done < opts.jobs;) {
    auto request = server->receive(std::chrono::hours(1));
    if (!request.ok()) {
      if (request.status().code() == core::ErrorCode::kTimeout) continue;
      spdlog::warn("control: {}; resetting the control socket", request.status().to_string());
      TESSERA_RETURN_IF_ERROR(server->reset());
      continue;
    }
    auto parsed = core::parse_json(*request, "control request");
    // A ping: the terminal checks that the daemon is up and holds its key.
    if (parsed.ok() && is_ping(*parsed)) {
      TESSERA_RETURN_IF_ERROR(answer(json({{"ok", true}})));
      continue;
    }
    // A profile request: answer with this device's profile, or join the
    // terminal's link measurement (runtime/cluster_profile.h).
    if (parsed.ok() && is_profile_request(*parsed)) {
      auto pj = ProfileJob::from_json(*parsed);
      if (!pj.ok()) {
        spdlog::warn("control: refused a profile request: {}", pj.status().to_string());
        TESSERA_RETURN_IF_ERROR(answer(json({{"ok", false}, {"error", pj.status().to_string()}})));
        continue;
      }
      if (pj->part == ProfileJob::Part::kDevice) {
        TESSERA_RETURN_IF_ERROR(answer(daemon_device_profile(*pj, opts.model_roots)));
        continue;
      }
      TESSERA_RETURN_IF_ERROR(answer(json({{"ok", true}})));
      const Status st = daemon_link_profile(*pj, WorkerEnv{data_bind, key, nullptr, &opts.model_roots, comm::Millis(60000)});
      if (st.ok()) spdlog::info("link profile of group {} done", pj->group_id);
      else spdlog::warn("link profile of group {} ended: {}", pj->group_id, st.to_string());
      continue;
    }
    auto job = JobSpec::from_json(*request);
    const Status checked = job.ok() ? check_daemon_job(*job, opts.model_roots) : job.status();
    if (!checked.ok()) {
      const std::string why = checked.to_string();
      spdlog::warn("control: refused a job: {}", why);
      TESSERA_RETURN_IF_ERROR(answer(json({{"ok", false}, {"error", why}})));
      continue;
    }
    job->insecure = opts.insecure;  // the daemon's own security setting, not the request's
    TESSERA_RETURN_IF_ERROR(answer(json({{"ok", true}})));
    ++done;
    comm::CommStats cs;
    WorkerEnv env{data_bind, key, &cs, &opts.model_roots, comm::Millis(60000)};
    const Status st = run_worker(*job, env);
    const std::string buffered = "unmatched bytes peak " + std::to_string(cs.unmatched_bytes_peak) + ", " +
                                 std::to_string(cs.unmatched_frames_dropped) + " frames (" +
                                 std::to_string(cs.unmatched_bytes_dropped) + " bytes) dropped over the cap";
    if (st.ok()) {
      spdlog::info("job of group {} finished ({})", job->group_id, buffered);
    } else {
      spdlog::warn("job of group {} ended: {} ({})", job->group_id, st.to_string(), buffered);
    }
  }
  return core::ok_status();
}

}  // namespace tessera::runtime
