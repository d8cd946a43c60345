// Link emulation without root: per-link bandwidth and latency, applied on the
// sending side. A link is modelled as a serialising pipe: a message occupies
// the link for bytes*8/bandwidth seconds after the previous one left (a token
// bucket that may go into debt, with a configurable burst), and is handed to
// ZeroMQ `latency` after its last bit left, so its delivery is delayed by the
// latency without blocking later messages.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tessera::comm {

struct LinkSpec {
  double bandwidth_bps = 0;  // bits per second; 0 = unpaced
  double latency_s = 0;
  double burst_bytes = 0;    // what an idle link sends at once (tc tbf's burst); 0 = the group's default
  bool paced() const { return bandwidth_bps > 0 || latency_s > 0; }
};

// "500mbit,2ms", "100mbit", "2ms", "1.5gbit,250us", "100mbit,64kb".
// Bandwidth units: bit, kbit, mbit, gbit (decimal, per second); latency
// units: s, ms, us; burst units as tc's: b, kb, mb (bytes, 1024-based), only
// with a bandwidth.
core::Result<LinkSpec> parse_link_spec(std::string_view text);

// K x K links; entry [i][j] is the link from rank i to rank j.
class LinkMatrix {
 public:
  LinkMatrix() = default;
  static LinkMatrix uniform(int world, LinkSpec spec);
  // JSON {"bandwidth_bps": [[...]], "latency_ms": [[...]]}; either key may be
  // missing (unpaced / zero latency). Diagonal entries are ignored.
  static core::Result<LinkMatrix> from_json(const std::string& json_text, int world);
  static core::Result<LinkMatrix> load(const std::string& path, int world);
  // A spec string, or "@path" / a path ending in .json for a matrix file.
  static core::Result<LinkMatrix> from_arg(const std::string& arg, int world);

  bool empty() const { return links_.empty(); }
  int world() const { return world_; }
  LinkSpec link(int from, int to) const;

 private:
  int world_ = 0;
  std::vector<LinkSpec> links_;  // row-major world x world
};

// Pacing state of one directed link, owned by the sending rank's I/O thread.
class LinkPacer {
 public:
  using Clock = std::chrono::steady_clock;
  LinkPacer() = default;
  LinkPacer(LinkSpec spec, size_t burst_bytes) : spec_(spec), burst_bytes_(burst_bytes) {}

  // When a message of `bytes` posted at `now` may be handed to the socket.
  // Calls must come in posting order; the returned times never decrease.
  Clock::time_point schedule(size_t bytes, Clock::time_point now);

 private:
  LinkSpec spec_;
  size_t burst_bytes_ = 0;
  Clock::time_point free_at_{};       // when the link finishes its backlog
  Clock::time_point last_release_{};  // keeps per-link FIFO order
};

}  // namespace tessera::comm
