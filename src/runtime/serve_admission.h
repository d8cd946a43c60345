// Inside `tessera serve`: the bounded request queue (429 with Retry-After
// when full) and the FIFO turn at the model. Apart from the Server because it
// knows nothing of HTTP or the model: a counter and a ticket line.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace tessera::runtime::serve_detail {

using Clock = std::chrono::steady_clock;

// At most `capacity` requests are admitted (running or waiting); the model
// runs one at a time, in the order they were admitted.
class Admission {
 public:
  explicit Admission(int capacity) : capacity_(capacity) {}
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
  // Waits for the model (FIFO) until `deadline`; false when it passed.
  bool acquire(Clock::time_point deadline) {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t ticket = next_++;
    if (cv_.wait_until(l, deadline, [&] { return serving_ == ticket; })) return true;
    abandoned_.push_back(ticket);  // skipped when its turn comes
    return false;
  }
  void release() {
    std::lock_guard<std::mutex> l(mu_);
    ++serving_;
    while (std::find(abandoned_.begin(), abandoned_.end(), serving_) != abandoned_.end()) {
      abandoned_.erase(std::find(abandoned_.begin(), abandoned_.end(), serving_));
      ++serving_;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int capacity_;
  int admitted_ = 0;
  uint64_t next_ = 0, serving_ = 0;
  std::vector<uint64_t> abandoned_;
};

}  // namespace tessera::runtime::serve_detail
