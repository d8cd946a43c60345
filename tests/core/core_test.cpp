// Status and Result, Tensor views and copies, dtypes and their conversions,
// and the order statistics every benchmark reports.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include <cmath>
#include <limits>

#include "core/device_speed.h"
#include "core/dtype.h"
#include "core/io.h"
#include "core/thread_pool.h"
#include "core/stats.h"
#include "core/status.h"
#include "core/tensor.h"

namespace tessera::core {
namespace {

Result<int> half(int x) {
  if (x % 2) return invalid_argument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> quarter(int x) {
  TESSERA_ASSIGN_OR_RETURN(int h, half(x));
  TESSERA_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status check_even(int x) {
  TESSERA_RETURN_IF_ERROR(half(x).status());
  return ok_status();
}

TEST(StatusTest, CarriesCodeMessageAndContext) {
  EXPECT_TRUE(ok_status().ok());
  const Status s = not_found("no such file");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.message(), "no such file");
  EXPECT_NE(s.to_string().find("no such file"), std::string::npos);
  EXPECT_NE(s.with_context("loading").to_string().find("loading"), std::string::npos);
  EXPECT_EQ(s.with_context("loading").code(), ErrorCode::kNotFound);
}

TEST(ResultTest, PropagatesValuesAndErrors) {
  EXPECT_EQ(quarter(12).value(), 3);
  const auto bad = quarter(6);  // 6 -> 3 is odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "odd: 3");
  EXPECT_TRUE(check_even(4).ok());
  EXPECT_FALSE(check_even(5).ok());
  EXPECT_EQ(quarter(6).value_or(-1), -1);
  EXPECT_EQ(quarter(8).value_or(-1), 2);
  // A Result built from an OK status is an error, never a value out of nothing.
  const Result<int> from_ok(ok_status());
  EXPECT_FALSE(from_ok.ok());
  EXPECT_EQ(from_ok.status().code(), ErrorCode::kInternal);
}

TEST(ResultTest, ValueOfAnErrorAborts) {
  EXPECT_DEATH({ (void)half(3).value(); }, "odd: 3");
}

TEST(TensorTest, ZerosShapesAndBytes) {
  Tensor t = Tensor::zeros_f32({2, 3});
  EXPECT_EQ(t.rank(), 2u);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.f32()[i], 0.0f);
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({4, 0, 2}), 0);
}

TEST(TensorTest, RowsAreViewsAndCloneIsACopy) {
  Tensor t = Tensor::from_f32({3, 2}, {1, 2, 3, 4, 5, 6});
  Tensor mid = t.rows(1, 2);
  EXPECT_EQ(mid.shape(), (Shape{1, 2}));
  EXPECT_EQ(mid.f32()[0], 3.0f);
  mid.f32()[0] = 30.0f;  // a view writes through
  EXPECT_EQ(t.f32()[2], 30.0f);
  Tensor copy = t.clone();
  copy.f32()[0] = -1.0f;  // a clone does not
  EXPECT_EQ(t.f32()[0], 1.0f);
  EXPECT_EQ(t.reshaped({6}).f32()[5], 6.0f);
  EXPECT_DEATH({ (void)t.i64(); }, "");  // the wrong dtype is an invariant broken
}

TEST(DTypeTest, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kU8}) {
    const auto back = parse_dtype(dtype_name(d));
    ASSERT_TRUE(back.has_value()) << dtype_name(d);
    EXPECT_EQ(*back, d);
  }
  EXPECT_FALSE(parse_dtype("F33").has_value());
}

TEST(DTypeTest, HalfConversionsAgainstKnownBits) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);  // largest finite half
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  for (float v : {0.0f, 1.0f, -2.5f, 1024.0f, 0.099975586f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(v)), bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(v))))) << v;
  }
}

TEST(StatsTest, MedianAndItsIndex) {
  EXPECT_EQ(median({}), 0.0);
  EXPECT_EQ(median({3}), 3.0);
  EXPECT_EQ(median({5, 1, 3}), 3.0);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(median_index({5, 1, 3}), 2u);
  EXPECT_EQ(median_index({4, 1, 3, 2}), 3u);  // the lower middle value, 2
  EXPECT_EQ(median_index({}), 0u);
}

// Busy for `ms` inside one timed kernel; returns how long the kernel's own
// work took (the clock's t).
double spin_kernel(double ms) {
  const auto start = std::chrono::steady_clock::now();
  core::KernelClock clock;
  while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() < ms) {
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// --device-speed s: a kernel that took t is followed by t(1/s - 1) of idling
// (sleep never returns early, so the idle is at least that once settled).
TEST(DeviceSpeedTest, KernelsIdleInProportionAndOnlyOnce) {
  {
    const core::ScopedDeviceSpeed full(1.0);
    const double before = core::device_speed_idle_s();
    spin_kernel(2);
    core::settle_device_speed();
    EXPECT_EQ(core::device_speed_idle_s(), before);  // full speed: no idling
  }
  const double before = core::device_speed_idle_s();
  double work = 0;
  {
    const core::ScopedDeviceSpeed quarter(0.25);
    EXPECT_EQ(core::device_speed(), 0.25);
    for (int i = 0; i < 3; ++i) work += spin_kernel(1);
    {  // a kernel inside a kernel is part of the outer one
      const auto start = std::chrono::steady_clock::now();
      core::KernelClock outer;
      spin_kernel(1);
      work += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }  // leaving the scope pays what is still owed
  EXPECT_EQ(core::device_speed(), 1.0);
  const double idle = core::device_speed_idle_s() - before;
  EXPECT_GE(idle, 3.0 * work * 0.999);
}

TEST(DeviceSpeedTest, PoolHelpersAndBadSpeedsAreNotTimed) {
  core::ThreadPool pool(2);
  const core::ScopedDeviceSpeed half(0.5);
  double helper_idle = -1;
  pool.parallel_for(2, [&](int64_t b, int64_t) {
    if (b == 1) {  // the helper thread's chunk
      spin_kernel(1);
      core::settle_device_speed();
      helper_idle = core::device_speed_idle_s();
    }
  });
  EXPECT_EQ(helper_idle, 0.0);
  core::set_device_speed(0);  // out of range: full speed
  EXPECT_EQ(core::device_speed(), 1.0);
  core::set_device_speed(1.5);
  EXPECT_EQ(core::device_speed(), 1.0);
  core::set_device_speed(0.5);
}

}  // namespace
}  // namespace tessera::core

namespace tessera::core {
namespace {

// Each loop covers [0, n) exactly once, whether the helpers are still
// spinning from the previous loop (back to back) or asleep (after a pause,
// which only chooses the path; nothing waits on it), and a pool ends cleanly
// while its helpers spin.
TEST(ThreadPoolTest, EveryLoopCoversItsRangeOnceSpinningOrAsleep) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int call = 0; call < 2000; ++call) {
      const int64_t n = 1 + call % 7;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (const auto& h : hits) ASSERT_EQ(h.load(), 1) << "call " << call << ", " << threads << " threads";
      if (call % 400 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ThreadPool quick(2);
  quick.parallel_for(2, [](int64_t, int64_t) {});
}

// The last level is the largest cache: at least as large as each level the
// kernel lists (sysfs), where it lists any.
TEST(SystemTest, TheLastLevelCacheIsTheLargest) {
  const int64_t llc = last_level_cache_bytes();
  EXPECT_GE(llc, 0);
  for (int i = 0; i < 16; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    int64_t kib = 0;
    std::string unit;
    if (!(in >> kib >> unit) || unit != "K") continue;
    EXPECT_GE(llc, kib * 1024) << "index" << i;
  }
}

}  // namespace
}  // namespace tessera::core
