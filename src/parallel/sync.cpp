#include "parallel/sync.h"

#include <numeric>
#include <vector>

#include "parallel/partition.h"

namespace tessera::parallel {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kSendRecv: return "sendrecv";
    case CollectiveKind::kCount: break;
  }
  return "?";
}

int64_t SyncStats::total_elements() const { return std::accumulate(elements_sent.begin(), elements_sent.end(), int64_t{0}); }

void SyncStats::add(CollectiveKind kind, int64_t elements) {
  elements_sent[static_cast<size_t>(kind)] += elements;
  calls[static_cast<size_t>(kind)] += 1;
}

core::Status Synchronizer::allgather_rows_overlapped(const float* mine, const std::vector<int64_t>& counts,
                                                     int64_t cols, const TileFn& on_tile) {
  return allgather_rows_then_tiles(mine, counts, cols, on_tile);
}

core::Status Synchronizer::reduce_scatter_rows_overlapped(const std::vector<int64_t>& counts, int64_t cols,
                                                          const PartialFn& partial, float* mine) {
  return partials_then_reduce_scatter(counts, cols, partial, mine);
}

core::Status Synchronizer::broadcast_rows_overlapped(float* all, const std::vector<int64_t>& counts, int64_t cols,
                                                     int root, const TileFn& on_tile) {
  return broadcast_rows_then_tiles(all, counts, cols, root, on_tile);
}

std::vector<int> own_part_first(int rank, int world) {
  std::vector<int> order{rank};
  for (int q = 0; q < world; ++q)
    if (q != rank) order.push_back(q);
  return order;
}

core::Status Synchronizer::broadcast_rows_then_tiles(float* all, const std::vector<int64_t>& counts, int64_t cols,
                                                     int root, const TileFn& on_tile) {
  if (static_cast<int>(counts.size()) != world()) return core::invalid_argument("counts do not match the world size");
  const std::vector<int64_t> at = row_offsets(counts);
  TESSERA_RETURN_IF_ERROR(broadcast(all, at.back() * cols, root));
  for (const int q : own_part_first(rank(), world()))
    on_tile(q, all + at[static_cast<size_t>(q)] * cols, counts[static_cast<size_t>(q)]);
  return core::ok_status();
}

core::Status Synchronizer::allgather_rows_then_tiles(const float* mine, const std::vector<int64_t>& counts, int64_t cols,
                                                     const TileFn& on_tile) {
  const std::vector<int64_t> at = row_offsets(counts);
  std::vector<float> all(static_cast<size_t>(at.back() * cols));
  TESSERA_RETURN_IF_ERROR(allgather_rows(mine, counts, cols, all.data()));
  // The ring's order (own tile first, then the left neighbours'), so both
  // forms hand the caller the same sequence.
  const int k = world();
  for (int s = 0; s < k; ++s) {
    const int owner = ((rank() - s) % k + k) % k;
    on_tile(owner, all.data() + at[static_cast<size_t>(owner)] * cols, counts[static_cast<size_t>(owner)]);
  }
  return core::ok_status();
}

core::Status Synchronizer::partials_then_reduce_scatter(const std::vector<int64_t>& counts, int64_t cols,
                                                        const PartialFn& partial, float* mine) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<float> full(static_cast<size_t>(total * cols));
  int64_t at = 0;
  for (size_t d = 0; d < counts.size(); ++d) {
    partial(static_cast<int>(d), full.data() + at * cols);
    at += counts[d];
  }
  return reduce_scatter_rows(full.data(), counts, cols, mine);
}

int64_t ring_allgather_sent(const std::vector<int64_t>& counts, int64_t cols, int rank) {
  // In step s a rank forwards the part of rank (rank - s) mod K, s = 0..K-2:
  // every part but that of its successor.
  const int k = static_cast<int>(counts.size());
  if (k <= 1) return 0;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  return (total - counts[static_cast<size_t>((rank + 1) % k)]) * cols;
}

int64_t ring_reduce_scatter_sent(const std::vector<int64_t>& counts, int64_t cols, int rank) {
  // Step s forwards the partial sum of part (rank - 1 - s) mod K, s = 0..K-2:
  // every part but the rank's own.
  if (counts.size() <= 1) return 0;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  return (total - counts[static_cast<size_t>(rank)]) * cols;
}

int64_t ring_allreduce_sent(int64_t n, int world, int rank) {
  // Reduce-scatter then allgather over K chunks of n: in each phase a rank
  // forwards every chunk but one, 2(K-1)n/K in all when K divides n.
  if (world <= 1) return 0;
  const int64_t base = n / world, rem = n % world;
  const int skipped = (rank + 1) % world;
  return 2 * (n - (base + (skipped < rem ? 1 : 0)));
}

}  // namespace tessera::parallel
