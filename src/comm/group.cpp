// Group, handles and the user-thread side of GroupCore (posting sends and
// receives, mailboxes, statistics). The I/O thread lives in engine.cpp.
#include "comm/group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "comm/group_core.h"
#include "core/duration.h"
#include "core/io.h"

namespace tessera::comm {

namespace detail {

void Completion::complete(core::Status s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    status = std::move(s);
  }
  cv.notify_all();
}

bool Completion::wait_until(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu);
  return cv.wait_until(lock, deadline, [this] { return done; });
}

bool Completion::is_done() {
  std::lock_guard<std::mutex> lock(mu);
  return done;
}

void RecvState::fail(const core::Status& s) {
  complete(s);
  if (forward_state) forward_state->complete(s);
}

Outgoing GroupCore::forward_of(const RecvState& st, const core::Tensor& t) {
  Outgoing o;
  o.kind = FrameKind::kData;
  o.op = st.op;
  o.peer = st.forward_peer;
  o.tag = st.tag;
  o.tensor = t;
  o.state = st.forward_state;
  return o;
}

void RecvState::complete_with(core::Tensor t) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    tensor = std::move(t);
  }
  cv.notify_all();
}

namespace {

core::Status check_peer_tag(int peer, int tag, int rank, int world) {
  if (peer < 0 || peer >= world || peer == rank) {
    return core::invalid_argument("peer " + std::to_string(peer) + " is not another rank of this group of " +
                                  std::to_string(world));
  }
  if (tag < 0 || static_cast<uint32_t>(tag) >= kMaxTag) return core::invalid_argument("tag out of range: " + std::to_string(tag));
  return core::ok_status();
}

}  // namespace

std::shared_ptr<SendState> GroupCore::post_send(OpKind op, int peer, int tag, core::Tensor tensor) {
  auto state = std::make_shared<SendState>();
  core::Status st = check_peer_tag(peer, tag, rank_, world_);
  if (st.ok() && tensor.rank() > kMaxDims) {
    st = core::invalid_argument("tensor rank " + std::to_string(tensor.rank()) + " exceeds " + std::to_string(kMaxDims));
  }
  if (st.ok() && tensor.nbytes() > options_.max_message_bytes) {
    st = core::invalid_argument("tensor of " + std::to_string(tensor.nbytes()) + " bytes exceeds max_message_bytes");
  }
  if (st.ok() && tensor.nbytes() > 0 && tensor.raw() == nullptr) st = core::invalid_argument("tensor has no data");
  if (!st.ok()) {
    state->complete(st);
    return state;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.empty()) st = core::network_error(fatal_);
    else if (closing_) st = core::network_error("group is closed");
    else if (peers_[peer].lost) st = core::network_error(peers_[peer].reason);
    if (st.ok()) {
      Outgoing o;
      o.kind = FrameKind::kData;
      o.op = op;
      o.peer = peer;
      o.tag = static_cast<uint32_t>(tag);
      o.tensor = std::move(tensor);
      o.state = state;
      inbox_.push_back(std::move(o));
    }
  }
  if (!st.ok()) state->complete(st);
  else wake();
  return state;
}

std::shared_ptr<RecvState> GroupCore::post_recv(OpKind op, int peer, int tag, int forward_peer) {
  auto state = std::make_shared<RecvState>();
  state->peer = peer;
  state->op = op;
  state->tag = static_cast<uint32_t>(tag);
  if (forward_peer >= 0) {
    state->forward_peer = forward_peer;
    state->forward_state = std::make_shared<SendState>();
  }
  core::Status st = check_peer_tag(peer, tag, rank_, world_);
  if (st.ok() && forward_peer >= 0) st = check_peer_tag(forward_peer, tag, rank_, world_);
  if (!st.ok()) {
    state->fail(st);
    return state;
  }
  bool forwarded = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Mailbox& box = mailboxes_[MailKey{peer, op, state->tag}];
    if (!box.unexpected.empty()) {
      core::Tensor t = std::move(box.unexpected.front());
      box.unexpected.pop_front();
      note_buffered(peer, -static_cast<int64_t>(buffered_cost(t)));
      if (forward_peer >= 0) {
        if (closing_) {
          state->forward_state->complete(core::network_error("group is closed"));
        } else {
          inbox_.push_back(forward_of(*state, t));
          forwarded = true;
        }
      }
      state->complete_with(std::move(t));
    } else if (!fatal_.empty()) {
      state->fail(core::network_error(fatal_));
    } else if (peers_[peer].lost) {
      state->fail(core::network_error(peers_[peer].reason));
    } else if (op != OpKind::kP2P && !broken_.empty()) {
      state->fail(core::network_error(broken_));
    } else if (closed_) {
      state->fail(core::network_error("group is closed"));
    } else {
      box.posted.push_back(state);
    }
  }
  if (forwarded) wake();
  return state;
}

void GroupCore::withdraw(const std::shared_ptr<RecvState>& state) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mailboxes_.find(MailKey{state->peer, state->op, state->tag});
  if (it == mailboxes_.end()) return;
  auto& posted = it->second.posted;
  posted.erase(std::remove(posted.begin(), posted.end(), state), posted.end());
  std::lock_guard<std::mutex> slock(state->mu);
  if (state->done && state->status.ok() && !state->consumed) {
    // Delivered but never collected: give it to the next receive.
    note_buffered(state->peer, static_cast<int64_t>(buffered_cost(state->tensor)));
    it->second.unexpected.push_front(std::move(state->tensor));
    state->consumed = true;
  }
}

bool GroupCore::peer_alive(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer < 0 || peer >= world_) return false;
  return peer == rank_ || !peers_[peer].lost;
}

CommStats GroupCore::stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void GroupCore::reset_stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  CommStats fresh;
  fresh.rank = rank_;
  fresh.world = world_;
  fresh.per_peer.assign(static_cast<size_t>(world_), TrafficCounters{});
  // The mailbox figures cover the group's life: a daemon reports them per job.
  fresh.unmatched_bytes = stats_.unmatched_bytes;
  fresh.unmatched_bytes_peak = stats_.unmatched_bytes_peak;
  fresh.unmatched_frames_dropped = stats_.unmatched_frames_dropped;
  fresh.unmatched_bytes_dropped = stats_.unmatched_bytes_dropped;
  stats_ = fresh;
}

void GroupCore::add_blocked(double seconds) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.blocked_seconds += seconds;
}

void GroupCore::record_op(OpKind op, double seconds, bool ok) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  OpStats& s = stats_.op(op);
  ++s.calls;
  if (!ok) ++s.failures;
  s.seconds += seconds;
}

}  // namespace detail

// ---- handles ---------------------------------------------------------------

SendHandle::SendHandle(std::shared_ptr<detail::SendState> state, std::shared_ptr<detail::GroupCore> core)
    : state_(std::move(state)), core_(std::move(core)) {}

bool SendHandle::ready() const { return state_ && state_->is_done(); }

core::Status SendHandle::wait(Millis timeout) {
  if (!state_) return core::invalid_argument("wait on an empty SendHandle");
  core::Timer timer;
  const bool done = state_->wait_until(detail::Clock::now() + timeout);
  if (core_) core_->add_blocked(timer.ms() / 1000.0);
  if (!done) return core::timeout_error("send not taken by the transport within " + std::to_string(timeout.count()) + " ms");
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->status;
}

RecvHandle::RecvHandle(std::shared_ptr<detail::RecvState> state, std::shared_ptr<detail::GroupCore> core)
    : state_(std::move(state)), core_(std::move(core)) {}

RecvHandle::~RecvHandle() { release(); }

RecvHandle& RecvHandle::operator=(RecvHandle&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    core_ = std::move(other.core_);
  }
  return *this;
}

void RecvHandle::release() {
  if (state_ && core_) {
    bool collected;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      collected = state_->consumed || (state_->done && !state_->status.ok());
    }
    if (!collected) core_->withdraw(state_);
  }
  state_.reset();
  core_.reset();
}

bool RecvHandle::ready() const { return state_ && state_->is_done(); }

core::Result<core::Tensor> RecvHandle::wait(Millis timeout) {
  if (!state_) return core::invalid_argument("wait on an empty RecvHandle");
  core::Timer timer;
  const bool done = state_->wait_until(detail::Clock::now() + timeout);
  if (core_) core_->add_blocked(timer.ms() / 1000.0);
  if (!done) {
    return core::timeout_error("no message from rank " + std::to_string(state_->peer) + " (" + op_name(state_->op) +
                               ", tag " + std::to_string(state_->tag) + ") within " + std::to_string(timeout.count()) +
                               " ms");
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->status.ok()) return state_->status;
  state_->consumed = true;
  return state_->tensor;
}

// ---- Group -----------------------------------------------------------------

Group::Group(GroupOptions options, std::shared_ptr<detail::GroupCore> core)
    : options_(std::move(options)), rank_(options_.rank),
      world_(static_cast<int>(options_.endpoints.size())), core_(std::move(core)) {}

namespace {

// A descriptor handed to a group must be a socket listening at the rank's
// endpoint: ZeroMQ would take anything (and abort on a non-socket), and a
// socket on another port would only show as peers that never arrive. It is
// made close-on-exec again, so a process the rank starts does not hold it.
core::Status check_bind_fd(const GroupOptions& o) {
  const std::string& ep = o.bind_endpoint.empty() ? o.endpoints[static_cast<size_t>(o.rank)] : o.bind_endpoint;
  int listening = 0;
  socklen_t n = sizeof listening;
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  const bool ok = ::getsockopt(o.bind_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) == 0 && listening == 1 &&
                  ::getsockname(o.bind_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && addr.sin_family == AF_INET &&
                  ep.size() > 6 && ep.rfind("tcp://", 0) == 0 &&
                  ep.substr(ep.rfind(':') + 1) == std::to_string(ntohs(addr.sin_port));
  if (!ok) {
    return core::invalid_argument("descriptor " + std::to_string(o.bind_fd) + " is not a TCP socket listening at " + ep);
  }
  if (::fcntl(o.bind_fd, F_SETFD, FD_CLOEXEC) != 0)
    return core::internal_error(std::string("fcntl on the listening socket: ") + std::strerror(errno));
  return core::ok_status();
}

}  // namespace

core::Result<std::unique_ptr<Group>> Group::create(GroupOptions options) {
  // options.bind_fd is ours: closed here until the core holds it.
  struct FdOwner {
    int fd;
    ~FdOwner() {
      if (fd >= 0) ::close(fd);
    }
  } owner{options.bind_fd};
  const int world = static_cast<int>(options.endpoints.size());
  if (world < 1) return core::invalid_argument("group needs at least one endpoint");
  if (options.rank < 0 || options.rank >= world) {
    return core::invalid_argument("rank " + std::to_string(options.rank) + " outside a group of " + std::to_string(world));
  }
  if (!options.links.empty() && options.links.world() != world) {
    return core::invalid_argument("link matrix is for " + std::to_string(options.links.world()) + " ranks, group has " +
                                  std::to_string(world));
  }
  if (options.max_message_bytes == 0) return core::invalid_argument("max_message_bytes must be positive");
  if (options.max_unmatched_bytes_per_peer == 0 || options.max_unmatched_bytes == 0)
    return core::invalid_argument("the caps on unmatched bytes must be positive");
  for (const auto& [d, what] : {std::pair{options.connect_timeout, "connect timeout"},
                                {options.heartbeat_interval, "heartbeat interval"},
                                {options.heartbeat_timeout, "heartbeat timeout"}, {options.loss_grace, "loss grace"},
                                {options.close_timeout, "close timeout"}})
    TESSERA_RETURN_IF_ERROR(core::check_duration(d, what));
  if (options.bind_fd >= 0) TESSERA_RETURN_IF_ERROR(check_bind_fd(options));
  const auto deadline = detail::Clock::now() + options.connect_timeout;
  auto core = std::make_shared<detail::GroupCore>(options);
  owner.fd = -1;  // the core's now: ZeroMQ's once bound, else closed with the core
  options.bind_fd = -1;  // options() must not hand out a descriptor the group owns
  TESSERA_RETURN_IF_ERROR(core->start());
  core::Status st = core->wait_formed(deadline);
  if (!st.ok()) {
    core->shutdown();
    return st;
  }
  return std::unique_ptr<Group>(new Group(std::move(options), std::move(core)));
}

Group::~Group() { close(); }

void Group::close() {
  if (core_) core_->shutdown();
}

core::Status Group::send(int peer, int tag, core::Tensor tensor, Millis timeout) {
  return isend(peer, tag, std::move(tensor)).wait(timeout);
}

core::Result<core::Tensor> Group::recv(int peer, int tag, Millis timeout) { return irecv(peer, tag).wait(timeout); }

SendHandle Group::isend_op(OpKind op, int peer, int tag, core::Tensor tensor) {
  return SendHandle(core_->post_send(op, peer, tag, std::move(tensor)), core_);
}

RecvHandle Group::irecv_op(OpKind op, int peer, int tag) { return RecvHandle(core_->post_recv(op, peer, tag), core_); }

RecvHandle Group::irecv_forward(OpKind op, int peer, int tag, int forward_peer, SendHandle* forwarded) {
  auto state = core_->post_recv(op, peer, tag, forward_peer);
  *forwarded = SendHandle(state->forward_state, core_);
  return RecvHandle(std::move(state), core_);
}

bool Group::peer_alive(int peer) const { return core_->peer_alive(peer); }
CommStats Group::stats() const { return core_->stats(); }
void Group::reset_stats() { core_->reset_stats(); }
void Group::record_op(OpKind op, double seconds, bool ok) { core_->record_op(op, seconds, ok); }

namespace {

// Ports below the kernel's ephemeral range: a port from that range can be
// handed to some other socket's outgoing connection between our pick and the
// real bind ("Address already in use" under parallel tests).
std::pair<int, int> non_ephemeral_ports() {
  int low = 32768;
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(f >> low) || low < 2048) low = 32768;
  return {std::max(1024, low - 16384), low};
}

}  // namespace

core::Result<std::vector<std::string>> pick_local_endpoints(int n) {
  std::vector<std::string> out;
  const auto [begin, end] = non_ephemeral_ports();
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> port(begin, end - 1);
  try {
    zmq::context_t ctx(1);
    std::vector<zmq::socket_t> holders;
    // Hold every socket until all ports are known so no port is picked twice.
    for (int i = 0; i < n; ++i) {
      holders.emplace_back(ctx, zmq::socket_type::router);
      holders.back().set(zmq::sockopt::linger, 0);
      bool bound = false;
      for (int attempt = 0; attempt < 200 && !bound; ++attempt) {
        try {
          holders.back().bind("tcp://127.0.0.1:" + std::to_string(port(rng)));
          bound = true;
        } catch (const zmq::error_t&) {  // taken: try another
        }
      }
      if (!bound) holders.back().bind("tcp://127.0.0.1:*");  // let the kernel choose
      out.push_back(holders.back().get(zmq::sockopt::last_endpoint));
    }
    for (auto& s : holders) s.close();
    ctx.close();
  } catch (const zmq::error_t& e) {
    return core::network_error(std::string("picking local ports: ") + e.what());
  }
  return out;
}

LocalListeners& LocalListeners::operator=(LocalListeners&& o) noexcept {
  if (this != &o) {
    close_all();
    endpoints_ = std::move(o.endpoints_);
    fds_ = std::exchange(o.fds_, {});
  }
  return *this;
}

int LocalListeners::release(int rank) { return std::exchange(fds_.at(static_cast<size_t>(rank)), -1); }

void LocalListeners::close(int rank) {
  const int fd = release(rank);
  if (fd >= 0) ::close(fd);
}

void LocalListeners::close_all() {
  for (int& fd : fds_)
    if (fd >= 0) ::close(std::exchange(fd, -1));
}

core::Result<LocalListeners> bind_local_listeners(int n) {
  LocalListeners out;
  for (int i = 0; i < n; ++i) {
    // Non-blocking as ZeroMQ's own listeners are, so its I/O thread never
    // waits in accept(); close-on-exec, so only the child meant to have it
    // inherits it. Port 0: the kernel picks, and no one else gets it while
    // the socket is held.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return core::network_error(std::string("a local listening socket: ") + std::strerror(errno));
    out.fds_.push_back(fd);
    const int one = 1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 100) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return core::network_error(std::string("binding a local listening socket: ") + std::strerror(errno));
    }
    out.endpoints_.push_back("tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  }
  return out;
}

}  // namespace tessera::comm
