#pragma once
// The definitions of the shape ops (tensor/shape_ops.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/shape_ops.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY std::string ints_str(const std::vector<std::int64_t>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}

KILN_ENTRY std::vector<std::int64_t> distinct_axes(const std::vector<std::int64_t>& dims, const Tensor& t,
                                                   const char* op) {
  std::vector<std::int64_t> out;
  for (auto d : dims) {
    const std::int64_t a = tensor_axis(d, t, op);
    if (std::find(out.begin(), out.end(), a) != out.end())
      throw ShapeError(std::string(op) + ": dim " + std::to_string(a) + " appears more than once in " + ints_str(dims) +
                       " for input " + describe(t));
    out.push_back(a);
  }
  return out;
}

KILN_ENTRY ir::NodePtr triangle_mask(const Shape& shape, std::int64_t k, bool lower, Device device) {
  const std::size_t r = shape.size();
  Shape s{shape[r - 2], shape[r - 1]};
  ir::NodePtr row = ir::iota(s, 0, DType::Int64, device), col = ir::iota(s, 1, DType::Int64, device);
  ir::NodePtr diff = ir::binary(ir::Op::Sub, col, row);
  ir::NodePtr kk = ir::constant_int(k, DType::Int64, s, device);
  ir::NodePtr m = lower ? ir::binary(ir::Op::Le, diff, kk) : ir::binary(ir::Op::Ge, diff, kk);
  Shape padded(r, 1);
  padded[r - 2] = s[0];
  padded[r - 1] = s[1];
  return ir::broadcast(ir::reshape(m, padded), shape);
}

KILN_ENTRY Tensor triangle(const Tensor& t, std::int64_t k, bool lower, const char* op) {
  if (t.dim() < 2) throw ShapeError(std::string(op) + ": expected a tensor of at least 2 dims, got " + describe(t));
  ir::NodePtr zero = ir::constant(0.0, t.dtype(), t.shape(), t.device());
  return Tensor(ir::where(triangle_mask(t.shape(), k, lower, t.device()), t.node(), zero));
}

KILN_ENTRY void check_fill_value(double value, const Tensor& t, const char* op) {
  const DType dt = t.dtype();
  double lo = 0, hi = 0;
  switch (dt) {
    case DType::Int32: lo = -2147483648.0, hi = 2147483647.0; break;
    case DType::Int64: lo = -9223372036854775808.0, hi = 9223372036854775807.0; break;
    case DType::Float16:
    case DType::BFloat16: lo = -largest_finite(dt), hi = largest_finite(dt); break;
    default: return;
  }
  const bool integer = dt == DType::Int32 || dt == DType::Int64;
  // A float value beyond the largest finite one still rounds to it within half an ulp; PyTorch
  // compares in double, as here (its check allows the rounding of finite values, not inf).
  if ((integer && !std::isfinite(value)) || (std::isfinite(value) && (value < lo || value > hi)))
    throw ValueError(std::string(op) + ": value " + std::to_string(value) + " cannot be converted to " +
                     dtype_name(dt) + " without overflow (input " + describe(t) + ")");
}

KILN_ENTRY Tensor masked_fill_with(const Tensor& t, const Tensor& mask, const ir::NodePtr& value) {
  Tensor m = to_tensor(mask);
  check_same_device(t.device(), m.device(), "masked_fill");
  if (m.dtype() != DType::Bool)
    throw DTypeError("masked_fill: expected a bool mask, got " + describe(m) + " for input " + describe(t));
  return Tensor(ir::where(broadcast_to(m, t.shape()).node(), value, t.node()));
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor stack(const std::vector<Tensor>& xs, std::int64_t axis) {
  if (xs.empty()) throw ShapeError("stack: expected a non-empty list of tensors");
  const Tensor& first = detail::to_tensor(xs[0]);
  const std::int64_t r = first.dim() + 1;
  if (axis < -r || axis >= r)
    throw ShapeError("stack: dim " + std::to_string(axis) + " is out of range for inputs " + detail::describe(first) +
                     " (expected [" + std::to_string(-r) + ", " + std::to_string(r - 1) + "])");
  for (const Tensor& x : xs)
    if (x.shape() != first.shape())
      throw ShapeError("stack: expects each tensor to be equal size, got " + detail::describe(first) + " and " +
                       detail::describe(x));
  std::vector<Tensor> parts;
  parts.reserve(xs.size());
  for (const Tensor& x : xs) parts.push_back(unsqueeze(x, axis));
  return concat(parts, axis);
}

KILN_ENTRY Tensor one_hot(const Tensor& index, std::int64_t num_classes) {
  Tensor t = detail::to_tensor(index);
  if (t.dtype() != DType::Int64 && t.dtype() != DType::Int32)
    throw DTypeError("one_hot: expected an int64 (or int32) index tensor, got " + detail::describe(t));
  if (num_classes < -1)
    throw ValueError("one_hot: num_classes must be -1 or positive, got " + std::to_string(num_classes));
  const bool on_host = t.is_evaluated() && t.device().is_cpu() && !detail::deferring_eval();
  if (num_classes == -1 || on_host) {
    std::vector<std::int64_t> v = t.to(DType::Int64).to_vector<std::int64_t>();
    if (num_classes == -1) {
      if (v.empty())
        throw ValueError("one_hot: can not infer the number of classes of an empty index " + detail::describe(t));
      num_classes = *std::max_element(v.begin(), v.end()) + 1;
    }
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || v[i] >= num_classes)
        throw IndexError("one_hot: class value " + std::to_string(v[i]) + " at flat index " + std::to_string(i) +
                         " is outside [0, " + std::to_string(num_classes) + ") (index " + detail::describe(t) + ")");
  }
  Shape s = t.shape();
  s.push_back(num_classes);
  checked_numel(s, "one_hot");
  Shape col = t.shape();
  col.push_back(1);
  ir::NodePtr idx = ir::broadcast(ir::reshape(ir::cast(t.node(), DType::Int64), col), s);
  ir::NodePtr classes = ir::iota(s, static_cast<std::int64_t>(s.size()) - 1, DType::Int64, t.device());
  return Tensor(ir::cast(ir::binary(ir::Op::Eq, idx, classes), DType::Int64));
}

}  // namespace kiln
