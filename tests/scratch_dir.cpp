// Every test process works in a temporary folder of its own: ::testing::TempDir()
// (TEST_TMPDIR) and TMPDIR, which the processes a test starts inherit, name
// it. It is removed when the process's tests pass; a failing run keeps it and
// says where. Before, test files stayed in /tmp: 18,000 of them after a few
// days of runs on one machine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

namespace {

class ScratchDir : public ::testing::Environment {
 public:
  // In SetUp, not at load: listing the tests (CTest's discovery) makes none.
  void SetUp() override {
    // A process a test started (a worker re-running this binary) keeps its parent's.
    if (std::getenv("TESSERA_TEST_SCRATCH") != nullptr) return;
    const char* outer = std::getenv("TMPDIR");
    const std::string base = outer != nullptr && *outer != 0 ? outer : "/tmp";
    std::string templ = base + "/tessera-test-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) return;  // then the usual folder
    dir_ = templ;
    owner_ = ::getpid();
    // Files that outlive one process (the llama.cpp peer's install) stay outside.
    ::setenv("TESSERA_TEST_OUTER_TMPDIR", base.c_str(), 1);
    ::setenv("TESSERA_TEST_SCRATCH", dir_.c_str(), 1);
    ::setenv("TEST_TMPDIR", dir_.c_str(), 1);
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (dir_.empty() || ::getpid() != owner_) return;
    std::error_code ec;
    if (::testing::UnitTest::GetInstance()->Failed() && !std::filesystem::is_empty(dir_, ec)) {
      std::cerr << "test files kept in " << dir_ << "\n";
      return;
    }
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string dir_;
  pid_t owner_ = 0;
};

const bool kRegistered = (::testing::AddGlobalTestEnvironment(new ScratchDir), true);

}  // namespace
