#pragma once
// The NCCL transport (process_group.hpp): one communicator per process on its GPU, collectives
// on kiln's stream, a watchdog that turns a dead or late rank into a DistributedError. Part of
// distributed_impl.hpp (compiled once in compiled mode).
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kiln/distributed/deadline.hpp"
#include "kiln/distributed/process_group.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/nccl.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln::distributed::detail {

// ---- the NCCL transport ------------------------------------------------------------------------

inline const runtime::nccl::NcclApi& require_nccl(const char* what) {
  const runtime::nccl::NcclState& s = runtime::nccl::nccl_state();
  if (!s.ok()) throw DistributedError(std::string("distributed: ") + what + " needs NCCL: " + s.reason);
  return s.api;
}

inline std::string nccl_error_text(const runtime::nccl::NcclApi& api, runtime::nccl::ncclResult_t r) {
  const char* s = api.get_error_string ? api.get_error_string(r) : nullptr;
  return "NCCL error " + std::to_string(r) + (s ? std::string(" (") + s + ")" : std::string());
}

inline runtime::nccl::ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return runtime::nccl::ncclSum;
    case ReduceOp::Avg:
      return runtime::nccl::ncclAvg;
    case ReduceOp::Product:
      return runtime::nccl::ncclProd;
    case ReduceOp::Min:
      return runtime::nccl::ncclMin;
    case ReduceOp::Max:
      return runtime::nccl::ncclMax;
  }
  return runtime::nccl::ncclSum;
}

inline runtime::cu::CUevent new_event() {
  const auto& cu = runtime::detail::cuda_driver_state().api;
  runtime::cu::CUevent e = nullptr;
  constexpr unsigned kDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING
  runtime::detail::cuda_check(cu.event_create(&e, kDisableTiming), "cuEventCreate", "for a collective");
  return e;
}

/// Makes `stream` wait for `done` (recorded on the communication stream), then lets the event go
/// (the driver keeps it until the wait is satisfied).
inline void stream_after(runtime::cu::CUstream stream, runtime::cu::CUevent done) {
  const auto& cu = runtime::detail::cuda_driver_state().api;
  runtime::detail::cuda_check(cu.stream_wait_event(stream, done, 0), "cuStreamWaitEvent", "after a collective");
  cu.event_destroy(done);
}

/// An NCCL collective in flight: wait() orders kiln's stream after it (the host goes on).
class NcclWork final : public Work {
 public:
  NcclWork(int device, runtime::cu::CUevent done) : device_(device), done_(done) {}
  ~NcclWork() override {
    if (done_) runtime::detail::cuda_driver_state().api.event_destroy(done_);
  }
  void wait() override {
    if (!done_) return;
    runtime::CudaContext& ctx = runtime::cuda_context(device_);
    ctx.make_current();
    stream_after(ctx.stream, std::exchange(done_, nullptr));
  }

 private:
  int device_;
  runtime::cu::CUevent done_;
};

/// One NCCL communicator on one device. Its collectives run on a communication stream of their
/// own, each after the work kiln's stream held when it was issued (an event between them): a
/// blocking collective then makes kiln's stream wait for it, an asynchronous one leaves that to
/// its Work, so kernels issued meanwhile run beside it (DistributedDataParallel's buckets
/// reduced while the backward goes on). One stream keeps the collectives in the order issued,
/// which NCCL needs on every rank. A watchdog thread checks, every 20 ms, NCCL's asynchronous
/// error and whether the oldest collective still running has outlived the timeout; either
/// aborts the communicator (which ends its kernels, so no stream waits forever) and the failure
/// is thrown by the next call.
class NcclTransport final : public Transport {
 public:
  NcclTransport(int rank, int world_size, const UniqueId& id, Device device, Options options)
      : api_(require_nccl("init")), device_(device), rank_(rank), options_(options) {
    runtime::CudaContext& ctx = runtime::cuda_context(device.index);
    ctx.make_current();
    runtime::nccl::ncclUniqueId raw;
    std::memcpy(raw.internal, id.bytes.data(), sizeof raw.internal);
    const runtime::nccl::ncclResult_t r = api_.comm_init_rank(&comm_, world_size, raw, rank);
    if (r != runtime::nccl::ncclSuccess)
      throw DistributedError("distributed: ncclCommInitRank for rank " + std::to_string(rank) + " of " +
                             std::to_string(world_size) + " on " + device.str() +
                             " failed: " + nccl_error_text(api_, r));
    const auto& cu = runtime::detail::cuda_driver_state().api;
    runtime::detail::cuda_check(cu.stream_create(&comm_stream_, runtime::cu::CU_STREAM_NON_BLOCKING), "cuStreamCreate",
                                "for NCCL's collectives");
    scratch_ = kiln::empty(Shape{1}, DType::Float32, device);
    scratch_.assign(0.0f);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclTransport() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) {
      std::lock_guard lock(mutex_);
      const auto& cu = runtime::detail::cuda_driver_state().api;
      for (Pending& p : pending_) cu.event_destroy(p.done);
      if (failure_.empty()) {
        api_.comm_destroy(comm_);
        cu.stream_destroy(comm_stream_);
      }
    }
  }

  std::string name() const override { return "nccl"; }
  bool supports(Device device) const override { return device == device_; }
  Device device() const override { return device_; }

  void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Device) override {
    finish(issue("all_reduce", [&](cu_stream s) {
      return api_.all_reduce(data, data, static_cast<std::size_t>(count), runtime::nccl::nccl_dtype(dtype), nccl_op(op),
                             comm_, s);
    }));
  }
  void all_gather(const void* in, void* out, std::int64_t count, DType dtype, Device) override {
    finish(issue("all_gather", [&](cu_stream s) {
      return api_.all_gather(in, out, static_cast<std::size_t>(count), runtime::nccl::nccl_dtype(dtype), comm_, s);
    }));
  }
  void reduce_scatter(const void* in, void* out, std::int64_t count, DType dtype, ReduceOp op, Device) override {
    finish(issue("reduce_scatter", [&](cu_stream s) {
      return api_.reduce_scatter(in, out, static_cast<std::size_t>(count), runtime::nccl::nccl_dtype(dtype),
                                 nccl_op(op), comm_, s);
    }));
  }
  void broadcast(void* data, std::int64_t count, DType dtype, int root, Device) override {
    finish(issue("broadcast", [&](cu_stream s) {
      return api_.broadcast(data, data, static_cast<std::size_t>(count), runtime::nccl::nccl_dtype(dtype), root, comm_,
                            s);
    }));
  }
  std::shared_ptr<Work> all_reduce_async(void* data, std::int64_t count, DType dtype, ReduceOp op, Device) override {
    return std::make_shared<NcclWork>(device_.index, issue("all_reduce", [&](cu_stream s) {
                                        return api_.all_reduce(data, data, static_cast<std::size_t>(count),
                                                               runtime::nccl::nccl_dtype(dtype), nccl_op(op), comm_, s);
                                      }));
  }
  /// An all_reduce of one element, then a wait for the stream that gives up with the group.
  void barrier() override {
    void* one = scratch_.node()->buffer->data();
    all_reduce(one, 1, DType::Float32, ReduceOp::Sum, device_);
    runtime::CudaContext& ctx = runtime::cuda_context(device_.index);
    const auto& cu = runtime::detail::cuda_driver_state().api;
    for (;;) {
      check("barrier");
      std::unique_lock lock(mutex_);
      if (pending_.empty()) break;
      wake_.wait_for(lock, std::chrono::milliseconds(1));
    }
    runtime::detail::cuda_check(cu.stream_synchronize(ctx.stream), "cuStreamSynchronize", "in distributed barrier");
    check("barrier");
  }

 private:
  using cu_stream = runtime::cu::CUstream;
  struct Pending {
    runtime::cu::CUevent done;
    Clock::time_point issued;
    std::string what;
  };

  void check(const char* what) {
    std::lock_guard lock(mutex_);
    if (!failure_.empty())
      throw DistributedError(failure_ + " (seen by rank " + std::to_string(rank_) + " in " + what + ")");
  }

  /// Enqueues `call` on the communication stream after what kiln's stream holds now; returns
  /// an event recorded after it there (the watchdog watches one of its own).
  template <class Call>
  runtime::cu::CUevent issue(const char* what, Call&& call) {
    check(what);
    runtime::CudaContext& ctx = runtime::cuda_context(device_.index);
    ctx.make_current();
    const auto& cu = runtime::detail::cuda_driver_state().api;
    runtime::cu::CUevent ready = new_event();
    runtime::detail::cuda_check(cu.event_record(ready, ctx.stream), "cuEventRecord", "before a collective");
    stream_after(comm_stream_, ready);
    const runtime::nccl::ncclResult_t r = call(comm_stream_);
    if (r != runtime::nccl::ncclSuccess)
      throw DistributedError(std::string("distributed: ") + what + " on rank " + std::to_string(rank_) + " (" +
                             device_.str() + "): " + nccl_error_text(api_, r));
    runtime::cu::CUevent done = new_event(), watched = new_event();
    runtime::detail::cuda_check(cu.event_record(done, comm_stream_), "cuEventRecord", "after a collective");
    runtime::detail::cuda_check(cu.event_record(watched, comm_stream_), "cuEventRecord", "after a collective");
    std::lock_guard lock(mutex_);
    pending_.push_back({watched, Clock::now(), std::string(what) + " #" + std::to_string(issued_++)});
    return done;
  }
  /// Kiln's stream goes on after the collective that recorded `done`.
  void finish(runtime::cu::CUevent done) { stream_after(runtime::cuda_context(device_.index).stream, done); }

  void watch() {
    runtime::cuda_context(device_.index).make_current();
    const auto& cu = runtime::detail::cuda_driver_state().api;
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(20));
      if (stop_ || !failure_.empty()) continue;
      runtime::nccl::ncclResult_t async = runtime::nccl::ncclSuccess;
      if (api_.comm_get_async_error(comm_, &async) == runtime::nccl::ncclSuccess &&
          async != runtime::nccl::ncclSuccess && async != runtime::nccl::ncclInProgress) {
        abort_locked("distributed: NCCL reported an asynchronous " + nccl_error_text(api_, async) + " on rank " +
                     std::to_string(rank_));
        continue;
      }
      while (!pending_.empty()) {
        Pending& p = pending_.front();
        const runtime::cu::CUresult q = cu.event_query(p.done);
        if (q == runtime::cu::CUDA_SUCCESS) {
          cu.event_destroy(p.done);
          pending_.pop_front();
          continue;
        }
        if (Clock::now() - p.issued > options_.timeout)
          abort_locked("distributed: " + p.what + " on rank " + std::to_string(rank_) + " did not complete within " +
                       ms_text(options_.timeout) +
                       " (the group's timeout; a rank died or stopped calling collectives)");
        break;
      }
      if (pending_.empty()) wake_.notify_all();
    }
  }

  /// The communicator is aborted (its kernels return, so streams drain) and every later call
  /// of this group throws `why`.
  void abort_locked(const std::string& why) {
    failure_ = why;
    api_.comm_abort(comm_);
    const auto& cu = runtime::detail::cuda_driver_state().api;
    for (Pending& p : pending_) cu.event_destroy(p.done);
    pending_.clear();
    wake_.notify_all();
  }

  const runtime::nccl::NcclApi& api_;
  Device device_;
  int rank_;
  Options options_;
  runtime::nccl::ncclComm_t comm_ = nullptr;
  runtime::cu::CUstream comm_stream_ = nullptr;
  Tensor scratch_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::uint64_t issued_ = 0;
  std::string failure_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace kiln::distributed::detail
