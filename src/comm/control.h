// A small request/reply channel for control messages that travel before a
// group exists (a worker daemon receiving its job). Same security as groups:
// CURVE with the cluster key, and the server accepts only clients holding it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/keys.h"
#include "core/status.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace tessera::comm {

class ControlServer {
 public:
  // Binds `endpoint`; `key` empty = insecure.
  static core::Result<std::unique_ptr<ControlServer>> bind(const std::string& endpoint, std::optional<ClusterKey> key,
                                                           size_t max_request_bytes = 1 << 20);
  ~ControlServer();
  // The next request (kTimeout when none came); answer it with reply().
  // A request of more than one frame is answered with an error here, logged
  // and counted, and never returned.
  core::Result<std::string> receive(std::chrono::milliseconds timeout);
  core::Status reply(const std::string& text);
  // Closes and rebinds the socket: the way out of any state a peer left it
  // in (a reply that cannot be sent). Fails only if the endpoint cannot be
  // bound again.
  core::Status reset();
  uint64_t auth_rejections() const { return auth_rejections_; }
  uint64_t malformed_requests() const { return malformed_requests_; }

 private:
  ControlServer() = default;
  void handle_zap();
  void handle_monitor();
  void note_refused();
  core::Status open_socket();
  void note_malformed(const std::string& why);

  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> zap_;
  std::unique_ptr<zmq::socket_t> rep_;
  std::unique_ptr<zmq::socket_t> monitor_;  // rep_'s failed handshakes (a client without our key)
  int monitor_count_ = 0;
  std::string cluster_public_;  // 32 raw bytes
  std::string endpoint_;
  std::optional<ClusterKey> key_;
  size_t max_request_bytes_ = 0;
  uint64_t auth_rejections_ = 0;
  uint64_t malformed_requests_ = 0;
};

// Sends one request and waits for the reply; a server that does not answer
// (gone, or refusing our key) gives kTimeout.
core::Result<std::string> control_request(const std::string& endpoint, const std::optional<ClusterKey>& key,
                                          const std::string& request, std::chrono::milliseconds timeout);

}  // namespace tessera::comm
