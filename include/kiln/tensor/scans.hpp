#pragma once
// Scans along one dim with PyTorch's names and dtype rules: cumsum, cumprod (integer and bool
// inputs give int64, unless a dtype is asked for), cummax and cummin (values and int64 indices:
// the latest index among equal values, the first NaN kept), logcumsumexp (floating inputs).
// Each is one Scan primitive, a step of its own after the kernels that compute its input.
// Beside them the differences and integrals along one dim built from slices: diff, trapezoid,
// cumulative_trapezoid.
#include <optional>
#include <string>
#include <tuple>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

namespace detail {

/// x as a node of rank >= 1 (a 0-dim tensor scans as one element) and the normalised dim.
KILN_ENTRY std::pair<ir::NodePtr, std::int64_t> scan_operand(const Tensor& x, std::int64_t dim, const char* op);

inline Tensor scan_result(const Tensor& x, ir::NodePtr r) {
  return x.dim() == 0 ? Tensor(ir::reshape(r, Shape{})) : Tensor(std::move(r));
}

KILN_ENTRY Tensor accumulate_scan(const Tensor& input, std::int64_t dim, std::optional<DType> dtype, ir::ScanKind kind,
                                  const char* op);

KILN_ENTRY std::tuple<Tensor, Tensor> select_scan(const Tensor& input, std::int64_t dim, bool max, const char* op);

}  // namespace detail

/// Running sums along `dim`, as torch.cumsum: out[..., i, ...] = x[..., 0, ...] + ... + x[..., i, ...].
/// Integer and bool inputs give int64 (exact, wrapping); `dtype` casts the input first.
inline Tensor cumsum(const Tensor& x, std::int64_t dim, std::optional<DType> dtype = std::nullopt) {
  return detail::accumulate_scan(x, dim, dtype, ir::ScanKind::Sum, "cumsum");
}

/// Running products along `dim`, as torch.cumprod (dtypes as cumsum).
inline Tensor cumprod(const Tensor& x, std::int64_t dim, std::optional<DType> dtype = std::nullopt) {
  return detail::accumulate_scan(x, dim, dtype, ir::ScanKind::Prod, "cumprod");
}

/// Running maxima along `dim` and their int64 indices, as torch.cummax (the latest index among
/// equal values; once a NaN is met it is the maximum, with its index).
inline std::tuple<Tensor, Tensor> cummax(const Tensor& x, std::int64_t dim) {
  return detail::select_scan(x, dim, true, "cummax");
}

/// Running minima along `dim` and their int64 indices, as torch.cummin.
inline std::tuple<Tensor, Tensor> cummin(const Tensor& x, std::int64_t dim) {
  return detail::select_scan(x, dim, false, "cummin");
}

/// log(cumsum(exp(x))) along `dim`, computed stably, as torch.logcumsumexp (floating inputs).
KILN_ENTRY Tensor logcumsumexp(const Tensor& input, std::int64_t dim);

/// The n-th forward difference along `dim` (torch.diff): out[i] = x[i + 1] - x[i], n times, after
/// `prepend` and `append` (undefined: none) are joined to the input along dim (dtypes promote
/// as cat's); bool inputs take logical_xor. n beyond the length gives an empty dim; n = 0 gives
/// a copy of the input, prepend and append left out (as torch's). ShapeError for a 0-dim input
/// or prepend/append of another rank or other sizes outside dim, ValueError for a negative n.
KILN_ENTRY Tensor diff(const Tensor& input, std::int64_t n = 1, std::int64_t dim = -1, const Tensor& prepend = {},
                       const Tensor& append = {});

/// The trapezoid rule along `dim` with samples `dx` apart (torch.trapezoid):
/// (sum(y) - (y[0] + y[-1]) / 2) * dx, the dim removed; integer inputs give float32. No samples
/// give zeros of y's dtype; bool y is a DTypeError, a 0-dim y a ShapeError.
KILN_ENTRY Tensor trapezoid(const Tensor& y, double dx = 1.0, std::int64_t dim = -1);

/// The trapezoid rule along `dim` at the sample points x (torch.trapezoid(y, x)):
/// sum((y[1:] + y[:-1]) * (x[1:] - x[:-1])) / 2. A 1-D x gives the points along dim (one for
/// each sample, ShapeError otherwise); another x gets leading size-1 dims up to y's rank and its
/// differences broadcast with y's, as torch's (and NumPy's). Bool y or x is a DTypeError.
KILN_ENTRY Tensor trapezoid(const Tensor& y, const Tensor& x, std::int64_t dim = -1);

/// The running trapezoid rule along `dim` (torch.cumulative_trapezoid): element i is the
/// integral over the first i + 2 samples, so the dim is one shorter; integer inputs give float32.
KILN_ENTRY Tensor cumulative_trapezoid(const Tensor& y, double dx = 1.0, std::int64_t dim = -1);

/// The running trapezoid rule at the sample points x (torch.cumulative_trapezoid(y, x)); x as
/// trapezoid's.
KILN_ENTRY Tensor cumulative_trapezoid(const Tensor& y, const Tensor& x, std::int64_t dim = -1);

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/scans_impl.hpp"
#endif
