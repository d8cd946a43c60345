// Shard maths for 1..8 devices, no network.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <numeric>

#include "parallel/partition.h"
#include "parallel/sync.h"

namespace tessera::parallel {
namespace {

TEST(PartitionTest, SplitsCoverEveryRowOnceForOneToEightDevices) {
  for (int k = 1; k <= 8; ++k)
    for (int64_t n : {0, 1, 3, 7, 128, 129}) {
      const auto r = split_by_ratio(n, equal_ratios(k));
      ASSERT_EQ(static_cast<int>(r.size()), k);
      int64_t at = 0;
      for (const auto& x : r) {
        EXPECT_EQ(x.begin, at);
        EXPECT_GE(x.size(), n / k);
        EXPECT_LE(x.size(), n / k + 1);
        at = x.end;
      }
      EXPECT_EQ(at, n);
    }
}

TEST(PartitionTest, UnevenRatiosFollowTheShares) {
  const auto r = split_by_ratio(10, {3, 1, 0, 1});
  EXPECT_EQ(range_sizes(r), (std::vector<int64_t>{6, 2, 0, 2}));
  const auto s = range_sizes(split_by_ratio(2, {1, 1, 1}));
  EXPECT_EQ(std::accumulate(s.begin(), s.end(), int64_t{0}), 2);
  EXPECT_EQ(range_sizes(split_by_ratio(7, {0.5, 0.5})), (std::vector<int64_t>{4, 3}));
  // A peer's absurd shares split n all the same, with no overflow: huge
  // (their sum infinite), NaN, infinite and negative ones count as none.
  EXPECT_EQ(range_sizes(split_by_ratio(10, {1e308, 1e308})), (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(range_sizes(split_by_ratio(10, {1e308, 1})), (std::vector<int64_t>{10, 0}));
  EXPECT_EQ(range_sizes(split_by_ratio(10, {1e300, 1e300, 2e300})), (std::vector<int64_t>{3, 2, 5}));
  EXPECT_EQ(range_sizes(split_by_ratio(10, {std::nan(""), 1, -1, std::numeric_limits<double>::infinity()})), (std::vector<int64_t>{0, 10, 0, 0}));
  EXPECT_EQ(range_sizes(split_by_ratio(5, {0, 0})), (std::vector<int64_t>{3, 2}));
}

TEST(PartitionTest, ParsesRatios) {
  auto r = parse_ratios("3,1", 2);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ((*r)[0], 0.75);
  EXPECT_FALSE(parse_ratios("1,x", 2).ok());
  EXPECT_FALSE(parse_ratios("1,1", 3).ok());
  EXPECT_FALSE(parse_ratios("0,0", 2).ok());
  EXPECT_FALSE(parse_ratios("-1,2", 2).ok());
}

TEST(PartitionTest, VoltageOrderFollowsTheoremTwo) {
  // F = 768, F_H = 64: threshold (F - F_H)/(F F_H) = 0.01432.
  EXPECT_FALSE(voltage_prefers_eq8(128, 128, 768, 64));  // one device: Eq. (3)
  EXPECT_TRUE(voltage_prefers_eq8(32, 128, 768, 64));    // 1/32 - 1/128 = 0.0234
  EXPECT_FALSE(voltage_prefers_eq8(64, 128, 768, 64));   // 1/64 - 1/128 = 0.0078
  EXPECT_FALSE(voltage_prefers_eq8(0, 128, 768, 64));
}

TEST(PartitionTest, LayerMaps) {
  for (int k = 1; k <= 8; ++k) {
    const auto m = contiguous_layers(12, k);
    std::vector<int> seen(static_cast<size_t>(k), 0);
    for (size_t l = 1; l < m.device_of_layer.size(); ++l) EXPECT_LE(m.device_of_layer[l - 1], m.device_of_layer[l]);
    for (int d : m.device_of_layer) ++seen[static_cast<size_t>(d)];
    for (int s : seen) EXPECT_GE(s, 12 / k);
  }
  auto m = parse_layer_map("0-3:1,4-7:0,8-11:1", 12, 2);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->stages().size(), 3u);
  EXPECT_EQ(m->stages()[1].device, 0);
  EXPECT_EQ(m->layers_on(1).size(), 8u);
  EXPECT_FALSE(parse_layer_map("0-5:0", 12, 2).ok());        // layers missing
  EXPECT_FALSE(parse_layer_map("0-11:0,3-3:1", 12, 2).ok());  // twice
  EXPECT_FALSE(parse_layer_map("0-11:2", 12, 2).ok());        // no such device
  EXPECT_FALSE(parse_layer_map("zero-11:0", 12, 2).ok());
}

TEST(AccountingTest, RingFormulas) {
  // Equal parts: (K-1)/K of the total per rank; allreduce 2(K-1)/K.
  for (int k = 1; k <= 8; ++k)
    for (int r = 0; r < k; ++r) {
      EXPECT_EQ(ring_allgather_sent(std::vector<int64_t>(static_cast<size_t>(k), 8), 10, r), (k - 1) * 80);
      EXPECT_EQ(ring_allreduce_sent(8 * k, k, r), 2 * (k - 1) * 8);
    }
}

}  // namespace
}  // namespace tessera::parallel
