// Emulated device speed (--device-speed): heterogeneous devices on one
// machine, for tests and benchmarks. A compute kernel that took t on this
// machine is followed by t(1/s - 1) of idling, so it lasts t/s as on a
// device s times as fast. This is emulation: the device's memory bandwidth,
// cache and link are this machine's.
//
// The speed is per process (one emulated device per process); kernels time
// themselves with KernelClock on the thread that called them. Nested
// kernels and the pool's helper threads are not timed again. Short idles
// are owed and paid together (sleeping costs ~50 us of its own), and every
// collective pays what is owed first, so the wait lands where the device
// would still be computing.
#pragma once

#include <chrono>

namespace tessera::core {

// The slowest speed emulated: a kernel then idles 99 times its length. A
// job's speed comes from a peer, and 1e-12 would sleep a daemon for years.
inline constexpr double kMinDeviceSpeed = 0.01;

// s in [kMinDeviceSpeed, 1] (below is taken as kMinDeviceSpeed); 1 (the
// default) turns the emulation off.
void set_device_speed(double s);
double device_speed();

// Sleeps what the kernels on this thread still owe.
void settle_device_speed();

// Total idling added on this thread (seconds), for tests and --stats.
double device_speed_idle_s();

// Marks the calling thread as a pool helper: its kernels are parts of a
// kernel timed by the caller.
void mark_kernel_helper_thread();

// The process's speed for a scope (the terminal's runs); pays what is owed
// on the way out, so a measured latency includes it.
class ScopedDeviceSpeed {
 public:
  explicit ScopedDeviceSpeed(double s) : before_(device_speed()) { set_device_speed(s); }
  ~ScopedDeviceSpeed() {
    settle_device_speed();
    set_device_speed(before_);
  }
  ScopedDeviceSpeed(const ScopedDeviceSpeed&) = delete;
  ScopedDeviceSpeed& operator=(const ScopedDeviceSpeed&) = delete;

 private:
  double before_;
};

class KernelClock {
 public:
  KernelClock();
  ~KernelClock();
  KernelClock(const KernelClock&) = delete;
  KernelClock& operator=(const KernelClock&) = delete;

 private:
  bool timed_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera::core
