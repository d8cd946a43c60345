#include "runtime/comm_sync.h"

#include "core/device_speed.h"

#include <cstring>
#include <numeric>

#include "comm/collectives.h"
#include "core/io.h"
#include "parallel/partition.h"

namespace tessera::runtime {

using core::Result;
using core::Status;
using core::Tensor;
using parallel::CollectiveKind;
using parallel::floats;

namespace {

// Tags of this layer's traffic: strategies run one collective at a time, and
// ZeroMQ keeps per-peer order, so one tag per kind is enough.
constexpr int kTag = 7;
constexpr int kScatterTag = 8;
constexpr int kPointTag = 9;
// Tags of the AllGather streams after the first (kTag).
constexpr int kStreamTag0 = 16;

// Sends take the tensor's buffer without copying and may still read it after
// the call returns, so what we send is always a private copy.
Tensor copy_rows(std::span<const float> data, int64_t rows, int64_t cols) {
  Tensor t = Tensor::zeros_f32({rows, cols});
  if (rows * cols > 0) std::memcpy(t.f32(), data.data(), static_cast<size_t>(rows * cols) * sizeof(float));
  return t;
}

Status check_tensor(const Tensor& t, int64_t expect) {
  if (t.dtype() != core::DType::kF32 || t.numel() != expect)
    return core::invalid_argument("received " + std::to_string(t.numel()) + " elements, expected " + std::to_string(expect));
  return core::ok_status();
}

Status copy_out(const Tensor& t, std::span<float> out, int64_t expect) {
  TESSERA_RETURN_IF_ERROR(check_tensor(t, expect));
  if (static_cast<int64_t>(out.size()) < expect) return core::invalid_argument("receive buffer too short");
  if (expect > 0) std::memcpy(out.data(), t.f32(), static_cast<size_t>(expect) * sizeof(float));
  return core::ok_status();
}

// The wire forms of copy_rows and copy_out (the plan's --wire); for f32 they
// are the same copies.
Tensor encode_rows(core::WireType w, std::span<const float> data, int64_t rows, int64_t cols) {
  return core::wire_encode(w, data.data(), rows, cols);
}
Status decode_rows(core::WireType w, const Tensor& t, std::span<float> out, int64_t rows, int64_t cols) {
  if (static_cast<int64_t>(out.size()) < rows * cols) return core::invalid_argument("receive buffer too short");
  return core::wire_decode(w, t, rows, cols, out.data());
}

// Ring AllGather tiles: each tile is a view of the received message, valid
// until the next call (the layer copies it at most once).
class RingTiles final : public parallel::TileStream {
 public:
  RingTiles(CommSynchronizer& sync, std::vector<int64_t> counts, int64_t cols, comm::AllgatherOptions o)
      : sync_(sync), counts_(std::move(counts)), cols_(cols), ring_(sync.group(), o) {}
  Status start(std::span<const float> mine) {
    return ring_.start(encode_rows(sync_.wire(), mine, counts_[static_cast<size_t>(sync_.rank())], cols_));
  }
  Result<parallel::Tile> next() override {
    core::settle_device_speed();  // the emulated device computes until here
    core::Timer t;
    TESSERA_ASSIGN_OR_RETURN(comm::Tile tile, ring_.next_tile());
    sync_.mutable_stats().blocked_ms += t.ms();
    if (tile.index < 0 || tile.index >= static_cast<int>(counts_.size()))
      return core::invalid_argument("allgather tile of an unknown rank");
    const int64_t rows = counts_[static_cast<size_t>(tile.index)];
    if (sync_.wire() == core::WireType::kF32) {
      TESSERA_RETURN_IF_ERROR(check_tensor(tile.data, rows * cols_));
      current_ = std::move(tile.data);
    } else {  // our own tile too, so every rank holds the same rows
      current_ = Tensor::zeros_f32({rows, cols_});
      TESSERA_RETURN_IF_ERROR(decode_rows(sync_.wire(), tile.data, floats(current_.f32(), rows * cols_), rows, cols_));
    }
    return parallel::Tile{tile.index, rows, rows > 0 ? floats(current_.f32(), rows * cols_) : std::span<const float>()};
  }
  bool ready() const override { return ring_.next_ready(); }
  bool done() const override { return ring_.done(); }
  Status finish() override {
    core::settle_device_speed();  // the emulated device computes until here
    core::Timer t;
    TESSERA_RETURN_IF_ERROR(ring_.finish());
    sync_.mutable_stats().blocked_ms += t.ms();
    return core::ok_status();
  }

 private:
  CommSynchronizer& sync_;
  std::vector<int64_t> counts_;
  int64_t cols_;
  comm::RingAllgather ring_;
  Tensor current_;
};

// A streamed collective's end: this rank's sends have left (time counted as blocked).
Status wait_sends(CommSynchronizer& sync, std::vector<comm::SendHandle>& sends) {
  core::settle_device_speed();  // the emulated device computes until here
  core::Timer t;
  for (auto& s : sends) TESSERA_RETURN_IF_ERROR(s.wait(sync.timeout()));
  sync.mutable_stats().blocked_ms += t.ms();
  return core::ok_status();
}

// The root sends each rank's rows in pieces, each its own message, all posted
// at once; a rank receives its pieces in order straight into `mine`.
class ScatterTiles final : public parallel::TileStream {
 public:
  ScatterTiles(CommSynchronizer& sync, std::span<float> mine, int64_t cols, int root, std::vector<int64_t> pieces)
      : sync_(sync), mine_(mine), cols_(cols), root_(root), at_(parallel::row_offsets(pieces)), pieces_(std::move(pieces)) {}

  Status start(std::span<const float> all, const std::vector<int64_t>& counts, int64_t piece_rows) {
    if (sync_.rank() == root_) {
      int64_t at = 0;
      for (int dest = 0; dest < sync_.world(); ++dest) {
        const int64_t rows = counts[static_cast<size_t>(dest)];
        const auto part = all.subspan(static_cast<size_t>(at * cols_), static_cast<size_t>(rows * cols_));
        if (dest == root_) {
          if (rows > 0) std::memcpy(mine_.data(), part.data(), part.size_bytes());
        } else {
          sync_.mutable_stats().add(CollectiveKind::kScatter, rows * cols_);
          int64_t from = 0;
          for (const int64_t piece : parallel::piece_counts(rows, piece_rows)) {
            sends_.push_back(sync_.group().isend(
                dest, kScatterTag, encode_rows(sync_.wire(), part.subspan(static_cast<size_t>(from * cols_)), piece, cols_)));
            from += piece;
          }
        }
        at += rows;
      }
      return core::ok_status();
    }
    for (size_t i = 0; i < pieces_.size(); ++i) recvs_.push_back(sync_.group().irecv(root_, kScatterTag));
    return core::ok_status();
  }
  Result<parallel::Tile> next() override {
    core::settle_device_speed();  // the emulated device computes until here
    if (done()) return core::internal_error("no piece left");
    const size_t i = next_++;
    const auto piece = mine_.subspan(static_cast<size_t>(at_[i] * cols_), static_cast<size_t>(pieces_[i] * cols_));
    if (sync_.rank() != root_) {
      core::Timer t;
      TESSERA_ASSIGN_OR_RETURN(Tensor got, recvs_[i].wait(sync_.timeout()));
      sync_.mutable_stats().blocked_ms += t.ms();
      TESSERA_RETURN_IF_ERROR(decode_rows(sync_.wire(), got, piece, pieces_[i], cols_));
    }
    return parallel::Tile{sync_.rank(), pieces_[i], piece};
  }
  bool ready() const override { return sync_.rank() == root_ || done() || recvs_[next_].ready(); }
  bool done() const override { return next_ >= pieces_.size(); }
  Status finish() override { return wait_sends(sync_, sends_); }

 private:
  CommSynchronizer& sync_;
  std::span<float> mine_;
  int64_t cols_;
  int root_;
  std::vector<int64_t> at_, pieces_;
  size_t next_ = 0;
  std::vector<comm::SendHandle> sends_;
  std::vector<comm::RecvHandle> recvs_;
};

// The root sends each part to each rank as its own message, the rank's part
// first; a rank receives each part straight into `all`.
class DirectBroadcastTiles final : public parallel::TileStream {
 public:
  DirectBroadcastTiles(CommSynchronizer& sync, std::span<float> all, std::vector<int64_t> counts, int64_t cols, int root)
      : sync_(sync), all_(all), at_(parallel::row_offsets(counts)), counts_(std::move(counts)), cols_(cols), root_(root),
        order_(parallel::own_part_first(sync.rank(), sync.world())) {}

  Status start() {
    const int k = sync_.world();
    if (sync_.rank() == root_) {
      sync_.mutable_stats().add(CollectiveKind::kBroadcast, at_.back() * cols_ * (k - 1));
      // Every send is posted before the root computes, so its links stay busy.
      for (int dest = 0; dest < k; ++dest)
        if (dest != root_)
          for (const int q : parallel::own_part_first(dest, k))
            if (rows(q) > 0)
              sends_.push_back(sync_.group().isend_op(comm::OpKind::kBroadcast, dest, kTag,
                                                      encode_rows(sync_.wire(), part(q), rows(q), cols_)));
      // The root keeps what the others receive.
      for (int q = 0; q < k; ++q) core::wire_round_trip(sync_.wire(), part(q).data(), rows(q), cols_);
      return core::ok_status();
    }
    for (const int q : order_)
      if (rows(q) > 0) recvs_.push_back(sync_.group().irecv_op(comm::OpKind::kBroadcast, root_, kTag));
    return core::ok_status();
  }
  Result<parallel::Tile> next() override {
    core::settle_device_speed();  // the emulated device computes until here
    if (done()) return core::internal_error("no tile left");
    const int q = order_[next_part_++];
    if (sync_.rank() != root_ && rows(q) > 0) {
      core::Timer t;
      TESSERA_ASSIGN_OR_RETURN(Tensor got, recvs_[next_recv_++].wait(sync_.timeout()));
      sync_.mutable_stats().blocked_ms += t.ms();
      TESSERA_RETURN_IF_ERROR(decode_rows(sync_.wire(), got, part(q), rows(q), cols_));
    }
    return parallel::Tile{q, rows(q), part(q)};
  }
  bool ready() const override {
    return sync_.rank() == root_ || next_recv_ >= recvs_.size() || recvs_[next_recv_].ready();
  }
  bool done() const override { return next_part_ >= order_.size(); }
  Status finish() override { return wait_sends(sync_, sends_); }

 private:
  std::span<float> part(int q) { return all_.subspan(static_cast<size_t>(at_[static_cast<size_t>(q)] * cols_), static_cast<size_t>(rows(q) * cols_)); }
  int64_t rows(int q) const { return counts_[static_cast<size_t>(q)]; }

  CommSynchronizer& sync_;
  std::span<float> all_;
  std::vector<int64_t> at_, counts_;
  int64_t cols_;
  int root_;
  std::vector<int> order_;
  size_t next_part_ = 0, next_recv_ = 0;
  std::vector<comm::SendHandle> sends_;
  std::vector<comm::RecvHandle> recvs_;
};

// Ring ReduceScatter fed part by part: step s computes this rank's partial of
// part (r - 1 - s) mod K while the previous step's sum travels, adds what the
// left neighbour sent for the same part and passes it on; the last part is
// this rank's own.
class RingPartials final : public parallel::PartialStream {
 public:
  RingPartials(CommSynchronizer& sync, std::vector<int64_t> counts, int64_t cols, std::span<float> mine)
      : sync_(sync), counts_(std::move(counts)), cols_(cols), mine_(mine) {
    const int k = sync.world(), r = sync.rank();
    // Receives first, so every partial streams in while we compute.
    for (int s = 1; s < k; ++s)
      recvs_.push_back(sync.group().irecv_op(comm::OpKind::kReduceScatter, (r + k - 1) % k, kTag));
  }
  Result<parallel::PartialSlot> next() override {
    core::settle_device_speed();  // the emulated device computes until here
    if (done()) return core::internal_error("no part left");
    const int d = dest(step_);
    sum_ = Tensor::zeros_f32({counts_[static_cast<size_t>(d)], cols_});
    return parallel::PartialSlot{d, floats(sum_.f32(), counts_[static_cast<size_t>(d)] * cols_)};
  }
  Status submit() override {
    core::settle_device_speed();  // the emulated device computes until here
    const int k = sync_.world(), d = dest(step_);
    const int64_t n = counts_[static_cast<size_t>(d)] * cols_;
    if (step_ > 0) {
      core::Timer t;
      TESSERA_ASSIGN_OR_RETURN(Tensor got, recvs_[static_cast<size_t>(step_ - 1)].wait(sync_.timeout()));
      sync_.mutable_stats().blocked_ms += t.ms();
      float* a = sum_.f32();
      if (sync_.wire() == core::WireType::kF32) {
        TESSERA_RETURN_IF_ERROR(check_tensor(got, n));
        const float* b = got.f32();
        for (int64_t i = 0; i < n; ++i) a[i] += b[i];
      } else {  // the partial sum is decoded and kept in F32
        scratch_.resize(static_cast<size_t>(n));
        TESSERA_RETURN_IF_ERROR(decode_rows(sync_.wire(), got, scratch_, counts_[static_cast<size_t>(d)], cols_));
        for (int64_t i = 0; i < n; ++i) a[i] += scratch_[static_cast<size_t>(i)];
      }
    }
    if (step_ < k - 1) {
      Tensor out = sync_.wire() == core::WireType::kF32
                       ? sum_
                       : encode_rows(sync_.wire(), floats(sum_.f32(), n), counts_[static_cast<size_t>(d)], cols_);
      sends_.push_back(sync_.group().isend_op(comm::OpKind::kReduceScatter, (sync_.rank() + 1) % k, kTag, std::move(out)));
    } else if (n > 0) {
      std::memcpy(mine_.data(), sum_.f32(), static_cast<size_t>(n) * sizeof(float));
    }
    ++step_;
    return core::ok_status();
  }
  bool done() const override { return step_ >= sync_.world(); }
  Status finish() override {
    core::settle_device_speed();  // the emulated device computes until here
    if (!done()) return core::internal_error("reduce-scatter finished before its last part");
    core::Timer t;
    for (auto& s : sends_) TESSERA_RETURN_IF_ERROR(s.wait(sync_.timeout()));
    sync_.mutable_stats().blocked_ms += t.ms();
    return core::ok_status();
  }

 private:
  int dest(int step) const {
    const int k = sync_.world();
    return ((sync_.rank() - 1 - step) % k + k) % k;
  }

  CommSynchronizer& sync_;
  std::vector<int64_t> counts_;
  int64_t cols_;
  std::span<float> mine_;
  int step_ = 0;
  Tensor sum_;
  std::vector<float> scratch_;
  std::vector<comm::RecvHandle> recvs_;
  std::vector<comm::SendHandle> sends_;
};

}  // namespace

comm::OpKind comm_op_of(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllgather: return comm::OpKind::kAllgather;
    case CollectiveKind::kAllreduce: return comm::OpKind::kAllreduce;
    case CollectiveKind::kReduceScatter: return comm::OpKind::kReduceScatter;
    case CollectiveKind::kBroadcast: return comm::OpKind::kBroadcast;
    case CollectiveKind::kGather: return comm::OpKind::kGather;
    case CollectiveKind::kScatter:  // point-to-point messages from the root
    case CollectiveKind::kSendRecv:
    case CollectiveKind::kCount: break;
  }
  return comm::OpKind::kP2P;
}

Status CommSynchronizer::allgather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                        std::span<float> all) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), true));
  core::Timer t;
  stats_.add(CollectiveKind::kAllgather, parallel::ring_allgather_sent(counts, cols, rank()));
  comm::AllgatherOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.wire = wire_;
  Tensor out;
  TESSERA_RETURN_IF_ERROR(comm::allgatherv(group_, o, copy_rows(mine, counts[static_cast<size_t>(rank())], cols), counts, &out));
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  TESSERA_RETURN_IF_ERROR(copy_out(out, all, total * cols));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::gather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                     std::span<float> all, int root) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), rank() == root));
  core::Timer t;
  if (rank() != root) stats_.add(CollectiveKind::kGather, counts[static_cast<size_t>(rank())] * cols);
  comm::GatherOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.root = root;
  Tensor out;
  // Rows are encoded alone, so the root's concatenation decodes as one block
  // (its own rows included).
  TESSERA_RETURN_IF_ERROR(
      comm::gatherv(group_, o, encode_rows(wire_, mine, counts[static_cast<size_t>(rank())], cols), counts, &out));
  if (rank() == root) {
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    TESSERA_RETURN_IF_ERROR(decode_rows(wire_, out, all, total, cols));
  }
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::scatter_rows(std::span<const float> all, const std::vector<int64_t>& counts, int64_t cols,
                                      std::span<float> mine, int root) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), rank() == root));
  core::Timer t;
  const int64_t mine_rows = counts[static_cast<size_t>(rank())];
  if (rank() == root) {
    int64_t at = 0;
    std::vector<comm::SendHandle> sends;
    for (int r = 0; r < world(); ++r) {
      const int64_t rows = counts[static_cast<size_t>(r)];
      if (r == root) {
        if (rows > 0) std::memcpy(mine.data(), all.data() + at * cols, static_cast<size_t>(rows * cols) * sizeof(float));
      } else {
        stats_.add(CollectiveKind::kScatter, rows * cols);
        sends.push_back(group_.isend(r, kScatterTag, encode_rows(wire_, all.subspan(static_cast<size_t>(at * cols)), rows, cols)));
      }
      at += rows;
    }
    for (auto& s : sends) TESSERA_RETURN_IF_ERROR(s.wait(timeout_));
  } else {
    TESSERA_ASSIGN_OR_RETURN(Tensor got, group_.recv(root, kScatterTag, timeout_));
    TESSERA_RETURN_IF_ERROR(decode_rows(wire_, got, mine, mine_rows, cols));
  }
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::reduce_scatter_rows(std::span<const float> full, const std::vector<int64_t>& counts,
                                             int64_t cols, std::span<float> mine) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), full.size(), true));
  core::Timer t;
  stats_.add(CollectiveKind::kReduceScatter, parallel::ring_reduce_scatter_sent(counts, cols, rank()));
  comm::ReduceScatterOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.wire = wire_;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor out;
  TESSERA_RETURN_IF_ERROR(comm::reduce_scatterv(group_, o, copy_rows(full, total, cols), counts, &out));
  TESSERA_RETURN_IF_ERROR(copy_out(out, mine, counts[static_cast<size_t>(rank())] * cols));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Result<std::unique_ptr<parallel::TileStream>> CommSynchronizer::allgather_tiles(std::span<const float> mine,
                                                                              const std::vector<int64_t>& counts,
                                                                              int64_t cols, int stream) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), 0, false));
  if (stream < 0 || stream >= parallel::kMaxTileStreams) return core::invalid_argument("allgather stream out of range");
  stats_.add(CollectiveKind::kAllgather, parallel::ring_allgather_sent(counts, cols, rank()));
  comm::AllgatherOptions o;
  o.timeout = timeout_;
  o.tag = stream == 0 ? kTag : kStreamTag0 + stream;
  auto tiles = std::make_unique<RingTiles>(*this, counts, cols, o);
  TESSERA_RETURN_IF_ERROR(tiles->start(mine));
  return std::unique_ptr<parallel::TileStream>(std::move(tiles));
}

Result<std::unique_ptr<parallel::TileStream>> CommSynchronizer::scatter_tiles(std::span<const float> all,
                                                                            const std::vector<int64_t>& counts,
                                                                            int64_t cols, std::span<float> mine,
                                                                            int root, int64_t piece_rows) {
  core::settle_device_speed();  // the emulated device computes until here
  if (root < 0 || root >= world()) return core::invalid_argument("scatter root out of range");
  if (piece_rows < 1) return core::invalid_argument("scatter pieces need at least one row");
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), rank() == root));
  auto tiles = std::make_unique<ScatterTiles>(*this, mine, cols, root,
                                              parallel::piece_counts(counts[static_cast<size_t>(rank())], piece_rows));
  TESSERA_RETURN_IF_ERROR(tiles->start(all, counts, piece_rows));
  return std::unique_ptr<parallel::TileStream>(std::move(tiles));
}

Result<std::unique_ptr<parallel::TileStream>> CommSynchronizer::broadcast_tiles(std::span<float> all,
                                                                              const std::vector<int64_t>& counts,
                                                                              int64_t cols, int root) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, all.size(), all.size(), true));
  if (root < 0 || root >= world()) return core::invalid_argument("broadcast root out of range");
  auto tiles = std::make_unique<DirectBroadcastTiles>(*this, all, counts, cols, root);
  TESSERA_RETURN_IF_ERROR(tiles->start());
  return std::unique_ptr<parallel::TileStream>(std::move(tiles));
}

Result<std::unique_ptr<parallel::PartialStream>> CommSynchronizer::reduce_scatter_parts(const std::vector<int64_t>& counts,
                                                                                      int64_t cols, std::span<float> mine) {
  core::settle_device_speed();  // the emulated device computes until here
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), 0, false));
  stats_.add(CollectiveKind::kReduceScatter, parallel::ring_reduce_scatter_sent(counts, cols, rank()));
  return std::unique_ptr<parallel::PartialStream>(new RingPartials(*this, counts, cols, mine));
}

Status CommSynchronizer::allreduce_sum(std::span<float> data) {
  core::settle_device_speed();  // the emulated device computes until here
  const auto n = static_cast<int64_t>(data.size());
  core::Timer t;
  stats_.add(CollectiveKind::kAllreduce, parallel::ring_allreduce_sent(n, world(), rank()));
  comm::AllreduceOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.wire = wire_;
  Tensor x = copy_rows(data, 1, n).reshaped({n});
  TESSERA_RETURN_IF_ERROR(comm::allreduce(group_, o, &x));
  TESSERA_RETURN_IF_ERROR(copy_out(x, data, n));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::broadcast(std::span<float> data, int root) {
  core::settle_device_speed();  // the emulated device computes until here
  const auto n = static_cast<int64_t>(data.size());
  core::Timer t;
  stats_.add(CollectiveKind::kBroadcast, parallel::tree_broadcast_sent(n, world(), rank(), root));
  comm::BroadcastOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.root = root;
  if (wire_ == core::WireType::kF32) {
    Tensor x = rank() == root ? copy_rows(data, 1, n).reshaped({n}) : Tensor();
    TESSERA_RETURN_IF_ERROR(comm::broadcast(group_, o, &x));
    if (rank() != root) TESSERA_RETURN_IF_ERROR(copy_out(x, data, n));
  } else {  // the tree passes the encoded tensor on; the root keeps what the others get
    Tensor x = rank() == root ? encode_rows(wire_, data, 1, n) : Tensor();
    TESSERA_RETURN_IF_ERROR(comm::broadcast(group_, o, &x));
    TESSERA_RETURN_IF_ERROR(decode_rows(wire_, x, data, 1, n));
  }
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::send(int peer, std::span<const float> data) {
  core::settle_device_speed();  // the emulated device computes until here
  const auto n = static_cast<int64_t>(data.size());
  core::Timer t;
  stats_.add(CollectiveKind::kSendRecv, n);
  Tensor x = wire_ == core::WireType::kF32 ? copy_rows(data, 1, n).reshaped({n}) : encode_rows(wire_, data, 1, n);
  TESSERA_RETURN_IF_ERROR(group_.send(peer, kPointTag, std::move(x), timeout_));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::recv(int peer, std::span<float> data) {
  core::settle_device_speed();  // the emulated device computes until here
  core::Timer t;
  TESSERA_ASSIGN_OR_RETURN(Tensor got, group_.recv(peer, kPointTag, timeout_));
  if (wire_ == core::WireType::kF32) TESSERA_RETURN_IF_ERROR(copy_out(got, data, static_cast<int64_t>(data.size())));
  else TESSERA_RETURN_IF_ERROR(decode_rows(wire_, got, data, 1, static_cast<int64_t>(data.size())));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

}  // namespace tessera::runtime
