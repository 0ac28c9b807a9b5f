#include "core/huge_page_allocator.h"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace memsim::internal {
namespace {

// Sanitized builds keep every buffer on the checked heap.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

#if defined(__linux__)
constexpr bool kHugePagesHere = !kSanitized;
#else
constexpr bool kHugePagesHere = false;
#endif

// The mapping of an allocation of `bytes`: whole huge pages.
std::size_t MappedBytes(std::size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

}  // namespace

bool UsesHugePages(std::size_t bytes) { return kHugePagesHere && bytes >= kHugePageBytes; }

#if defined(__linux__)
void* MapHugePages(std::size_t bytes) {
  const std::size_t length = MappedBytes(bytes);
  // Map one huge page more than needed and unmap what lies before the first 2 MiB boundary and
  // after the buffer, so that every 2 MiB of it can be one huge page.
  const std::size_t spare = length + kHugePageBytes;
  void* raw = mmap(nullptr, spare, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > base) munmap(raw, aligned - base);
  const std::size_t tail = base + spare - (aligned + length);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + length), tail);
  void* p = reinterpret_cast<void*>(aligned);
  // Advice only: without it (or where the kernel refuses it) the pages are ordinary ones.
  madvise(p, length, MADV_HUGEPAGE);
  return p;
}

void UnmapHugePages(void* p, std::size_t bytes) { munmap(p, MappedBytes(bytes)); }
#else
void* MapHugePages(std::size_t) { throw std::bad_alloc(); }  // never called: UsesHugePages
void UnmapHugePages(void*, std::size_t) {}
#endif

}  // namespace memsim::internal
