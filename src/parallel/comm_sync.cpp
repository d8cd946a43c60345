#include "parallel/comm_sync.h"

#include <cstring>
#include <numeric>

#include "comm/collectives.h"
#include "core/io.h"
#include "parallel/partition.h"

namespace tessera::parallel {

using core::Status;
using core::Tensor;

namespace {

// Tags of this layer's traffic: strategies run one collective at a time, and
// ZeroMQ keeps per-peer order, so one tag per kind is enough.
constexpr int kTag = 7;
constexpr int kScatterTag = 8;
constexpr int kPointTag = 9;

// Sends take the tensor's buffer without copying and may still read it after
// the call returns, so what we send is always a private copy.
Tensor copy_rows(const float* data, int64_t rows, int64_t cols) {
  Tensor t = Tensor::zeros_f32({rows, cols});
  if (rows * cols > 0) std::memcpy(t.f32(), data, static_cast<size_t>(rows * cols) * sizeof(float));
  return t;
}

Status copy_out(const Tensor& t, float* out, int64_t expect) {
  if (t.dtype() != core::DType::kF32 || t.numel() != expect)
    return core::invalid_argument("received " + std::to_string(t.numel()) + " elements, expected " + std::to_string(expect));
  if (expect > 0) std::memcpy(out, t.f32(), static_cast<size_t>(expect) * sizeof(float));
  return core::ok_status();
}

// Clears next_ready_ however the collective ends (it points into its locals).
struct ScopeExit {
  std::function<void()> fn;
  ~ScopeExit() { fn(); }
};

}  // namespace

Status CommSynchronizer::allgather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all) {
  core::Timer t;
  stats_.add(CollectiveKind::kAllgather, ring_allgather_sent(counts, cols, rank()));
  comm::AllgatherOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  Tensor out;
  TESSERA_RETURN_IF_ERROR(comm::allgatherv(group_, o, copy_rows(mine, counts[static_cast<size_t>(rank())], cols), counts, &out));
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  TESSERA_RETURN_IF_ERROR(copy_out(out, all, total * cols));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::gather_rows(const float* mine, const std::vector<int64_t>& counts, int64_t cols, float* all,
                                     int root) {
  core::Timer t;
  if (rank() != root) stats_.add(CollectiveKind::kGather, counts[static_cast<size_t>(rank())] * cols);
  comm::GatherOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.root = root;
  Tensor out;
  TESSERA_RETURN_IF_ERROR(comm::gatherv(group_, o, copy_rows(mine, counts[static_cast<size_t>(rank())], cols), counts, &out));
  if (rank() == root) {
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    TESSERA_RETURN_IF_ERROR(copy_out(out, all, total * cols));
  }
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::scatter_rows(const float* all, const std::vector<int64_t>& counts, int64_t cols, float* mine,
                                      int root) {
  core::Timer t;
  const int64_t mine_rows = counts[static_cast<size_t>(rank())];
  if (rank() == root) {
    int64_t at = 0;
    std::vector<comm::SendHandle> sends;
    for (int r = 0; r < world(); ++r) {
      const int64_t rows = counts[static_cast<size_t>(r)];
      if (r == root) {
        if (rows > 0) std::memcpy(mine, all + at * cols, static_cast<size_t>(rows * cols) * sizeof(float));
      } else {
        stats_.add(CollectiveKind::kScatter, rows * cols);
        sends.push_back(group_.isend(r, kScatterTag, copy_rows(all + at * cols, rows, cols)));
      }
      at += rows;
    }
    for (auto& s : sends) TESSERA_RETURN_IF_ERROR(s.wait(timeout_));
  } else {
    TESSERA_ASSIGN_OR_RETURN(Tensor got, group_.recv(root, kScatterTag, timeout_));
    TESSERA_RETURN_IF_ERROR(copy_out(got, mine, mine_rows * cols));
  }
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::reduce_scatter_rows(const float* full, const std::vector<int64_t>& counts, int64_t cols,
                                             float* mine) {
  core::Timer t;
  stats_.add(CollectiveKind::kReduceScatter, ring_reduce_scatter_sent(counts, cols, rank()));
  comm::ReduceScatterOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor out;
  TESSERA_RETURN_IF_ERROR(comm::reduce_scatterv(group_, o, copy_rows(full, total, cols), counts, &out));
  TESSERA_RETURN_IF_ERROR(copy_out(out, mine, counts[static_cast<size_t>(rank())] * cols));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::allgather_rows_overlapped(const float* mine, const std::vector<int64_t>& counts, int64_t cols,
                                                   const TileFn& on_tile) {
  if (static_cast<int>(counts.size()) != world()) return core::invalid_argument("counts do not match the world size");
  stats_.add(CollectiveKind::kAllgather, ring_allgather_sent(counts, cols, rank()));
  comm::AllgatherOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  comm::RingAllgather ring(group_, o);
  TESSERA_RETURN_IF_ERROR(ring.start(copy_rows(mine, counts[static_cast<size_t>(rank())], cols)));
  next_ready_ = [&ring] { return ring.next_ready(); };
  const ScopeExit clear{[this] { next_ready_ = nullptr; }};
  while (!ring.done()) {
    core::Timer t;
    TESSERA_ASSIGN_OR_RETURN(comm::Tile tile, ring.next_tile());
    stats_.blocked_ms += t.ms();
    const int64_t rows = counts[static_cast<size_t>(tile.index)];
    if (tile.data.dtype() != core::DType::kF32 || tile.data.numel() != rows * cols)
      return core::invalid_argument("allgather tile of rank " + std::to_string(tile.index) + " has " +
                                    std::to_string(tile.data.numel()) + " elements, expected " + std::to_string(rows * cols));
    on_tile(tile.index, rows > 0 ? tile.data.f32() : nullptr, rows);
  }
  core::Timer t;
  TESSERA_RETURN_IF_ERROR(ring.finish());
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::reduce_scatter_rows_overlapped(const std::vector<int64_t>& counts, int64_t cols,
                                                        const PartialFn& partial, float* mine) {
  const int k = world(), r = rank();
  if (static_cast<int>(counts.size()) != k) return core::invalid_argument("counts do not match the world size");
  stats_.add(CollectiveKind::kReduceScatter, ring_reduce_scatter_sent(counts, cols, r));
  const int right = (r + 1) % k, left = (r + k - 1) % k;
  // Receives first, so every partial streams in while we compute.
  std::vector<comm::RecvHandle> recvs;
  for (int s = 1; s < k; ++s) recvs.push_back(group_.irecv_op(comm::OpKind::kReduceScatter, left, kTag));
  std::vector<comm::SendHandle> sends;
  // Step s computes our partial of part (r - 1 - s) mod K while the previous
  // step's sum travels, adds what the left neighbour sent for the same part
  // and passes it on; the last part is ours.
  for (int s = 0; s < k; ++s) {
    const int d = ((r - 1 - s) % k + k) % k;
    const int64_t n = counts[static_cast<size_t>(d)] * cols;
    Tensor sum = Tensor::zeros_f32({counts[static_cast<size_t>(d)], cols});
    if (n > 0) partial(d, sum.f32());
    if (s > 0) {
      core::Timer t;
      TESSERA_ASSIGN_OR_RETURN(Tensor got, recvs[static_cast<size_t>(s - 1)].wait(timeout_));
      stats_.blocked_ms += t.ms();
      if (got.dtype() != core::DType::kF32 || got.numel() != n)
        return core::invalid_argument("reduce-scatter partial of part " + std::to_string(d) + " has " +
                                      std::to_string(got.numel()) + " elements, expected " + std::to_string(n));
      float* a = sum.f32();
      const float* b = got.f32();
      for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    }
    if (s < k - 1) {
      sends.push_back(group_.isend_op(comm::OpKind::kReduceScatter, right, kTag, sum));
    } else if (n > 0) {
      std::memcpy(mine, sum.f32(), static_cast<size_t>(n) * sizeof(float));
    }
  }
  core::Timer t;
  for (auto& s : sends) TESSERA_RETURN_IF_ERROR(s.wait(timeout_));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::broadcast_rows_overlapped(float* all, const std::vector<int64_t>& counts, int64_t cols, int root,
                                                   const TileFn& on_tile) {
  const int k = world(), r = rank();
  if (static_cast<int>(counts.size()) != k) return core::invalid_argument("counts do not match the world size");
  if (root < 0 || root >= k) return core::invalid_argument("broadcast root out of range");
  const std::vector<int64_t> at = row_offsets(counts);
  auto part = [&](int q) { return all + at[static_cast<size_t>(q)] * cols; };
  auto rows = [&](int q) { return counts[static_cast<size_t>(q)]; };
  if (r == root) {
    stats_.add(CollectiveKind::kBroadcast, at.back() * cols * (k - 1));
    // Every send is posted before the root computes, so its links stay busy.
    std::vector<comm::SendHandle> sends;
    for (int dest = 0; dest < k; ++dest)
      if (dest != root)
        for (const int q : own_part_first(dest, k))
          if (rows(q) > 0) sends.push_back(group_.isend_op(comm::OpKind::kBroadcast, dest, kTag, copy_rows(part(q), rows(q), cols)));
    for (const int q : own_part_first(r, k)) on_tile(q, part(q), rows(q));
    core::Timer t;
    for (auto& s : sends) TESSERA_RETURN_IF_ERROR(s.wait(timeout_));
    stats_.blocked_ms += t.ms();
    return core::ok_status();
  }
  std::vector<comm::RecvHandle> recvs;
  const std::vector<int> order = own_part_first(r, k);
  for (const int q : order)
    if (rows(q) > 0) recvs.push_back(group_.irecv_op(comm::OpKind::kBroadcast, root, kTag));
  size_t next = 0;
  next_ready_ = [&] { return next >= recvs.size() || recvs[next].ready(); };
  const ScopeExit clear{[this] { next_ready_ = nullptr; }};
  for (const int q : order) {
    if (rows(q) > 0) {
      core::Timer t;
      TESSERA_ASSIGN_OR_RETURN(Tensor got, recvs[next++].wait(timeout_));
      stats_.blocked_ms += t.ms();
      TESSERA_RETURN_IF_ERROR(copy_out(got, part(q), rows(q) * cols));
    }
    on_tile(q, part(q), rows(q));
  }
  return core::ok_status();
}

Status CommSynchronizer::allreduce_sum(float* data, int64_t n) {
  core::Timer t;
  stats_.add(CollectiveKind::kAllreduce, ring_allreduce_sent(n, world(), rank()));
  comm::AllreduceOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  Tensor x = copy_rows(data, 1, n).reshaped({n});
  TESSERA_RETURN_IF_ERROR(comm::allreduce(group_, o, &x));
  TESSERA_RETURN_IF_ERROR(copy_out(x, data, n));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::broadcast(float* data, int64_t n, int root) {
  core::Timer t;
  if (rank() == root) stats_.add(CollectiveKind::kBroadcast, n * (world() - 1));
  comm::BroadcastOptions o;
  o.timeout = timeout_;
  o.tag = kTag;
  o.root = root;
  Tensor x = rank() == root ? copy_rows(data, 1, n).reshaped({n}) : Tensor();
  TESSERA_RETURN_IF_ERROR(comm::broadcast(group_, o, &x));
  if (rank() != root) TESSERA_RETURN_IF_ERROR(copy_out(x, data, n));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::send(int peer, const float* data, int64_t n) {
  core::Timer t;
  stats_.add(CollectiveKind::kSendRecv, n);
  TESSERA_RETURN_IF_ERROR(group_.send(peer, kPointTag, copy_rows(data, 1, n).reshaped({n}), timeout_));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

Status CommSynchronizer::recv(int peer, float* data, int64_t n) {
  core::Timer t;
  TESSERA_ASSIGN_OR_RETURN(Tensor got, group_.recv(peer, kPointTag, timeout_));
  TESSERA_RETURN_IF_ERROR(copy_out(got, data, n));
  stats_.blocked_ms += t.ms();
  return core::ok_status();
}

}  // namespace tessera::parallel
