// Small file helpers that report failures as values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace tessera::core {

// Reads a whole regular file; anything else (a FIFO, a device, a folder) is
// refused before it is read, since it could block or never end.
Result<std::string> read_file(const std::string& path);
// The same check for callers that read or map the file themselves: an open
// descriptor (O_CLOEXEC) the caller closes.
Result<int> open_regular_file(const std::string& path);
Status write_file(const std::string& path, const std::string& bytes);
// Writes all of `bytes` to an open descriptor (retrying short writes and
// EINTR); errno's text on failure. The caller closes it.
Status write_all(int fd, const std::string& bytes);
// Writes a sibling temporary file and renames it over `path`: a reader in
// another process sees the old file or the new one whole, never a torn one
// (caches that several processes read and write).
Status replace_file(const std::string& path, const std::string& bytes);
// A regular file mapped read-only (private); `data` keeps the mapping alive
// (null for an empty file).
struct MappedFile {
  std::shared_ptr<const void> data;
  size_t size = 0;
};
Result<MappedFile> map_file(const std::string& path);
// Drops the whole pages covering [p, p + bytes) from this process's resident
// memory (advice: a private read-only mapping re-reads them if touched).
void drop_pages(const void* p, size_t bytes);
bool file_exists(const std::string& path);
// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t available_memory_bytes();
// The bytes of the last-level cache this process's CPUs have: the highest
// level's caches (sysfs), each shared group once, or sysconf's figure when
// that is larger; 0 when neither says.
int64_t last_level_cache_bytes();
// The CPUs this process may run on (its affinity mask); at least 1.
int usable_cpus();
// This process's resident memory now (VmRSS) and its peak (VmHWM), bytes;
// 0 where /proc does not say.
int64_t resident_bytes();
int64_t peak_resident_bytes();
// Starts the peak over from the current resident memory (Linux's
// clear_refs "5"), so a device's memory is measured from just before it
// loads; false where the kernel does not allow it.
bool reset_peak_resident();

// Monotonic stopwatch in milliseconds.
class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tessera::core
