// What the integration tests share: the fixture folder, the binary, per-test
// temporary paths, and running the binary with its output captured.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/io.h"
#include "model/safetensors.h"

namespace tessera::testing {

inline const std::string kData = TESSERA_TEST_DATA;
inline const std::string kBin = TESSERA_BIN;

// Fixed ports for a test: windows of `count` ports at lo + w * stride for w
// in [0, windows), starting at window `start` (the test's pid picks it, so
// tests in parallel take different ones) and moving on past any window with
// a port already in use on 127.0.0.1. A service of the machine itself may
// listen on one: 0.0.0.0:2024 did, and a daemon test's terminal failed to
// bind it.
inline int free_port_window(int lo, int stride, int windows, int start, int count) {
  auto in_use = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    const int one = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // TIME_WAIT is not in use
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool taken = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0;
    ::close(fd);
    return taken;
  };
  for (int k = 0; k < windows; ++k) {
    const int base = lo + ((start + k) % windows) * stride;
    bool free = true;
    for (int p = base; p < base + count && free; ++p) free = !in_use(p);
    if (free) return base;
  }
  return lo + (start % windows) * stride;
}

// A path of the running test's own, so tests in parallel never share one.
inline std::string tmp(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "/" + info->name() + "-" + std::to_string(::getpid()) + "-" + name;
}

struct CmdResult {
  int code = -1;
  std::string out, err;
};

// Runs `tessera ARGS` (after the environment assignments in `env`, if any).
inline CmdResult run(const std::string& args, const std::string& env = "") {
  const std::string out = tmp("out.txt"), err = tmp("err.txt");
  const int status = std::system((env + (env.empty() ? "" : " ") + kBin + " " + args + " >" + out + " 2>" + err).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, core::read_file(out).value(), core::read_file(err).value()};
}

// A terminal budget under which `tessera plan PLAN_ARGS --json` chooses a
// plan that uses a worker: each time the choice runs on the terminal alone,
// the budget becomes a byte less than that plan needs. `other_budgets` are
// the workers' (",1GB,1GB"). Returns what the chosen plan needs on the
// terminal (the budget to run it with), or -1 when none is found.
inline int64_t terminal_budget_that_needs_a_worker(const std::string& plan_args, const std::string& other_budgets,
                                                   const std::string& env) {
  std::string limit;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const CmdResult r = run("plan " + plan_args + " --json" + limit, env);
    const auto t = nlohmann::json::parse(r.out, nullptr, false);
    if (r.code != 0 || !t.is_object() || !t.contains("chosen")) {
      ADD_FAILURE() << "plan failed: " << r.err << r.out;
      return -1;
    }
    const auto& row = t["rows"][t["chosen"].get<size_t>()];
    const int64_t terminal = row["prediction"]["devices"][0]["memory_bytes"].get<int64_t>();
    if (row["members"].size() >= 2) return terminal;
    limit = " --memory-limit " + std::to_string(terminal - 1) + other_budgets;
  }
  return -1;
}

// The largest difference between tensor `name` of two --dump files.
inline float dump_max_diff(const std::string& a_path, const std::string& b_path, const std::string& name) {
  auto a = model::SafeTensorsFile::open(a_path).value().get(name).value();
  auto b = model::SafeTensorsFile::open(b_path).value().get(name).value();
  EXPECT_EQ(a.shape(), b.shape());
  float m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
  return m;
}

}  // namespace tessera::testing
