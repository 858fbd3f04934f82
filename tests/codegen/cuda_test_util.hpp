#pragma once
// Helpers of the CUDA tests: IR graphs over host buffers (the WORKLOADS.md workloads and every
// op x dtype), run by the reference executor and by the generated CUDA code (emulated on the
// host, or on a GPU), compared element by element with per-dtype tolerances.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/backend/reference.hpp"
#include "kiln/codegen/cuda.hpp"
#include "kiln/decomp/decompose.hpp"
#include "kiln/ir/builder.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln_cuda_test {

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
      if constexpr (std::is_same_v<T, bool>) p[i] = (rng() & 1) != 0;
      else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(static_cast<int>(rng() % 19) - 9);
      else p[i] = T(static_cast<float>(nd(rng) * scale));
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
inline NodePtr red(Op op, const NodePtr& a, std::vector<std::int64_t> axes) { return ir::reduce(op, a, std::move(axes)); }
inline NodePtr expand(const NodePtr& x, const Shape& shape) { return decomp::expand(x, shape); }

inline NodePtr softmax_ir(const NodePtr& x, std::int64_t axis) {
  NodePtr m = ir::broadcast(red(Op::ReduceMax, x, {axis}), x->shape);
  NodePtr e = un(Op::Exp, sub(x, m));
  return div(e, ir::broadcast(red(Op::ReduceSum, e, {axis}), x->shape));
}

/// One workload of WORKLOADS.md at IR level (f32 unless said), for rows M and columns K
/// (pointwise and full reductions use N = M * K elements).
struct Workload {
  const char* id;
  std::function<std::vector<NodePtr>(std::int64_t M, std::int64_t K)> build;
  double bytes_per_element;  ///< WORKLOADS.md's "bytes" over M*K (N for 1-D ones)
};

inline std::vector<Workload> workloads() {
  std::vector<Workload> w;
  w.push_back({"P1", [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 1), y = input({M * K}, f32, 2);
                 return std::vector<NodePtr>{add(mul(cst(2.0, x), x), y)};
               }, 12});
  w.push_back({"P2", [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 3);
                 NodePtr cube = mul(mul(x, x), x);
                 NodePtr inner = mul(cst(0.7978845608028654, x), add(x, mul(cst(0.044715, x), cube)));
                 return std::vector<NodePtr>{mul(mul(cst(0.5, x), x), add(cst(1.0, x), un(Op::Tanh, inner)))};
               }, 8});
  w.push_back({"P3", [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 4);
                 for (int i = 0; i < 16; ++i) x = add(mul(un(Op::Sin, x), cst(1.01, x)), cst(0.5, x));
                 return std::vector<NodePtr>{x};
               }, 8});
  w.push_back({"P4", [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 5), mu = input({M, 1}, f32, 6), s = input({K}, f32, 7), b = input({K}, f32, 8);
                 return std::vector<NodePtr>{add(mul(sub(X, ir::broadcast(mu, X->shape)), expand(s, X->shape)), expand(b, X->shape))};
               }, 8});
  w.push_back({"R1", [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 9);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, mul(x, x), {0}), Shape{})};
               }, 4});
  w.push_back({"R2", [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 10);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, X, {1}), Shape{M})};
               }, 4});
  w.push_back({"R3", [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 11);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, X, {0}), Shape{K})};
               }, 4});
  w.push_back({"N1", [](std::int64_t M, std::int64_t K) { return std::vector<NodePtr>{decomp::softmax(input({M, K}, f32, 12, {}, -1, 0, 3.0), 1)}; }, 8});
  w.push_back({"N2", [](std::int64_t M, std::int64_t K) { return std::vector<NodePtr>{decomp::softmax(input({M, K}, f32, 13), 1)}; }, 8});
  w.push_back({"N3", [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 14), wt = input({K}, f32, 15), b = input({K}, f32, 16);
                 return std::vector<NodePtr>{decomp::layer_norm(X, wt, b, 1e-5)};
               }, 8});
  w.push_back({"N4", [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 17), wt = input({K}, f32, 18);
                 NodePtr ms = div(red(Op::ReduceSum, mul(X, X), {1}), ir::constant(static_cast<double>(K), f32, {M, 1}, Device::cpu()));
                 return std::vector<NodePtr>{mul(mul(X, ir::broadcast(un(Op::Rsqrt, add(ms, cst(1e-6, ms))), X->shape)), expand(wt, X->shape))};
               }, 8});
  w.push_back({"N5", [](std::int64_t M, std::int64_t K) { return std::vector<NodePtr>{decomp::softmax(input({M, K}, bf16, 19), 1)}; }, 4});
  w.push_back({"N6", [](std::int64_t M, std::int64_t K) {
                 NodePtr logits = input({M, K}, f32, 21);
                 std::vector<std::int64_t> t(static_cast<std::size_t>(M));
                 for (std::int64_t i = 0; i < M; ++i) t[static_cast<std::size_t>(i)] = i % 5 == 0 ? -100 : (i * 13) % K;
                 return std::vector<NodePtr>{decomp::cross_entropy(logits, input_values<std::int64_t>({M}, t), -100)};
               }, 4});
  return w;
}

/// Output buffers of one run on the host, pre-filled with `fill` bytes (unwritten elements show).
struct Outputs {
  std::vector<StoragePtr> buffers;
  std::vector<void*> pointers;
};

inline std::int64_t extent_elems(const Shape& shape, const Strides& strides) {
  std::int64_t hi = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) hi += (shape[d] - 1) * std::max<std::int64_t>(0, strides[d]);
  return shape.numel() == 0 ? 0 : hi + 1;
}

inline std::size_t output_bytes(const ir::Graph& g, std::size_t k) {
  const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(g.outputs[k])];
  return static_cast<std::size_t>(std::max<std::int64_t>(1, extent_elems(n.shape, g.output_strides[k]))) * itemsize(n.dtype);
}

inline Outputs make_outputs(const ir::Graph& g, unsigned char fill) {
  Outputs o;
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    std::size_t bytes = output_bytes(g, k);
    o.buffers.push_back(runtime::allocate_host(bytes));
    std::memset(o.buffers.back()->data, fill, bytes);
    o.pointers.push_back(o.buffers.back()->data);
  }
  return o;
}

inline const void* leaf_pointer(const NodePtr& leaf) {
  return static_cast<const char*>(leaf->buffer->storage->data) + leaf->buffer->offset * static_cast<std::int64_t>(itemsize(leaf->dtype));
}

inline backend::RunArgs args_for(const ir::Captured& c, const Outputs& o) {
  backend::RunArgs a;
  for (auto& leaf : c.leaves) a.inputs.push_back(leaf_pointer(leaf));
  a.outputs = o.pointers;
  return a;
}

struct Tol {
  double rtol, atol;
};
inline Tol default_tol(DType t) {
  switch (t) {
    case DType::Float16: return {2e-3, 1e-5};
    case DType::BFloat16: return {1.6e-2, 1e-5};
    case DType::Float32: return {2e-5, 1e-6};
    case DType::Float64: return {1e-12, 1e-14};
    default: return {0, 0};
  }
}

inline double as_double(const void* base, std::int64_t off, DType dt) {
  double v = 0;
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const T x = static_cast<const T*>(base)[off];
    if constexpr (std::is_same_v<T, bool>) v = x ? 1.0 : 0.0;
    else if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>) v = static_cast<double>(x);
    else v = static_cast<double>(static_cast<float>(x));
  });
  return v;
}

/// "" when output buffers `got` match `want` element for element (within tolerance, times
/// `tol_scale`), else the first mismatch.
inline std::string compare(const ir::Graph& g, const std::vector<void*>& got, const std::vector<void*>& want, double tol_scale = 1.0) {
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(g.outputs[k])];
    const Strides& st = g.output_strides[k];
    Tol tol = default_tol(n.dtype);
    std::vector<std::int64_t> idx(n.shape.size(), 0);
    for (std::int64_t i = 0; i < n.shape.numel(); ++i) {
      std::int64_t off = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
      double a = as_double(got[k], off, n.dtype), b = as_double(want[k], off, n.dtype);
      bool ok;
      if (std::isnan(b)) ok = std::isnan(a);
      else if (std::isinf(b)) ok = a == b;
      else ok = std::fabs(a - b) <= tol_scale * (tol.atol + tol.rtol * std::fabs(b));
      if (!ok)
        return "output " + std::to_string(k) + " (" + dtype_name(n.dtype) + n.shape.str() + ") element " + std::to_string(i) +
               ": cuda " + std::to_string(a) + " vs reference " + std::to_string(b);
      for (std::size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < n.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  return {};
}

/// Captures `roots` on the host, optionally with strided outputs.
inline ir::Captured capture(const std::vector<NodePtr>& roots, const std::vector<Strides>& out_strides = {}) {
  ir::Captured c = ir::capture(roots, Device::cpu());
  if (!out_strides.empty()) {
    for (std::size_t k = 0; k < out_strides.size(); ++k)
      if (!out_strides[k].empty()) c.graph.output_strides[k] = out_strides[k];
    c.graph.rehash();
  }
  c.graph.verify();
  return c;
}

}  // namespace kiln_cuda_test
