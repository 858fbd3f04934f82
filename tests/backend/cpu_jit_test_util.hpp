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
#include "../support/ir_build.hpp"

namespace kiln_jit_test {

using namespace kiln;
using ir::NodePtr;
using ir::Op;
using namespace kiln_ir_build;

inline Device cpu() { return Device::cpu(); }

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

/// Result of comparing one run of the JIT with the reference.
struct Check {
  std::uint64_t launches = 0;  ///< kernels the JIT launched
  std::size_t kernels = 0;     ///< kernels in the schedule
  std::string mismatch;        ///< empty when every element agrees
  std::string schedule;
};

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
