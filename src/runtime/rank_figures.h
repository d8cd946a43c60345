// The figures every rank reports after a run or a generation (the session's
// --stats): time split into compute and waiting, bytes per collective kind,
// weight bytes and memory as the planner predicts it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "comm/group.h"
#include "parallel/sync.h"

namespace tessera::runtime {

// The resident memory a device's figure starts from, just before it loads:
// the GEMM library is initialised first (process start-up, like the binary's
// own code), and the peak starts over from here.
int64_t memory_baseline();

// memory_bytes is the device's memory as the planner predicts it: peak
// resident memory less what was resident just before the model loaded.
nlohmann::json rank_stats(const parallel::Synchronizer& sync, const comm::Group& g, double total_ms, int64_t weight_bytes,
                          int64_t rss_before_load);

}  // namespace tessera::runtime
