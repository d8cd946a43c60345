#include "parallel/comm_sync.h"

#include <cstring>
#include <numeric>

#include "comm/collectives.h"
#include "core/io.h"

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
