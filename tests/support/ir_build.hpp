#pragma once
// Graph building blocks for tests that drive the IR directly (the CPU JIT's and the CUDA code
// generator's tests): realized host leaves with seeded values, one-line op constructors, the
// per-dtype tolerance and the element reader their comparisons use.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kiln/decomp/decompose.hpp"
#include "kiln/ir/builder.hpp"
#include "kiln/runtime/host_allocator.hpp"

namespace kiln_ir_build {

using namespace kiln;
using ir::NodePtr;
using ir::Op;

/// A realized host leaf of `shape` and `dtype` (normal floats times `scale`, small integers,
/// random bools), viewed with `strides` (default contiguous) from element `offset` of a buffer
/// of `alloc` elements (default: just enough).
inline NodePtr input(const Shape& shape, DType dt, unsigned seed, Strides strides = {}, std::int64_t alloc = -1,
                     std::int64_t offset = 0, double scale = 1.0) {
  if (strides.empty()) strides = contiguous_strides(shape);
  if (alloc < 0) {
    std::int64_t hi = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) hi += (shape[d] - 1) * std::max<std::int64_t>(0, strides[d]);
    alloc = shape.numel() == 0 ? offset : offset + hi + 1;
  }
  auto st = runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(1, alloc)) * itemsize(dt));
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(st->data);
    for (std::int64_t i = 0; i < alloc; ++i) {
      if constexpr (std::is_same_v<T, bool>)
        p[i] = (rng() & 1) != 0;
      else if constexpr (std::is_integral_v<T>)
        p[i] = static_cast<T>(static_cast<int>(rng() % 19) - 9);
      else
        p[i] = T(static_cast<float>(nd(rng) * scale));
    }
  });
  return ir::input(ir::BufferView{st, offset, std::move(strides)}, shape, dt, Device::cpu());
}

/// A host leaf holding exactly `values` (row-major).
template <class T>
inline NodePtr input_values(const Shape& shape, const std::vector<T>& values) {
  auto st = runtime::allocate_host(std::max<std::size_t>(1, values.size()) * sizeof(T));
  if (!values.empty()) std::memcpy(st->data, values.data(), values.size() * sizeof(T));
  return ir::input(ir::BufferView{st, 0, contiguous_strides(shape)}, shape, dtype_v<T>, Device::cpu());
}

inline NodePtr cst(double v, const NodePtr& like) { return ir::constant(v, like->dtype, like->shape, Device::cpu()); }
inline NodePtr add(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Add, a, b); }
inline NodePtr sub(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Sub, a, b); }
inline NodePtr mul(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Mul, a, b); }
inline NodePtr div(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Div, a, b); }
inline NodePtr un(Op op, const NodePtr& a) { return ir::unary(op, a); }
inline NodePtr red(Op op, const NodePtr& a, std::vector<std::int64_t> axes) {
  return ir::reduce(op, a, std::move(axes));
}
inline NodePtr expand(const NodePtr& x, const Shape& shape) { return decomp::expand(x, shape); }

struct Tol {
  double rtol, atol;
};
inline Tol default_tol(DType t) {
  switch (t) {
    case DType::Float16:
      return {2e-3, 1e-5};
    case DType::BFloat16:
      return {1.6e-2, 1e-5};
    case DType::Float32:
      return {2e-5, 1e-6};
    case DType::Float64:
      return {1e-12, 1e-14};
    default:
      return {0, 0};
  }
}

inline double as_double(const void* base, std::int64_t off, DType dt) {
  double v = 0;
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const T x = static_cast<const T*>(base)[off];
    if constexpr (std::is_same_v<T, bool>)
      v = x ? 1.0 : 0.0;
    else if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>)
      v = static_cast<double>(x);
    else
      v = static_cast<double>(static_cast<float>(x));
  });
  return v;
}

}  // namespace kiln_ir_build
