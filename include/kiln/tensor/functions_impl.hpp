#pragma once
// The definitions of the tensor functions (tensor/functions.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/functions.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY std::int64_t tensor_axis(std::int64_t axis, const Tensor& t, const char* op) {
  std::int64_t rank = t.dim(), r = rank == 0 ? 1 : rank;
  if (axis < -r || axis >= r)
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for " + describe(t) +
                     " (rank " + std::to_string(rank) + ")");
  return axis < 0 ? axis + r : axis;
}

KILN_ENTRY std::vector<std::int64_t> reduce_axes(const Axes& axes, const Tensor& t, const char* op) {
  const Shape& shape = t.shape();
  std::int64_t rank = static_cast<std::int64_t>(shape.size());
  std::vector<std::int64_t> out;
  if (axes.axes.empty()) {
    for (std::int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (auto a : axes.axes) {
    std::int64_t n = tensor_axis(a, t, op);
    if (rank == 0) continue;  // axis 0/-1 of a 0-dim tensor: nothing to reduce
    if (std::find(out.begin(), out.end(), n) != out.end())
      throw ShapeError(std::string(op) + ": axis " + std::to_string(a) + " appears twice for " + describe(t));
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

KILN_ENTRY Shape reduced_shape(const Shape& shape, const std::vector<std::int64_t>& axes, bool keepdim) {
  Shape out;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    bool reduced = std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(i)) != axes.end();
    if (!reduced)
      out.push_back(shape[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

KILN_ENTRY Tensor finish_reduce(const ir::NodePtr& kept, const Shape& in_shape, const std::vector<std::int64_t>& axes,
                                bool keepdim) {
  return Tensor(ir::reshape(kept, reduced_shape(in_shape, axes, keepdim)));
}

KILN_ENTRY void require_float(const Tensor& t, const char* op) {
  if (!is_floating(t.dtype()))
    throw DTypeError(std::string(op) + ": expected a floating point tensor, got " + describe(t) +
                     " (convert with .to(kiln::f32))");
}

KILN_ENTRY void require_nonempty_reduction(const Tensor& t, const std::vector<std::int64_t>& axes, const char* op) {
  for (auto a : axes)
    if (t.shape()[a] == 0)
      throw ShapeError(std::string(op) + ": cannot reduce over a dimension of size 0 (input " + describe(t) +
                       ", axis " + std::to_string(a) + ")");
  if (t.numel() == 0 && axes.size() == t.shape().size() && !t.shape().empty())
    throw ShapeError(std::string(op) + ": cannot reduce an empty tensor " + describe(t));
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis) {
  if (xs.empty()) throw ShapeError("concat: expected a non-empty list of tensors");
  const Tensor& first = detail::to_tensor(xs[0]);
  if (first.dim() == 0)
    throw ShapeError("concat: zero-dimensional tensors cannot be concatenated, got " + detail::describe(first));
  std::int64_t a = detail::tensor_axis(axis, first, "concat");
  DType dt = first.dtype();
  std::int64_t joined = 0;
  for (auto& x : xs) {
    detail::to_tensor(x);
    detail::check_same_device(first.device(), x.device(), "concat");
    bool ok = x.dim() == first.dim();
    for (std::int64_t d = 0; ok && d < first.dim(); ++d) ok = d == a || x.shape()[d] == first.shape()[d];
    if (!ok)
      throw ShapeError("concat: inputs " + detail::describe(first) + " and " + detail::describe(x) +
                       " differ outside axis " + std::to_string(a));
    dt = promote_types(dt, x.dtype());
    if (__builtin_add_overflow(joined, x.shape()[a], &joined))
      throw ShapeError("concat: the joined size along axis " + std::to_string(a) + " overflows int64 (inputs like " +
                       detail::describe(x) + ")");
  }
  // Parts empty along the axis add nothing and are left out, unless gradients are recorded
  // through them: then they stay, so that their (empty) gradient reaches them, as torch's.
  std::vector<ir::NodePtr> nodes;
  for (auto& x : xs)
    if (x.shape()[a] > 0 || xs.size() == 1 || ir::records_grad(x.node())) nodes.push_back(ir::cast(x.node(), dt));
  if (nodes.empty()) nodes.push_back(ir::cast(first.node(), dt));
  return Tensor(ir::concat(nodes, a));
}

}  // namespace kiln

namespace kiln {
namespace detail {

KILN_ENTRY ir::NodePtr norm_param(const Tensor& p, const Tensor& x, const char* op, const char* what) {
  if (!p.defined()) return nullptr;
  check_same_device(x.device(), p.device(), op);
  if (p.dim() != 1 || p.shape()[0] != x.shape().back())
    throw ShapeError(std::string(op) + ": " + what + " must have shape [" + std::to_string(x.shape().back()) +
                     "] to match input " + describe(x) + ", got " + describe(p));
  if (!is_floating(p.dtype()))
    throw DTypeError(std::string(op) + ": " + what + " must be floating point, got " + describe(p));
  return p.node();
}

KILN_ENTRY void check_class_operands(const Tensor& scores, const Tensor& targets, std::int64_t ignore_index,
                                     const char* op) {
  require_float(scores, op);
  check_same_device(scores.device(), targets.device(), op);
  if (scores.dim() != 2 || targets.dim() != 1 || targets.shape()[0] != scores.shape()[0])
    throw ShapeError(std::string(op) + ": expected scores [N, C] and targets [N], got " + describe(scores) + " and " +
                     describe(targets));
  if (targets.dtype() != DType::Int64 && targets.dtype() != DType::Int32)
    throw DTypeError(std::string(op) + ": targets must be int64 class indices, got " + describe(targets));
  // Targets already in host memory are checked here, as PyTorch's CPU kernel does. Lazy or
  // device targets are not read here (that would be a synchronisation, and a graph break inside
  // kiln::compile): the kernel that reads a target checks it, and an out-of-range one is an
  // IndexError when the result is evaluated (on a GPU: when it is read back).
  if (targets.is_evaluated() && targets.device().is_cpu() && !deferring_eval())
    check_class_targets(targets, scores.shape()[1], ignore_index, op);
}

KILN_ENTRY Tensor cross_entropy_checked(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index,
                                        decomp::Reduction reduction, double label_smoothing) {
  const Tensor& l = logits;
  Tensor t = to_tensor(targets);
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
    throw ValueError("cross_entropy: label_smoothing must be between 0.0 and 1.0, got " +
                     std::to_string(label_smoothing) + " (logits " + describe(l) + ")");
  check_class_operands(l, t, ignore_index, "cross_entropy");
  if (l.shape()[1] == 0 && l.shape()[0] > 0)
    throw IndexError("cross_entropy: no classes to pick a target from (logits " + describe(l) + ")");
  return Tensor(
      decomp::cross_entropy(l.node(), ir::cast(t.node(), DType::Int64), ignore_index, reduction, label_smoothing));
}

KILN_ENTRY void check_class_targets(const Tensor& t, std::int64_t classes, std::int64_t ignore_index, const char* op) {
  const ir::BufferView& b = *t.node()->buffer;
  const std::int64_t n = t.numel(), stride = b.strides.empty() ? 1 : b.strides[0];
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t at = b.offset + i * stride;
    const std::int64_t v = t.dtype() == DType::Int64 ? static_cast<const std::int64_t*>(b.data())[at]
                                                     : static_cast<const std::int32_t*>(b.data())[at];
    if (v != ignore_index && (v < 0 || v >= classes))
      throw IndexError(std::string(op) + ": target " + std::to_string(v) + " at index " + std::to_string(i) +
                       " is out of bounds for " + std::to_string(classes) + " classes (targets " + describe(t) +
                       ", ignore_index " + std::to_string(ignore_index) + ")");
  }
}

}  // namespace detail
}  // namespace kiln
