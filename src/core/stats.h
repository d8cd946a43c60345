// Order statistics of measurements, in one place for every command.
#pragma once

#include <cstddef>
#include <vector>

namespace tessera::core {

// The median (mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);
// Index of the run whose value is the (lower) median, for reporting that
// run's other figures; 0 for none.
size_t median_index(const std::vector<double>& values);

}  // namespace tessera::core
