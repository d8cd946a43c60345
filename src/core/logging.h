// Logging goes through spdlog; this header fixes the project's defaults.
#pragma once

#include <spdlog/spdlog.h>

namespace tessera::core {

// Level from a name ("debug", "info", "warn", "error", "off"); logs go to stderr.
void init_logging(const std::string& level = "warn");

}  // namespace tessera::core
