#pragma once
// kiln::distributed: collectives on tensors (torch.distributed's names and semantics) over a
// process group (process_group.hpp), the rendezvous that makes one (rendezvous.hpp), and
// nn::DistributedDataParallel (nn/ddp.hpp) built on them.
//
// A collective evaluates its tensors first (it is a graph break inside kiln::compile, as a data
// read is), then works on their memory: in place for all_reduce and broadcast (as assign() does,
// a lazy tensor built from the old value reads the new one when it is evaluated later). Tensors
// must have the same shape, dtype and device on every rank; a non-contiguous one goes through a
// contiguous copy. Every argument is checked before any rank is waited for: a ShapeError,
// DTypeError or DeviceError names the collective, the shapes and the dtypes.
#include <memory>
#include <vector>

#include "kiln/distributed/process_group.hpp"
#include "kiln/distributed/rendezvous.hpp"
#include "kiln/tensor/tensor.hpp"

namespace kiln::distributed {

/// Combines `tensor` over the ranks with `op`, in place: afterwards every rank holds the result.
/// With `async_op` it returns a Work at once, and the result may be read after its wait()
/// (torch's async_op); otherwise it returns null once the result is in place.
KILN_ENTRY std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum,
                                            ProcessGroup* group = nullptr, bool async_op = false);

/// Makes every rank's `tensor` equal to rank `src`'s, in place.
KILN_ENTRY void broadcast(const Tensor& tensor, int src, ProcessGroup* group = nullptr);

/// outputs[r] = rank r's `input`, for every rank. `outputs` holds world_size tensors of the
/// input's shape and dtype (written in place); an empty vector is filled with new tensors.
KILN_ENTRY void all_gather(std::vector<Tensor>& outputs, const Tensor& input, ProcessGroup* group = nullptr);

/// `output` (dim 0 world_size times the input's) = the ranks' `input`s concatenated along dim 0.
KILN_ENTRY void all_gather_into_tensor(const Tensor& output, const Tensor& input, ProcessGroup* group = nullptr);

/// output = op over ranks of inputs[this rank]: `inputs` holds world_size tensors of the
/// output's shape and dtype.
KILN_ENTRY void reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op = ReduceOp::Sum,
                               ProcessGroup* group = nullptr);

/// output = op over ranks of this rank's block of `input` along dim 0 (whose size is
/// world_size times the output's).
KILN_ENTRY void reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                                      ProcessGroup* group = nullptr);

/// Returns once every rank has called it (on a GPU, after the collectives issued before it).
KILN_ENTRY void barrier(ProcessGroup* group = nullptr);

}  // namespace kiln::distributed

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/distributed/distributed_impl.hpp"
#endif
