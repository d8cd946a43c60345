#include "runtime/rank_figures.h"

#include "core/io.h"
#include "kernels/gemm.h"

namespace tessera::runtime {

using nlohmann::json;

int64_t memory_baseline() {
  (void)kernels::gemm_path();
  core::reset_peak_resident();
  return core::resident_bytes();
}

json rank_stats(const parallel::Synchronizer& sync, const comm::Group& g, double total_ms, int64_t weight_bytes,
                int64_t rss_before_load) {
  const auto cs = g.stats();
  json by_kind = json::object(), elems = json::object();
  for (int k = 0; k < comm::kOpKindCount; ++k) {
    const auto& op = cs.per_op[static_cast<size_t>(k)];
    if (op.traffic.bytes_sent > 0) by_kind[comm::op_name(static_cast<comm::OpKind>(k))] = op.traffic.bytes_sent;
  }
  for (size_t k = 0; k < sync.stats().elements_sent.size(); ++k)
    if (sync.stats().elements_sent[k] > 0)
      elems[parallel::collective_name(static_cast<parallel::CollectiveKind>(k))] = sync.stats().elements_sent[k];
  return {{"rank", g.rank()},
          {"compute_ms", total_ms - sync.stats().blocked_ms},
          {"comm_ms", sync.stats().blocked_ms},
          {"bytes_sent", cs.total.bytes_sent},
          {"bytes_sent_by_kind", by_kind},
          {"elements_sent_by_kind", elems},
          {"weight_bytes", weight_bytes},
          {"peak_rss_bytes", core::peak_resident_bytes()},
          {"memory_bytes", core::peak_resident_bytes() - rss_before_load},
          {"unmatched_bytes_peak", cs.unmatched_bytes_peak},
          {"unmatched_frames_dropped", cs.unmatched_frames_dropped}};
}

}  // namespace tessera::runtime
