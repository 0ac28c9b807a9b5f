// HugePageAllocator: a std::allocator for buffers of megabytes that are filled once (the kept
// memory curve, timeline/bounded_curve.h). The first touch of every 4 KiB page of a fresh buffer
// is a page fault, which costs about 15 µs on the virtual machines memsim is developed on
// (docs/performance.md, 'Page faults and threads'): a 4 MB curve cost more in faults than the
// work that filled it. An allocation of at least kHugePageBytes is mapped with mmap at a
// kHugePageBytes boundary and marked MADV_HUGEPAGE (Linux madvise(2)), so that where transparent
// huge pages are enabled ("always" or "madvise" in /sys/kernel/mm/transparent_hugepage/enabled)
// one fault maps 2 MiB. Smaller allocations, other systems and sanitized builds (whose checks
// need their own heap) use operator new. Where huge pages are not granted the mapping works
// as ordinary memory: speed is all that changes, never a result.
#pragma once

#include <cstddef>
#include <memory>

namespace memsim {

// The x86-64 and AArch64 (4 KiB base pages) transparent huge page: one PMD entry maps 2 MiB
// (/sys/kernel/mm/transparent_hugepage/hpage_pmd_size).
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

namespace internal {
// `bytes` from a 2 MiB-aligned anonymous mapping advised for huge pages, or nullptr when
// huge pages are not used here (the caller then uses operator new). Throws std::bad_alloc
// when the mapping fails.
void* MapHugePages(std::size_t bytes);
void UnmapHugePages(void* p, std::size_t bytes);
// Whether an allocation of `bytes` goes to MapHugePages.
bool UsesHugePages(std::size_t bytes);
}  // namespace internal

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: conversions between rebinds

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (internal::UsesHugePages(bytes)) return static_cast<T*>(internal::MapHugePages(bytes));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (internal::UsesHugePages(bytes)) {
      internal::UnmapHugePages(p, bytes);
    } else {
      std::allocator<T>().deallocate(p, n);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace memsim
