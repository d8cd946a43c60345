// Ranks as threads of one process sharing memory: the fake synchronizer for
// multi-rank tests with no network. Results are exactly what the collectives
// define; the accounting is what the comm layer's ring algorithms send.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/sync.h"

namespace tessera::parallel {

class LocalGroup {
 public:
  explicit LocalGroup(int world, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  int world() const { return world_; }
  // The synchronizer for one rank; call once per rank, use from its thread.
  std::unique_ptr<Synchronizer> member(int rank);

 private:
  friend class LocalMember;
  core::Status barrier();

  const int world_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<const float*> slots_;  // one pointer per rank for the current collective
  std::vector<float*> out_slots_;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mail_;  // (from, to) -> messages
};

}  // namespace tessera::parallel
