#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tessera::core {

void init_logging(const std::string& level) {
  static auto logger = spdlog::stderr_color_mt("tessera");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
}

}  // namespace tessera::core
