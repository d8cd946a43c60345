#include "core/io.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tessera::core {

Result<std::string> read_file(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const int fd, open_regular_file(path));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      return io_error("cannot read '" + path + "': " + err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<int> open_regular_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
  // before we could even look at what it is.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error("'" + path + "' is not a regular file");
  }
  // Regular files never block; clear the flag so reads behave normally.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    ::close(fd);
    return io_error("cannot read '" + path + "': " + std::strerror(errno));
  }
  return fd;
}

Status write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot create '" + path + "': " + std::strerror(errno));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return io_error("cannot write '" + path + "'");
  return ok_status();
}

Status write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error(n == 0 ? "no progress" : std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

Status replace_file(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return io_error("cannot create a temporary file beside '" + path + "': " + std::strerror(errno));
  if (Status st = write_all(fd, bytes); !st.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error("cannot write '" + tmp + "': " + st.message());
  }
  // mkstemp's file is 0600; a cache or a profile is as readable as write_file's.
  (void)::fchmod(fd, 0644);
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return io_error("cannot replace '" + path + "': " + why);
  }
  return ok_status();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

int64_t last_level_cache_bytes() {
  // What glibc says (cpuid on x86: one cache), or the kernel's cache
  // description (sysfs; ARM has only this), whichever is larger. From sysfs,
  // the highest level's caches of the CPUs this process may run on, each
  // shared group once: an AMD EPYC's L3 is one slice per core complex, and a
  // GEMM's threads fill them all.
  int64_t sysconf_bytes = 0;
  for (const int name : {_SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL4_CACHE_SIZE})
    sysconf_bytes = std::max<int64_t>(sysconf_bytes, ::sysconf(name));
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) CPU_SET(0, &allowed);
  int top = 0;
  std::map<std::string, int64_t> groups;  // shared_cpu_list -> bytes, at level `top`
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index";
    for (int i = 0; i < 16; ++i) {
      std::ifstream size_in(dir + std::to_string(i) + "/size"), level_in(dir + std::to_string(i) + "/level"),
          shared_in(dir + std::to_string(i) + "/shared_cpu_list");
      int64_t v = 0;
      int level = 0;
      std::string unit, shared;
      if (!(size_in >> v) || !(level_in >> level)) continue;
      size_in >> unit;
      shared_in >> shared;
      const int64_t bytes = v * (unit.starts_with("K") ? 1024 : unit.starts_with("M") ? 1024 * 1024 : 1);
      if (level < top) continue;
      if (level > top) top = level, groups.clear();
      groups[shared.empty() ? "cpu" + std::to_string(cpu) : shared] = bytes;
    }
  }
  int64_t sysfs_bytes = 0;
  for (const auto& [cpus, bytes] : groups) sysfs_bytes += bytes;
  return std::max(sysconf_bytes, sysfs_bytes);
}

int usable_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  return ::sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? std::max(CPU_COUNT(&allowed), 1) : 1;
}

namespace {
int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k(key);
  while (std::getline(in, line))
    if (line.rfind(k, 0) == 0) return std::strtoll(line.c_str() + k.size(), nullptr, 10);
  return 0;
}
}  // namespace

int64_t resident_bytes() { return status_kib("VmRSS:") * 1024; }
int64_t peak_resident_bytes() { return status_kib("VmHWM:") * 1024; }

bool reset_peak_resident() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

Result<MappedFile> map_file(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const int fd, open_regular_file(path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error("cannot stat '" + path + "': " + std::strerror(errno));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  if (size > 0 && map == MAP_FAILED) return io_error("cannot mmap '" + path + "': " + std::strerror(errno));
  MappedFile f;
  f.data = std::shared_ptr<const void>(map, [size](const void* p) {
    if (p != nullptr) ::munmap(const_cast<void*>(p), size);
  });
  f.size = size;
  return f;
}

void drop_pages(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  ::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);  // advice only: failure changes nothing
}

}  // namespace tessera::core
