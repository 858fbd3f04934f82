#pragma once
// A thread-safe map whose values are made once per key, even when threads race for a new key:
// the first caller runs the factory, the others wait for its result.
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace kiln::runtime {

/// Values made once per key by a factory. A factory that throws leaves no entry: its exception
/// goes to the caller that ran it and to every caller that was waiting, and the next
/// get_or_create for that key runs a factory again. A factory must not ask for its own key.
template <class K, class V, class Hash = std::hash<K>, class Eq = std::equal_to<K>>
class OnceCache {
 public:
  /// The value for `key`, made by `factory()` if no other call made or is making it.
  /// `*created` (when given) says whether this call ran the factory.
  template <class F>
  V get_or_create(const K& key, F&& factory, bool* created = nullptr) {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      std::shared_future<V> ready = it->second.future;
      lock.unlock();
      if (created) *created = false;
      return ready.get();
    }
    std::promise<V> promise;
    std::uint64_t id = next_id_++;
    map_.emplace(key, Slot{promise.get_future().share(), id});
    lock.unlock();
    try {
      V value = std::forward<F>(factory)();
      promise.set_value(value);
      if (created) *created = true;
      return value;
    } catch (...) {
      promise.set_exception(std::current_exception());
      lock.lock();
      // Only erase our own slot: clear() may have run and a new caller made a fresh one.
      auto mine = map_.find(key);
      if (mine != map_.end() && mine->second.id == id) map_.erase(mine);
      throw;
    }
  }

  /// The finished value for `key`, or nullopt (absent, still being made, or failed).
  std::optional<V> find(const K& key) const {
    std::shared_future<V> f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it == map_.end()) return std::nullopt;
      f = it->second.future;
    }
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return std::nullopt;
    try {
      return f.get();
    } catch (...) {
      return std::nullopt;
    }
  }

  /// Forgets every entry (values already handed out stay alive with their holders; calls
  /// still running their factory finish and return normally).
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
  }

  /// Entries made or being made.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }

 private:
  struct Slot {
    std::shared_future<V> future;
    std::uint64_t id;
  };
  mutable std::mutex mu_;
  std::unordered_map<K, Slot, Hash, Eq> map_;
  std::uint64_t next_id_ = 0;
};

}  // namespace kiln::runtime
