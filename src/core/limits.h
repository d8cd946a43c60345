// Limits shared by every layer that checks a device count.
#pragma once

namespace tessera::core {

// The most devices in a plan, cluster, job or comm group: one bound for every count read from users, files and peers,
// so a mistyped or hostile count cannot size per-device buffers and connections without limit.
inline constexpr int kMaxDevices = 64;

}  // namespace tessera::core
