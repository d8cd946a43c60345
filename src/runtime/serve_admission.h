// Inside `tessera serve`: the bounded request queue (429 with Retry-After
// when full) and the FIFO turn at the model. Apart from the Server because it
// knows nothing of HTTP or the model: a counter and a ticket line.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

namespace tessera::runtime::serve_detail {

using Clock = std::chrono::steady_clock;

// At most `capacity` requests are admitted (running or waiting); up to
// `concurrency` of them run at once (serve --max-batch; else one), taking
// their turns in the order they were admitted.
class Admission {
 public:
  explicit Admission(int capacity, int concurrency = 1) : capacity_(capacity), concurrency_(std::max(concurrency, 1)) {}
  bool try_admit() {
    std::lock_guard<std::mutex> l(mu_);
    if (admitted_ >= capacity_) return false;
    ++admitted_;
    return true;
  }
  void leave() {
    std::lock_guard<std::mutex> l(mu_);
    --admitted_;
  }
  int depth() const {
    std::lock_guard<std::mutex> l(mu_);
    return admitted_;
  }
  // Waits for a turn at the model (FIFO) until `deadline`; false when it passed.
  bool acquire(Clock::time_point deadline) {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t ticket = next_++;
    waiting_.push_back(ticket);
    const bool got = cv_.wait_until(l, deadline, [&] { return running_ < concurrency_ && waiting_.front() == ticket; });
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
    if (got) ++running_;
    cv_.notify_all();  // the next in line may go (or move up)
    return got;
  }
  // Up to `k` more turns for a request that holds one, at once and only
  // while nobody waits in line (a request's extra choices never pass a
  // request admitted before them); how many it got. Each is release()d.
  int try_acquire_more(int k) {
    std::lock_guard<std::mutex> l(mu_);
    int got = 0;
    while (got < k && waiting_.empty() && running_ < concurrency_) ++running_, ++got;
    return got;
  }
  void release() {
    std::lock_guard<std::mutex> l(mu_);
    --running_;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int capacity_;
  const int concurrency_;
  int admitted_ = 0;
  int running_ = 0;
  uint64_t next_ = 0;
  std::deque<uint64_t> waiting_;  // tickets, in the order they came
};

}  // namespace tessera::runtime::serve_detail
