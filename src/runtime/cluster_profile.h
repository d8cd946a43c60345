// Profiling the devices a plan may use: each device's profile (the model's
// kernels, planner::measure_device, cached per device) and every ordered
// link's latency and bandwidth through the real transport. Local devices and
// worker daemons run the same two functions: a daemon runs them when the
// terminal asks over the control channel (a "profile" request, beside jobs).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/keys.h"
#include "core/status.h"
#include "model/config.h"
#include "planner/profile.h"
#include "runtime/cluster_file.h"
#include "runtime/worker.h"

namespace tessera::runtime {

using LinkProfiles = std::vector<std::vector<planner::LinkProfile>>;

// This device's profile for `rows` rows on `threads` threads: read from the
// cache (planner::device_cache_path) unless `reprofile`, else measured and
// cached. The available memory is read fresh either way.
[[nodiscard]] core::Result<planner::DeviceProfile> device_profile(const model::ModelConfig& c, int64_t rows, int threads,
                                                                  bool reprofile);

// This rank's part of the link measurement over a formed group: every
// ordered pair (a, b) in turn, round trips of a 4-byte message and one bulk
// message of 1 MiB, as the emulated links pace them. Then every rank sends
// the row it measured as the sender to rank 0, which answers each with an
// acknowledgement. Rank 0 returns the K x K matrix, the others an empty one.
[[nodiscard]] core::Result<LinkProfiles> measure_links(comm::Group& g, comm::Millis timeout);

// K local devices: K ranks as threads over loopback with `link` emulated,
// CURVE-encrypted with a throwaway key when `secure` (as the run will be:
// encrypting and decrypting each message is part of a transfer's time).
[[nodiscard]] core::Result<LinkProfiles> measure_local_links(int K, const std::string& link, bool secure = true);
// Bytes a second this machine's cores encrypt (or decrypt) with CURVE, as
// the transport frames them: the extra CPU time of moving tensors over
// loopback encrypted rather than in the clear (DeviceProfile::crypto_gbps;
// 0 when no difference shows).
[[nodiscard]] core::Result<double> measure_crypto_gbps();
// The same, or 0 with a warning where it fails: a refinement left unpriced.
double crypto_gbps_or_zero();

// What a terminal asks a daemon. Part kDevice: measure (or read) the
// device's profile and answer with it. Part kLinks: answer {"ok": true},
// then join group `group_id` as `rank` and run measure_links.
struct ProfileJob {
  enum class Part { kDevice, kLinks };
  Part part = Part::kDevice;
  // kDevice.
  std::string model;  // a name under the daemon's --models roots
  int threads = 1;
  int64_t rows = 128;
  bool reprofile = false;
  // kLinks.
  int rank = 1;
  std::vector<std::string> endpoints;
  std::string group_id;
  std::string link;  // a spec or an inline JSON matrix, as a job carries it
  int64_t timeout_ms = 60000;

  nlohmann::json to_json() const;
  // Every field checked: the request comes from the network.
  [[nodiscard]] static core::Result<ProfileJob> from_json(const nlohmann::json& j);
};

// The daemon's side of a kDevice request: the reply to send. An encrypted
// daemon whose job threads take every core also measures crypto_gbps.
nlohmann::json daemon_device_profile(const ProfileJob& job, const std::vector<std::string>& roots, bool encrypted);
// The daemon's side of a kLinks request, after it replied: its data endpoint
// and key as for jobs.
[[nodiscard]] core::Status daemon_link_profile(const ProfileJob& job, const WorkerEnv& env);

// The terminal's side: its own profile, then each daemon's in turn (one at a
// time, so that devices sharing a machine do not measure each other's load),
// then the links among all of them. Devices whose endpoints name the same
// host share its memory. A daemon that does not answer a probe within 10 s
// fails the whole profile, naming it.
struct ClusterProfileOptions {
  ClusterFile cluster;
  std::optional<comm::ClusterKey> key;  // required unless insecure
  bool insecure = false;
  std::string model_dir;  // the terminal's; daemons look up its folder name
  int threads = 1;
  int64_t rows = 128;
  std::string link;  // --link as the user gave it
  bool reprofile = false;
  comm::Millis timeout{120000};  // one daemon's device profile; the link group's formation
};
[[nodiscard]] core::Result<planner::ClusterProfile> profile_cluster(const ClusterProfileOptions& o, const model::ModelConfig& c);

}  // namespace tessera::runtime
