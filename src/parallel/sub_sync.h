// The first `world` ranks of a synchronizer as a world of their own: a
// pair's decode layout on a prefix of its prefill's devices (Plan::decode
// with a smaller world). Its collectives are built on the parent's
// point-to-point messages, which only its members exchange, so the ranks
// outside it are never waited for. Each collective is one hop (every
// member sends its part to those that need it), the shape of a decode
// step's exchange: a few KiB, bound by latency.
#pragma once

#include <vector>

#include "parallel/sync.h"

namespace tessera::parallel {

// An AllReduce in one hop: every rank sends its vector to every other and
// sums all of them in rank order, its own as the others receive it (the same
// bits on every rank). A decode step's row is a few KiB, so the step is bound
// by latency: a ring's 2(K-1) hops cost more than its smaller share saves.
[[nodiscard]] core::Status exchange_sum(Synchronizer& sync, float* data, int64_t n, std::vector<float>& buf);

class SubSynchronizer final : public Synchronizer {
 public:
  // parent.rank() < world <= parent.world(); the parent outlives this.
  // It takes the parent's wire.
  SubSynchronizer(Synchronizer& parent, int world);
  int rank() const override { return parent_.rank(); }
  int world() const override { return world_; }

  [[nodiscard]] core::Status allgather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                            std::span<float> all) override;
  [[nodiscard]] core::Status gather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                         std::span<float> all, int root) override;
  [[nodiscard]] core::Status scatter_rows(std::span<const float> all, const std::vector<int64_t>& counts, int64_t cols,
                                          std::span<float> mine, int root) override;
  [[nodiscard]] core::Status reduce_scatter_rows(std::span<const float> full, const std::vector<int64_t>& counts,
                                                 int64_t cols, std::span<float> mine) override;
  [[nodiscard]] core::Status allreduce_sum(std::span<float> data) override;
  [[nodiscard]] core::Status broadcast(std::span<float> data, int root) override;
  [[nodiscard]] core::Status send(int peer, std::span<const float> data) override;
  [[nodiscard]] core::Status recv(int peer, std::span<float> data) override;

 private:
  core::Status check_peer(int peer) const;
  core::Status check_root(int root) const;
  core::Status collect(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols, std::span<float> all);
  Synchronizer& parent_;
  const int world_;
  std::vector<float> buf_;
};

}  // namespace tessera::parallel
