// The I/O thread's receiving side: frame validation and delivery, ZAP key
// checks, connection events, peer loss and the final close.
#include <algorithm>
#include <cstring>
#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include "comm/group_core.h"

namespace tessera::comm::detail {

namespace {
constexpr std::chrono::milliseconds kByeWait{250};
}

bool GroupCore::receive_one() {
  // [routing id][header] or [routing id][header][payload]; anything longer
  // is read to its end and thrown away.
  zmq::message_t frames[3];
  size_t count = 0;
  for (bool more = true; more;) {
    zmq::message_t m;
    if (!router_->recv(m, zmq::recv_flags::dontwait)) {
      if (count == 0) return false;
      break;  // cannot happen with atomic multipart delivery; be safe
    }
    more = m.more();
    if (count < 3) frames[count] = std::move(m);
    ++count;
  }
  if (count < 2 || count > 3) {
    reject(RejectReason::kFrameCount);
    return true;
  }
  const DecodeResult d = decode_header(frames[1].data(), frames[1].size(), limits_);
  if (!d.ok) {
    reject(d.reason);
    return true;
  }
  const FrameHeader& h = d.header;
  if (rank_from_routing_id(frames[0].data(), frames[0].size()) != static_cast<int>(h.src)) {
    reject(RejectReason::kRank);
    return true;
  }
  const bool is_data = h.kind == FrameKind::kData;
  if (is_data != (count == 3)) {
    reject(RejectReason::kFrameCount);
    return true;
  }
  if (is_data && frames[2].size() != h.nbytes) {
    reject(RejectReason::kPayload);
    return true;
  }
  accept_frame(static_cast<int>(h.src), h, is_data ? &frames[2] : nullptr);
  return true;
}

void GroupCore::reject(RejectReason r) {
  spdlog::debug("comm rank {}: rejected a frame ({})", rank_, reject_reason_name(r));
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.frames_rejected;
  ++stats_.rejected_by_reason[static_cast<size_t>(r)];
}

bool GroupCore::over_unmatched_cap(int peer, uint64_t cost) const {
  return unmatched_per_peer_[static_cast<size_t>(peer)] + cost > options_.max_unmatched_bytes_per_peer ||
         unmatched_total_ + cost > options_.max_unmatched_bytes;
}

void GroupCore::note_buffered(int peer, int64_t delta) {
  unmatched_per_peer_[static_cast<size_t>(peer)] += static_cast<uint64_t>(delta);
  unmatched_total_ += static_cast<uint64_t>(delta);
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.unmatched_bytes = unmatched_total_;
  stats_.unmatched_bytes_peak = std::max(stats_.unmatched_bytes_peak, unmatched_total_);
}

void GroupCore::accept_frame(int src, const FrameHeader& h, zmq::message_t* payload) {
  PeerLink& l = links_[src];
  if (l.lost) {
    reject(RejectReason::kUnexpected);
    return;
  }
  switch (h.kind) {
    case FrameKind::kHello: {
      if (l.hello_seen) {
        reject(RejectReason::kUnexpected);
        return;
      }
      l.hello_seen = true;
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.control_bytes_received += kHeaderSize;
      }
      std::lock_guard<std::mutex> lock(mu_);
      peers_[src].hello = true;
      formed_cv_.notify_all();
      return;
    }
    case FrameKind::kBye: {
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.control_bytes_received += kHeaderSize;
      }
      // Everything the peer sent came before its goodbye on this connection.
      lose_peer(src, "rank " + std::to_string(src) + " left the group", true);
      return;
    }
    case FrameKind::kData:
      break;
  }
  if (!l.hello_seen) {
    reject(RejectReason::kUnexpected);
    return;
  }

  core::Tensor t;
  if (h.nbytes == 0) {
    t = core::Tensor::zeros(h.dtype, h.shape);
  } else {
    // Zero copy when the bytes are suitably aligned for the element type;
    // libzmq may place small messages at odd offsets, which we copy.
    auto holder = std::make_shared<zmq::message_t>(std::move(*payload));
    void* data = holder->data();
    if (reinterpret_cast<uintptr_t>(data) % core::dtype_size(h.dtype) == 0) {
      t = core::Tensor::borrow(h.dtype, h.shape, data, std::move(holder));
    } else {
      t = core::Tensor::zeros(h.dtype, h.shape);
      std::memcpy(t.raw(), data, h.nbytes);
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.control_bytes_received += kHeaderSize;
    for (TrafficCounters* c : {&stats_.total, &stats_.per_peer[src], &stats_.op(h.op).traffic}) {
      c->bytes_received += h.nbytes;
      ++c->messages_received;
    }
  }
  std::shared_ptr<RecvState> matched;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Mailbox& box = mailboxes_[MailKey{src, h.op, h.tag}];
    if (box.posted.empty()) {
      const uint64_t cost = buffered_cost(t);
      if (!over_unmatched_cap(src, cost)) {
        box.unexpected.push_back(std::move(t));
        note_buffered(src, static_cast<int64_t>(cost));
        return;
      }
      if (box.unexpected.empty()) mailboxes_.erase(MailKey{src, h.op, h.tag});
    } else {
      matched = std::move(box.posted.front());
      box.posted.pop_front();
    }
  }
  if (!matched) {
    uint64_t dropped = 0;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      dropped = ++stats_.unmatched_frames_dropped;
      stats_.unmatched_bytes_dropped += h.nbytes + kMailboxOverhead;
    }
    // Powers of two only: a flood must not flood the log too.
    if ((dropped & (dropped - 1)) == 0)
      spdlog::warn("comm rank {}: dropped a message from rank {} on tag {} nobody receives: over the cap of {} buffered "
                   "bytes per peer / {} per group ({} dropped so far)",
                   rank_, src, h.tag, options_.max_unmatched_bytes_per_peer, options_.max_unmatched_bytes, dropped);
    return;
  }
  // Forward first: the next hop should not wait for the local consumer.
  // Sends posted before this receive go out before the forward (per-link
  // FIFO is what keeps the receiver's mailbox in order).
  if (matched->forward_peer >= 0) {
    const Clock::time_point now = Clock::now();
    take_inbox(now);
    enqueue(forward_of(*matched, t), now);
  }
  matched->complete_with(std::move(t));
}

void GroupCore::handle_zap() {
  for (;;) {
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(*zap_, std::back_inserter(req), zmq::recv_flags::dontwait)) return;
    // RFC 27: version, request id, domain, address, identity, mechanism,
    // credentials. For CURVE the credential is the client's public key,
    // which the handshake has proven the client holds the secret for.
    bool ok = req.size() >= 7 && req[5].to_string_view() == "CURVE" && req[6].size() == 32 &&
              std::memcmp(req[6].data(), cluster_public_, 32) == 0;
    uint64_t refused = 0;
    if (!ok) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      refused = ++stats_.auth_rejections;
    }
    const std::string request_id = req.size() >= 2 ? req[1].to_string() : std::string();
    zap_->send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(std::string(ok ? "200" : "400")), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(std::string(ok ? "OK" : "not the cluster key")), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    zap_->send(zmq::str_buffer(""), zmq::send_flags::none);
    // Powers of two only: a client retrying forever must not flood the log.
    if (!ok && (refused & (refused - 1)) == 0) {
      spdlog::warn("comm rank {}: refused a connection that does not hold the cluster key ({} so far)", rank_, refused);
    }
  }
}

void GroupCore::handle_monitor(int peer) {
  PeerLink& l = links_[peer];
  for (;;) {
    zmq::message_t ev;
    if (!l.monitor->recv(ev, zmq::recv_flags::dontwait)) return;
    while (ev.more()) {  // the endpoint frame
      zmq::message_t rest;
      if (!l.monitor->recv(rest, zmq::recv_flags::dontwait)) break;
      if (!rest.more()) break;
    }
    if (ev.size() < 6) continue;
    uint16_t event;
    std::memcpy(&event, ev.data(), sizeof(event));
    switch (event) {
      case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        l.handshake_ok = true;
        break;
      case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: {
        {
          std::lock_guard<std::mutex> lock(stats_mu_);
          ++stats_.handshake_failures;
        }
        std::lock_guard<std::mutex> lock(mu_);
        peers_[peer].handshake_failed = true;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) peers_[peer].auth_rejected = true;
        formed_cv_.notify_all();
        break;
      }
      case ZMQ_EVENT_DISCONNECTED:
        // Before the peer joined, libzmq just retries; after, a dropped
        // connection is a lost peer (libzmq could reconnect, but a message
        // cut in half would be lost silently).
        if (l.handshake_ok && l.hello_seen && !l.lost && !l.suspect) {
          l.suspect = true;
          l.suspect_deadline = Clock::now() + options_.loss_grace;
        }
        l.handshake_ok = false;
        break;
      default:
        break;
    }
  }
}

void GroupCore::check_suspects(Clock::time_point now) {
  for (int j = 0; j < world_; ++j) {
    PeerLink& l = links_[j];
    if (l.suspect && !l.lost && now >= l.suspect_deadline) {
      lose_peer(j, "connection to rank " + std::to_string(j) + " lost (process died or stopped answering heartbeats)", false);
    }
  }
}

void GroupCore::lose_peer(int peer, const std::string& reason, bool graceful) {
  PeerLink& l = links_[peer];
  if (l.lost) return;
  l.lost = true;
  l.suspect = false;
  if (graceful) spdlog::debug("comm rank {}: {}", rank_, reason);
  else spdlog::warn("comm rank {}: {}", rank_, reason);
  for (auto& o : l.queue) {
    if (o.state) o.state->complete(core::network_error(reason));
  }
  l.queue.clear();
  try {
    if (l.dealer) l.dealer->set(zmq::sockopt::linger, 0);
  } catch (const zmq::error_t&) {
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.peers_lost;
  }
  std::lock_guard<std::mutex> lock(mu_);
  peers_[peer].lost = true;
  peers_[peer].reason = reason;
  if (!graceful && broken_.empty()) broken_ = "collective aborted: " + reason;
  for (auto& [key, box] : mailboxes_) {
    const bool aborted = !graceful && key.op != OpKind::kP2P;
    if (key.peer != peer && !aborted) continue;
    for (auto& st : box.posted) st->fail(core::network_error(key.peer == peer ? reason : broken_));
    box.posted.clear();
  }
  formed_cv_.notify_all();
}

void GroupCore::finish_close() {
  for (int j = 0; j < world_; ++j) {
    PeerLink& l = links_[j];
    if (!l.dealer) continue;
    for (auto& o : l.queue) {
      if (o.state) o.state->complete(core::network_error("group closed before the message could be sent"));
    }
    l.queue.clear();
    if (!l.lost) {
      Outgoing bye;
      bye.kind = FrameKind::kBye;
      bye.peer = j;
      try_send(l, bye);
    }
  }
  // Peers that are leaving too will say goodbye in a moment. Waiting briefly
  // for that lets us drop what we still hold for them (linger 0) instead of
  // lingering on a socket nobody reads; peers that stay read our last bytes
  // quickly, so their linger costs nothing. (inproc has no linger to save.)
  const auto bye_deadline = inproc_ ? Clock::now() : std::min(close_deadline_, Clock::now() + kByeWait);
  auto all_gone = [this] {
    for (int j = 0; j < world_; ++j) {
      if (j != rank_ && !links_[j].lost && !links_[j].suspect) return false;
    }
    return true;
  };
  while (!all_gone() && Clock::now() < bye_deadline) {
    try {
      poll_once(5);
    } catch (const zmq::error_t&) {
      break;
    }
  }
  const Clock::time_point now = Clock::now();
  for (int j = 0; j < world_; ++j) {
    PeerLink& l = links_[j];
    if (!l.dealer) continue;
    int linger = 0;
    if (!l.lost && !l.suspect) {
      // Give queued bytes time to leave, but never wait on a dead peer.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(close_deadline_ - now).count();
      linger = static_cast<int>(std::clamp<int64_t>(left, 100, 60000));
    }
    try {
      l.dealer->set(zmq::sockopt::linger, linger);
      if (l.monitor) zmq_socket_monitor(l.dealer->handle(), nullptr, 0);
    } catch (const zmq::error_t&) {
    }
    l.monitor.reset();
    l.dealer.reset();
  }
  router_.reset();
  zap_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (auto& [key, box] : mailboxes_) {
    for (auto& st : box.posted) st->fail(core::network_error("group is closed"));
    box.posted.clear();
  }
}

}  // namespace tessera::comm::detail
