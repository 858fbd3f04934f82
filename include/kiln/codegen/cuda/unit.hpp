#pragma once
// A schedule's CUDA translation unit: each kernel written by the writer of its kind (the kind
// decided here, from the schedule and the target), then the prelude the kernels need.
#include <string>
#include <vector>

#include "kiln/codegen/cuda/columns.hpp"
#include "kiln/codegen/cuda/kinds.hpp"
#include "kiln/codegen/cuda/pointwise.hpp"
#include "kiln/codegen/cuda/prelude.hpp"
#include "kiln/codegen/cuda/rows.hpp"
#include "kiln/codegen/cuda/split_rows.hpp"
#include "kiln/core/generated.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {
namespace cuda_detail {

/// The kernels' argument struct (see CudaSource).
inline std::string args_struct(const CudaSource& unit) {
  return "struct kiln_args { void* p[" + std::to_string(unit.num_args) + "];" + (unit.symbolic ? " long long n;" : "") +
         " };\n";
}

/// Writes kernel `kid` of `s` with the writer of kind K: plan, then print.
template <class K>
CudaKernelInfo write_kind(const ir::Graph& g, const sched::Schedule& s, int kid, const CudaTarget& target,
                          const CudaAlignment& align, Needs& needs, std::size_t scratch_offset, const std::string& name,
                          std::string& code, std::size_t& scratch) {
  K w(g, s, kid, target, align, needs, scratch_offset);
  w.begin(name);
  w.print(w.plan());
  return w.finish_kernel(code, scratch);
}

/// Writes kernel `kid` of `s` with the writer its kind takes (cuda_kernel_kind).
inline CudaKernelInfo write_kernel(const ir::Graph& g, const sched::Schedule& s, int kid, const CudaTarget& target,
                                   const CudaAlignment& align, Needs& needs, std::size_t scratch_offset,
                                   const std::string& name, std::string& code, std::size_t& scratch) {
  switch (cuda_kernel_kind(s, kid, target)) {
    case CudaKernelKind::Pointwise:
      return write_kind<PointwiseKernel>(g, s, kid, target, align, needs, scratch_offset, name, code, scratch);
    case CudaKernelKind::Rows:
      return write_kind<RowKernel>(g, s, kid, target, align, needs, scratch_offset, name, code, scratch);
    case CudaKernelKind::SplitRows:
      return write_kind<SplitRowKernel>(g, s, kid, target, align, needs, scratch_offset, name, code, scratch);
    case CudaKernelKind::Columns:
      return write_kind<ColumnKernel>(g, s, kid, target, align, needs, scratch_offset, name, code, scratch);
  }
  throw InternalError("kiln CUDA codegen: kernel " + std::to_string(kid) + " of no known kind");
}

}  // namespace cuda_detail

/// The argument count of every kernel generated for `g` and `s` (see CudaSource).
inline std::size_t cuda_num_args(const ir::Graph& g, const sched::Schedule& s) {
  return g.num_leaves() + g.outputs.size() + s.temps.size() + 1;
}

/// CUDA source for every kernel of `s` (a schedule of `g`) in one unit, for `target`; kernel i
/// is `<prefix>_<i>`. `align` says which leaves and outputs are 16-byte aligned (vector access
/// needs it). Throws DTypeError for a primitive on a dtype it is not defined for.
inline CudaSource generate_cuda(const ir::Graph& g, const sched::Schedule& s, const std::string& prefix,
                                const std::vector<CudaTarget>& per_kernel, const CudaAlignment& align = {});

inline CudaSource generate_cuda(const ir::Graph& g, const sched::Schedule& s, const std::string& prefix,
                                const CudaTarget& target = CudaTarget::sm90(), const CudaAlignment& align = {}) {
  return generate_cuda(g, s, prefix, std::vector<CudaTarget>(s.kernels.size(), target), align);
}

/// The same, kernel k generated with per_kernel[k]'s tuning knobs (max-autotune's choice per
/// kernel); the targets differ only in knobs, never in the device.
inline CudaSource generate_cuda(const ir::Graph& g, const sched::Schedule& s, const std::string& prefix,
                                const std::vector<CudaTarget>& per_kernel, const CudaAlignment& align) {
  if (per_kernel.size() != s.kernels.size())
    throw Error("kiln codegen: " + std::to_string(per_kernel.size()) + " CUDA targets for " +
                std::to_string(s.kernels.size()) + " kernels");
  cuda_detail::Needs needs;
  CudaSource out;
  out.num_args = cuda_num_args(g, s);
  std::string body;
  for (std::size_t k = 0; k < s.kernels.size(); ++k) {
    std::string name = prefix + "_" + std::to_string(k);
    std::string code;
    std::size_t scratch = 0;
    out.kernels.push_back(cuda_detail::write_kernel(g, s, static_cast<int>(k), per_kernel[k], align, needs,
                                                    out.scratch_bytes, name, code, scratch));
    out.kernels.back().code_hash = kiln::detail::hash_string(code);
    out.scratch_bytes += (scratch + 15) / 16 * 16;
    body += code;
  }
  std::string& src = out.source;
  src = "// kiln generated CUDA kernels\n";
  src +=
      "#ifndef KILN_EXTERN_SMEM\n#define KILN_EXTERN_SMEM(name) extern __shared__ __align__(16) unsigned char "
      "name[]\n#endif\n";
  out.symbolic = s.symbolic != 0;
  src += cuda_detail::args_struct(out);
  src += cuda_detail::kCudaBase;
  if (needs.half) src += cuda_detail::kCudaHalf;
  if (needs.bf16) src += cuda_detail::kCudaBf16;
  if (needs.ints) src += cuda_detail::kCudaInts;
  if (needs.gather)
    src += c_family::gather_prelude("__device__", "__noinline__",
                                    "(long long)atomicCAS((unsigned long long*)r, 0ull, 1ull)");
  c_family::append_kernels(src, needs, body);
  return out;
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
