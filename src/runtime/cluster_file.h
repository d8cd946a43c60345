// The terminal's cluster file (TOML) and the endpoint forms derived from it.
// Parsed in one place (runtime/deployment.h's Cluster::open); the session,
// the profiler and serve get the parsed form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::runtime {

// A cluster file:
//   terminal = "tcp://192.168.1.10:7100"   # this device's data endpoint
//   [[worker]]
//   endpoint = "tcp://192.168.1.11:7070"
//   memory = "512MB"                       # optional budget
// or, without budgets, workers = ["tcp://192.168.1.11:7070", ...]. The
// terminal may be a table too: [terminal] endpoint = "...", memory = "1GB".
// Worker endpoints are the daemons' --listen endpoints; their data endpoint
// is the same host on the next port.
struct ClusterFile {
  std::string terminal;
  std::vector<std::string> workers;
  // Budgets in bytes, terminal first then the workers in order; 0: none.
  std::vector<int64_t> memory;
  // The budgets as --memory-limit gives them (no budget: the largest
  // value); empty when the file names none.
  std::vector<int64_t> memory_limits() const;
  // The terminal and the workers `members` names (cluster device indices,
  // 0 = the terminal first), with their budgets, in that order.
  ClusterFile subset(const std::vector<int>& members) const;
};
[[nodiscard]] core::Result<ClusterFile> load_cluster_file(const std::string& path);
// The same from the file's text; `path` labels errors.
[[nodiscard]] core::Result<ClusterFile> parse_cluster_file(const std::string& text, const std::string& path);

// "tcp://host:7070" -> "tcp://host:7071"; "tcp://host:7070" -> "tcp://*:7070" for binding.
[[nodiscard]] core::Result<std::string> next_port_endpoint(const std::string& endpoint);
[[nodiscard]] core::Result<std::string> bind_form(const std::string& endpoint);
// "tcp://host:7070" -> "host" (devices behind one host share its memory).
[[nodiscard]] core::Result<std::string> endpoint_host(const std::string& endpoint);
// The name a daemon looks a model up by (under its --models roots): the
// terminal's model folder name.
std::string daemon_model_name(const std::string& model_dir);

}  // namespace tessera::runtime
