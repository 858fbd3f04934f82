#pragma once
// Source of a scatter step (sched::ScatterCall) in the C++ and CUDA dialects: out = base (or
// a constant), then src written or added where index says along the axis. Every index is
// checked before anything is written (an IndexError, nothing written). Shapes and strides are
// baked into the text, as in the fused kernels.
//
// Deterministic (the default): the positions off the axis are shared among threads and each
// walks the axis in index order, so repeated indices are written (or summed) in the order of
// their positions, as the reference does, with the same bits on every run; no two threads
// touch one output element. On a GPU, an index that is one row of positions is counting-sorted
// by target instead, and one thread per output element applies its run in position order
// (generate_cuda_sorted_runs). Atomic (opt-in, GPU, f32/f64/int32/int64): a row index's runs
// are linked lists summed in the order their atomics linked them; any other index is added one
// element a thread with atomicAdd, in whatever order the hardware gives.
#include <string>
#include <vector>

#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/codegen/cpp/dialect.hpp"
#include "kiln/codegen/cuda/prelude.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// A scatter step's unit: the CPU's one function `entry`, or the GPU's kernels.
struct ScatterSource {
  std::string source;
  std::string entry;                 ///< CPU: int entry(void* const* args, int nth); 1 = a range fault
  std::string check, init, scatter;  ///< GPU kernels, launched in this order over `launches`
  std::int64_t index_elements = 0;   ///< elements of index and src (the check's threads)
  std::int64_t out_elements = 0;     ///< the init's threads
  std::int64_t scatter_threads = 0;  ///< the scatter's threads: positions off the axis, or every element (atomic)
  bool atomic = false;               ///< the scatter kernel accumulates with atomics
  /// GPU, sched::ScatterCall::sorted_runs: after the check (which counts each target),
  /// `reserve` (reserve_blocks blocks of 1024 threads: each target's run its places), `place`
  /// (one thread a position), `order` (one thread a position), then `scatter` over every output
  /// element (scatter_threads); no init.
  bool sorted_runs = false;
  /// Sorted runs in the atomic mode: linked lists built by the check, no reserve, place or order.
  bool linked = false;
  std::string reserve, place, order;
  std::int64_t reserve_blocks = 0;
  std::int64_t positions = 0;  ///< the place and order kernels' threads
  std::int64_t zero_bytes = 4;  ///< bytes of the flag's temporary cleared before the check
};

namespace scatter_detail {

using i64 = std::int64_t;

/// Statements that split flat position `flat` over `shape` (size-1 dims skipped) into the
/// variables c<d><suffix>, each defined.
inline std::string coords(const std::string& flat, const Shape& shape, const std::string& indent,
                          const std::string& suffix = "") {
  const std::string rest = "rest" + suffix;
  std::string s = indent + "long long " + rest + " = " + flat + ";\n";
  for (std::size_t d = shape.size(); d-- > 0;) {
    const std::string c = "c" + std::to_string(d) + suffix;
    if (shape[d] == 1) {
      s += indent + "const long long " + c + " = 0;\n";
      continue;
    }
    s += indent + "const long long " + c + " = " + rest + " % " + std::to_string(shape[d]) + "LL; " + rest + " /= " +
         std::to_string(shape[d]) + "LL;\n";
  }
  return s + indent + "(void)" + rest + ";\n";
}

/// sum c<d><suffix> * strides[d] (dim `replace` takes `with` instead).
inline std::string offset(const Strides& strides, const Shape& shape, int replace = -1, const std::string& with = "",
                          const std::string& suffix = "") {
  std::string s = "0LL";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::string c = static_cast<int>(d) == replace ? "(" + with + ")" : "c" + std::to_string(d) + suffix;
    if (static_cast<int>(d) != replace && (shape[d] == 1 || strides[d] == 0)) continue;
    s += " + " + c + " * " + std::to_string(strides[d]) + "LL";
  }
  return s;
}

/// The index shape without the axis (the positions each walk of the axis belongs to).
inline Shape others(const sched::ScatterCall& c) {
  Shape o = c.index_shape;
  o[static_cast<std::size_t>(c.axis)] = 1;
  return o;
}

/// The index elements to check: index's shape with the dims it is broadcast along (stride 0)
/// taken once (index_add's 1-d index spread over the source's rows is checked once per row).
inline Shape check_shape(const sched::ScatterCall& c) {
  Shape s = c.index_shape;
  for (std::size_t d = 0; d < s.size(); ++d)
    if (c.index.strides[d] == 0) s[d] = 1;
  return s;
}

/// Elements per thread along the last dim of `shape` for the GPU's init and atomic kernels, and
/// their distance: 4 when the last dim splits in fours and (`same_index`) the index is one along
/// it, else 1; 32 apart when the dim splits in 128s, so that each of a warp's four accesses
/// covers 32 consecutive elements (coalesced), else adjacent.
struct Lanes {
  i64 count = 1, stride = 1;
  /// Four adjacent elements of a 4-byte dtype moved as one 16-byte access (kiln_load4 and
  /// kiln_store4 in the unit, which fall back to four where an address is not aligned).
  bool quad = false;
  /// C text of thread `p`'s first element (a flat position).
  std::string first(const std::string& p) const {
    if (stride == 32) return "((" + p + ") / 32LL * 128LL + (" + p + ") % 32LL)";
    return "(" + p + ") * " + std::to_string(count) + "LL";
  }
};
inline Lanes lanes_along_last(const Shape& shape, bool same_index) {
  if (shape.empty() || !same_index || shape.back() % 4 != 0) return {};
  return {4, shape.back() % 128 == 0 ? 32 : 1};
}

/// Whether rows of `shape` with `strides` split in aligned fours: a contiguous last dim of a
/// multiple of four and every other stride a multiple of four (so only the base pointer's
/// alignment is left, checked by kiln_load4/kiln_store4).
inline bool quad_rows(const Shape& shape, const Strides& strides) {
  if (shape.empty() || shape.back() % 4 != 0 || strides.back() != 1) return false;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d)
    if (shape[d] > 1 && strides[d] % 4 != 0) return false;
  return true;
}

/// The GPU's lanes over `c`'s output rows when they move in 16-byte quads: a 4-byte dtype, out
/// and (unless a constant) base in aligned fours; else lanes_along_last.
inline Lanes init_lanes_of(const sched::ScatterCall& c, bool same_index) {
  if (same_index && itemsize(c.dtype) == 4 && quad_rows(c.shape, c.out.strides) &&
      (c.base_constant || quad_rows(c.shape, c.base.strides)))
    return {4, 1, true};
  return lanes_along_last(c.shape, same_index);
}

/// The unit's quad type and its loads and stores (16 bytes where the address allows, else four).
inline std::string quad_helpers(const sched::ScatterCall& c) {
  const std::string st = c_family::stype(c.dtype);
  return "struct __align__(16) kiln_quad { " + st + " v[4]; };\n"
         "static __device__ __forceinline__ kiln_quad kiln_load4(const " + st + "* p) {\n"
         "  if (((unsigned long long)p & 15ull) == 0ull) return *(const kiln_quad*)p;\n"
         "  kiln_quad q; q.v[0] = p[0]; q.v[1] = p[1]; q.v[2] = p[2]; q.v[3] = p[3]; return q;\n}\n"
         "static __device__ __forceinline__ void kiln_store4(" + st + "* p, kiln_quad q) {\n"
         "  if (((unsigned long long)p & 15ull) == 0ull) { *(kiln_quad*)p = q; return; }\n"
         "  p[0] = q.v[0]; p[1] = q.v[1]; p[2] = q.v[2]; p[3] = q.v[3];\n}\n";
}

/// The statement storing the scatter of src at `soff` into out at `ooff`.
inline std::string element_into(const sched::ScatterCall& c, const std::string& dst, const std::string& v,
                                c_family::PreludeNeeds& needs) {
  if (!c.accumulate) return dst + " = " + v + ";";
  const DType t = c.dtype;
  std::string sum;
  switch (t) {
    case DType::Bool:
      sum = "(unsigned char)((" + dst + " != 0) | (" + v + " != 0))";
      break;
    case DType::Int32:
      sum = "(int)((unsigned)" + dst + " + (unsigned)" + v + ")";
      break;
    case DType::Int64:
      sum = "(long long)((unsigned long long)" + dst + " + (unsigned long long)" + v + ")";
      break;
    case DType::Float16:
    case DType::BFloat16:
      sum = c_family::to_storage(
          c_family::from_storage(dst, t, needs) + " + " + c_family::from_storage(v, t, needs), t, needs);
      break;
    default:
      sum = dst + " + " + v;
  }
  return dst + " = " + sum + ";";
}

/// The statement writing (or adding) src[soff] into out[ooff].
inline std::string element(const sched::ScatterCall& c, const std::string& ooff, const std::string& soff,
                           c_family::PreludeNeeds& needs) {
  return element_into(c, "out[" + ooff + "]", "src[" + soff + "]", needs);
}

/// The fault site of `c` (core/index_fault.hpp): its op, axis and operands.
inline long long site_of(const sched::ScatterCall& c) {
  return kiln::detail::register_index_fault_site(ir::gather_site_name(c.site), c.axis,
                                                 "output " + std::string(dtype_name(c.dtype)) + c.shape.str() +
                                                     ", index int64" + c.index_shape.str());
}

/// The constant base as stored, spelled in dialect `d` (infinities and NaN by its names).
inline std::string constant_text(const sched::ScatterCall& c, const c_family::Dialect& d,
                                 c_family::PreludeNeeds& needs) {
  if (is_floating(c.dtype)) {
    const std::string f = c_family::float_literal(c.base_scalar, c.dtype == DType::Float64, d);
    if (c.dtype == DType::Float64 || c.dtype == DType::Float32) return f;
    return c_family::to_storage(f, c.dtype, needs);
  }
  if (c.dtype == DType::Bool) return c.base_iscalar != 0 ? "(unsigned char)1" : "(unsigned char)0";
  return "(" + std::string(c_family::stype(c.dtype)) + ")" + std::to_string(c.base_iscalar) + "LL";
}


/// The GPU kernels' pointers to their operands, from the argument `a` (kiln_scatter_args).
inline std::string cuda_operands(const sched::ScatterCall& c) {
  const std::string st = c_family::stype(c.dtype);
  return "  const " + st + "* __restrict__ base = (const " + st + "*)a.p[0]; (void)base;\n" +
         "  const long long* __restrict__ index = (const long long*)a.p[1]; (void)index;\n" + "  const " + st +
         "* __restrict__ src = (const " + st + "*)a.p[2]; (void)src;\n" + "  " + st + "* __restrict__ out = (" + st +
         "*)a.p[3]; (void)out;\n" +
         // A plain pointer: the kernels after the check read the flag it wrote in an earlier
         // launch (visible, and cached per multiprocessor); a volatile read by every thread went
         // to one L2 slice each time and held E2's init to 1 TB/s.
         "  int* const flag = (int*)a.p[4];\n";
}

/// A GPU thread's flat number `var`, returning past `count`.
inline std::string cuda_thread(const std::string& var, i64 count) {
  return "  const long long " + var + " = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n  if (" + var +
         " >= " + std::to_string(count) + "LL) return;\n";
}

/// The GPU check kernel `name` up to its range test: one thread per element of the check shape
/// `cs`, its index `v` read, the flag set and the fault recorded when it is out of range (then
/// `on_fault`), the operands declared by `operands`.
inline std::string cuda_check_head(const sched::ScatterCall& c, const std::string& name, const std::string& operands,
                                   const std::string& on_fault) {
  const Shape cs = check_shape(c);
  const std::string bound = std::to_string(c.bound());
  return "extern \"C\" __global__ void " + name + "(kiln_scatter_args a) {\n" + operands + cuda_thread("p", cs.numel()) +
         coords("p", cs, "  ") + "  const long long v = index[" + offset(c.index.strides, cs) + "];\n" +
         "  if ((unsigned long long)v >= " + bound + "ULL) { *flag = 1; kiln_index_out_of_range(" +
         std::to_string(site_of(c)) + "LL, v, " + bound + "LL); " + on_fault + "}\n";
}

/// The GPU init's stores: out = base (or the constant) at the thread's `lanes` elements, whose
/// coordinates c<d> are defined.
inline std::string cuda_init_stores(const sched::ScatterCall& c, const Lanes& lanes, c_family::PreludeNeeds& needs) {
  const std::string value = c.base_constant ? constant_text(c, c_family::kCudaDialect, needs) : "";
  std::string s;
  if (lanes.quad) {
    const std::string ooff = offset(c.out.strides, c.shape);
    if (c.base_constant)
      return "  { kiln_quad w; w.v[0] = w.v[1] = w.v[2] = w.v[3] = " + value + "; kiln_store4(&out[" + ooff + "], w); }\n";
    return "  kiln_store4(&out[" + ooff + "], kiln_load4(&base[" + offset(c.base.strides, c.shape) + "]));\n";
  }
  for (i64 j = 0; j < lanes.count; ++j) {
    const std::string step = j == 0 ? "" : " + " + std::to_string(j * lanes.stride) + "LL * ";
    s += "  out[" + offset(c.out.strides, c.shape) + (j ? step + std::to_string(c.out.strides.back()) + "LL" : "") +
         "] = " +
         (c.base_constant ? value
                          : "base[" + offset(c.base.strides, c.shape) +
                                (j ? step + std::to_string(c.base.strides.back()) + "LL" : "") + "]") +
         ";\n";
  }
  return s;
}
}  // namespace scatter_detail

/// The C++ unit of scatter `c`, entry named `name`.
inline ScatterSource generate_cpu_scatter(const sched::ScatterCall& c, const std::string& name) {
  using namespace scatter_detail;
  c_family::PreludeNeeds needs;
  needs.gather = true;
  ScatterSource out;
  out.entry = name;
  const Shape& is = c.index_shape;
  const int axis = static_cast<int>(c.axis);
  const i64 ni = is.numel(), no = c.shape.numel(), n = is[static_cast<std::size_t>(axis)];
  const i64 bound = c.shape[static_cast<std::size_t>(axis)];
  const Shape oth = others(c);
  const i64 positions = oth.numel();
  out.index_elements = ni;
  out.out_elements = no;
  const std::string st = c_family::stype(c.dtype);
  std::string body;
  body += "extern \"C\" int " + name + "(void* const* args, int nth) {\n  (void)nth;\n";
  body += "  const " + st + "* __restrict base = (const " + st + "*)args[0]; (void)base;\n";
  body += "  const long long* __restrict index = (const long long*)args[1];\n";
  body += "  const " + st + "* __restrict src = (const " + st + "*)args[2];\n";
  body += "  " + st + "* __restrict out = (" + st + "*)args[3];\n";
  // 1. Every index in range, before anything is written.
  const Shape cs = check_shape(c);
  body += "  for (long long p = 0; p < " + std::to_string(cs.numel()) + "LL; ++p) {\n" + coords("p", cs, "    ");
  body += "    const long long v = index[" + offset(c.index.strides, cs) + "];\n";
  body += "    if ((unsigned long long)v >= " + std::to_string(bound) + "ULL) { kiln_index_out_of_range(" +
          std::to_string(site_of(c)) + "LL, v, " + std::to_string(bound) + "LL); return 1; }\n  }\n";
  // 2. out = base.
  const std::string team = " num_threads(nth) if(" + std::to_string(no) + "LL >= 32768LL)";
  body += "  #pragma omp parallel for" + team + "\n";
  body += "  for (long long q = 0; q < " + std::to_string(no) + "LL; ++q) {\n" + coords("q", c.shape, "    ");
  body += "    out[" + offset(c.out.strides, c.shape) + "] = " +
          (c.base_constant ? constant_text(c, c_family::kCppDialect, needs) : "base[" + offset(c.base.strides, c.shape) + "]") + ";\n  }\n";
  // 3. The scatter: chunks of the positions off the axis, each walking the axis in order.
  const std::string ooff = offset(c.out.strides, c.shape, axis, "t");
  const std::string ioff = offset(c.index.strides, is, axis, "i"), soff = offset(c.src.strides, is, axis, "i");
  bool axis_innermost = true;
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < is.size(); ++d) axis_innermost = axis_innermost && is[d] == 1;
  const i64 chunks = std::max<i64>(1, std::min<i64>(positions, 256));
  const i64 per = (positions + chunks - 1) / chunks;
  auto at = [&](const std::string& indent) {
    return coords("o", oth, indent) + indent + "const long long t = index[" + ioff + "];\n" + indent +
           element(c, ooff, soff, needs) + "\n";
  };
  body += "  #pragma omp parallel for schedule(static)" +
          std::string(" num_threads(nth) if(" + std::to_string(ni) + "LL >= 32768LL)") + "\n";
  body += "  for (long long chunk = 0; chunk < " + std::to_string(chunks) + "LL; ++chunk) {\n";
  body += "    const long long o0 = chunk * " + std::to_string(per) + "LL, o1 = o0 + " + std::to_string(per) + "LL < " +
          std::to_string(positions) + "LL ? o0 + " + std::to_string(per) + "LL : " + std::to_string(positions) +
          "LL;\n";
  if (axis_innermost) {
    body += "    for (long long o = o0; o < o1; ++o)\n      for (long long i = 0; i < " + std::to_string(n) +
            "LL; ++i) {\n" + at("        ") + "      }\n";
  } else {
    body += "    for (long long i = 0; i < " + std::to_string(n) + "LL; ++i)\n      for (long long o = o0; o < o1; ++o) {\n" +
            at("        ") + "      }\n";
  }
  body += "  }\n  return 0;\n}\n";
  std::string& src = out.source;
  src = "// kiln generated scatter\n";
  if (needs.half) src += detail::kHalfHelpers;
  if (needs.bf16) src += detail::kBf16Helpers;
  src += c_family::gather_prelude("", "__attribute__((noinline, cold))",
                                  "__atomic_exchange_n(&r[0], 1LL, __ATOMIC_ACQ_REL)");
  src += body;
  return out;
}

namespace scatter_detail {

/// The CUDA unit of a sorted-runs scatter (sched::ScatterCall::sorted_runs; see ScatterSource):
/// a counting sort of the positions by target, then one pass over the output.
/// - check: every index in range; each position's target kept, and its arrival place in its
///   target's run taken from the target's count (an atomic increment);
/// - reserve: each target's run its places, taken from one cursor a block at a time;
/// - place: each position written at its target's first place plus its arrival place;
/// - order (deterministic): each position's rank in its run is the number of the run's positions
///   before it, so the runs are copied in position order: O(run length) a position, where a
///   stable radix sort of the targets took six launches;
/// - apply: one thread per four columns of every output row, untouched ones included, starting
///   from the base value and applying its target's run in order, then storing once (the init
///   kernel that wrote untouched rows separately is gone).
/// The atomic mode needs no order, so its runs are linked lists instead: the check pushes each
/// position on its target's list (an atomic exchange of the list's head; the lists hold
/// position + 1, 0 ends them) and the apply walks the lists, in whatever order the exchanges
/// took: two launches, where the counted runs take four or five.
inline ScatterSource generate_cuda_sorted_runs(const sched::ScatterCall& c, const std::string& name) {
  c_family::PreludeNeeds needs;
  ScatterSource out;
  out.sorted_runs = true;
  out.check = name + "_check";
  out.linked = !c.ordered_runs();
  if (!out.linked) {
    out.reserve = name + "_reserve";
    out.place = name + "_place";
    out.order = name + "_order";
  }
  out.scatter = name + "_apply";
  const Shape& is = c.index_shape;
  const int axis = static_cast<int>(c.axis);
  const std::size_t last = is.size() - 1;
  const std::string ax = std::to_string(axis);
  const sched::ScatterCall::RunsLayout L = c.runs_layout();
  const i64 n = c.length(), bound = c.bound();
  out.zero_bytes = L.cleared * 4;
  out.positions = n;
  out.reserve_blocks = (bound + 1023) / 1024;
  const std::string N = std::to_string(n) + "LL", B = std::to_string(bound) + "LL";
  // Apply lanes: four columns of an output row when the index spans the row (then they share a
  // target and a run), a quad where out, base and src rows allow.
  Lanes lanes = static_cast<int>(last) != axis && is[last] == c.shape[last] ? lanes_along_last(c.shape, true) : Lanes{};
  if (lanes.count == 4 && itemsize(c.dtype) == 4 && quad_rows(is, c.src.strides) && quad_rows(c.shape, c.out.strides) &&
      (c.base_constant || quad_rows(c.shape, c.base.strides)))
    lanes = {4, 1, true};
  out.index_elements = check_shape(c).numel();
  // An index with no elements (a dim off the axis of extent 0) places nothing: the check that
  // writes each position's target and arrival place does not run, so neither may the kernels
  // that read them (they read uninitialised scratch: fuzz seed 600, graph 654 on a GPU).
  if (out.index_elements == 0) out.positions = 0;
  const std::string args = "(kiln_scatter_args a)";
  auto at = [](i64 ints) { return "(unsigned*)a.p[4] + " + std::to_string(ints); };
  // Each mode names only its own buffers (RunsLayout lays out one mode's).
  auto pointer = [&](const char* buffer, i64 ints) {
    return std::string("  unsigned* const ") + buffer + " = " + at(ints) + "; (void)" + buffer + ";\n";
  };
  const std::string ptrs =
      cuda_operands(c) + pointer("heads", L.heads) +
      (out.linked ? pointer("links", L.links)
                  : pointer("counts", L.counts) + pointer("offsets", L.offsets) + pointer("keys", L.keys) +
                        pointer("slots", L.slots) + pointer("placed", L.placed) + pointer("ordered", L.ordered));
  const auto thread = cuda_thread;
  std::string body;
  // Check: every index in range (else the flag, and nothing is written); targets and places.
  body += cuda_check_head(c, out.check, ptrs, "return; ");
  if (out.linked)
    body += "  links[c" + ax + "] = atomicExch(&heads[v], (unsigned)c" + ax + " + 1u);\n}\n";
  else
    body += "  keys[c" + ax + "] = (unsigned)v;\n  slots[c" + ax + "] = atomicAdd(&counts[v], 1u);\n}\n";
  if (!out.linked) {
    // Reserve: each target's run gets `count` places from one cursor (the int after the flag),
    // one atomic per block: a block's counts are scanned by shuffles, its total reserved, and
    // each target's start is the block's start plus the counts before it. The runs lie in any
    // order (a one-block scan of E2's 50304 counts into a fixed layout took 56 us); what a run
    // holds, and the order of its sums, does not depend on where it lies.
    body += "extern \"C\" __global__ void __launch_bounds__(1024) " + out.reserve + args + " {\n" + ptrs +
            "  if (*flag) return;\n";
    body += "  __shared__ unsigned warp_total[32];\n  __shared__ unsigned block_start;\n";
    body += "  const long long t = (long long)blockIdx.x * 1024LL + threadIdx.x;\n";
    body += "  const unsigned lane = threadIdx.x & 31u, w = threadIdx.x >> 5;\n";
    body += "  const unsigned own = t < " + B + " ? counts[t] : 0u;\n  unsigned incl = own;\n";
    body += "  for (unsigned o = 1; o < 32u; o <<= 1) { const unsigned y = __shfl_up_sync(0xffffffffu, incl, o); if (lane >= o) incl += y; }\n";
    body += "  if (lane == 31u) warp_total[w] = incl;\n  __syncthreads();\n";
    body += "  if (w == 0u) {\n    unsigned x = warp_total[lane];\n";
    body += "    for (unsigned o = 1; o < 32u; o <<= 1) { const unsigned y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }\n";
    body += "    warp_total[lane] = x;\n    if (lane == 31u) block_start = x ? atomicAdd((unsigned*)a.p[4] + " + std::to_string(L.cursor) + ", x) : 0u;\n  }\n";
    body += "  __syncthreads();\n";
    body += "  if (t < " + B + " && own) offsets[t] = block_start + (w > 0u ? warp_total[w - 1u] : 0u) + incl - own;\n}\n";
    // Place: each position at its target's first place plus its arrival place.
    body += "extern \"C\" __global__ void " + out.place + args + " {\n" + ptrs + "  if (*flag) return;\n" +
            thread("p", n) + "  placed[offsets[keys[p]] + slots[p]] = (unsigned)p;\n}\n";
    // Order: each position's rank among its run's positions (distinct, so the ranks are too).
    {
      body += "extern \"C\" __global__ void " + out.order + args + " {\n" + ptrs + "  if (*flag) return;\n" +
              thread("p", n);
      body += "  const unsigned t = keys[p], first = offsets[t], length = counts[t];\n";
      body += "  unsigned rank = 0;\n  for (unsigned j = 0; j < length; ++j) rank += placed[first + j] < (unsigned)p;\n";
      body += "  ordered[first + rank] = (unsigned)p;\n  if (rank == 0u) heads[t] = (unsigned)p;\n}\n";
    }
  }
  // Apply: every output element once, four columns a thread where the lanes allow, and two such
  // groups a thread (q and q + half, each coalesced across a warp) when they split evenly, their
  // loads in flight together: the kernel waits on a chain of loads (the run's bounds, then the
  // source rows), so bytes in flight are what it lacks. (Four groups of one row a thread, with
  // the run's start waiting on its length, took E2's apply from 101 to 124 us on an H200.)
  const i64 groups = c.shape.numel() / lanes.count, sets = groups % 2 == 0 ? 2 : 1;
  out.scatter_threads = groups / sets;
  body += "extern \"C\" __global__ void " + out.scatter + args + " {\n" + ptrs + "  if (*flag) return;\n" +
          thread("q", out.scatter_threads);
  if (!out.linked) body += "  const unsigned* const runs = ordered;\n";
  const std::string st = c_family::stype(c.dtype);
  const std::string acc_type = lanes.quad ? "kiln_quad" : "struct { " + st + " v[" + std::to_string(lanes.count) + "]; }";
  const std::string constant = c.base_constant ? constant_text(c, c_family::kCudaDialect, needs) : "";
  auto lane_off = [&](const std::string& off, const Strides& strides, i64 j) {
    return j == 0 ? off : off + " + " + std::to_string(j * lanes.stride * strides[last]) + "LL";
  };
  std::string loop;
  if (out.linked)
    loop = sets == 1 ? "  while (link_0) {\n" : "  while (link_0 | link_1) {\n";
  else
    loop = sets == 1 ? "  for (unsigned r = 0; r < length_0; ++r) {\n"
                     : "  for (unsigned r = 0; r < (length_0 > length_1 ? length_0 : length_1); ++r) {\n";
  std::string stores;
  for (i64 m = 0; m < sets; ++m) {
    const std::string x = "_" + std::to_string(m);
    body += coords(lanes.first(m == 0 ? "q" : "q + " + std::to_string(groups / 2) + "LL"), c.shape, "  ", x);
    std::string inside = "true";
    for (std::size_t d = 0; d < is.size(); ++d)
      if (static_cast<int>(d) != axis && is[d] < c.shape[d])
        inside += " && c" + std::to_string(d) + x + " < " + std::to_string(is[d]) + "LL";
    body += "  const long long t" + x + " = c" + ax + x + ";\n";
    // Counted runs: the run's length, start and first position are three independent loads
    // (the position would otherwise wait on the start), so a run of one reads its source row
    // after two hops, as a linked run does.
    if (out.linked)
      body += "  unsigned link" + x + " = (" + inside + ") ? heads[t" + x + "] : 0u;\n";
    else
      body += "  const unsigned length" + x + " = (" + inside + ") ? counts[t" + x + "] : 0u, first" + x + " = offsets[t" +
              x + "], head" + x + " = heads[t" + x + "];\n";
    const std::string ooff = offset(c.out.strides, c.shape, -1, "", x),
                      boff = c.base_constant ? "" : offset(c.base.strides, c.shape, -1, "", x);
    const std::string soff = offset(c.src.strides, is, axis, "pp" + x, x);
    // The run's sums stay in registers (acc.v[j]): one store of each element, no re-reads of out.
    const std::string acc = "acc" + x;
    body += "  " + acc_type + " " + acc + ";\n";
    if (lanes.quad && !c.base_constant) {
      body += "  " + acc + " = kiln_load4(&base[" + boff + "]);\n";
    } else {
      for (i64 j = 0; j < lanes.count; ++j)
        body += "  " + acc + ".v[" + std::to_string(j) + "] = " +
                (c.base_constant ? constant : "base[" + lane_off(boff, c.base.strides, j) + "]") + ";\n";
    }
    if (out.linked) {
      loop += "    if (link" + x + ") {\n";
      loop += "      const long long pp" + x + " = (long long)link" + x + " - 1LL;\n      link" + x + " = links[pp" + x + "];\n";
    } else {
      loop += "    if (r < length" + x + ") {\n";
      loop += "      const long long pp" + x + " = r == 0u ? (long long)head" + x + " : (long long)runs[first" + x + " + r];\n";
    }
    if (lanes.quad) loop += "      const kiln_quad s" + x + " = kiln_load4(&src[" + soff + "]);\n";
    for (i64 j = 0; j < lanes.count; ++j) {
      const std::string js = std::to_string(j);
      loop += "      " +
              element_into(c, acc + ".v[" + js + "]",
                           lanes.quad ? "s" + x + ".v[" + js + "]" : "src[" + lane_off(soff, c.src.strides, j) + "]", needs) +
              "\n";
    }
    loop += "    }\n";
    if (lanes.quad)
      stores += "  kiln_store4(&out[" + ooff + "], " + acc + ");\n";
    else
      for (i64 j = 0; j < lanes.count; ++j)
        stores += "  out[" + lane_off(ooff, c.out.strides, j) + "] = " + acc + ".v[" + std::to_string(j) + "];\n";
  }
  body += loop + "  }\n" + stores + "}\n";
  std::string& src = out.source;
  src = "// kiln generated scatter (sorted runs)\nstruct kiln_scatter_args { void* p[5]; };\n";
  src += cuda_detail::kCudaBase;
  if (needs.half) src += cuda_detail::kCudaHalf;
  if (needs.bf16) src += cuda_detail::kCudaBf16;
  if (lanes.quad) src += quad_helpers(c);
  src += c_family::gather_prelude("__device__", "__noinline__",
                                  "(long long)atomicCAS((unsigned long long*)r, 0ull, 1ull)");
  src += body;
  return out;
}

}  // namespace scatter_detail

/// The CUDA unit of scatter `c`, kernels named `name`_check, _init and _scatter. Their one
/// argument is {base, index, src, out, flag} by value; flag (an int, zeroed before the check)
/// is set by the check when an index is out of range, and the other two then write nothing.
inline ScatterSource generate_cuda_scatter(const sched::ScatterCall& c, const std::string& name) {
  using namespace scatter_detail;
  if (c.sorted_runs) return generate_cuda_sorted_runs(c, name);
  c_family::PreludeNeeds needs;
  ScatterSource out;
  out.check = name + "_check";
  out.init = name + "_init";
  out.scatter = name + "_scatter";
  const Shape& is = c.index_shape;
  const int axis = static_cast<int>(c.axis);
  const i64 ni = is.numel(), no = c.shape.numel(), n = is[static_cast<std::size_t>(axis)];
  const Shape oth = others(c);
  out.atomic = c.atomic_adds();
  const Shape cs = check_shape(c);
  const std::size_t last = is.size() - 1;
  // The init's lanes: consecutive elements of a row; the atomic scatter's: consecutive elements
  // of a row that share their index (the axis is another dim and the index is broadcast along it).
  const Lanes init_lanes = init_lanes_of(c, true);
  Lanes add_lanes =
      lanes_along_last(is, static_cast<int>(last) != axis && c.index.strides[last] == 0 && is[last] > 1);
  // float32 rows whose four lanes are adjacent in src and out: one 16-byte vector atomic
  // (sm_90's red.global.add.v4.f32) where both addresses are aligned, four scalar ones elsewhere.
  const bool vector_add = out.atomic && c.dtype == DType::Float32 && add_lanes.count == 4 &&
                          c.src.strides[last] == 1 && c.out.strides[last] == 1;
  if (vector_add) add_lanes.stride = 1;
  out.index_elements = cs.numel();
  out.out_elements = no / init_lanes.count;
  out.scatter_threads = out.atomic ? ni / add_lanes.count : oth.numel();
  const std::string args = "(kiln_scatter_args a)";
  const std::string ptrs = cuda_operands(c);
  const auto thread = cuda_thread;
  std::string body;
  body += cuda_check_head(c, out.check, ptrs, "") + "}\n";
  body += "extern \"C\" __global__ void " + out.init + args + " {\n" + ptrs + "  if (*flag) return;\n" +
          thread("q", no / init_lanes.count) + coords(init_lanes.first("q"), c.shape, "  ");
  body += cuda_init_stores(c, init_lanes, needs) + "}\n";
  const std::string ooff = offset(c.out.strides, c.shape, axis, "t");
  body += "extern \"C\" __global__ void " + out.scatter + args + " {\n" + ptrs + "  if (*flag) return;\n";
  if (out.atomic) {
    // One index load for the lanes, then an atomic add (a fire-and-forget reduction) per element.
    body += thread("p", ni / add_lanes.count) + coords(add_lanes.first("p"), is, "  ");
    body += "  const long long t = index[" + offset(c.index.strides, is) + "];\n";
    if (vector_add) {
      body += "#if __CUDA_ARCH__ >= 900\n";
      body += "  {\n    float* o = &out[" + ooff + "];\n    const float* s = &src[" + offset(c.src.strides, is) + "];\n";
      body += "    if ((((unsigned long long)o | (unsigned long long)s) & 15ull) == 0ull) {\n";
      body += "      atomicAdd((float4*)o, *(const float4*)s);\n      return;\n    }\n  }\n#endif\n";
    }
    for (i64 j = 0; j < add_lanes.count; ++j) {
      const std::string sj = j ? " + " + std::to_string(j * add_lanes.stride * c.src.strides[last]) + "LL" : "";
      const std::string oj = j ? " + " + std::to_string(j * add_lanes.stride * c.out.strides[last]) + "LL" : "";
      const std::string v = "src[" + offset(c.src.strides, is) + sj + "]";
      if (c.dtype == DType::Int64)
        body += "  atomicAdd((unsigned long long*)&out[" + ooff + oj + "], (unsigned long long)" + v + ");\n";
      else
        body += "  atomicAdd(&out[" + ooff + oj + "], " + v + ");\n";
    }
    body += "}\n";
  } else {
    const std::string ioff = offset(c.index.strides, is, axis, "i"), soff = offset(c.src.strides, is, axis, "i");
    body += thread("o", oth.numel()) + coords("o", oth, "  ");
    body += "  for (long long i = 0; i < " + std::to_string(n) + "LL; ++i) {\n    const long long t = index[" + ioff +
            "];\n    " + element(c, ooff, soff, needs) + "\n  }\n}\n";
  }
  std::string& src = out.source;
  src = "// kiln generated scatter\nstruct kiln_scatter_args { void* p[5]; };\n";
  src += cuda_detail::kCudaBase;
  if (needs.half) src += cuda_detail::kCudaHalf;
  if (needs.bf16) src += cuda_detail::kCudaBf16;
  if (init_lanes.quad) src += quad_helpers(c);
  src += c_family::gather_prelude("__device__", "__noinline__",
                                  "(long long)atomicCAS((unsigned long long*)r, 0ull, 1ull)");
  src += body;
  return out;
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
