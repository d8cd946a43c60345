// A folder of its own for one test process, removed with its files at the end.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/io.h"

namespace tessera::runtime::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix)
      : path(std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  // Writes `text` to `name` in the folder; its path.
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = (path / name).string();
    EXPECT_TRUE(core::write_file(p, text).ok());
    return p;
  }
};

}  // namespace tessera::runtime::testing
