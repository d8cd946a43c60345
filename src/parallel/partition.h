// Shard maths as pure functions: which rows, heads, FFN columns and layers
// each device owns. No I/O, no communication; tested for 1..8 devices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace tessera::parallel {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// k equal weights.
std::vector<double> equal_ratios(int k);
// "3,1,1" -> normalised weights for k devices (k entries, all >= 0, sum > 0).
core::Result<std::vector<double>> parse_ratios(const std::string& text, int k);
// Splits [0, n) into contiguous ranges proportional to `ratios` (largest
// remainder rounding, so sizes differ from the exact share by < 1). A device
// with ratio 0 gets an empty range; any device may get zero rows when n < k.
std::vector<Range> split_by_ratio(int64_t n, const std::vector<double>& ratios);
// Counts of each range.
std::vector<int64_t> range_sizes(const std::vector<Range>& ranges);
// First row of each part given the parts' row counts; one more entry, the total.
std::vector<int64_t> row_offsets(const std::vector<int64_t>& counts);

// Voltage Theorem 2: true when Eq. (8) ((x_p W_Q) W_K^T) x^T is cheaper than
// Eq. (3) for a partition of p rows out of n, hidden f and head size fh:
// 1/p - 1/n > (f - fh) / (f * fh).
bool voltage_prefers_eq8(int64_t p, int64_t n, int64_t f, int64_t fh);

// Pipeline placement: device of each layer.
struct LayerMap {
  std::vector<int> device_of_layer;
  int devices = 0;
  // Maximal runs of consecutive layers on one device, in order.
  struct Stage {
    int device;
    Range layers;
  };
  std::vector<Stage> stages() const;
  std::vector<int64_t> layers_on(int device) const;
};
// Contiguous, equal layer ranges (earlier devices take the remainder).
LayerMap contiguous_layers(int64_t layers, int devices);
// "0-5:0,6-11:1": every layer exactly once, devices < `devices`.
core::Result<LayerMap> parse_layer_map(const std::string& text, int64_t layers, int devices);

}  // namespace tessera::parallel
