#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>

namespace tessera::core {

void init_logging(const std::string& level) {
  static auto logger = spdlog::stderr_color_mt("tessera");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
}

std::string for_log(std::string_view text, size_t max) {
  std::string out;
  const size_t n = std::min(text.size(), max);
  out.reserve(n + 32);
  static const char* kHex = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (text.size() > n) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace tessera::core
