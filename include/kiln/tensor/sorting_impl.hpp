#pragma once
// The definitions of sorting and selection (tensor/sorting.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/sorting.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY std::tuple<Tensor, Tensor> sorted_along(const Tensor& input, std::int64_t dim, std::int64_t k,
                                                   bool descending, const char* op) {
  Tensor x = to_tensor(input);
  const std::int64_t axis = tensor_axis(dim, x, op);
  const std::int64_t len = x.dim() == 0 ? 1 : x.shape()[static_cast<std::size_t>(axis)];
  if (k < 0 || k > len)
    throw ValueError(std::string(op) + ": k = " + std::to_string(k) + " is out of range for dimension " +
                     std::to_string(dim) + " of size " + std::to_string(len) + " (input " + describe(x) + ")");
  ir::NodePtr n = x.dim() == 0 ? ir::reshape(x.node(), Shape{1}) : x.node();
  ir::NodePtr positions = ir::sort(n, axis, k, descending);
  ir::NodePtr values = gather_nodes(Tensor(n), positions, axis, ir::GatherSite::Gather).node();
  if (x.dim() == 0) return {Tensor(ir::reshape(values, Shape{})), Tensor(ir::reshape(positions, Shape{}))};
  return {Tensor(values), Tensor(positions)};
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY std::tuple<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t dim, bool largest,
                                           bool sorted) {
  (void)sorted;
  if (x.dtype() == DType::Bool)  // as PyTorch (sort takes bools; topk does not)
    throw DTypeError("topk: not supported for bool tensors, got " + detail::describe(x));
  return detail::sorted_along(x, dim, k, largest, "topk");
}

KILN_ENTRY std::tuple<Tensor, Tensor> sort(const Tensor& x, std::int64_t dim, bool descending, bool stable) {
  (void)stable;
  return detail::sorted_along(x, dim, detail::length_along(detail::to_tensor(x), dim, "sort"), descending, "sort");
}

}  // namespace kiln
