#pragma once
// Scans along one dim with PyTorch's names and dtype rules: cumsum, cumprod (integer and bool
// inputs give int64, unless a dtype is asked for), cummax and cummin (values and int64 indices:
// the latest index among equal values, the first NaN kept), logcumsumexp (floating inputs).
// Each is one Scan primitive, a step of its own after the kernels that compute its input.
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

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/scans_impl.hpp"
#endif
