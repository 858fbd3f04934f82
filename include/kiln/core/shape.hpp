#pragma once
// Shapes, strides, axes and NumPy broadcasting.
#include <cstdint>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln {

/// Sizes of a tensor's dimensions, outermost first (row-major). `{}` is a 0-dim scalar.
struct Shape : std::vector<std::int64_t> {
  using std::vector<std::int64_t>::vector;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : std::vector<std::int64_t>(dims) {}
  explicit Shape(const std::vector<std::int64_t>& v) : std::vector<std::int64_t>(v) {}

  /// Number of elements (1 for a 0-dim shape).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : *this) n *= d;
    return n;
  }
  std::int64_t rank() const { return static_cast<std::int64_t>(size()); }
  /// "[4096, 4096]".
  std::string str() const {
    std::string s = "[";
    for (std::size_t i = 0; i < size(); ++i) s += (i ? ", " : "") + std::to_string((*this)[i]);
    return s + "]";
  }
};

/// `shape.numel()`, or ShapeError naming `op` when a size is negative or the product (or its
/// size in bytes, `itemsize` per element) does not fit in int64.
inline std::int64_t checked_numel(const Shape& shape, const char* op, std::size_t itemsize = 1) {
  constexpr std::int64_t kMax = INT64_MAX;
  std::int64_t n = 1;
  bool overflow = false;
  for (auto d : shape)
    if (d < 0) throw ShapeError(std::string(op) + ": negative size in shape " + shape.str());
  for (auto d : shape) {
    if (d == 0) return 0;
    if (n > kMax / d)
      overflow = true;
    else
      n *= d;
  }
  if (overflow || n > kMax / static_cast<std::int64_t>(itemsize ? itemsize : 1))
    throw ShapeError(std::string(op) + ": shape " + shape.str() + " has too many elements" +
                     (itemsize > 1 ? " (its size in bytes, " + std::to_string(itemsize) + " per element, " : " (") +
                     "does not fit in int64)");
  return n;
}

/// Element strides (not bytes), one per dimension.
using Strides = std::vector<std::int64_t>;

/// One axis or a list of axes; negative axes count from the end. `{}` means every axis.
struct Axes {
  std::vector<std::int64_t> axes;
  Axes() = default;
  Axes(std::int64_t a) : axes{a} {}  // NOLINT: `sum(x, 1)`
  Axes(int a) : axes{a} {}           // NOLINT
  Axes(std::initializer_list<std::int64_t> a) : axes(a) {}
  Axes(std::vector<std::int64_t> a) : axes(std::move(a)) {}  // NOLINT
};

/// Row-major contiguous strides of `shape`.
inline Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

/// True when `strides` address `shape` densely in row-major order (size-1 dims ignored).
inline bool is_contiguous(const Shape& shape, const Strides& strides) {
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != acc) return false;
    acc *= shape[i];
  }
  return true;
}

/// Broadcast two shapes by NumPy's rules or throw ShapeError naming `op`.
inline Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  std::size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ShapeError(std::string(op) + ": shapes " + a.str() + " and " + b.str() +
                       " cannot be broadcast (dimension " + std::to_string(i) + ": " + std::to_string(da) + " vs " +
                       std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  checked_numel(out, op);
  return out;
}

/// Maps a possibly negative axis into [0, rank) or throws ShapeError naming `op` and `shape`.
inline std::int64_t normalize_axis(std::int64_t axis, std::int64_t rank, const char* op, const Shape& shape) {
  std::int64_t r = rank == 0 ? 1 : rank;  // PyTorch accepts axis 0 / -1 on 0-dim tensors
  if (axis < -r || axis >= r)
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for shape " + shape.str() +
                     " (rank " + std::to_string(rank) + ")");
  return axis < 0 ? axis + r : axis;
}

}  // namespace kiln
