// What a strategy will run, as a pure function of the plan, the model's
// config and the row count: per device, phase by phase, each kernel call with
// its shape and FLOPs, and each transfer with its kind, bytes and peers. The
// planner prices it with device and link profiles; tests check its bytes
// against what the comm layer counted and its FLOPs against the kernels'
// own count.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quant.h"
#include "parallel/sync.h"

namespace tessera::parallel {

enum class WorkKind { kGemm, kAttention, kElementwise };
const char* work_kind_name(WorkKind k);

// One kernel call. GEMM: m x k times k x n. Attention: n_q = m query rows
// over n_kv = n keys, heads x head_dim = k. Elementwise: m rows of n.
struct Work {
  WorkKind kind = WorkKind::kGemm;
  std::string what;  // "qkv", "attention", "ffn_in", ...
  int64_t m = 0, k = 0, n = 0;
  double flops = 0;  // 2 per multiply-add (GEMM, attention); 0 for element-wise
  // Memory it streams that its FLOPs do not price: a decode step's read of
  // its K/V caches (add_cache_reads), bound by bandwidth, not arithmetic.
  int64_t bytes = 0;
  // kGemm: the type its weights are held in (estimate() stamps the plan's),
  // since a quantized matrix runs on other kernels than an F32 one.
  kernels::WeightType weights = kernels::WeightType::kF32;
  // A mixed file's layers: the share of their weights held in `mix` instead
  // (ModelConfig::mix_other), priced at that type's rate.
  kernels::WeightType mix = kernels::WeightType::kF32;
  double mix_share = 0;
};

// One collective (or point-to-point message) as this device takes part in it.
struct Transfer {
  CollectiveKind kind = CollectiveKind::kAllgather;
  std::string what;
  int64_t bytes_sent = 0;
  std::vector<int> peers;  // the devices it exchanges data with
};

// A step between two synchronisation points. `work` runs, then `transfers`
// complete; with `overlapped`, the work runs while the transfers travel
// (ring tiles), so the phase lasts about max(work, transfers) rather than
// their sum.
struct Phase {
  std::string name;
  int64_t layer = -1;  // -1: before or after the layers
  std::vector<Work> work;
  std::vector<Transfer> transfers;
  bool overlapped = false;
};

struct DeviceSchedule {
  std::vector<Phase> phases;
  int64_t weight_bytes = 0;      // what the device loads
  int64_t activation_bytes = 0;  // peak of its activation buffers
  std::vector<int64_t> kv_layer_bytes;  // its KV caches at the context, per layer (generation plans; add_kv_cache)
  int64_t kv_bytes() const;             // their sum
  double flops() const;
  int64_t bytes_sent() const;
  int64_t bytes_sent(CollectiveKind kind) const;
  std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> bytes_by_kind() const;
};

struct Schedule {
  std::vector<DeviceSchedule> devices;
};

// Builders for the common shapes.
Work gemm(std::string what, int64_t m, int64_t k, int64_t n);
Work attention(std::string what, int64_t n_q, int64_t n_kv, int64_t width);
Work elementwise(std::string what, int64_t rows, int64_t cols);
Transfer transfer(CollectiveKind kind, std::string what, int64_t floats_sent, std::vector<int> peers);
std::vector<int> everyone_but(int rank, int world);

}  // namespace tessera::parallel
