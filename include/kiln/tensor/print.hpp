#pragma once
// Printing tensors as PyTorch's repr does: nested brackets, aligned columns, the middle of
// long dimensions elided, then the dtype, shape and device. Printing evaluates (a data read).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln {

namespace detail {

/// Tensors with more elements than this print only `kEdgeItems` at each end of every dimension
/// (torch.set_printoptions' threshold and edgeitems defaults).
inline constexpr std::int64_t kPrintThreshold = 1000;
inline constexpr std::int64_t kEdgeItems = 3;

/// Row-major flat indices of the elements that are printed, per dimension: all of them, or the
/// first and last kEdgeItems when the tensor is summarised.
KILN_ENTRY std::vector<std::int64_t> printed_indices(std::int64_t size, bool summarise);

/// How floats are written: fixed with 4 decimals, integral values without them ("3."), or
/// scientific when the magnitudes call for it, chosen over all printed values as PyTorch does.
struct FloatStyle {
  bool scientific = false;
  bool integral = true;
};

KILN_ENTRY FloatStyle float_style(const std::vector<double>& v);

KILN_ENTRY std::string format_float(double x, const FloatStyle& s);

/// The values part: "[[1., 2.],\n        [3., 4.]]" with `indent` columns before each new row.
KILN_ENTRY std::string format_values(const Tensor& t, std::size_t indent);

}  // namespace detail

/// "tensor([[1., 2.],\n        [3., 4.]], dtype=float32, shape=[2, 2], device=cpu)"; the middle
/// of long dimensions is elided for tensors of more than 1000 elements. Evaluates the tensor.

template <class Derived>
std::string Expr<Derived>::str() const {
  return Tensor(derived()).str();
}

/// Prints `t.str()`.
inline std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

/// Prints an expression's value as its Tensor would print.
template <class E>
requires(TensorLike<E> && !std::is_base_of_v<Tensor, std::remove_cvref_t<E>>) std::ostream& operator<<(std::ostream& os,
                                                                                                       const E& e) {
  return os << Tensor(e).str();
}

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/print_impl.hpp"
#endif
