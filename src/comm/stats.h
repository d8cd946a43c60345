// Communication accounting: bytes and messages per peer and per operation
// kind, time callers spent blocked, and rejected frames. Byte counts are
// payload bytes (tensor data); headers and control frames are counted apart
// in control_bytes_* so that the payload figures match the algorithms' cost
// formulas exactly.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "comm/wire.h"

namespace tessera::comm {

struct TrafficCounters {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
};

struct OpStats {
  TrafficCounters traffic;
  uint64_t calls = 0;     // collective calls (p2p: completed waits)
  uint64_t failures = 0;  // calls that returned an error
  double seconds = 0;     // wall time inside the calls
};

struct CommStats {
  int rank = 0;
  int world = 1;
  TrafficCounters total;
  std::vector<TrafficCounters> per_peer;       // indexed by peer rank
  std::array<OpStats, kOpKindCount> per_op{};  // indexed by OpKind
  double blocked_seconds = 0;                  // time in wait()/blocking calls
  uint64_t control_bytes_sent = 0;             // headers and control frames
  uint64_t control_bytes_received = 0;
  uint64_t frames_rejected = 0;
  std::array<uint64_t, kRejectReasonCount> rejected_by_reason{};
  uint64_t auth_rejections = 0;     // clients refused by the key check
  uint64_t handshake_failures = 0;  // our connections that failed to authenticate
  uint64_t peers_lost = 0;
  // Messages waiting for a receive (payload plus bookkeeping bytes): now,
  // the most at any time, and what was dropped over the caps. These cover
  // the group's whole life (reset_stats keeps them).
  uint64_t unmatched_bytes = 0;
  uint64_t unmatched_bytes_peak = 0;
  uint64_t unmatched_frames_dropped = 0;
  uint64_t unmatched_bytes_dropped = 0;

  const OpStats& op(OpKind k) const { return per_op[static_cast<size_t>(k)]; }
  OpStats& op(OpKind k) { return per_op[static_cast<size_t>(k)]; }
};

nlohmann::json stats_to_json(const CommStats& stats);

}  // namespace tessera::comm
