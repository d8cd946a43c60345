#include "comm/control.h"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "core/duration.h"
#include "core/logging.h"

namespace tessera::comm {

using core::Result;
using core::Status;

Result<std::unique_ptr<ControlServer>> ControlServer::bind(const std::string& endpoint, std::optional<ClusterKey> key,
                                                           size_t max_request_bytes) {
  std::unique_ptr<ControlServer> s(new ControlServer());
  s->endpoint_ = endpoint;
  s->key_ = key;
  s->max_request_bytes_ = max_request_bytes;
  try {
    s->ctx_ = std::make_unique<zmq::context_t>(1);
    if (key) {
      TESSERA_RETURN_IF_ERROR(validate_cluster_key(*key));
      s->cluster_public_.resize(32);
      if (zmq_z85_decode(reinterpret_cast<uint8_t*>(s->cluster_public_.data()), key->public_z85.c_str()) == nullptr)
        return core::invalid_argument("cluster public key is not Z85");
      // libzmq asks whoever is bound here about every CURVE client.
      s->zap_ = std::make_unique<zmq::socket_t>(*s->ctx_, zmq::socket_type::rep);
      s->zap_->set(zmq::sockopt::linger, 0);
      s->zap_->bind("inproc://zeromq.zap.01");
    }
  } catch (const zmq::error_t& e) {
    return core::network_error("cannot bind control endpoint " + endpoint + ": " + e.what());
  }
  TESSERA_RETURN_IF_ERROR(s->open_socket());
  return s;
}

Status ControlServer::open_socket() {
  try {
    rep_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::rep);
    rep_->set(zmq::sockopt::linger, 0);
    rep_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_request_bytes_));
    if (key_) {
      rep_->set(zmq::sockopt::curve_server, true);
      rep_->set(zmq::sockopt::curve_secretkey, key_->secret_z85);
      rep_->set(zmq::sockopt::zap_domain, "tessera-control");
    }
    if (key_) {
      // A client that does not hold the key fails the CURVE handshake
      // before any ZAP request: only the socket's events show it.
      const std::string mon = "inproc://tessera-control-server-monitor-" + std::to_string(++monitor_count_);
      if (zmq_socket_monitor(rep_->handle(), mon.c_str(),
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
        throw zmq::error_t();
      monitor_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(mon);
    }
    rep_->bind(endpoint_);
  } catch (const zmq::error_t& e) {
    monitor_.reset();
    rep_.reset();
    return core::network_error("cannot bind control endpoint " + endpoint_ + ": " + e.what());
  }
  return core::ok_status();
}

Status ControlServer::reset() {
  monitor_.reset();
  rep_.reset();
  // libzmq releases the listening port asynchronously; retry for a moment.
  Status st;
  for (int attempt = 0; attempt < 50; ++attempt) {
    st = open_socket();
    if (st.ok()) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return st;
}

void ControlServer::note_malformed(const std::string& why) {
  ++malformed_requests_;
  // Powers of two only: a client repeating it must not flood the log.
  if ((malformed_requests_ & (malformed_requests_ - 1)) == 0)
    spdlog::warn("control: refused a malformed request ({}; {} so far)", why, malformed_requests_);
}

ControlServer::~ControlServer() {
  monitor_.reset();
  rep_.reset();
  zap_.reset();
}

void ControlServer::handle_zap() {
  for (;;) {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(*zap_, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    // RFC 27: the CURVE credential is the client's proven public key.
    const bool ok = req.size() >= 7 && req[5].to_string_view() == "CURVE" && req[6].size() == 32 &&
                    std::memcmp(req[6].data(), cluster_public_.data(), 32) == 0;
    if (!ok) note_refused();
    const std::string id = req.size() >= 2 ? req[1].to_string() : std::string();
    zap_->send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(id), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(std::string(ok ? "200" : "400")), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(std::string(ok ? "OK" : "not the cluster key")), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::none);
  }
}

void ControlServer::note_refused() {
  ++auth_rejections_;
  // Powers of two only: a client retrying forever must not flood the log.
  if ((auth_rejections_ & (auth_rejections_ - 1)) == 0)
    spdlog::warn("control {}: refused a connection that does not hold the cluster key ({} so far)", endpoint_,
                 auth_rejections_);
}

void ControlServer::handle_monitor() {
  zmq::message_t ev;
  while (monitor_->recv(ev, zmq::recv_flags::dontwait)) {
    const bool event_frame = ev.size() >= 6;  // [event u16][value u32], then the endpoint frame
    while (ev.more() && monitor_->recv(ev, zmq::recv_flags::dontwait)) {
    }
    if (event_frame) note_refused();
  }
}

Result<std::string> ControlServer::receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    for (;;) {
      std::vector<zmq::pollitem_t> items = {{rep_->handle(), 0, ZMQ_POLLIN, 0}};
      if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
      if (monitor_) items.push_back({monitor_->handle(), 0, ZMQ_POLLIN, 0});
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return core::timeout_error("no control request");
      zmq::poll(items, std::min(left, std::chrono::milliseconds(1000)));
      if (zap_ && (items[1].revents & ZMQ_POLLIN)) handle_zap();
      if (monitor_ && (items.back().revents & ZMQ_POLLIN)) handle_monitor();
      if (items[0].revents & ZMQ_POLLIN) {
        // A request is one frame. Read every frame of what came (ZeroMQ
        // delivers a message whole), so the socket is ready for the reply.
        zmq::message_t m;
        if (!rep_->recv(m, zmq::recv_flags::dontwait)) continue;
        size_t frames = 1;
        for (bool more = m.more(); more; ++frames) {
          zmq::message_t rest;
          if (!rep_->recv(rest, zmq::recv_flags::dontwait)) break;
          more = rest.more();
        }
        if (frames == 1) return m.to_string();
        note_malformed(std::to_string(frames) + " frames");
        if (!reply(R"({"ok":false,"error":"a control request is one frame"})").ok()) TESSERA_RETURN_IF_ERROR(reset());
      }
    }
  } catch (const zmq::error_t& e) {
    return core::network_error(std::string("control receive: ") + e.what());
  }
}

Status ControlServer::reply(const std::string& text) {
  try {
    if (!rep_->send(zmq::buffer(text), zmq::send_flags::dontwait)) return core::network_error("control reply not sent");
  } catch (const zmq::error_t& e) {
    return core::network_error(std::string("control reply: ") + e.what());
  }
  return core::ok_status();
}

Result<std::string> control_request(const std::string& endpoint, const std::optional<ClusterKey>& key,
                                    const std::string& request, std::chrono::milliseconds timeout) {
  // zmq::poll takes a negative timeout as "wait forever".
  TESSERA_RETURN_IF_ERROR(core::check_duration(timeout, "control request timeout"));
  try {
    zmq::context_t ctx(1);
    zmq::socket_t req(ctx, zmq::socket_type::req);
    req.set(zmq::sockopt::linger, 0);
    req.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(1 << 20));
    if (key) {
      req.set(zmq::sockopt::curve_serverkey, key->public_z85);
      req.set(zmq::sockopt::curve_publickey, key->public_z85);
      req.set(zmq::sockopt::curve_secretkey, key->secret_z85);
    }
    // A server that does not hold our key drops every CURVE handshake, and
    // libzmq would retry until the timeout: the handshake events say so at
    // once. Two failures in a row (not one: a server restarting can cut one)
    // and no success end the wait.
    zmq::socket_t mon(ctx, zmq::socket_type::pair);
    mon.set(zmq::sockopt::linger, 0);
    if (key) {
      const std::string mon_ep = "inproc://tessera-control-monitor";
      if (zmq_socket_monitor(req.handle(), mon_ep.c_str(),
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                                 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
        throw zmq::error_t();
      mon.connect(mon_ep);
    }
    req.connect(endpoint);
    if (!req.send(zmq::buffer(request), zmq::send_flags::dontwait)) return core::network_error("cannot queue the request");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int failed = 0;
    bool shook = false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      std::vector<zmq::pollitem_t> items = {{req.handle(), 0, ZMQ_POLLIN, 0}, {mon.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items.data(), key ? 2 : 1, left);
      if (items[0].revents & ZMQ_POLLIN) {
        zmq::message_t m;
        if (req.recv(m, zmq::recv_flags::dontwait)) return m.to_string();
      }
      if (key && (items[1].revents & ZMQ_POLLIN)) {
        zmq::message_t ev;
        while (mon.recv(ev, zmq::recv_flags::dontwait)) {
          uint16_t event = 0;
          const bool first = ev.size() >= 6;  // [event u16][value u32], then the endpoint frame
          if (first) std::memcpy(&event, ev.data(), sizeof(event));
          while (ev.more() && mon.recv(ev, zmq::recv_flags::dontwait)) {
          }
          if (!first) continue;
          if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) shook = true;
          else ++failed;
        }
        if (!shook && failed >= 2)
          return core::unauthenticated(endpoint + " refused our key (" + std::to_string(failed) +
                                       " CURVE handshakes failed): it does not hold this cluster key (--key)");
      }
    }
    return core::timeout_error("no answer from " + endpoint + " (not running, unreachable, or it refused our key)");
  } catch (const zmq::error_t& e) {
    return core::network_error("control request to " + endpoint + ": " + e.what());
  }
}

}  // namespace tessera::comm
