#include "core/thread_pool.h"

#include "core/device_speed.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace tessera::core {

namespace {
// A decode step is ~50 short parallel loops a few microseconds apart; waking
// a sleeping thread costs about as much as one of them. So both sides spin
// (yielding, so that other runnable threads keep the core) this long before
// they sleep on the condition variables.
constexpr auto kSpin = std::chrono::microseconds(200);

// Spins until done() or kSpin has passed; whether done() became true.
template <typename Done>
bool spin_until(Done done) {
  const auto end = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
}

void chunk_of(int64_t n, int parts, int index, int64_t* begin, int64_t* end) {
  const int64_t base = n / parts, rem = n % parts;
  *begin = index * base + std::min<int64_t>(index, rem);
  *end = *begin + base + (index < rem ? 1 : 0);
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    pending_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  int64_t b, e;
  chunk_of(n, size(), 0, &b, &e);
  if (b < e) fn(b, e);
  spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_.load() == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
  mark_kernel_helper_thread();  // its chunks are parts of the caller's kernel
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
      job = job_;
      n = job_n_;
    }
    int64_t b, e;
    chunk_of(n, size(), index, &b, &e);
    if (b < e) (*job)(b, e);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.fetch_sub(1) == 1) done_cv_.notify_one();
    }
  }
}

}  // namespace tessera::core
