#pragma once
// A thread-safe map whose values are made once per key, even when threads race for a new key:
// the first caller runs the factory, the others wait for its result.
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
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
      std::shared_ptr<Slot> ready = it->second;
      lock.unlock();
      if (created) *created = false;
      return ready->get();
    }
    auto slot = std::make_shared<Slot>();
    map_.emplace(key, slot);
    lock.unlock();
    try {
      V value = std::forward<F>(factory)();
      slot->finish(value, nullptr);
      if (created) *created = true;
      return value;
    } catch (...) {
      slot->finish(std::nullopt, std::current_exception());
      lock.lock();
      // Only erase our own slot: clear() may have run and a new caller made a fresh one.
      auto mine = map_.find(key);
      if (mine != map_.end() && mine->second == slot) map_.erase(mine);
      throw;
    }
  }

  /// The finished value for `key`, or nullopt (absent, still being made, or failed).
  std::optional<V> find(const K& key) const {
    std::shared_ptr<Slot> slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it == map_.end()) return std::nullopt;
      slot = it->second;
    }
    std::lock_guard<std::mutex> lock(slot->mu);
    return slot->value;  // nullopt while being made and after a failure
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
  /// One key's value, or the exception of the factory that was making it: set once by the
  /// call that ran the factory, waited for by the others. (A mutex and a condition variable
  /// rather than std::shared_future: <future> and its instantiations cost every file that
  /// includes kiln in header-only mode.)
  struct Slot {
    std::mutex mu;
    std::condition_variable finished;
    bool done = false;
    std::optional<V> value;
    std::exception_ptr error;

    void finish(std::optional<V> v, std::exception_ptr e) {
      {
        std::lock_guard<std::mutex> lock(mu);
        value = std::move(v);
        error = std::move(e);
        done = true;
      }
      finished.notify_all();
    }
    /// The value once made; rethrows the factory's exception.
    V get() {
      std::unique_lock<std::mutex> lock(mu);
      finished.wait(lock, [&] { return done; });
      if (error) std::rethrow_exception(error);
      return *value;
    }
  };
  mutable std::mutex mu_;
  std::unordered_map<K, std::shared_ptr<Slot>, Hash, Eq> map_;
};

}  // namespace kiln::runtime
