#pragma once
// Helpers of the CPU JIT tests: graphs over host buffers, run through run_cpu_jit and the
// reference executor, compared element by element with per-dtype tolerances.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/cpu_jit.hpp"
#include "kiln/backend/reference.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/ir/builder.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/host_allocator.hpp"

namespace kiln_jit_test {

using namespace kiln;
using ir::NodePtr;
using ir::Op;

inline Device cpu() { return Device::cpu(); }

/// A realized leaf of `shape` and `dtype` filled with values from `seed` (normal floats,
/// small integers, random bools), viewed with `strides` over a buffer of `alloc` elements.
inline NodePtr input(const Shape& shape, DType dt, unsigned seed, Strides strides = {}, std::int64_t alloc = -1,
                     std::int64_t offset = 0, double scale = 1.0) {
  if (strides.empty()) strides = contiguous_strides(shape);
  if (alloc < 0) alloc = shape.numel() + offset;
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
  return ir::input(ir::BufferView{st, offset, std::move(strides)}, shape, dt, cpu());
}

/// A leaf holding exactly `values` (row-major, contiguous).
template <class T>
inline NodePtr input_values(const Shape& shape, const std::vector<T>& values) {
  DType dt = dtype_v<T>;
  auto st = runtime::allocate_host(std::max<std::size_t>(1, values.size()) * sizeof(T));
  if (!values.empty()) std::memcpy(st->data, values.data(), values.size() * sizeof(T));
  return ir::input(ir::BufferView{st, 0, contiguous_strides(shape)}, shape, dt, cpu());
}

inline NodePtr cst(double v, const NodePtr& like) { return ir::constant(v, like->dtype, like->shape, cpu()); }
inline NodePtr add(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Add, a, b); }
inline NodePtr sub(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Sub, a, b); }
inline NodePtr mul(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Mul, a, b); }
inline NodePtr div(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Div, a, b); }
inline NodePtr un(Op op, const NodePtr& a) { return ir::unary(op, a); }
inline NodePtr red(Op op, const NodePtr& a, std::vector<std::int64_t> axes) {
  return ir::reduce(op, a, std::move(axes));
}
/// Broadcast `x` (same rank, or fewer dims: leading 1s added) to `shape`.
inline NodePtr expand(const NodePtr& x, const Shape& shape) {
  NodePtr r = x;
  if (r->shape.size() < shape.size()) {
    Shape s(shape.size() - r->shape.size(), 1);
    s.insert(s.end(), r->shape.begin(), r->shape.end());
    r = ir::reshape(r, s);
  }
  return ir::broadcast(r, shape);
}

/// Output buffers of one run.
struct Outputs {
  std::vector<StoragePtr> buffers;
  std::vector<void*> pointers;
};

inline std::int64_t extent_elems(const Shape& shape, const Strides& strides) {
  std::int64_t hi = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) hi += (shape[d] - 1) * std::max<std::int64_t>(0, strides[d]);
  return shape.numel() == 0 ? 0 : hi + 1;
}

inline Outputs make_outputs(const ir::Graph& g, unsigned char fill) {
  Outputs o;
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(g.outputs[k])];
    std::size_t bytes =
        static_cast<std::size_t>(std::max<std::int64_t>(1, extent_elems(n.shape, g.output_strides[k]))) *
        itemsize(n.dtype);
    o.buffers.push_back(runtime::allocate_host(bytes));
    std::memset(o.buffers.back()->data, fill, bytes);
    o.pointers.push_back(o.buffers.back()->data);
  }
  return o;
}

inline backend::RunArgs args_for(const ir::Captured& c, const Outputs& o) {
  backend::RunArgs a;
  for (auto& leaf : c.leaves)
    a.inputs.push_back(static_cast<const char*>(leaf->buffer->storage->data) +
                       leaf->buffer->offset * static_cast<std::int64_t>(itemsize(leaf->dtype)));
  a.outputs = o.pointers;
  return a;
}

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

/// Result of comparing one run of the JIT with the reference.
struct Check {
  std::uint64_t launches = 0;  ///< kernels the JIT launched
  std::size_t kernels = 0;     ///< kernels in the schedule
  std::string mismatch;        ///< empty when every element agrees
  std::string schedule;
};

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

/// Runs `roots` (captured together) through run_cpu_jit and run_reference and compares.
/// `out_strides` (optional, per output) makes the outputs strided views.
inline Check run_both(const std::vector<NodePtr>& roots, std::vector<Strides> out_strides = {},
                      double tol_scale = 1.0) {
  ir::Captured c = ir::capture(roots, cpu());
  if (!out_strides.empty()) {
    for (std::size_t k = 0; k < out_strides.size(); ++k)
      if (!out_strides[k].empty()) c.graph.output_strides[k] = out_strides[k];
    c.graph.rehash();
  }
  c.graph.verify();
  Check r;
  sched::Schedule s = sched::schedule(c.graph);
  r.kernels = s.kernels.size();
  r.schedule = s.str(c.graph);
  Outputs jit = make_outputs(c.graph, 0xAB), ref = make_outputs(c.graph, 0xAB);
  auto before = stats().launches;
  backend::run_cpu_jit(c.graph, args_for(c, jit));
  r.launches = stats().launches - before;
  backend::run_reference(c.graph, args_for(c, ref));
  for (std::size_t k = 0; k < c.graph.outputs.size() && r.mismatch.empty(); ++k) {
    const ir::GraphNode& n = c.graph.nodes[static_cast<std::size_t>(c.graph.outputs[k])];
    const Strides& st = c.graph.output_strides[k];
    Tol tol = default_tol(n.dtype);
    std::vector<std::int64_t> idx(n.shape.size(), 0);
    for (std::int64_t i = 0; i < n.shape.numel(); ++i) {
      std::int64_t off = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
      double a = as_double(jit.pointers[k], off, n.dtype), b = as_double(ref.pointers[k], off, n.dtype);
      bool ok;
      if (std::isnan(b))
        ok = std::isnan(a);
      else if (std::isinf(b))
        ok = a == b;
      else
        ok = std::fabs(a - b) <= tol_scale * (tol.atol + tol.rtol * std::fabs(b));
      if (!ok) {
        r.mismatch = "output " + std::to_string(k) + " (" + dtype_name(n.dtype) + n.shape.str() + ") element " +
                     std::to_string(i) + ": jit " + std::to_string(a) + " vs reference " + std::to_string(b) + "\n" +
                     c.graph.str() + r.schedule;
        break;
      }
      for (std::size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < n.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  return r;
}

}  // namespace kiln_jit_test
