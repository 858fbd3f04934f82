#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime/kernel_cache.hpp"

namespace kiln_test_runtime_kernel_cache {

using kiln::runtime::OnceCache;

TEST_CASE("runtime: OnceCache runs the factory once per key, even when threads race") {
  OnceCache<std::string, std::shared_ptr<int>> cache;
  std::atomic<int> calls{0};
  std::atomic<int> created{0};
  std::atomic<bool> go{false};
  std::vector<std::shared_ptr<int>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      bool made = false;
      got[t] = cache.get_or_create(
          "k",
          [&] {
            ++calls;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // everyone else arrives meanwhile
            return std::make_shared<int>(7);
          },
          &made);
      if (made) ++created;
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  CHECK(calls == 1);
  CHECK(created == 1);
  for (auto& p : got) {
    REQUIRE(p);
    CHECK(p.get() == got[0].get());
  }
  CHECK(cache.size() == 1);
  CHECK(*cache.find("k").value() == 7);
  CHECK_FALSE(cache.find("other").has_value());

  // Different keys get different values.
  auto other = cache.get_or_create("other", [] { return std::make_shared<int>(8); });
  CHECK(*other == 8);
  CHECK(cache.size() == 2);
  cache.clear();
  CHECK(cache.size() == 0);
  CHECK_FALSE(cache.find("k").has_value());
}

TEST_CASE("runtime: OnceCache passes a factory's exception to every waiter and retries later") {
  OnceCache<int, int> cache;
  std::atomic<int> calls{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      try {
        cache.get_or_create(1, [&]() -> int {
          ++calls;
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          throw std::runtime_error("factory failed");
        });
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()) == "factory failed") ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 4);
  CHECK(calls >= 1);
  CHECK(calls <= 4);  // a thread arriving after the failure was cleaned up retries
  CHECK(cache.size() == 0);
  CHECK(cache.get_or_create(1, [] { return 5; }) == 5);
  CHECK(cache.get_or_create(1, [] { return 6; }) == 5);
}

}  // namespace kiln_test_runtime_kernel_cache
