// Large long-lived buffers (packed weights, KV caches) on transparent huge pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tessera::core {

// `bytes` (>= 1), 64-byte aligned, uninitialised; nullptr when out of memory.
// From 2 MiB up the buffer is its own mapping, 2 MiB aligned and advised
// MADV_HUGEPAGE: a decode step streams every weight once, and with 4 KiB
// pages each page costs a TLB walk and stops the hardware prefetcher (on a
// kernel whose THP setting is "madvise" nothing else gets huge pages). GPT-2
// F32 decode: 18.2-20.4 against 21.1-21.6 ms/token (docs/quantization.md).
// The mapping is trimmed to the buffer, so no memory is held beyond it.
std::shared_ptr<uint8_t[]> alloc_large(size_t bytes);

// `bytes` (>= 1) of zeroed memory mapped lazily (its pages come from the
// kernel when first touched), 2 MiB aligned and advised MADV_HUGEPAGE: a KV
// cache. Faulting in 4 KiB pages ran at 0.3 GB/s on a VM here, about a fifth
// of a GPT-2 prefill of 512 tokens; a whole 2 MiB page is one fault. Only whole
// 2 MiB pages within the buffer can be huge, so what is resident never
// exceeds the pages touched rounded up to 2 MiB, nor the buffer. nullptr when
// out of memory.
std::shared_ptr<void> alloc_lazy_zeroed(size_t bytes);

}  // namespace tessera::core
