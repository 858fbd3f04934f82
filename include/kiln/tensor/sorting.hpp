#pragma once
// Sorting and selection along one dim with PyTorch's names and semantics: sort, argsort, topk,
// msort. Each is one Sort primitive giving int64 positions (a step of its own after the kernels
// that compute its input); the values are a gather of the input at those positions, read inside
// whatever kernel consumes them.
//
// The order is total and the same on every device: NaN is larger than every number (last in an
// ascending sort, first in a descending one and in topk's largest), -0 equals +0, and equal
// values keep their order, so every sort is stable (the `stable` flag is accepted for PyTorch's
// signature and always holds) and topk returns the lowest positions among equal values, sorted.
#include <string>
#include <tuple>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

namespace detail {

/// The positions of x's k first elements along `dim` and the values there (0-dim inputs act as
/// one element and give 0-dim results).
KILN_ENTRY std::tuple<Tensor, Tensor> sorted_along(const Tensor& input, std::int64_t dim, std::int64_t k,
                                                   bool descending, const char* op);

inline std::int64_t length_along(const Tensor& x, std::int64_t dim, const char* op) {
  return x.dim() == 0 ? 1 : x.shape()[static_cast<std::size_t>(tensor_axis(dim, x, op))];
}

}  // namespace detail

/// The `k` largest (or, with largest = false, smallest) elements along `dim` and their int64
/// positions, as torch.topk: sorted first to last (`sorted` = false is accepted and gives the
/// same order), NaN counting as the largest, the lower position first among equal values.
/// ValueError unless 0 <= k <= the dim's size.
KILN_ENTRY std::tuple<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, std::int64_t dim = -1, bool largest = true,
                                           bool sorted = true);

/// x sorted along `dim` (ascending, or descending) and the int64 positions the values came
/// from, as torch.sort; always stable (NaN last ascending, first descending).
KILN_ENTRY std::tuple<Tensor, Tensor> sort(const Tensor& x, std::int64_t dim = -1, bool descending = false,
                                           bool stable = false);

/// The int64 positions that sort x along `dim`, as torch.argsort (stable).
inline Tensor argsort(const Tensor& x, std::int64_t dim = -1, bool descending = false, bool stable = false) {
  return std::get<1>(sort(x, dim, descending, stable));
}

/// x sorted along its first dim, ascending (torch.msort).
inline Tensor msort(const Tensor& x) { return std::get<0>(sort(x, 0)); }

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/sorting_impl.hpp"
#endif
