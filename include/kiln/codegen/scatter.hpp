#pragma once
// Source of a scatter step (sched::ScatterCall) in the C++ and CUDA dialects: out = base (or
// a constant), then src written or added where index says along the axis. Every index is
// checked before anything is written (an IndexError, nothing written). Shapes and strides are
// baked into the text, as in the fused kernels.
//
// Deterministic (the default): the positions off the axis are shared among threads and each
// walks the axis in index order, so repeated indices are written (or summed) in the order of
// their positions, as the reference does, with the same bits on every run; no two threads
// touch one output element. Atomic (opt-in, GPU, f32/f64/int32/int64): one thread per index
// element adds with atomicAdd, in whatever order the hardware gives.
#include <string>
#include <vector>

#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/codegen/cpp/dialect.hpp"
#include "kiln/codegen/cuda/prelude.hpp"
#include "kiln/sched/steps.hpp"

namespace kiln::codegen {

/// A scatter step's unit: the CPU's one function `entry`, or the GPU's three kernels.
struct ScatterSource {
  std::string source;
  std::string entry;                 ///< CPU: int entry(void* const* args, int nth); 1 = a range fault
  std::string check, init, scatter;  ///< GPU kernels, launched in this order over `launches`
  std::int64_t index_elements = 0;   ///< elements of index and src (the check's threads)
  std::int64_t out_elements = 0;     ///< the init's threads
  std::int64_t scatter_threads = 0;  ///< the scatter's threads: positions off the axis, or every element (atomic)
  bool atomic = false;               ///< the scatter kernel accumulates with atomics
  /// GPU, sched::ScatterCall::sorted_runs: between the check and the init, `passes` radix passes
  /// of three kernels each (`hist` over `tiles` blocks of 256 threads, `scan` one block of 1024,
  /// `place` over `tiles` blocks of 32), the pass number in the argument; `scatter` then applies
  /// each target's run, over scatter_threads threads.
  bool sorted_runs = false;
  std::string hist, scan, place;
  std::int64_t tiles = 0;
  int passes = 0;
  std::int64_t zero_bytes = 4;  ///< bytes of the flag's temporary cleared before the check
};

namespace scatter_detail {

using i64 = std::int64_t;

/// Statements that split flat position `flat` over `shape` (size-1 dims skipped) into the
/// variables c<d>, each defined.
inline std::string coords(const std::string& flat, const Shape& shape, const std::string& indent) {
  std::string s = indent + "long long rest = " + flat + ";\n";
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) {
      s += indent + "const long long c" + std::to_string(d) + " = 0;\n";
      continue;
    }
    s += indent + "const long long c" + std::to_string(d) + " = rest % " + std::to_string(shape[d]) + "LL; rest /= " +
         std::to_string(shape[d]) + "LL;\n";
  }
  return s + indent + "(void)rest;\n";
}

/// sum c<d> * strides[d] (dim `replace` takes `with` instead of c<d>).
inline std::string offset(const Strides& strides, const Shape& shape, int replace = -1, const std::string& with = "") {
  std::string s = "0LL";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const std::string c = static_cast<int>(d) == replace ? "(" + with + ")" : "c" + std::to_string(d);
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
/// the check also writes each position's target as a key and counts the targets; a stable LSD
/// radix sort orders the positions by target, eight bits a pass (each tile's digit histogram, one
/// scan of them all in digit-major order, then each tile's warp placing its elements in position
/// order: equal digits ranked by __match_any_sync, so every pass is stable); the init writes the
/// elements no run touches; the apply kernel gives each run's first position and four columns
/// one thread, which writes the base value and then applies the run's sources in position order.
inline ScatterSource generate_cuda_sorted_runs(const sched::ScatterCall& c, const std::string& name) {
  c_family::PreludeNeeds needs;
  ScatterSource out;
  out.sorted_runs = true;
  out.check = name + "_check";
  out.hist = name + "_hist";
  out.scan = name + "_scan";
  out.place = name + "_place";
  out.init = name + "_init";
  out.scatter = name + "_apply";
  const Shape& is = c.index_shape;
  const int axis = static_cast<int>(c.axis);
  const std::size_t last = is.size() - 1;
  const i64 n = c.length(), bound = c.bound(), tiles = c.sort_tiles(), tile = sched::ScatterCall::kSortTile;
  out.tiles = tiles;
  out.passes = c.sort_passes();
  out.zero_bytes = (1 + bound) * 4;
  const Shape oth = others(c), cs = check_shape(c);
  const std::string N = std::to_string(n) + "LL", B = std::to_string(bound), TL = std::to_string(tiles);
  // Init lanes: four elements along the last dim when they share the target and the index's extent.
  const Lanes init_lanes = static_cast<int>(last) != axis && is[last] == c.shape[last] ? init_lanes_of(c, true) : Lanes{};
  // Apply lanes: four columns of a run's rows (a quad where out, base and src rows allow).
  Lanes run_lanes = static_cast<int>(last) != axis ? lanes_along_last(is, true) : Lanes{};
  if (run_lanes.count == 4 && itemsize(c.dtype) == 4 && quad_rows(is, c.src.strides) &&
      quad_rows(c.shape, c.out.strides) && (c.base_constant || quad_rows(c.shape, c.base.strides)))
    run_lanes = {4, 1, true};
  const i64 per_run = oth.numel() / run_lanes.count;
  out.index_elements = cs.numel();
  out.out_elements = c.shape.numel() / init_lanes.count;
  out.scatter_threads = n * per_run;
  const std::string args = "(kiln_scatter_args a)";
  const std::string ptrs = cuda_operands(c) + "  unsigned* const count = (unsigned*)a.p[4] + 1;\n" +
                           "  unsigned* const keys0 = count + " + B + ";\n" +
                           "  unsigned* const vals0 = keys0 + " + N + ";\n" +
                           "  unsigned* const keys1 = vals0 + " + N + ";\n" +
                           "  unsigned* const vals1 = keys1 + " + N + ";\n" +
                           "  unsigned* const hist = vals1 + " + N + ";\n" +
                           "  (void)count; (void)keys0; (void)vals0; (void)keys1; (void)vals1; (void)hist;\n";
  const auto thread = cuda_thread;
  std::string body;
  // Check: every index in range (else the flag, and nothing is written); keys and counts.
  body += cuda_check_head(c, out.check, ptrs, "return; ");
  body += "  keys0[c" + std::to_string(axis) + "] = (unsigned)v;\n  vals0[c" + std::to_string(axis) +
          "] = (unsigned)c" + std::to_string(axis) + ";\n  atomicAdd(&count[v], 1u);\n}\n";
  const std::string pass_io = "  const int shift = 8 * a.pass;\n"
                              "  const unsigned* keys_in = (a.pass & 1) ? keys1 : keys0;\n"
                              "  const unsigned* vals_in = (a.pass & 1) ? vals1 : vals0; (void)vals_in;\n"
                              "  unsigned* keys_out = (a.pass & 1) ? keys0 : keys1; (void)keys_out;\n"
                              "  unsigned* vals_out = (a.pass & 1) ? vals0 : vals1; (void)vals_out;\n";
  const std::string tile_range = "  const long long begin = (long long)blockIdx.x * " + std::to_string(tile) +
                                 "LL, end = begin + " + std::to_string(tile) + "LL < " + N + " ? begin + " +
                                 std::to_string(tile) + "LL : " + N + ";\n";
  // Hist: each tile's digit counts, stored digit-major (hist[d * tiles + tile]).
  const std::string one_element = "  const long long i = begin + threadIdx.x;\n  const bool valid = i < end;\n";
  body += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(tile) + ") " + out.hist + args + " {\n" + ptrs +
          "  if (*flag) return;\n" + pass_io + tile_range + one_element;
  body += "  __shared__ unsigned h[256];\n  if (threadIdx.x < 256u) h[threadIdx.x] = 0u;\n  __syncthreads();\n";
  body += "  if (valid) atomicAdd(&h[(keys_in[i] >> shift) & 255u], 1u);\n";
  body += "  __syncthreads();\n  if (threadIdx.x < 256u) hist[(long long)threadIdx.x * " + TL + " + blockIdx.x] = h[threadIdx.x];\n}\n";
  // Scan: exclusive prefix sums of the histograms, in place, by one block of 1024 threads in
  // rounds of 8192 (each thread's eight adjacent counts loaded together, then the threads'
  // totals scanned by shuffles and the warps' totals in shared memory): a thread walking its
  // own stretch in order was latency-bound, 68 us for E2's 32768 counts.
  const std::string M = std::to_string(256 * tiles) + "LL";
  body += "extern \"C\" __global__ void __launch_bounds__(1024) " + out.scan + args + " {\n" + ptrs + "  if (*flag) return;\n";
  body += "  __shared__ unsigned warp_total[32];\n  const unsigned t = threadIdx.x, lane = t & 31u, w = t >> 5;\n";
  body += "  unsigned carry = 0;\n";
  body += "  for (long long base = 0; base < " + M + "; base += 8192LL) {\n";
  body += "    const long long at = base + 8LL * t;\n    unsigned v[8], own = 0;\n";
  body += "    for (int j = 0; j < 8; ++j) v[j] = at + j < " + M + " ? hist[at + j] : 0u;\n";
  body += "    for (int j = 0; j < 8; ++j) { const unsigned h = v[j]; v[j] = own; own += h; }\n";
  body += "    unsigned incl = own;\n";
  body += "    for (unsigned o = 1; o < 32u; o <<= 1) { const unsigned y = __shfl_up_sync(0xffffffffu, incl, o); if (lane >= o) incl += y; }\n";
  body += "    if (lane == 31u) warp_total[w] = incl;\n    __syncthreads();\n";
  body += "    if (w == 0u) {\n      unsigned x = warp_total[lane];\n";
  body += "      for (unsigned o = 1; o < 32u; o <<= 1) { const unsigned y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }\n";
  body += "      warp_total[lane] = x;\n    }\n    __syncthreads();\n";
  body += "    const unsigned first = carry + (w > 0u ? warp_total[w - 1u] : 0u) + incl - own;\n";
  body += "    for (int j = 0; j < 8; ++j) if (at + j < " + M + ") hist[at + j] = first + v[j];\n";
  body += "    carry += warp_total[31];\n    __syncthreads();  // warp_total is the next round's\n  }\n}\n";
  // Place: one element a thread. Within a warp, equal digits are ranked by __match_any_sync; the
  // warps' counts of each digit, scanned in warp order after the earlier tiles' (the histogram
  // scan), give each warp's start, so the pass keeps position order (stable).
  const std::string W = std::to_string(tile / 32);
  body += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(tile) + ") " + out.place + args + " {\n" +
          ptrs + "  if (*flag) return;\n" + pass_io + tile_range + one_element;
  body += "  __shared__ unsigned at[" + W + "][256];\n  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;\n";
  body += "  for (unsigned w = 0; w < " + W + "u; ++w) if (threadIdx.x < 256u) at[w][threadIdx.x] = 0u;\n  __syncthreads();\n";
  body += "  const unsigned key = valid ? keys_in[i] : 0u, d = valid ? (key >> shift) & 255u : 256u;\n";
  body += "  const unsigned peers = __match_any_sync(0xffffffffu, d);\n";
  body += "  const unsigned rank = (unsigned)__popc(peers & ((1u << lane) - 1u));\n";
  body += "  if (valid && rank == 0u) at[warp][d] = (unsigned)__popc(peers);\n  __syncthreads();\n";
  body += "  if (threadIdx.x < 256u) {\n    unsigned run = hist[(long long)threadIdx.x * " + TL + " + blockIdx.x];\n";
  body += "    for (unsigned w = 0; w < " + W + "u; ++w) { const unsigned n = at[w][threadIdx.x]; at[w][threadIdx.x] = run; run += n; }\n  }\n";
  body += "  __syncthreads();\n";
  body += "  if (valid) {\n    const unsigned dst = at[warp][d] + rank;\n    keys_out[dst] = key;\n    vals_out[dst] = vals_in[i];\n  }\n}\n";
  // Init: the elements no run writes (an untouched target, or outside the index's extent).
  std::string inside = "count[c" + std::to_string(axis) + "] > 0u";
  for (std::size_t d = 0; d < is.size(); ++d)
    if (static_cast<int>(d) != axis && is[d] < c.shape[d]) inside += " && c" + std::to_string(d) + " < " + std::to_string(is[d]) + "LL";
  const std::string constant = c.base_constant ? constant_text(c, c_family::kCudaDialect, needs) : "";
  body += "extern \"C\" __global__ void " + out.init + args + " {\n" + ptrs + "  if (*flag) return;\n" +
          thread("q", c.shape.numel() / init_lanes.count) + coords(init_lanes.first("q"), c.shape, "  ");
  body += "  if (" + inside + ") return;  // the run's thread writes it\n";
  body += cuda_init_stores(c, init_lanes, needs) + "}\n";
  // Apply: the first position of each run, four columns a thread.
  const bool odd = out.passes % 2 == 1;
  body += "extern \"C\" __global__ void " + out.scatter + args + " {\n" + ptrs + "  if (*flag) return;\n" +
          thread("id", n * per_run);
  body += "  const unsigned* keys = " + std::string(odd ? "keys1" : "keys0") + ";\n  const unsigned* vals = " +
          (odd ? "vals1" : "vals0") + ";\n";
  body += "  const long long i = id / " + std::to_string(per_run) + "LL, qq = id % " + std::to_string(per_run) + "LL;\n";
  // The run's first key, the key before it and its first position are read together, and each
  // step reads the next key and position beside its source row (two dependent reads a run of
  // one, not four).
  body += "  const long long t = keys[i];\n  const long long before = i > 0 ? (long long)keys[i - 1] : -1LL;\n";
  body += "  long long pp = vals[i];\n  if (before == t) return;  // not the run's first\n";
  body += coords(run_lanes.first("qq"), oth, "  ");
  const std::string ooff = offset(c.out.strides, c.shape, axis, "t"), boff = c.base_constant ? "" : offset(c.base.strides, c.shape, axis, "t");
  auto lane_off = [&](const std::string& off, const Strides& strides, i64 j) {
    return j == 0 ? off : off + " + " + std::to_string(j * run_lanes.stride * strides[last]) + "LL";
  };
  const std::string soff = offset(c.src.strides, is, axis, "pp");
  // The run's sums stay in registers (acc.v[j]): one store of each element, no re-reads of out.
  const std::string st = c_family::stype(c.dtype);
  const std::string acc = run_lanes.quad ? "kiln_quad acc" : "struct { " + st + " v[" + std::to_string(run_lanes.count) + "]; } acc";
  body += "  " + acc + ";\n";
  if (run_lanes.quad && !c.base_constant) {
    body += "  acc = kiln_load4(&base[" + boff + "]);\n";
  } else {
    for (i64 j = 0; j < run_lanes.count; ++j)
      body += "  acc.v[" + std::to_string(j) + "] = " +
              (c.base_constant ? constant : "base[" + lane_off(boff, c.base.strides, j) + "]") + ";\n";
  }
  body += "  for (long long r = i;; ++r) {\n";
  body += "    const bool more = r + 1 < " + N + " && (long long)keys[r + 1] == t;\n";
  body += "    const long long next = more ? (long long)vals[r + 1] : 0LL;\n";
  if (run_lanes.quad) body += "    const kiln_quad s = kiln_load4(&src[" + soff + "]);\n";
  for (i64 j = 0; j < run_lanes.count; ++j) {
    const std::string js = std::to_string(j);
    body += "    " + element_into(c, "acc.v[" + js + "]", run_lanes.quad ? "s.v[" + js + "]" : "src[" + lane_off(soff, c.src.strides, j) + "]", needs) + "\n";
  }
  body += "    if (!more) break;\n    pp = next;\n  }\n";
  if (run_lanes.quad)
    body += "  kiln_store4(&out[" + ooff + "], acc);\n";
  else
    for (i64 j = 0; j < run_lanes.count; ++j)
      body += "  out[" + lane_off(ooff, c.out.strides, j) + "] = acc.v[" + std::to_string(j) + "];\n";
  body += "}\n";
  std::string& src = out.source;
  src = "// kiln generated scatter (sorted runs)\nstruct kiln_scatter_args { void* p[5]; int pass; };\n";
  src += cuda_detail::kCudaBase;
  if (needs.half) src += cuda_detail::kCudaHalf;
  if (needs.bf16) src += cuda_detail::kCudaBf16;
  if (init_lanes.quad || run_lanes.quad) src += quad_helpers(c);
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
  src = "// kiln generated scatter\nstruct kiln_scatter_args { void* p[5]; int pass; };\n";
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
