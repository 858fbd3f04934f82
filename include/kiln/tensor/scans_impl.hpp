#pragma once
// The definitions of the scans (tensor/scans.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/scans.hpp"
// diff's copy (detail::identity_node) and trapezoid's zeros.
#include "kiln/tensor/creation.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY std::pair<ir::NodePtr, std::int64_t> scan_operand(const Tensor& x, std::int64_t dim, const char* op) {
  const std::int64_t axis = tensor_axis(dim, x, op);
  ir::NodePtr n = x.dim() == 0 ? ir::reshape(x.node(), Shape{1}) : x.node();
  return {n, axis};
}

KILN_ENTRY Tensor accumulate_scan(const Tensor& input, std::int64_t dim, std::optional<DType> dtype, ir::ScanKind kind,
                                  const char* op) {
  // Autocast (float32 for f16/bf16 inputs) only when no dtype is asked for, as torch.
  Tensor x = dtype ? to_tensor(input).to(*dtype) : fp32_operand(input);
  auto [n, axis] = scan_operand(x, dim, op);
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::Int64;
  return scan_result(x, ir::scan(n, axis, kind, out));
}

KILN_ENTRY std::tuple<Tensor, Tensor> select_scan(const Tensor& input, std::int64_t dim, bool max, const char* op) {
  Tensor x = to_tensor(input);
  auto [n, axis] = scan_operand(x, dim, op);
  ir::NodePtr values = ir::scan(n, axis, max ? ir::ScanKind::Max : ir::ScanKind::Min, x.dtype());
  ir::NodePtr indices = ir::scan(n, axis, max ? ir::ScanKind::ArgMax : ir::ScanKind::ArgMin, DType::Int64);
  return {scan_result(x, values), scan_result(x, indices)};
}

}  // namespace detail

KILN_ENTRY Tensor logcumsumexp(const Tensor& input, std::int64_t dim) {
  Tensor x = detail::to_tensor(input);
  if (!is_floating(x.dtype())) throw DTypeError("logcumsumexp: expected a floating input, got " + detail::describe(x));
  auto [n, axis] = detail::scan_operand(x, dim, "logcumsumexp");
  return detail::scan_result(x, ir::scan(n, axis, ir::ScanKind::LogSumExp, x.dtype()));
}

}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor diff(const Tensor& input, std::int64_t n, std::int64_t dim, const Tensor& prepend,
                       const Tensor& append) {
  const Tensor x = detail::to_tensor(input);
  if (x.dim() == 0) throw ShapeError("diff: expects input to be at least one-dimensional, got " + detail::describe(x));
  if (n < 0)
    throw ValueError("diff: order must be non-negative but got n=" + std::to_string(n) + " for input " +
                     detail::describe(x));
  const std::int64_t axis = detail::tensor_axis(dim, x, "diff");
  auto check_side = [&](const Tensor& other, const char* what) {
    if (!other.defined()) return;
    detail::check_same_device(x.device(), other.device(), "diff");
    bool ok = other.dim() == x.dim();
    for (std::int64_t k = 0; ok && k < x.dim(); ++k)
      ok = k == axis || other.shape()[static_cast<std::size_t>(k)] == x.shape()[static_cast<std::size_t>(k)];
    if (!ok)
      throw ShapeError(std::string("diff: expects ") + what + " to match the input's shape except along dim " +
                       std::to_string(axis) + ", got " + what + " " + detail::describe(other) + " for input " +
                       detail::describe(x));
  };
  check_side(prepend, "prepend");
  check_side(append, "append");
  if (n == 0) return Tensor(detail::identity_node(x.node()));
  Tensor r = x;
  if (prepend.defined() || append.defined()) {
    std::vector<Tensor> parts;
    if (prepend.defined()) parts.push_back(prepend);
    parts.push_back(x);
    if (append.defined()) parts.push_back(append);
    r = concat(parts, axis);
  }
  // Checked on the joined tensor, as torch's: a bool input with an integer prepend subtracts.
  const bool logical = r.dtype() == DType::Bool;
  std::int64_t len = r.shape()[static_cast<std::size_t>(axis)];
  const std::int64_t steps = std::min(n, len);
  for (std::int64_t i = 0; i < steps; ++i, --len) {
    const Tensor hi = narrow(r, axis, 1, len - 1), lo = narrow(r, axis, 0, len - 1);
    r = logical ? Tensor(logical_xor(hi, lo)) : Tensor(hi - lo);
  }
  return r;
}

namespace detail {

/// y's dim for the trapezoid rules, checked (a 0-dim y has no samples along any dim).
KILN_ENTRY std::int64_t trapezoid_axis(const Tensor& y, std::int64_t dim, const char* op) {
  if (y.dim() == 0) throw ShapeError(std::string(op) + ": expects y of at least one dim, got " + describe(y));
  return tensor_axis(dim, y, op);
}

/// x[1:] - x[:-1] along `axis` for the trapezoid rules, x viewed as torch's: a 1-D x along
/// y's axis (one point per sample), a lower-rank one with leading size-1 dims; the differences
/// must broadcast with y's (ShapeError naming `op` before anything is built).
KILN_ENTRY Tensor trapezoid_spacing(const Tensor& y, const Tensor& x, std::int64_t axis, const char* op) {
  if (y.dtype() == DType::Bool || x.dtype() == DType::Bool)
    throw DTypeError(std::string(op) + ": bool is not supported, got y " + describe(y) + " and x " + describe(x));
  check_same_device(y.device(), x.device(), op);
  const std::size_t a = static_cast<std::size_t>(axis);
  Shape view = x.shape();
  if (x.dim() == 1) {
    if (x.shape()[0] != y.shape()[a])
      throw ShapeError(std::string(op) + ": there must be one x value for each sample point, got x " + describe(x) +
                       " for y " + describe(y) + " along dim " + std::to_string(axis));
    view = Shape(std::vector<std::int64_t>(static_cast<std::size_t>(y.dim()), 1));
    view[a] = x.shape()[0];
  } else if (x.dim() < y.dim()) {
    view.insert(view.begin(), static_cast<std::size_t>(y.dim() - x.dim()), 1);
  }
  Shape dx = view, dy = y.shape();
  dx[a] = std::max<std::int64_t>(view[a] - 1, 0);
  dy[a] = std::max<std::int64_t>(y.shape()[a] - 1, 0);
  try {
    broadcast_shapes(dy, dx, op);
  } catch (const ShapeError&) {
    throw ShapeError(std::string(op) + ": the differences of x " + describe(x) + " and of y " + describe(y) +
                     " along dim " + std::to_string(axis) + " cannot be broadcast (" + dx.str() + " and " + dy.str() +
                     ")");
  }
  // x has at least y's rank here, so `axis` is one of its dims.
  const Tensor xv = reshape(x, view);
  return Tensor(slice(xv, axis, 1, view[a]) - slice(xv, axis, 0, -1));
}

}  // namespace detail

KILN_ENTRY Tensor trapezoid(const Tensor& y_in, double dx, std::int64_t dim) {
  const Tensor y = detail::to_tensor(y_in);
  const std::int64_t axis = detail::trapezoid_axis(y, dim, "trapezoid");
  if (y.shape()[static_cast<std::size_t>(axis)] == 0) {
    // No samples integrate to 0, as NumPy's.
    Shape s = y.shape();
    s.erase(s.begin() + axis);
    return zeros(s, y.dtype(), y.device());
  }
  if (y.dtype() == DType::Bool) throw DTypeError("trapezoid: bool is not supported, got y " + detail::describe(y));
  // A constant spacing needs no per-interval products: dx (sum(y) - (first + last) / 2).
  return Tensor((sum(y, {axis}) - (select(y, axis, 0) + select(y, axis, -1)) * 0.5) * dx);
}

KILN_ENTRY Tensor trapezoid(const Tensor& y_in, const Tensor& x_in, std::int64_t dim) {
  const Tensor y = detail::to_tensor(y_in), x = detail::to_tensor(x_in);
  const std::int64_t axis = detail::trapezoid_axis(y, dim, "trapezoid");
  const std::int64_t len = y.shape()[static_cast<std::size_t>(axis)];
  if (len == 0) {
    Shape s = y.shape();
    s.erase(s.begin() + axis);
    return zeros(s, y.dtype(), y.device());
  }
  const Tensor dx = detail::trapezoid_spacing(y, x, axis, "trapezoid");
  const Tensor sides = slice(y, axis, 0, -1) + slice(y, axis, 1, len);
  return Tensor(sum(Tensor(sides * dx), {axis}) / 2.0);
}

KILN_ENTRY Tensor cumulative_trapezoid(const Tensor& y_in, double dx, std::int64_t dim) {
  const Tensor y = detail::to_tensor(y_in);
  const std::int64_t axis = detail::trapezoid_axis(y, dim, "cumulative_trapezoid");
  if (y.dtype() == DType::Bool)
    throw DTypeError("cumulative_trapezoid: bool is not supported, got y " + detail::describe(y));
  const std::int64_t len = y.shape()[static_cast<std::size_t>(axis)];
  const Tensor sides = slice(y, axis, 0, -1) + slice(y, axis, 1, len);
  return cumsum(Tensor(dx / 2.0 * sides), axis);
}

KILN_ENTRY Tensor cumulative_trapezoid(const Tensor& y_in, const Tensor& x_in, std::int64_t dim) {
  const Tensor y = detail::to_tensor(y_in), x = detail::to_tensor(x_in);
  const std::int64_t axis = detail::trapezoid_axis(y, dim, "cumulative_trapezoid");
  const Tensor dx = detail::trapezoid_spacing(y, x, axis, "cumulative_trapezoid");
  const std::int64_t len = y.shape()[static_cast<std::size_t>(axis)];
  const Tensor sides = slice(y, axis, 0, -1) + slice(y, axis, 1, len);
  return Tensor(cumsum(Tensor(sides * dx), axis) / 2.0);
}

}  // namespace kiln
