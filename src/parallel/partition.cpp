#include "parallel/partition.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace tessera::parallel {

std::vector<double> equal_ratios(int k) { return std::vector<double>(static_cast<size_t>(std::max(k, 0)), 1.0 / std::max(k, 1)); }

core::Result<std::vector<double>> parse_ratios(const std::string& text, int k) {
  std::vector<double> r;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !std::isfinite(v) || v < 0)
      return core::invalid_argument("partition entry '" + item + "' is not a non-negative number");
    r.push_back(v);
  }
  if (static_cast<int>(r.size()) != k)
    return core::invalid_argument("partition has " + std::to_string(r.size()) + " entries for " + std::to_string(k) + " devices");
  const double sum = std::accumulate(r.begin(), r.end(), 0.0);
  if (!(sum > 0)) return core::invalid_argument("partition ratios sum to zero");
  for (double& v : r) v /= sum;
  return r;
}

std::vector<Range> split_by_ratio(int64_t n, const std::vector<double>& ratios) {
  const size_t k = ratios.size();
  std::vector<Range> out(k);
  if (k == 0) return out;
  // Shares relative to the largest: a peer's plan may hold 1e308 (whose
  // sum, and n times it, would be infinite), a NaN or a negative (none).
  std::vector<double> share(k, 0.0);
  double top = 0;
  for (size_t i = 0; i < k; ++i) {
    share[i] = std::isfinite(ratios[i]) && ratios[i] > 0 ? ratios[i] : 0.0;
    top = std::max(top, share[i]);
  }
  double sum = std::accumulate(share.begin(), share.end(), 0.0);
  if (!std::isfinite(sum)) {
    sum = 0;
    for (double& s : share) sum += (s /= top);
  }
  if (!(sum > 0)) sum = 1.0;
  std::vector<int64_t> size(k);
  std::vector<std::pair<double, size_t>> rem;
  int64_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    double exact = static_cast<double>(n) * share[i] / sum;
    if (!std::isfinite(exact)) exact = static_cast<double>(n) * (share[i] / sum);  // (1e300 of 2e300)
    exact = std::clamp(exact, 0.0, static_cast<double>(n));
    size[i] = static_cast<int64_t>(std::floor(exact));
    given += size[i];
    rem.push_back({exact - static_cast<double>(size[i]), i});
  }
  // Largest remainders first; ties to the lower rank.
  std::stable_sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t j = 0; given < n; ++j, ++given) ++size[rem[j % k].second];
  int64_t at = 0;
  for (size_t i = 0; i < k; ++i) {
    out[i] = {at, at + size[i]};
    at += size[i];
  }
  return out;
}

std::vector<int64_t> range_sizes(const std::vector<Range>& ranges) {
  std::vector<int64_t> s;
  for (const auto& r : ranges) s.push_back(r.size());
  return s;
}

std::vector<int64_t> row_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t q = 0; q < counts.size(); ++q) at[q + 1] = at[q] + counts[q];
  return at;
}

bool voltage_prefers_eq8(int64_t p, int64_t n, int64_t f, int64_t fh) {
  if (p <= 0 || n <= 0) return false;
  return 1.0 / static_cast<double>(p) - 1.0 / static_cast<double>(n) >
         static_cast<double>(f - fh) / (static_cast<double>(f) * static_cast<double>(fh));
}

std::vector<LayerMap::Stage> LayerMap::stages() const {
  std::vector<Stage> out;
  for (size_t l = 0; l < device_of_layer.size(); ++l) {
    const int d = device_of_layer[l];
    if (!out.empty() && out.back().device == d && out.back().layers.end == static_cast<int64_t>(l)) {
      ++out.back().layers.end;
    } else {
      out.push_back({d, {static_cast<int64_t>(l), static_cast<int64_t>(l) + 1}});
    }
  }
  return out;
}

std::vector<int64_t> LayerMap::layers_on(int device) const {
  std::vector<int64_t> out;
  for (size_t l = 0; l < device_of_layer.size(); ++l)
    if (device_of_layer[l] == device) out.push_back(static_cast<int64_t>(l));
  return out;
}

LayerMap contiguous_layers(int64_t layers, int devices) {
  LayerMap m;
  m.devices = devices;
  const auto ranges = split_by_ratio(layers, equal_ratios(devices));
  m.device_of_layer.resize(static_cast<size_t>(layers));
  for (int d = 0; d < devices; ++d)
    for (int64_t l = ranges[static_cast<size_t>(d)].begin; l < ranges[static_cast<size_t>(d)].end; ++l)
      m.device_of_layer[static_cast<size_t>(l)] = d;
  return m;
}

core::Result<LayerMap> parse_layer_map(const std::string& text, int64_t layers, int devices) {
  LayerMap m;
  m.devices = devices;
  m.device_of_layer.assign(static_cast<size_t>(layers), -1);
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    long long a = 0, b = 0, d = 0;
    char dash = 0, colon = 0;
    std::stringstream is(item);
    if (item.find('-') != std::string::npos) {
      is >> a >> dash >> b >> colon >> d;
    } else {
      is >> a >> colon >> d;
      b = a;
      dash = '-';
    }
    if (is.fail() || !is.eof() || dash != '-' || colon != ':')
      return core::invalid_argument("layer map entry '" + item + "' is not FIRST-LAST:DEVICE");
    if (a < 0 || b < a || b >= layers) return core::out_of_range("layer range '" + item + "' outside 0.." + std::to_string(layers - 1));
    if (d < 0 || d >= devices) return core::out_of_range("device in '" + item + "' outside 0.." + std::to_string(devices - 1));
    for (long long l = a; l <= b; ++l) {
      if (m.device_of_layer[static_cast<size_t>(l)] != -1)
        return core::invalid_argument("layer " + std::to_string(l) + " is assigned twice");
      m.device_of_layer[static_cast<size_t>(l)] = static_cast<int>(d);
    }
  }
  for (int64_t l = 0; l < layers; ++l)
    if (m.device_of_layer[static_cast<size_t>(l)] == -1)
      return core::invalid_argument("layer " + std::to_string(l) + " is not assigned to a device");
  return m;
}

}  // namespace tessera::parallel
