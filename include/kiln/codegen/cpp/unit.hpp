#pragma once
// A schedule's C++/OpenMP translation unit: one entry per kernel (and optionally one for the
// whole graph), then the prelude the kernels need.
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/codegen/cpp/pointwise.hpp"
#include "kiln/codegen/cpp/reductions.hpp"
#include "kiln/core/generated.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// Generated source for one graph.
struct CppSource {
  std::string source;                ///< the whole translation unit
  std::vector<std::string> entries;  ///< exported symbol of each kernel, in schedule order
  std::string graph_entry;           ///< exported symbol running every kernel in order (when asked for)
};

/// What generate_cpp writes besides the per-kernel entries.
struct CppOptions {
  /// Also export `<prefix>_graph` (a CpuKernelFn): every kernel in schedule order inside one
  /// OpenMP parallel region, with a barrier between kernels ("reduce-overhead" on the CPU).
  bool graph_entry = false;
  /// When >= 0, only that kernel is written (a variant of one kernel, e.g. another chunking,
  /// compiled on its own); entries then holds its one symbol.
  int only_kernel = -1;
  /// With only_kernel, a pointwise kernel's shared loop is dealt round-robin in this many
  /// pieces (`schedule(static, extent/pieces)`) instead of one contiguous block per thread
  /// (0 or 1): an autotuning candidate.
  std::int64_t pointwise_pieces = 0;
};

/// The calling convention of every generated kernel: `args` holds the graph's leaf pointers
/// (leaf order), then its output pointers, then the temporaries, then (schedules with a
/// symbolic size) a `const long long*` to that size; `nthreads` sizes the OpenMP team of
/// parallel loops.
using CpuKernelFn = void (*)(void* const* args, int nthreads);

/// C++/OpenMP source for every kernel of `s` (a schedule of `g`) in one translation unit.
/// Kernel i is exported as `<prefix>_<i>` (and, with options.graph_entry, the whole graph as
/// `<prefix>_graph`). Throws DTypeError for a primitive on a dtype it is
/// not defined for (as the reference executor does).
inline CppSource generate_cpp(const ir::Graph& g, const sched::Schedule& s, const std::string& prefix,
                              const CppOptions& options = {}) {
  detail::Needs needs;
  CppSource out;
  std::string body;
  std::string graph_alloc, graph_calls, serial_calls, graph_free;
  bool any_ws = false;
  for (std::size_t k = 0; k < s.kernels.size(); ++k) {
    if (options.only_kernel >= 0 && static_cast<int>(k) != options.only_kernel) continue;
    std::string name = prefix + "_" + std::to_string(k);
    detail::KernelWriter w(g, s, static_cast<int>(k), needs);
    if (options.only_kernel >= 0) w.pointwise_pieces_ = options.pointwise_pieces;
    body += w.write(name);
    out.entries.push_back(std::move(name));
    const std::string var = "s" + std::to_string(k);
    graph_alloc += w.scratch_alloc(var);
    graph_free += w.scratch_free(var);
    // The barrier between kernels: a later kernel may read what this one wrote.
    if (k > 0) graph_calls += "    #pragma omp barrier\n";
    graph_calls += "    " + w.body_name() + "(args, " + var + ");\n";
    serial_calls += "    " + w.body_name() + "(args, " + var + ");\n";
    any_ws = any_ws || w.worksharing();
  }
  if (options.graph_entry && options.only_kernel < 0) {
    out.graph_entry = prefix + "_graph";
    // One parallel region for the whole graph, when any kernel shares its loops; otherwise
    // the kernels simply run one after another on the calling thread.
    body += "extern \"C\" void " + out.graph_entry + "(void* const* args, int nth) {\n  (void)nth;\n" + graph_alloc;
    if (any_ws) {
      body += "  #pragma omp parallel num_threads(nth)\n  {\n" + graph_calls + "  }\n";
    } else {
      body += "  {\n" + serial_calls + "  }\n";
    }
    body += graph_free + "}\n";
  }
  std::string& src = out.source;
  src = "// kiln generated CPU kernels\n";
  // Lets GCC if-convert selects whose arms hold floating-point arithmetic (trapping math only
  // concerns floating-point exception flags, which kiln never reads; values are unchanged).
  src += "#pragma GCC optimize(\"no-trapping-math\")\n";
  src += "static inline long long kiln_iclamp(long long x, long long hi) { return x < 0 ? 0 : x > hi ? hi : x; }\n";
  if (needs.ints) src += detail::kIntHelpers;
  if (needs.gather)
    src += c_family::gather_prelude("", "__attribute__((noinline, cold))",
                                    "__atomic_exchange_n(&r[0], 1LL, __ATOMIC_ACQ_REL)");
  if (needs.half) src += detail::kHalfHelpers;
  if (needs.bf16) src += detail::kBf16Helpers;
  if (needs.math) {
    src += kCpuMathSource;
    src += "\n";
  }
  if (needs.stream) src += detail::kStreamHelpers;
  c_family::append_kernels(src, needs, body);
  return out;
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
