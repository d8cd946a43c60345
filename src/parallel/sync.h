// The communication steps a strategy needs, injected into the executor:
// real ranks use comm collectives (comm_sync.h), tests use LocalGroup
// (threads in one process, no network).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

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

// Galaxy's tile callbacks (§III-D). A TileFn receives one part of an
// allgather (its owner rank and counts[owner] rows); a PartialFn writes this
// rank's partial sum of part `dest` (counts[dest] rows) into `out`.
using TileFn = std::function<void(int owner, const float* rows, int64_t count)>;
using PartialFn = std::function<void(int dest, float* out)>;

class Synchronizer {
 public:
  virtual ~Synchronizer() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;

  // Each rank contributes counts[rank] rows of `cols` floats (`mine`); all
  // ranks receive every row in rank order in `all`.
  virtual core::Status allgather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all) = 0;
  // As allgather_rows, but only `root` receives (`all` may be null elsewhere).
  virtual core::Status gather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all,
                                   int root) = 0;
  // `root` holds every row in `all`; each rank receives its counts[rank] rows.
  virtual core::Status scatter_rows(const float* all, const std::vector<int64_t>& counts, int64_t cols, float* mine,
                                    int root) = 0;
  // Every rank holds a full [sum(counts), cols] partial in `full`; rank r
  // receives the sum over ranks of its counts[r] rows in `mine`.
  virtual core::Status reduce_scatter_rows(const float* full, const std::vector<int64_t>& counts, int64_t cols,
                                           float* mine) = 0;
  // Overlapped forms (Galaxy's ring tiles): the callback runs on each tile
  // while the next one travels. The defaults have nothing to overlap with and
  // run the plain forms below; transports that can overlap override them.
  virtual core::Status allgather_rows_overlapped(const float* mine, const std::vector<int64_t>& counts, int64_t cols,
                                                 const TileFn& on_tile);
  virtual core::Status reduce_scatter_rows_overlapped(const std::vector<int64_t>& counts, int64_t cols,
                                                      const PartialFn& partial, float* mine);
  // `root` holds every row in `all` (part q: counts[q] rows); every rank
  // receives them into `all`, each part handed to `on_tile` as it arrives,
  // the rank's own part first (Voltage's first distribution: a device starts
  // on its own rows while the others travel).
  virtual core::Status broadcast_rows_overlapped(float* all, const std::vector<int64_t>& counts, int64_t cols, int root,
                                                 const TileFn& on_tile);
  // Called from a TileFn of allgather_rows_overlapped or
  // broadcast_rows_overlapped: whether the next tile has already arrived (or
  // none is left), so work could be put off without waiting for it. The plain
  // forms hold every tile before the first callback: always true.
  virtual bool next_tile_ready() const { return true; }
  // Plain forms: the whole collective, then every tile (allgather); every
  // partial, then the whole collective (reduce-scatter).
  core::Status allgather_rows_then_tiles(const float* mine, const std::vector<int64_t>& counts, int64_t cols,
                                         const TileFn& on_tile);
  core::Status broadcast_rows_then_tiles(float* all, const std::vector<int64_t>& counts, int64_t cols, int root,
                                         const TileFn& on_tile);
  core::Status partials_then_reduce_scatter(const std::vector<int64_t>& counts, int64_t cols, const PartialFn& partial,
                                            float* mine);
  // Element-wise sum over ranks, result everywhere.
  virtual core::Status allreduce_sum(float* data, int64_t n) = 0;
  virtual core::Status broadcast(float* data, int64_t n, int root) = 0;
  virtual core::Status send(int peer, const float* data, int64_t n) = 0;
  virtual core::Status recv(int peer, float* data, int64_t n) = 0;

  const SyncStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  SyncStats stats_;
};

// Part order of broadcast_rows_overlapped at `rank`: its own part, then the
// others in rank order.
std::vector<int> own_part_first(int rank, int world);

// Elements a rank sends in the ring algorithms the comm layer uses; shared
// by every Synchronizer so the accounting is the same in tests and on wire.
int64_t ring_allgather_sent(const std::vector<int64_t>& counts, int64_t cols, int rank);
int64_t ring_allreduce_sent(int64_t n, int world, int rank);
int64_t ring_reduce_scatter_sent(const std::vector<int64_t>& counts, int64_t cols, int rank);

}  // namespace tessera::parallel
