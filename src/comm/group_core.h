// Internal: the shared state behind a Group and its handles, and the I/O
// thread that owns every socket. Not part of the public API.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "comm/group.h"

namespace tessera::comm::detail {

using Clock = std::chrono::steady_clock;

// A one-shot completion that any thread may wait on.
struct Completion {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  core::Status status;

  // First completion wins; later ones are ignored.
  void complete(core::Status s);
  bool wait_until(Clock::time_point deadline);
  bool is_done();
};

struct SendState : Completion {};

struct RecvState : Completion {
  int peer = 0;
  OpKind op = OpKind::kP2P;
  uint32_t tag = 0;
  core::Tensor tensor;    // set with an ok completion
  bool consumed = false;  // the caller got the tensor
  // Rings: on arrival the message is also sent on to forward_peer at once,
  // by whichever thread matches it, so forwarding never waits for the caller.
  int forward_peer = -1;
  std::shared_ptr<SendState> forward_state;
  void complete_with(core::Tensor t);
  // Fails the receive and the forward that will now never happen.
  void fail(const core::Status& s);
};

struct MailKey {
  int peer;
  OpKind op;
  uint32_t tag;
  bool operator<(const MailKey& o) const {
    return std::tie(peer, op, tag) < std::tie(o.peer, o.op, o.tag);
  }
};

inline uint64_t buffered_cost(const core::Tensor& t) { return t.nbytes() + kMailboxOverhead; }

struct Mailbox {
  std::deque<core::Tensor> unexpected;                // arrived, nobody asked yet
  std::deque<std::shared_ptr<RecvState>> posted;       // asked, nothing arrived yet
};

struct Outgoing {
  FrameKind kind = FrameKind::kData;
  OpKind op = OpKind::kP2P;
  int peer = 0;
  uint32_t tag = 0;
  core::Tensor tensor;
  std::shared_ptr<SendState> state;  // null for control frames
  Clock::time_point release{};
};

// Per-peer state shared with user threads (guarded by GroupCore::mu_).
struct PeerStatus {
  bool hello = false;             // the peer introduced itself
  bool lost = false;              // left (bye) or connection lost
  bool handshake_failed = false;  // a CURVE handshake with it failed
  bool auth_rejected = false;     // it refused our key outright
  std::string reason;
};

// Per-peer state owned by the I/O thread.
struct PeerLink {
  std::unique_ptr<zmq::socket_t> dealer;
  std::unique_ptr<zmq::socket_t> monitor;
  LinkPacer pacer;
  std::deque<Outgoing> queue;  // release times never decrease
  bool handshake_ok = false;
  bool hello_seen = false;     // I/O thread's copy of PeerStatus::hello
  bool lost = false;
  bool suspect = false;        // disconnected; frames may still be in flight
  Clock::time_point suspect_deadline{};
};

class GroupCore : public std::enable_shared_from_this<GroupCore> {
 public:
  explicit GroupCore(const GroupOptions& options);
  ~GroupCore();

  // Sockets, ZAP handler, hellos, I/O thread.
  core::Status start();
  // Until every peer said hello, or an error / the deadline.
  core::Status wait_formed(Clock::time_point deadline);
  // Flush, goodbye, stop the thread, close sockets (idempotent).
  void shutdown();

  std::shared_ptr<SendState> post_send(OpKind op, int peer, int tag, core::Tensor tensor);
  std::shared_ptr<RecvState> post_recv(OpKind op, int peer, int tag, int forward_peer = -1);
  // Drops an abandoned receive; a message it already holds goes back to
  // the front of its mailbox.
  void withdraw(const std::shared_ptr<RecvState>& state);

  bool peer_alive(int peer);
  CommStats stats();
  void reset_stats();
  void add_blocked(double seconds);
  void record_op(OpKind op, double seconds, bool ok);

 private:
  // I/O thread.
  void run();
  // One poll of every socket: incoming frames, ZAP requests, events.
  void poll_once(int timeout_ms);
  void arm_timer(Clock::time_point at);
  void take_inbox(Clock::time_point now);
  void enqueue(Outgoing o, Clock::time_point now);
  bool try_send(PeerLink& link, Outgoing& o);
  void flush_queues(Clock::time_point now);
  bool receive_one();
  void accept_frame(int src, const FrameHeader& h, zmq::message_t* payload);
  void reject(RejectReason r);
  // Accounting of mailbox bytes (callers hold mu_ for the first two).
  void note_buffered(int peer, int64_t delta);
  bool over_unmatched_cap(int peer, uint64_t cost) const;
  // An Outgoing that sends a received tensor on, for RecvState::forward_peer.
  static Outgoing forward_of(const RecvState& st, const core::Tensor& t);
  void handle_zap();
  void handle_monitor(int peer);
  void check_suspects(Clock::time_point now);
  // graceful: the peer said goodbye, so only receives from it fail. A lost
  // connection also aborts every pending collective receive: the
  // collectives need every rank, and waiting on a live rank that is itself
  // stuck behind the dead one would only end at the timeout.
  void lose_peer(int peer, const std::string& reason, bool graceful);
  void finish_close();
  void wake();

  GroupOptions options_;
  const int rank_;
  const int world_;
  const uint64_t group_;
  const bool secure_;
  const bool inproc_;
  FrameLimits limits_;
  uint8_t cluster_public_[32] = {};

  std::shared_ptr<zmq::context_t> ctx_;
  bool owns_ctx_ = false;
  bool took_bind_fd_ = false;
  std::unique_ptr<zmq::socket_t> router_;
  std::unique_ptr<zmq::socket_t> zap_;
  std::vector<PeerLink> links_;
  int wake_fd_ = -1;
  int timer_fd_ = -1;  // wakes run() when the next paced message is due
  std::vector<zmq_pollitem_t> poll_items_;
  std::vector<int> poll_monitor_peer_;
  std::thread thread_;
  std::atomic<bool> thread_running_{false};
  Clock::time_point close_deadline_{};

  // Shared with user threads.
  std::mutex mu_;
  std::condition_variable formed_cv_;
  std::vector<Outgoing> inbox_;
  std::map<MailKey, Mailbox> mailboxes_;
  std::vector<PeerStatus> peers_;
  std::vector<uint64_t> unmatched_per_peer_;  // bytes waiting in mailboxes, by sender
  uint64_t unmatched_total_ = 0;
  bool closing_ = false;
  bool closed_ = false;
  std::string fatal_;   // I/O thread died: every operation fails with this
  std::string broken_;  // a peer was lost abruptly: collectives fail with this

  std::mutex stats_mu_;
  CommStats stats_;

  std::mutex shutdown_mu_;  // serialises shutdown() callers
};

}  // namespace tessera::comm::detail
