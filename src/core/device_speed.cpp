#include "core/device_speed.h"

#include <algorithm>
#include <atomic>
#include <thread>

namespace tessera::core {

namespace {
std::atomic<double> g_speed{1.0};
thread_local int t_depth = 0;
thread_local bool t_helper = false;
thread_local double t_owed_s = 0.0;
thread_local double t_idle_s = 0.0;
// Owed idling below this is carried to the next kernel or collective.
constexpr double kPayAtS = 200e-6;

void pay() {
  if (t_owed_s <= 0) return;
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(t_owed_s));
  // What the sleep overshot is credited to the next kernels.
  const double slept = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t_idle_s += slept;
  t_owed_s -= slept;
}
}  // namespace

void set_device_speed(double s) { g_speed.store(s > 0 && s < 1 ? std::max(s, kMinDeviceSpeed) : 1.0); }
double device_speed() { return g_speed.load(std::memory_order_relaxed); }
void settle_device_speed() { pay(); }
double device_speed_idle_s() { return t_idle_s; }
void mark_kernel_helper_thread() { t_helper = true; }

KernelClock::KernelClock() : timed_(!t_helper && t_depth == 0 && device_speed() < 1.0) {
  ++t_depth;
  if (timed_) start_ = std::chrono::steady_clock::now();
}

KernelClock::~KernelClock() {
  --t_depth;
  if (!timed_) return;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double s = device_speed();
  if (s < 1.0) t_owed_s += t * (1.0 / s - 1.0);
  if (t_owed_s >= kPayAtS) pay();
}

}  // namespace tessera::core
