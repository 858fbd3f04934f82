#pragma once
// Process groups: the ranks that take part in collectives and the transport that moves their
// bytes (torch.distributed's ProcessGroup and backends).
//
// Two transports:
// - NCCL (CUDA tensors): one process per GPU, the communicator made from a unique id that rank 0
//   creates and shares through a rendezvous (rendezvous.hpp); collectives run on a communication
//   stream ordered by events after the kernels kiln's stream held when they were issued, and
//   kiln's stream waits for a blocking one (an asynchronous one leaves that to its Work). A
//   watchdog thread polls NCCL's asynchronous errors and each collective's completion: a
//   collective that fails or outlives the group's timeout aborts the communicator, and the next
//   collective or barrier() of the group throws DistributedError, instead of waiting forever for
//   a rank that died.
// - threads (CPU tensors): ranks are threads of one process (run_threads), exchanging through
//   shared memory. Every collective checks that all ranks called the same one (kind, count,
//   dtype, op, root): a mismatch, a rank that throws, or one that does not arrive within the
//   timeout gives every rank a DistributedError naming what happened. It is the transport of the
//   CPU tests of everything built on collectives (DistributedDataParallel's buckets and order of
//   reductions), and a real one: CPU training on several threads works through it.
//
// Reductions are deterministic: every rank receives bitwise the same result (the threads
// transport adds ranks in rank order; NCCL guarantees equal results across ranks).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/duration.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/linkage.hpp"

namespace kiln::distributed {

/// How a collective combines the ranks' values (torch.distributed.ReduceOp). Avg is for
/// floating dtypes; the others work on every dtype but bool.
enum class ReduceOp { Sum, Avg, Product, Min, Max };

/// "sum", "avg", "product", "min", "max".
KILN_ENTRY const char* reduce_op_name(ReduceOp op);

/// Settings of a process group.
struct Options {
  /// How long a collective may wait for the other ranks before every rank gets a
  /// DistributedError (torch's default for NCCL: 10 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

/// A collective started without waiting for it (torch's Work, from `async_op = true`). wait()
/// makes its result safe to read: on the CPU it blocks until the collective is done; on a GPU
/// it orders kiln's stream after it (the host does not wait). It throws the collective's error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

/// A Work that was complete when it was made.
class CompletedWork final : public Work {
 public:
  void wait() override {}
};

/// How a group moves bytes: the operations every transport provides, on contiguous memory of
/// `count` elements of `dtype` on `device` (pointers already offset). Collectives must be called
/// by every rank of the group in the same order.
class Transport {
 public:
  virtual ~Transport() = default;
  /// "nccl", "threads".
  virtual std::string name() const = 0;
  /// Whether tensors on `device` can take part.
  virtual bool supports(Device device) const = 0;
  /// The device this rank's tensors live on: its GPU for NCCL, the CPU for threads.
  virtual Device device() const = 0;
  /// data = op over ranks of data (in place).
  virtual void all_reduce(void* data, std::int64_t count, DType dtype, ReduceOp op, Device device) = 0;
  /// all_reduce, returning before it is done: `data` is read and written until the Work's
  /// wait(). Ordered with the transport's other collectives as issued. By default it runs now.
  virtual std::shared_ptr<Work> all_reduce_async(void* data, std::int64_t count, DType dtype, ReduceOp op,
                                                 Device device) {
    all_reduce(data, count, dtype, op, device);
    return std::make_shared<CompletedWork>();
  }
  /// out (world·count elements) = every rank's `in` (count elements), in rank order.
  virtual void all_gather(const void* in, void* out, std::int64_t count, DType dtype, Device device) = 0;
  /// out (count elements) = op over ranks of this rank's block of `in` (world·count elements).
  virtual void reduce_scatter(const void* in, void* out, std::int64_t count, DType dtype, ReduceOp op,
                              Device device) = 0;
  /// data = rank `root`'s data.
  virtual void broadcast(void* data, std::int64_t count, DType dtype, int root, Device device) = 0;
  /// Returns once every rank has called it (and, on a GPU, every collective issued before it
  /// has completed).
  virtual void barrier() = 0;
};

/// A set of ranks and the transport between them (torch's ProcessGroup). Made by init(),
/// init_from_env() or run_threads(); collectives without a group use the default one.
class ProcessGroup {
 public:
  ProcessGroup(int rank, int world_size, std::shared_ptr<Transport> transport, Options options = {})
      : rank_(rank), world_size_(world_size), transport_(std::move(transport)), options_(options) {}
  /// This process's (thread's) rank, 0..size()-1.
  int rank() const { return rank_; }
  /// The number of ranks.
  int size() const { return world_size_; }
  const Options& options() const { return options_; }
  Transport& transport() const { return *transport_; }
  /// "nccl" or "threads".
  std::string backend() const { return transport_->name(); }
  /// The device this rank's tensors live on (cuda:LOCAL_RANK in an NCCL group, cpu for threads).
  Device device() const { return transport_->device(); }

 private:
  int rank_, world_size_;
  std::shared_ptr<Transport> transport_;
  Options options_;
};

/// NCCL's unique id: made by rank 0 (make_unique_id) and given to every rank's init.
struct UniqueId {
  std::array<char, 128> bytes{};
};

/// A fresh NCCL unique id (ncclGetUniqueId). DistributedError when NCCL cannot be loaded.
KILN_ENTRY UniqueId make_unique_id();

/// Joins the NCCL group of `world_size` ranks as `rank`, on the CUDA device `device` (by default
/// cuda:<LOCAL_RANK>, else cuda:<rank % device count>), and makes it the process's default
/// group. Every rank must pass the same `id` (rank 0's make_unique_id()). DistributedError when
/// NCCL or the device is missing, or the communicator cannot be made; ValueError for a rank
/// outside [0, world_size).
KILN_ENTRY void init(int rank, int world_size, const UniqueId& id, Options options = {},
                     std::optional<Device> device = std::nullopt);

/// init() with torchrun's env:// rendezvous: RANK and WORLD_SIZE (required), LOCAL_RANK (the
/// device; default RANK), and rank 0's unique id shared through KILN_RENDEZVOUS_FILE when set,
/// else through a TCP listener of rank 0 at MASTER_ADDR:MASTER_PORT (rendezvous.hpp).
/// `scripts/kiln-run -n N prog args` sets them all. ValueError for a missing or malformed
/// variable; DistributedError when the rendezvous times out.
KILN_ENTRY void init_from_env(Options options = {});

/// Whether a default group exists (for this thread: a run_threads rank; else the process).
KILN_ENTRY bool is_initialized();
/// The default group: this thread's when it is a run_threads rank, else the process's.
/// DistributedError when there is none.
KILN_ENTRY ProcessGroup& default_group();
/// default_group().rank() and .size().
KILN_ENTRY int get_rank();
KILN_ENTRY int get_world_size();
/// Drops the process's default group (its communicator is destroyed once no one holds it).
KILN_ENTRY void destroy_process_group();

/// Runs `fn(rank)` on `world_size` threads, each a rank of one threads-transport group (its
/// default group inside `fn`), and returns when all have. When a rank throws, the others get a
/// DistributedError at their next collective (at once, not after the timeout), and the first
/// rank's exception is rethrown here after every thread has ended.
KILN_ENTRY void run_threads(int world_size, const std::function<void(int rank)>& fn, Options options = {});

}  // namespace kiln::distributed
