// Small file helpers that report failures as values.
#pragma once

#include <chrono>
#include <string>

#include "core/status.h"

namespace tessera::core {

Result<std::string> read_file(const std::string& path);
Status write_file(const std::string& path, const std::string& bytes);
bool file_exists(const std::string& path);

// Monotonic stopwatch in milliseconds.
class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera::core
