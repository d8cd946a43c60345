#include "runtime/cluster_file.h"

#include <toml++/toml.h>

#include <filesystem>
#include <limits>
#include <optional>

#include "core/io.h"
#include "core/limits.h"
#include "planner/profile.h"

namespace tessera::runtime {

using core::Result;
using core::Status;

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
  if (c.workers.size() >= static_cast<size_t>(core::kMaxDevices))
    return core::invalid_argument("cluster file: at most " + std::to_string(core::kMaxDevices - 1) + " workers");
  return c;
}

ClusterFile ClusterFile::subset(const std::vector<int>& members) const {
  ClusterFile c;
  c.terminal = terminal;
  c.memory.push_back(memory.empty() ? 0 : memory[0]);
  for (size_t i = 1; i < members.size(); ++i) {
    const auto m = static_cast<size_t>(members[i]);
    c.workers.push_back(workers[m - 1]);
    c.memory.push_back(m < memory.size() ? memory[m] : 0);
  }
  return c;
}

}  // namespace tessera::runtime
