// Logging goes through spdlog; this header fixes the project's defaults.
#pragma once

#include <spdlog/spdlog.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera::core {

// Level from a name ("debug", "info", "warn", "error", "off"); logs go to stderr.
void init_logging(const std::string& level = "warn");

// Text a peer may have written, fit for one log line: control bytes (and
// bytes >= 0x7f) as \xNN, at most `max` bytes of it, then how long it was.
// A refused job can quote its whole (1 MiB) field back otherwise.
std::string for_log(std::string_view text, size_t max = 240);

}  // namespace tessera::core
