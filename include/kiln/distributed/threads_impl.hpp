#pragma once
// The threads transport (process_group.hpp): ranks that are threads of one process, exchanging
// host memory through a ThreadWorld. Part of distributed_impl.hpp (compiled once in compiled
// mode).
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <thread>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/half.hpp"
#include "kiln/distributed/deadline.hpp"
#include "kiln/distributed/process_group.hpp"

namespace kiln::distributed::detail {

// ---- element-wise reduction on the host --------------------------------------------------------

template <class T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, bool>) {
    return op == ReduceOp::Min ? (a && b) : (a || b);  // bool reduces with min and max only (checked)
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // sums and products wrap, as on the GPU, instead of being UB
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      case ReduceOp::Product:
        return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::Min:
        return std::min(a, b);
      case ReduceOp::Max:
        return std::max(a, b);
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        return a + b;
      case ReduceOp::Product:
        return a * b;
      // NaN propagates, as torch's max/min do.
      case ReduceOp::Min:
        return (a != a || a < b) ? a : b;
      case ReduceOp::Max:
        return (a != a || a > b) ? a : b;
    }
  }
  return a;
}

/// out[i] = op over r of inputs[r][offset + i], ranks in order (so every rank gets the same
/// bits). Half types reduce in float and round once.
template <class T, class Acc>
void reduce_typed(void* out, const std::vector<const void*>& inputs, std::int64_t offset, std::int64_t count,
                  ReduceOp op) {
  T* o = static_cast<T*>(out);
  const Acc world = static_cast<Acc>(inputs.size());
  for (std::int64_t i = 0; i < count; ++i) {
    Acc acc = static_cast<Acc>(static_cast<const T*>(inputs[0])[offset + i]);
    for (std::size_t r = 1; r < inputs.size(); ++r)
      acc = combine<Acc>(acc, static_cast<Acc>(static_cast<const T*>(inputs[r])[offset + i]), op);
    if (op == ReduceOp::Avg) acc = acc / world;
    o[i] = static_cast<T>(acc);
  }
}

inline void reduce_elements(void* out, const std::vector<const void*>& inputs, std::int64_t offset, std::int64_t count,
                            DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Bool:
      return reduce_typed<bool, bool>(out, inputs, offset, count, op);  // min / max only (checked)
    case DType::Int32:
      return reduce_typed<std::int32_t, std::int32_t>(out, inputs, offset, count, op);
    case DType::Int64:
      return reduce_typed<std::int64_t, std::int64_t>(out, inputs, offset, count, op);
    case DType::Float16:
      return reduce_typed<Half, float>(out, inputs, offset, count, op);
    case DType::BFloat16:
      return reduce_typed<BFloat16, float>(out, inputs, offset, count, op);
    case DType::Float32:
      return reduce_typed<float, float>(out, inputs, offset, count, op);
    case DType::Float64:
      return reduce_typed<double, double>(out, inputs, offset, count, op);
  }
}

// ---- the threads transport ---------------------------------------------------------------------

/// One collective as a rank called it: what every rank must agree on, and its input.
struct ThreadCall {
  std::string kind;
  std::int64_t count = 0;
  DType dtype = DType::Float32;
  int op = -1;    ///< ReduceOp, or -1
  int root = -1;  ///< broadcast's source, or -1
  const void* input = nullptr;
  std::uint64_t seq = 0;  ///< the rank's count of collectives before this one

  std::string str() const {
    std::string s =
        kind + " #" + std::to_string(seq) + " (" + std::to_string(count) + " " + dtype_name(dtype) + " elements";
    if (op >= 0) s += std::string(", ") + reduce_op_name(static_cast<ReduceOp>(op));
    if (root >= 0) s += ", src " + std::to_string(root);
    return s + ")";
  }
  bool agrees(const ThreadCall& o) const {
    return kind == o.kind && count == o.count && dtype == o.dtype && op == o.op && root == o.root && seq == o.seq;
  }
};

/// The shared state of the ranks of one run_threads: a cyclic barrier with a timeout, and the
/// failure that ends the group for every rank.
class ThreadWorld {
 public:
  ThreadWorld(int world_size, Options options)
      : world_(world_size),
        options_(options),
        calls_(static_cast<std::size_t>(world_size)),
        present_(static_cast<std::size_t>(world_size), false) {}

  int size() const { return world_; }

  /// Ends the group: every rank waiting now or later throws DistributedError(`why`). The first
  /// failure wins.
  void fail(const std::string& why) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = why;
    changed_.notify_all();
  }

  /// Runs one collective for `rank`: posts `call`, waits for every rank's, checks they agree,
  /// lets `compute(calls)` read every rank's input into this rank's private result, waits until
  /// every rank has read, then lets `store` write the result where this rank wants it.
  template <class Compute, class Store>
  void collective(int rank, ThreadCall call, Compute&& compute, Store&& store) {
    call.seq = seq_[rank]++;
    {
      std::lock_guard lock(mutex_);
      calls_[static_cast<std::size_t>(rank)] = call;
    }
    wait_all(rank, call.str());
    const ThreadCall& first = calls_[0];
    for (int r = 1; r < world_; ++r)
      if (!calls_[static_cast<std::size_t>(r)].agrees(first)) {
        std::string why = "distributed: the ranks called different collectives: ";
        for (int q = 0; q < world_; ++q)
          why += (q ? "; rank " : "rank ") + std::to_string(q) + " " + calls_[static_cast<std::size_t>(q)].str();
        fail(why);
        throw DistributedError(why + " (every rank must call the same collectives in the same order)");
      }
    auto result = compute(calls_);
    wait_all(rank, call.str() + ", after reading the inputs");
    store(result);
  }

  void barrier(int rank) {
    ThreadCall call;
    call.kind = "barrier";
    call.count = 0;
    collective(
        rank, call, [](const std::vector<ThreadCall>&) { return 0; }, [](int) {});
  }

 private:
  void wait_all(int rank, const std::string& what) {
    std::unique_lock lock(mutex_);
    if (!failure_.empty())
      throw DistributedError(failure_ + " (seen by rank " + std::to_string(rank) + " in " + what + ")");
    const std::uint64_t generation = generation_;
    present_[static_cast<std::size_t>(rank)] = true;
    if (++arrived_ == world_) {
      arrived_ = 0;
      std::fill(present_.begin(), present_.end(), false);
      ++generation_;
      changed_.notify_all();
      return;
    }
    const auto deadline = Clock::now() + options_.timeout;
    const bool woke =
        changed_.wait_until(lock, deadline, [&] { return generation_ != generation || !failure_.empty(); });
    if (generation_ != generation) return;
    if (!woke) {
      std::string missing;
      for (int r = 0; r < world_; ++r)
        if (!present_[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      failure_ = "distributed: rank " + std::to_string(rank) + " waited " + ms_text(options_.timeout) + " in " + what +
                 " for rank(s) " + missing + ", which did not arrive (the group's timeout)";
      changed_.notify_all();
      throw DistributedError(failure_);
    }
    throw DistributedError(failure_ + " (seen by rank " + std::to_string(rank) + " in " + what + ")");
  }

  int world_;
  Options options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<ThreadCall> calls_;
  std::vector<bool> present_;
  std::vector<std::uint64_t> seq_ = std::vector<std::uint64_t>(static_cast<std::size_t>(world_), 0);
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::string failure_;
};

/// A collective queued on a rank's communication thread: done once that thread ran it.
class QueuedWork final : public Work {
 public:
  void finish(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_ = true;
    changed_.notify_all();
  }
  void wait() override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// The transport of one run_threads rank: host memory, exchanged through the ThreadWorld. The
/// first asynchronous collective starts the rank's communication thread; from then on every
/// collective of the rank runs there, in the order issued (a blocking one waits for it), so the
/// rank's sequence of collectives is the one its code issued.
class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}
  ~ThreadTransport() override {
    {
      std::lock_guard lock(queue_mutex_);
      stop_ = true;
    }
    queue_changed_.notify_all();
    if (comm_thread_.joinable()) comm_thread_.join();
  }
  std::string name() const override { return "threads"; }
  bool supports(Device device) const override { return device.is_cpu(); }
  Device device() const override { return Device::cpu(); }

  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Device) override {
    ordered([=, this] { all_reduce_now(data, count, dtype, op); });
  }
  std::shared_ptr<Work> all_reduce_async(void* data, std::int64_t count, DType dtype, ReduceOp op, Device) override {
    return enqueue([=, this] { all_reduce_now(data, count, dtype, op); });
  }
  void all_gather(const void* in, void* out, std::int64_t count, DType dtype, Device) override {
    ordered([=, this] { all_gather_now(in, out, count, dtype); });
  }
  void reduce_scatter(const void* in, void* out, std::int64_t count, DType dtype, ReduceOp op, Device) override {
    ordered([=, this] { reduce_scatter_now(in, out, count, dtype, op); });
  }
  void broadcast(void* data, std::int64_t count, DType dtype, int root, Device) override {
    ordered([=, this] { broadcast_now(data, count, dtype, root); });
  }
  void barrier() override {
    ordered([this] { world_->barrier(rank_); });
  }

 private:
  /// Runs `task` on the communication thread (started on first use) and returns its Work.
  std::shared_ptr<Work> enqueue(std::function<void()> task) {
    auto work = std::make_shared<QueuedWork>();
    {
      std::lock_guard lock(queue_mutex_);
      if (!comm_thread_.joinable()) comm_thread_ = std::thread([this] { communicate(); });
      queue_.emplace_back(std::move(task), work);
    }
    queue_changed_.notify_all();
    return work;
  }
  /// Runs `task` now, or after the queued collectives when the communication thread exists.
  void ordered(std::function<void()> task) {
    bool queued;
    {
      std::lock_guard lock(queue_mutex_);
      queued = comm_thread_.joinable();
    }
    if (!queued) return task();
    enqueue(std::move(task))->wait();
  }
  void communicate() {
    std::unique_lock lock(queue_mutex_);
    for (;;) {
      queue_changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, every task run
      auto [task, work] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      work->finish(error);
      lock.lock();
    }
  }

  void all_reduce_now(void* data, std::int64_t count, DType dtype, ReduceOp op) {
    const std::size_t bytes = static_cast<std::size_t>(count) * itemsize(dtype);
    world_->collective(
        rank_, call("all_reduce", count, dtype, static_cast<int>(op), -1, data),
        [&](const std::vector<ThreadCall>& calls) {
          std::vector<char> out(bytes);
          reduce_elements(out.data(), inputs(calls), 0, count, dtype, op);
          return out;
        },
        [&](const std::vector<char>& out) { std::memcpy(data, out.data(), bytes); });
  }

  void all_gather_now(const void* in, void* out, std::int64_t count, DType dtype) {
    const std::size_t bytes = static_cast<std::size_t>(count) * itemsize(dtype);
    world_->collective(
        rank_, call("all_gather", count, dtype, -1, -1, in),
        [&](const std::vector<ThreadCall>& calls) {
          std::vector<char> all(bytes * calls.size());
          for (std::size_t r = 0; r < calls.size(); ++r) std::memcpy(all.data() + r * bytes, calls[r].input, bytes);
          return all;
        },
        [&](const std::vector<char>& all) { std::memcpy(out, all.data(), all.size()); });
  }

  void reduce_scatter_now(const void* in, void* out, std::int64_t count, DType dtype, ReduceOp op) {
    const std::size_t bytes = static_cast<std::size_t>(count) * itemsize(dtype);
    world_->collective(
        rank_, call("reduce_scatter", count, dtype, static_cast<int>(op), -1, in),
        [&](const std::vector<ThreadCall>& calls) {
          std::vector<char> mine(bytes);
          reduce_elements(mine.data(), inputs(calls), static_cast<std::int64_t>(rank_) * count, count, dtype, op);
          return mine;
        },
        [&](const std::vector<char>& mine) { std::memcpy(out, mine.data(), bytes); });
  }

  void broadcast_now(void* data, std::int64_t count, DType dtype, int root) {
    const std::size_t bytes = static_cast<std::size_t>(count) * itemsize(dtype);
    world_->collective(
        rank_, call("broadcast", count, dtype, -1, root, data),
        [&](const std::vector<ThreadCall>& calls) {
          const char* src = static_cast<const char*>(calls[static_cast<std::size_t>(root)].input);
          return std::vector<char>(src, src + bytes);
        },
        [&](const std::vector<char>& value) { std::memcpy(data, value.data(), bytes); });
  }

  static ThreadCall call(const char* kind, std::int64_t count, DType dtype, int op, int root, const void* input) {
    ThreadCall c;
    c.kind = kind;
    c.count = count;
    c.dtype = dtype;
    c.op = op;
    c.root = root;
    c.input = input;
    return c;
  }
  static std::vector<const void*> inputs(const std::vector<ThreadCall>& calls) {
    std::vector<const void*> in;
    for (const ThreadCall& c : calls) in.push_back(c.input);
    return in;
  }

  std::shared_ptr<ThreadWorld> world_;
  int rank_;
  std::mutex queue_mutex_;
  std::condition_variable queue_changed_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<QueuedWork>>> queue_;
  bool stop_ = false;
  std::thread comm_thread_;
};

}  // namespace kiln::distributed::detail
