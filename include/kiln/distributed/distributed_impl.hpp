#pragma once
// The definitions of kiln::distributed (process_group.hpp, rendezvous.hpp, distributed.hpp):
// default groups, run_threads, init, and the collectives on tensors; the transports and the
// rendezvous in the files included below. Header-only mode includes them from distributed.hpp
// (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled.
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <source_location>
#include <thread>

#include "kiln/distributed/distributed.hpp"
#include "kiln/distributed/nccl_impl.hpp"
#include "kiln/distributed/rendezvous_impl.hpp"
#include "kiln/distributed/threads_impl.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/shape_ops.hpp"

namespace kiln::distributed {

KILN_ENTRY const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Product:
      return "product";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
  }
  return "?";
}

namespace detail {

// ---- default groups ----------------------------------------------------------------------------

struct DefaultGroups {
  std::mutex mutex;
  std::shared_ptr<ProcessGroup> process;
};
inline DefaultGroups& default_groups() {
  static DefaultGroups* groups = new DefaultGroups();  // never destroyed: ranks may outlive main's statics
  return *groups;
}
/// The group of a run_threads rank, on its thread.
inline ProcessGroup*& thread_group() {
  thread_local ProcessGroup* group = nullptr;
  return group;
}

inline ProcessGroup& group_or_default(ProcessGroup* group) { return group ? *group : default_group(); }

}  // namespace detail

// ---- groups ------------------------------------------------------------------------------------

KILN_ENTRY UniqueId make_unique_id() {
  const runtime::nccl::NcclApi& api = detail::require_nccl("make_unique_id");
  runtime::nccl::ncclUniqueId raw{};
  if (const auto r = api.get_unique_id(&raw); r != runtime::nccl::ncclSuccess)
    throw DistributedError("distributed: ncclGetUniqueId failed: " + detail::nccl_error_text(api, r));
  UniqueId id;
  std::memcpy(id.bytes.data(), raw.internal, id.bytes.size());
  return id;
}

KILN_ENTRY void init(int rank, int world_size, const UniqueId& id, Options options, std::optional<Device> device) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw ValueError("distributed::init: rank " + std::to_string(rank) + " is not a rank of a world of " +
                     std::to_string(world_size));
  if (!device) {
    const int count = runtime::cuda_device_count();
    if (count == 0)
      throw DistributedError("distributed::init: the NCCL group needs a CUDA device and there is none (" +
                             std::string(runtime::detail::cuda_driver_state().reason) +
                             "); CPU ranks run as threads: run_threads");
    const int local = detail::env_int("LOCAL_RANK", rank);
    device = Device::cuda(local % count);
  }
  if (!device->is_cuda())
    throw DeviceError("distributed::init: the NCCL group runs on a CUDA device, not " + device->str());
  detail::require_nccl("init");
  auto transport = std::make_shared<detail::NcclTransport>(rank, world_size, id, *device, options);
  std::lock_guard lock(detail::default_groups().mutex);
  detail::default_groups().process = std::make_shared<ProcessGroup>(rank, world_size, std::move(transport), options);
}

KILN_ENTRY void init_from_env(Options options) {
  RendezvousConfig config = rendezvous_from_env(options.timeout);
  // The unique id needs NCCL: check before anyone waits on rank 0.
  detail::require_nccl("init_from_env");
  std::string blob;
  if (config.rank == 0) {
    const UniqueId id = make_unique_id();
    blob.assign(id.bytes.data(), id.bytes.size());
  }
  blob = share_from_rank0(config, blob);
  if (blob.size() != UniqueId().bytes.size())
    throw DistributedError("distributed::init_from_env: the rendezvous gave " + std::to_string(blob.size()) +
                           " bytes, not an NCCL unique id");
  UniqueId id;
  std::memcpy(id.bytes.data(), blob.data(), id.bytes.size());
  const int count = runtime::cuda_device_count();
  init(config.rank, config.world_size, id, options,
       count > 0 ? std::optional<Device>(Device::cuda(config.local_rank % count)) : std::nullopt);
}

KILN_ENTRY bool is_initialized() {
  if (detail::thread_group()) return true;
  std::lock_guard lock(detail::default_groups().mutex);
  return detail::default_groups().process != nullptr;
}

KILN_ENTRY ProcessGroup& default_group() {
  if (ProcessGroup* g = detail::thread_group()) return *g;
  std::lock_guard lock(detail::default_groups().mutex);
  if (!detail::default_groups().process)
    throw DistributedError(
        "distributed: no process group: call distributed::init_from_env() (or init, or run inside run_threads) first");
  return *detail::default_groups().process;
}

KILN_ENTRY int get_rank() { return default_group().rank(); }
KILN_ENTRY int get_world_size() { return default_group().size(); }

KILN_ENTRY void destroy_process_group() {
  std::shared_ptr<ProcessGroup> old;
  {
    std::lock_guard lock(detail::default_groups().mutex);
    old = std::move(detail::default_groups().process);
  }
}

KILN_ENTRY void run_threads(int world_size, const std::function<void(int rank)>& fn, Options options) {
  if (world_size < 1) throw ValueError("distributed::run_threads: world_size " + std::to_string(world_size) + " < 1");
  auto world = std::make_shared<detail::ThreadWorld>(world_size, options);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::mutex first_mutex;
  int first_failed = -1;
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&, r] {
      ProcessGroup group(r, world_size, std::make_shared<detail::ThreadTransport>(world, r), options);
      detail::thread_group() = &group;
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        {
          std::lock_guard lock(first_mutex);
          if (first_failed < 0) first_failed = r;
        }
        world->fail("distributed: rank " + std::to_string(r) + " failed: " + e.what());
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        {
          std::lock_guard lock(first_mutex);
          if (first_failed < 0) first_failed = r;
        }
        world->fail("distributed: rank " + std::to_string(r) + " failed");
      }
      detail::thread_group() = nullptr;
    });
  for (std::thread& t : threads) t.join();
  if (first_failed >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first_failed)]);
}

// ---- collectives on tensors --------------------------------------------------------------------

namespace detail {

inline std::string tensor_text(const Tensor& t) {
  return t.defined() ? std::string(dtype_name(t.dtype())) + t.shape().str() + " on " + t.device().str()
                     : std::string("an undefined tensor");
}

/// The argument checks every collective makes before it waits for anyone.
inline void check_tensor(const char* op, const Tensor& t, const ProcessGroup& g, const char* role) {
  if (!t.defined()) throw ValueError(std::string("distributed::") + op + ": the " + role + " is an undefined tensor");
  if (!g.transport().supports(t.device()))
    throw DeviceError(std::string("distributed::") + op + ": the " + role + " " + tensor_text(t) +
                      " is on a device the " + g.backend() + " group does not reach (" +
                      (g.backend() == "threads" ? "threads groups move CPU tensors"
                                                : "an NCCL group moves the tensors of its own GPU") +
                      ")");
}

inline void check_op(const char* op_name, ReduceOp op, const Tensor& t) {
  if (op == ReduceOp::Avg && !is_floating(t.dtype()))
    throw DTypeError(std::string("distributed::") + op_name + ": ReduceOp avg needs a floating dtype, not " +
                     tensor_text(t));
  if (t.dtype() == DType::Bool && op != ReduceOp::Min && op != ReduceOp::Max)
    throw DTypeError(std::string("distributed::") + op_name + ": bool tensors reduce with min or max only, not " +
                     reduce_op_name(op) + " (" + tensor_text(t) + ")");
}

/// The shape of `world` tensors of `shape` laid end to end along dim 0 (a 0-dim one: [world]).
inline Shape concatenated_shape(const Shape& shape, int world) {
  if (shape.empty()) return Shape{world};
  Shape out = shape;
  out[0] *= world;
  return out;
}

/// A tensor's evaluated memory, contiguous: its own when it is, else a contiguous copy that
/// `finish` writes back (for outputs).
struct Contiguous {
  Tensor original, work;
  void* data() const {
    const ir::BufferView& v = *work.node()->buffer;
    return static_cast<char*>(v.data()) + v.offset * static_cast<std::int64_t>(itemsize(work.dtype()));
  }
  void finish() {
    if (work.node() != original.node()) original.assign(work);
  }
};

/// `written`: the collective writes into `t`, which must then own each of its elements' memory.
inline Contiguous contiguous_of(const Tensor& t, const char* what, bool written) {
  kiln::detail::before_data_read(what, std::source_location::current());
  t.eval();
  if (written && t.node()->realized() && kiln::detail::has_self_overlap(t.shape(), t.node()->buffer->strides))
    throw ShapeError(std::string(what) + ": " + t.describe() +
                     " has elements that share memory (a broadcast view); write into a tensor of its own");
  Contiguous c{t, t};
  if (!t.node()->realized() || !t.is_contiguous()) {
    c.work = kiln::empty(t.shape(), t.dtype(), t.device());
    c.work.assign(t);
  }
  return c;
}

}  // namespace detail

namespace detail {
/// An asynchronous collective whose result still has to be copied out of a contiguous copy.
class CopyBackWork final : public Work {
 public:
  CopyBackWork(std::shared_ptr<Work> inner, Contiguous copy) : inner_(std::move(inner)), copy_(std::move(copy)) {}
  void wait() override {
    inner_->wait();
    copy_.finish();
  }

 private:
  std::shared_ptr<Work> inner_;
  Contiguous copy_;
};
}  // namespace detail

KILN_ENTRY std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, ProcessGroup* group, bool async_op) {
  ProcessGroup& g = detail::group_or_default(group);
  detail::check_tensor("all_reduce", tensor, g, "tensor");
  detail::check_op("all_reduce", op, tensor);
  detail::Contiguous c = detail::contiguous_of(tensor, "distributed::all_reduce", true);
  if (async_op) {
    std::shared_ptr<Work> work =
        g.transport().all_reduce_async(c.data(), tensor.numel(), tensor.dtype(), op, tensor.device());
    if (c.work.node() == c.original.node()) return work;
    return std::make_shared<detail::CopyBackWork>(std::move(work), std::move(c));
  }
  g.transport().all_reduce(c.data(), tensor.numel(), tensor.dtype(), op, tensor.device());
  c.finish();
  return nullptr;
}

KILN_ENTRY void broadcast(const Tensor& tensor, int src, ProcessGroup* group) {
  ProcessGroup& g = detail::group_or_default(group);
  detail::check_tensor("broadcast", tensor, g, "tensor");
  if (src < 0 || src >= g.size())
    throw ValueError("distributed::broadcast: src " + std::to_string(src) + " is not a rank of a group of " +
                     std::to_string(g.size()));
  detail::Contiguous c = detail::contiguous_of(tensor, "distributed::broadcast", true);
  g.transport().broadcast(c.data(), tensor.numel(), tensor.dtype(), src, tensor.device());
  c.finish();
}

KILN_ENTRY void all_gather_into_tensor(const Tensor& output, const Tensor& input, ProcessGroup* group) {
  ProcessGroup& g = detail::group_or_default(group);
  detail::check_tensor("all_gather_into_tensor", input, g, "input");
  detail::check_tensor("all_gather_into_tensor", output, g, "output");
  const Shape expected = detail::concatenated_shape(input.shape(), g.size());
  if (output.shape() != expected || output.dtype() != input.dtype() || output.device() != input.device())
    throw ShapeError("distributed::all_gather_into_tensor: the output " + detail::tensor_text(output) + " must be " +
                     dtype_name(input.dtype()) + expected.str() + " on " + input.device().str() + " for the input " +
                     detail::tensor_text(input) + " and " + std::to_string(g.size()) + " ranks");
  detail::Contiguous src = detail::contiguous_of(input, "distributed::all_gather_into_tensor", false);
  detail::Contiguous dst = detail::contiguous_of(output, "distributed::all_gather_into_tensor", true);
  g.transport().all_gather(src.data(), dst.data(), input.numel(), input.dtype(), input.device());
  dst.finish();
}

KILN_ENTRY void all_gather(std::vector<Tensor>& outputs, const Tensor& input, ProcessGroup* group) {
  ProcessGroup& g = detail::group_or_default(group);
  detail::check_tensor("all_gather", input, g, "input");
  if (outputs.empty())
    for (int r = 0; r < g.size(); ++r) outputs.push_back(kiln::empty(input.shape(), input.dtype(), input.device()));
  if (static_cast<int>(outputs.size()) != g.size())
    throw ValueError("distributed::all_gather: " + std::to_string(outputs.size()) + " output tensors for a group of " +
                     std::to_string(g.size()) + " ranks");
  for (std::size_t r = 0; r < outputs.size(); ++r)
    if (!outputs[r].defined() || outputs[r].shape() != input.shape() || outputs[r].dtype() != input.dtype() ||
        outputs[r].device() != input.device())
      throw ShapeError("distributed::all_gather: output " + std::to_string(r) + " " + detail::tensor_text(outputs[r]) +
                       " does not match the input " + detail::tensor_text(input));
  // Gathered end to end, then each rank's block copied into its output.
  Tensor all = kiln::empty(detail::concatenated_shape(input.shape(), g.size()), input.dtype(), input.device());
  all_gather_into_tensor(all, input, &g);
  const Tensor rows = kiln::reshape(all, Shape{g.size(), input.numel()});
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const auto i = static_cast<std::int64_t>(r);
    outputs[r].assign(kiln::reshape(kiln::slice(rows, 0, i, i + 1), input.shape()));
  }
}

KILN_ENTRY void reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op, ProcessGroup* group) {
  ProcessGroup& g = detail::group_or_default(group);
  detail::check_tensor("reduce_scatter_tensor", input, g, "input");
  detail::check_tensor("reduce_scatter_tensor", output, g, "output");
  detail::check_op("reduce_scatter_tensor", op, input);
  const Shape expected = detail::concatenated_shape(output.shape(), g.size());
  if (input.shape() != expected || output.dtype() != input.dtype() || output.device() != input.device())
    throw ShapeError("distributed::reduce_scatter_tensor: the input " + detail::tensor_text(input) + " must be " +
                     dtype_name(output.dtype()) + expected.str() + " on " + output.device().str() + " for the output " +
                     detail::tensor_text(output) + " and " + std::to_string(g.size()) + " ranks");
  detail::Contiguous src = detail::contiguous_of(input, "distributed::reduce_scatter_tensor", false);
  detail::Contiguous dst = detail::contiguous_of(output, "distributed::reduce_scatter_tensor", true);
  g.transport().reduce_scatter(src.data(), dst.data(), output.numel(), output.dtype(), op, output.device());
  dst.finish();
}

KILN_ENTRY void reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op,
                               ProcessGroup* group) {
  ProcessGroup& g = detail::group_or_default(group);
  detail::check_tensor("reduce_scatter", output, g, "output");
  detail::check_op("reduce_scatter", op, output);
  if (static_cast<int>(inputs.size()) != g.size())
    throw ValueError("distributed::reduce_scatter: " + std::to_string(inputs.size()) +
                     " input tensors for a group of " + std::to_string(g.size()) + " ranks");
  for (std::size_t r = 0; r < inputs.size(); ++r)
    if (!inputs[r].defined() || inputs[r].shape() != output.shape() || inputs[r].dtype() != output.dtype() ||
        inputs[r].device() != output.device())
      throw ShapeError("distributed::reduce_scatter: input " + std::to_string(r) + " " +
                       detail::tensor_text(inputs[r]) + " does not match the output " + detail::tensor_text(output));
  // The inputs end to end, scattered as one tensor.
  reduce_scatter_tensor(
      output, kiln::reshape(kiln::stack(inputs, 0), detail::concatenated_shape(output.shape(), g.size())), op, &g);
}

KILN_ENTRY void barrier(ProcessGroup* group) { detail::group_or_default(group).transport().barrier(); }

}  // namespace kiln::distributed
