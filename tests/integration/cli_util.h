// What the integration tests share: the fixture folder, the binary, per-test
// temporary paths, and running the binary with its output captured.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/io.h"
#include "model/safetensors.h"

namespace tessera::testing {

inline const std::string kData = TESSERA_TEST_DATA;
inline const std::string kBin = TESSERA_BIN;

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
