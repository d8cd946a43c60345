#include "parallel/local_group.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "core/io.h"

namespace tessera::parallel {

using core::Status;

class LocalMember final : public Synchronizer {
 public:
  LocalMember(LocalGroup* g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return g_->world_; }

  Status allgather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols,
                        std::span<float> all) override {
    TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), true));
    stats_.add(CollectiveKind::kAllgather, ring_allgather_sent(counts, cols, rank_));
    TESSERA_RETURN_IF_ERROR(exchange(mine.data(), [&](const std::vector<const float*>& slots) {
      concat(slots, counts, cols, all.data());
    }));
    // After the last barrier (`mine` may lie inside `all`). Rows are encoded
    // alone, so rounding the whole result is rounding each part.
    core::wire_round_trip(wire_, all.data(), total_rows(counts), cols);
    return core::ok_status();
  }

  Status gather_rows(std::span<const float> mine, const std::vector<int64_t>& counts, int64_t cols, std::span<float> all,
                     int root) override {
    TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), rank_ == root));
    if (rank_ != root) stats_.add(CollectiveKind::kGather, counts[static_cast<size_t>(rank_)] * cols);
    TESSERA_RETURN_IF_ERROR(exchange(mine.data(), [&](const std::vector<const float*>& slots) {
      if (rank_ == root) concat(slots, counts, cols, all.data());
    }));
    if (rank_ == root) core::wire_round_trip(wire_, all.data(), total_rows(counts), cols);
    return core::ok_status();
  }

  Status scatter_rows(std::span<const float> all, const std::vector<int64_t>& counts, int64_t cols, std::span<float> mine,
                      int root) override {
    TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), all.size(), rank_ == root));
    if (rank_ == root) {
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      stats_.add(CollectiveKind::kScatter, (total - counts[static_cast<size_t>(root)]) * cols);
    }
    TESSERA_RETURN_IF_ERROR(exchange(all.data(), [&](const std::vector<const float*>& slots) {
      const int64_t at = std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});
      copy(mine.data(), slots[static_cast<size_t>(root)] + at * cols, counts[static_cast<size_t>(rank_)] * cols);
    }));
    if (rank_ != root) core::wire_round_trip(wire_, mine.data(), counts[static_cast<size_t>(rank_)], cols);
    return core::ok_status();
  }

  Status reduce_scatter_rows(std::span<const float> full, const std::vector<int64_t>& counts, int64_t cols,
                             std::span<float> mine) override {
    TESSERA_RETURN_IF_ERROR(check_rows(counts, cols, mine.size(), full.size(), true));
    stats_.add(CollectiveKind::kReduceScatter, ring_reduce_scatter_sent(counts, cols, rank_));
    const int64_t at = std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0}) * cols;
    const int64_t n = counts[static_cast<size_t>(rank_)] * cols;
    std::vector<float> sum(static_cast<size_t>(n), 0.0f);
    TESSERA_RETURN_IF_ERROR(exchange(full.data(), [&](const std::vector<const float*>& slots) {
      if (wire_ != core::WireType::kF32) return ring_sum(slots, rank_, at, counts[static_cast<size_t>(rank_)], cols, sum.data());
      for (int r = 0; r < world(); ++r)
        for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += slots[static_cast<size_t>(r)][at + i];
    }));
    copy(mine.data(), sum.data(), n);
    return core::ok_status();
  }

  Status allreduce_sum(std::span<float> data) override {
    const auto n = static_cast<int64_t>(data.size());
    stats_.add(CollectiveKind::kAllreduce, ring_allreduce_sent(n, world(), rank_));
    std::vector<float> sum(data.size(), 0.0f);
    TESSERA_RETURN_IF_ERROR(exchange(data.data(), [&](const std::vector<const float*>& slots) {
      if (wire_ != core::WireType::kF32) {
        // The comm layer's ring over n/K-element parts, each one row; every
        // rank then receives each part's sum as encoded by its owner.
        int64_t at = 0;
        for (int b = 0; b < world(); ++b) {
          const int64_t len = n / world() + (b < n % world() ? 1 : 0);
          ring_sum(slots, b, at, 1, len, sum.data() + at);
          core::wire_round_trip(wire_, sum.data() + at, 1, len);
          at += len;
        }
        return;
      }
      for (int r = 0; r < world(); ++r)  // rank order: every rank gets identical bits
        for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += slots[static_cast<size_t>(r)][i];
    }));
    copy(data.data(), sum.data(), n);
    return core::ok_status();
  }

  Status broadcast(std::span<float> data, int root) override {
    const auto n = static_cast<int64_t>(data.size());
    stats_.add(CollectiveKind::kBroadcast, tree_broadcast_sent(n, world(), rank_, root));
    TESSERA_RETURN_IF_ERROR(exchange(data.data(), [&](const std::vector<const float*>& slots) {
      if (rank_ != root) copy(data.data(), slots[static_cast<size_t>(root)], n);
    }));
    // After the second barrier: the root may round its own copy now.
    core::wire_round_trip(wire_, data.data(), 1, n);
    return core::ok_status();
  }

  Status send(int peer, std::span<const float> data) override {
    if (peer < 0 || peer >= world() || peer == rank_) return core::invalid_argument("bad peer " + std::to_string(peer));
    stats_.add(CollectiveKind::kSendRecv, static_cast<int64_t>(data.size()));
    std::lock_guard<std::mutex> lock(g_->mu_);
    g_->mail_[{rank_, peer}].emplace_back(data.begin(), data.end());
    g_->cv_.notify_all();
    return core::ok_status();
  }

  Status recv(int peer, std::span<float> data) override {
    if (peer < 0 || peer >= world() || peer == rank_) return core::invalid_argument("bad peer " + std::to_string(peer));
    core::Timer t;
    std::unique_lock<std::mutex> lock(g_->mu_);
    auto& box = g_->mail_[{peer, rank_}];
    if (!g_->cv_.wait_for(lock, g_->timeout_, [&] { return !box.empty(); }))
      return core::timeout_error("rank " + std::to_string(rank_) + ": no message from rank " + std::to_string(peer));
    std::vector<float> msg = std::move(box.front());
    box.pop_front();
    stats_.blocked_ms += t.ms();
    if (msg.size() != data.size())
      return core::invalid_argument("expected " + std::to_string(data.size()) + " floats from rank " + std::to_string(peer) +
                                    ", got " + std::to_string(msg.size()));
    copy(data.data(), msg.data(), static_cast<int64_t>(msg.size()));
    core::wire_round_trip(wire_, data.data(), 1, static_cast<int64_t>(msg.size()));
    return core::ok_status();
  }

 private:
  static void copy(float* dst, const float* src, int64_t n) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }

  static int64_t total_rows(const std::vector<int64_t>& counts) {
    return std::accumulate(counts.begin(), counts.end(), int64_t{0});
  }

  // The comm layer's ring ReduceScatter of one part (rows x cols at element
  // `at` of every slot) owned by rank b: rank b+1 sends its rows, each next
  // rank decodes what it got and adds its own, the last is b. Same bits as
  // the wire, for any wire type.
  void ring_sum(const std::vector<const float*>& slots, int b, int64_t at, int64_t rows, int64_t cols, float* out) const {
    const int k = world();
    const int64_t n = rows * cols;
    const float* first = slots[static_cast<size_t>((b + 1) % k)] + at;
    std::copy(first, first + n, out);
    for (int s = 1; s < k; ++s) {
      core::wire_round_trip(wire_, out, rows, cols);
      const float* m = slots[static_cast<size_t>((b + 1 + s) % k)] + at;
      for (int64_t i = 0; i < n; ++i) out[i] = out[i] + m[i];
    }
  }

  void concat(const std::vector<const float*>& slots, const std::vector<int64_t>& counts, int64_t cols, float* all) const {
    int64_t at = 0;
    for (int r = 0; r < world(); ++r) {
      copy(all + at * cols, slots[static_cast<size_t>(r)], counts[static_cast<size_t>(r)] * cols);
      at += counts[static_cast<size_t>(r)];
    }
  }

  // Publishes `mine`, waits for every rank, runs `read` on all slots, waits again.
  template <typename Fn>
  Status exchange(const float* mine, Fn read) {
    core::Timer t;
    {
      std::lock_guard<std::mutex> lock(g_->mu_);
      g_->slots_[static_cast<size_t>(rank_)] = mine;
    }
    TESSERA_RETURN_IF_ERROR(g_->barrier());
    read(g_->slots_);
    TESSERA_RETURN_IF_ERROR(g_->barrier());
    stats_.blocked_ms += t.ms();
    return core::ok_status();
  }

  LocalGroup* g_;
  int rank_;
};

LocalGroup::LocalGroup(int world, std::chrono::milliseconds timeout)
    : world_(world), timeout_(timeout), slots_(static_cast<size_t>(world), nullptr), out_slots_(static_cast<size_t>(world)) {
  TESSERA_CHECK(world >= 1);
}

std::unique_ptr<Synchronizer> LocalGroup::member(int rank) {
  TESSERA_CHECK(rank >= 0 && rank < world_);
  return std::make_unique<LocalMember>(this, rank);
}

Status LocalGroup::barrier() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return core::ok_status();
  }
  if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != gen; }))
    return core::timeout_error("local group barrier timed out");
  return core::ok_status();
}

}  // namespace tessera::parallel
