#pragma once
// Data-dependent reads: gather, index_select, take_along_dim, embedding. Each is one Gather
// primitive (the index read inside the kernel that reads the result, so `embedding(W, ids) *
// scale + pos` is one kernel), with PyTorch's names, argument orders, shapes and dtype rules.
//
// Indices are int64 or int32 (cast to int64 inside the kernel). A negative index is an error, as
// on PyTorch's CUDA path (no wrap-around). Out-of-range indices raise IndexError: before anything
// is compiled when the index is already in host memory, otherwise from the kernel that read it
// (core/index_fault.hpp: the read is clamped into range and the run's results are discarded).
#include <optional>
#include <string>
#include <vector>

#include "kiln/tensor/functions.hpp"

namespace kiln {

namespace detail {

/// The index tensor of `op` as int64 (DTypeError unless int32/int64; ShapeError if on another
/// device than `x`).
inline ir::NodePtr index_node(const Tensor& x, const Tensor& index, const char* op) {
  if (index.dtype() != DType::Int64 && index.dtype() != DType::Int32)
    throw DTypeError(std::string(op) + ": expected an int64 or int32 index, got " + describe(index) + " for input " +
                     describe(x));
  check_same_device(x.device(), index.device(), op);
  return ir::cast(index.node(), DType::Int64);
}

/// IndexError naming `op` for the first entry of `index` outside [0, bound) when the index is
/// already in host memory (lazy or device indices are checked by the kernel that reads them).
inline void check_host_index(const Tensor& x, const Tensor& index, std::int64_t axis, std::int64_t bound,
                             const char* op) {
  if (!index.is_evaluated() || !index.device().is_cpu() || deferring_eval() || index.numel() == 0) return;
  // Read in place, through the buffer's strides (no graph runs for the check).
  const ir::BufferView& b = *index.node()->buffer;
  const Shape& shape = index.shape();
  std::vector<std::int64_t> p(shape.size(), 0);
  for (std::int64_t i = 0; i < index.numel(); ++i) {
    std::int64_t at = b.offset;
    for (std::size_t d = 0; d < shape.size(); ++d) at += p[d] * b.strides[d];
    const std::int64_t v = index.dtype() == DType::Int64 ? static_cast<const std::int64_t*>(b.data())[at]
                                                         : static_cast<const std::int32_t*>(b.data())[at];
    if (v < 0 || v >= bound)
      throw IndexError(std::string(op) + ": index " + std::to_string(v) + " is out of bounds for dimension " +
                       std::to_string(axis) + " with size " + std::to_string(bound) + " (input " + describe(x) +
                       ", index " + describe(index) + ", at flat position " + std::to_string(i) + ")");
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++p[d] < shape[d]) break;
      p[d] = 0;
    }
  }
}

/// A gather with nothing to read from: an error unless the index is empty too.
inline void check_gather_source(const Tensor& x, const Tensor& index, std::int64_t axis, const char* op) {
  if (x.shape()[static_cast<std::size_t>(axis)] == 0 && index.numel() > 0)
    throw IndexError(std::string(op) + ": cannot index dimension " + std::to_string(axis) + " of size 0 (input " +
                     describe(x) + ", index " + describe(index) + ")");
}

/// gather(x, index) along `axis` on nodes of equal rank >= 1 (index's shape at most x's off the axis).
inline Tensor gather_nodes(const Tensor& x, const ir::NodePtr& index, std::int64_t axis, ir::GatherSite site) {
  if (index->shape.numel() == 0) return Tensor(ir::constant(0.0, x.dtype(), index->shape, x.device()));
  return Tensor(ir::gather(x.node(), index, axis, site));
}

}  // namespace detail

/// Values of `input` along `dim` at `index`: out[i][j][k] = input[index[i][j][k]][j][k] (dim 0),
/// as torch.gather. index has input's rank and, off `dim`, sizes at most input's; the result
/// has index's shape and input's dtype.
inline Tensor gather(const Tensor& input, std::int64_t dim, const Tensor& index) {
  Tensor x = detail::to_tensor(input);
  const char* op = "gather";
  ir::NodePtr idx = detail::index_node(x, index, op);
  const std::int64_t axis = detail::tensor_axis(dim, x, op);
  if (index.dim() != x.dim() && !(x.dim() <= 1 && index.dim() <= 1))
    throw ShapeError(std::string(op) + ": index " + detail::describe(index) + " must have the rank of input " +
                     detail::describe(x));
  // 0-dim operands are gathered as one-element vectors.
  Tensor xv = x.dim() == 0 ? Tensor(ir::reshape(x.node(), Shape{1})) : x;
  ir::NodePtr iv = index.dim() == 0 ? ir::reshape(idx, Shape{1}) : idx;
  for (std::size_t d = 0; d < iv->shape.size(); ++d)
    if (static_cast<std::int64_t>(d) != axis && iv->shape[d] > xv.shape()[d])
      throw ShapeError(std::string(op) + ": index " + detail::describe(index) + " is larger than input " +
                       detail::describe(x) + " in dimension " + std::to_string(d) + " (only dimension " +
                       std::to_string(axis) + " may differ)");
  detail::check_gather_source(xv, index, axis, op);
  detail::check_host_index(x, index, axis, xv.shape()[static_cast<std::size_t>(axis)], op);
  Tensor out = detail::gather_nodes(xv, iv, axis, ir::GatherSite::Gather);
  return index.dim() == 0 ? Tensor(ir::reshape(out.node(), Shape{})) : out;
}

/// The entries of `input` along `dim` at the positions of the 1-d (or 0-d) `index`, as
/// torch.index_select: input's shape with dim's size index.numel().
inline Tensor index_select(const Tensor& input, std::int64_t dim, const Tensor& index) {
  Tensor x = detail::to_tensor(input);
  const char* op = "index_select";
  ir::NodePtr idx = detail::index_node(x, index, op);
  if (index.dim() > 1)
    throw ShapeError(std::string(op) + ": index must be 1-d (or 0-d), got " + detail::describe(index) + " for input " +
                     detail::describe(x));
  const std::int64_t axis = detail::tensor_axis(dim, x, op);
  Tensor xv = x.dim() == 0 ? Tensor(ir::reshape(x.node(), Shape{1})) : x;
  detail::check_gather_source(xv, index, axis, op);
  detail::check_host_index(x, index, axis, xv.shape()[static_cast<std::size_t>(axis)], op);
  Shape out = xv.shape();
  out[static_cast<std::size_t>(axis)] = index.numel();
  Shape column(out.size(), 1);
  column[static_cast<std::size_t>(axis)] = index.numel();
  Tensor r = detail::gather_nodes(xv, ir::broadcast(ir::reshape(idx, column), out), axis, ir::GatherSite::IndexSelect);
  return x.dim() == 0 ? Tensor(ir::reshape(r.node(), Shape{})) : r;
}

/// Values of `input` at `indices` along `dim`, input and indices broadcast against each other off
/// `dim`, as torch.take_along_dim; without `dim`, both are flattened first.
inline Tensor take_along_dim(const Tensor& input, const Tensor& indices, std::optional<std::int64_t> dim = std::nullopt) {
  Tensor x = detail::to_tensor(input);
  const char* op = "take_along_dim";
  ir::NodePtr idx = detail::index_node(x, indices, op);
  if (!dim) {
    Tensor flat(ir::reshape(x.node(), Shape{x.numel()}));
    detail::check_gather_source(flat, indices, 0, op);
    detail::check_host_index(x, indices, 0, x.numel(), op);
    return detail::gather_nodes(flat, ir::reshape(idx, Shape{indices.numel()}), 0, ir::GatherSite::TakeAlongDim);
  }
  if (indices.dim() != x.dim())
    throw ShapeError(std::string(op) + ": input " + detail::describe(x) + " and indices " + detail::describe(indices) +
                     " should have the same number of dimensions");
  const std::int64_t axis = detail::tensor_axis(*dim, x, op);
  Tensor xv = x.dim() == 0 ? Tensor(ir::reshape(x.node(), Shape{1})) : x;
  ir::NodePtr iv = x.dim() == 0 ? ir::reshape(idx, Shape{1}) : idx;
  // Broadcast off the axis: the input to the common sizes (it keeps its axis), the index too.
  Shape xs = xv.shape(), is = iv->shape;
  for (std::size_t d = 0; d < xs.size(); ++d) {
    if (static_cast<std::int64_t>(d) == axis) continue;
    if (xs[d] != is[d] && xs[d] != 1 && is[d] != 1)
      throw ShapeError(std::string(op) + ": input " + detail::describe(x) + " and indices " +
                       detail::describe(indices) + " do not broadcast in dimension " + std::to_string(d));
    const std::int64_t n = xs[d] == 1 ? is[d] : xs[d];
    xs[d] = is[d] = n;
  }
  detail::check_gather_source(xv, indices, axis, op);
  detail::check_host_index(x, indices, axis, xv.shape()[static_cast<std::size_t>(axis)], op);
  Tensor xb(ir::broadcast(xv.node(), xs));
  Tensor r = detail::gather_nodes(xb, ir::broadcast(iv, is), axis, ir::GatherSite::TakeAlongDim);
  return x.dim() == 0 ? Tensor(ir::reshape(r.node(), Shape{})) : r;
}

/// Rows of the 2-d `weight` [num_embeddings, embedding_dim] at `index` (any shape): the
/// result is index's shape + [embedding_dim], as torch.nn.functional.embedding.
inline Tensor embedding(const Tensor& weight, const Tensor& index) {
  Tensor w = detail::to_tensor(weight);
  const char* op = "embedding";
  ir::NodePtr idx = detail::index_node(w, index, op);
  if (w.dim() != 2)
    throw ShapeError(std::string(op) + ": weight must be 2-d [num_embeddings, embedding_dim], got " +
                     detail::describe(w) + " (index " + detail::describe(index) + ")");
  detail::check_gather_source(w, index, 0, op);
  detail::check_host_index(w, index, 0, w.shape()[0], op);
  const std::int64_t n = index.numel(), d = w.shape()[1];
  Shape out = index.shape();
  out.push_back(d);
  checked_numel(out, op);
  ir::NodePtr rows = ir::broadcast(ir::reshape(idx, Shape{n, 1}), Shape{n, d});
  Tensor r = detail::gather_nodes(w, rows, 0, ir::GatherSite::Embedding);
  return Tensor(ir::reshape(r.node(), out));
}

}  // namespace kiln
