// Local links are measured through the transport the run will use: CURVE
// encrypted unless the run is insecure (encrypting and decrypting a message
// is part of its transfer time), paced by the emulated link either way.
#include "runtime/cluster_profile.h"

#include <gtest/gtest.h>

namespace tessera::runtime {
namespace {

TEST(LocalLinksTest, MeasuredEncryptedOrNotAndNeverFasterThanTheEmulatedLink) {
  for (const bool secure : {true, false}) {
    auto links = measure_local_links(3, "1gbit,0.2ms", secure);
    ASSERT_TRUE(links.ok()) << secure << ": " << links.status().to_string();
    ASSERT_EQ(links->size(), 3u);
    for (size_t a = 0; a < 3; ++a) {
      ASSERT_EQ((*links)[a].size(), 3u);
      for (size_t b = 0; b < 3; ++b) {
        if (a == b) continue;
        const planner::LinkProfile& l = (*links)[a][b];
        // Pacing only ever delays a message: a slow machine measures less, never more.
        EXPECT_GE(l.latency_ms, 0.2 * 0.95) << secure << " " << a << "->" << b;
        EXPECT_GT(l.bandwidth_mbps, 0) << secure;
        EXPECT_LE(l.bandwidth_mbps, 1000 * 1.05) << secure << " " << a << "->" << b;
      }
    }
  }
}

// Encrypting costs CPU time: the rate is positive and no faster than a
// memory copy could be (1 TB/s bounds any machine here).
TEST(LocalLinksTest, EncryptionHasACpuRate) {
  const auto gbps = measure_crypto_gbps();
  ASSERT_TRUE(gbps.ok()) << gbps.status().to_string();
  EXPECT_GT(gbps.value(), 0);
  EXPECT_LT(gbps.value(), 1000);
}

}  // namespace
}  // namespace tessera::runtime
