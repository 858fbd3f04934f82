#pragma once
// The definitions of tensor/composites.hpp. Header-only mode includes them from that header
// (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/decomp/decompose.hpp"
#include "kiln/tensor/autograd.hpp"
#include "kiln/tensor/composites.hpp"
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/linalg.hpp"
#include "kiln/tensor/scans.hpp"
#include "kiln/tensor/shape_ops.hpp"
#include "kiln/tensor/sorting.hpp"

namespace kiln {
namespace detail {

/// `t` in dtype `dt` (itself when it has it).
KILN_ENTRY Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }

/// `value`, computed from detached operands (or none), made differentiable with zero derivatives
/// into `operands`, which broadcast to its shape (torch's rule for rounded quotients and counts:
/// a backward through them gives zeros, not an error): a select that never takes the operand,
/// whose gradient there is exactly 0.
KILN_ENTRY Tensor zero_derivative(const Tensor& value, std::initializer_list<const Tensor*> operands) {
  Tensor r = value;
  for (const Tensor* t : operands)
    if (t->requires_grad() && is_grad_enabled()) r = where(full(Shape{}, 0.0, DType::Bool, r.device()), *t, r);
  return r;
}

/// A number as the dtype `dt` rounds it (float32's value for float32 and the half types' opmath).
KILN_ENTRY double rounded_to(double v, DType dt) {
  return dt == DType::Float64 || !is_floating(dt) ? v : static_cast<double>(static_cast<float>(v));
}

/// torch.result_type over tensors (each a dim or a 0-dim operand).
KILN_ENTRY DType result_type_of(std::initializer_list<const Tensor*> ts) {
  ResultType rt;
  for (const Tensor* t : ts) rt.add(info_of(*t));
  return rt.result();
}

/// s^(1/p) for a non-negative s and p > 0, whose gradient is 0 where s is 0 (torch's norm and
/// std backward mask it there): the root reads 1 where s is 0 and the result takes 0, so no
/// 0 * inf reaches the backward.
KILN_ENTRY Tensor root_zero_safe(const Tensor& s, double p) {
  const Tensor zero = s == 0;
  const Tensor safe = where(zero, 1.0, s);
  return where(zero, 0.0, p == 2 ? Tensor(sqrt(safe)) : Tensor(pow(safe, 1.0 / p)));
}

/// The row-major positions of the nonzero elements of `flags` (any dtype): the one read (a
/// synchronisation) of the data-dependent selections.
KILN_ENTRY std::vector<std::int64_t> true_positions(const Tensor& flags) {
  const std::vector<std::int64_t> f = Tensor(flags != 0).to(DType::Int64).to_vector<std::int64_t>();
  std::vector<std::int64_t> out;
  for (std::size_t k = 0; k < f.size(); ++k)
    if (f[k]) out.push_back(static_cast<std::int64_t>(k));
  return out;
}

}  // namespace detail

// ---- logical reductions -------------------------------------------------------------------

KILN_ENTRY Tensor all(const Tensor& x, const Axes& axes, bool keepdim) {
  detail::reduce_axes(axes, x, "all");  // the axes' errors name this op
  return sum(Tensor(x == 0), axes, keepdim) == 0;
}

KILN_ENTRY Tensor any(const Tensor& x, const Axes& axes, bool keepdim) {
  detail::reduce_axes(axes, x, "any");
  return sum(Tensor(x != 0), axes, keepdim) > 0;
}

KILN_ENTRY Tensor count_nonzero(const Tensor& x, const Axes& axes) {
  detail::reduce_axes(axes, x, "count_nonzero");
  return sum(Tensor(x != 0), axes, false);
}

KILN_ENTRY std::tuple<Tensor, Tensor> var_mean(const Tensor& x, const Axes& axes, bool keepdim, double correction) {
  return {var(x, axes, keepdim, correction), mean(x, axes, keepdim)};
}

KILN_ENTRY std::tuple<Tensor, Tensor> std_mean(const Tensor& x, const Axes& axes, bool keepdim, double correction) {
  auto [v, m] = var_mean(x, axes, keepdim, correction);
  return {detail::root_zero_safe(v, 2.0), m};
}

namespace detail {
/// The int64 position (keepdim) of the lower median of x along `dim`: the stable sort's
/// position (n - 1) / 2, or the first NaN of a row that has one.
KILN_ENTRY Tensor median_position(const Tensor& x, std::int64_t dim, const char* op) {
  if (x.dtype() == DType::Bool)
    throw DTypeError(std::string(op) + ": not supported for bool tensors, got " + describe(x));
  const std::int64_t d = tensor_axis(dim, x, op);
  if (x.dim() > 0) require_nonempty_reduction(x, {d}, op);
  if (x.dim() == 0) return Tensor(ir::constant_int(0, DType::Int64, Shape{}, x.device()));
  const std::int64_t n = x.shape()[static_cast<std::size_t>(d)];
  const Tensor order = std::get<1>(sort(x, d, false, true));
  const Tensor at = narrow(order, d, (n - 1) / 2, 1);
  if (!is_floating(x.dtype())) return at;
  const Tensor nan = isnan(x);
  const Tensor first_nan = argmax(nan.to(DType::Int32), Axes{d}, true);
  return where(any(nan, Axes{d}, true), first_nan, at);
}
}  // namespace detail

namespace detail {
/// The median of an empty x: NaN, or an integer dtype's lowest value (torch's), tied to x so
/// that a backward through it reaches x (with an empty gradient).
KILN_ENTRY Tensor median_of_empty(const Tensor& x) {
  const Tensor nothing = sum(x);
  return zero_derivative(
      full(Shape{},
           is_floating(x.dtype())      ? std::numeric_limits<double>::quiet_NaN()
           : x.dtype() == DType::Int32 ? static_cast<double>(std::numeric_limits<std::int32_t>::lowest())
                                       : static_cast<double>(std::numeric_limits<std::int64_t>::lowest()),
           x.dtype(), x.device()),
      {&nothing});
}

/// x's element at the flat position `at` as a 0-dim result (median and nanmedian of all of x)
/// with torch's gradient for it: split evenly among the elements equal to the result (among
/// the NaN elements where it is NaN), not given to the one that was picked.
KILN_ENTRY Tensor evenly_selected(const Tensor& x, const Tensor& at) {
  const Tensor flat = reshape(x, Shape{x.numel()});
  const Tensor value = reshape(gather(flat, 0, at), Shape{});
  const ir::NodePtr xn = x.node();
  decomp::with_gradient(value.node(), {xn}, [xn](const ir::NodePtr& r, const ir::NodePtr& g) {
    const Tensor xs(xn), picked(r);
    const Tensor equal = where(isnan(picked), isnan(xs), xs == picked);
    const Tensor share = Tensor(g) / sum(equal.to(g->dtype));
    return std::vector<ir::NodePtr>{Tensor(where(equal, share, 0.0)).node()};
  });
  return value;
}
}  // namespace detail

KILN_ENTRY Tensor median(const Tensor& x) {
  if (x.dtype() == DType::Bool) throw DTypeError("median: not supported for bool tensors, got " + detail::describe(x));
  if (x.numel() == 0) return detail::median_of_empty(x);
  return detail::evenly_selected(x, detail::median_position(reshape(x, Shape{x.numel()}), 0, "median"));
}

namespace detail {
/// x's values at the int64 positions `at` (keepdim, one along `dim`) and the positions, with
/// dim squeezed away unless `keepdim`: the results of median, nanmedian and kthvalue along a dim.
KILN_ENTRY ValuesIndices selected_along(const Tensor& x, std::int64_t dim, const Tensor& at, bool keepdim,
                                        const char* op) {
  if (x.dim() == 0) return {x, at};
  const std::int64_t d = tensor_axis(dim, x, op);
  if (keepdim) return {gather(x, d, at), at};
  return {squeeze(gather(x, d, at), d), squeeze(at, d)};
}
}  // namespace detail

KILN_ENTRY ValuesIndices median(const Tensor& x, std::int64_t dim, bool keepdim) {
  return detail::selected_along(x, dim, detail::median_position(x, dim, "median"), keepdim, "median");
}

KILN_ENTRY Tensor nonzero(const Tensor& x) {
  const Shape shape = x.shape();
  const auto rank = static_cast<std::int64_t>(shape.size());
  const std::vector<std::int64_t> positions = detail::true_positions(x);
  const auto count = static_cast<std::int64_t>(positions.size());
  std::vector<std::int64_t> coords;
  for (std::int64_t f : positions) {
    std::vector<std::int64_t> c(static_cast<std::size_t>(rank));
    auto rest = f;
    for (std::int64_t k = rank; k-- > 0;) {
      c[static_cast<std::size_t>(k)] = rest % shape[static_cast<std::size_t>(k)];
      rest /= shape[static_cast<std::size_t>(k)];
    }
    coords.insert(coords.end(), c.begin(), c.end());
  }
  return from_vector<std::int64_t>(coords, Shape{count, rank}, x.device());
}

KILN_ENTRY Tensor argwhere(const Tensor& x) { return nonzero(x); }

KILN_ENTRY Tensor masked_select(const Tensor& x, const Tensor& mask) {
  if (mask.dtype() != DType::Bool)
    throw DTypeError("masked_select: expected a bool mask, got " + detail::describe(mask) + " (input " +
                     detail::describe(x) + ")");
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_select");
  const std::vector<std::int64_t> positions = detail::true_positions(mask.expand(shape));
  const auto n = static_cast<std::int64_t>(positions.size());
  const Tensor flat = reshape(x.expand(shape), Shape{shape.numel()});
  return index_select(flat, 0, from_vector<std::int64_t>(positions, Shape{n}, x.device()));
}

KILN_ENTRY std::vector<Tensor> where(const Tensor& condition) {
  // A 0-dim condition counts as one element of a 1-D one, as torch's.
  if (condition.dim() == 0) return where(reshape(condition, Shape{1}));
  const Tensor positions = nonzero(condition);
  std::vector<Tensor> out;
  for (std::int64_t d = 0; d < condition.dim(); ++d) out.push_back(select(positions, 1, d));
  return out;
}

namespace detail {
/// unique's and unique_consecutive's common part over `run` (x flattened, sorted or not):
/// values at the starts of its runs of equal elements (NaN never equals), each element's run
/// number, the runs' lengths. `order`, when defined, maps run's positions back to x's.
KILN_ENTRY std::tuple<Tensor, Tensor, Tensor> runs_of(const Tensor& x, const Tensor& run, const Tensor& order) {
  const std::int64_t n = run.numel();
  if (n == 0)
    return {run.to(x.dtype()), zeros(x.shape(), DType::Int64, x.device()), zeros(Shape{0}, DType::Int64, x.device())};
  const Tensor starts = concat(
      {ones(Shape{1}, DType::Bool, x.device()), Tensor(narrow(run, 0, 1, n - 1) != narrow(run, 0, 0, n - 1))}, 0);
  // The read: where each run starts.
  const std::vector<std::int64_t> first = detail::true_positions(starts);
  std::vector<std::int64_t> counts;
  for (std::size_t r = 0; r < first.size(); ++r) counts.push_back((r + 1 < first.size() ? first[r + 1] : n) - first[r]);
  const auto runs = static_cast<std::int64_t>(first.size());
  const Tensor values = index_select(run, 0, from_vector<std::int64_t>(first, Shape{runs}, x.device())).to(x.dtype());
  const Tensor number = cumsum(starts.to(DType::Int64), 0) - std::int64_t{1};
  const Tensor inverse =
      order.defined() ? scatter(zeros(Shape{n}, DType::Int64, x.device()), 0, order, number) : number;
  return {values, reshape(inverse, x.shape()), from_vector<std::int64_t>(counts, Shape{runs}, x.device())};
}
}  // namespace detail

KILN_ENTRY std::tuple<Tensor, Tensor, Tensor> unique(const Tensor& x) {
  // Bools are ordered as integers (false first); sort takes int32 in their place.
  const Tensor keys = reshape(x.dtype() == DType::Bool ? x.to(DType::Int32) : x, Shape{x.numel()});
  auto [sorted, order] = sort(keys, 0, false, true);
  return detail::runs_of(x, sorted, order);
}

KILN_ENTRY std::tuple<Tensor, Tensor, Tensor> unique_consecutive(const Tensor& x) {
  const Tensor keys = reshape(x.dtype() == DType::Bool ? x.to(DType::Int32) : x, Shape{x.numel()});
  return detail::runs_of(x, keys, Tensor{});
}

KILN_ENTRY Tensor diagonal(const Tensor& x, std::int64_t offset, std::int64_t dim1, std::int64_t dim2) {
  if (x.dim() < 2) throw ShapeError("diagonal: expected a tensor of two or more dims, got " + detail::describe(x));
  const std::int64_t d1 = detail::tensor_axis(dim1, x, "diagonal"), d2 = detail::tensor_axis(dim2, x, "diagonal");
  if (d1 == d2)
    throw ShapeError("diagonal: dimensions cannot be identical, got " + std::to_string(dim1) + " and " +
                     std::to_string(dim2) + " for " + detail::describe(x));
  // The two dims moved last and merged; the diagonal's elements picked from the merged dim.
  std::vector<std::int64_t> perm;
  Shape lead;
  for (std::int64_t k = 0; k < x.dim(); ++k)
    if (k != d1 && k != d2) {
      perm.push_back(k);
      lead.push_back(x.shape()[static_cast<std::size_t>(k)]);
    }
  perm.push_back(d1);
  perm.push_back(d2);
  const std::int64_t n = x.shape()[static_cast<std::size_t>(d1)], m = x.shape()[static_cast<std::size_t>(d2)];
  const std::int64_t r0 = std::max<std::int64_t>(0, -offset), c0 = std::max<std::int64_t>(0, offset);
  const std::int64_t len = std::max<std::int64_t>(0, std::min(n - r0, m - c0));
  std::vector<std::int64_t> picks(static_cast<std::size_t>(len));
  for (std::int64_t i = 0; i < len; ++i) picks[static_cast<std::size_t>(i)] = (i + r0) * m + (i + c0);
  Shape merged = lead;
  merged.push_back(n * m);
  const Tensor rows = reshape(permute(x, perm), merged);
  return index_select(rows, static_cast<std::int64_t>(lead.size()),
                      from_vector<std::int64_t>(picks, Shape{len}, x.device()));
}

KILN_ENTRY Tensor diag(const Tensor& x, std::int64_t k) {
  if (x.dim() == 2) return diagonal(x, k, 0, 1);
  if (x.dim() != 1) throw ShapeError("diag: expected a 1-D or 2-D tensor, got " + detail::describe(x));
  const std::int64_t n = x.shape()[0], shift = k < 0 ? -k : k, size = n + shift;
  const Tensor padded = shift ? pad(x, {0, shift}, 0.0) : x;
  const Shape square{size, size};
  const Tensor rows(ir::iota(square, 0, DType::Int64, x.device())), cols(ir::iota(square, 1, DType::Int64, x.device()));
  // Entry (i, i + k) holds x[i]: x along the rows for k >= 0, along the columns below.
  const Tensor along = k >= 0 ? reshape(padded, Shape{size, 1}) : reshape(padded, Shape{1, size});
  return where(Tensor(cols - rows) == k, along.expand(square), Tensor(zeros(square, x.dtype(), x.device())));
}

KILN_ENTRY Tensor trace(const Tensor& x) {
  if (x.dim() != 2) throw ShapeError("trace: expected a matrix, got " + detail::describe(x));
  detail::AutocastSuspend native;  // torch's trace is not on an autocast list (its sum is)
  return sum(diagonal(x));
}

namespace linalg {
KILN_ENTRY Tensor cross(const Tensor& a_in, const Tensor& b_in, std::int64_t dim) {
  const Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), "linalg.cross");
  if (a_in.dim() != b_in.dim())
    throw ShapeError("linalg.cross: inputs must have the same number of dimensions, got " + detail::describe(a_in) +
                     " and " + detail::describe(b_in));
  if (a_in.dtype() != b_in.dtype())
    throw DTypeError("linalg.cross: expected both inputs of one dtype, got " + detail::describe(a_in) + " and " +
                     detail::describe(b_in));
  const DType dt = a_in.dtype();
  if (dt == DType::Bool)
    throw DTypeError("linalg.cross: not supported for bool tensors, got " + detail::describe(a_in) + " and " +
                     detail::describe(b_in));
  const Tensor a = detail::as_dtype(a_in, dt).expand(shape), b = detail::as_dtype(b_in, dt).expand(shape);
  const std::int64_t d = detail::tensor_axis(dim, a, "linalg.cross");
  // Each input's own size at the dim (a dim it lacks, broadcast, counts as 1).
  auto size_at = [&](const Tensor& t) {
    const std::int64_t k = d - (static_cast<std::int64_t>(shape.size()) - t.dim());
    return k < 0 ? std::int64_t{1} : t.shape()[static_cast<std::size_t>(k)];
  };
  if (shape.empty() || size_at(a_in) != 3 || size_at(b_in) != 3)
    throw ShapeError("linalg.cross: inputs dimension " + std::to_string(dim) + " must have length 3, got " +
                     detail::describe(a_in) + " and " + detail::describe(b_in));
  auto at = [&](const Tensor& t, std::int64_t i) { return narrow(t, d, i, 1); };
  return concat({Tensor(at(a, 1) * at(b, 2) - at(a, 2) * at(b, 1)), Tensor(at(a, 2) * at(b, 0) - at(a, 0) * at(b, 2)),
                 Tensor(at(a, 0) * at(b, 1) - at(a, 1) * at(b, 0))},
                d);
}
}  // namespace linalg

KILN_ENTRY Tensor cross(const Tensor& a_in, const Tensor& b_in, std::optional<std::int64_t> dim) {
  // torch.cross is on autocast's promote list (torch.linalg.cross is not).
  Tensor a = a_in, b = b_in;
  detail::autocast_promote({&a, &b});
  if (dim) return linalg::cross(a, b, *dim);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "cross");
  for (std::size_t k = 0; k < shape.size(); ++k)
    if (shape[k] == 3) return linalg::cross(a, b, static_cast<std::int64_t>(k));
  throw ShapeError("cross: no dimension of size 3 in " + detail::describe(a) + " and " + detail::describe(b));
}

KILN_ENTRY Tensor softmin(const Tensor& x, std::int64_t dim) { return softmax(Tensor(-x), dim); }

// ---- norms ------------------------------------------------------------------------------------

namespace linalg {
KILN_ENTRY Tensor vector_norm(const Tensor& input_in, double ord, const Axes& dim, bool keepdim) {
  const char* op = "linalg.vector_norm";
  // On torch's autocast float32 list (linalg_vector_norm): the half types in float32.
  const Tensor input = detail::autocast_cast(input_in, detail::AutocastClass::Fp32);
  detail::require_float(input, op);
  const auto ax = detail::reduce_axes(dim, input, op);
  // max, min and negative powers have no identity over an empty dim
  if (std::isinf(ord) || ord < 0) detail::require_nonempty_reduction(input, ax, op);
  const Tensor x = detail::as_dtype(input, compute_dtype(input.dtype()));
  Tensor r;
  if (std::isinf(ord)) {
    r = ord > 0 ? amax(abs(x), dim, keepdim) : amin(abs(x), dim, keepdim);
  } else if (ord == 0) {
    // The count of nonzero elements, with torch's zero gradient (a backward gives zeros).
    r = sum(detail::zero_derivative(Tensor(x != 0.0).to(x.dtype()), {&x}), dim, keepdim);
  } else if (ord == 1) {
    r = sum(abs(x), dim, keepdim);
  } else {
    // sum |x|^p, then its 1/p-th power, with torch's gradient 0 where the sum is 0. Negative
    // orders keep 0^(1/p) = inf.
    const Tensor s = ord == 2 ? sum(x * x, dim, keepdim) : sum(pow(abs(x), ord), dim, keepdim);
    r = ord < 0 ? Tensor(pow(s, 1.0 / ord)) : detail::root_zero_safe(s, ord);
  }
  return detail::as_dtype(r, input.dtype());
}
}  // namespace linalg

KILN_ENTRY Tensor norm(const Tensor& x, double p, const Axes& dim, bool keepdim) {
  return linalg::vector_norm(x, p, dim, keepdim);
}

// ---- creation ---------------------------------------------------------------------------------

KILN_ENTRY Tensor eye(std::int64_t n, std::int64_t m, DType dtype, Device device) {
  if (n < 0) throw ShapeError("eye: n must be greater or equal to 0, got " + std::to_string(n));
  if (m < 0) throw ShapeError("eye: m must be greater or equal to 0, got " + std::to_string(m));
  const Shape shape{n, m};
  detail::check_creation_shape(shape, "eye", dtype);
  const Tensor rows(ir::iota(shape, 0, DType::Int64, device)), cols(ir::iota(shape, 1, DType::Int64, device));
  return Tensor(rows == cols).to(dtype);
}

KILN_ENTRY Tensor eye(std::int64_t n, DType dtype, Device device) { return eye(n, n, dtype, device); }

KILN_ENTRY Tensor linspace(double start, double end, std::int64_t steps, DType dtype, Device device) {
  if (steps < 0) throw ValueError("linspace: number of steps must be non-negative, got " + std::to_string(steps));
  if (!std::isfinite(start) || !std::isfinite(end))
    throw ValueError("linspace: start and end must be finite, got " + std::to_string(start) + " and " +
                     std::to_string(end));
  detail::check_creation_shape(Shape{steps}, "linspace", dtype);
  // torch's kernel: the step in the dtype (float64 for integers, truncated at the end), the
  // first half counted from start and the second from end.
  const DType ct = is_floating(dtype) ? compute_dtype(dtype) : DType::Float64;
  // The bounds in the dtype first (an integer dtype truncates them, as torch's Scalar::to).
  const double s = is_floating(dtype) ? detail::rounded_to(start, ct) : std::trunc(start);
  const double e = is_floating(dtype) ? detail::rounded_to(end, ct) : std::trunc(end);
  const double step =
      steps > 1 ? detail::rounded_to(detail::rounded_to(e - s, ct) / static_cast<double>(steps - 1), ct) : 0.0;
  if (steps == 1) return full(Shape{1}, s, dtype, device);
  if (!is_floating(dtype)) {
    // Integer values are truncated, so the last rounding decides them: computed here as torch's
    // kernel computes them on x86 (its step * i contracted into a fused multiply-add).
    std::vector<double> v(static_cast<std::size_t>(steps));
    for (std::int64_t k = 0; k < steps; ++k)
      v[static_cast<std::size_t>(k)] = k < steps / 2 ? std::fma(step, static_cast<double>(k), s)
                                                     : std::fma(-step, static_cast<double>(steps - 1 - k), e);
    return from_vector<double>(v, Shape{steps}, device).to(dtype);
  }
  const Tensor i(ir::iota(Shape{steps}, 0, ct, device));
  const Tensor from_start = s + i * step;
  const Tensor from_end = e - (static_cast<double>(steps - 1) - i) * step;
  const Tensor v = where(i < static_cast<double>(steps / 2), from_start, from_end);
  return detail::as_dtype(v, dtype);
}

// ---- shape utilities ---------------------------------------------------------------------------

KILN_ENTRY Tensor movedim(const Tensor& x, const std::vector<std::int64_t>& source,
                          const std::vector<std::int64_t>& destination) {
  const char* op = "movedim";
  if (source.size() != destination.size())
    throw ShapeError("movedim: source and destination must list as many dims, got " + std::to_string(source.size()) +
                     " and " + std::to_string(destination.size()) + " for " + detail::describe(x));
  const auto rank = static_cast<std::size_t>(x.dim());
  std::vector<std::int64_t> perm(rank, -1);
  std::vector<char> used(rank, 0), placed(rank, 0);
  for (std::size_t k = 0; k < source.size(); ++k) {
    const auto s = static_cast<std::size_t>(detail::tensor_axis(source[k], x, op));
    const auto d = static_cast<std::size_t>(detail::tensor_axis(destination[k], x, op));
    if (used[s] || placed[d])
      throw ShapeError("movedim: repeated dim in source or destination, for " + detail::describe(x));
    used[s] = placed[d] = 1;
    perm[d] = static_cast<std::int64_t>(s);
  }
  // The dims not moved fill the remaining positions in their order.
  std::size_t next = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    if (placed[d]) continue;
    while (used[next]) ++next;
    perm[d] = static_cast<std::int64_t>(next++);
  }
  return x.dim() == 0 ? x : permute(x, perm);
}

KILN_ENTRY Tensor movedim(const Tensor& x, std::int64_t source, std::int64_t destination) {
  return movedim(x, std::vector<std::int64_t>{source}, std::vector<std::int64_t>{destination});
}
KILN_ENTRY Tensor moveaxis(const Tensor& x, std::int64_t source, std::int64_t destination) {
  return movedim(x, source, destination);
}
KILN_ENTRY Tensor swapaxes(const Tensor& x, std::int64_t dim0, std::int64_t dim1) { return transpose(x, dim0, dim1); }
KILN_ENTRY Tensor swapdims(const Tensor& x, std::int64_t dim0, std::int64_t dim1) { return transpose(x, dim0, dim1); }

KILN_ENTRY Tensor hstack(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) throw ValueError("hstack: expects a non-empty list of tensors");
  std::vector<Tensor> parts;
  bool all_1d = true;
  for (const Tensor& t : tensors) {
    parts.push_back(t.dim() == 0 ? reshape(t, Shape{1}) : t);
    all_1d = all_1d && parts.back().dim() == 1;
  }
  return concat(parts, all_1d ? 0 : 1);
}

KILN_ENTRY Tensor vstack(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) throw ValueError("vstack: expects a non-empty list of tensors");
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors)
    parts.push_back(t.dim() == 0 ? reshape(t, Shape{1, 1}) : t.dim() == 1 ? reshape(t, Shape{1, t.shape()[0]}) : t);
  return concat(parts, 0);
}

KILN_ENTRY std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, const std::string& indexing) {
  if (indexing != "ij" && indexing != "xy")
    throw ValueError("meshgrid: indexing must be 'ij' or 'xy', got '" + indexing + "'");
  if (tensors.empty()) throw ValueError("meshgrid: expects a non-empty list of tensors");
  const std::size_t n = tensors.size();
  Shape shape;
  for (const Tensor& t : tensors) {
    if (t.dim() > 1) throw ShapeError("meshgrid: expects 0-D or 1-D tensors, got " + detail::describe(t));
    shape.push_back(t.numel());
  }
  // "xy": the first two inputs' dims swap places in every output.
  const bool xy = indexing == "xy" && n >= 2;
  if (xy) std::swap(shape[0], shape[1]);
  std::vector<Tensor> out;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t at = xy && k < 2 ? 1 - k : k;
    Shape along(n, 1);
    along[at] = tensors[k].numel();
    out.push_back(reshape(tensors[k], along).expand(shape));
  }
  return out;
}

namespace detail {
/// The [2, N] coordinates of a triangle of a row x col matrix, row by row: (i, j) with j - i
/// <= offset (lower) or >= offset (upper).
KILN_ENTRY Tensor triangle_indices(std::int64_t row, std::int64_t col, std::int64_t offset, bool lower, DType dtype,
                                   Device device, const char* op) {
  if (row < 0 || col < 0)
    throw ShapeError(std::string(op) + ": row and col must be non-negative, got " + std::to_string(row) + " and " +
                     std::to_string(col));
  if (dtype != DType::Int64 && dtype != DType::Int32)
    throw DTypeError(std::string(op) + ": expected an integer dtype (int64 or int32), got " + dtype_name(dtype));
  std::vector<std::int64_t> rows, cols;
  for (std::int64_t i = 0; i < row; ++i)
    for (std::int64_t j = 0; j < col; ++j)
      if (lower ? j - i <= offset : j - i >= offset) {
        rows.push_back(i);
        cols.push_back(j);
      }
  const auto n = static_cast<std::int64_t>(rows.size());
  rows.insert(rows.end(), cols.begin(), cols.end());
  return from_vector<std::int64_t>(rows, Shape{2, n}, device).to(dtype);
}
}  // namespace detail

KILN_ENTRY Tensor tril_indices(std::int64_t row, std::int64_t col, std::int64_t offset, DType dtype, Device device) {
  return detail::triangle_indices(row, col, offset, true, dtype, device, "tril_indices");
}
KILN_ENTRY Tensor triu_indices(std::int64_t row, std::int64_t col, std::int64_t offset, DType dtype, Device device) {
  return detail::triangle_indices(row, col, offset, false, dtype, device, "triu_indices");
}

KILN_ENTRY Tensor bincount(const Tensor& x, const Tensor& weights, std::int64_t minlength) {
  if (x.dim() != 1) throw ShapeError("bincount: expects a 1-D tensor, got " + detail::describe(x));
  if (x.dtype() != DType::Int64 && x.dtype() != DType::Int32)
    throw DTypeError("bincount: expects an integer tensor, got " + detail::describe(x));
  if (minlength < 0) throw ValueError("bincount: minlength must be non-negative, got " + std::to_string(minlength));
  if (weights.defined() && (weights.dim() != 1 || weights.shape()[0] != x.shape()[0]))
    throw ShapeError("bincount: weights must be 1-D of the input's length, got " + detail::describe(weights) +
                     " for input " + detail::describe(x));
  // An empty input gives int64 zeros whatever the weights, as torch's.
  if (x.numel() == 0) return zeros(Shape{minlength}, DType::Int64, x.device());
  std::int64_t bins = minlength;
  {
    // The one read that decides the output's size: the smallest and the largest value.
    const Tensor x64 = x.to(DType::Int64);
    const std::vector<std::int64_t> range =
        concat({reshape(amin(x64), Shape{1}), reshape(amax(x64), Shape{1})}, 0).to_vector<std::int64_t>();
    if (range[0] < 0) throw ValueError("bincount: expects non-negative values, got " + std::to_string(range[0]));
    bins = std::max(bins, range[1] + 1);
  }
  const DType dt = !weights.defined()                  ? DType::Int64
                   : weights.dtype() == DType::Float32 ? DType::Float32
                                                       : DType::Float64;
  const Tensor src = weights.defined() ? weights.to(dt) : ones(x.shape(), dt, x.device());
  return index_add(zeros(Shape{bins}, dt, x.device()), 0, x.to(DType::Int64), src);
}

// ---- sampling ---------------------------------------------------------------------------------

KILN_ENTRY Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype, Device device) {
  if (high <= low)
    throw ValueError("randint: expected low < high, got low " + std::to_string(low) + " and high " +
                     std::to_string(high));
  if (dtype == DType::Bool && !(low >= 0 && high <= 2))
    throw ValueError("randint: the range [" + std::to_string(low) + ", " + std::to_string(high) +
                     ") does not fit bool");
  detail::check_creation_shape(shape, "randint", dtype);
  // floor(u (high - low)) over u in [0, 1) from a float64 draw: every integer of the range
  // equally likely to within 2^-52 of the range, never high itself.
  const Tensor u = rand(shape, DType::Float64, device);
  const Tensor k = floor(u * static_cast<double>(high - low)) + static_cast<double>(low);
  return k.to(dtype);
}

KILN_ENTRY Tensor randint(std::int64_t high, const Shape& shape, DType dtype, Device device) {
  return randint(0, high, shape, dtype, device);
}

KILN_ENTRY Tensor randperm(std::int64_t n, DType dtype, Device device) {
  if (n < 0) throw ValueError("randperm: n must be non-negative, got " + std::to_string(n));
  detail::check_creation_shape(Shape{n}, "randperm", dtype);
  // The order that sorts n independent uniform keys (ties, of probability about n^2 2^-53,
  // keep the stable sort's order).
  return std::get<1>(sort(rand(Shape{n}, DType::Float64, device), 0, false, true)).to(dtype);
}

KILN_ENTRY Tensor bernoulli(const Tensor& probs) {
  detail::require_float(probs, "bernoulli");
  return Tensor(rand(probs.shape(), probs.dtype(), probs.device()) < probs).to(probs.dtype());
}

KILN_ENTRY Tensor bernoulli(const Tensor& x, double p) {
  detail::require_float(x, "bernoulli");
  if (!(p >= 0.0 && p <= 1.0))
    throw ValueError("bernoulli: p must be in [0, 1], got " + std::to_string(p) + " (input " + detail::describe(x) +
                     ")");
  return Tensor(rand(x.shape(), DType::Float64, x.device()) < p).to(x.dtype());
}

KILN_ENTRY Tensor multinomial(const Tensor& probs, std::int64_t num_samples, bool replacement) {
  const char* op = "multinomial";
  if (probs.dim() != 1 && probs.dim() != 2)
    throw ShapeError("multinomial: expected a 1-D or 2-D tensor of weights, got " + detail::describe(probs));
  detail::require_float(probs, op);
  if (num_samples <= 0)
    throw ValueError("multinomial: num_samples must be positive, got " + std::to_string(num_samples));
  const std::int64_t categories = probs.shape().back();
  if (categories == 0) throw ShapeError("multinomial: no categories in " + detail::describe(probs));
  if (!replacement && num_samples > categories)
    throw ValueError("multinomial: cannot draw " + std::to_string(num_samples) + " samples without replacement from " +
                     std::to_string(categories) + " categories (" + detail::describe(probs) + ")");
  const Tensor p2 = (probs.dim() == 1 ? reshape(probs, Shape{1, categories}) : probs).to(DType::Float64);
  // torch's CPU checks, in one read: every weight finite and non-negative, each row's total and
  // its count of positive weights.
  {
    // Per row: the count of bad weights, the total, the count of positive weights.
    const Tensor bad = sum(Tensor(logical_or(logical_or(p2 < 0.0, isnan(p2)), isinf(p2))), {1}, true);
    const Tensor positive = sum(Tensor(p2 > 0.0), {1}, true);
    const Tensor stats = concat({bad.to(DType::Float64), sum(p2, {1}, true), positive.to(DType::Float64)}, 1);
    const std::vector<double> v = stats.to_vector<double>();
    for (std::size_t r = 0; r < v.size() / 3; ++r)
      if (v[3 * r] != 0)
        throw ValueError("multinomial: the weights must be finite and non-negative (" + detail::describe(probs) + ")");
    for (std::size_t r = 0; r < v.size() / 3; ++r) {
      const double total = v[3 * r + 1];
      const auto positive = static_cast<std::int64_t>(v[3 * r + 2]);
      if (!(total > 0))
        throw ValueError("multinomial: row " + std::to_string(r) + " of the weights sums to 0 (" +
                         detail::describe(probs) + ")");
      if (!replacement && positive < num_samples)
        throw ValueError("multinomial: row " + std::to_string(r) + " has " + std::to_string(positive) +
                         " positive weights, fewer than the " + std::to_string(num_samples) +
                         " samples to draw without replacement");
    }
  }
  const std::int64_t rows = p2.shape()[0];
  Tensor picks;
  if (replacement) {
    // The first category whose cumulative weight reaches v = (1 - u) total, v in (0, total]:
    // the count of cumulative weights below v (a category of weight 0 is never reached).
    const Tensor cdf = cumsum(p2, 1);
    const Tensor total = narrow(cdf, 1, categories - 1, 1);
    const Tensor v = (1.0 - rand(Shape{rows, num_samples}, DType::Float64, probs.device())) * total;
    const Tensor below = reshape(cdf, Shape{rows, 1, categories}) < reshape(v, Shape{rows, num_samples, 1});
    picks = minimum(sum(below, {2}), categories - 1);
  } else {
    // Gumbel-top-k: the num_samples largest of log p - log(-log u), u in (0, 1).
    const Tensor u = 1.0 - rand(Shape{rows, categories}, DType::Float64, probs.device());
    const Tensor keys = log(p2) - log(-log(u));
    picks = std::get<1>(topk(keys, num_samples, 1, true, true));
  }
  return probs.dim() == 1 ? reshape(picks, Shape{num_samples}) : picks;
}

// ---- pointwise --------------------------------------------------------------------------------

namespace detail {
KILN_ENTRY void check_lerp(const Tensor& start, const Tensor& end, const Tensor* weight) {
  // The computing dtype must be floating: start's, or with a tensor weight the three's
  // promotion (integer start and end with a floating 0-dim weight compute in its dtype).
  const DType dt = weight ? result_type_of({&start, &end, weight}) : start.dtype();
  if (!is_floating(dt))
    throw DTypeError("lerp: expected floating point operands, got start " + describe(start) +
                     (weight ? ", weight " + describe(*weight) : std::string(", a number weight")));
  if (end.dtype() != start.dtype())
    throw DTypeError(std::string("lerp: expected dtype ") + dtype_name(start.dtype()) + " for `end` but got dtype " +
                     dtype_name(end.dtype()) + " (start " + describe(start) + ", end " + describe(end) + ")");
  // A 0-dim weight of any dtype is taken as a number (converted), as torch's.
  if (weight && weight->dim() > 0 && weight->dtype() != start.dtype())
    throw DTypeError(std::string("lerp: expected dtype ") + dtype_name(start.dtype()) + " for `weight` but got dtype " +
                     dtype_name(weight->dtype()) + " (start " + describe(start) + ", weight " + describe(*weight) +
                     ")");
}
}  // namespace detail

KILN_ENTRY Tensor lerp(const Tensor& start, const Tensor& end, double weight) {
  detail::check_lerp(start, end, nullptr);
  const DType ct = compute_dtype(start.dtype());
  const Tensor s = detail::as_dtype(start, ct), e = detail::as_dtype(end, ct);
  const double w = detail::rounded_to(weight, ct);
  // torch's two forms: near start from start, near end from end (exact at weight 0 and 1).
  const Tensor r = std::abs(w) < 0.5 ? Tensor(s + w * (e - s)) : Tensor(e - (e - s) * detail::rounded_to(1.0 - w, ct));
  return detail::as_dtype(r, start.dtype());
}

KILN_ENTRY Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight) {
  detail::check_lerp(start, end, &weight);
  // The three promote together (only a 0-dim start and end can be widened by a 0-dim weight).
  const DType dt = detail::result_type_of({&start, &end, &weight});
  const DType ct = compute_dtype(dt);
  const Tensor s = detail::as_dtype(start, ct), e = detail::as_dtype(end, ct), w = detail::as_dtype(weight, ct);
  const Tensor d = e - s;
  const Tensor r = where(abs(w) < 0.5, s + w * d, e - d * (1.0 - w));
  return detail::as_dtype(r, dt);
}

KILN_ENTRY Tensor addcmul(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, double value) {
  const DType dt = detail::result_type_of({&input, &tensor1, &tensor2});
  if (dt == DType::Bool)
    throw DTypeError("addcmul: not supported for bool tensors, got " + detail::describe(input) + ", " +
                     detail::describe(tensor1) + " and " + detail::describe(tensor2));
  const DType ct = compute_dtype(dt);
  const Tensor i = detail::as_dtype(input, ct), a = detail::as_dtype(tensor1, ct), b = detail::as_dtype(tensor2, ct);
  Tensor r;
  if (is_floating(ct))
    r = i + (detail::rounded_to(value, ct) * a) * b;
  else  // the value converted to the integer dtype, as torch's Scalar::to<int64_t> (truncated)
    r = i + (static_cast<std::int64_t>(value) * a) * b;
  return detail::as_dtype(r, dt);
}

KILN_ENTRY Tensor addcdiv(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, double value) {
  if (!is_floating(tensor1.dtype()) && !is_floating(tensor2.dtype()))
    throw DTypeError("addcdiv: integer division with addcdiv is no longer supported (tensor1 " +
                     detail::describe(tensor1) + ", tensor2 " + detail::describe(tensor2) +
                     "); for integers write (input + value * trunc(tensor1 / tensor2)).to(input.dtype())");
  const DType dt = detail::result_type_of({&input, &tensor1, &tensor2});
  const DType ct = compute_dtype(dt);
  const Tensor i = detail::as_dtype(input, ct), a = detail::as_dtype(tensor1, ct), b = detail::as_dtype(tensor2, ct);
  return detail::as_dtype(i + (detail::rounded_to(value, ct) * a) / b, dt);
}

namespace detail {
/// log(e^a + e^b), or with `base2` log2(2^a + 2^b), as torch's kernels compute them: a where a ==
/// b is infinite (a - b is NaN there), else max(a, b) + log1p(e^-|a - b|) (log1p(2^-|a - b|) /
/// ln 2), which neither overflows nor loses the smaller term.
KILN_ENTRY Tensor log_add_exp(const Tensor& a_in, const Tensor& b_in, bool base2, const char* op) {
  const DType dt = result_type_of({&a_in, &b_in});
  if (!is_floating(dt))
    throw DTypeError(std::string(op) + ": expected floating point tensors, got " + describe(a_in) + " and " +
                     describe(b_in));
  const DType ct = compute_dtype(dt);
  const Tensor a = as_dtype(a_in, ct), b = as_dtype(b_in, ct);
  const Tensor gap = -abs(a - b);
  const Tensor body = base2 ? Tensor(maximum(a, b) + log1p(exp2(gap)) * (1.0 / std::numbers::ln2))
                            : Tensor(maximum(a, b) + log1p(exp(gap)));
  return as_dtype(where(logical_and(isinf(a), a == b), a, body), dt);
}
}  // namespace detail

KILN_ENTRY Tensor logaddexp(const Tensor& a, const Tensor& b) { return detail::log_add_exp(a, b, false, "logaddexp"); }

KILN_ENTRY Tensor nan_to_num(const Tensor& x, double nan, std::optional<double> posinf, std::optional<double> neginf) {
  if (!is_floating(x.dtype())) return clone(x);
  const double big = largest_finite(x.dtype());
  const double pos = posinf.value_or(big), neg = neginf.value_or(-big);
  return where(isnan(x), nan, where(x == INFINITY, pos, where(x == -INFINITY, neg, x)));
}

KILN_ENTRY Tensor isfinite(const Tensor& x) {
  if (!is_floating(x.dtype())) return ones(x.shape(), DType::Bool, x.device());
  return abs(x) < INFINITY;  // false for +-inf and NaN: one compare
}

KILN_ENTRY Tensor isposinf(const Tensor& x) {
  if (!is_floating(x.dtype())) return zeros(x.shape(), DType::Bool, x.device());
  return x == INFINITY;
}

KILN_ENTRY Tensor isneginf(const Tensor& x) {
  if (!is_floating(x.dtype())) return zeros(x.shape(), DType::Bool, x.device());
  return x == -INFINITY;
}

KILN_ENTRY Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim) { return concat(tensors, dim); }

KILN_ENTRY Tensor log10(const Tensor& x) {
  // log's relative error and one rounding of the product (the constant is within half an ulp).
  return log(x) * (1.0 / std::log(10.0));
}

KILN_ENTRY Tensor frac(const Tensor& x) {
  if (!is_floating(x.dtype()))
    throw DTypeError("frac: expected a floating tensor (torch has no integer frac), got " + detail::describe(x));
  return x - trunc(x);
}

KILN_ENTRY Tensor fmax(const Tensor& a, const Tensor& b) {
  // torch's rule: a where a >= b or b is NaN (a tie gives a the gradient), else b.
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) return maximum(a, b);
  return where(logical_or(a >= b, isnan(b)), a, b);
}

KILN_ENTRY Tensor fmin(const Tensor& a, const Tensor& b) {
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) return minimum(a, b);
  return where(logical_or(a <= b, isnan(b)), a, b);
}

KILN_ENTRY Tensor nansum(const Tensor& x, const Axes& axes, bool keepdim) {
  if (!is_floating(x.dtype())) return sum(x, axes, keepdim);
  return sum(where(isnan(x), 0.0, x), axes, keepdim);
}

KILN_ENTRY Tensor nanmean(const Tensor& x, const Axes& axes, bool keepdim) {
  if (!is_floating(x.dtype()))
    throw DTypeError("nanmean: expected a floating tensor, got " + detail::describe(x));
  const Tensor count = sum(logical_not(isnan(x)), axes, keepdim);  // int64
  return nansum(x, axes, keepdim) / count;
}

KILN_ENTRY std::tuple<Tensor, Tensor> aminmax(const Tensor& x, const Axes& axes, bool keepdim) {
  return {amin(x, axes, keepdim), amax(x, axes, keepdim)};
}

KILN_ENTRY Tensor tile(const Tensor& x, const std::vector<std::int64_t>& reps) {
  std::vector<std::int64_t> r = reps;
  if (r.size() < static_cast<std::size_t>(x.dim())) r.insert(r.begin(), static_cast<std::size_t>(x.dim()) - r.size(), 1);
  return repeat(x, r);
}

KILN_ENTRY Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  if (a.dtype() != b.dtype())
    throw DTypeError("isclose: expected a and b of one dtype, got " + detail::describe(a) + " and " + detail::describe(b));
  if (!(rtol >= 0) || !(atol >= 0))
    throw ValueError("isclose: rtol and atol must be >= 0, got rtol " + std::to_string(rtol) + ", atol " +
                     std::to_string(atol) + " for " + detail::describe(a));
  // torch's order: equal values (infinities of one sign) are close; then NaN with equal_nan;
  // then |a - b| <= atol + rtol |b| where that is finite: the difference in the operands' dtype
  // (bools as float32), the allowance in floating point (an integer times rtol is float32).
  Tensor close = a == b;
  if (equal_nan && is_floating(a.dtype())) close = logical_or(close, logical_and(isnan(a), isnan(b)));
  if (rtol == 0 && atol == 0) return close;
  const bool as_float = a.dtype() == DType::Bool;
  const Tensor x = as_float ? a.to(DType::Float32) : a, y = as_float ? b.to(DType::Float32) : b;
  const Tensor actual = abs(x - y), allowed = abs(y * rtol) + atol;
  return logical_or(close, logical_and(isfinite(actual), actual <= allowed));
}

KILN_ENTRY bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  const Tensor close = isclose(a, b, rtol, atol, equal_nan);
  return close.numel() == 0 || all(close).item<bool>();
}

KILN_ENTRY bool equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  return a.numel() == 0 || all(a == b).item<bool>();
}

namespace detail {
/// quantile and nanquantile: the sorted slices' values at rank q (n - 1), n counting every
/// element (a slice with NaN takes its last rank, NaN) or, with `skip_nan`, the ones not NaN.
KILN_ENTRY Tensor quantile_of(const Tensor& x, double q, std::optional<std::int64_t> dim, bool keepdim,
                              const std::string& interpolation, bool skip_nan, const char* op) {
  if (x.dtype() != DType::Float32 && x.dtype() != DType::Float64)
    throw DTypeError(std::string(op) + ": expected a float32 or float64 input (as torch), got " + describe(x));
  if (!(q >= 0 && q <= 1))
    throw ValueError(std::string(op) + ": q must be in [0, 1], got " + std::to_string(q) + " for " + describe(x));
  static const char* const modes[] = {"linear", "lower", "higher", "midpoint", "nearest"};
  if (std::find(std::begin(modes), std::end(modes), interpolation) == std::end(modes))
    throw ValueError(std::string(op) + ": interpolation must be linear, lower, higher, midpoint or nearest, got '" +
                     interpolation + "'");
  if (x.numel() == 0) throw ValueError(std::string(op) + ": expected a non-empty input, got " + describe(x));
  // The slices along the last dim of `v` (x flattened without dim, else dim moved last).
  const std::int64_t d = dim ? normalize_axis(*dim, std::max<std::int64_t>(x.dim(), 1), op, x.shape()) : 0;
  const Tensor v = !dim ? reshape(x, Shape{x.numel()}) : x.dim() == 0 ? reshape(x, Shape{1}) : movedim(x, d, -1);
  const Tensor sorted = std::get<0>(sort(v, -1));
  const Tensor q_in_dtype = full(Shape{}, q, x.dtype(), x.device());
  Tensor ranks;
  if (skip_nan) {
    // torch's ranks: q (count - 1) over the values not NaN (sorted first), 0 where all are NaN.
    const Tensor count = sum(logical_not(isnan(sorted)).to(DType::Int64), {-1}, true);
    ranks = q_in_dtype * (count - 1).to(x.dtype());
    ranks = where(ranks < 0.0, 0.0, ranks);
  } else {
    // torch's ranks: q (n - 1) in x's dtype, the last rank where the slice holds a NaN (sorted last).
    const std::int64_t last = sorted.shape().back() - 1;
    ranks = where(any(isnan(sorted), {-1}, true), static_cast<double>(last), q_in_dtype * static_cast<double>(last));
  }
  if (interpolation == "lower") ranks = floor(ranks);
  if (interpolation == "higher") ranks = ceil(ranks);
  if (interpolation == "nearest") ranks = round(ranks);
  const Tensor low = floor(ranks);
  const Tensor below = gather(sorted, -1, low.to(DType::Int64));
  Tensor r = below;
  if (interpolation == "linear" || interpolation == "midpoint") {
    const Tensor above = gather(sorted, -1, ceil(ranks).to(DType::Int64));
    r = interpolation == "linear" ? lerp(below, above, Tensor(ranks - low)) : lerp(below, above, 0.5);
  }
  r = squeeze(r, -1);  // the slice's value
  if (!keepdim) return r;
  if (!dim) return reshape(r, Shape(static_cast<std::size_t>(x.dim()), 1));
  return x.dim() == 0 ? r : unsqueeze(r, d);
}

/// quantile_of for each of `q`, stacked along a new first dim.
KILN_ENTRY Tensor quantiles_of(const Tensor& x, const std::vector<double>& q, std::optional<std::int64_t> dim,
                               bool keepdim, const std::string& interpolation, bool skip_nan, const char* op) {
  std::vector<Tensor> each;
  for (double p : q) each.push_back(quantile_of(x, p, dim, keepdim, interpolation, skip_nan, op));
  if (each.empty()) throw ValueError(std::string(op) + ": expected at least one q, got none for " + describe(x));
  return stack(each, 0);
}
}  // namespace detail

KILN_ENTRY Tensor quantile(const Tensor& x, double q, std::optional<std::int64_t> dim, bool keepdim,
                           const std::string& interpolation) {
  return detail::quantile_of(x, q, dim, keepdim, interpolation, false, "quantile");
}

KILN_ENTRY Tensor quantile(const Tensor& x, const std::vector<double>& q, std::optional<std::int64_t> dim, bool keepdim,
                           const std::string& interpolation) {
  return detail::quantiles_of(x, q, dim, keepdim, interpolation, false, "quantile");
}

KILN_ENTRY Tensor nanquantile(const Tensor& x, double q, std::optional<std::int64_t> dim, bool keepdim,
                              const std::string& interpolation) {
  return detail::quantile_of(x, q, dim, keepdim, interpolation, true, "nanquantile");
}

KILN_ENTRY Tensor nanquantile(const Tensor& x, const std::vector<double>& q, std::optional<std::int64_t> dim,
                              bool keepdim, const std::string& interpolation) {
  return detail::quantiles_of(x, q, dim, keepdim, interpolation, true, "nanquantile");
}

KILN_ENTRY Tensor flipud(const Tensor& x) {
  if (x.dim() < 1) throw ShapeError("flipud: expected a tensor of at least 1 dim, got " + detail::describe(x));
  return flip(x, 0);
}

KILN_ENTRY Tensor fliplr(const Tensor& x) {
  if (x.dim() < 2) throw ShapeError("fliplr: expected a tensor of at least 2 dims, got " + detail::describe(x));
  return flip(x, 1);
}

KILN_ENTRY Tensor rot90(const Tensor& x, std::int64_t k, const std::vector<std::int64_t>& dims) {
  if (dims.size() != 2)
    throw ValueError("rot90: expected two dims, got " + std::to_string(dims.size()) + " for " + detail::describe(x));
  if (x.dim() < 2) throw ShapeError("rot90: expected a tensor of at least 2 dims, got " + detail::describe(x));
  const std::int64_t a = normalize_axis(dims[0], x.dim(), "rot90", x.shape()),
                     b = normalize_axis(dims[1], x.dim(), "rot90", x.shape());
  if (a == b) throw ValueError("rot90: expected two different dims, got " + std::to_string(dims[0]) + " and " +
                               std::to_string(dims[1]) + " for " + detail::describe(x));
  switch (((k % 4) + 4) % 4) {
    case 1:
      return transpose(flip(x, b), a, b);
    case 2:
      return flip(x, std::vector<std::int64_t>{a, b});
    case 3:
      return flip(transpose(x, a, b), b);
    default:
      return clone(x);
  }
}

KILN_ENTRY Tensor deg2rad(const Tensor& x) {
  const Tensor v = is_floating(x.dtype()) ? x : x.to(DType::Float32);
  return v * (std::numbers::pi / 180.0);
}

KILN_ENTRY Tensor rad2deg(const Tensor& x) {
  const Tensor v = is_floating(x.dtype()) ? x : x.to(DType::Float32);
  return v * (180.0 / std::numbers::pi);
}

KILN_ENTRY Tensor xlogy(const Tensor& x_in, const Tensor& y_in) {
  detail::AutocastSuspend native;  // torch's xlogy is not on an autocast list (its log is)
  detail::ResultType rt;
  rt.add(detail::info_of(x_in));
  rt.add(detail::info_of(y_in));
  const DType dt = is_floating(rt.result()) ? rt.result() : DType::Float32;
  const Shape shape = broadcast_shapes(x_in.shape(), y_in.shape(), "xlogy");
  const Tensor x = broadcast_to(x_in.to(dt), shape), y = broadcast_to(y_in.to(dt), shape);
  // Where x is 0 (and y not NaN) the value is 0; the branch not taken reads y = 1 there.
  const Tensor zero = logical_and(x == 0.0, logical_not(isnan(y)));
  const Tensor out = where(zero, 0.0, x * log(where(zero, 1.0, y)));
  // torch 2.11's rule: d/dx = xlogy(g, y), except 0 where x is 0 and y <= 0; d/dy = g x / y
  // (so 0 / 0 = NaN at x = y = 0, as torch's).
  const ir::NodePtr xn = x.node(), yn = y.node();
  decomp::with_gradient(out.node(), {xn, yn}, [xn, yn](const ir::NodePtr&, const ir::NodePtr& g_node) {
    const Tensor xs(xn), ys(yn), g(g_node);
    const Tensor g_log_y = where(logical_and(g == 0.0, logical_not(isnan(ys))), 0.0, g * log(ys));
    const Tensor dx = where(logical_and(xs == 0.0, ys <= 0.0), 0.0, g_log_y);
    return std::vector<ir::NodePtr>{dx.node(), Tensor(g * xs / ys).node()};
  });
  return out;
}

KILN_ENTRY Tensor heaviside(const Tensor& x, const Tensor& values) {
  if (x.dtype() != values.dtype())
    throw DTypeError("heaviside: expected input and values of one dtype, got " + detail::describe(x) + " and " +
                     detail::describe(values));
  return where(x == 0.0, values.detach(), Tensor(x > 0.0).to(x.dtype())).detach();
}

KILN_ENTRY Tensor repeat_interleave(const Tensor& x, std::int64_t repeats, std::optional<std::int64_t> dim) {
  if (repeats < 0)
    throw ValueError("repeat_interleave: repeats must be >= 0, got " + std::to_string(repeats) + " for " +
                     detail::describe(x));
  const Tensor v = dim ? x : reshape(x, Shape{x.numel()});
  const std::int64_t d = dim ? normalize_axis(*dim, std::max<std::int64_t>(v.dim(), 1), "repeat_interleave", v.shape()) : 0;
  if (v.dim() == 0) return repeat_interleave(reshape(v, Shape{1}), repeats, 0);
  Shape wide = v.shape();
  wide.insert(wide.begin() + d + 1, repeats);
  Shape out = v.shape();
  out[static_cast<std::size_t>(d)] *= repeats;
  return reshape(broadcast_to(unsqueeze(v, d + 1), wide), out);
}

KILN_ENTRY Tensor logit(const Tensor& input, std::optional<double> eps) {
  // Integers and bools compute in float32 (torch's unary float rule).
  const DType dt = is_floating(input.dtype()) ? input.dtype() : DType::Float32;
  const DType ct = compute_dtype(dt);
  Tensor x = detail::as_dtype(input, ct);
  if (eps) {
    // torch clamps with x < lo ? lo : (x > hi ? hi : x): NaN stays, no gradient outside.
    // The bounds in the input's dtype, as torch's kernel (1 - 1e-6 is 1 in float16).
    const Tensor lo = full(Shape{}, *eps, dt, input.device()).to(ct);
    const Tensor hi = full(Shape{}, 1.0 - *eps, dt, input.device()).to(ct);
    x = where(x < lo, lo, where(x > hi, hi, x));
  }
  // torch's log(x / (1 - x)), whose gradient is grad / (x (1 - x)): infinite at 0 and 1. The
  // quotient's own backward would give 0 * inf = NaN there, so 0 and 1 take branches with the
  // same value (log(0) = -inf, -log1p(-1) = inf) and torch's infinite gradient, and every branch
  // reads a harmless operand where it is not taken.
  const Tensor at0 = x == 0.0, at1 = x == 1.0;
  const Tensor inner = logical_not(logical_or(at0, at1));
  const Tensor xm = where(inner, x, 0.5);
  // At 0 torch's gradient is +inf times the incoming one at -0 too: the operand is x + 0.0 (+0).
  Tensor r = where(at0, log(Tensor(where(at0, x, 1.0)) + 0.0),
                   where(at1, -log1p(-where(at1, x, 0.0)), Tensor(log(xm / (1.0 - xm)))));
  if (!eps) {
    // Outside [0, 1] torch's backward gives NaN (the value is NaN there already): sqrt of a
    // negative number has a NaN derivative, and the branch reads 1 (no gradient) where unused.
    const Tensor outside = logical_or(x<0.0, x> 1.0);
    r = where(outside, sqrt(where(outside, -abs(x) - 1.0, 1.0)), r);
  }
  return detail::as_dtype(r, dt);
}

KILN_ENTRY Tensor outer(const Tensor& a, const Tensor& b) {
  if (a.dim() != 1 || b.dim() != 1)
    throw ShapeError("outer: expected two 1-D tensors, got " + detail::describe(a) + " and " + detail::describe(b));
  return reshape(a, Shape{a.shape()[0], 1}) * reshape(b, Shape{1, b.shape()[0]});
}

// ---- rounding division, signs and powers ------------------------------------------------------

namespace detail {
KILN_ENTRY Tensor rounded_div(const Tensor& a, const Tensor& b, std::string_view rounding_mode, const char* op) {
  if (rounding_mode != "trunc" && rounding_mode != "floor")
    throw ValueError(std::string(op) + ": expected rounding_mode to be one of None, 'trunc', or 'floor' but found '" +
                     std::string(rounding_mode) + "' (operands " + describe(a) + " and " + describe(b) + ")");
  const DType dt = a.dtype();
  if (dt == DType::Bool)
    throw DTypeError(std::string(op) + ": rounding division is not supported for bool tensors, got " + describe(a) +
                     " and " + describe(b));
  const bool floor_mode = rounding_mode == "floor";
  if (!is_floating(dt)) {
    // Integer quotients are exact: the primitive's division truncates, and floor moves one
    // down where the remainder's sign differs from the divisor's (Python's //).
    if (any(b == 0).item<bool>())
      throw ValueError(std::string(op) + ": integer division by zero (" + describe(a) + " by " + describe(b) + ")");
    const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
    const Tensor x = broadcast_to(a, shape), y = broadcast_to(b, shape);
    const Tensor q(ir::binary(ir::Op::Div, x.node(), y.node()));
    if (!floor_mode) return q;
    const Tensor rem(ir::binary(ir::Op::Fmod, x.node(), y.node()));
    return where(logical_and(rem != 0, (rem < 0) != (y < 0)), q - 1, q);
  }
  const DType ct = compute_dtype(dt);
  const Tensor x = as_dtype(a.detach(), ct), y = as_dtype(b.detach(), ct);
  const Tensor quotient = x / y;
  Tensor r;
  if (!floor_mode) {
    r = trunc(quotient);
  } else {
    // torch's floor division: from fmod, so that a quotient that rounds up to an integer is not
    // floored one too far; a zero quotient keeps the sign a / b has.
    const Tensor mod = fmod(x, y);
    Tensor whole = (x - mod) / y;
    whole = where(logical_and(mod != 0.0, (y < 0.0) != (mod < 0.0)), whole - 1.0, whole);
    const Tensor down = floor(whole);
    const Tensor nearest = where(whole - down > 0.5, down + 1.0, down);
    const Tensor signed_zero = copysign(0.0, quotient);
    r = where(y == 0.0, quotient, where(whole != 0.0, nearest, signed_zero));
  }
  return zero_derivative(as_dtype(r, dt), {&a, &b});
}
}  // namespace detail

KILN_ENTRY Tensor signbit(const Tensor& x) {
  if (x.dtype() == DType::Bool) return zeros(x.shape(), DType::Bool, x.device());
  if (!is_floating(x.dtype())) return x < 0;
  return Tensor(copysign(1.0, x)) < 0.0;
}

KILN_ENTRY Tensor sgn(const Tensor& x) { return sign(x); }

KILN_ENTRY Tensor float_power(const Tensor& a, const Tensor& b) {
  return pow(detail::as_dtype(a, DType::Float64), detail::as_dtype(b, DType::Float64));
}

KILN_ENTRY Tensor logaddexp2(const Tensor& a, const Tensor& b) { return detail::log_add_exp(a, b, true, "logaddexp2"); }

// ---- statistics that skip NaN, order statistics, search ------------------------------------------

KILN_ENTRY Tensor std(const Tensor& x, const Axes& axes, bool keepdim, double correction) {
  return std::get<0>(std_mean(x, axes, keepdim, correction));
}

namespace detail {
/// The int64 position (keepdim) of the lower median along `dim` of x's values that are not NaN:
/// the stable sort's (NaN last) position (count - 1) / 2, position 0 of a row of NaN only.
KILN_ENTRY Tensor nan_median_position(const Tensor& x, std::int64_t dim, const char* op) {
  if (!is_floating(x.dtype())) return median_position(x, dim, op);
  const std::int64_t d = tensor_axis(dim, x, op);
  if (x.dim() > 0) require_nonempty_reduction(x, {d}, op);
  if (x.dim() == 0) return Tensor(ir::constant_int(0, DType::Int64, Shape{}, x.device()));
  const Tensor order = std::get<1>(sort(x, d, false, true));
  const Tensor count = sum(logical_not(isnan(x)).to(DType::Int64), Axes{d}, true);
  return gather(order, d, right_shift(where(count > 0, count - 1, 0), 1));
}
}  // namespace detail

KILN_ENTRY Tensor nanmedian(const Tensor& x) {
  if (x.dtype() == DType::Bool)
    throw DTypeError("nanmedian: not supported for bool tensors, got " + detail::describe(x));
  if (!is_floating(x.dtype())) return median(x);
  if (x.numel() == 0) return detail::median_of_empty(x);
  return detail::evenly_selected(x, detail::nan_median_position(reshape(x, Shape{x.numel()}), 0, "nanmedian"));
}

KILN_ENTRY ValuesIndices nanmedian(const Tensor& x, std::int64_t dim, bool keepdim) {
  // nan_median_position refuses bool (median_position's check, under this op's name).
  return detail::selected_along(x, dim, detail::nan_median_position(x, dim, "nanmedian"), keepdim, "nanmedian");
}

KILN_ENTRY ValuesIndices kthvalue(const Tensor& x, std::int64_t k, std::int64_t dim, bool keepdim) {
  if (x.dtype() == DType::Bool)
    throw DTypeError("kthvalue: not supported for bool tensors, got " + detail::describe(x));
  const std::int64_t n = detail::length_along(x, dim, "kthvalue");
  if (k < 1 || k > n)
    throw IndexError("kthvalue: selected number k = " + std::to_string(k) + " out of range for dimension " +
                     std::to_string(dim) + " of size " + std::to_string(n) + " (" + detail::describe(x) + ")");
  if (x.dim() == 0) return {x, Tensor(ir::constant_int(0, DType::Int64, Shape{}, x.device()))};
  const std::int64_t d = detail::tensor_axis(dim, x, "kthvalue");
  const Tensor at = narrow(std::get<1>(sort(x, d, false, true)), d, k - 1, 1);
  return detail::selected_along(x, dim, at, keepdim, "kthvalue");
}

namespace detail {
/// How many of a sorted row's elements lie before each value: below it, or with `right` not
/// above it (a NaN value: all). `seq` is [R, N] or 1-D; `values` [R, M] or any shape with a
/// 1-D seq. Rows of many elements merge with the values in one stable sort (values first on
/// ties, or last with `right`) and count the sequence's elements ahead of each; short rows
/// compare every pair inside one fused reduction.
KILN_ENTRY Tensor insertion_counts(const Tensor& seq, const Tensor& values, bool right) {
  const std::int64_t n = seq.shape().back();
  const bool one_row = seq.dim() == 1;
  // Pairwise: [..., M, 1] against [..., 1, N] (1-D: [..., 1] against [N]).
  if (n <= 64 || values.numel() * n <= (std::int64_t{1} << 22)) {
    const Tensor v = unsqueeze(values, -1), s = one_row ? seq : unsqueeze(seq, -2);
    // torch's binary search moves right past s while !(v <= s) (left) or !(v < s) (right).
    const Tensor before = right ? Tensor(logical_not(v < s)) : Tensor(logical_not(v <= s));
    return sum(before.to(DType::Int64), {-1});
  }
  const Tensor rows = one_row ? reshape(values, Shape{1, values.numel()}) : values;
  const Tensor s = one_row ? unsqueeze(seq, 0) : seq;
  const std::int64_t m = rows.shape().back();
  const Tensor merged = right ? cat({s, rows}, -1) : cat({rows, s}, -1);
  const Tensor order = argsort(merged, -1, false, true);
  const Tensor from_seq = (right ? Tensor(order < n) : Tensor(order >= m)).to(DType::Int64);
  const Tensor ahead = cumsum(from_seq, -1) - from_seq;
  const Tensor counts = scatter(zeros(merged.shape(), DType::Int64, merged.device()), -1, order, ahead);
  const Tensor mine = narrow(counts, -1, right ? n : 0, m);
  return one_row ? reshape(mine, values.shape()) : mine;
}

KILN_ENTRY Tensor searchsorted_checked(const Tensor& seq_in, const Tensor& values_in, bool out_int32, bool right,
                                       const std::optional<std::string>& side, const Tensor& sorter, const char* op) {
  const std::string what = " (sorted_sequence " + describe(seq_in) + ", values " + describe(values_in) + ")";
  if (side && *side != "left" && *side != "right")
    throw ValueError(std::string(op) + ": side can only be 'left' or 'right', got '" + *side + "'" + what);
  if (side && *side == "left" && right)
    throw ValueError(std::string(op) + ": side and right can't be set to opposites, got side left with right" + what);
  if (seq_in.dim() == 0)
    throw ShapeError(std::string(op) + ": the sorted sequence should have a positive number of dims, got 0" + what);
  if (seq_in.dim() > 1) {
    const Shape& s = seq_in.shape();
    const Shape& v = values_in.shape();
    if (v.size() != s.size() || !std::equal(s.begin(), s.end() - 1, v.begin()))
      throw ShapeError(std::string(op) + ": the sorted sequence should be 1-D or have the values' leading dims" + what);
  }
  if (seq_in.dtype() == DType::Bool || values_in.dtype() == DType::Bool)
    throw DTypeError(std::string(op) + ": not supported for bool tensors" + what);
  Tensor seq = seq_in;
  if (sorter.defined()) {
    if (sorter.dtype() != DType::Int64)
      throw DTypeError(std::string(op) + ": sorter must be an int64 tensor, got " + describe(sorter) + what);
    if (sorter.shape() != seq_in.shape())
      throw ShapeError(std::string(op) + ": sorter must have the sorted sequence's shape, got " + describe(sorter) +
                       what);
    seq = gather(seq_in, -1, sorter);
  }
  const DType dt = result_type_of({&seq_in, &values_in});
  const Tensor counts =
      insertion_counts(as_dtype(seq, dt), as_dtype(values_in.detach(), dt), right || (side && *side == "right"));
  return out_int32 ? counts.to(DType::Int32) : counts;
}
}  // namespace detail

KILN_ENTRY Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool out_int32, bool right,
                               std::optional<std::string> side, const Tensor& sorter) {
  return detail::searchsorted_checked(sorted_sequence.detach(), values, out_int32, right, side, sorter, "searchsorted");
}

KILN_ENTRY Tensor searchsorted(const Tensor& sorted_sequence, double value, bool out_int32, bool right,
                               std::optional<std::string> side, const Tensor& sorter) {
  if (sorted_sequence.dim() != 1)
    throw ShapeError("searchsorted: a number value needs a 1-D sorted sequence, got " +
                     detail::describe(sorted_sequence));
  // The number is a wrapped number: it never widens the sequence's dtype (a float one makes an
  // integer sequence float32, as torch's promotion).
  detail::ResultType rt;
  rt.add(detail::info_of(sorted_sequence));
  rt.add(detail::info_of(detail::as_operand(value)));
  const Tensor v = full(Shape{}, value, rt.result(), sorted_sequence.device());
  return searchsorted(sorted_sequence, v, out_int32, right, side, sorter);
}

KILN_ENTRY Tensor bucketize(const Tensor& input, const Tensor& boundaries, bool out_int32, bool right) {
  if (boundaries.dim() != 1)
    throw ShapeError("bucketize: boundaries must be 1-D, got " + detail::describe(boundaries) + " (input " +
                     detail::describe(input) + ")");
  return detail::searchsorted_checked(boundaries.detach(), input, out_int32, right, std::nullopt, Tensor{},
                                      "bucketize");
}

KILN_ENTRY Tensor cov(const Tensor& input, std::int64_t correction, const Tensor& fweights, const Tensor& aweights) {
  if (input.dim() > 2)
    throw ShapeError("cov: expected input to have two or fewer dimensions, got " + detail::describe(input));
  if (input.dtype() == DType::Bool)
    throw DTypeError("cov: bool dtype is not supported for input, got " + detail::describe(input));
  const Tensor in = input.dim() < 2 ? reshape(input, Shape{1, input.numel()}) : input;
  const std::int64_t observations = in.shape()[1];
  auto check_weights = [&](const Tensor& w, const char* name, bool integral) {
    const std::string got =
        std::string(" but got ") + name + " " + detail::describe(w) + " for input " + detail::describe(input);
    if (w.dim() > 1) throw ShapeError(std::string("cov: expected ") + name + " to have one or fewer dimensions" + got);
    if (integral ? (is_floating(w.dtype()) || w.dtype() == DType::Bool) : !is_floating(w.dtype()))
      throw DTypeError(std::string("cov: expected ") + name +
                       (integral ? " to have an integral" : " to have a floating") + " dtype" + got);
    if (w.numel() != observations)
      throw ShapeError(std::string("cov: expected ") + name + " to have one element per observation (" +
                       std::to_string(observations) + ")" + got);
    if (observations > 0 && any(w < 0).item<bool>())
      throw ValueError(std::string("cov: ") + name + " cannot be negative" + got);
  };
  Tensor w;
  if (fweights.defined()) {
    check_weights(fweights, "fweights", true);
    w = fweights;
  }
  if (aweights.defined()) {
    check_weights(aweights, "aweights", false);
    w = w.defined() ? Tensor(w * aweights) : aweights;
  }
  const Tensor w_sum =
      w.defined() ? sum(w) : full(Shape{}, static_cast<double>(observations), DType::Int64, input.device());
  if (w.defined() && (w_sum == 0).item<bool>())
    throw ValueError("cov: weights sum to zero, can't be normalized (input " + detail::describe(input) + ")");
  const Tensor avg = sum(w.defined() ? Tensor(in * w) : in, {1}) / w_sum;
  Tensor norm = w.defined() && aweights.defined() && correction != 0
                    ? Tensor(w_sum - static_cast<double>(correction) * sum(w * aweights) / w_sum)
                    : Tensor(w_sum - correction);
  // torch warns and divides by 0 when the degrees of freedom are not positive.
  norm = where(norm <= 0, 0, norm);
  const Tensor centred = in - unsqueeze(avg, 1);
  const Tensor c = matmul(centred, transpose(w.defined() ? Tensor(centred * w) : centred, 0, 1));
  return squeeze(true_divide(c, norm));
}

KILN_ENTRY Tensor corrcoef(const Tensor& input) {
  if (input.dim() > 2)
    throw ShapeError("corrcoef: expected input to have two or fewer dimensions, got " + detail::describe(input));
  const Tensor c = cov(input);
  if (c.dim() == 0) return c / c;  // 1, or NaN where the variance is 0, inf or NaN
  const Tensor stddev = sqrt(diagonal(c));
  return clip(c / unsqueeze(stddev, 1) / unsqueeze(stddev, 0), -1.0, 1.0);
}

KILN_ENTRY Tensor histc(const Tensor& x, std::int64_t bins, double min, double max) {
  if (!is_floating(x.dtype()))
    throw DTypeError("histc: expected a floating input (as torch's CPU kernel), got " + detail::describe(x));
  if (bins <= 0)
    throw ValueError("histc: bins must be > 0, got " + std::to_string(bins) + " for " + detail::describe(x));
  double lo = min, hi = max;
  if (lo == hi && x.numel() > 0) {
    const auto [smallest, largest] = aminmax(x);
    lo = smallest.item<double>();
    hi = largest.item<double>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  if (!std::isfinite(lo) || !std::isfinite(hi))
    throw ValueError("histc: range of [" + std::to_string(lo) + ", " + std::to_string(hi) + "] is not finite (" +
                     detail::describe(x) + ")");
  if (!(lo < hi))
    throw ValueError("histc: max must be larger than min, got min " + std::to_string(lo) + " and max " +
                     std::to_string(hi) + " (" + detail::describe(x) + ")");
  // torch's kernel: the outer edges in x's dtype, the bin trunc((x - lo) bins / (hi - lo)) in
  // x's arithmetic, max in the last bin; elements outside [lo, hi] (and NaN) go to an extra
  // bin that is dropped.
  const DType dt = x.dtype(), ct = compute_dtype(dt);
  const Tensor lo_t = full(Shape{}, lo, dt, x.device()).to(ct), hi_t = full(Shape{}, hi, dt, x.device()).to(ct);
  const Tensor v = detail::as_dtype(reshape(x.detach(), Shape{x.numel()}), ct);
  const Tensor at = trunc((v - lo_t) * static_cast<double>(bins) / (hi_t - lo_t)).to(DType::Int64);
  const Tensor inside = logical_and(v >= lo_t, v <= hi_t);
  const Tensor slot = where(inside, where(at == bins, bins - 1, at), bins);
  const Tensor counts =
      scatter_add(zeros(Shape{bins + 1}, dt, x.device()), 0, slot, ones(Shape{x.numel()}, dt, x.device()));
  return narrow(counts, 0, 0, bins);
}

// ---- writes at index tuples and masks ------------------------------------------------------

namespace detail {
/// The int64 positions `index` gives along a dim of `size` of x, negative ones counted from the
/// end (torch's indexing), and -1 for those out of range. Out of range is an IndexError naming
/// `op` when the index is already in host memory; otherwise the -1 reaches a kernel's check.
KILN_ENTRY Tensor wrapped_positions(const Tensor& x, const Tensor& index, std::int64_t dim, std::int64_t size,
                                    const char* op) {
  if (index.dtype() != DType::Int64 && index.dtype() != DType::Int32)
    throw DTypeError(std::string(op) + ": tensors used as indices must be int64, int32 or bool, got " +
                     describe(index) + " (input " + describe(x) + ")");
  if (index.device() != x.device())
    throw DeviceError(std::string(op) + ": index " + describe(index) + " is not on the input's device (input " +
                      describe(x) + ")");
  if (index.is_evaluated() && index.device().is_cpu())
    for (const std::int64_t v : index.dtype() == DType::Int64 ? index.to_vector<std::int64_t>() : [&] {
           const std::vector<std::int32_t> narrow = index.to_vector<std::int32_t>();
           return std::vector<std::int64_t>(narrow.begin(), narrow.end());
         }())
      if (v < -size || v >= size)
        throw IndexError(std::string(op) + ": index " + std::to_string(v) + " is out of bounds for dimension " +
                         std::to_string(dim) + " with size " + std::to_string(size) + " (input " + describe(x) +
                         ", index " + describe(index) + ")");
  const Tensor i = index.to(DType::Int64);
  return where(logical_and(i >= -size, i < size), where(i < 0, i + size, i), -1);
}
}  // namespace detail

KILN_ENTRY Tensor index_put(const Tensor& input_in, const std::vector<Tensor>& indices_in, const Tensor& values_in,
                            bool accumulate) {
  const char* op = "index_put";
  // On autocast's promote list: input and values meet in the wider dtype under autocast.
  Tensor input = input_in, values = values_in;
  detail::autocast_promote({&input, &values});
  if (indices_in.empty())
    throw ValueError(std::string(op) + ": expected at least one index tensor (input " + detail::describe(input) + ")");
  if (values.dtype() != input.dtype())
    throw DTypeError(std::string(op) + ": values must have the input's dtype, got " + detail::describe(values) +
                     " for input " + detail::describe(input));
  detail::check_same_device(input.device(), values.device(), op);
  // Bool masks stand for the positions of their true elements, one index tensor per mask dim.
  std::vector<Tensor> indices;
  for (const Tensor& index : indices_in) {
    if (!index.defined())
      throw ValueError(std::string(op) + ": an index tensor is undefined (input " + detail::describe(input) + ")");
    if (index.dtype() != DType::Bool) {
      indices.push_back(index);
      continue;
    }
    if (index.dim() == 0)
      throw ValueError(std::string(op) + ": a 0-dim bool index is not supported (input " + detail::describe(input) +
                       ")");
    const std::size_t first = indices.size();
    for (std::int64_t d = 0; d < index.dim(); ++d)
      if (first + d >= input.shape().size() || index.shape()[d] != input.shape()[first + d])
        throw IndexError(std::string(op) + ": the shape of the mask " + detail::describe(index) + " at index " +
                         std::to_string(d) + " does not match the shape of the indexed tensor " +
                         detail::describe(input));
    for (const Tensor& positions : where(index)) indices.push_back(positions);
  }
  const std::size_t k = indices.size();
  if (k > input.shape().size())
    throw IndexError(std::string(op) + ": too many indices for tensor of dimension " + std::to_string(input.dim()) +
                     " (got " + std::to_string(k) + "), input " + detail::describe(input));
  Shape batch;
  try {
    for (const Tensor& index : indices) batch = broadcast_shapes(batch, index.shape(), op);
  } catch (const ShapeError&) {
    std::string shapes;
    for (const Tensor& index : indices) shapes += " " + index.shape().str();
    throw ShapeError(std::string(op) +
                     ": shape mismatch: indexing tensors could not be broadcast together with "
                     "shapes" +
                     shapes + " (input " + detail::describe(input) + ")");
  }
  const Shape& in_shape = input.shape();
  const std::vector<std::int64_t> rest(in_shape.begin() + static_cast<std::ptrdiff_t>(k), in_shape.end());
  std::vector<std::int64_t> target(batch.begin(), batch.end());
  target.insert(target.end(), rest.begin(), rest.end());
  bool fits = true;
  try {
    fits = broadcast_shapes(values.shape(), Shape(target), op) == Shape(target);
  } catch (const ShapeError&) {
    fits = false;
  }
  if (!fits)
    throw ShapeError(std::string(op) + ": shape mismatch: value tensor of shape " + values.shape().str() +
                     " cannot be broadcast to indexing result of shape " + Shape(target).str() + " (input " +
                     detail::describe(input) + ")");
  // One position along the leading dims flattened; a position out of range in any dim makes
  // it `leading` (out of range), which the scatter's check reports.
  std::int64_t leading = 1;
  Tensor linear = zeros(batch, DType::Int64, input.device()), valid = full(batch, 1.0, DType::Bool, input.device());
  for (std::size_t d = 0; d < k; ++d) {
    const Tensor at = detail::wrapped_positions(input, indices[d], static_cast<std::int64_t>(d), in_shape[d], op);
    linear = linear * in_shape[d] + at;
    valid = logical_and(valid, at >= 0);
    leading *= in_shape[d];
  }
  std::vector<std::int64_t> flat_shape{leading}, source_shape{batch.numel()};
  flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
  source_shape.insert(source_shape.end(), rest.begin(), rest.end());
  const Tensor positions = reshape(where(valid, linear, leading), Shape{batch.numel()});
  const Tensor source = reshape(broadcast_to(values, Shape(target)), Shape(source_shape));
  const Tensor written = detail::index_scatter(reshape(input, Shape(flat_shape)), 0, positions, source, accumulate,
                                               accumulate ? ir::GatherSite::IndexAdd : ir::GatherSite::IndexCopy, op);
  return reshape(written, in_shape);
}

KILN_ENTRY Tensor index_fill(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& value) {
  const char* op = "index_fill";
  if (value.dim() != 0)
    throw ShapeError(std::string(op) + ": only supports a 0-dimensional value tensor, got " + detail::describe(value) +
                     " (input " + detail::describe(input) + ")");
  if (index.dim() > 1)
    throw ShapeError(std::string(op) + ": the index has to be a vector or a scalar, got " + detail::describe(index) +
                     " (input " + detail::describe(input) + ")");
  detail::check_same_device(input.device(), value.device(), op);
  const std::int64_t d = input.dim() == 0 ? 0 : detail::tensor_axis(dim, input, op);
  const std::int64_t size = input.dim() == 0 ? 1 : input.shape()[static_cast<std::size_t>(d)];
  const Tensor at = reshape(detail::wrapped_positions(input, index, d, size, op), Shape{index.numel()});
  // The dim's positions that are filled, as a bool column along d (a scatter of trues, whose
  // kernel reports a -1 left by an index out of range).
  const Tensor filled = scatter(zeros(Shape{size}, DType::Bool, input.device()), 0, at, 1.0);
  std::vector<std::int64_t> column(static_cast<std::size_t>(input.dim()), 1);
  if (input.dim() > 0) column[static_cast<std::size_t>(d)] = size;
  return where(reshape(filled, Shape(column)), detail::as_dtype(value, input.dtype()), input);
}

KILN_ENTRY Tensor index_fill(const Tensor& input, std::int64_t dim, const Tensor& index, double value) {
  return index_fill(input, dim, index, full(Shape{}, value, input.dtype(), input.device()));
}

KILN_ENTRY Tensor masked_scatter(const Tensor& input, const Tensor& mask, const Tensor& source) {
  const char* op = "masked_scatter";
  if (mask.dtype() != DType::Bool)
    throw DTypeError(std::string(op) + ": only supports boolean masks, got " + detail::describe(mask) + " (input " +
                     detail::describe(input) + ")");
  if (source.dtype() != input.dtype())
    throw DTypeError(std::string(op) + ": expected input and source to have one dtype, got input " +
                     detail::describe(input) + " and source " + detail::describe(source));
  detail::check_same_device(input.device(), mask.device(), op);
  detail::check_same_device(input.device(), source.device(), op);
  const Shape shape = broadcast_shapes(input.shape(), mask.shape(), op);
  const Tensor m = reshape(broadcast_to(mask, shape), Shape{shape.numel()});
  const Tensor x = reshape(broadcast_to(input, shape), Shape{shape.numel()});
  const Tensor src = reshape(source, Shape{source.numel()});
  if (src.numel() == 0) {
    // Nothing to read: only a mask without a true element is valid (the mask is read).
    if (shape.numel() > 0 && any(m).item<bool>())
      throw IndexError(std::string(op) + ": the source " + detail::describe(source) +
                       " has fewer elements than the mask " + detail::describe(mask) + " has true ones");
    const Tensor nothing = sum(src);
    return detail::zero_derivative(reshape(x, shape), {&nothing});
  }
  // The k-th true element of the mask reads source[k]; a position k beyond the source is
  // out of range, which the gather's check reports.
  const Tensor k = cumsum(m.to(DType::Int64), 0) - 1;
  const Tensor read = gather(src, 0, where(m, k, 0));
  return reshape(where(m, read, x), shape);
}

}  // namespace kiln
