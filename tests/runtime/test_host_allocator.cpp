#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "kiln/runtime/host_cache.hpp"

namespace kiln_test_runtime_host_allocator {

using kiln::runtime::allocate_host;
using kiln::runtime::host_allocator_stats;
using kiln::runtime::detail::HostAllocator;

TEST_CASE("runtime: allocate_host gives 64-byte aligned, writable blocks of the asked size") {
  for (std::size_t bytes : {std::size_t(0), std::size_t(1), std::size_t(63), std::size_t(64), std::size_t(65),
                            std::size_t(1000), std::size_t(4097), std::size_t(3) << 20, std::size_t(9) << 20}) {
    auto s = allocate_host(bytes);
    REQUIRE(s);
    CHECK(s->data != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(s->data) % 64 == 0);
    CHECK(s->bytes == bytes);
    CHECK(s->device == kiln::Device::cpu());
    CHECK(s->owner);
    std::memset(s->data, 0xab, bytes);
    if (bytes >= HostAllocator::kHugeThreshold)
      CHECK(reinterpret_cast<std::uintptr_t>(s->data) % HostAllocator::kHugePage == 0);
  }
}

TEST_CASE("runtime: size classes bound the slack") {
  std::size_t prev = 0;
  for (std::size_t n = 0; n < (std::size_t(1) << 22); n = n < 5000 ? n + 1 : n + n / 7) {
    std::size_t c = HostAllocator::size_class(n);
    CHECK(c >= n);
    CHECK(c % 64 == 0);
    CHECK(c <= n + n / 4 + 64);
    CHECK(c >= prev);
    prev = c;
  }
  CHECK(HostAllocator::size_class(std::size_t(64) << 20) == std::size_t(64) << 20);
}

TEST_CASE("runtime: freed host blocks are reused instead of returned to the system") {
  const std::size_t bytes = 3 * 1000 * 1000 + 17;
  void* first;
  {
    auto s = allocate_host(bytes);
    first = s->data;
  }
  auto before = host_allocator_stats();
  CHECK(before.cached_bytes >= bytes);
  auto again = allocate_host(bytes - 100);  // same size class
  CHECK(again->data == first);
  auto after = host_allocator_stats();
  CHECK(after.hits == before.hits + 1);
  CHECK(after.misses == before.misses);
  CHECK(after.cached_bytes == before.cached_bytes - HostAllocator::size_class(bytes));

  // The block stays out of the cache for as long as anyone holds the owner.
  const std::size_t cls = HostAllocator::size_class(bytes);
  std::shared_ptr<void> keep = again->owner;
  const std::size_t cached = host_allocator_stats().cached_bytes;
  again.reset();
  CHECK(host_allocator_stats().cached_bytes == cached);
  keep.reset();
  CHECK(host_allocator_stats().cached_bytes == cached + cls);
}

TEST_CASE("runtime: the host cache is bounded and can be released") {
  const std::size_t old_limit = host_allocator_stats().cache_limit;
  kiln::runtime::release_cached_host_memory();
  CHECK(host_allocator_stats().cached_bytes == 0);

  kiln::runtime::set_host_cache_limit(std::size_t(10) << 20);
  {
    std::vector<kiln::StoragePtr> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(allocate_host(std::size_t(4) << 20));
  }  // 32 MiB released into a 10 MiB cache
  auto st = host_allocator_stats();
  CHECK(st.cached_bytes <= (std::size_t(10) << 20));
  CHECK(st.cached_bytes >= (std::size_t(8) << 20));           // two 4 MiB blocks fit
  kiln::runtime::set_host_cache_limit(std::size_t(4) << 20);  // shrinking drops what is over
  CHECK(host_allocator_stats().cached_bytes <= (std::size_t(4) << 20));

  kiln::runtime::release_cached_host_memory();
  CHECK(host_allocator_stats().cached_bytes == 0);
  kiln::runtime::set_host_cache_limit(old_limit);
}

TEST_CASE("runtime: the host allocator is thread-safe and never hands one block to two owners") {
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<kiln::StoragePtr> live;
      for (int i = 0; i < 2000; ++i) {
        std::size_t bytes = 64 + static_cast<std::size_t>((i * 131 + t * 17) % 4096);
        auto s = allocate_host(bytes);
        std::memset(s->data, t + 1, bytes);
        live.push_back(s);
        if (live.size() > 8) {
          // Every byte must still hold this thread's mark.
          auto& old = live.front();
          const auto* p = static_cast<const unsigned char*>(old->data);
          for (std::size_t k = 0; k < old->bytes; ++k)
            if (p[k] != t + 1) {
              ++errors;
              break;
            }
          live.erase(live.begin());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
}

TEST_CASE("runtime: the host allocator's peak is the most in use since the last reset") {
  const std::size_t mib = std::size_t(1) << 20;
  kiln::runtime::reset_host_memory_peak();
  const std::size_t base = host_allocator_stats().in_use_bytes;
  CHECK(host_allocator_stats().peak_in_use_bytes == base);
  {
    auto a = allocate_host(3 * mib), b = allocate_host(5 * mib);
    const std::size_t both = host_allocator_stats().in_use_bytes;
    CHECK(both >= base + 8 * mib);
    CHECK(host_allocator_stats().peak_in_use_bytes == both);
  }
  // Freed: the use falls back, the peak stays until the next reset.
  CHECK(host_allocator_stats().in_use_bytes == base);
  CHECK(host_allocator_stats().peak_in_use_bytes >= base + 8 * mib);
  kiln::runtime::reset_host_memory_peak();
  CHECK(host_allocator_stats().peak_in_use_bytes == base);
  auto c = allocate_host(mib);
  CHECK(host_allocator_stats().peak_in_use_bytes == host_allocator_stats().in_use_bytes);
  CHECK(host_allocator_stats().peak_in_use_bytes < base + 8 * mib);
}

}  // namespace kiln_test_runtime_host_allocator
