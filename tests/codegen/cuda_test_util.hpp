#pragma once
// Helpers of the CUDA tests: IR graphs over host buffers (the WORKLOADS.md workloads and every
// op x dtype), run by the reference executor and by the generated CUDA code (emulated on the
// host, or on a GPU), compared element by element with per-dtype tolerances.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
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
#include "../support/ir_build.hpp"

namespace kiln_cuda_test {

using namespace kiln;
using ir::NodePtr;
using ir::Op;
using namespace kiln_ir_build;

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
  w.push_back({"P1",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 1), y = input({M * K}, f32, 2);
                 return std::vector<NodePtr>{add(mul(cst(2.0, x), x), y)};
               },
               12});
  w.push_back({"P2",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 3);
                 NodePtr cube = mul(mul(x, x), x);
                 NodePtr inner = mul(cst(0.7978845608028654, x), add(x, mul(cst(0.044715, x), cube)));
                 return std::vector<NodePtr>{mul(mul(cst(0.5, x), x), add(cst(1.0, x), un(Op::Tanh, inner)))};
               },
               8});
  w.push_back({"P3",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 4);
                 for (int i = 0; i < 16; ++i) x = add(mul(un(Op::Sin, x), cst(1.01, x)), cst(0.5, x));
                 return std::vector<NodePtr>{x};
               },
               8});
  w.push_back(
      {"P4",
       [](std::int64_t M, std::int64_t K) {
         NodePtr X = input({M, K}, f32, 5), mu = input({M, 1}, f32, 6), s = input({K}, f32, 7), b = input({K}, f32, 8);
         return std::vector<NodePtr>{
             add(mul(sub(X, ir::broadcast(mu, X->shape)), expand(s, X->shape)), expand(b, X->shape))};
       },
       8});
  w.push_back({"R1",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr x = input({M * K}, f32, 9);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, mul(x, x), {0}), Shape{})};
               },
               4});
  w.push_back({"R2",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 10);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, X, {1}), Shape{M})};
               },
               4});
  w.push_back({"R3",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 11);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, X, {0}), Shape{K})};
               },
               4});
  w.push_back({"N1",
               [](std::int64_t M, std::int64_t K) {
                 return std::vector<NodePtr>{decomp::softmax(input({M, K}, f32, 12, {}, -1, 0, 3.0), 1)};
               },
               8});
  w.push_back({"N2",
               [](std::int64_t M, std::int64_t K) {
                 return std::vector<NodePtr>{decomp::softmax(input({M, K}, f32, 13), 1)};
               },
               8});
  w.push_back({"N3",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 14), wt = input({K}, f32, 15), b = input({K}, f32, 16);
                 return std::vector<NodePtr>{decomp::layer_norm(X, wt, b, 1e-5)};
               },
               8});
  w.push_back({"N4",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr X = input({M, K}, f32, 17), wt = input({K}, f32, 18);
                 NodePtr ms = div(red(Op::ReduceSum, mul(X, X), {1}),
                                  ir::constant(static_cast<double>(K), f32, {M, 1}, Device::cpu()));
                 return std::vector<NodePtr>{
                     mul(mul(X, ir::broadcast(un(Op::Rsqrt, add(ms, cst(1e-6, ms))), X->shape)), expand(wt, X->shape))};
               },
               8});
  w.push_back({"N5",
               [](std::int64_t M, std::int64_t K) {
                 return std::vector<NodePtr>{decomp::softmax(input({M, K}, bf16, 19), 1)};
               },
               4});
  w.push_back({"N6",
               [](std::int64_t M, std::int64_t K) {
                 NodePtr logits = input({M, K}, f32, 21);
                 std::vector<std::int64_t> t(static_cast<std::size_t>(M));
                 for (std::int64_t i = 0; i < M; ++i) t[static_cast<std::size_t>(i)] = i % 5 == 0 ? -100 : (i * 13) % K;
                 return std::vector<NodePtr>{decomp::cross_entropy(logits, input_values<std::int64_t>({M}, t), -100)};
               },
               4});
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
  return static_cast<std::size_t>(std::max<std::int64_t>(1, extent_elems(n.shape, g.output_strides[k]))) *
         itemsize(n.dtype);
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
  return static_cast<const char*>(leaf->buffer->storage->data) +
         leaf->buffer->offset * static_cast<std::int64_t>(itemsize(leaf->dtype));
}

inline backend::RunArgs args_for(const ir::Captured& c, const Outputs& o) {
  backend::RunArgs a;
  for (auto& leaf : c.leaves) a.inputs.push_back(leaf_pointer(leaf));
  a.outputs = o.pointers;
  return a;
}

/// "" when output buffers `got` match `want` element for element (within tolerance, times
/// `tol_scale`), else the first mismatch.
inline std::string compare(const ir::Graph& g, const std::vector<void*>& got, const std::vector<void*>& want,
                           double tol_scale = 1.0) {
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
      if (std::isnan(b))
        ok = std::isnan(a);
      else if (std::isinf(b))
        ok = a == b;
      else
        ok = std::fabs(a - b) <= tol_scale * (tol.atol + tol.rtol * std::fabs(b));
      if (!ok)
        return "output " + std::to_string(k) + " (" + dtype_name(n.dtype) + n.shape.str() + ") element " +
               std::to_string(i) + ": cuda " + std::to_string(a) + " vs reference " + std::to_string(b);
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

// ---- cases ------------------------------------------------------------------------------

/// A named graph to test (built on the host) and how to run it.
struct Case {
  std::string name;
  std::function<std::vector<NodePtr>()> build;
  std::vector<Strides> out_strides = {};
  bool index64 = false;  ///< force 64-bit index math
  double tol_scale = 1.0;
};

/// Whether primitive `op` is defined on dtype `dt` (the op table's flags; the reference
/// executor refuses the rest with a DTypeError).
inline bool defined_on(Op op, DType dt) {
  if (ir::has_flag(op, ir::kFloatOnly)) return is_floating(dt);
  if (ir::has_flag(op, ir::kIntOnly)) return is_integral(dt) || (dt == DType::Bool && ir::has_flag(op, ir::kBoolToo));
  if (op == Op::Fmod) return dt != DType::Bool;
  return true;
}
inline bool float_only(Op op) { return ir::has_flag(op, ir::kFloatOnly); }

/// Every unary (but cast) and binary primitive of the op table: a new primitive is covered by
/// the op x dtype tests without being listed here.
inline std::vector<Op> ops_of_kind(ir::OpKind kind) {
  std::vector<Op> v;
  for (Op op : ir::kAllOps)
    if (ir::op_kind(op) == kind && op != Op::Cast) v.push_back(op);
  return v;
}
inline const std::vector<Op> kUnaryOps = ops_of_kind(ir::OpKind::Unary);
inline const std::vector<Op> kBinaryOps = ops_of_kind(ir::OpKind::Binary);
inline const Op kReduceOps[] = {Op::ReduceSum, Op::ReduceProd, Op::ReduceMax, Op::ReduceMin, Op::ArgMax, Op::ArgMin};
inline const DType kDTypes[] = {DType::Bool,     DType::Int32,   DType::Int64,  DType::Float16,
                                DType::BFloat16, DType::Float32, DType::Float64};

/// Every primitive defined on `dt` in one graph of many outputs: unary and binary ops, where,
/// casts to every dtype, iota, random (floating dtypes), and every reduction along rows,
/// columns and everything. Odd sizes leave vector tails.
inline std::vector<NodePtr> op_batch(DType dt, std::int64_t M = 5, std::int64_t K = 37) {
  NodePtr x = input({M, K}, dt, 100 + static_cast<unsigned>(dt)),
          y = input({M, K}, dt, 200 + static_cast<unsigned>(dt));
  std::vector<NodePtr> out;
  for (Op op : kUnaryOps)
    if (defined_on(op, dt)) out.push_back(un(op, x));
  for (Op op : kBinaryOps)
    if (defined_on(op, dt)) out.push_back(ir::binary(op, x, y));
  out.push_back(ir::where(ir::binary(Op::Gt, x, y), x, y));
  for (DType to : kDTypes) out.push_back(ir::cast(x, to));
  out.push_back(add(ir::iota({M, K}, 1, dt, Device::cpu()), x));
  if (is_floating(dt)) {
    out.push_back(ir::random({M, K}, 7, 0, dt, Device::cpu()));
    out.push_back(add(ir::random({M, K}, 9, 1, dt, Device::cpu()), x));
  }
  for (Op op : kReduceOps) {
    out.push_back(red(op, x, {1}));
    out.push_back(red(op, x, {0}));
    if (op != Op::ReduceProd) out.push_back(red(op, x, {0, 1}));
  }
  return out;
}

inline std::vector<Case> op_cases() {
  std::vector<Case> v;
  for (DType dt : kDTypes) v.push_back({std::string("ops ") + dtype_name(dt), [dt] { return op_batch(dt); }});
  return v;
}

/// Layouts, index maps and every reduction strategy (for a GPU of few multiprocessors, as
/// small_target() in the emulator; a larger GPU takes other paths for some of them).
inline std::vector<Case> layout_cases() {
  std::vector<Case> v;
  v.push_back({"transposed realized input", [] {
                 return std::vector<NodePtr>{un(Op::Exp, ir::permute(input({37, 5}, f32, 1), {1, 0}))};
               }});
  v.push_back({"permute of a lazy node", [] {
                 return std::vector<NodePtr>{
                     add(ir::permute(un(Op::Exp, input({6, 5, 4}, f32, 2)), {2, 0, 1}), input({4, 6, 5}, f32, 3))};
               }});
  v.push_back({"unaligned f32 (offset 1)", [] {
                 return std::vector<NodePtr>{add(input({1001}, f32, 4, {}, -1, 1), input({1001}, f32, 5, {}, -1, 3))};
               }});
  v.push_back(
      {"f16 with tail, unaligned", [] { return std::vector<NodePtr>{un(Op::Exp, input({1003}, f16, 6, {}, -1, 1))}; }});
  v.push_back({"bf16 and f32 mixed", [] {
                 NodePtr a = input({8, 64}, bf16, 7), b = input({8, 64}, f32, 8);
                 return std::vector<NodePtr>{add(ir::cast(a, f32), b), ir::cast(mul(b, b), bf16)};
               }});
  v.push_back({"slice with step", [] {
                 return std::vector<NodePtr>{un(Op::Neg, ir::slice(un(Op::Exp, input({6, 40}, f32, 9)), 1, 3, 12, 3))};
               }});
  v.push_back({"scalar broadcast", [] {
                 NodePtr s = input({1, 1}, f32, 10), x = input({5, 37}, f32, 11);
                 return std::vector<NodePtr>{mul(ir::broadcast(s, {5, 37}), x)};
               }});
  v.push_back(
      {"concat", [] {
         NodePtr a = un(Op::Exp, input({5, 3}, f32, 12)), b = input({5, 34}, f32, 13), c = input({5, 1}, f32, 14);
         return std::vector<NodePtr>{ir::concat({a, b, c}, 1)};
       }});
  v.push_back({"concat along the outer axis of lazy pieces (clamped index beside vector lanes)", [] {
                 NodePtr src = input({2, 3, 4}, f32, 42);
                 NodePtr lazy = add(mul(src, cst(2.0, src)), cst(1.0, src));
                 return std::vector<NodePtr>{ir::concat({lazy, ir::slice(lazy, 0, 1, 1, 1)}, 0)};
               }});
  v.push_back({"uneven reshape (opaque index)", [] {
                 NodePtr r = ir::reshape(un(Op::Exp, input({6, 10}, f32, 15)), {4, 15});
                 return std::vector<NodePtr>{add(r, input({4, 15}, f32, 16)), red(Op::ReduceSum, r, {1})};
               }});
  v.push_back({"transposed output",
               [] {
                 return std::vector<NodePtr>{un(Op::Sin, input({5, 37}, f32, 17))};
               },
               {{1, 5}}});
  v.push_back({"row kernel then column kernel through a temporary", [] {
                 NodePtr X = input({33, 20}, f32, 18);
                 NodePtr mean = div(red(Op::ReduceSum, X, {1}), ir::constant(20.0, f32, {33, 1}, Device::cpu()));
                 NodePtr d = sub(X, ir::broadcast(mean, X->shape));
                 return std::vector<NodePtr>{red(Op::ReduceSum, mul(d, d), {0})};
               }});
  v.push_back({"column softmax (two phases)", [] {
                 return std::vector<NodePtr>{softmax_ir(input({37, 20}, f32, 19), 0)};
               }});
  v.push_back(
      {"column sums then their sum (final)", [] {
         return std::vector<NodePtr>{red(Op::ReduceSum, red(Op::ReduceSum, input({37, 20}, f32, 20), {0}), {1})};
       }});
  v.push_back({"column split over blocks", [] {
                 return std::vector<NodePtr>{red(Op::ReduceSum, input({1000, 64}, f32, 21), {0})};
               }});
  v.push_back({"column split argmax and max", [] {
                 NodePtr X = input({1000, 64}, f32, 22);
                 return std::vector<NodePtr>{red(Op::ArgMax, X, {0}), red(Op::ReduceMax, X, {0})};
               }});
  v.push_back(
      {"column split with a final", [] {
         return std::vector<NodePtr>{red(Op::ReduceSum, red(Op::ReduceSum, input({1000, 64}, f32, 23), {0}), {1})};
       }});
  v.push_back({"middle axis (column, outer kept)", [] {
                 return std::vector<NodePtr>{red(Op::ReduceSum, input({4, 6, 8}, f32, 24), {1})};
               }});
  v.push_back({"two non-adjacent axes", [] {
                 return std::vector<NodePtr>{red(Op::ReduceSum, input({4, 6, 8}, f32, 25), {0, 2})};
               }});
  v.push_back({"split row: full sum and argmin", [] {
                 NodePtr x = input({20000}, f32, 26);
                 return std::vector<NodePtr>{red(Op::ReduceSum, mul(x, x), {0}), red(Op::ArgMin, x, {0})};
               }});
  v.push_back(
      {"split rows with a final", [] {
         NodePtr X = input({2, 10000}, f32, 27);
         return std::vector<NodePtr>{red(Op::ReduceSum, red(Op::ReduceSum, X, {1}), {0}), red(Op::ReduceMax, X, {1})};
       }});
  v.push_back({"argmax of row sums (arg final)", [] {
                 return std::vector<NodePtr>{red(Op::ArgMax, red(Op::ReduceSum, input({40, 30}, f32, 28), {1}), {0})};
               }});
  v.push_back({"long rows: row in shared memory", [] {
                 return std::vector<NodePtr>{softmax_ir(input({2, 40000}, f32, 29), 1)};
               }});
  v.push_back({"very long rows: read per pass", [] {
                 return std::vector<NodePtr>{softmax_ir(input({2, 70000}, f32, 30), 1)};
               }});
  v.push_back({"layer_norm with mean and rstd as outputs", [] {
                 NodePtr X = input({9, 300}, f32, 31);
                 NodePtr mean = div(red(Op::ReduceSum, X, {1}), ir::constant(300.0, f32, {9, 1}, Device::cpu()));
                 NodePtr d = sub(X, ir::broadcast(mean, X->shape));
                 NodePtr var = div(red(Op::ReduceSum, mul(d, d), {1}), ir::constant(300.0, f32, {9, 1}, Device::cpu()));
                 NodePtr rstd = un(Op::Rsqrt, add(var, ir::constant(1e-5, f32, {9, 1}, Device::cpu())));
                 return std::vector<NodePtr>{mul(d, ir::broadcast(rstd, X->shape)), mean, rstd};
               }});
  v.push_back({"special values: NaN, Inf, -0 through max, argmax, sum", [] {
                 const float nan = std::numeric_limits<float>::quiet_NaN(),
                             inf = std::numeric_limits<float>::infinity();
                 std::vector<float> vals = {1, nan, 3, -inf, inf, -0.0f, 0.0f, 2, 2, -1, nan, 5, 7, 7, -2, 1};
                 NodePtr X = input_values<float>({4, 4}, vals);
                 return std::vector<NodePtr>{red(Op::ReduceMax, X, {1}),
                                             red(Op::ArgMax, X, {1}),
                                             red(Op::ReduceMin, X, {0}),
                                             red(Op::ArgMin, X, {0}),
                                             red(Op::ReduceSum, X, {1}),
                                             ir::cast(X, i32),
                                             ir::cast(X, f16)};
               }});
  v.push_back({"long-row softmax with -inf, all -inf, NaN and +inf rows (online max and sum)", [] {
                 const float nan = std::numeric_limits<float>::quiet_NaN(),
                             inf = std::numeric_limits<float>::infinity();
                 const std::int64_t K = 40000;
                 std::vector<float> vals(static_cast<std::size_t>(5 * K));
                 std::mt19937 rng(41);
                 std::normal_distribution<float> nd;
                 for (auto& x : vals) x = 3 * nd(rng);
                 for (std::int64_t j = 0; j < 100; ++j)
                   vals[static_cast<std::size_t>(j)] = -inf;  // row 0 starts at -inf
                 for (std::int64_t j = 0; j < K; ++j) vals[static_cast<std::size_t>(K + j)] = -inf;  // row 1 all -inf
                 vals[static_cast<std::size_t>(2 * K + 7)] = nan;
                 vals[static_cast<std::size_t>(3 * K + 12345)] = inf;
                 vals[static_cast<std::size_t>(4 * K + K - 1)] = 80.0f;  // the max arrives last
                 NodePtr X = input_values<float>({5, K}, vals);
                 return std::vector<NodePtr>{decomp::softmax(X, 1), decomp::log_softmax(X, 1)};
               }});
  v.push_back({"empty shapes", [] {
                 NodePtr E = input({0, 5}, f32, 32), z = input({0}, f32, 33);
                 return std::vector<NodePtr>{red(Op::ReduceSum, E, {1}), red(Op::ReduceSum, E, {0}),
                                             red(Op::ReduceMax, E, {0}), un(Op::Exp, z)};
               }});
  v.push_back(
      {"0-dim", [] {
         NodePtr a = input({}, f32, 34), b = input({}, f32, 35);
         return std::vector<NodePtr>{add(un(Op::Exp, a), b), red(Op::ReduceSum, input({1, 1}, f64, 36), {0, 1})};
       }});
  v.push_back({"64-bit index math (forced)",
               [] {
                 NodePtr X = input({33, 70}, f32, 37);
                 return std::vector<NodePtr>{softmax_ir(X, 1), red(Op::ReduceSum, X, {0}), add(X, X)};
               },
               {},
               true});
  v.push_back({"integer sums wrap, bool max", [] {
                 NodePtr a = input({8, 300}, i64, 38), b = input({8, 300}, bool_, 39), c = input({8, 300}, i32, 40);
                 return std::vector<NodePtr>{red(Op::ReduceSum, mul(a, a), {1}), red(Op::ReduceMax, b, {1}),
                                             red(Op::ReduceProd, c, {1}), red(Op::ArgMax, c, {0})};
               }});
  return v;
}

}  // namespace kiln_cuda_test
