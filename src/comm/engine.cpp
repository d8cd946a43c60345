// The I/O thread of a group: it alone touches the sockets. It paces and
// sends queued messages, validates and files incoming frames, answers the
// ZAP (key check) requests and watches connection events for lost peers.
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "comm/group_core.h"

namespace tessera::comm::detail {

namespace {

constexpr int kMonitorEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_DISCONNECTED;
constexpr int kMaxReadsPerWake = 256;  // keep sending while a peer floods us

bool is_inproc(const std::vector<std::string>& eps) {
  return !eps.empty() && std::all_of(eps.begin(), eps.end(), [](const std::string& e) { return e.rfind("inproc://", 0) == 0; });
}

void free_tensor_holder(void*, void* hint) { delete static_cast<core::Tensor*>(hint); }

int to_ms(Clock::duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 100));
}

}  // namespace

GroupCore::GroupCore(const GroupOptions& options)
    : options_(options),
      rank_(options.rank),
      world_(static_cast<int>(options.endpoints.size())),
      group_(group_hash(options.group_id)),
      secure_(!options.insecure && !is_inproc(options.endpoints)),
      inproc_(is_inproc(options.endpoints)) {
  limits_ = FrameLimits{static_cast<uint32_t>(rank_), static_cast<uint32_t>(world_), group_, options.max_message_bytes};
  peers_.resize(static_cast<size_t>(world_));
  unmatched_per_peer_.assign(static_cast<size_t>(world_), 0);
  links_.resize(static_cast<size_t>(world_));
  reset_stats();
}

GroupCore::~GroupCore() {
  shutdown();
  // A socket given to us that ZeroMQ never took (it closes those it took).
  if (options_.bind_fd >= 0 && !took_bind_fd_) ::close(options_.bind_fd);
}

core::Status GroupCore::start() {
  const bool any_inproc = std::any_of(options_.endpoints.begin(), options_.endpoints.end(),
                                      [](const std::string& e) { return e.rfind("inproc://", 0) == 0; });
  if (any_inproc && !inproc_) return core::invalid_argument("endpoints mix inproc:// with other transports");
  if (secure_) {
    if (!options_.key) {
      return core::invalid_argument("secure group needs a cluster key (tessera keygen --out FILE) or insecure=true");
    }
    TESSERA_RETURN_IF_ERROR(validate_cluster_key(*options_.key));
    zmq_z85_decode(cluster_public_, options_.key->public_z85.c_str());
  }
  if (inproc_ && !options_.context) return core::invalid_argument("inproc groups need a context shared by all ranks");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return core::internal_error(std::string("eventfd: ") + std::strerror(errno));
  // zmq_poll counts in whole milliseconds; a paced message would leave up to
  // 1 ms late, a large error on a fast link. A timerfd wakes us on time.
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0) return core::internal_error(std::string("timerfd: ") + std::strerror(errno));

  const std::string bind_ep = options_.bind_endpoint.empty() ? options_.endpoints[rank_] : options_.bind_endpoint;
  std::string step = "creating the ZeroMQ context";
  try {
    if (inproc_) {
      ctx_ = options_.context;
    } else {
      ctx_ = std::make_shared<zmq::context_t>(std::max(1, options_.io_threads));
      owns_ctx_ = true;
    }
    if (secure_) {
      // The key check: libzmq asks whoever is bound here about every
      // CURVE client of this context before accepting it.
      step = "binding the ZAP handler";
      zap_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::rep);
      zap_->set(zmq::sockopt::linger, 0);
      zap_->bind("inproc://zeromq.zap.01");
    }
    step = "binding " + bind_ep;
    router_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router);
    router_->set(zmq::sockopt::linger, 0);
    router_->set(zmq::sockopt::rcvhwm, 0);
    // libzmq drops a connection announcing a bigger frame before allocating it.
    router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.max_message_bytes + kHeaderSize));
    if (secure_) {
      router_->set(zmq::sockopt::curve_server, true);
      router_->set(zmq::sockopt::curve_secretkey, options_.key->secret_z85);
      router_->set(zmq::sockopt::zap_domain, "tessera");
    }
    // A socket the launcher bound for us: ZeroMQ listens on it (and closes it).
    if (options_.bind_fd >= 0) router_->set(zmq::sockopt::use_fd, options_.bind_fd);
    router_->bind(bind_ep);
    took_bind_fd_ = options_.bind_fd >= 0;

    for (int j = 0; j < world_; ++j) {
      if (j == rank_) continue;
      PeerLink& l = links_[j];
      step = "connecting to rank " + std::to_string(j) + " at " + options_.endpoints[j];
      l.dealer = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::dealer);
      l.dealer->set(zmq::sockopt::routing_id, routing_id_for(rank_));
      l.dealer->set(zmq::sockopt::sndhwm, 0);  // our own queue bounds what is in flight
      l.dealer->set(zmq::sockopt::linger, 0);
      l.dealer->set(zmq::sockopt::reconnect_ivl, 100);
      l.dealer->set(zmq::sockopt::reconnect_ivl_max, 1000);
      l.dealer->set(zmq::sockopt::heartbeat_ivl, static_cast<int>(options_.heartbeat_interval.count()));
      l.dealer->set(zmq::sockopt::heartbeat_timeout, static_cast<int>(options_.heartbeat_timeout.count()));
      if (secure_) {
        l.dealer->set(zmq::sockopt::curve_serverkey, options_.key->public_z85);
        l.dealer->set(zmq::sockopt::curve_publickey, options_.key->public_z85);
        l.dealer->set(zmq::sockopt::curve_secretkey, options_.key->secret_z85);
      }
      if (!inproc_) {
        // Connection events (lost peer, failed handshake) of this link.
        const std::string mon = "inproc://tessera-monitor-" + std::to_string(j);
        if (zmq_socket_monitor(l.dealer->handle(), mon.c_str(), kMonitorEvents) != 0) throw zmq::error_t();
        l.monitor = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pair);
        l.monitor->set(zmq::sockopt::linger, 0);
        l.monitor->connect(mon);
      }
      l.dealer->connect(options_.endpoints[j]);
      const LinkSpec spec = options_.links.link(rank_, j);
      l.pacer = LinkPacer(spec, spec.burst_bytes > 0 ? static_cast<size_t>(spec.burst_bytes) : options_.link_burst_bytes);
      Outgoing hello;
      hello.kind = FrameKind::kHello;
      hello.peer = j;
      enqueue(std::move(hello), Clock::now());
    }
  } catch (const zmq::error_t& e) {
    return core::network_error(step + ": " + e.what());
  }
  thread_ = std::thread([this] { run(); });
  return core::ok_status();
}

core::Status GroupCore::wait_formed(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::vector<int> missing, bad_handshake;
    for (int j = 0; j < world_; ++j) {
      if (j == rank_ || peers_[j].hello) continue;
      missing.push_back(j);
      if (peers_[j].handshake_failed) bad_handshake.push_back(j);
      if (peers_[j].auth_rejected) {
        return core::unauthenticated("rank " + std::to_string(j) + " refused our key: this process does not hold the cluster key");
      }
      if (peers_[j].lost) return core::network_error("forming the group: " + peers_[j].reason);
    }
    if (!fatal_.empty()) return core::network_error(fatal_);
    if (missing.empty()) return core::ok_status();
    if (formed_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      auto list = [](const std::vector<int>& v) {
        std::string s;
        for (int r : v) {
          if (!s.empty()) s += ',';
          s += std::to_string(r);
        }
        return s;
      };
      // Re-check once more under the lock before reporting.
      missing.clear();
      bad_handshake.clear();
      for (int j = 0; j < world_; ++j) {
        if (j == rank_ || peers_[j].hello) continue;
        missing.push_back(j);
        if (peers_[j].handshake_failed) bad_handshake.push_back(j);
      }
      if (missing.empty()) return core::ok_status();
      if (!bad_handshake.empty()) {
        return core::unauthenticated("CURVE handshake with rank(s) " + list(bad_handshake) +
                                     " failed: they and this rank do not hold the same cluster key, or what answers at " +
                                     "their endpoint is not their rank");
      }
      return core::timeout_error("rank(s) " + list(missing) + " did not join group '" + options_.group_id + "' within " +
                                 std::to_string(options_.connect_timeout.count()) + " ms");
    }
  }
}

void GroupCore::wake() {
  const uint64_t one = 1;
  // A full counter already guarantees a wake-up, so a failed write is fine.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void GroupCore::shutdown() {
  std::lock_guard<std::mutex> guard(shutdown_mu_);
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    wake();
    thread_.join();
  }
  // Whatever the thread did not close (it never ran, or it failed).
  for (auto& l : links_) {
    l.monitor.reset();
    l.dealer.reset();
  }
  router_.reset();
  zap_.reset();
  if (owns_ctx_ && ctx_) ctx_->close();
  ctx_.reset();
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
    wake_fd_ = -1;
  }
  if (timer_fd_ >= 0) {
    ::close(timer_fd_);
    timer_fd_ = -1;
  }
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = closed_ = true;
  for (auto& [key, box] : mailboxes_) {
    for (auto& st : box.posted) st->fail(core::network_error("group is closed"));
    box.posted.clear();
  }
  for (auto& o : inbox_) {
    if (o.state) o.state->complete(core::network_error("group is closed"));
  }
  inbox_.clear();
}

void GroupCore::poll_once(int timeout_ms) {
  poll_items_.clear();
  poll_monitor_peer_.clear();
  poll_items_.push_back({router_->handle(), 0, ZMQ_POLLIN, 0});
  poll_items_.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
  poll_items_.push_back({nullptr, timer_fd_, ZMQ_POLLIN, 0});
  const size_t zap_index = poll_items_.size();
  if (zap_) poll_items_.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
  const size_t mon_base = poll_items_.size();
  for (int j = 0; j < world_; ++j) {
    if (links_[j].monitor) {
      poll_monitor_peer_.push_back(j);
      poll_items_.push_back({links_[j].monitor->handle(), 0, ZMQ_POLLIN, 0});
    }
  }
  const int rc = zmq_poll(poll_items_.data(), static_cast<int>(poll_items_.size()), timeout_ms);
  if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
  if (poll_items_[1].revents & ZMQ_POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(wake_fd_, &v, sizeof(v));
  }
  if (poll_items_[2].revents & ZMQ_POLLIN) {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(timer_fd_, &v, sizeof(v));
  }
  if (zap_ && (poll_items_[zap_index].revents & ZMQ_POLLIN)) handle_zap();
  if (poll_items_[0].revents & ZMQ_POLLIN) {
    for (int i = 0; i < kMaxReadsPerWake && receive_one(); ++i) {
    }
  }
  for (size_t m = 0; m < poll_monitor_peer_.size(); ++m) {
    if (poll_items_[mon_base + m].revents & ZMQ_POLLIN) handle_monitor(poll_monitor_peer_[m]);
  }
}

void GroupCore::arm_timer(Clock::time_point at) {
  // steady_clock is CLOCK_MONOTONIC on Linux, so its epoch is the timer's.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
  spec.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

namespace {
// Nice value `nice` for the calling thread and this process's ZeroMQ I/O
// threads. Without the privilege to raise them nothing changes, by design.
void raise_io_threads(int nice) {
  if (nice == 0) return;
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice) != 0)
    spdlog::debug("comm: the I/O thread keeps its priority ({})", std::strerror(errno));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(e.path() / "comm");
    std::string name;
    if (!std::getline(f, name) || name.rfind("ZMQbg/IO", 0) != 0) continue;
    int tid = 0;
    const std::string id = e.path().filename().string();
    if (std::from_chars(id.data(), id.data() + id.size(), tid).ec == std::errc() && tid > 0)
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice);
  }
}
}  // namespace

void GroupCore::run() {
  raise_io_threads(options_.io_nice);
  try {
    for (;;) {
      Clock::time_point now = Clock::now();
      Clock::time_point next = now + std::chrono::milliseconds(100);
      for (const auto& l : links_) {
        if (!l.queue.empty()) next = std::min(next, l.queue.front().release);
        if (l.suspect) next = std::min(next, l.suspect_deadline);
      }
      int timeout_ms = to_ms(next - now);
      if (timeout_ms == 0 && next <= now) timeout_ms = 1;  // a send waits for room: do not spin
      if (next > now) arm_timer(next);
      poll_once(timeout_ms);
      now = Clock::now();
      take_inbox(now);
      flush_queues(now);
      check_suspects(now);

      bool closing;
      {
        std::lock_guard<std::mutex> lock(mu_);
        closing = closing_;
      }
      if (closing) {
        if (close_deadline_ == Clock::time_point{}) close_deadline_ = now + options_.close_timeout;
        take_inbox(now);
        const bool drained = std::all_of(links_.begin(), links_.end(), [](const PeerLink& l) { return l.queue.empty(); });
        if (drained || now >= close_deadline_) {
          finish_close();
          return;
        }
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("comm rank {}: I/O thread failed: {}", rank_, e.what());
    {
      std::lock_guard<std::mutex> lock(mu_);
      fatal_ = std::string("communication thread failed: ") + e.what();
      formed_cv_.notify_all();
    }
    for (int j = 0; j < world_; ++j) {
      if (j != rank_) lose_peer(j, fatal_, false);
    }
    try {
      finish_close();
    } catch (const std::exception&) {
      // Sockets are closed by shutdown() in that case.
    }
  }
}

void GroupCore::take_inbox(Clock::time_point now) {
  std::vector<Outgoing> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(inbox_);
  }
  for (auto& o : batch) enqueue(std::move(o), now);
}

void GroupCore::enqueue(Outgoing o, Clock::time_point now) {
  PeerLink& l = links_[o.peer];
  if (l.lost) {
    if (o.state) o.state->complete(core::network_error("rank " + std::to_string(o.peer) + " is no longer in the group"));
    return;
  }
  if (o.kind == FrameKind::kData) {
    o.release = l.pacer.schedule(kHeaderSize + o.tensor.nbytes(), now);
  } else {
    o.release = l.queue.empty() ? now : std::max(now, l.queue.back().release);
  }
  l.queue.push_back(std::move(o));
}

bool GroupCore::try_send(PeerLink& l, Outgoing& o) {
  FrameHeader h;
  h.kind = o.kind;
  h.op = o.op;
  h.src = static_cast<uint32_t>(rank_);
  h.world = static_cast<uint32_t>(world_);
  h.group = group_;
  h.tag = o.tag;
  if (o.kind == FrameKind::kData) {
    h.dtype = o.tensor.dtype();
    h.shape = o.tensor.shape();
    h.nbytes = o.tensor.nbytes();
  }
  const HeaderBytes hb = encode_header(h);
  try {
    zmq::message_t header(hb.data(), hb.size());
    if (o.kind != FrameKind::kData) {
      if (!l.dealer->send(header, zmq::send_flags::dontwait)) return false;
    } else {
      // Zero copy: the message keeps a share of the tensor's buffer until
      // libzmq is done with it.
      zmq::message_t payload;
      if (h.nbytes > 0) {
        auto* holder = new core::Tensor(o.tensor);
        payload.rebuild(holder->raw(), h.nbytes, &free_tensor_holder, holder);
      }
      if (!l.dealer->send(header, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
      // Once the first part is accepted the rest of the message is too.
      if (!l.dealer->send(payload, zmq::send_flags::dontwait)) throw zmq::error_t();
    }
  } catch (const zmq::error_t& e) {
    if (o.state) o.state->complete(core::network_error(std::string("sending to rank ") + std::to_string(o.peer) + ": " + e.what()));
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.control_bytes_sent += kHeaderSize;
    if (o.kind == FrameKind::kData) {
      for (TrafficCounters* t : {&stats_.total, &stats_.per_peer[o.peer], &stats_.op(o.op).traffic}) {
        t->bytes_sent += h.nbytes;
        ++t->messages_sent;
      }
    }
  }
  if (o.state) o.state->complete(core::ok_status());
  return true;
}

void GroupCore::flush_queues(Clock::time_point now) {
  for (auto& l : links_) {
    while (!l.queue.empty() && l.queue.front().release <= now) {
      if (!try_send(l, l.queue.front())) break;
      l.queue.pop_front();
    }
  }
}

}  // namespace tessera::comm::detail
