#include "parallel/sub_sync.h"

#include <cstring>
#include <numeric>
#include <string>

#include "core/check.h"

namespace tessera::parallel {

using core::Status;

namespace {

int64_t rows_before(const std::vector<int64_t>& counts, int r) {
  return std::accumulate(counts.begin(), counts.begin() + r, int64_t{0});
}

}  // namespace

Status exchange_sum(Synchronizer& sync, float* data, int64_t n, std::vector<float>& buf) {
  const int k = sync.world(), me = sync.rank();
  if (k == 1 || n == 0) return core::ok_status();
  for (int p = 0; p < k; ++p)
    if (p != me) TESSERA_RETURN_IF_ERROR(sync.send(p, std::span<const float>(data, static_cast<size_t>(n))));
  buf.resize(static_cast<size_t>(k * n));
  std::memcpy(buf.data() + me * n, data, static_cast<size_t>(n) * sizeof(float));
  // Our row as the others receive it, so every rank sums the same values.
  core::wire_round_trip(sync.wire(), buf.data() + me * n, 1, n);
  for (int p = 0; p < k; ++p)
    if (p != me) TESSERA_RETURN_IF_ERROR(sync.recv(p, std::span<float>(buf.data() + p * n, static_cast<size_t>(n))));
  for (int64_t i = 0; i < n; ++i) {
    float s = buf[static_cast<size_t>(i)];
    for (int p = 1; p < k; ++p) s += buf[static_cast<size_t>(p * n + i)];
    data[i] = s;
  }
  return core::ok_status();
}

SubSynchronizer::SubSynchronizer(Synchronizer& parent, int world) : parent_(parent), world_(world) {
  TESSERA_CHECK(world >= 1 && world <= parent.world() && parent.rank() < world);
  // With no other member nothing travels, so nothing is rounded either.
  wire_ = world > 1 ? parent.wire() : core::WireType::kF32;
}

Status SubSynchronizer::check_peer(int peer) const {
  if (peer < 0 || peer >= world_ || peer == rank()) return core::invalid_argument("bad peer " + std::to_string(peer));
  return core::ok_status();
}

Status SubSynchronizer::check_root(int root) const {
  if (root < 0 || root >= world_) return core::invalid_argument("bad root " + std::to_string(root));
  return core::ok_status();
}

// Sent and decoded by the parent, in its wire (which the view took).
Status SubSynchronizer::send(int peer, std::span<const float> data) {
  TESSERA_RETURN_IF_ERROR(check_peer(peer));
  stats_.add(CollectiveKind::kSendRecv, static_cast<int64_t>(data.size()));
  return parent_.send(peer, data);
}

Status SubSynchronizer::recv(int peer, std::span<float> data) {
  TESSERA_RETURN_IF_ERROR(check_peer(peer));
  return parent_.recv(peer, data);
}

// Our rows into their place in `all`, as the others receive them (`mine` may
// lie inside `all`: moved, not copied), and every other member's from it.
Status SubSynchronizer::collect(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                std::span<float> all) {
  const int me = rank();
  const int64_t n = counts[static_cast<size_t>(me)] * cols;
  float* own = all.data() + rows_before(counts, me) * cols;
  if (n > 0) {
    if (own != mine.data()) std::memmove(own, mine.data(), static_cast<size_t>(n) * sizeof(float));
    core::wire_round_trip(wire_, own, 1, n);
  }
  for (int p = 0; p < world_; ++p) {
    const int64_t c = counts[static_cast<size_t>(p)] * cols;
    if (p != me && c > 0)
      TESSERA_RETURN_IF_ERROR(parent_.recv(p, all.subspan(static_cast<size_t>(rows_before(counts, p) * cols), static_cast<size_t>(c))));
  }
  return core::ok_status();
}

Status SubSynchronizer::allgather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                       std::span<float> all) {
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), true));
  const int me = rank();
  const int64_t n = counts[static_cast<size_t>(me)] * cols;
  for (int p = 0; p < world_ && n > 0; ++p)
    if (p != me) {
      stats_.add(CollectiveKind::kAllgather, n);
      TESSERA_RETURN_IF_ERROR(parent_.send(p, mine.first(static_cast<size_t>(n))));
    }
  return collect(mine, counts, cols, all);
}

Status SubSynchronizer::gather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                                    std::span<float> all, int root) {
  TESSERA_RETURN_IF_ERROR(check_root(root));
  const int me = rank();
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), me == root));
  const int64_t n = counts[static_cast<size_t>(me)] * cols;
  if (me != root) {
    if (n == 0) return core::ok_status();
    stats_.add(CollectiveKind::kGather, n);
    return parent_.send(root, mine.first(static_cast<size_t>(n)));
  }
  return collect(mine, counts, cols, all);
}

Status SubSynchronizer::scatter_rows(std::span<const float> all, const std::vector<int64_t>& counts, int64_t cols,
                                     std::span<float> mine, int root) {
  TESSERA_RETURN_IF_ERROR(check_root(root));
  const int me = rank();
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), me == root));
  const int64_t n = counts[static_cast<size_t>(me)] * cols;
  if (me != root) return n == 0 ? core::ok_status() : parent_.recv(root, mine.first(static_cast<size_t>(n)));
  for (int p = 0; p < world_; ++p) {
    const int64_t c = counts[static_cast<size_t>(p)] * cols;
    if (p == me || c == 0) continue;
    stats_.add(CollectiveKind::kScatter, c);
    TESSERA_RETURN_IF_ERROR(parent_.send(p, all.subspan(static_cast<size_t>(rows_before(counts, p) * cols), static_cast<size_t>(c))));
  }
  const float* own = all.data() + rows_before(counts, me) * cols;
  if (n > 0 && own != mine.data()) std::memmove(mine.data(), own, static_cast<size_t>(n) * sizeof(float));
  return core::ok_status();
}

// Each member sends every other its rows of the partial sums; each sums its
// own rows over the members in rank order.
Status SubSynchronizer::reduce_scatter_rows(std::span<const float> full, const std::vector<int64_t>& counts, int64_t cols,
                                            std::span<float> mine) {
  TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), full.size(), true));
  const int me = rank();
  for (int p = 0; p < world_; ++p) {
    const int64_t c = counts[static_cast<size_t>(p)] * cols;
    if (p == me || c == 0) continue;
    stats_.add(CollectiveKind::kReduceScatter, c);
    TESSERA_RETURN_IF_ERROR(parent_.send(p, full.subspan(static_cast<size_t>(rows_before(counts, p) * cols), static_cast<size_t>(c))));
  }
  const int64_t n = counts[static_cast<size_t>(me)] * cols;
  if (n == 0) return core::ok_status();
  const float* own = full.data() + rows_before(counts, me) * cols;
  buf_.assign(static_cast<size_t>(n), 0.0f);
  std::vector<float> part(static_cast<size_t>(n));
  for (int p = 0; p < world_; ++p) {
    const float* src = own;
    if (p != me) {
      TESSERA_RETURN_IF_ERROR(parent_.recv(p, std::span<float>(part)));
      src = part.data();
    }
    for (int64_t i = 0; i < n; ++i) buf_[static_cast<size_t>(i)] += src[i];
  }
  std::memcpy(mine.data(), buf_.data(), static_cast<size_t>(n) * sizeof(float));
  return core::ok_status();
}

Status SubSynchronizer::allreduce_sum(std::span<float> data) {
  return exchange_sum(*this, data.data(), static_cast<int64_t>(data.size()), buf_);
}

Status SubSynchronizer::broadcast(std::span<float> data, int root) {
  TESSERA_RETURN_IF_ERROR(check_root(root));
  if (world_ == 1 || data.empty()) return core::ok_status();
  if (rank() != root) return parent_.recv(root, data);
  for (int p = 0; p < world_; ++p)
    if (p != root) {
      stats_.add(CollectiveKind::kBroadcast, static_cast<int64_t>(data.size()));
      TESSERA_RETURN_IF_ERROR(parent_.send(p, data));
    }
  core::wire_round_trip(wire_, data.data(), 1, static_cast<int64_t>(data.size()));  // as the others received it
  return core::ok_status();
}

}  // namespace tessera::parallel
