#include "core/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace tessera::core {

namespace {

// A private anonymous mapping of `len` bytes (a multiple of the page) whose
// start is 2 MiB aligned: a larger one, trimmed.
uint8_t* map_huge_aligned(size_t len) {
  constexpr size_t kHuge = size_t{2} << 20;
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
  return p;
}

constexpr size_t kPage = 4096;

}  // namespace

std::shared_ptr<uint8_t[]> alloc_large(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < kHuge) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64));
    if (p == nullptr) return nullptr;
    return std::shared_ptr<uint8_t[]>(p, [](uint8_t* q) { std::free(q); });
  }
  const size_t len = (bytes + kPage - 1) / kPage * kPage;
  uint8_t* p = map_huge_aligned(len);
  if (p == nullptr) return nullptr;
  return std::shared_ptr<uint8_t[]>(p, [len](uint8_t* q) { ::munmap(q, len); });
}

std::shared_ptr<void> alloc_lazy_zeroed(size_t bytes) {
  const size_t len = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  uint8_t* p = map_huge_aligned(len);
  if (p == nullptr) return nullptr;
  return std::shared_ptr<void>(p, [len](void* q) { ::munmap(q, len); });
}

}  // namespace tessera::core
