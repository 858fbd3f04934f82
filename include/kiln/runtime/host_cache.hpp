#pragma once
// The caching host allocator behind runtime::allocate_host (runtime/host_allocator.hpp): free
// lists per size class, huge-page blocks for large sizes, counters. All inline: the library's
// host_allocator_impl.hpp and the allocator's own tests include it.
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/runtime/host_allocator.hpp"

namespace kiln::runtime {

namespace detail {

class HostAllocator {
 public:
  // Blocks this large come straight from mmap, aligned to 2 MiB and advised for transparent
  // huge pages: one fault maps 2 MiB instead of 4 KiB.
  static constexpr std::size_t kHugeThreshold = std::size_t(4) << 20;
  static constexpr std::size_t kHugePage = std::size_t(2) << 20;

  /// The block size `bytes` is rounded to: multiples of 64 up to 512 bytes, then four classes
  /// per power of two (at most 25% slack), so free lists are shared by similar sizes.
  static std::size_t size_class(std::size_t bytes) {
    // More than the machine's memory and swap can never be backed. Refused here rather than
    // left to the system: with overcommit on, mmap grants it and the first touch of its pages
    // gets the process killed instead of a typed error.
    if (bytes > (std::size_t(1) << 60) || bytes > backable_bytes()) throw OutOfMemoryError(too_large(bytes));
    if (bytes <= 64) return 64;
    if (bytes <= 512) return (bytes + 63) / 64 * 64;
    unsigned width = static_cast<unsigned>(std::bit_width(bytes - 1));  // 2^width >= bytes
    std::size_t step = std::size_t(1) << (width - 3);
    return (bytes + step - 1) / step * step;
  }

  void* allocate(std::size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= cls;
        in_use_ += cls;
        peak_ = std::max(peak_, in_use_);
        ++hits_;
        return p;
      }
      ++misses_;
      in_use_ += cls;
      peak_ = std::max(peak_, in_use_);
    }
    void* p = system_allocate(cls);
    if (!p) {
      // Memory may be sitting in free lists of other sizes: give it back and try once more.
      release_cached();
      p = system_allocate(cls);
    }
    if (!p) {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ -= cls;
      throw OutOfMemoryError(too_large(cls));
    }
    return p;
  }

  /// Physical memory plus swap (once per process).
  static std::size_t backable_bytes() {
    static const std::size_t total = [] {
      struct sysinfo si {};
      if (::sysinfo(&si) != 0) return ~std::size_t(0);
      return (static_cast<std::size_t>(si.totalram) + static_cast<std::size_t>(si.totalswap)) * si.mem_unit;
    }();
    return total;
  }

  static std::string too_large(std::size_t bytes) {
    return "cannot allocate " + std::to_string(bytes) + " bytes of host memory (the machine has " +
           std::to_string(backable_bytes()) + " bytes of memory and swap)";
  }

  void release(void* p, std::size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ -= cls;
      if (cached_ + cls <= limit_) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    system_free(p, cls);
  }

  void release_cached() {
    std::unordered_map<std::size_t, std::vector<void*>> taken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      taken.swap(free_);
      cached_ = 0;
    }
    for (auto& [cls, blocks] : taken)
      for (void* p : blocks) system_free(p, cls);
  }

  void set_limit(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
      if (cached_ <= limit_) return;
    }
    release_cached();
  }

  HostAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return HostAllocatorStats{cached_, in_use_, peak_, limit_, hits_, misses_};
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = in_use_;
  }

 private:
  static void* system_allocate(std::size_t cls) {
    if (cls < kHugeThreshold) return std::aligned_alloc(64, cls);
    std::size_t len = cls + kHugePage;
    void* raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    auto base = reinterpret_cast<std::uintptr_t>(raw);
    std::uintptr_t aligned = (base + kHugePage - 1) & ~(kHugePage - 1);
    if (aligned > base) ::munmap(raw, aligned - base);
    std::uintptr_t end = base + len, used_end = aligned + cls;  // cls is a multiple of the page size here
    if (end > used_end) ::munmap(reinterpret_cast<void*>(used_end), end - used_end);
#ifdef MADV_HUGEPAGE
    ::madvise(reinterpret_cast<void*>(aligned), cls, MADV_HUGEPAGE);
#endif
    return reinterpret_cast<void*>(aligned);
  }

  static void system_free(void* p, std::size_t cls) {
    if (cls < kHugeThreshold)
      std::free(p);
    else
      ::munmap(p, cls);
  }

  static std::size_t default_limit() {
    // A quarter of physical memory, at most 4 GiB: enough to recycle the working set of a loop
    // over large tensors without pinning memory the rest of the program needs.
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    std::size_t limit = std::size_t(1) << 30;
    if (pages > 0 && page > 0) limit = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) / 4;
    return std::min(limit, std::size_t(4) << 30);
  }

  std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0, in_use_ = 0, peak_ = 0, limit_ = default_limit();
  std::uint64_t hits_ = 0, misses_ = 0;
};

inline HostAllocator& host_allocator() {
  // Leaked on purpose: storages released during static destruction still return here.
  static HostAllocator* allocator = new HostAllocator();
  return *allocator;
}

}  // namespace detail

}  // namespace kiln::runtime
