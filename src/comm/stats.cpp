#include "comm/stats.h"

#include <nlohmann/json.hpp>

namespace tessera::comm {

namespace {
nlohmann::json traffic_json(const TrafficCounters& t) {
  return {{"bytes_sent", t.bytes_sent},
          {"bytes_received", t.bytes_received},
          {"messages_sent", t.messages_sent},
          {"messages_received", t.messages_received}};
}
}  // namespace

nlohmann::json stats_to_json(const CommStats& s) {
  nlohmann::json j;
  j["rank"] = s.rank;
  j["world"] = s.world;
  j["total"] = traffic_json(s.total);
  nlohmann::json peers = nlohmann::json::array();
  for (size_t p = 0; p < s.per_peer.size(); ++p) {
    nlohmann::json e = traffic_json(s.per_peer[p]);
    e["peer"] = p;
    peers.push_back(std::move(e));
  }
  j["per_peer"] = std::move(peers);
  nlohmann::json ops = nlohmann::json::object();
  for (int k = 0; k < kOpKindCount; ++k) {
    const OpStats& o = s.per_op[static_cast<size_t>(k)];
    if (o.calls == 0 && o.traffic.messages_sent == 0 && o.traffic.messages_received == 0) continue;
    nlohmann::json e = traffic_json(o.traffic);
    e["calls"] = o.calls;
    e["failures"] = o.failures;
    e["seconds"] = o.seconds;
    ops[op_name(static_cast<OpKind>(k))] = std::move(e);
  }
  j["per_op"] = std::move(ops);
  j["blocked_seconds"] = s.blocked_seconds;
  j["control_bytes_sent"] = s.control_bytes_sent;
  j["control_bytes_received"] = s.control_bytes_received;
  nlohmann::json rej = nlohmann::json::object();
  for (int r = 0; r < kRejectReasonCount; ++r) {
    if (s.rejected_by_reason[static_cast<size_t>(r)] != 0) {
      rej[reject_reason_name(static_cast<RejectReason>(r))] = s.rejected_by_reason[static_cast<size_t>(r)];
    }
  }
  j["frames_rejected"] = s.frames_rejected;
  j["rejected_by_reason"] = std::move(rej);
  j["auth_rejections"] = s.auth_rejections;
  j["handshake_failures"] = s.handshake_failures;
  j["peers_lost"] = s.peers_lost;
  j["unmatched_bytes"] = s.unmatched_bytes;
  j["unmatched_bytes_peak"] = s.unmatched_bytes_peak;
  j["unmatched_frames_dropped"] = s.unmatched_frames_dropped;
  j["unmatched_bytes_dropped"] = s.unmatched_bytes_dropped;
  return j;
}

}  // namespace tessera::comm
