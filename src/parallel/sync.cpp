#include "parallel/sync.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "parallel/partition.h"

namespace tessera::parallel {

using core::Result;
using core::Status;

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

Status Synchronizer::check_rows(const std::vector<int64_t>& counts, int64_t cols, size_t mine_floats,
                                size_t all_floats, bool check_all) const {
  if (static_cast<int>(counts.size()) != world()) return core::invalid_argument("counts do not match the world size");
  if (cols < 0) return core::invalid_argument("negative column count");
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0) return core::invalid_argument("negative row count");
    total += c;
  }
  if (mine_floats < static_cast<size_t>(counts[static_cast<size_t>(rank())] * cols))
    return core::invalid_argument("this rank's buffer is shorter than its rows");
  if (check_all && all_floats < static_cast<size_t>(total * cols))
    return core::invalid_argument("the buffer for all rows is shorter than the rows");
  return core::ok_status();
}

std::vector<int> own_part_first(int rank, int world) {
  std::vector<int> order{rank};
  for (int q = 0; q < world; ++q)
    if (q != rank) order.push_back(q);
  return order;
}

std::vector<int> ring_order(int rank, int world) {
  std::vector<int> order;
  for (int s = 0; s < world; ++s) order.push_back(((rank - s) % world + world) % world);
  return order;
}

namespace {

// Tiles of rows that are all in memory already, in a given part order.
class WholeTiles final : public TileStream {
 public:
  WholeTiles(std::vector<float> owned, const float* rows, std::vector<int64_t> counts, int64_t cols, std::vector<int> order)
      : owned_(std::move(owned)), rows_(rows ? rows : owned_.data()), at_(row_offsets(counts)), counts_(std::move(counts)),
        cols_(cols), order_(std::move(order)) {}
  Result<Tile> next() override {
    if (done()) return core::internal_error("no tile left");
    const int q = order_[next_++];
    const auto i = static_cast<size_t>(q);
    return Tile{q, counts_[i], floats(rows_ + at_[i] * cols_, counts_[i] * cols_)};
  }
  bool ready() const override { return true; }
  bool done() const override { return next_ >= order_.size(); }
  Status finish() override { return core::ok_status(); }

 private:
  std::vector<float> owned_;
  const float* rows_;
  std::vector<int64_t> at_, counts_;
  int64_t cols_;
  std::vector<int> order_;
  size_t next_ = 0;
};

// This rank's pieces of rows already in memory.
class Pieces final : public TileStream {
 public:
  Pieces(int rank, std::span<float> mine, std::vector<int64_t> counts, int64_t cols)
      : rank_(rank), mine_(mine), at_(row_offsets(counts)), counts_(std::move(counts)), cols_(cols) {}
  Result<Tile> next() override {
    if (done()) return core::internal_error("no piece left");
    const size_t i = next_++;
    return Tile{rank_, counts_[i], mine_.subspan(static_cast<size_t>(at_[i] * cols_), static_cast<size_t>(counts_[i] * cols_))};
  }
  bool ready() const override { return true; }
  bool done() const override { return next_ >= counts_.size(); }
  Status finish() override { return core::ok_status(); }

 private:
  int rank_;
  std::span<float> mine_;
  std::vector<int64_t> at_, counts_;
  int64_t cols_;
  size_t next_ = 0;
};

// Every partial first, then one ReduceScatter.
class WholePartials final : public PartialStream {
 public:
  WholePartials(Synchronizer& sync, std::vector<int64_t> counts, int64_t cols, std::span<float> mine)
      : sync_(sync), at_(row_offsets(counts)), counts_(std::move(counts)), cols_(cols), mine_(mine),
        full_(static_cast<size_t>(at_.back() * cols), 0.0f) {}
  Result<PartialSlot> next() override {
    if (done()) return core::internal_error("no part left");
    const auto d = static_cast<size_t>(next_);
    return PartialSlot{next_, floats(full_.data() + at_[d] * cols_, counts_[d] * cols_)};
  }
  Status submit() override {
    ++next_;
    return core::ok_status();
  }
  bool done() const override { return next_ >= static_cast<int>(counts_.size()); }
  Status finish() override { return sync_.reduce_scatter_rows(full_, counts_, cols_, mine_); }

 private:
  Synchronizer& sync_;
  std::vector<int64_t> at_, counts_;
  int64_t cols_;
  std::span<float> mine_;
  std::vector<float> full_;
  int next_ = 0;
};

}  // namespace

Result<std::unique_ptr<TileStream>> Synchronizer::allgather_tiles_whole(std::span<const float> mine,
                                                                      const std::vector<int64_t>& counts, int64_t cols) {
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), 0, false));
  std::vector<float> all(static_cast<size_t>(row_offsets(counts).back() * cols));
  TESSERA_RETURN_IF_ERROR(allgather_rows(mine, counts, cols, all));
  return std::unique_ptr<TileStream>(new WholeTiles(std::move(all), nullptr, counts, cols, ring_order(rank(), world())));
}

Result<std::unique_ptr<TileStream>> Synchronizer::broadcast_tiles_whole(std::span<float> all,
                                                                      const std::vector<int64_t>& counts, int64_t cols,
                                                                      int root) {
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, all.size(), all.size(), true));
  const int64_t total = row_offsets(counts).back() * cols;
  TESSERA_RETURN_IF_ERROR(broadcast(all.first(static_cast<size_t>(total)), root));
  return std::unique_ptr<TileStream>(new WholeTiles({}, all.data(), counts, cols, own_part_first(rank(), world())));
}

Result<std::unique_ptr<PartialStream>> Synchronizer::reduce_scatter_parts_whole(const std::vector<int64_t>& counts,
                                                                               int64_t cols, std::span<float> mine) {
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), 0, false));
  return std::unique_ptr<PartialStream>(new WholePartials(*this, counts, cols, mine));
}

Result<std::unique_ptr<TileStream>> Synchronizer::allgather_tiles(std::span<const float> mine,
                                                                const std::vector<int64_t>& counts, int64_t cols,
                                                                int stream) {
  if (stream < 0 || stream >= kMaxTileStreams) return core::invalid_argument("allgather stream out of range");
  return allgather_tiles_whole(mine, counts, cols);
}

std::vector<int64_t> piece_counts(int64_t rows, int64_t piece_rows) {
  std::vector<int64_t> out;
  const int64_t step = std::max<int64_t>(piece_rows, 1);
  for (int64_t at = 0; at < rows; at += step) out.push_back(std::min(step, rows - at));
  return out;
}

Result<std::unique_ptr<TileStream>> Synchronizer::scatter_tiles(std::span<const float> all,
                                                               const std::vector<int64_t>& counts, int64_t cols,
                                                               std::span<float> mine, int root, int64_t piece_rows) {
  if (piece_rows < 1) return core::invalid_argument("scatter pieces need at least one row");
  TESSERA_RETURN_IF_ERROR(scatter_rows(all, counts, cols, mine, root));
  return std::unique_ptr<TileStream>(
      new Pieces(rank(), mine, piece_counts(counts[static_cast<size_t>(rank())], piece_rows), cols));
}

Result<std::unique_ptr<TileStream>> Synchronizer::broadcast_tiles(std::span<float> all, const std::vector<int64_t>& counts,
                                                                int64_t cols, int root) {
  return broadcast_tiles_whole(all, counts, cols, root);
}

Result<std::unique_ptr<PartialStream>> Synchronizer::reduce_scatter_parts(const std::vector<int64_t>& counts, int64_t cols,
                                                                        std::span<float> mine) {
  return reduce_scatter_parts_whole(counts, cols, mine);
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

int64_t tree_broadcast_sent(int64_t n, int world, int rank, int root) {
  // Virtual rank v receives at its lowest set bit and sends to v + m for
  // every smaller power of two m with v + m < world.
  const int v = ((rank - root) % world + world) % world;
  int mask = 1;
  while (mask < world && !(v & mask)) mask <<= 1;
  int64_t children = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < world) ++children;
  return n * children;
}

int64_t ring_allreduce_sent(int64_t n, int world, int rank) {
  // A ring reduce-scatter then a ring allgather over K chunks of n (the first
  // n mod K chunks one longer): the first phase forwards every chunk but the
  // rank's own, the second every chunk but its successor's.
  if (world <= 1) return 0;
  std::vector<int64_t> chunks(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) chunks[static_cast<size_t>(i)] = n / world + (i < n % world ? 1 : 0);
  return ring_reduce_scatter_sent(chunks, 1, rank) + ring_allgather_sent(chunks, 1, rank);
}

}  // namespace tessera::parallel
