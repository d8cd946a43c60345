// The cost model: a strategy's Schedule (estimate()) priced with device and
// link profiles. docs/planner.md writes the equations down.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "parallel/schedule.h"
#include "planner/profile.h"

namespace tessera::planner {

struct DevicePrediction {
  double compute_ms = 0;  // its kernels
  double comm_ms = 0;     // transfers not hidden behind work
  double wait_ms = 0;     // blocked on slower devices at synchronisation points
  double end_ms = 0;      // when it finished its last phase
  int64_t memory_bytes = 0;  // weight_bytes + activation_bytes
  int64_t budget_bytes = 0;  // the profile's memory (0: unknown)
};

struct Prediction {
  double latency_ms = 0;  // the terminal's end: the critical path
  double compute_ms = 0;  // compute on the critical path (the bottleneck device's)
  double comm_ms = 0;     // latency_ms - compute_ms
  int bottleneck = 0;     // the device that waits least (on the critical path)
  bool fits = true;       // every device within its memory budget
  std::string why_not;    // when it does not fit: device, need, budget
  int over_budget = -1;   // the first device over its budget
  std::vector<DevicePrediction> devices;
  nlohmann::json to_json() const;
};

// Milliseconds of one kernel call on a device.
double work_ms(const parallel::Work& w, const DeviceProfile& d);
// The same with the device streaming at `stream_gbps` (its share of a host's
// bandwidth while other devices there stream too) rather than its own rate.
double work_ms(const parallel::Work& w, const DeviceProfile& d, double stream_gbps);
// The streaming rate of device `d` while the devices `busy` of the profile
// (d among them) compute at once: its stream_gbps, or, where some share its
// host, its threads' share of the host's bandwidth if that is less (each
// other's threads weighted by its emulated speed).
double shared_stream_gbps(const ClusterProfile& p, int d, const std::vector<int>& busy);
// Each device's milliseconds for its work of one phase (`work[d]`; null or
// empty: none), the devices with work computing at once: where some share a
// host each streams at its share (shared_stream_gbps) until one finishes,
// whose share then goes to those still busy (processor sharing).
std::vector<double> phase_work_ms(const ClusterProfile& p, const std::vector<const std::vector<parallel::Work>*>& work);
// The profile with every device streaming at its share while all of them
// compute at once (a pipeline's overlapped steps, one group at each stage),
// each then a host of its own.
ClusterProfile streaming_at_once(ClusterProfile p);
// Milliseconds device `from` spends in one transfer: per ring or tree step
// the worst latency to its peers, then its bytes over its slowest link.
double transfer_ms(const parallel::Transfer& t, int from, const ClusterProfile& p);
// Latency steps of a collective among `participants` devices.
int collective_steps(parallel::CollectiveKind kind, int participants);

// Each device's predicted peak memory (weights + activations, estimate() for
// `rows` rows) against its budget (bytes; 0 = none): the error names the
// device, its need and its budget.
[[nodiscard]] core::Status check_memory_budgets(const parallel::Schedule& s, const std::vector<int64_t>& budgets);

// The terminal's own kernels, which no strategy's estimate() holds: the
// embedding before the layers and the head after them (GPT-2's LM head over
// every row is about 10 GFLOP at 128 rows).
std::vector<parallel::Work> embed_work(const model::ModelConfig& c, int64_t n);
std::vector<parallel::Work> head_work(const model::ModelConfig& c, int64_t n);
// Adds them to a prediction: they run on the terminal (device 0) before and
// after everything else, so they lengthen the end-to-end latency. The head
// runs on head_rows rows (< 0: all n; a generation's prefill: its last row).
void add_terminal_work(Prediction& pred, const model::ModelConfig& c, const ClusterProfile& p, int64_t n,
                       int64_t head_rows = -1);

// A generation: each device's KV caches (the schedule's kv_bytes, at the
// whole context) are mapped lazily, and the prompt's writes fault in
// `touched` of them (its positions over the context's). The prefill writes
// them layer by layer: each layer's slowest holder lengthens the time to the
// first token (kv_layer_bytes).
void add_cache_allocation(Prediction& pred, const parallel::Schedule& s, const ClusterProfile& p, double touched = 1.0);

// The critical path through every synchronisation point of the schedule.
// Device i of the schedule runs on device i of the profile.
[[nodiscard]] core::Result<Prediction> predict(const parallel::Schedule& s, const ClusterProfile& p);

}  // namespace tessera::planner
