// Untrusted input at the bottom layer: strict JSON (duplicate keys, depth,
// typed and bounded fields), reads that refuse non-regular files, duration
// checks and allocations whose failure is an error.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/duration.h"
#include "core/io.h"
#include "core/logging.h"
#include "core/memory.h"
#include "core/json.h"
#include "core/tensor.h"

namespace tessera::core {
namespace {

// A peer's text in a log line: escaped, cut, and its length said.
TEST(LogTest, PeerTextIsEscapedAndCut) {
  EXPECT_EQ(core::for_log("plain text"), "plain text");
  EXPECT_EQ(core::for_log(std::string("a\nb\x1b[2J\x7f\xff", 9)), "a\\x0ab\\x1b[2J\\x7f\\xff");
  const std::string big(1 << 20, 'x');
  const std::string cut = core::for_log(big, 16);
  EXPECT_EQ(cut, std::string(16, 'x') + "... (1048576 bytes)");
  EXPECT_EQ(core::for_log(big).size(), 240u + std::string("... (1048576 bytes)").size());
}

TEST(JsonTest, RefusesDuplicateKeysAtAnyDepth) {
  EXPECT_TRUE(parse_json(R"({"a":1,"b":{"a":2}})", "doc").ok());
  auto top = parse_json(R"({"a":1,"a":2})", "doc");
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.status().message().find("duplicate key \"a\""), std::string::npos) << top.status().to_string();
  EXPECT_FALSE(parse_json(R"({"x":{"0":"a","0":"b"}})", "doc").ok());
  // Same key in sibling objects is fine.
  EXPECT_TRUE(parse_json(R"([{"a":1},{"a":2}])", "doc").ok());
  EXPECT_TRUE(parse_json(R"({"a":1,"a":2})", "doc", JsonLimits{64, false}).ok());
}

TEST(JsonTest, BoundsNestingWithoutRecursing) {
  // 100k levels: a recursive walk of this would overflow the stack.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto j = parse_json(deep, "doc");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("nested deeper"), std::string::npos);
  EXPECT_TRUE(parse_json(std::string(10, '[') + std::string(10, ']'), "doc").ok());
  EXPECT_FALSE(parse_json("{\"a\":", "doc").ok());
}

TEST(JsonTest, TypedFieldsNeverThrow) {
  auto j = parse_json(R"({"i":5,"big":18446744073709551615,"f":1.5,"s":"x","b":true,"n":null,"huge":1e300})", "doc").value();
  EXPECT_EQ(json_field_int(j, "i", 0, 10).value(), 5);
  EXPECT_EQ(json_field_int(j, "i", 6, 10).status().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(json_field_int(j, "big", 0, INT64_MAX).status().code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(json_field_int(j, "f", 0, 10).status().code(), ErrorCode::kParseError);
  EXPECT_EQ(json_field_int(j, "s", 0, 10).status().code(), ErrorCode::kParseError);
  EXPECT_EQ(json_field_int(j, "n", 0, 10, 7).value(), 7);  // null = absent
  EXPECT_FALSE(json_field_int(j, "missing", 0, 10).ok());
  EXPECT_EQ(json_field_number(j, "f", 0, 2).value(), 1.5);
  EXPECT_FALSE(json_field_number(j, "huge", 0, 1e9).ok());
  EXPECT_FALSE(json_field_string(j, "i").ok());
  EXPECT_EQ(json_field_string(j, "s").value(), "x");
  EXPECT_FALSE(json_field_bool(j, "i").ok());
  EXPECT_TRUE(json_field_bool(j, "b").value());
  // Not an object: every field is absent.
  const nlohmann::json arr = nlohmann::json::array();
  EXPECT_EQ(json_field_string(arr, "format", std::string("d")).value(), "d");
}

TEST(IoTest, RefusesFifosWithoutBlocking) {
  const std::string fifo = ::testing::TempDir() + "/fifo-" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = read_file(fifo);  // no writer: a blocking open would never return
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos);
  EXPECT_FALSE(read_file(::testing::TempDir()).ok());  // a folder
  EXPECT_FALSE(read_file("/dev/zero").ok());          // a device that never ends
  ::unlink(fifo.c_str());
  const std::string file = fifo + ".txt";
  ASSERT_TRUE(write_file(file, "hello").ok());
  EXPECT_EQ(read_file(file).value(), "hello");
  ::unlink(file.c_str());
}

// A file other processes read while it is replaced (the device profile
// cache): every read sees one whole version, and no temporary is left.
TEST(IoTest, ReplacedFilesAreNeverSeenTorn) {
  const std::string dir = ::testing::TempDir() + "/replace-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::string file = dir + "/cache.json";
  const std::string a(1 << 20, 'a'), b(1 << 19, 'b');
  ASSERT_TRUE(replace_file(file, a).ok());
  std::atomic<bool> done{false};
  int torn = 0, reads = 0;
  std::thread reader([&] {
    while (!done.load()) {
      auto r = read_file(file);
      ASSERT_TRUE(r.ok()) << r.status().message();
      if (r.value() != a && r.value() != b) ++torn;
      ++reads;
    }
  });
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(replace_file(file, i % 2 == 0 ? b : a).ok());
  done = true;
  reader.join();
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
  EXPECT_EQ(read_file(file).value(), a);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 1);  // the file alone, no temporaries
  EXPECT_FALSE(replace_file(dir + "/missing/cache.json", a).ok());
  std::filesystem::remove_all(dir);
}

TEST(DurationTest, RangeIsOneMillisecondToADay) {
  using std::chrono::milliseconds;
  EXPECT_TRUE(check_duration(milliseconds(1), "--timeout").ok());
  EXPECT_TRUE(check_duration(kMaxDuration, "--timeout").ok());
  EXPECT_FALSE(check_duration(milliseconds(0), "--timeout").ok());
  EXPECT_FALSE(check_duration(milliseconds(-5000), "--timeout").ok());
  auto st = check_duration(milliseconds(3000000ll * 1000), "--timeout");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--timeout"), std::string::npos);
}

TEST(TensorTest, TryZerosReportsImpossibleAllocations) {
  auto t = Tensor::try_zeros(DType::kF32, {1ll << 40, 1ll << 20});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_FALSE(Tensor::try_zeros(DType::kF32, {-1}).ok());
  auto ok = Tensor::try_zeros(DType::kF32, {3, 4});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->numel(), 12);
  EXPECT_EQ(ok->f32()[11], 0.0f);
}

// A KV cache's allocation: the same errors; zeros; and only the pages
// written are in memory (a long context costs a short prompt nothing).
TEST(TensorTest, LazyZerosAreZeroAndTakeOnlyThePagesWritten) {
  EXPECT_EQ(Tensor::try_zeros_lazy(DType::kF32, {1ll << 40, 1ll << 20}).status().code(), ErrorCode::kResourceExhausted);
  EXPECT_FALSE(Tensor::try_zeros_lazy(DType::kF32, {-1}).ok());
  for (const int64_t rows : {4, 0, 4096}) {  // the heap, empty, mapped
    auto t = Tensor::try_zeros_lazy(DType::kF32, {rows, 512});
    ASSERT_TRUE(t.ok()) << rows;
    ASSERT_EQ(t->numel(), rows * 512);
    ASSERT_EQ(t->dtype(), DType::kF32);
    if (rows == 0) continue;
    float* p = t->f32();
    p[0] = 1.0f;  // the first row's page only
    if (rows == 4096) {
      const long page = ::sysconf(_SC_PAGESIZE);
      std::vector<unsigned char> in(t->nbytes() / static_cast<size_t>(page));
      ASSERT_EQ(::mincore(t->raw(), t->nbytes(), in.data()), 0);
      EXPECT_TRUE(in.front() & 1);
      EXPECT_FALSE(in.back() & 1);  // 8 MB, one page of it written
      // A huge page at most (core::alloc_lazy_zeroed): 2 MiB of the 8.
      const auto resident = std::count_if(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
      EXPECT_LE(resident * page, 2 << 20);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % (2 << 20), 0u) << "2 MiB aligned, so a whole huge page fits";
    }
    int64_t nonzero = 0;
    for (int64_t i = 1; i < t->numel(); ++i) nonzero += p[i] != 0.0f;
    EXPECT_EQ(nonzero, 0) << rows;
  }
}

}  // namespace
}  // namespace tessera::core

// Packed weights' buffers: small ones from the heap, large ones their own
// mapping on a 2 MiB boundary (for huge pages); every byte usable either way,
// and many in turn do not leak mappings.
TEST(MemoryTest, LargeBuffersAreAlignedWholeAndFreed) {
  for (const size_t bytes : {size_t{1}, size_t{4096}, (size_t{2} << 20) - 1, size_t{2} << 20, (size_t{5} << 20) + 3}) {
    auto buf = tessera::core::alloc_large(bytes);
    ASSERT_NE(buf, nullptr) << bytes;
    const auto at = reinterpret_cast<uintptr_t>(buf.get());
    EXPECT_EQ(at % 64, 0u) << bytes;
    if (bytes >= (size_t{2} << 20)) {
      EXPECT_EQ(at % (size_t{2} << 20), 0u) << bytes;
    }
    std::memset(buf.get(), 0xA5, bytes);
    EXPECT_EQ(buf[0], 0xA5);
    EXPECT_EQ(buf[bytes - 1], 0xA5);
  }
  // Freed buffers give their mappings back.
  auto mappings = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) ++n;
    return n;
  };
  const int before = mappings();
  for (int i = 0; i < 200; ++i) {
    auto buf = tessera::core::alloc_large(size_t{3} << 20);
    ASSERT_NE(buf, nullptr) << i;
    buf[static_cast<size_t>(i) * 4096] = 1;
  }
  EXPECT_LT(mappings(), before + 20);
}
