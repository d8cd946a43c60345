#include "parallel/schedule.h"

#include <numeric>

namespace tessera::parallel {

const char* work_kind_name(WorkKind k) {
  switch (k) {
    case WorkKind::kGemm: return "gemm";
    case WorkKind::kAttention: return "attention";
    case WorkKind::kElementwise: return "elementwise";
  }
  return "?";
}

int64_t DeviceSchedule::kv_bytes() const { return std::accumulate(kv_layer_bytes.begin(), kv_layer_bytes.end(), int64_t{0}); }

double DeviceSchedule::flops() const {
  double f = 0;
  for (const Phase& p : phases)
    for (const Work& w : p.work) f += w.flops;
  return f;
}

std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> DeviceSchedule::bytes_by_kind() const {
  std::array<int64_t, static_cast<size_t>(CollectiveKind::kCount)> b{};
  for (const Phase& p : phases)
    for (const Transfer& t : p.transfers) b[static_cast<size_t>(t.kind)] += t.bytes_sent;
  return b;
}

int64_t DeviceSchedule::bytes_sent(CollectiveKind kind) const { return bytes_by_kind()[static_cast<size_t>(kind)]; }

int64_t DeviceSchedule::bytes_sent() const {
  int64_t total = 0;
  for (int64_t b : bytes_by_kind()) total += b;
  return total;
}

Work gemm(std::string what, int64_t m, int64_t k, int64_t n) {
  return {WorkKind::kGemm, std::move(what), m, k, n, 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n)};
}

Work attention(std::string what, int64_t n_q, int64_t n_kv, int64_t width) {
  // Q K^T and P V: 2 * n_q * n_kv * width each.
  return {WorkKind::kAttention, std::move(what), n_q, width, n_kv,
          4.0 * static_cast<double>(n_q) * static_cast<double>(n_kv) * static_cast<double>(width)};
}

Work elementwise(std::string what, int64_t rows, int64_t cols) {
  return {WorkKind::kElementwise, std::move(what), rows, 0, cols, 0.0};
}

Transfer transfer(CollectiveKind kind, std::string what, int64_t floats_sent, std::vector<int> peers) {
  return {kind, std::move(what), floats_sent * static_cast<int64_t>(sizeof(float)), std::move(peers)};
}

std::vector<int> everyone_but(int rank, int world) {
  std::vector<int> v;
  for (int r = 0; r < world; ++r)
    if (r != rank) v.push_back(r);
  return v;
}

}  // namespace tessera::parallel
