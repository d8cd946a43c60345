// The Synchronizer over a real comm::Group (ZeroMQ, possibly paced links).
// It lives in runtime/ so that parallel/ never links the transport.
#pragma once

#include <chrono>

#include "comm/group.h"
#include "parallel/sync.h"

namespace tessera::runtime {

class CommSynchronizer final : public parallel::Synchronizer {
 public:
  CommSynchronizer(comm::Group& group, std::chrono::milliseconds timeout) : group_(group), timeout_(timeout) {}
  int rank() const override { return group_.rank(); }
  int world() const override { return group_.size(); }

  core::Status allgather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                              std::span<float> all) override;
  core::Status gather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                           std::span<float> all, int root) override;
  core::Status scatter_rows(std::span<const float> all, const std::vector<int64_t>& counts, int64_t cols,
                            std::span<float> mine, int root) override;
  core::Status reduce_scatter_rows(std::span<const float> full, const std::vector<int64_t>& counts, int64_t cols,
                                   std::span<float> mine) override;
  core::Status allreduce_sum(std::span<float> data) override;
  core::Status broadcast(std::span<float> data, int root) override;
  core::Status send(int peer, std::span<const float> data) override;
  core::Status recv(int peer, std::span<float> data) override;
  // Ring tiles: a tile is handed over as it arrives while the next travels
  // (Galaxy §III-D); the broadcast's parts go root -> rank directly, each
  // rank's own part first, received in place.
  core::Result<std::unique_ptr<parallel::TileStream>> allgather_tiles(std::span<const float> mine,
                                                                      const std::vector<int64_t>& counts,
                                                                      int64_t cols, int stream = 0) override;
  core::Result<std::unique_ptr<parallel::TileStream>> scatter_tiles(std::span<const float> all,
                                                                    const std::vector<int64_t>& counts, int64_t cols,
                                                                    std::span<float> mine, int root,
                                                                    int64_t piece_rows) override;
  core::Result<std::unique_ptr<parallel::TileStream>> broadcast_tiles(std::span<float> all,
                                                                      const std::vector<int64_t>& counts, int64_t cols,
                                                                      int root) override;
  core::Result<std::unique_ptr<parallel::PartialStream>> reduce_scatter_parts(const std::vector<int64_t>& counts,
                                                                              int64_t cols,
                                                                              std::span<float> mine) override;

  comm::Group& group() { return group_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  parallel::SyncStats& mutable_stats() { return stats_; }

 private:
  comm::Group& group_;
  std::chrono::milliseconds timeout_;
};

// The comm layer's operation kind that carries each collective's bytes, so
// that an estimate can be compared with comm::CommStats.
comm::OpKind comm_op_of(parallel::CollectiveKind kind);

}  // namespace tessera::runtime
