// The Synchronizer over a real comm::Group (ZeroMQ, possibly paced links).
#pragma once

#include <chrono>
#include <functional>

#include "comm/group.h"
#include "parallel/sync.h"

namespace tessera::parallel {

class CommSynchronizer final : public Synchronizer {
 public:
  CommSynchronizer(comm::Group& group, std::chrono::milliseconds timeout) : group_(group), timeout_(timeout) {}
  int rank() const override { return group_.rank(); }
  int world() const override { return group_.size(); }

  core::Status allgather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all) override;
  core::Status gather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all,
                           int root) override;
  core::Status scatter_rows(const float* all, const std::vector<int64_t>& counts, int64_t cols, float* mine,
                            int root) override;
  core::Status reduce_scatter_rows(const float* full, const std::vector<int64_t>& counts, int64_t cols,
                                   float* mine) override;
  // Ring tiles: compute on one tile while the next travels (Galaxy §III-D).
  core::Status allgather_rows_overlapped(const float* mine, const std::vector<int64_t>& counts, int64_t cols,
                                         const TileFn& on_tile) override;
  core::Status reduce_scatter_rows_overlapped(const std::vector<int64_t>& counts, int64_t cols, const PartialFn& partial,
                                              float* mine) override;
  // Root sends each part to each rank as its own message, the rank's part first.
  core::Status broadcast_rows_overlapped(float* all, const std::vector<int64_t>& counts, int64_t cols, int root,
                                         const TileFn& on_tile) override;
  bool next_tile_ready() const override { return !next_ready_ || next_ready_(); }
  core::Status allreduce_sum(float* data, int64_t n) override;
  core::Status broadcast(float* data, int64_t n, int root) override;
  core::Status send(int peer, const float* data, int64_t n) override;
  core::Status recv(int peer, float* data, int64_t n) override;

 private:
  comm::Group& group_;
  std::chrono::milliseconds timeout_;
  std::function<bool()> next_ready_;  // set while an overlapped collective runs its tiles
};

}  // namespace tessera::parallel
