// `tessera keygen` and `tessera comm-bench` end to end (the test depends on
// the tessera binary, so CMake builds it first).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/keys.h"
#include "core/io.h"

using namespace tessera;

namespace {

// Runs a shell command; returns its exit code and stdout.
int run(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST(CommCli, KeygenWritesAUsableKey) {
  const std::string path = ::testing::TempDir() + "cli-" + std::to_string(::getpid()) + ".key";
  std::remove(path.c_str());
  std::string out;
  ASSERT_EQ(run(std::string(TESSERA_BIN) + " keygen --out " + path, &out), 0);
  auto key = comm::read_key_file(path);
  ASSERT_TRUE(key.ok()) << key.status().to_string();
  EXPECT_NE(run(std::string(TESSERA_BIN) + " keygen --out " + path + " 2>/dev/null", &out), 0);  // exists
  std::remove(path.c_str());
}

TEST(CommCli, AllgatherBenchReportsBytesPerRank) {
  std::string out;
  ASSERT_EQ(run(std::string(TESSERA_BIN) + " comm-bench --ranks 3 --op allgather --bytes 300000 --iters 2 --json", &out), 0)
      << out;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["per_rank"].size(), 3u);
  for (const auto& r : j["per_rank"]) {
    EXPECT_EQ(r["per_op"]["allgather"]["bytes_sent"], 2 * 200000);  // (K-1)/K of the total, per iteration
    EXPECT_EQ(r["per_op"]["allgather"]["calls"], 2);
  }
  EXPECT_GT(j["algbw_bytes_per_s"].get<double>(), 0);
}

TEST(CommCli, PacedSendRecvMatchesTheLink) {
  std::string out;
  ASSERT_EQ(run(std::string(TESSERA_BIN) +
                    " comm-bench --ranks 2 --op sendrecv --bytes 10000000 --link 100mbit --iters 1 --warmup 0 --json",
                &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  // A lower bound only: 10 MB cannot cross a 100 Mbit/s link in less than
  // 0.8 s. How close to the link rate it gets is the benchmark's figure, not
  // a test's (Link.PacerSerialisesAndDelays checks the pacer's model exactly).
  const double s = j["mean_seconds"].get<double>();
  EXPECT_GT(s, 0.6);
  ASSERT_EQ(j["per_rank"].size(), 2u);
  for (const auto& r : j["per_rank"]) {  // the whole message crossed, once
    const auto& p2p = r["per_op"]["p2p"];
    EXPECT_EQ(r["rank"] == 0 ? p2p["bytes_sent"] : p2p["bytes_received"], 10000000) << r.dump();
  }
}
