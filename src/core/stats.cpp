#include "core/stats.h"

#include <algorithm>
#include <numeric>

namespace tessera::core {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

size_t median_index(const std::vector<double>& values) {
  if (values.empty()) return 0;
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  return order[(values.size() - 1) / 2];
}

}  // namespace tessera::core
