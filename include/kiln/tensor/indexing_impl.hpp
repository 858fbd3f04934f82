#pragma once
// The definitions of the indexing ops (tensor/indexing.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/indexing.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY ir::NodePtr index_node(const Tensor& x, const Tensor& index, const char* op) {
  if (index.dtype() != DType::Int64 && index.dtype() != DType::Int32)
    throw DTypeError(std::string(op) + ": expected an int64 or int32 index, got " + describe(index) + " for input " +
                     describe(x));
  check_same_device(x.device(), index.device(), op);
  return ir::cast(index.node(), DType::Int64);
}

KILN_ENTRY void check_host_index(const Tensor& x, const Tensor& index, std::int64_t axis, std::int64_t bound,
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

KILN_ENTRY void check_gather_source(const Tensor& x, const Tensor& index, std::int64_t axis, const char* op) {
  if (x.shape()[static_cast<std::size_t>(axis)] == 0 && index.numel() > 0)
    throw IndexError(std::string(op) + ": cannot index dimension " + std::to_string(axis) + " of size 0 (input " +
                     describe(x) + ", index " + describe(index) + ")");
}

KILN_ENTRY Tensor gather_nodes(const Tensor& x, const ir::NodePtr& index, std::int64_t axis, ir::GatherSite site) {
  if (index->shape.numel() == 0) {
    // Nothing to read, but the (empty) result still comes from x: where x records gradients, its
    // gradient reaches x as zeros (as PyTorch's), so a loss built on it differentiates.
    ir::NodePtr out = ir::constant(0.0, x.dtype(), index->shape, x.device());
    const ir::NodePtr& xn = x.node();
    if (ir::records_grad(xn)) {
      out->requires_grad = true;
      decomp::with_gradient(out, {xn}, [xn](const ir::NodePtr&, const ir::NodePtr&) {
        return std::vector<ir::NodePtr>{ir::constant(0.0, xn->dtype, xn->shape, xn->device)};
      });
    }
    return Tensor(out);
  }
  return Tensor(ir::gather(x.node(), index, axis, site));
}

KILN_ENTRY std::atomic<int>& scatter_mode_setting() {
  static std::atomic<int> mode{env::get("KILN_SCATTER_MODE", "") == "atomic" ? 1 : 0};
  return mode;
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor gather(const Tensor& input, std::int64_t dim, const Tensor& index) {
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

KILN_ENTRY Tensor index_select(const Tensor& input, std::int64_t dim, const Tensor& index) {
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

KILN_ENTRY Tensor take_along_dim(const Tensor& input, const Tensor& indices, std::optional<std::int64_t> dim) {
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

KILN_ENTRY Tensor embedding(const Tensor& weight, const Tensor& index) {
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
  // Rows 0..n-1 in order (a position embedding read at arange(T)) are the table's first n rows:
  // a slice, whose gradient pads instead of scattering (a scatter along the rows whose index is
  // the same for every column runs one thread per column through all the rows).
  if (idx->op == ir::Op::Iota && !idx->realized() && idx->shape.size() == 1 && n <= w.shape()[0])
    return Tensor(ir::reshape(ir::slice(w.node(), 0, 0, n, 1), out));
  ir::NodePtr rows = ir::broadcast(ir::reshape(idx, Shape{n, 1}), Shape{n, d});
  Tensor r = detail::gather_nodes(w, rows, 0, ir::GatherSite::Embedding);
  return Tensor(ir::reshape(r.node(), out));
}

}  // namespace kiln

namespace kiln {
namespace detail {

KILN_ENTRY Tensor scatter_into(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& src,
                               bool accumulate, ir::GatherSite site, const char* op) {
  Tensor x = to_tensor(input);
  ir::NodePtr idx = index_node(x, index, op);
  check_same_device(x.device(), src.device(), op);
  if (src.dtype() != x.dtype())
    throw DTypeError(std::string(op) + ": src " + describe(src) + " must have the dtype of input " + describe(x));
  if (x.dim() == 0 || index.dim() != x.dim() || src.dim() != x.dim())
    throw ShapeError(std::string(op) + ": input " + describe(x) + ", index " + describe(index) + " and src " +
                     describe(src) + " must have one rank of at least 1");
  const std::int64_t axis = tensor_axis(dim, x, op);
  for (std::size_t d = 0; d < x.shape().size(); ++d) {
    if (static_cast<std::int64_t>(d) != axis && index.shape()[d] > x.shape()[d])
      throw ShapeError(std::string(op) + ": index " + describe(index) + " is larger than input " + describe(x) +
                       " in dimension " + std::to_string(d) + " (only dimension " + std::to_string(axis) +
                       " may differ)");
    if (index.shape()[d] > src.shape()[d])
      throw ShapeError(std::string(op) + ": index " + describe(index) + " is larger than src " + describe(src) +
                       " in dimension " + std::to_string(d));
  }
  if (x.shape()[static_cast<std::size_t>(axis)] == 0 && index.numel() > 0)
    throw IndexError(std::string(op) + ": cannot index dimension " + std::to_string(axis) + " of size 0 (input " +
                     describe(x) + ", index " + describe(index) + ")");
  check_host_index(x, index, axis, x.shape()[static_cast<std::size_t>(axis)], op);
  ir::NodePtr s = src.node();
  for (std::size_t d = 0; d < index.shape().size(); ++d)
    if (s->shape[d] != index.shape()[d]) s = ir::slice(s, static_cast<std::int64_t>(d), 0, index.shape()[d], 1);
  const bool atomic = accumulate && scatter_mode() == ScatterMode::Atomic;
  return Tensor(ir::scatter(x.node(), idx, s, axis, accumulate, atomic, site));
}

KILN_ENTRY Tensor index_scatter(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& source,
                                bool accumulate, ir::GatherSite site, const char* op) {
  Tensor x = to_tensor(input);
  ir::NodePtr idx = index_node(x, index, op);
  check_same_device(x.device(), source.device(), op);
  if (index.dim() > 1)
    throw ShapeError(std::string(op) + ": index must be 1-d (or 0-d), got " + describe(index) + " for input " +
                     describe(x));
  if (source.dtype() != x.dtype())
    throw DTypeError(std::string(op) + ": source " + describe(source) + " must have the dtype of input " + describe(x));
  const std::int64_t axis = tensor_axis(dim, x, op);
  Tensor xv = x.dim() == 0 ? Tensor(ir::reshape(x.node(), Shape{1})) : x;
  Tensor sv = source.dim() == 0 ? Tensor(ir::reshape(source.node(), Shape{1})) : source;
  Shape want = xv.shape();
  want[static_cast<std::size_t>(axis)] = index.numel();
  if (sv.shape() != want)
    throw ShapeError(std::string(op) + ": source " + describe(source) + " must have shape " + want.str() + " (input " +
                     describe(x) + " with dimension " + std::to_string(axis) + " of index " + describe(index) +
                     "'s length)");
  Shape column(want.size(), 1);
  column[static_cast<std::size_t>(axis)] = index.numel();
  Tensor spread(ir::broadcast(ir::reshape(idx, column), want));
  if (xv.shape()[static_cast<std::size_t>(axis)] == 0 && index.numel() > 0)
    throw IndexError(std::string(op) + ": cannot index dimension " + std::to_string(axis) + " of size 0 (input " +
                     describe(x) + ", index " + describe(index) + ")");
  check_host_index(x, index, axis, xv.shape()[static_cast<std::size_t>(axis)], op);
  const bool atomic = accumulate && scatter_mode() == ScatterMode::Atomic;
  Tensor r(ir::scatter(xv.node(), spread.node(), sv.node(), axis, accumulate, atomic, site));
  return x.dim() == 0 ? Tensor(ir::reshape(r.node(), Shape{})) : r;
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor scatter(const Tensor& input, std::int64_t dim, const Tensor& index, double value) {
  Tensor x = detail::to_tensor(input);
  Tensor src(ir::constant(value, x.dtype(), index.shape(), x.device()));
  return detail::scatter_into(x, dim, index, src, false, ir::GatherSite::Scatter, "scatter");
}

KILN_ENTRY Tensor scatter_add(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor x = detail::to_tensor(input), s = detail::to_tensor(src);
  detail::autocast_promote({&x, &s});
  return detail::scatter_into(x, dim, index, s, true, ir::GatherSite::ScatterAdd, "scatter_add");
}

KILN_ENTRY Tensor index_add(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& source,
                            double alpha) {
  Tensor s = detail::to_tensor(source);
  if (alpha != 1.0)
    s = Tensor(ir::binary(ir::Op::Mul, s.node(), ir::constant(alpha, s.dtype(), s.shape(), s.device())));
  return detail::index_scatter(input, dim, index, s, true, ir::GatherSite::IndexAdd, "index_add");
}

}  // namespace kiln
