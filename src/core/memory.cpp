#include "core/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace tessera::core {

std::shared_ptr<uint8_t[]> alloc_large(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20, kPage = 4096;
  if (bytes < kHuge) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64));
    if (p == nullptr) return nullptr;
    return std::shared_ptr<uint8_t[]>(p, [](uint8_t* q) { std::free(q); });
  }
  const size_t len = (bytes + kPage - 1) / kPage * kPage;
  void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Keep the 2 MiB-aligned part; give the rest back.
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHuge - 1) / kHuge * kHuge;
  if (start > base) ::munmap(raw, start - base);
  const uintptr_t end = base + len + kHuge;
  if (end > start + len) ::munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  auto* p = reinterpret_cast<uint8_t*>(start);
  ::madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP it is 4 KiB pages, as before
  return std::shared_ptr<uint8_t[]>(p, [len](uint8_t* q) { ::munmap(q, len); });
}

}  // namespace tessera::core
