// The communication steps a strategy needs, injected into its run(): real
// ranks use the comm layer (runtime/comm_sync.h), tests use LocalGroup
// (threads in one process, no network). Buffers are spans whose sizes are
// checked against the row counts.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/wire_format.h"

namespace tessera::parallel {

enum class CollectiveKind { kAllgather = 0, kAllreduce, kReduceScatter, kBroadcast, kGather, kScatter, kSendRecv, kCount };
const char* collective_name(CollectiveKind kind);

// Elements this rank sent and time it spent blocked, per collective kind.
struct SyncStats {
  std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> elements_sent{};
  std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> calls{};
  double blocked_ms = 0.0;
  int64_t total_elements() const;
  void add(CollectiveKind kind, int64_t elements);
};

inline std::span<float> floats(float* p, int64_t n) { return {p, static_cast<size_t>(n > 0 ? n : 0)}; }
inline std::span<const float> floats(const float* p, int64_t n) { return {p, static_cast<size_t>(n > 0 ? n : 0)}; }

// One part of an AllGather or a broadcast: `count` rows of the rank `owner`.
// The rows stay valid until the stream's next call.
struct Tile {
  int owner = 0;
  int64_t count = 0;
  std::span<const float> rows;
};

// The parts of an AllGather or a broadcast, handed over as each can be used,
// so a strategy computes on one part while the next travels (Galaxy's ring
// tiles, Voltage's blocks of rows).
class TileStream {
 public:
  virtual ~TileStream() = default;
  // The next part; waits (within the timeout) until it is in.
  [[nodiscard]] virtual core::Result<Tile> next() = 0;
  // Whether next() would return without waiting (or no part is left).
  virtual bool ready() const = 0;
  virtual bool done() const = 0;
  // After the last part: waits until this rank's own sends have left.
  [[nodiscard]] virtual core::Status finish() = 0;
};

// A ReduceScatter fed one destination part at a time: next() names the part
// to compute and a zeroed buffer for this rank's partial sum of it, submit()
// passes it on. finish() leaves the sum of this rank's part in `mine`.
struct PartialSlot {
  int dest = 0;
  std::span<float> out;
};
class PartialStream {
 public:
  virtual ~PartialStream() = default;
  [[nodiscard]] virtual core::Result<PartialSlot> next() = 0;
  [[nodiscard]] virtual core::Status submit() = 0;
  virtual bool done() const = 0;
  [[nodiscard]] virtual core::Status finish() = 0;
};

inline constexpr int kMaxTileStreams = 8;

class Synchronizer {
 public:
  virtual ~Synchronizer() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Each rank contributes counts[rank] rows of `cols` floats (`mine`); all
  // ranks receive every row in rank order in `all`.
  [[nodiscard]] virtual core::Status allgather_rows(std::span<const float> mine, const std::vector<int64_t>& counts,
                                                    int64_t cols, std::span<float> all) = 0;
  // As allgather_rows, but only `root` receives (`all` may be empty elsewhere).
  [[nodiscard]] virtual core::Status gather_rows(std::span<const float> mine, const std::vector<int64_t>& counts,
                                                 int64_t cols, std::span<float> all, int root) = 0;
  // `root` holds every row in `all`; each rank receives its counts[rank] rows.
  [[nodiscard]] virtual core::Status scatter_rows(std::span<const float> all, const std::vector<int64_t>& counts,
                                                  int64_t cols, std::span<float> mine, int root) = 0;
  // Every rank holds a full [sum(counts), cols] partial in `full`; rank r
  // receives the sum over ranks of its counts[r] rows in `mine`.
  [[nodiscard]] virtual core::Status reduce_scatter_rows(std::span<const float> full, const std::vector<int64_t>& counts,
                                                         int64_t cols, std::span<float> mine) = 0;
  // Element-wise sum over ranks, result everywhere.
  [[nodiscard]] virtual core::Status allreduce_sum(std::span<float> data) = 0;
  [[nodiscard]] virtual core::Status broadcast(std::span<float> data, int root) = 0;
  [[nodiscard]] virtual core::Status send(int peer, std::span<const float> data) = 0;
  [[nodiscard]] virtual core::Status recv(int peer, std::span<float> data) = 0;

  // Streaming forms. The AllGather's parts come in ring order (this rank's
  // own first, then its left neighbours'); the broadcast's parts are received
  // into `all` in place, this rank's own part first. The defaults run the
  // whole collective first (nothing to overlap with); transports that can
  // overlap override them. The *_whole forms always run it first (a
  // strategy's --no-overlap).
  // Several AllGathers may be in flight at once when each has its own
  // `stream` in [0, kMaxTileStreams): a stream's collectives keep their order
  // on every rank, so their messages never cross.
  [[nodiscard]] virtual core::Result<std::unique_ptr<TileStream>> allgather_tiles(std::span<const float> mine,
                                                                                  const std::vector<int64_t>& counts,
                                                                                  int64_t cols, int stream = 0);
  // As scatter_rows, but this rank's rows come as pieces of at most
  // `piece_rows` rows, each its own message, so work on the first can start
  // while the rest travel. Tile i is this rank's i-th piece (owner: this
  // rank), in `mine`. The root's sends go out at once; its finish() waits
  // for them.
  [[nodiscard]] virtual core::Result<std::unique_ptr<TileStream>> scatter_tiles(std::span<const float> all,
                                                                                const std::vector<int64_t>& counts,
                                                                                int64_t cols, std::span<float> mine,
                                                                                int root, int64_t piece_rows);
  [[nodiscard]] virtual core::Result<std::unique_ptr<TileStream>> broadcast_tiles(std::span<float> all,
                                                                                  const std::vector<int64_t>& counts,
                                                                                  int64_t cols, int root);
  [[nodiscard]] virtual core::Result<std::unique_ptr<PartialStream>> reduce_scatter_parts(
      const std::vector<int64_t>& counts, int64_t cols, std::span<float> mine);
  [[nodiscard]] core::Result<std::unique_ptr<TileStream>> allgather_tiles_whole(std::span<const float> mine,
                                                                               const std::vector<int64_t>& counts,
                                                                               int64_t cols);
  [[nodiscard]] core::Result<std::unique_ptr<TileStream>> broadcast_tiles_whole(std::span<float> all,
                                                                               const std::vector<int64_t>& counts,
                                                                               int64_t cols, int root);
  [[nodiscard]] core::Result<std::unique_ptr<PartialStream>> reduce_scatter_parts_whole(
      const std::vector<int64_t>& counts, int64_t cols, std::span<float> mine);

  const SyncStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  // How activations travel (Plan::wire, the same on every rank): each part is
  // encoded by its sender and decoded by its receivers; the outputs every
  // rank shares (AllGather, AllReduce, broadcast) hold the decoded values on
  // the sender too, so the ranks never drift apart. Sums stay in F32.
  core::WireType wire() const { return wire_; }
  void set_wire(core::WireType wire) { wire_ = wire; }

 protected:
  // Checks a collective's arguments: one count per rank, none negative, and
  // each span at least as long as the rows it must hold (0 = not checked).
  core::Status check_rows(const std::vector<int64_t>& counts, int64_t cols, size_t mine_floats, size_t all_floats,
                          bool check_all) const;
  SyncStats stats_;
  core::WireType wire_ = core::WireType::kF32;
};

// The pieces scatter_tiles cuts `rows` into: piece_rows each, the last
// shorter (none for no rows).
std::vector<int64_t> piece_counts(int64_t rows, int64_t piece_rows);
// Part order of broadcast_tiles at `rank`: its own part, then the others in
// rank order.
std::vector<int> own_part_first(int rank, int world);
// Part order of allgather_tiles at `rank`: the ring's, own part first, then
// rank - 1, rank - 2, ... (mod world).
std::vector<int> ring_order(int rank, int world);

// Elements a rank sends in the ring algorithms the comm layer uses; shared
// by every Synchronizer so the accounting is the same in tests and on wire.
int64_t ring_allgather_sent(const std::vector<int64_t>& counts, int64_t cols, int rank);
int64_t ring_allreduce_sent(int64_t n, int world, int rank);
int64_t ring_reduce_scatter_sent(const std::vector<int64_t>& counts, int64_t cols, int rank);
// The comm layer's broadcast is a binomial tree: a rank sends n to each child.
int64_t tree_broadcast_sent(int64_t n, int world, int rank, int root);

}  // namespace tessera::parallel
