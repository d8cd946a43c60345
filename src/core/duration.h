// Durations from users and peers: 64-bit milliseconds, range-checked before
// use (a negative wait means "forever" to zmq_poll, and seconds * 1000 in an
// int overflows).
#pragma once

#include <chrono>
#include <string>

#include "core/status.h"

namespace tessera::core {

// The longest wait anything accepts: a day.
inline constexpr std::chrono::milliseconds kMaxDuration{24ll * 3600 * 1000};

// kOutOfRange unless 1 ms <= d <= kMaxDuration; `what` names the option.
inline Status check_duration(std::chrono::milliseconds d, const std::string& what) {
  if (d.count() < 1 || d > kMaxDuration)
    return out_of_range(what + " must be between 1 ms and 24 h (got " + std::to_string(d.count()) + " ms)");
  return ok_status();
}

}  // namespace tessera::core
