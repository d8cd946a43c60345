// Shared by the fuzz targets: quiet logs, input as a string.
#pragma once

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::fuzz {

inline std::string text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// Warnings about odd-but-accepted inputs would drown libFuzzer's output.
inline int quiet() {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

}  // namespace tessera::fuzz
