// A group of ranks connected over ZeroMQ. Rank 0 is the terminal, ranks
// 1..K-1 are workers. Each rank binds one ROUTER socket at its endpoint and
// holds one DEALER per peer; an I/O thread owns all sockets, paces sends
// (link emulation), validates every incoming frame and files it in a
// per-(peer, op, tag) mailbox. See docs/comm.md for the design.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/keys.h"
#include "comm/link.h"
#include "comm/stats.h"
#include "comm/wire.h"
#include "core/status.h"
#include "core/tensor.h"

namespace zmq {
class context_t;
}

namespace tessera::comm {

using Millis = std::chrono::milliseconds;

namespace detail {
class GroupCore;
struct SendState;
struct RecvState;
}  // namespace detail

// What a message waiting in a mailbox counts against the caps on unmatched
// bytes: its payload plus this, for the bookkeeping around it (tensor, deque
// and map entries), so that a flood of empty frames cannot slip under them.
inline constexpr uint64_t kMailboxOverhead = 1024;

struct GroupOptions {
  int rank = 0;
  // One per rank ("tcp://host:port", "ipc://path" or "inproc://name");
  // endpoints[rank] is bound, the others are connected to.
  std::vector<std::string> endpoints;
  // Bind here instead of endpoints[rank] (e.g. "tcp://*:5555" when the
  // endpoint list uses a host name).
  std::string bind_endpoint;
  // A TCP socket already bound to this rank's endpoint and listening, passed
  // on by whoever picked the port (LocalListeners): the group takes it over
  // instead of binding, so nothing can take the port in between. The group
  // owns it from create() on, whether or not create() succeeds. -1: bind.
  int bind_fd = -1;
  // Every frame carries a hash of this; frames of another group are rejected.
  std::string group_id = "tessera";

  // Security: CURVE with the cluster key unless insecure. inproc groups never
  // leave the process and ZeroMQ applies no mechanism to them.
  bool insecure = false;
  std::optional<ClusterKey> key;

  Millis connect_timeout{30000};     // create() waits this long for every peer's hello
  Millis heartbeat_interval{1000};   // ZMTP PING on idle connections
  Millis heartbeat_timeout{10000};   // no traffic for this long: connection lost
  Millis loss_grace{200};            // after a disconnect, wait for in-flight frames
  Millis close_timeout{5000};        // flushing queued sends on close
  uint64_t max_message_bytes = 1ull << 30;
  // Messages that arrive before anyone receives them wait in a mailbox.
  // Beyond these caps (payload plus header bytes) such messages are dropped
  // and counted, so a peer sending on tags nobody receives cannot exhaust
  // memory. Legitimate early messages are activations of a few MiB.
  uint64_t max_unmatched_bytes_per_peer = 128ull << 20;
  uint64_t max_unmatched_bytes = 256ull << 20;  // all peers together (the job)

  LinkMatrix links;  // empty: unpaced
  size_t link_burst_bytes = 0;

  // Required for inproc (every rank of the group must share it); ignored for
  // tcp/ipc, where each group owns its context.
  std::shared_ptr<zmq::context_t> context;
  int io_threads = 1;
  // The transport's threads (this group's I/O thread and ZeroMQ's) run at
  // this nice value where the process may raise them (CAP_SYS_NICE), so the
  // next step of a transfer does not queue behind compute on a busy core;
  // elsewhere they stay as they are. 0: leave them alone.
  int io_nice = -10;
};

// Completion of an asynchronous send: ok once ZeroMQ has taken the message.
// The tensor's buffer is shared with the transport (zero copy): do not write
// to it after the send; build a new tensor instead.
class SendHandle {
 public:
  SendHandle() = default;
  SendHandle(std::shared_ptr<detail::SendState> state, std::shared_ptr<detail::GroupCore> core);
  bool valid() const { return state_ != nullptr; }
  bool ready() const;
  // Waits at most `timeout`; kTimeout leaves the send pending.
  core::Status wait(Millis timeout);

 private:
  std::shared_ptr<detail::SendState> state_;
  std::shared_ptr<detail::GroupCore> core_;
};

// A posted receive. Receives on the same (peer, op, tag) are matched in
// posting order; messages that arrive before a receive is posted wait in the
// mailbox. Destroying an unfinished handle withdraws the receive.
class RecvHandle {
 public:
  RecvHandle() = default;
  RecvHandle(std::shared_ptr<detail::RecvState> state, std::shared_ptr<detail::GroupCore> core);
  ~RecvHandle();
  RecvHandle(RecvHandle&&) noexcept = default;
  RecvHandle& operator=(RecvHandle&& other) noexcept;
  RecvHandle(const RecvHandle&) = delete;
  RecvHandle& operator=(const RecvHandle&) = delete;

  bool valid() const { return state_ != nullptr; }
  bool ready() const;
  // The tensor, or an error: kTimeout (still posted, may wait again),
  // kNetwork (peer lost or group closed), kInvalidArgument. The tensor is
  // zero copy (it keeps the received message alive) and may share memory
  // with the sender (inproc) or with a forwarding send (rings): treat it as
  // read-only and clone() it before writing.
  core::Result<core::Tensor> wait(Millis timeout);

 private:
  void release();
  std::shared_ptr<detail::RecvState> state_;
  std::shared_ptr<detail::GroupCore> core_;
};

class Group {
 public:
  // Binds, connects, exchanges hellos with every peer; fails (kTimeout,
  // kUnauthenticated, kNetwork) if the group does not form within
  // connect_timeout.
  static core::Result<std::unique_ptr<Group>> create(GroupOptions options);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return world_; }
  const GroupOptions& options() const { return options_; }

  // Tagged point-to-point; tag in [0, kMaxTag).
  SendHandle isend(int peer, int tag, core::Tensor tensor) { return isend_op(OpKind::kP2P, peer, tag, std::move(tensor)); }
  RecvHandle irecv(int peer, int tag) { return irecv_op(OpKind::kP2P, peer, tag); }
  core::Status send(int peer, int tag, core::Tensor tensor, Millis timeout);
  core::Result<core::Tensor> recv(int peer, int tag, Millis timeout);

  // Same, in the mailboxes of an operation kind (used by the collectives).
  SendHandle isend_op(OpKind op, int peer, int tag, core::Tensor tensor);
  RecvHandle irecv_op(OpKind op, int peer, int tag);
  // A receive whose message is also sent on to forward_peer (same op and
  // tag) the moment it arrives, without waiting for the caller; *forwarded
  // completes with that send. Rings use it so that a slow consumer never
  // delays the next hop.
  RecvHandle irecv_forward(OpKind op, int peer, int tag, int forward_peer, SendHandle* forwarded);

  // Whether the peer is still believed alive (false after a lost connection
  // or its goodbye).
  bool peer_alive(int peer) const;

  CommStats stats() const;
  void reset_stats();
  // Collectives report their calls and wall time here.
  void record_op(OpKind op, double seconds, bool ok);

  // Sends what is queued (within close_timeout), says goodbye to the peers
  // and stops the I/O thread. Called by the destructor; later sends fail.
  void close();

 private:
  Group(GroupOptions options, std::shared_ptr<detail::GroupCore> core);
  GroupOptions options_;
  int rank_ = 0;
  int world_ = 1;
  std::shared_ptr<detail::GroupCore> core_;
};

// Free loopback endpoints ("tcp://127.0.0.1:PORT"): random ports below the
// ephemeral range that bind now. Only the numbers come back, so another
// process can take a port before it is used; launches use LocalListeners.
core::Result<std::vector<std::string>> pick_local_endpoints(int n);

// Loopback endpoints whose sockets are bound and listening from the pick on,
// for a launch of local ranks: each rank's group takes its socket over
// (GroupOptions::bind_fd), in this process or in a child that inherits it.
// A port whose number alone was passed on could be taken by another launch's
// pick or an outgoing connection before the rank bound it ("Address already
// in use", or a connection to someone else's rank). Descriptors not released
// close with the object.
class LocalListeners {
 public:
  LocalListeners() = default;
  LocalListeners(const LocalListeners&) = delete;
  LocalListeners& operator=(const LocalListeners&) = delete;
  LocalListeners(LocalListeners&& o) noexcept { *this = std::move(o); }
  LocalListeners& operator=(LocalListeners&& o) noexcept;
  ~LocalListeners() { close_all(); }

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  int fd(int rank) const { return fds_.at(static_cast<size_t>(rank)); }  // -1 once released or closed
  int release(int rank);  // the caller (a group) owns it from now on
  void close(int rank);   // a child has its copy
  void close_all();

 private:
  friend core::Result<LocalListeners> bind_local_listeners(int n);
  std::vector<std::string> endpoints_;
  std::vector<int> fds_;
};

core::Result<LocalListeners> bind_local_listeners(int n);

}  // namespace tessera::comm
