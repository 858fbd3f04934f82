#pragma once
// The definitions of the shape ops (tensor/shape_ops.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/shape_ops.hpp"
// vander's powers (cumprod).
#include "kiln/tensor/scans.hpp"

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

namespace kiln {
namespace detail {

/// concat along `axis` with the shape and device checks made here, so that errors name `op`
/// (the parts are the inputs as the op reshaped them, of one rank).
KILN_ENTRY Tensor join_along(const std::vector<Tensor>& parts, std::int64_t axis, const char* op) {
  const Tensor& first = parts[0];
  for (const Tensor& t : parts) {
    check_same_device(first.device(), t.device(), op);
    bool ok = t.dim() == first.dim();
    for (std::int64_t d = 0; ok && d < t.dim(); ++d)
      ok = d == axis || t.shape()[static_cast<std::size_t>(d)] == first.shape()[static_cast<std::size_t>(d)];
    if (!ok)
      throw ShapeError(std::string(op) + ": the tensors (as " + describe(first) + " and " + describe(t) +
                       ") must match in every dim but " + std::to_string(axis));
  }
  return concat(parts, axis);
}

}  // namespace detail

KILN_ENTRY Tensor block_diag(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return zeros(Shape{1, 0}, DType::Float32, Device::cpu());
  const Tensor& first = detail::to_tensor(tensors[0]);
  detail::ResultType rt;
  std::int64_t rows = 0, cols = 0;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = detail::to_tensor(tensors[k]);
    detail::check_same_device(first.device(), t.device(), "block_diag");
    if (t.dim() > 2)
      throw ShapeError("block_diag: input tensors must have 2 or fewer dimensions, input " + std::to_string(k) +
                       " is " + detail::describe(t));
    rt.add(detail::info_of(t));
    rows += t.dim() == 2 ? t.shape()[0] : 1;
    cols += t.dim() == 0 ? 1 : t.shape().back();
  }
  checked_numel(Shape{rows, cols}, "block_diag");
  const DType dt = rt.result();
  // Each block padded with zeros to the full width at its column offset: the rows, stacked.
  std::vector<Tensor> parts;
  std::int64_t at = 0;
  for (const Tensor& t : tensors) {
    const Tensor m = t.dim() == 2 ? t : reshape(t, Shape{1, t.numel()});
    const std::int64_t w = m.shape()[1];
    parts.push_back(pad(m.dtype() == dt ? m : m.to(dt), {at, cols - at - w}, 0.0));
    at += w;
  }
  return concat(parts, 0);
}

KILN_ENTRY Tensor diag_embed(const Tensor& input, std::int64_t offset, std::int64_t dim1, std::int64_t dim2) {
  const Tensor t = detail::to_tensor(input);
  if (t.dim() == 0)
    throw ShapeError("diag_embed: expected an input of at least 1 dim (its last dim is the diagonal), got " +
                     detail::describe(t));
  const std::int64_t r = t.dim() + 1;
  auto wrap = [&](std::int64_t d) {
    if (d < -r || d >= r)
      throw ShapeError("diag_embed: dim " + std::to_string(d) + " is out of range [" + std::to_string(-r) + ", " +
                       std::to_string(r - 1) + "] for the result of " + detail::describe(t));
    return d < 0 ? d + r : d;
  };
  const std::int64_t d1 = wrap(dim1), d2 = wrap(dim2);
  if (d1 == d2)
    throw ShapeError("diag_embed: diagonal dimensions cannot be identical, got " + std::to_string(dim1) + " and " +
                     std::to_string(dim2) + " for " + detail::describe(t));
  const std::int64_t shift = offset < 0 ? -offset : offset, n = t.shape().back();
  std::int64_t m = 0;
  if (__builtin_add_overflow(n, shift, &m))
    throw ShapeError("diag_embed: offset " + std::to_string(offset) + " is too large for " + detail::describe(t));
  // [..., i, j] over the two new dims last: x[..., i] (offset >= 0) or x[..., j] where
  // j - i == offset, else 0; x padded to m so that both read it in range.
  Shape grid(std::vector<std::int64_t>(t.shape().begin(), t.shape().end() - 1));
  const std::size_t lead = grid.size();
  grid.push_back(m);
  grid.push_back(m);
  checked_numel(grid, "diag_embed");
  const Tensor padded = shift ? pad(t, {0, shift}, 0.0) : t;
  const Tensor along = broadcast_to(offset >= 0 ? unsqueeze(padded, -1) : unsqueeze(padded, -2), grid);
  const Shape square{m, m};
  const Tensor rows(ir::iota(square, 0, DType::Int64, t.device())), cols(ir::iota(square, 1, DType::Int64, t.device()));
  const Tensor on = broadcast_to(Tensor(Tensor(cols - rows) == offset), grid);
  const Tensor y(ir::where(on.node(), along.node(), ir::constant(0.0, t.dtype(), grid, t.device())));
  // The two new dims (last in y) move to d1 and d2, the others keep their order.
  std::vector<std::int64_t> perm;
  std::int64_t next = 0;
  for (std::int64_t k = 0; k < r; ++k)
    perm.push_back(k == d1 ? static_cast<std::int64_t>(lead) : k == d2 ? static_cast<std::int64_t>(lead) + 1 : next++);
  return permute(y, perm);
}

KILN_ENTRY Tensor diagflat(const Tensor& input, std::int64_t offset) {
  const Tensor t = detail::to_tensor(input);
  return diag_embed(reshape(t, Shape{t.numel()}), offset, 0, 1);
}

KILN_ENTRY Tensor dstack(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) throw ValueError("dstack: expects a non-empty list of tensors");
  std::vector<Tensor> parts;
  for (const Tensor& x : tensors) {
    const Tensor t = detail::to_tensor(x);
    // torch.atleast_3d's shapes.
    if (t.dim() == 0)
      parts.push_back(reshape(t, Shape{1, 1, 1}));
    else if (t.dim() == 1)
      parts.push_back(reshape(t, Shape{1, t.shape()[0], 1}));
    else if (t.dim() == 2)
      parts.push_back(reshape(t, Shape{t.shape()[0], t.shape()[1], 1}));
    else
      parts.push_back(t);
  }
  return detail::join_along(parts, 2, "dstack");
}

KILN_ENTRY Tensor column_stack(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) throw ValueError("column_stack: expects a non-empty list of tensors");
  std::vector<Tensor> parts;
  for (const Tensor& x : tensors) {
    const Tensor t = detail::to_tensor(x);
    parts.push_back(t.dim() <= 1 ? reshape(t, Shape{t.numel(), 1}) : t);
  }
  return detail::join_along(parts, 1, "column_stack");
}

KILN_ENTRY Tensor cartesian_prod(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) throw ValueError("cartesian_prod: expects a non-empty list of tensors");
  const Tensor& first = detail::to_tensor(tensors[0]);
  Shape grid;
  for (const Tensor& x : tensors) {
    const Tensor& t = detail::to_tensor(x);
    if (t.dim() != 1) throw ShapeError("cartesian_prod: expects 1-D tensors, got " + detail::describe(t));
    if (t.dtype() != first.dtype())
      throw DTypeError("cartesian_prod: expects tensors of one dtype, got " + detail::describe(first) + " and " +
                       detail::describe(t));
    detail::check_same_device(first.device(), t.device(), "cartesian_prod");
    grid.push_back(t.shape()[0]);
  }
  if (tensors.size() == 1) return first;
  const std::int64_t count = checked_numel(grid, "cartesian_prod");
  // Column k: tensor k along grid dim k, broadcast over the others and flattened row-major, so
  // the last tensor varies fastest (itertools.product's order).
  std::vector<Tensor> columns;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    Shape along(grid.size(), 1);
    along[k] = grid[k];
    columns.push_back(reshape(broadcast_to(reshape(tensors[k], along), grid), Shape{count, 1}));
  }
  return concat(columns, 1);
}

KILN_ENTRY Tensor vander(const Tensor& x_in, std::optional<std::int64_t> N, bool increasing) {
  const Tensor x = detail::to_tensor(x_in);
  if (x.dim() != 1) throw ShapeError("vander: x must be a one-dimensional tensor, got " + detail::describe(x));
  const std::int64_t n = N.value_or(x.shape()[0]);
  if (n < 0)
    throw ValueError("vander: N must be non-negative, got " + std::to_string(n) + " for x " + detail::describe(x));
  const std::int64_t len = x.shape()[0];
  checked_numel(Shape{len, n}, "vander");
  // torch's result dtype: integers and bool widen to int64, as its cumprod does.
  const DType dt = promote_types(x.dtype(), DType::Int64);
  const Tensor xs = x.dtype() == dt ? x : x.to(dt);
  Tensor r = full(Shape{len, std::min<std::int64_t>(n, 1)}, 1.0, dt, x.device());
  if (n > 1) {
    // x^1 .. x^(n-1) as running products of x (torch's; the gradient is cumprod's).
    const Tensor powers = cumprod(broadcast_to(unsqueeze(xs, 1), Shape{len, n - 1}), 1);
    r = concat({r, powers.dtype() == dt ? powers : powers.to(dt)}, 1);
  }
  return increasing ? r : flip(r, {1});
}

}  // namespace kiln
