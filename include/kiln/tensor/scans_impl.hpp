#pragma once
// The definitions of the scans (tensor/scans.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/scans.hpp"

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
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor logcumsumexp(const Tensor& input, std::int64_t dim) {
  Tensor x = detail::to_tensor(input);
  if (!is_floating(x.dtype())) throw DTypeError("logcumsumexp: expected a floating input, got " + detail::describe(x));
  auto [n, axis] = detail::scan_operand(x, dim, "logcumsumexp");
  return detail::scan_result(x, ir::scan(n, axis, ir::ScanKind::LogSumExp, x.dtype()));
}

}  // namespace kiln
