// PRISM (Qazi, Iosifidis, Zhang): position-wise partitioning in which devices
// exchange a few segment means (Eq. 8-9) instead of their rows, and compute
// keys and values from their own rows plus the other partitions' means
// (Eq. 6), with count-scaled softmax (Eq. 12-15) and the partition-aware
// causal mask (Eq. 17). The shape maths here are pure functions; the layer
// loop is the strategy's run() (Prism in prism.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "parallel/partition.h"

namespace tessera::parallel {

struct Plan;

// The plan's rate and segment options (0 = unset).
double prism_rate(const Plan& plan);
int64_t prism_segments_option(const Plan& plan);

// Segment means of a partition of `rows` rows: max(1, floor(rows / rate))
// when a rate is given (Eq. 16 for equal partitions), else min(segments,
// rows); an empty partition has none.
int64_t prism_segment_count(int64_t rows, double rate, int64_t segments);

// Eq. 8 / Algorithm 2: `l` segments of floor(rows / l) rows, the last one
// also taking the remainder; offsets relative to the partition.
std::vector<Range> prism_segments(int64_t rows, int64_t l);

// What every device derives from the plan and the row count.
struct PrismLayout {
  std::vector<Range> rows;                   // each device's partition (global rows)
  std::vector<std::vector<Range>> segments;  // each device's segments, partition-relative
  std::vector<int64_t> means;                // L_p of each device
  int64_t total_means() const;
  // Keys device p attends over: its own rows plus every other device's means.
  int64_t key_rows(int p) const;
};
PrismLayout prism_layout(const Plan& plan, int64_t n);

// out[s] = column means of x's rows in segments[s]; x [rows, cols] packed.
void segment_means_f32(const float* x, int64_t cols, const std::vector<Range>& segments, float* out);

}  // namespace tessera::parallel
