#pragma once
// Scans along one dim with PyTorch's names and dtype rules: cumsum, cumprod (integer and bool
// inputs give int64, unless a dtype is asked for), cummax and cummin (values and int64 indices:
// the latest index among equal values, the first NaN kept), logcumsumexp (floating inputs).
// Each is one Scan primitive, a step of its own after the kernels that compute its input.
#include <optional>
#include <string>
#include <tuple>

#include "kiln/tensor/functions.hpp"

namespace kiln {

namespace detail {

/// x as a node of rank >= 1 (a 0-dim tensor scans as one element) and the normalised dim.
inline std::pair<ir::NodePtr, std::int64_t> scan_operand(const Tensor& x, std::int64_t dim, const char* op) {
  const std::int64_t axis = tensor_axis(dim, x, op);
  ir::NodePtr n = x.dim() == 0 ? ir::reshape(x.node(), Shape{1}) : x.node();
  return {n, axis};
}

inline Tensor scan_result(const Tensor& x, ir::NodePtr r) {
  return x.dim() == 0 ? Tensor(ir::reshape(r, Shape{})) : Tensor(std::move(r));
}

inline Tensor accumulate_scan(const Tensor& input, std::int64_t dim, std::optional<DType> dtype, ir::ScanKind kind,
                              const char* op) {
  // Autocast (float32 for f16/bf16 inputs) only when no dtype is asked for, as torch.
  Tensor x = dtype ? to_tensor(input).to(*dtype) : fp32_operand(input);
  auto [n, axis] = scan_operand(x, dim, op);
  const DType out = is_floating(x.dtype()) ? x.dtype() : DType::Int64;
  return scan_result(x, ir::scan(n, axis, kind, out));
}

inline std::tuple<Tensor, Tensor> select_scan(const Tensor& input, std::int64_t dim, bool max, const char* op) {
  Tensor x = to_tensor(input);
  auto [n, axis] = scan_operand(x, dim, op);
  ir::NodePtr values = ir::scan(n, axis, max ? ir::ScanKind::Max : ir::ScanKind::Min, x.dtype());
  ir::NodePtr indices = ir::scan(n, axis, max ? ir::ScanKind::ArgMax : ir::ScanKind::ArgMin, DType::Int64);
  return {scan_result(x, values), scan_result(x, indices)};
}

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
inline Tensor logcumsumexp(const Tensor& input, std::int64_t dim) {
  Tensor x = detail::to_tensor(input);
  if (!is_floating(x.dtype()))
    throw DTypeError("logcumsumexp: expected a floating input, got " + detail::describe(x));
  auto [n, axis] = detail::scan_operand(x, dim, "logcumsumexp");
  return detail::scan_result(x, ir::scan(n, axis, ir::ScanKind::LogSumExp, x.dtype()));
}

}  // namespace kiln
