// Device and link profiles: what the cost model prices a Schedule with.
// A device profile is measured by running the model's own kernels at the row
// counts the strategies use; a link profile (latency and bandwidth of each
// ordered pair) is measured through the real transport by runtime/, which
// fills these structures. Both round-trip through JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/config.h"

namespace tessera::planner {

// One measured GEMM shape: m x k times k x n ran at `gflops`.
struct GemmSample {
  int64_t m = 0, k = 0, n = 0;
  double gflops = 0;
  // The weights' type: a quantized model's matrices run on its kernels (JSON:
  // a fifth element, absent for F32).
  kernels::WeightType type = kernels::WeightType::kF32;
};

struct DeviceProfile {
  std::string name;  // host or endpoint
  int threads = 1;
  std::vector<GemmSample> gemm;
  double attention_gflops = 0;
  double elementwise_gbps = 0;  // bytes read + written per second by layer norm, in GB/s
  double stream_gbps = 0;       // a streaming read
  // The same read with every CPU of the host reading at once, in all: the
  // memory bandwidth that devices emulated on one host share (two local
  // devices decoding at once each read 0.55-0.87x of stream_gbps on an Intel
  // Xeon VM in one session, their full rate in the next). 0: not measured.
  double host_stream_gbps = 0;
  // Devices with the same host (>= 0) share its memory bandwidth while they
  // compute at once: the local devices of one machine. -1: a host of its own.
  int host = -1;
  // Fresh memory allocated and zeroed, page faults included: what a
  // generation's KV caches cost when it starts (0: not measured).
  double zero_gbps = 0;
  // Bytes a second a core encrypts (or decrypts) on the transport (CURVE)
  // when the transport shares the compute's cores, as local devices do: an
  // overlapped exchange's encryption then lengthens the work under it. 0:
  // not measured, in the clear, or the transport has cores of its own.
  double crypto_gbps = 0;
  int64_t memory_bytes = 0;     // the memory available to Tessera (its budget)
  // What the kernels' libraries keep resident once used (JIT code, scratch
  // pools), on top of a plan's weights and activations.
  int64_t runtime_bytes = 0;
  // Emulated speed (--device-speed): a kernel that took t lasts t / speed.
  double speed = 1.0;

  // GFLOP/s of the measured sample nearest to the shape (log distance).
  // The nearest sample of weights in `type`; F32's where none was measured.
  double gemm_gflops(int64_t m, int64_t k, int64_t n, kernels::WeightType type = kernels::WeightType::kF32) const;
  bool measured(kernels::WeightType type) const;  // any GEMM sample of weights in `type`
  nlohmann::json to_json() const;
  [[nodiscard]] static core::Result<DeviceProfile> from_json(const nlohmann::json& j);
};

struct LinkProfile {
  double latency_ms = 0;
  double bandwidth_mbps = 0;  // megabits per second; 0 = no link
};

struct ClusterProfile {
  std::vector<DeviceProfile> devices;
  // links[a][b]: from device a to device b (the diagonal is unused).
  std::vector<std::vector<LinkProfile>> links;
  // The same devices measured at a decode step's rows (one row; a batched
  // step's B with `profile --max-batch B`), which `tessera profile` stores
  // beside the prompt's: a profile file then prices a generation's steps as
  // a measured run does, not on the prompt's GEMM rates (which flatter a
  // one-row step). Empty: none.
  struct Step {
    int64_t rows = 0;
    std::vector<DeviceProfile> devices;  // one for each of `devices`
  };
  std::vector<Step> steps;
  const Step* step(int64_t rows) const;  // null: none measured at these rows

  int size() const { return static_cast<int>(devices.size()); }
  const LinkProfile& link(int from, int to) const;
  // The profile of the devices in `subset`, in that order (the first stays the terminal).
  ClusterProfile subset(const std::vector<int>& members) const;
  nlohmann::json to_json() const;
  [[nodiscard]] static core::Result<ClusterProfile> from_json(const nlohmann::json& j);
  [[nodiscard]] static core::Result<ClusterProfile> load(const std::string& path);
  [[nodiscard]] core::Status save(const std::string& path) const;
};

// The row counts whose GEMMs a device profile measures: n, and n split over
// 2..max_devices (the shares the row and ring strategies run).
std::vector<int64_t> profile_row_counts(int64_t n, int max_devices);

// Runs the model's kernels (GEMM at every shape class the strategies use for
// n rows on up to max_devices devices, attention, layer norm, a streaming
// read) on `pool` and reads the memory available. Takes a few seconds.
[[nodiscard]] core::Result<DeviceProfile> measure_device(const model::ModelConfig& c, int64_t n, int max_devices,
                                                         core::ThreadPool* pool);

// Bytes a profile's one-row samples and its streaming read go through, so
// that no cache still holds them when read again: twice the last-level
// cache, at least 96 MB, at most an eighth of the memory available (but
// never under 96 MB).
int64_t profile_cold_bytes();
// The same for a last-level cache of `llc` bytes and `available` bytes of
// memory (0: unknown).
int64_t profile_cold_bytes(int64_t llc, int64_t available);

// The cache file of a device profile: per host, model (its config's shape),
// rows and thread count, under $XDG_CACHE_HOME/tessera (or ~/.cache/tessera).
std::string device_cache_path(const model::ModelConfig& c, int64_t n, int threads);

// "512MB", "1GB", "1.5GiB", "1000000" -> bytes.
[[nodiscard]] core::Result<int64_t> parse_bytes(const std::string& text);
std::string format_bytes(int64_t bytes);

}  // namespace tessera::planner
