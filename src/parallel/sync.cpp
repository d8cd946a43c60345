#include "parallel/sync.h"

#include <numeric>

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

int64_t ring_allgather_sent(const std::vector<int64_t>& counts, int64_t cols, int rank) {
  // In step s a rank forwards the part of rank (rank - s) mod K, s = 0..K-2:
  // every part but that of its successor.
  const int k = static_cast<int>(counts.size());
  if (k <= 1) return 0;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  return (total - counts[static_cast<size_t>((rank + 1) % k)]) * cols;
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
