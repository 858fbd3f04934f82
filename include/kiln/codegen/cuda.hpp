#pragma once
// CUDA code generation: a scheduled graph -> one CUDA translation unit (for NVRTC) holding one
// `extern "C" __global__` kernel per kernel of the schedule. The kernel grouping and the index
// algebra are the scheduler's (kiln/sched), exactly as for the CPU; only the mapping of the
// loops onto the GPU differs:
//
//  * pointwise kernels: one thread per VEC consecutive elements of the unit-stride loop group,
//    grid-stride over the rest; VEC = 16 bytes of the narrowest vectorisable access, so every
//    contiguous load and store is one 16-byte transaction per thread (a scalar tail covers what
//    the vectors leave over);
//  * row reductions: a warp (short rows) or a block per row; the row is read once into
//    registers (or shared memory for long rows) when later passes need it again, reductions are
//    folded per thread, then across the warp with shuffles and across warps through shared
//    memory; few long rows are split over many blocks whose partials the last block combines;
//  * column reductions: each thread owns VEC neighbouring columns (coalesced along the
//    contiguous axis) and a share of the rows; shares are combined in shared memory, and when
//    there are few columns the rows are split over blocks whose partials the last block of each
//    column tile combines;
//  * reductions over all rows of a row kernel ("finals", e.g. cross_entropy's mean) fold
//    per-block partials that the last block combines.
// Every combination runs in a fixed order for a given grid, and the grid depends only on the
// device (its multiprocessor count), so results are deterministic. Values are computed as the
// reference executor (kiln/backend/reference.hpp) defines them: f16/bf16 are loaded and stored
// as 16-bit and computed in f32, rounded once per op; sums accumulate in double (floats) or
// wrap in 64 bits (integers); CUDA's standard-accuracy math functions (no fast-math).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/codegen/cuda_prelude.hpp"
#include "kiln/core/error.hpp"
#include "kiln/codegen/c/integer.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/core/generated.hpp"
#include "kiln/core/half.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/index.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::codegen {

/// What code generation needs to know about the GPU: the architecture, and the sizes that set
/// grids, block counts and shared memory.
struct CudaTarget {
  int cc_major = 9, cc_minor = 0;
  int sm_count = 132;
  int max_threads_per_sm = 2048;
  int max_shared_per_block_optin = 227 * 1024;  ///< bytes a block may use after opting in
  int max_shared_per_sm = 228 * 1024;
  bool index64 = false;  ///< 64-bit index math even where 32 bits suffice (tests use it)
  // Tuning: the defaults are the variants measured best on an H200 (bench_gpu --variants;
  // docs/performance-gpu.md has the figures).
  int pointwise_block = 256;    ///< threads per block of pointwise kernels
  int warp_rows_per_block = 8;  ///< rows per block of row kernels with a warp per row (short rows)
  /// A row of at most 32 x lanes x this many elements gets a warp, a longer one a block. Each
  /// thread's share of a row is unrolled, and NVRTC's time grows with it. 4: N2 (1024-wide
  /// rows, then 64 threads per row) 0.985 x copy and compiled by NVRTC in 78 ms on an H200's
  /// host; 8 (a warp per row, 32 floats per thread) 0.969 and 112-140 ms.
  int warp_row_vectors = 4;
  int pointwise_unroll = 2;        ///< vectors per thread and loop step of light pointwise kernels
  int row_vectors_per_thread = 4;  ///< sets the threads per row of row reductions
  int split_blocks_per_sm = 4;     ///< blocks per multiprocessor when rows or columns are split
  int pointwise_unroll_heavy = 1;  ///< the same for pointwise kernels heavy in transcendental functions
  /// At most this many lanes per thread in pointwise kernels heavy in transcendental functions
  /// (0: as many as 16-byte loads give). Two: P3 (16 sinf per element) 1.094 -> 0.905 ms on an
  /// H200, fewer live registers per thread.
  int pointwise_lanes_heavy = 2;
  int row_unroll_uncached = 4;               ///< unroll of a row pass whose row is not cached on chip
  int row_vectors_per_thread_uncached = 32;  ///< sets the threads per row of long rows not cached on chip
  bool column_split_interleave = false;      ///< column splits take interleaved row groups
  int column_vectors_per_thread = 1;         ///< 16-byte vectors per thread across the columns of column reductions
  int column_unroll = 4;                     ///< rows in flight per thread in column reductions
  /// Rows too long for registers stay in shared memory (one row per multiprocessor at a time),
  /// else they are re-read per pass, mostly from L2 (two rows per multiprocessor overlap).
  bool row_cache_shared = false;
  /// x / d with d loop-invariant (f32): x * (1 / d), the exact division where 1/d is not a
  /// normal number. Off: it bought nothing on an H200 and its select doubles compile time.
  bool reciprocal_div = false;

  /// "sm_90".
  std::string arch() const { return "sm_" + std::to_string(cc_major) + std::to_string(cc_minor); }
  /// An H100/H200 (132 multiprocessors).
  static CudaTarget sm90() { return CudaTarget{}; }
  /// An A100 (108 multiprocessors, 163 KiB of shared memory per block).
  static CudaTarget sm80() {
    CudaTarget t;
    t.cc_major = 8;
    t.sm_count = 108;
    t.max_shared_per_block_optin = 163 * 1024;
    t.max_shared_per_sm = 164 * 1024;
    return t;
  }
};

/// Which buffers of a run are 16-byte aligned (vector loads and stores need it). Empty vectors
/// mean "all aligned".
struct CudaAlignment {
  std::vector<char> inputs;   ///< per leaf, in leaf order
  std::vector<char> outputs;  ///< per output
  bool input(int leaf) const { return inputs.empty() || inputs[static_cast<std::size_t>(leaf)]; }
  bool output(int index) const { return outputs.empty() || outputs[static_cast<std::size_t>(index)]; }
};

/// The grid of a kernel whose work grows with a symbolic size n, read at launch (see
/// CudaSource::symbolic): the kernel has units = floor(n * units_per_size / size_divisor) work
/// units (vectors of a pointwise kernel, rows of a row reduction), and its grid is
/// ceil(units / units_per_block) blocks, clamped to [1, max_grid] as the static choice is.
struct CudaGridRule {
  std::int64_t units_per_size = 0;  ///< 0: no rule, the grid is static (CudaKernelInfo::grid)
  std::int64_t size_divisor = 1;
  std::int64_t units_per_block = 1;
  std::int64_t max_grid = 1;
  /// The grid for size `n` (>= 0).
  unsigned grid(std::int64_t n) const {
    // n * units_per_size cannot overflow for any size a buffer can hold (units_per_size counts
    // elements of one unit of the size, and n times it are addressed in 64 bits).
    const std::int64_t units = n * units_per_size / size_divisor;
    const std::int64_t g = (units + units_per_block - 1) / units_per_block;
    return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(g, max_grid)));
  }
};

/// How one generated kernel is launched.
struct CudaKernelInfo {
  std::string name;             ///< `extern "C"` symbol
  unsigned grid = 1;            ///< blocks (x); 0 when grid_rule sets it at launch
  unsigned block = 1;           ///< threads per block (x)
  unsigned shared_bytes = 0;    ///< dynamic shared memory
  std::string strategy;         ///< one line for logs and explain
  std::uint64_t code_hash = 0;  ///< hash of the kernel's code (equal: the same kernel; autotune skips repeats)
  /// Kernels over a symbolic size: how the grid follows the size (units_per_size 0: static).
  CudaGridRule grid_rule;
  /// The grid to launch with when the symbolic size is `n` (static kernels: `grid`).
  unsigned grid_for(std::int64_t n) const { return grid_rule.units_per_size != 0 ? grid_rule.grid(n) : grid; }
};

/// A generated unit: the source and its kernels in launch order. Every kernel takes one
/// argument, a struct of `num_args` pointers: the graph's leaves (leaf order), its outputs,
/// the schedule's temporaries, then a scratch buffer of `scratch_bytes` (cross-block partials;
/// null when 0).
///
/// A schedule with a symbolic size (sched::Schedule::symbolic, kiln::compile's dynamic
/// shapes) makes a `symbolic` unit: the struct then has one more field after the pointers,
/// `long long n`, the size at this launch (C layout: `struct { void* p[num_args]; long long
/// n; }`, n at byte 8 * num_args). Kernels whose iteration space leads with that size read it
/// for their loop bounds and index math (in 64-bit integers, whatever the size: no guard
/// picks 32 bits at launch), and their grid follows it (CudaKernelInfo::grid_rule); the other
/// kernels of the unit ignore it. One unit serves every size; sizes 0 and 1 are valid too.
struct CudaSource {
  std::string source;
  std::vector<CudaKernelInfo> kernels;
  std::size_t num_args = 0;
  std::size_t scratch_bytes = 0;
  bool symbolic = false;  ///< the argument struct ends with the size `n` (see above)
};

namespace cuda_detail {

using ir::Op;
using sched::i64;
using sched::Index;
using sched::IndexExpr;

/// How this writer's errors name it.
inline constexpr const char* kWriter = "kiln CUDA codegen";

// Types and literals: the C every dialect shares (codegen/c/literals.hpp).
using c_family::ctype;
using c_family::hex_double;
using c_family::int_literal;
using c_family::stype;
inline std::string float_literal(double v, bool is_double) {
  return c_family::float_literal(v, is_double, c_family::kCudaDialect);
}
inline std::string constant_literal(const ir::GraphNode& n) {
  return c_family::constant_literal(n, c_family::kCudaDialect);
}

/// What a unit needs in its prelude.
struct Needs : c_family::PreludeNeeds {};

/// One reduction as generated code sees it.
struct Red {
  int node = -1;
  Op op = Op::ReduceSum;
  DType in = DType::Float32, out = DType::Float32;
  bool fl = false;    ///< floating input
  bool arg = false;   ///< ArgMax / ArgMin: (value, index) pairs
  std::string acc_t;  ///< accumulator type
  std::string init;   ///< identity of the combination
  /// A max whose phase-next sum of exp(input - max) is folded in the same pass ("online
  /// softmax": the sum is rescaled whenever the max grows); the sum's node, else -1.
  int online_sum = -1;
};

inline Red red_info(const ir::Graph& g, int id) {
  const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(id)];
  Red r;
  r.node = id;
  r.op = n.op;
  r.in = g.nodes[static_cast<std::size_t>(n.inputs[0])].dtype;
  r.out = n.dtype;
  r.fl = is_floating(r.in);
  c_family::Accumulator acc = c_family::accumulator(n.op, r.in, c_family::kCudaDialect);
  r.acc_t = acc.type;
  r.init = acc.init;
  r.arg = n.op == Op::ArgMax || n.op == Op::ArgMin;
  return r;
}

inline bool is_max(const Red& r) { return r.op == Op::ReduceMax || r.op == Op::ArgMax; }

/// Whether candidate (cv, ck) replaces (a, x) in an arg reduction (the reference's rule: the
/// extreme wins, NaN counts as the extreme, ties go to the lower index; index-aware, so
/// partial results may be combined in any grouping).
inline std::string take(const Red& r, const std::string& a, const std::string& x, const std::string& cv,
                        const std::string& ck) {
  const char* cmp = is_max(r) ? " > " : " < ";
  std::string plain = "(" + cv + cmp + a + " || (" + cv + " == " + a + " && " + ck + " < " + x + "))";
  if (r.fl) {
    std::string an = "(" + a + " != " + a + ")", bn = "(" + cv + " != " + cv + ")";
    plain = "((" + an + " || " + bn + ") ? ((" + an + " && " + bn + ") ? " + ck + " < " + x + " : " + bn +
            ") : " + plain + ")";
  }
  return "(" + ck + " >= 0 && (" + x + " < 0 || " + plain + "))";
}

/// Folds value `v` (at flat position `k` along the reduced dims, for arg reductions) into the
/// accumulator `a` (`x` its index). NaN sticks in max/min: once `a` is NaN no comparison is true.
inline std::string step(const Red& r, const std::string& a, const std::string& x, const std::string& v,
                        const std::string& k) {
  switch (r.op) {
    case Op::ReduceSum:
      return a + " += " + (r.fl ? "(double)" + v : "(unsigned long long)(long long)" + v) + ";";
    case Op::ReduceProd:
      return a + " *= " + (r.fl ? "(double)" + v : "(unsigned long long)(long long)" + v) + ";";
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const char* cmp = r.op == Op::ReduceMax ? " > " : " < ";
      if (!r.fl) {
        std::string vv = r.in == DType::Bool ? "(long long)" + v : v;
        return "{ const " + r.acc_t + " cv = " + vv + "; " + a + " = cv" + cmp + a + " ? cv : " + a + "; }";
      }
      return "{ const " + r.acc_t + " cv = " + v + "; " + a + " = (cv" + cmp + a + " || cv != cv) ? cv : " + a + "; }";
    }
    default: {
      std::string vv = r.in == DType::Bool ? "(long long)" + v : v;
      return "{ const " + r.acc_t + " cv = " + vv + "; const long long ck = " + k + "; if (" +
             take(r, a, x, "cv", "ck") + ") { " + a + " = cv; " + x + " = ck; } }";
    }
  }
}

/// Merges partial (pv, px) into (a, x).
inline std::string merge(const Red& r, const std::string& a, const std::string& x, const std::string& pv,
                         const std::string& px) {
  switch (r.op) {
    case Op::ReduceSum:
      return a + " += " + pv + ";";
    case Op::ReduceProd:
      return a + " *= " + pv + ";";
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const char* cmp = r.op == Op::ReduceMax ? " > " : " < ";
      if (!r.fl) return "{ const " + r.acc_t + " cv = " + pv + "; " + a + " = cv" + cmp + a + " ? cv : " + a + "; }";
      return "{ const " + r.acc_t + " cv = " + pv + "; " + a + " = (cv" + cmp + a + " || cv != cv) ? cv : " + a + "; }";
    }
    default:
      return "{ const " + r.acc_t + " cv = " + pv + "; const long long ck = " + px + "; if (" +
             take(r, a, x, "cv", "ck") + ") { " + a + " = cv; " + x + " = ck; } }";
  }
}

/// Online max-and-sum-of-exp: folds `v` into max `m` and sum `s` (double), the sum kept
/// relative to the current max. Terms exp(-inf - -inf) are skipped (they are 0 once a finite
/// value arrives; an all -inf row is made NaN at the end, as the reference computes it).
inline std::string online_step(const Red& r, const std::string& m, const std::string& s, const std::string& v) {
  const bool dbl = r.in == DType::Float64;
  const std::string t = r.acc_t, ex = dbl ? "exp(" : "expf(", ninf = dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)";
  return "{ const " + t + " cv = " + v + "; const " + t + " nm = (cv > " + m + " || cv != cv) ? cv : " + m +
         "; if (nm != " + m + ") { " + s + " *= (double)" + ex + m + " - nm); " + m + " = nm; } " + s +
         " += (cv == " + ninf + " && " + m + " == " + ninf + ") ? 0.0 : (double)" + ex + "cv - " + m + "); }";
}

/// Type of a chunk of `bytes` bytes (a whole vector access, or one 16-byte piece of it).
inline const char* chunk_type(std::size_t bytes) {
  switch (bytes) {
    case 16:
      return "uint4";
    case 8:
      return "uint2";
    case 4:
      return "unsigned int";
    case 2:
      return "unsigned short";
    default:
      return "unsigned char";
  }
}

inline const char* word_name(std::size_t chunk_bytes, std::size_t word) {
  static const char* xyzw[] = {".x", ".y", ".z", ".w"};
  if (chunk_bytes >= 8) return xyzw[word];
  return "";
}

/// Writes one kernel.
class Writer {
 public:
  Writer(const ir::Graph& g, const sched::Schedule& s, int kid, const CudaTarget& target, const CudaAlignment& align,
         Needs& needs, std::size_t scratch_offset)
      : g_(g),
        s_(s),
        k_(s.kernels[static_cast<std::size_t>(kid)]),
        kid_(kid),
        t_(target),
        al_(align),
        needs_(needs),
        scratch_offset_(scratch_offset) {
    leaves_ = g.num_leaves();
    nargs_ = leaves_ + g.outputs.size() + s.temps.size() + 1;
    sym_ = s.symbolic != 0 && !k_.space.empty() && k_.space[0] == s.symbolic;
    std::string why;
    if (!sched::symbolic_kernel(s, static_cast<std::size_t>(kid), &why))
      throw Error("kiln CUDA codegen: no symbolic-size code for " + why);
    // A symbolic size can be anything at launch: 64-bit index math (see CudaSource).
    i64_ = target.index64 || sym_ || needs_64bit();
    it_ = i64_ ? "long long" : "int";
    if (sym_) decls_.push_back("const long long " + std::string(kSizeVar) + " = a.n;");
  }

  /// The kernel's source (after the unit's prelude) and its launch; `scratch` receives the
  /// bytes of scratch this kernel uses (at the offset given to the constructor).
  CudaKernelInfo write(const std::string& name, std::string& code, std::size_t& scratch) {
    info_.name = name;
    scopes_.push_back(Scope{});
    if (k_.kind == sched::KernelKind::Pointwise)
      pointwise();
    else if (k_.loops.column)
      columns();
    else if (use_split())
      split_rows();
    else
      rows();
    while (scopes_.size() > 1) close();
    std::string out;
    if (!globals_.empty()) out += globals_;
    out += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(info_.block) + ") " + name +
           "(const kiln_args a) {\n";
    for (auto& d : decls_) out += "  " + d + "\n";
    out += scopes_[0].code;
    out += "}\n";
    code = out;
    scratch = scratch_bytes_;
    return info_;
  }

 private:
  // ---- scopes -------------------------------------------------------------------------------
  struct Val {
    std::string expr;
    int scope = 0;
    bool lane = false;  ///< differs between the lanes of a vector
  };
  struct Scope {
    std::string code;
    std::unordered_map<std::string, Val> memo;
    std::uint64_t dims = 0;
    std::string header;
  };
  struct Binding {
    std::vector<std::string> text;  ///< one per lane, or one for all
    std::uint64_t dims = 0;
    int min_scope = 0;
  };

  const ir::GraphNode& node(int i) const { return g_.nodes[static_cast<std::size_t>(i)]; }
  int top() const { return static_cast<int>(scopes_.size()) - 1; }
  std::string indent(int scope) const { return std::string(2 * static_cast<std::size_t>(scope + 1), ' '); }
  void line(const std::string& text) { line_at(top(), text); }
  void line_at(int scope, const std::string& text) {
    scopes_[static_cast<std::size_t>(scope)].code += indent(scope) + text + "\n";
  }
  /// Opens a block (`header` e.g. a for or if statement) that defines the variables of `dims`.
  void open(const std::string& header, std::uint64_t dims = 0, const std::string& pragma = "") {
    std::string h;
    if (!pragma.empty()) h += indent(top()) + pragma + "\n";
    h += indent(top()) + header + " {\n";
    Scope sc;
    sc.dims = dims;
    sc.header = h;
    scopes_.push_back(std::move(sc));
  }
  void close() {
    Scope sc = std::move(scopes_.back());
    scopes_.pop_back();
    scopes_.back().code += sc.header + sc.code + indent(top()) + "}\n";
  }
  /// Innermost open scope defining a variable of `mask` (0: the kernel's body).
  int scope_for(std::uint64_t mask) const {
    if (!mask) return 0;
    for (int i = top(); i > 0; --i)
      if (scopes_[static_cast<std::size_t>(i)].dims & mask) return i;
    throw Error("kiln CUDA codegen: index uses a loop variable that is not in scope (internal error)");
  }
  std::string fresh(const char* prefix) { return prefix + std::to_string(counter_++); }

  // ---- loop groups --------------------------------------------------------------------------
  int ngroups() const { return static_cast<int>(k_.loops.groups.size()); }
  std::uint64_t group_mask(int gi) const {
    std::uint64_t m = 0;
    for (int d : k_.loops.groups[static_cast<std::size_t>(gi)]) m |= std::uint64_t(1) << d;
    return m;
  }
  i64 extent(int gi) const {
    i64 e = 1;
    for (int d : k_.loops.groups[static_cast<std::size_t>(gi)]) e *= k_.space[static_cast<std::size_t>(d)];
    return e;
  }
  int last_dim(int gi) const { return k_.loops.groups[static_cast<std::size_t>(gi)].back(); }
  std::string var(int gi) const { return sched::loop_var(last_dim(gi)); }
  std::uint64_t groups_mask(const std::vector<int>& gs) const {
    std::uint64_t m = 0;
    for (int gi : gs) m |= group_mask(gi);
    return m;
  }

  /// An index literal in the kernel's index type.
  std::string lit(i64 v) const { return i64_ ? std::to_string(v) + "LL" : std::to_string(v); }

  /// C text of an index expression, the vector group's variable advanced by `lane`.
  std::string render(const IndexExpr& e, int lane = 0) const {
    if (!e.affine()) {
      if (lane <= 0 || vec_group_ < 0 || !(e.deps & vec_mask_)) return "(" + e.text + ")";
      // Opaque text names loop variables i<d>; lane j reads the vector group's variable + j.
      std::string out, v = sched::loop_var(vec_dim_);
      const std::string& t = e.text;
      auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
      for (std::size_t i = 0; i < t.size();) {
        if (t.compare(i, v.size(), v) == 0 && (i == 0 || !ident(t[i - 1])) &&
            (i + v.size() == t.size() || !ident(t[i + v.size()]))) {
          out += "(" + v + " + " + std::to_string(lane) + ")";
          i += v.size();
        } else {
          out += t[i++];
        }
      }
      return "(" + out + ")";
    }
    std::string s;
    i64 constant = e.constant;
    for (int gi = 0; gi < ngroups(); ++gi) {
      const auto& grp = k_.loops.groups[static_cast<std::size_t>(gi)];
      i64 c = e.at(static_cast<std::size_t>(grp.back()));
      // A merged group is walked by one variable; every affine function the scheduler saw
      // scales consistently across it, so its last coefficient says all.
      i64 expect = c;
      for (std::size_t j = grp.size() - 1; j-- > 0;) {
        expect *= k_.space[static_cast<std::size_t>(grp[j + 1])];
        if (e.at(static_cast<std::size_t>(grp[j])) != expect)
          throw Error("kiln CUDA codegen: index not affine in merged loop dims (internal error)");
      }
      if (c == 0) continue;
      if (gi == vec_group_ && lane > 0) constant += c * lane;
      s += (s.empty() ? "" : " + ") + (c == 1 ? std::string() : "(" + lit(c) + ")*") + var(gi);
    }
    if (constant != 0 || s.empty()) s += (s.empty() ? "" : " + ") + std::string("(") + lit(constant) + ")";
    return "(" + s + ")";
  }

  /// Whether the value of `e` differs between the lanes of a vector.
  bool lane_dep(const IndexExpr& e) const { return vec_ > 1 && (e.dep_mask() & vec_mask_) != 0; }

  // ---- index width ----------------------------------------------------------------------------
  static i64 span(const Shape& shape, const Strides& strides) {
    i64 s = 1;
    for (std::size_t d = 0; d < shape.size(); ++d)
      if (shape[d] > 1) s += (shape[d] - 1) * (strides[d] < 0 ? -strides[d] : strides[d]);
    return s;
  }
  /// 64-bit index math unless every size and offset of the graph stays far below 2^31 (the
  /// margin covers grid strides and vector lanes).
  bool needs_64bit() const {
    const i64 lim = i64(1) << 30;
    for (auto& n : g_.nodes) {
      if (n.shape.numel() >= lim) return true;
      if (n.op == Op::Input && span(n.shape, n.strides) >= lim) return true;
    }
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      if (span(node(g_.outputs[o]).shape, g_.output_strides[o]) >= lim) return true;
    return k_.space.numel() >= lim;
  }

  // ---- buffers --------------------------------------------------------------------------------
  void declare(const std::string& name, DType dt, std::size_t slot, bool write) {
    if (!declared_.insert(name).second) return;
    std::string t = stype(dt);
    // Outputs alias inputs only element for element (the front end's rule); every element is
    // read before it is written by the same thread, which keeps __restrict__'s promise.
    decls_.push_back(std::string(write ? "" : "const ") + t + "* __restrict__ " + name + " = (" +
                     (write ? "" : "const ") + t + "*)a.p[" + std::to_string(slot) + "];");
  }
  std::string leaf_pointer(const ir::GraphNode& n) {
    std::string name = "in" + std::to_string(n.leaf);
    declare(name, n.dtype, static_cast<std::size_t>(n.leaf), false);
    return name;
  }
  std::string location_pointer(const sched::Location& loc, DType dt, bool write) {
    std::string name;
    std::size_t slot;
    if (loc.kind == sched::Location::Output) {
      name = "out" + std::to_string(loc.index);
      slot = leaves_ + static_cast<std::size_t>(loc.index);
    } else {
      name = "tmp" + std::to_string(loc.index);
      slot = leaves_ + g_.outputs.size() + static_cast<std::size_t>(loc.index);
    }
    // Outputs and temporaries are declared writable whether this kernel writes or reads them
    // (a kernel never does both to one buffer).
    (void)write;
    declare(name, dt, slot, true);
    return name;
  }
  bool location_aligned(const sched::Location& loc) const {
    return loc.kind != sched::Location::Output || al_.output(loc.index);
  }
  /// Scratch memory for this kernel: `count` elements of `type`; returns the pointer's name.
  std::string scratch_array(const std::string& type, i64 count, std::size_t elem_bytes) {
    scratch_bytes_ = (scratch_bytes_ + 15) / 16 * 16;
    std::string name = fresh("kiln_sp");
    decls_.push_back(type + "* __restrict__ " + name + " = (" + type + "*)((char*)a.p[" + std::to_string(nargs_ - 1) +
                     "] + " + std::to_string(scratch_offset_ + scratch_bytes_) + ");");
    scratch_bytes_ += static_cast<std::size_t>(std::max<i64>(1, count)) * elem_bytes;
    return name;
  }
  static std::size_t acc_bytes(const std::string& acc_t) { return acc_t == "float" || acc_t == "int" ? 4 : 8; }

  // ---- loads and stores ---------------------------------------------------------------------
  /// Whether an access at offset `off` can move VEC lanes as one vector (or, without lanes, be
  /// kept as one element).
  bool vector_ok(const IndexExpr& off, bool aligned) const {
    if (!off.affine()) return false;
    if (!lane_dep(off)) return true;
    if (!aligned || off.at(static_cast<std::size_t>(vec_dim_)) != 1) return false;
    for (int gi = 0; gi < ngroups(); ++gi)
      if (gi != vec_group_ && off.at(static_cast<std::size_t>(last_dim(gi))) % vec_ != 0) return false;
    return off.constant % vec_ == 0;
  }

  struct Chunks {
    std::vector<std::string> text;  ///< one expression per chunk
    std::size_t chunk_bytes = 0;
  };

  /// Chunk texts of a vector (or one-element) access; loads them (or takes them from the row
  /// cache) at scope `sc`.
  Chunks load_chunks(const std::string& ptr, DType dt, const IndexExpr& off, const std::string& ckey, int sc) {
    const std::size_t sz = itemsize(dt);
    const std::size_t n_el = lane_dep(off) ? static_cast<std::size_t>(vec_) : 1;
    const std::size_t bytes = n_el * sz;
    Chunks c;
    c.chunk_bytes = std::min<std::size_t>(bytes, 16);
    const std::size_t nch = bytes >= 16 ? bytes / 16 : 1;
    const std::size_t per = c.chunk_bytes / sz;
    const char* ct = chunk_type(c.chunk_bytes);
    auto cache = cache_.find(ckey);
    if (cache != cache_.end()) {
      CacheSlot& cs = cache->second;
      for (std::size_t j = 0; j < nch; ++j) c.text.push_back(cache_ref(cs, j));
      if (!cs.loaded) {
        cs.loaded = true;
        for (std::size_t j = 0; j < nch; ++j)
          line_at(sc, c.text[j] + " = *(const " + ct + "*)(" + ptr + " + " + render(off) +
                          (j ? " + " + lit(static_cast<i64>(j * per)) : "") + ");");
      }
      return c;
    }
    std::string mkey = "V|" + ckey;
    for (int s = top(); s >= 0; --s) {
      auto it = scopes_[static_cast<std::size_t>(s)].memo.find(mkey);
      if (it != scopes_[static_cast<std::size_t>(s)].memo.end()) {
        for (std::size_t j = 0; j < nch; ++j) c.text.push_back(it->second.expr + "_" + std::to_string(j));
        return c;
      }
    }
    std::string name = fresh("w");
    for (std::size_t j = 0; j < nch; ++j) {
      line_at(sc, "const " + std::string(ct) + " " + name + "_" + std::to_string(j) + " = *(const " + ct + "*)(" + ptr +
                      " + " + render(off) + (j ? " + " + lit(static_cast<i64>(j * per)) : "") + ");");
      c.text.push_back(name + "_" + std::to_string(j));
    }
    scopes_[static_cast<std::size_t>(sc)].memo[mkey] = Val{name, sc, true};
    return c;
  }

  /// The bits of element `lane` of a chunked access, as an unsigned integer of the item's size.
  static std::string extract_bits(const Chunks& c, std::size_t sz, int lane) {
    std::size_t b = static_cast<std::size_t>(lane) * sz;
    std::size_t ci = c.chunk_bytes >= 16 ? b / 16 : 0;
    std::size_t bb = c.chunk_bytes >= 16 ? b % 16 : b;
    const std::string& ch = c.text[ci];
    auto word = [&](std::size_t w) { return ch + word_name(c.chunk_bytes, w); };
    switch (sz) {
      case 8:
        return "(((unsigned long long)" + word(bb / 4 + 1) + " << 32) | (unsigned long long)" + word(bb / 4) + ")";
      case 4:
        return word(bb / 4);
      case 2:
        if (c.chunk_bytes == 2) return ch;
        return "(unsigned short)(" + word(bb / 4) + ((bb % 4) ? " >> 16" : "") + ")";
      default:
        if (c.chunk_bytes == 1) return ch;
        return "(unsigned char)(" + word(bb / 4) + ((bb % 4) ? " >> " + std::to_string(8 * (bb % 4)) : "") + ")";
    }
  }
  std::string from_bits(const std::string& bits, DType dt) {
    switch (dt) {
      case DType::Bool:
        return "(" + bits + " != 0)";
      case DType::Int32:
        return "(int)" + bits;
      case DType::Int64:
        return "(long long)" + bits;
      case DType::Float16:
        needs_.half = true;
        return "kiln_h2f(" + bits + ")";
      case DType::BFloat16:
        needs_.bf16 = true;
        return "kiln_b2f(" + bits + ")";
      case DType::Float32:
        return "__uint_as_float(" + bits + ")";
      case DType::Float64:
        return "__longlong_as_double((long long)" + bits + ")";
    }
    return bits;
  }
  std::string scalar_load(const std::string& ptr, const std::string& off, DType dt) {
    std::string e = ptr + "[" + off + "]";
    switch (dt) {
      case DType::Bool:
        return "(" + e + " != 0)";
      case DType::Float16:
        needs_.half = true;
        return "kiln_h2f(" + e + ")";
      case DType::BFloat16:
        needs_.bf16 = true;
        return "kiln_b2f(" + e + ")";
      default:
        return e;
    }
  }
  std::string to_storage(const std::string& v, DType dt) { return c_family::to_storage(v, dt, needs_); }

  /// The value's bits as an unsigned integer of its item size (for vector stores).
  std::string to_bits(const std::string& v, DType dt) {
    switch (dt) {
      case DType::Bool:
        return "(unsigned int)(" + v + " ? 1u : 0u)";
      case DType::Int32:
        return "(unsigned int)" + v;
      case DType::Int64:
        return "(unsigned long long)" + v;
      case DType::Float16:
        needs_.half = true;
        return "(unsigned int)kiln_f2h(" + v + ")";
      case DType::BFloat16:
        needs_.bf16 = true;
        return "(unsigned int)kiln_f2b(" + v + ")";
      case DType::Float32:
        return "__float_as_uint(" + v + ")";
      case DType::Float64:
        return "(unsigned long long)__double_as_longlong(" + v + ")";
    }
    return v;
  }
  std::string round16(const std::string& v, DType dt) { return c_family::round16(v, dt, needs_); }

  /// Reads element `off` of `ptr` for lane `lane`: from a vector (or the row cache) when the
  /// access allows, else one element.
  Val load_access(const std::string& ptr, DType dt, const IndexExpr& off, bool aligned, const std::string& ckey,
                  const std::string& key, int lane) {
    const bool ld = lane_dep(off);
    const int sc = scope_for(off.dep_mask());
    if ((ld || cache_.count(ckey)) && vector_ok(off, aligned)) {
      Chunks c = load_chunks(ptr, dt, off, ckey, sc);
      return emit(sc, key, ld, lane, dt, from_bits(extract_bits(c, itemsize(dt), ld ? lane : 0), dt));
    }
    return emit(sc, key, ld, lane, dt, scalar_load(ptr, render(off, ld ? lane : 0), dt));
  }

  /// Writes the value of store `st` at `idx` to each of its targets, all lanes.
  void store(const sched::Store& st, const Index& idx) {
    const ir::GraphNode& n = node(st.node);
    const int lanes = vec_ > 1 ? vec_ : 1;
    if (!store_guard_.empty()) open("if (" + store_guard_ + ")");
    for (auto& t : st.targets) {
      IndexExpr off = sched::strided_offset(idx, t.strides, n.shape);
      std::string p = location_pointer(t, n.dtype, true);
      const bool ld = lane_dep(off);
      if (ld && vector_ok(off, location_aligned(t))) {
        const std::size_t sz = itemsize(n.dtype);
        const std::size_t bytes = static_cast<std::size_t>(vec_) * sz;
        const std::size_t cb = std::min<std::size_t>(bytes, 16);
        const std::size_t nch = bytes >= 16 ? bytes / 16 : 1;
        std::vector<std::string> bits;
        for (int j = 0; j < lanes; ++j) {
          Val v = stored_value(st.node, idx, j);
          std::string b = fresh("b");
          line(std::string(sz == 8 ? "const unsigned long long " : "const unsigned int ") + b + " = " +
               to_bits(v.expr, n.dtype) + ";");
          bits.push_back(b);
        }
        const std::size_t per_chunk = cb / sz;
        for (std::size_t c = 0; c < nch; ++c) {
          std::vector<std::string> words(std::max<std::size_t>(1, cb / 4), "");
          for (std::size_t e = 0; e < per_chunk; ++e) {
            const std::string& b = bits[c * per_chunk + e];
            std::size_t byte = e * sz;
            if (sz == 8) {
              words[byte / 4] = "(unsigned int)" + b;
              words[byte / 4 + 1] = "(unsigned int)(" + b + " >> 32)";
            } else {
              std::string part = (byte % 4) ? "(" + b + " << " + std::to_string(8 * (byte % 4)) + ")" : b;
              std::string& w = words[byte / 4];
              w = w.empty() ? part : w + " | " + part;
            }
          }
          std::string ct = chunk_type(cb);
          std::string target = "*(" + ct + "*)(" + p + " + " + render(off) +
                               (c ? " + " + lit(static_cast<i64>(c * per_chunk)) : "") + ")";
          std::string val;
          if (cb == 16)
            val = "make_uint4(" + words[0] + ", " + words[1] + ", " + words[2] + ", " + words[3] + ")";
          else if (cb == 8)
            val = "make_uint2(" + words[0] + ", " + words[1] + ")";
          else
            val = "(" + ct + ")(" + words[0] + ")";
          line(target + " = " + val + ";");
        }
        continue;
      }
      for (int j = 0; j < (ld ? lanes : 1); ++j) {
        Val v = stored_value(st.node, idx, j);
        line(p + "[" + render(off, j) + "] = " + to_storage(v.expr, n.dtype) + ";");
      }
    }
    if (!store_guard_.empty()) close();
  }

  /// The value a store converts to its storage type. A cast from f32 to f16/bf16 is already
  /// that conversion: storing the f32 input gives the same bits (f2b(b2f(f2b(x))) == f2b(x))
  /// without rounding twice.
  Val stored_value(int id, const Index& idx, int lane) {
    const ir::GraphNode& n = node(id);
    if (n.op == Op::Cast && (n.dtype == DType::Float16 || n.dtype == DType::BFloat16) &&
        node(n.inputs[0]).dtype == DType::Float32)
      return value(n.inputs[0], idx, lane);
    return value(id, idx, lane);
  }

  // ---- values ---------------------------------------------------------------------------------
  Val emit(int scope, const std::string& key, bool lane_dependent, int lane, DType dt, const std::string& expr) {
    std::string name = fresh("v");
    line_at(scope, "const " + std::string(ctype(dt)) + " " + name + " = " + expr + ";");
    Val v{name, scope, lane_dependent};
    scopes_[static_cast<std::size_t>(scope)].memo[key + (lane_dependent ? "|" + std::to_string(lane) : "|*")] = v;
    return v;
  }
  const Val* find(const std::string& key) const {
    for (int s = top(); s >= 0; --s) {
      auto& memo = scopes_[static_cast<std::size_t>(s)].memo;
      auto it = memo.find(key);
      if (it != memo.end()) return &it->second;
    }
    return nullptr;
  }
  void remember(const std::string& key, const Val& v, int lane) {
    scopes_[static_cast<std::size_t>(v.scope)].memo[key + (v.lane ? "|" + std::to_string(lane) : "|*")] = v;
  }

  /// The value of node `id` at `idx` for lane `lane`: computed inline, read from memory, a
  /// register or the row cache, placed in the outermost scope where everything it uses exists.
  Val value(int id, const Index& idx, int lane) {
    const std::string key = std::to_string(id) + "|" + sched::index_key(idx);
    if (const Val* v = find(key + "|*")) return *v;
    if (const Val* v = find(key + "|" + std::to_string(lane))) return *v;
    const ir::GraphNode& n = node(id);
    // A value another kernel stored (an output or a temporary that this kernel reads, not only
    // a reduction) is loaded, as the schedule ordered this kernel after that one to do.
    if (!ir::is_reduction(n.op) && ir::op_kind(n.op) != ir::OpKind::Leaf &&
        sched::detail::reads_memory(s_, id, kid_, g_)) {
      const sched::Location& loc = s_.location[static_cast<std::size_t>(id)];
      IndexExpr off = sched::strided_offset(idx, loc.strides, n.shape);
      return load_access(location_pointer(loc, n.dtype, false), n.dtype, off, location_aligned(loc),
                         "R" + std::to_string(id) + "|" + off.key(), key, lane);
    }
    switch (ir::op_kind(n.op)) {
      case ir::OpKind::Leaf: {
        if (n.op == Op::Input) {
          IndexExpr off = sched::strided_offset(idx, n.strides, n.shape);
          return load_access(leaf_pointer(n), n.dtype, off, al_.input(n.leaf),
                             "L" + std::to_string(id) + "|" + off.key(), key, lane);
        }
        if (n.op == Op::Constant) return Val{constant_literal(n), 0, false};
        if (n.op == Op::Iota) {
          const IndexExpr& e = idx[static_cast<std::size_t>(n.attrs.ints.at(0))];
          bool ld = lane_dep(e);
          return emit(scope_for(e.dep_mask()), key, ld, lane, n.dtype,
                      cast_from_index(render(e, ld ? lane : 0), n.dtype));
        }
        // The front end gives GPU graphs the seed as a literal (numbers are not kernel
        // arguments on CUDA yet).
        if (!n.inputs.empty()) throw InternalError("kiln CUDA codegen: random with its seed as an input");
        IndexExpr flat = sched::flat_index(idx, n.shape);
        bool ld = lane_dep(flat);
        return emit(scope_for(flat.dep_mask()), key, ld, lane, n.dtype, random_expr(n, render(flat, ld ? lane : 0)));
      }
      case ir::OpKind::Reduce: {
        if (s_.owner[static_cast<std::size_t>(id)] == kid_) {
          auto it = bound_.find(id);
          if (it == bound_.end()) throw Error("kiln CUDA codegen: reduction used before its pass (internal error)");
          const Binding& b = it->second;
          int sc = std::max(b.min_scope, scope_for(b.dims));
          bool ld = b.text.size() > 1;
          return Val{b.text[ld ? static_cast<std::size_t>(lane) : 0], sc, ld};
        }
        const sched::Location& loc = s_.location[static_cast<std::size_t>(id)];
        if (loc.kind == sched::Location::None)
          throw Error("kiln CUDA codegen: a reduction read from memory has no buffer (internal error)");
        IndexExpr off = sched::strided_offset(idx, loc.strides, n.shape);
        return load_access(location_pointer(loc, n.dtype, false), n.dtype, off, location_aligned(loc),
                           "R" + std::to_string(id) + "|" + off.key(), key, lane);
      }
      case ir::OpKind::IndexMap: {
        if (n.op != Op::Concat) {
          Val v = value(n.inputs[0], sched::input_index(g_, n, 0, idx, k_.space), lane);
          remember(key, v, lane);
          return v;
        }
        // Every piece is read at a clamped (valid) index, then the right one is selected.
        const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
        const bool pos_ld = lane_dep(idx[axis]);
        std::string pos = render(idx[axis], pos_ld ? lane : 0);
        std::vector<Val> parts;
        std::vector<i64> ends;
        i64 off = 0;
        int sc = scope_for(idx[axis].dep_mask());
        bool ld = pos_ld;
        for (std::size_t k = 0; k < n.inputs.size(); ++k) {
          i64 len = node(n.inputs[k]).shape[axis];
          off += len;
          if (len == 0) continue;
          parts.push_back(value(n.inputs[k], sched::input_index(g_, n, k, idx, k_.space), lane));
          ends.push_back(off);
          sc = std::max(sc, parts.back().scope);
          ld = ld || parts.back().lane;
        }
        std::string e = parts.back().expr;
        for (std::size_t k = parts.size() - 1; k-- > 0;)
          e = "(" + pos + " < " + lit(ends[k]) + " ? " + parts[k].expr + " : " + e + ")";
        return emit(sc, key, ld, lane, n.dtype, e);
      }
      default:
        break;
    }
    auto cached = vcache_.find(key);
    if (cached != vcache_.end() && cached->second.pass > 0 && cached->second.pass < cur_pass_)
      // Computed by an earlier pass of this row and kept in registers.
      return emit(top(), key, vec_ > 1, lane, n.dtype, cached->second.name + "[" + value_slot(lane) + "]");
    std::vector<Val> in;
    int sc = 0;
    bool ld = false;
    for (auto i : n.inputs) {
      in.push_back(value(i, idx, lane));
      sc = std::max(sc, in.back().scope);
      ld = ld || in.back().lane;
    }
    Val v = emit(sc, key, ld, lane, n.dtype, pointwise_expr(n, in));
    if (cached != vcache_.end() && cur_pass_ > 0 && loop_scope_ >= 0 && v.scope >= loop_scope_ &&
        (cached->second.pass == 0 || cached->second.pass == cur_pass_)) {
      line_at(v.scope, cached->second.name + "[" + value_slot(lane) + "] = " + v.expr + ";");
      cached->second.pass = cur_pass_;
    }
    return v;
  }

  /// Register slot of the current position's lane in a row's value cache.
  std::string value_slot(int lane) const {
    return "(" + slot_var_ + ") * " + std::to_string(vec_) + " + " + std::to_string(lane);
  }

  /// Transcendental values along the row that more than one pass computes (softmax's
  /// exp(x - max): the sum's pass and the output's pass): kept in registers after the first.
  std::map<std::string, int> multi_pass_values() const {
    std::map<std::string, std::set<int>> passes;
    std::map<std::string, int> nodes;
    Index id = sched::identity_index(k_.space);
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::unordered_set<std::string> seen;
      std::function<void(int, const Index&)> walk = [&](int nid, const Index& idx) {
        const std::string key = std::to_string(nid) + "|" + sched::index_key(idx);
        if (!seen.insert(key).second) return;
        const ir::GraphNode& n = node(nid);
        if (ir::op_kind(n.op) == ir::OpKind::Leaf || ir::op_kind(n.op) == ir::OpKind::Reduce ||
            ir::op_kind(n.op) == ir::OpKind::IndexMap)
          return;
        if (sched::detail::reads_memory(s_, nid, kid_, g_)) return;  // stored by another kernel: loaded, not computed
        if (ir::has_flag(n.op, ir::kMathCall) && n.dtype == DType::Float32) {
          passes[key].insert(pass);
          nodes[key] = nid;
        }
        for (std::size_t k = 0; k < n.inputs.size(); ++k)
          walk(n.inputs[k], sched::input_index(g_, n, k, idx, k_.space));
      };
      for (std::size_t j = 0; j < k_.reductions.size(); ++j)
        if (folded_in(j, pass)) walk(node(k_.reductions[j]).inputs[0], id);
      for (auto& st : k_.stores)
        if (st.level == sched::Level::Full && st.pass == pass) walk(st.node, id);
    }
    std::map<std::string, int> out;
    for (auto& [key, ps] : passes)
      if (ps.size() > 1) out[key] = nodes[key];
    return out;
  }

  /// 1/d (f32) and whether it is a normal number, computed once where d is.
  std::string reciprocal(const Val& d) {
    const std::string key = "RCP|" + d.expr;
    for (int s = top(); s >= 0; --s) {
      auto it = scopes_[static_cast<std::size_t>(s)].memo.find(key);
      if (it != scopes_[static_cast<std::size_t>(s)].memo.end()) return it->second.expr;
    }
    std::string rc = fresh("rc");
    line_at(d.scope, "const float " + rc + " = 1.0f / " + d.expr + ";");
    line_at(d.scope, "const bool " + rc + "_ok = fabsf(" + rc + ") >= 0x1p-126f && fabsf(" + rc + ") <= 0x1p+126f;");
    scopes_[static_cast<std::size_t>(d.scope)].memo[key] = Val{rc, d.scope, d.lane};
    return rc;
  }

  std::string cast_from_index(const std::string& v, DType t) {
    switch (t) {
      case DType::Bool:
        return "(" + v + " != 0)";
      case DType::Int32:
        return "(int)" + v;
      case DType::Int64:
        return "(long long)" + v;
      case DType::Float64:
        return "(double)" + v;
      case DType::Float32:
        return "(float)" + v;
      default:
        return round16("(float)" + v, t);
    }
  }

  std::string random_expr(const ir::GraphNode& n, const std::string& flat) {
    return c_family::random_expr(n, flat, needs_, kWriter);
  }

  [[noreturn]] void unsupported(const ir::GraphNode& n, DType in) const { c_family::unsupported(kWriter, n, in); }

  std::string cast_expr(const std::string& a, DType from, DType to) {
    if (from == to) return a;
    if (to == DType::Bool) return "(" + a + " != 0)";
    if (from == DType::Bool)
      return is_floating(to) ? round16(std::string("(") + ctype(to) + ")(" + a + " ? 1 : 0)", to)
                             : "(" + std::string(ctype(to)) + ")(" + a + " ? 1 : 0)";
    if (is_integral(to)) {
      if (is_floating(from)) {
        needs_.ints = true;
        return std::string(to == DType::Int32 ? "kiln_f2i32" : "kiln_f2i64") + "((double)" + a + ")";
      }
      return "(" + std::string(ctype(to)) + ")" + a;  // integer narrowing wraps
    }
    return round16("(" + std::string(ctype(to)) + ")" + a, to);
  }

  /// __fadd_rn(a, b) (or __dsub_rn, ...): one correctly rounded op NVRTC keeps apart.
  static std::string rounded_op(bool dbl, const char* op, const std::string& a, const std::string& b) {
    return std::string(dbl ? "__d" : "__f") + op + "_rn(" + a + ", " + b + ")";
  }

  std::string pointwise_expr(const ir::GraphNode& n, const std::vector<Val>& in) {
    const DType t = n.dtype;
    const DType it = node(n.inputs[0]).dtype;
    const std::string a = in[0].expr;
    const std::string b = in.size() > 1 ? in[1].expr : std::string();
    const bool fl = is_floating(it);
    const bool dbl = it == DType::Float64;
    // Math by its C name (the op table's kLibmName): CUDA's expf(a), atan2(a, b), ...
    if (ir::has_flag(n.op, ir::kLibmName)) {
      if (!fl) unsupported(n, it);
      return round16(c_family::libm_call(c_family::kCudaDialect, ir::op_name(n.op), dbl) + a +
                         (in.size() > 1 ? ", " + b : std::string()) + ")",
                     t);
    }
    switch (n.op) {
      case Op::Cast:
        return cast_expr(a, it, t);
      // Floating +, - and * through the _rn intrinsics, which NVRTC never contracts into a
      // fused multiply-add: each op rounds as the reference and the CPU kernels round them
      // (-ffp-contract=off). A contracted x*y - max(x*y) is the product's rounding error, not 0,
      // and for huge products exp of it overflows: softmax of 1e30-sized logits gave NaN.
      case Op::Add:
        if (fl) return round16(rounded_op(dbl, "add", a, b), t);
        break;
      case Op::Sub:
        if (fl) return round16(rounded_op(dbl, "sub", a, b), t);
        break;
      case Op::Mul:
        if (fl) return round16(rounded_op(dbl, "mul", a, b), t);
        break;
      case Op::Div:
        if (fl && !dbl && t_.reciprocal_div && in[1].scope < in[0].scope) {
          // A divisor computed outside the loop (softmax's row sum): one division per row and a
          // multiply per element, within 1.5 ulp of the quotient. Where 1/d is not a normal
          // number (d = 0, Inf, NaN, huge or tiny) the exact division runs instead.
          std::string rc = reciprocal(in[1]);
          return round16("(" + rc + "_ok ? " + a + " * " + rc + " : " + a + " / " + b + ")", t);
        }
        if (fl) return round16("(" + a + " / " + b + ")", t);
        break;
      default:
        break;
    }
    // Everything else reads the same in every dialect (codegen/c/pointwise.hpp).
    const std::string c = in.size() > 2 ? in[2].expr : std::string();
    const c_family::PointwiseHooks hooks{c_family::kCudaDialect, needs_, kWriter};
    if (std::string e = c_family::pointwise_expr({n, it, a, b, c}, hooks); !e.empty()) return e;
    throw Error(std::string("kiln CUDA codegen: no code for op ") + ir::op_name(n.op));
  }

  // ---- analysis -------------------------------------------------------------------------------
  /// Every memory access of the kernel (leaf reads, reductions read from memory, stores) and
  /// the dims read by opaque index expressions.
  struct Access {
    IndexExpr off;
    std::size_t itemsize;
  };
  void collect(std::vector<Access>& acc, std::uint64_t& opaque) const {
    auto visit = [&](int root, const Index& idx) {
      sched::detail::Visitor v;
      // Values another kernel stored (not only reductions) are read from memory here.
      v.boundary = [&](int n) { return sched::detail::reads_memory(s_, n, kid_, g_); };
      v.leaf = [&](int n, const Index& i) {
        const ir::GraphNode& nn = node(n);
        acc.push_back({sched::strided_offset(i, nn.strides, nn.shape), itemsize(nn.dtype)});
      };
      v.reduction = [&](int q, const Index& i) {
        if (s_.owner[static_cast<std::size_t>(q)] == kid_) return;
        const ir::GraphNode& nn = node(q);
        acc.push_back(
            {sched::strided_offset(i, s_.location[static_cast<std::size_t>(q)].strides, nn.shape), itemsize(nn.dtype)});
      };
      std::unordered_set<std::string> seen;
      sched::detail::walk(g_, root, idx, k_.space, v, seen);
      opaque |= v.opaque;
    };
    Index id = sched::identity_index(k_.space);
    for (int r : k_.reductions) visit(node(r).inputs[0], id);
    for (int f : k_.finals) visit(node(f).inputs[0], sched::identity_index(k_.row_shape()));
    for (auto& st : k_.stores) {
      const ir::GraphNode& nn = node(st.node);
      Index idx = sched::detail::level_index(k_, st.level, nn.shape);
      if (!ir::is_reduction(nn.op)) visit(st.node, idx);
      for (auto& t : st.targets) acc.push_back({sched::strided_offset(idx, t.strides, nn.shape), itemsize(nn.dtype)});
    }
  }

  /// Lanes per thread along group `gi`: 16 bytes of the narrowest access that walks it with
  /// unit stride (at most 8 lanes), 1 when none does or an opaque index depends on it.
  int choose_vec(int gi, bool need_divisible) const {
    if (gi < 0) return 1;
    std::vector<Access> acc;
    std::uint64_t opaque = 0;
    collect(acc, opaque);
    if (opaque & group_mask(gi)) return 1;
    const std::size_t d = static_cast<std::size_t>(last_dim(gi));
    std::size_t narrow = 0;
    for (auto& a : acc)
      if (a.off.affine() && a.off.at(d) == 1 && (narrow == 0 || a.itemsize < narrow)) narrow = a.itemsize;
    if (narrow == 0) return 1;
    int v = static_cast<int>(std::min<std::size_t>(8, 16 / narrow));
    // A group with the symbolic size divides by v for every size when its other dims do.
    if (need_divisible)
      while (v > 1 && static_extent(gi) % v != 0) v /= 2;
    return std::max(1, v);
  }

  void set_vec(int gi, int v) {
    vec_group_ = v > 1 ? gi : -1;
    vec_ = v;
    vec_dim_ = gi >= 0 ? last_dim(gi) : -1;
    vec_mask_ = gi >= 0 && v > 1 ? group_mask(gi) : 0;
  }

  /// Defines the variables of `groups` (outer to inner) from the flat position `t` (`lanes`
  /// consecutive positions of the innermost group per step).
  void decode(const std::string& t, const std::vector<int>& groups, int lanes = 1) {
    std::vector<std::string> lines;
    std::string rest = t;
    for (std::size_t j = groups.size(); j-- > 0;) {
      int gi = groups[j];
      bool inner = j + 1 == groups.size();
      i64 step = inner ? lanes : 1;
      const std::string count = extent_text(gi, step);
      std::string val = j == 0 ? rest : "(" + rest + " % " + count + ")";
      if (step != 1) val = val + " * " + lit(step);
      lines.push_back("const " + it_ + " " + var(gi) + " = " + val + ";");
      if (j > 0) rest = "(" + rest + " / " + count + ")";
    }
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) line(*it);
  }

  // ---- a symbolic size: the leading dim of the space, read at launch --------------------------
  /// The kernel's copy of the size (the argument struct's `n`).
  static constexpr const char* kSizeVar = "kiln_n";
  /// Whether group `gi` holds the symbolic dim (dim 0 of a symbolic kernel's space).
  bool sym_group(int gi) const {
    if (!sym_) return false;
    for (int d : k_.loops.groups[static_cast<std::size_t>(gi)])
      if (d == 0) return true;
    return false;
  }
  /// The group's extent without the symbolic dim: its extent per unit of the size.
  i64 static_extent(int gi) const {
    i64 e = 1;
    for (int d : k_.loops.groups[static_cast<std::size_t>(gi)])
      if (!(sym_ && d == 0)) e *= k_.space[static_cast<std::size_t>(d)];
    return e;
  }
  /// C text of the group's extent divided by `div` (which divides it for every size).
  std::string extent_text(int gi, i64 div = 1) const {
    if (!sym_group(gi)) return lit(extent(gi) / div);
    const i64 e = static_extent(gi);
    if (e % div == 0) return "(" + std::string(kSizeVar) + " * " + lit(e / div) + ")";
    return "(" + std::string(kSizeVar) + " * " + lit(e) + " / " + lit(div) + ")";
  }
  /// The product of the space's dims other than the symbolic one (the work per unit of size).
  i64 per_size(const std::vector<int>& groups) const {
    i64 e = 1;
    for (int gi : groups) e *= static_extent(gi);
    return e;
  }
  /// "(ceil(n * 64 / 4 / 512) <= 1024)": a grid that follows the size n (logs).
  static std::string rule_text(const CudaGridRule& r) {
    std::string u = "n";
    if (r.units_per_size != 1) u += " * " + std::to_string(r.units_per_size);
    if (r.size_divisor != 1) u += " / " + std::to_string(r.size_divisor);
    if (r.units_per_block != 1) u = "ceil(" + u + " / " + std::to_string(r.units_per_block) + ")";
    return "(" + u + " <= " + std::to_string(r.max_grid) + ")";
  }

  // ---- pointwise kernels ----------------------------------------------------------------------
  void pointwise() {
    const auto& p = k_.loops;
    const int block = std::clamp(t_.pointwise_block, 32, 1024) / 32 * 32;
    info_.block = block;
    const i64 numel = k_.space.numel();
    if (p.order.empty()) {
      info_.grid = 1;
      info_.strategy = "pointwise, one element";
      open("if (blockIdx.x == 0 && threadIdx.x == 0)");
      for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
      close();
      return;
    }
    const int inner = p.order.back();
    const bool single = p.order.size() == 1;
    const bool heavy = heavy_ops() > 4;
    int v = choose_vec(inner, !single);
    if (heavy && t_.pointwise_lanes_heavy > 0) v = std::min(v, t_.pointwise_lanes_heavy);
    set_vec(inner, v);
    const i64 nvec = numel / v;
    const i64 tail = numel - nvec * v;
    const int unroll = std::max(1, heavy ? t_.pointwise_unroll_heavy : t_.pointwise_unroll);
    // Each thread takes `unroll` vectors and leaves (the hardware balances blocks across the
    // GPU); only very large tensors loop, over at most 256 blocks' worth per multiprocessor.
    const i64 per_block = static_cast<i64>(block) * unroll;
    // A symbolic size: the vectors, the tail and the grid follow the size read at launch.
    const i64 per_n = sym_ ? per_size(p.order) : 0;
    std::string nv = lit(nvec);
    if (sym_) {
      info_.grid = 0;
      info_.grid_rule = CudaGridRule{per_n, v, per_block, t_.sm_count * i64(256)};
      nv = "kiln_nv";
      line("const long long kiln_nv = " +
           (per_n % v == 0 ? std::string(kSizeVar) + " * " + lit(per_n / v)
                           : std::string(kSizeVar) + " * " + lit(per_n) + " / " + lit(v)) +
           ";");
    } else {
      info_.grid = static_cast<unsigned>(
          std::max<i64>(1, std::min<i64>((nvec + per_block - 1) / per_block, t_.sm_count * i64(256))));
    }
    info_.strategy = "pointwise, " + std::to_string(v) + " lane(s) per thread, grid " +
                     (sym_ ? rule_text(info_.grid_rule) : std::to_string(info_.grid)) + "x" + std::to_string(block);
    if (unroll > 1) info_.strategy += ", " + std::to_string(unroll) + " steps per iteration";
    if (sym_ || nvec > 0) {
      auto body = [&](const std::string& t) {
        open("", groups_mask(p.order));
        decode(t, p.order, v);
        for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
        close();
      };
      line(it_ + " t = (" + it_ + ")blockIdx.x * " + lit(block) + " + threadIdx.x;");
      line("const " + it_ + " G = (" + it_ + ")gridDim.x * " + lit(block) + ";");
      if (unroll > 1) {
        // Whole steps without bounds checks, so the loads of every element are in flight at once.
        open("for (; t + " + lit(unroll - 1) + " * G < " + nv + "; t += " + lit(unroll) + " * G)");
        for (int u = 0; u < unroll; ++u) {
          std::string tu = "tu" + std::to_string(u);
          line("const " + it_ + " " + tu + " = t + " + lit(u) + " * G;");
          body(tu);
        }
        close();
        open("for (; t < " + nv + "; t += G)");
        body("t");
        close();
      } else {
        open("for (; t < " + nv + "; t += G)");
        body("t");
        close();
      }
    }
    // With a symbolic size, a tail is possible when the work per unit of size is not a whole
    // number of vectors (then the space is one group: the tail's position is its variable).
    if (sym_ ? per_n % v != 0 : tail > 0) {
      // The elements the vectors leave over, one per thread of the first block.
      set_vec(inner, 1);
      const std::string left =
          sym_ ? "(long long)threadIdx.x < " + std::string(kSizeVar) + " * " + lit(per_n) + " - " + nv + " * " + lit(v)
               : "threadIdx.x < " + std::to_string(tail);
      open("if (blockIdx.x == 0 && " + left + ")", groups_mask(p.order));
      line("const " + it_ + " " + var(inner) + " = " + (sym_ ? nv + " * " + lit(v) : lit(nvec * v)) + " + (" + it_ +
           ")threadIdx.x;");
      for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
      close();
    }
  }

  /// Transcendental functions a pointwise kernel evaluates per element (heavy bodies are not
  /// unrolled: they are bound by arithmetic, and code size costs compile time).
  int heavy_ops() const {
    std::set<int> seen;
    std::vector<int> todo;
    for (auto& st : k_.stores) todo.push_back(st.node);
    int heavy = 0;
    while (!todo.empty()) {
      int n = todo.back();
      todo.pop_back();
      if (!seen.insert(n).second) continue;
      const ir::GraphNode& nn = node(n);
      if (ir::has_flag(nn.op, ir::kMathCall) || nn.op == Op::Random) ++heavy;
      if (nn.op == Op::Input || ir::is_reduction(nn.op)) continue;
      for (int i : nn.inputs) todo.push_back(i);
    }
    return heavy;
  }

  // ---- reductions: shared pieces --------------------------------------------------------------
  /// Whether the kernel's reduction j is folded element by element in pass p's loop (a one-hot
  /// pick of that phase is loaded once instead: bind_picks).
  bool folded_in(std::size_t j, int p) const { return k_.phase[j] == p && !picks_.count(k_.reductions[j]); }
  std::vector<Red> phase_reds(int p) const {
    std::vector<Red> v;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (folded_in(j, p)) v.push_back(red_info(g_, k_.reductions[j]));
    return v;
  }
  std::vector<Red> final_reds() const {
    std::vector<Red> v;
    for (int f : k_.finals) v.push_back(red_info(g_, f));
    return v;
  }
  static std::string acc_name(const Red& r, const std::string& suffix = "") {
    return "a" + std::to_string(r.node) + suffix;
  }
  static std::string idx_name(const Red& r, const std::string& suffix = "") {
    return "x" + std::to_string(r.node) + suffix;
  }
  void declare_acc(const Red& r, const std::string& suffix = "") {
    line(r.acc_t + " " + acc_name(r, suffix) + " = " + r.init + ";");
    if (r.arg) line("long long " + idx_name(r, suffix) + " = -1;");
    if (r.online_sum >= 0) line("double " + sum_name(r, suffix) + " = 0.0;");
  }
  static std::string sum_name(const Red& r, const std::string& suffix = "") {
    return "a" + std::to_string(r.online_sum) + suffix;
  }
  std::string finish(const Red& r, const std::string& a, const std::string& x) {
    switch (r.op) {
      case Op::ReduceSum:
      case Op::ReduceProd:
        if (r.fl) return round16("(" + std::string(ctype(r.out)) + ")" + a, r.out);
        if (r.out == DType::Bool) return "(" + a + " != 0)";
        return "(" + std::string(ctype(r.out)) + ")(long long)" + a;
      case Op::ReduceMax:
      case Op::ReduceMin:
        if (r.out == DType::Bool) return "(" + a + " != 0)";
        return a;
      default:
        return "(" + x + " < 0 ? 0LL : " + x + ")";
    }
  }
  /// The position of the element along the reduced dims, row-major (arg reductions).
  std::string reduced_position(int lane) const {
    IndexExpr f = sched::ix_const(0);
    i64 mult = 1;
    for (std::size_t d = k_.space.size(); d-- > 0;) {
      if (!k_.reduced[d] || k_.space[d] == 1) continue;
      f = sched::ix_add(f,
                        sched::ix_scale(sched::ix_var(static_cast<int>(d), static_cast<int>(k_.space.size())), mult));
      mult *= k_.space[d];
    }
    return "(long long)" + render(f, lane);
  }
  /// The position of the current row among all rows, row-major (arg finals).
  std::string row_position(int lane) const {
    Shape rs = k_.row_shape();
    IndexExpr f = sched::flat_index(sched::identity_index(rs), rs);
    if (f.affine()) f.coeff.resize(k_.space.size(), 0);
    return "(long long)" + render(f, lane);
  }

  /// Folds every lane's value of the inputs of `reds` into accumulators (`per_lane`: one
  /// accumulator per lane, for columns), then writes the Full stores of `pass`.
  /// Whether every term of a float sum is >= 0 (or NaN) by construction: then the lanes of a
  /// vector may be added in f32 first (pairwise: a few ulp of a sum of like-signed terms)
  /// before the double accumulator, one conversion per vector instead of per element.
  bool nonnegative(int id) const {
    const ir::GraphNode& n = node(id);
    switch (n.op) {
      case Op::Exp:
      case Op::Exp2:
      case Op::Abs:
      case Op::Sqrt:
        return true;
      case Op::Mul:
        return n.inputs[0] == n.inputs[1];
      default:
        return false;
    }
  }
  static std::string pairwise(std::vector<std::string> v) {
    while (v.size() > 1) {
      std::vector<std::string> next;
      for (std::size_t i = 0; i + 1 < v.size(); i += 2) next.push_back("(" + v[i] + " + " + v[i + 1] + ")");
      if (v.size() % 2) next.push_back(v.back());
      v = std::move(next);
    }
    return v[0];
  }
  /// Online max and sum of exp over the lanes of one vector: the vector's max first, so the
  /// running max (and the rescale of the sum) changes at most once per vector.
  static std::string online_step_vector(const Red& r, const std::string& m, const std::string& s,
                                        const std::vector<std::string>& v) {
    const bool dbl = r.in == DType::Float64;
    const std::string t = r.acc_t, ex = dbl ? "exp(" : "expf(", ninf = dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)";
    std::string out = "{ " + t + " vm = " + v[0] + "; ";
    for (std::size_t j = 1; j < v.size(); ++j)
      out += "vm = (" + v[j] + " > vm || " + v[j] + " != " + v[j] + ") ? " + v[j] + " : vm; ";
    out += "const " + t + " nm = (vm > " + m + " || vm != vm) ? vm : " + m + "; if (nm != " + m + ") { " + s +
           " *= (double)" + ex + m + " - nm); " + m + " = nm; } ";
    std::vector<std::string> terms;
    for (auto& x : v) terms.push_back(ex + x + " - " + m + ")");
    // Each term is at most 1 (or NaN): added in the compute type first. While the max is
    // still -inf every value so far is -inf and contributes nothing.
    out += "if (" + m + " != " + ninf + ") " + s + " += (double)" + pairwise(terms) + "; }";
    return out;
  }

  void fold_body(const std::vector<Red>& reds, int pass, bool per_lane) {
    Index id = sched::identity_index(k_.space);
    const int lanes = vec_ > 1 ? vec_ : 1;
    for (auto& r : reds) {
      if (!per_lane && lanes > 1 &&
          (r.online_sum >= 0 ||
           (r.op == Op::ReduceSum && r.fl && r.in != DType::Float64 && nonnegative(node(r.node).inputs[0])))) {
        std::vector<std::string> vals;
        for (int j = 0; j < lanes; ++j) vals.push_back(value(node(r.node).inputs[0], id, j).expr);
        if (r.online_sum >= 0)
          line(online_step_vector(r, acc_name(r), sum_name(r), vals));
        else
          line(acc_name(r) + " += (double)" + pairwise(vals) + ";");
        continue;
      }
      for (int j = 0; j < lanes; ++j) {
        Val v = value(node(r.node).inputs[0], id, j);
        std::string sfx = per_lane ? "_" + std::to_string(j) : "";
        if (r.online_sum >= 0)
          line(online_step(r, acc_name(r, sfx), sum_name(r, sfx), v.expr));
        else
          line(step(r, acc_name(r, sfx), idx_name(r, sfx), v.expr, r.arg ? reduced_position(j) : "0"));
      }
    }
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Full && st.pass == pass) store(st, id);
  }

  /// Butterfly over the 32 lanes of each warp (every lane ends with the warp's combination).
  /// An online (max, sum of exp) pair combines its maxima first, then rescales each lane's sum
  /// once to the warp's max and adds the sums: one exp per lane, where merging pairs would
  /// take two per step (ten, each inlined: a fifth of NVRTC's time on N6's kernel).
  void warp_reduce(const std::vector<Red>& reds, const std::string& sfx = "") {
    if (reds.empty()) return;
    std::vector<std::string> merges, sums;
    for (auto& r : reds) {
      const std::string a = acc_name(r, sfx), x = idx_name(r, sfx);
      merges.push_back("{ const " + r.acc_t + " pv = __shfl_xor_sync(0xffffffffu, " + a + ", o);" +
                       (r.arg ? " const long long px = __shfl_xor_sync(0xffffffffu, " + x + ", o);" : "") + " " +
                       merge(r, a, x, "pv", r.arg ? "px" : "0") + " }");
      if (r.online_sum >= 0)
        sums.push_back(sum_name(r, sfx) + " += __shfl_xor_sync(0xffffffffu, " + sum_name(r, sfx) + ", o);");
    }
    if (sums.empty()) {
      butterfly(merges);
      return;
    }
    open("");
    for (auto& r : reds)
      if (r.online_sum >= 0)
        line("const " + r.acc_t + " kiln_om" + std::to_string(r.node) + sfx + " = " + acc_name(r, sfx) + ";");
    butterfly(merges);
    for (auto& r : reds)
      if (r.online_sum >= 0) {
        const std::string own = "kiln_om" + std::to_string(r.node) + sfx;
        line(sum_name(r, sfx) + " = " + rescaled_sum(r, sum_name(r, sfx), own, acc_name(r, sfx)) + ";");
      }
    butterfly(sums);
    close();
  }

  /// The loop over the butterfly's distances o = 16, 8, ..., 1, doing `steps` at each.
  void butterfly(const std::vector<std::string>& steps) {
    open("for (int o = 16; o > 0; o >>= 1)", 0, "#pragma unroll");
    for (auto& st : steps) line(st);
    close();
  }

  /// Online pair `r`'s sum `sum`, kept relative to max `from`, made relative to the larger max
  /// `to`. Equal maxima keep the sum (also two infinities, where the exp would give NaN).
  static std::string rescaled_sum(const Red& r, const std::string& sum, const std::string& from,
                                  const std::string& to) {
    return "(" + from + " == " + to + " ? " + sum + " : " + sum + " * (double)" +
           (r.in == DType::Float64 ? "exp(" : "expf(") + from + " - " + to + "))";
  }

  /// Combines accumulators across the `threads` threads (a multiple of 32, one row) starting
  /// at thread 0 of the block; every thread ends with the result. The warps' partials meet in
  /// shared memory; every thread folds them in warp order (few warps), or every warp reads
  /// them into its lanes and reduces them with a second butterfly (many warps).
  void block_reduce(const std::vector<Red>& reds, int threads, const std::string& sfx = "") {
    warp_reduce(reds, sfx);
    if (threads <= 32 || reds.empty()) return;
    const int warps = threads / 32;
    auto sm = [&](const Red& r, const char* part) { return "kiln_w" + std::to_string(r.node) + part + sfx; };
    for (auto& r : reds) {
      shared_decl(r.acc_t, sm(r, ""), 32);
      if (r.arg) shared_decl("long long", sm(r, "x"), 32);
      if (r.online_sum >= 0) shared_decl("double", sm(r, "s"), 32);
    }
    open("if ((threadIdx.x & 31) == 0)");
    for (auto& r : reds) {
      line(sm(r, "") + "[threadIdx.x >> 5] = " + acc_name(r, sfx) + ";");
      if (r.arg) line(sm(r, "x") + "[threadIdx.x >> 5] = " + idx_name(r, sfx) + ";");
      if (r.online_sum >= 0) line(sm(r, "s") + "[threadIdx.x >> 5] = " + sum_name(r, sfx) + ";");
    }
    close();
    line("__syncthreads();");
    if (warps <= 8) {
      const std::string nw = std::to_string(warps);
      for (auto& r : reds) {
        line(acc_name(r, sfx) + " = " + sm(r, "") + "[0];");
        if (r.arg) line(idx_name(r, sfx) + " = " + sm(r, "x") + "[0];");
        line("for (int w = 1; w < " + nw + "; ++w) " +
             merge(r, acc_name(r, sfx), idx_name(r, sfx), sm(r, "") + "[w]", r.arg ? sm(r, "x") + "[w]" : "0"));
        if (r.online_sum >= 0) {
          // The block's max is known: each warp's sum is rescaled to it once, then added.
          line(sum_name(r, sfx) + " = 0.0;");
          line("for (int w = 0; w < " + nw + "; ++w) " + sum_name(r, sfx) +
               " += " + rescaled_sum(r, sm(r, "s") + "[w]", sm(r, "") + "[w]", acc_name(r, sfx)) + ";");
        }
      }
    } else {
      open("");
      line("const int lane = threadIdx.x & 31;");
      for (auto& r : reds) {
        line(acc_name(r, sfx) + " = lane < " + std::to_string(warps) + " ? " + sm(r, "") + "[lane] : " + r.init + ";");
        if (r.arg) line(idx_name(r, sfx) + " = lane < " + std::to_string(warps) + " ? " + sm(r, "x") + "[lane] : -1;");
        if (r.online_sum >= 0)
          line(sum_name(r, sfx) + " = lane < " + std::to_string(warps) + " ? " + sm(r, "s") + "[lane] : 0.0;");
      }
      warp_reduce(reds, sfx);
      close();
    }
    line("__syncthreads();");
  }

  void shared_decl(const std::string& type, const std::string& name, i64 count) {
    if (!declared_.insert(name).second) return;
    decls_.push_back("__shared__ " + type + " " + name + "[" + std::to_string(std::max<i64>(1, count)) + "];");
  }

  /// The kernel's self-resetting arrival counters (module globals, zero at load).
  std::string counters(i64 count) {
    std::string name = "kiln_cnt_" + info_.name;
    globals_ += "__device__ unsigned int " + name + "[" + std::to_string(std::max<i64>(1, count)) + "];\n";
    return name;
  }

  /// One reduction's partials in scratch memory, read back by a grid's last block: partial u
  /// of the accumulators with suffix `sfx` is element `at(u)` of pv (px: arg indices).
  struct PartialRead {
    Red r;
    std::string pv, px, sfx;
    std::function<std::string(const std::string&)> at;
  };
  /// Merges partials u = first, first + stride, ... < count (in that order) into the
  /// accumulators of `reads`. Four partials are loaded before they are merged: a loop that loads
  /// one partial and merges it before the next load waits a full L2 latency per partial, all in
  /// the one block the grid waits for (R3 on an H200: 16 splits x 4 columns read that way were
  /// 12 of the kernel's 83 us).
  void fold_partials(const std::vector<PartialRead>& reads, const std::string& first, i64 count, i64 stride) {
    if (reads.empty() || count <= 0) return;
    constexpr int kBatch = 4;
    open("for (" + it_ + " u0 = " + first + "; u0 < " + lit(count) + "; u0 += " + lit(kBatch * stride) + ")");
    std::vector<std::vector<std::pair<std::string, std::string>>> got(reads.size());
    for (int b = 0; b < kBatch; ++b) {
      const std::string u = b == 0 ? "u0" : "(u0 + " + lit(b * stride) + ")";
      const std::string ok = b == 0 ? "" : u + " < " + lit(count) + " ? ";
      for (std::size_t i = 0; i < reads.size(); ++i) {
        const PartialRead& pr = reads[i];
        const std::string name = "kiln_p" + std::to_string(i) + "_" + std::to_string(b);
        const std::string v = "((volatile " + pr.r.acc_t + "*)" + pr.pv + ")[" + pr.at(u) + "]";
        line("const " + pr.r.acc_t + " " + name + " = " + (ok.empty() ? v : ok + v + " : " + pr.r.init) + ";");
        std::string xname = "0";
        if (pr.r.arg) {
          xname = name + "x";
          const std::string x = "((volatile long long*)" + pr.px + ")[" + pr.at(u) + "]";
          line("const long long " + xname + " = " + (ok.empty() ? x : ok + x + " : -1LL") + ";");
        }
        got[i].push_back({name, xname});
      }
    }
    for (int b = 0; b < kBatch; ++b)
      for (std::size_t i = 0; i < reads.size(); ++i) {
        const PartialRead& pr = reads[i];
        line(merge(pr.r, acc_name(pr.r, pr.sfx), idx_name(pr.r, pr.sfx), got[i][static_cast<std::size_t>(b)].first,
                   got[i][static_cast<std::size_t>(b)].second));
      }
    close();
  }

  /// Publishes this unit's final partials, and in the unit that arrives last combines every
  /// unit's partials in unit order and writes the Final stores. `fins` accumulators are in
  /// thread 0; `units` is the number of units; `unit` names this block's unit.
  void finals_epilogue(const std::vector<Red>& fins, i64 units, const std::string& unit, const std::string& counter) {
    if (fins.empty() && !has_level(sched::Level::Final)) return;
    std::vector<std::string> pv, px;
    for (auto& r : fins) {
      pv.push_back(scratch_array(r.acc_t, units, acc_bytes(r.acc_t)));
      px.push_back(r.arg ? scratch_array("long long", units, 8) : "");
    }
    shared_decl("unsigned int", "kiln_last", 1);
    open("if (threadIdx.x == 0)");
    for (std::size_t i = 0; i < fins.size(); ++i) {
      line(pv[i] + "[" + unit + "] = " + acc_name(fins[i], "f") + ";");
      if (fins[i].arg) line(px[i] + "[" + unit + "] = " + idx_name(fins[i], "f") + ";");
    }
    line("__threadfence();");
    line("kiln_last[0] = atomicAdd(&" + counter + ", 1u) == " + std::to_string(units - 1) + "u;");
    close();
    line("__syncthreads();");
    open("if (kiln_last[0])");
    line("__threadfence();");
    for (auto& r : fins) declare_acc(r, "g");
    std::vector<PartialRead> reads;
    for (std::size_t i = 0; i < fins.size(); ++i)
      reads.push_back({fins[i], pv[i], px[i], "g", [](const std::string& u) { return u; }});
    fold_partials(reads, "(" + it_ + ")threadIdx.x", units, info_.block);
    block_reduce(fins, static_cast<int>(info_.block), "g");
    for (auto& r : fins) {
      std::string res = "r" + std::to_string(r.node);
      line("const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r, "g"), idx_name(r, "g")) +
           ";");
      bound_[r.node] = Binding{{res}, 0, top()};
    }
    open("if (threadIdx.x == 0)");
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Final) store(st, sched::detail::zero_index(node(st.node).shape));
    line(counter + " = 0u;");
    close();
    close();
  }
  bool has_level(sched::Level l) const {
    for (auto& st : k_.stores)
      if (st.level == l) return true;
    return false;
  }

  /// Row-level stores of the current row (every value is at hand in every thread).
  void row_stores() {
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Row) store(st, sched::detail::level_index(k_, st.level, node(st.node).shape));
  }

  /// Folds the current row's value of each final's input into its accumulator.
  void fold_finals(const std::vector<Red>& fins, int lanes) {
    Index ri = sched::identity_index(k_.row_shape());
    for (int j = 0; j < lanes; ++j)
      for (auto& r : fins) {
        Val v = value(node(r.node).inputs[0], ri, j);
        line(step(r, acc_name(r, "f"), idx_name(r, "f"), v.expr, r.arg ? row_position(j) : "0"));
      }
  }

  // ---- one-hot picks -----------------------------------------------------------------------------
  /// sum(where(iota_d == t, x, 0), d), with t the same all along the reduced dim d (the shape
  /// cross_entropy's decomposition picks the target's logit in): x at d = t when 0 <= t < extent,
  /// else 0. A row kernel loads that one element instead of comparing every position of the
  /// row (N6 in bench_gpu on an H200: 0.755 -> 0.905 x copy).
  struct Pick {
    int x = -1, target = -1, dim = -1;
    std::uint64_t target_dims = 0;  ///< the kernel dims t depends on (never `dim`)
  };
  std::map<int, Pick> picks_;  ///< reduction node -> its pick (row kernels)

  /// The dims of the kernel's space that node `id`'s value at the identity index depends on;
  /// nullopt when it reads a reduction of this kernel (bound only after its pass).
  std::optional<std::uint64_t> dependence(int id) const {
    std::uint64_t mask = 0;
    bool own = false;
    auto add = [&](const Index& idx) {
      for (auto& e : idx) mask |= e.dep_mask();
    };
    sched::detail::Visitor v;
    v.boundary = [&](int n) { return sched::detail::reads_memory(s_, n, kid_, g_); };
    v.leaf = [&](int n, const Index& idx) {
      mask |= sched::strided_offset(idx, node(n).strides, node(n).shape).dep_mask();
    };
    v.reduction = [&](int n, const Index& idx) {
      if (ir::is_reduction(node(n).op) && s_.owner[static_cast<std::size_t>(n)] == kid_) own = true;
      add(idx);
    };
    v.index_use = [&](int n, const Index& idx) {
      const ir::GraphNode& nn = node(n);
      if (nn.op == Op::Iota || nn.op == Op::Concat)
        mask |= idx[static_cast<std::size_t>(nn.attrs.ints.at(0))].dep_mask();
      else
        add(idx);
    };
    std::unordered_set<std::string> seen;
    sched::detail::walk(g_, id, sched::identity_index(k_.space), k_.space, v, seen);
    if (own) return std::nullopt;
    return mask | v.opaque;
  }

  /// Finds the kernel's reductions that are one-hot picks (see Pick).
  void find_picks() {
    picks_.clear();
    int dim = -1;
    for (std::size_t d = 0; d < k_.space.size(); ++d) {
      if (!k_.reduced[d] || k_.space[d] == 1) continue;
      if (dim >= 0) return;  // more than one reduced dim
      dim = static_cast<int>(d);
    }
    if (dim < 0) return;
    auto integral = [](DType t) { return t == DType::Int32 || t == DType::Int64; };
    auto is_zero = [&](int id) {
      const ir::GraphNode& c = node(id);
      return c.op == Op::Constant && (is_floating(c.dtype) ? c.attrs.scalar == 0.0 : c.attrs.iscalar == 0);
    };
    for (int rid : k_.reductions) {
      const ir::GraphNode& r = node(rid);
      if (r.op != Op::ReduceSum) continue;
      const ir::GraphNode& w = node(r.inputs[0]);
      if (w.op != Op::Where || w.shape != k_.space || !is_zero(w.inputs[2])) continue;
      const ir::GraphNode& eq = node(w.inputs[0]);
      if (eq.op != Op::Eq) continue;
      for (int side = 0; side < 2; ++side) {
        const ir::GraphNode& io = node(eq.inputs[static_cast<std::size_t>(side)]);
        const int t = eq.inputs[static_cast<std::size_t>(1 - side)];
        if (io.op != Op::Iota || io.attrs.ints.at(0) != dim || !integral(io.dtype) || node(t).dtype != io.dtype)
          continue;
        auto tdeps = dependence(t);
        if (!tdeps || (*tdeps & (std::uint64_t(1) << dim)) || !dependence(w.inputs[1])) continue;
        picks_[rid] = Pick{w.inputs[1], t, dim, *tdeps};
        break;
      }
    }
  }

  /// Reads every pick's target at the current scope (the row's start): the load of x at the
  /// target (bind_picks) waits for it, so it is issued long before.
  void prepare_picks() {
    for (auto& [rid, pk] : picks_) value(pk.target, sched::identity_index(k_.space), 0);
  }

  /// Binds every pick at the current scope (the row's): one load of x where t says. Called
  /// after the row's first pass has been read, before its block reduction: x at the target is
  /// then in L2 and its load overlaps the reduction (bound at the row's start, the load of t
  /// then of x stalled every block for two DRAM latencies: N6 0.896 x copy instead of 0.905).
  void bind_picks() {
    if (!picks_.empty()) info_.strategy += ", " + std::to_string(picks_.size()) + " one-hot pick(s) loaded";
    for (auto& [rid, pk] : picks_) {
      const Red r = red_info(g_, rid);
      Index id = sched::identity_index(k_.space);
      const Val t = value(pk.target, id, 0);
      const std::string valid =
          "(" + t.expr + " >= 0 && " + t.expr + " < " + lit(k_.space[static_cast<std::size_t>(pk.dim)]) + ")";
      IndexExpr at;
      at.text = "(" + valid + " ? (" + it_ + ")" + t.expr + " : (" + it_ + ")0)";
      at.deps = pk.target_dims;
      Index xi = id;
      xi[static_cast<std::size_t>(pk.dim)] = at;
      const Val x = value(pk.x, xi, 0);
      declare_acc(r);
      line("if " + valid + " " + step(r, acc_name(r), idx_name(r), x.expr, "0"));
      std::string res = "r" + std::to_string(rid);
      line("const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r), idx_name(r)) + ";");
      bound_[rid] = Binding{{res}, 0, top()};
    }
  }

  // ---- row reductions -------------------------------------------------------------------------
  i64 reduced_extent() const {
    i64 r = 1;
    for (int gi : k_.loops.red_groups) r *= extent(gi);
    return r;
  }

  /// Few long rows, one phase, nothing per element to store: split every row over blocks.
  bool use_split() const {
    const auto& p = k_.loops;
    // A symbolic number of rows is not split (one code for every size; the scheduler does not
    // split it either).
    if (sym_ || p.red_groups.empty() || k_.phases > 1 || k_.passes > 1 || has_level(sched::Level::Full)) return false;
    const i64 rows = p.rows, r = reduced_extent();
    // Fewer rows than multiprocessors: one block per row would leave most of the GPU idle.
    return r >= 8192 && rows >= 1 && rows < t_.sm_count;
  }

  struct CacheSlot {
    std::string name;
    std::size_t nch = 1;
    std::string type;
    bool shared = false;
    bool loaded = false;
  };
  std::string cache_ref(const CacheSlot& cs, std::size_t chunk) const {
    if (cs.shared)
      return cs.name + "[((" + slot_var_ + ") * " + std::to_string(info_.block) + " + threadIdx.x) * " +
             std::to_string(cs.nch) + " + " + std::to_string(chunk) + "]";
    return cs.name + "[(" + slot_var_ + ") * " + std::to_string(cs.nch) + " + " + std::to_string(chunk) + "]";
  }

  /// Leaf reads along the row that more than one pass needs: kept on chip after the first.
  std::map<std::string, std::pair<int, std::size_t>> multi_pass_reads() const {
    std::map<std::string, std::set<int>> passes;
    std::map<std::string, std::pair<int, std::size_t>> info;  // key -> (node, bytes per slot)
    const std::uint64_t red_mask = groups_mask(k_.loops.red_groups);
    Index id = sched::identity_index(k_.space);
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::vector<int> roots;
      for (std::size_t j = 0; j < k_.reductions.size(); ++j)
        if (folded_in(j, pass)) roots.push_back(node(k_.reductions[j]).inputs[0]);
      for (auto& st : k_.stores)
        if (st.level == sched::Level::Full && st.pass == pass) roots.push_back(st.node);
      for (int root : roots) {
        sched::detail::Visitor v;
        v.boundary = [&](int n) { return sched::detail::reads_memory(s_, n, kid_, g_); };
        v.leaf = [&](int n, const Index& i) {
          const ir::GraphNode& nn = node(n);
          IndexExpr off = sched::strided_offset(i, nn.strides, nn.shape);
          if (!(off.dep_mask() & red_mask) || !vector_ok(off, al_.input(nn.leaf))) return;
          std::string key = "L" + std::to_string(n) + "|" + off.key();
          passes[key].insert(pass);
          info[key] = {n, itemsize(nn.dtype) * static_cast<std::size_t>(lane_dep(off) ? vec_ : 1)};
        };
        std::unordered_set<std::string> seen;
        sched::detail::walk(g_, root, id, k_.space, v, seen);
      }
    }
    std::map<std::string, std::pair<int, std::size_t>> out;
    for (auto& [key, ps] : passes)
      if (ps.size() > 1) out[key] = info[key];
    return out;
  }

  /// The sum of phase p+1 that folds into phase p's max in one pass (online softmax), or -1:
  /// phase p+1 is exactly sum(exp(A - broadcast(max(A)))) with the max in phase p, and pass p+1
  /// stores nothing.
  int online_sum_of(int p, int& max_node) const {
    std::vector<int> next;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (folded_in(j, p + 1)) next.push_back(k_.reductions[j]);
    if (next.size() != 1) return -1;
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Full && st.pass == p + 1) return -1;
    const ir::GraphNode& sum = node(next[0]);
    if (sum.op != Op::ReduceSum) return -1;
    const ir::GraphNode& e = node(sum.inputs[0]);
    if (e.op != Op::Exp || (e.dtype != DType::Float32 && e.dtype != DType::Float64)) return -1;
    const ir::GraphNode& d = node(e.inputs[0]);
    if (d.op != Op::Sub) return -1;
    const ir::GraphNode& b = node(d.inputs[1]);
    if (b.op != Op::Broadcast) return -1;
    const int m = b.inputs[0];
    const ir::GraphNode& mx = node(m);
    if (mx.op != Op::ReduceMax || mx.inputs[0] != d.inputs[0] || s_.owner[static_cast<std::size_t>(m)] != kid_)
      return -1;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (k_.reductions[j] == m && k_.phase[j] != p) return -1;
    max_node = m;
    return next[0];
  }

  void rows() {
    find_picks();
    const auto& p = k_.loops;
    const i64 rows = p.rows;
    const i64 R = reduced_extent();
    const int inner = p.red_groups.empty() ? -1 : p.red_groups.back();
    set_vec(inner, choose_vec(inner, true));
    const int V = vec_;
    // Threads per row: a warp for short rows, else enough threads for about `vpt` vectors each.
    auto threads_for = [&](int vectors_per_thread) {
      const i64 vpt = std::max(1, vectors_per_thread);
      int t = 32;
      if (R > static_cast<i64>(32) * V * std::max(1, t_.warp_row_vectors)) {
        i64 want = (R + V * vpt - 1) / (V * vpt);
        t = 64;
        while (t < 1024 && t < want) t *= 2;
      }
      return t;
    };
    int T = threads_for(t_.row_vectors_per_thread);
    i64 E = R == 0 ? 0 : (R + static_cast<i64>(T) * V - 1) / (static_cast<i64>(T) * V);
    // (A symbolic number of rows may be large: 8.)
    const i64 warp_rows = std::clamp(t_.warp_rows_per_block, 1, 32);
    const int rpb = T == 32 ? static_cast<int>(sym_ ? warp_rows : std::max<i64>(1, std::min<i64>(warp_rows, rows))) : 1;
    // The row cache: registers when small, else shared memory, else none (re-read).
    auto reads = multi_pass_reads();
    std::size_t slot_bytes = 0;
    for (auto& [key, info] : reads) slot_bytes += (info.second + 15) / 16 * 16;
    const i64 reg_words = E * static_cast<i64>(slot_bytes) / 4;
    const i64 row_bytes = E * static_cast<i64>(slot_bytes) * T * rpb;
    int mode = 0;  // 0 none, 1 registers, 2 shared memory
    if (!reads.empty() && E > 0) {
      const i64 reg_limit = std::min<i64>(32, 65536 / (T * rpb) - 40);
      if (reg_words <= reg_limit)
        mode = 1;
      else if (t_.row_cache_shared && row_bytes <= t_.max_shared_per_block_optin - 8192)
        mode = 2;
    }
    if (mode == 0 && !reads.empty() && rpb == 1 && t_.row_vectors_per_thread_uncached > 0) {
      // A long row that later passes re-read from L2: fewer threads per row with more vectors
      // each keep several rows in flight per multiprocessor, so one row's block reduction
      // overlaps another's loads (N6, 128 KiB rows: 1024 threads 0.41 x copy, 256 threads 0.76).
      T = threads_for(t_.row_vectors_per_thread_uncached);
      E = R == 0 ? 0 : (R + static_cast<i64>(T) * V - 1) / (static_cast<i64>(T) * V);
    }
    row_threads_ = T;
    const bool guard = R % (static_cast<i64>(T) * V) != 0;
    info_.block = static_cast<unsigned>(T * rpb);
    // Values more than one pass computes, kept in registers beside a register-cached row when
    // the budget allows (at most 64 words per thread in all).
    std::map<std::string, int> values;
    if (mode == 1) {
      values = multi_pass_values();
      const i64 value_words = E * V * static_cast<i64>(values.size());
      const i64 limit = std::min<i64>(64, 65536 / (T * rpb) - 40);
      if (values.empty() || reg_words + value_words > limit) values.clear();
    }
    std::size_t dyn = 0;
    if (mode == 2) {
      dyn = static_cast<std::size_t>(row_bytes);
      line("KILN_EXTERN_SMEM(kiln_dsm);");
    }
    // One row (a warp's rows) per block: blocks that loop over many rows would run in uneven
    // waves whenever fewer fit on the GPU at once than the grid holds.
    // A symbolic size: the rows are n times the other kept dims, and the grid follows n.
    std::string rows_text = lit(rows);
    if (sym_) {
      info_.grid = 0;
      info_.grid_rule = CudaGridRule{per_size(p.kept_groups), 1, rpb, i64(1) << 30};
      rows_text = "kiln_rows";
      line("const long long kiln_rows = " + std::string(kSizeVar) + " * " + lit(per_size(p.kept_groups)) + ";");
    } else {
      info_.grid = static_cast<unsigned>(std::max<i64>(1, std::min<i64>((rows + rpb - 1) / rpb, i64(1) << 30)));
    }
    info_.shared_bytes = static_cast<unsigned>(dyn);
    info_.strategy = "row reduction, " + std::to_string(T) + " thread(s) per row, " + std::to_string(V) + " lane(s), " +
                     std::to_string(E) + " slot(s), row " +
                     (mode == 1   ? "cached in registers"
                      : mode == 2 ? "cached in shared memory"
                                  : "read per pass") +
                     ", grid " + (sym_ ? rule_text(info_.grid_rule) : std::to_string(info_.grid)) + "x" +
                     std::to_string(info_.block);

    line("const int tid = " + std::string(rpb > 1 ? "threadIdx.x & 31" : "threadIdx.x") + ";");
    std::vector<Red> fins = final_reds();
    for (auto& r : fins) declare_acc(r, "f");
    const std::string rowv =
        rpb > 1 ? "(" + it_ + ")blockIdx.x * " + lit(rpb) + " + (threadIdx.x >> 5)" : "(" + it_ + ")blockIdx.x";
    open("for (" + it_ + " row = " + rowv + "; row < " + rows_text + "; row += (" + it_ + ")gridDim.x * " + lit(rpb) +
             ")",
         groups_mask(p.kept_groups));
    decode("row", p.kept_groups);
    const int row_scope = top();
    prepare_picks();
    // Declare the cache.
    slot_var_ = "s";
    std::size_t dsm_off = 0;
    for (auto& [key, info] : reads) {
      if (mode == 0) break;
      CacheSlot cs;
      std::size_t cb = std::min<std::size_t>(info.second, 16);
      cs.nch = info.second >= 16 ? info.second / 16 : 1;
      cs.type = chunk_type(cb);
      cs.name = fresh("kc");
      if (mode == 1) {
        line(cs.type + " " + cs.name + "[" + std::to_string(E * static_cast<i64>(cs.nch)) + "];");
      } else {
        cs.shared = true;
        // Each thread reads back only what it wrote: no barrier needed.
        dsm_off = (dsm_off + 15) / 16 * 16;
        line(cs.type + "* " + cs.name + " = (" + cs.type + "*)(kiln_dsm + " + std::to_string(dsm_off) + ");");
        dsm_off += static_cast<std::size_t>(E) * info_.block * cs.nch * cb;
      }
      cache_[key] = cs;
    }
    vcache_.clear();
    for (auto& [key, nid] : values) {
      (void)nid;
      std::string name = fresh("kv");
      line("float " + name + "[" + std::to_string(E * V) + "];");
      vcache_[key] = ValueSlot{name, 0};
    }
    if (!vcache_.empty())
      info_.strategy += ", " + std::to_string(vcache_.size()) + " value(s) kept in registers between passes";
    // A row that is not in registers is read once less when softmax's max and sum of exp
    // share a pass.
    std::map<int, std::pair<int, int>> online;  // phase -> (max node, sum node)
    std::set<int> skip;
    if (mode != 1)
      for (int ph = 1; ph < k_.phases; ++ph) {
        int m = -1, sum = online_sum_of(ph, m);
        if (sum >= 0 && !skip.count(ph)) {
          online[ph] = {m, sum};
          skip.insert(ph + 1);
        }
      }
    if (!online.empty()) info_.strategy += ", online max and sum of exp";
    for (int pass = 1; pass <= k_.passes; ++pass) {
      if (skip.count(pass)) continue;
      std::vector<Red> reds = phase_reds(pass);
      auto on = online.find(pass);
      if (on != online.end())
        for (auto& r : reds)
          if (r.node == on->second.first) r.online_sum = on->second.second;
      for (auto& r : reds) declare_acc(r);
      std::string pragma =
          mode == 1 ? "#pragma unroll" : "#pragma unroll " + std::to_string(std::max(1, t_.row_unroll_uncached));
      if (E > 0) {
        open("for (int s = 0; s < " + std::to_string(E) + "; ++s)", 0, pragma);
        line("const " + it_ + " pos = ((" + it_ + ")s * " + lit(T) + " + tid) * " + lit(V) + ";");
        open(guard ? "if (pos < " + lit(R) + ")" : "", groups_mask(p.red_groups));
        decode("pos", p.red_groups);
        cur_pass_ = pass;
        loop_scope_ = top();
        fold_body(reds, pass, false);
        cur_pass_ = 0;
        loop_scope_ = -1;
        close();
        close();
      }
      // No reduction of this kernel feeds a pick, and what a pick feeds comes after pass 1.
      if (pass == 1) bind_picks();
      block_reduce(reds, T);
      for (auto& r : reds) {
        std::string res = "r" + std::to_string(r.node);
        line_at(row_scope,
                "const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r), idx_name(r)) + ";");
        bound_[r.node] = Binding{{res}, 0, row_scope};
        if (r.online_sum >= 0) {
          // Every term of an all -inf row is exp(-inf - -inf) = NaN in the reference.
          const ir::GraphNode& sn = node(r.online_sum);
          const bool dbl = r.in == DType::Float64;
          std::string sres = "r" + std::to_string(r.online_sum);
          std::string sv = round16("(" + std::string(ctype(sn.dtype)) + ")" + sum_name(r), sn.dtype);
          if (R > 0)
            sv = "(" + acc_name(r) + " == " + (dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)") + " ? " +
                 (dbl ? "KILN_NAN_D" : "KILN_NAN_F") + " : " + sv + ")";
          line_at(row_scope, "const " + std::string(ctype(sn.dtype)) + " " + sres + " = " + sv + ";");
          bound_[r.online_sum] = Binding{{sres}, 0, row_scope};
        }
      }
    }
    if (has_level(sched::Level::Row) || !fins.empty()) {
      open("if (tid == 0)");
      row_stores();
      fold_finals(fins, 1);
      close();
    }
    close();
    // Finals: thread 0 of each warp holds its rows' partial; warp partials combine in order.
    if (!fins.empty() || has_level(sched::Level::Final)) {
      if (rpb > 1) {
        for (auto& r : fins) {
          shared_decl(r.acc_t, "kiln_fw" + std::to_string(r.node), rpb);
          if (r.arg) shared_decl("long long", "kiln_fwx" + std::to_string(r.node), rpb);
        }
        open("if (tid == 0)");
        for (auto& r : fins) {
          line("kiln_fw" + std::to_string(r.node) + "[threadIdx.x >> 5] = " + acc_name(r, "f") + ";");
          if (r.arg) line("kiln_fwx" + std::to_string(r.node) + "[threadIdx.x >> 5] = " + idx_name(r, "f") + ";");
        }
        close();
        line("__syncthreads();");
        open("if (threadIdx.x == 0)");
        for (auto& r : fins)
          line("for (int w = 1; w < " + std::to_string(rpb) + "; ++w) " +
               merge(r, acc_name(r, "f"), idx_name(r, "f"), "kiln_fw" + std::to_string(r.node) + "[w]",
                     r.arg ? "kiln_fwx" + std::to_string(r.node) + "[w]" : "0"));
        close();
      }
      finals_epilogue(fins, info_.grid, "blockIdx.x", counters(1) + "[0]");
    }
  }

  /// Few long rows: each row is split into chunks, one per block; the last block to finish
  /// combines every row's chunks in order, then writes the row values and the finals.
  void split_rows() {
    find_picks();
    const auto& p = k_.loops;
    const i64 rows = p.rows;
    const i64 R = reduced_extent();
    const int inner = p.red_groups.back();
    set_vec(inner, choose_vec(inner, true));
    const int V = vec_;
    const int T = 256;
    info_.block = T;
    const i64 target = static_cast<i64>(t_.sm_count) * std::max(1, t_.split_blocks_per_sm);
    i64 splits = std::max<i64>(1, target / std::max<i64>(1, rows));
    // Every chunk holds whole vectors and at least a few per thread.
    splits = std::max<i64>(1, std::min<i64>(splits, R / (static_cast<i64>(T) * V * 4)));
    i64 chunk = (R + splits - 1) / splits;
    chunk = (chunk + V - 1) / V * V;
    splits = (R + chunk - 1) / chunk;
    const i64 blocks = rows * splits;
    info_.grid = static_cast<unsigned>(blocks);
    info_.strategy = "split row reduction, " + std::to_string(splits) + " block(s) per row of " + std::to_string(R) +
                     ", " + std::to_string(V) + " lane(s), grid " + std::to_string(blocks) + "x" + std::to_string(T);
    row_threads_ = T;
    std::vector<Red> reds = phase_reds(1), fins = final_reds();
    std::vector<std::string> pv, px;
    for (auto& r : reds) {
      pv.push_back(scratch_array(r.acc_t, blocks, acc_bytes(r.acc_t)));
      px.push_back(r.arg ? scratch_array("long long", blocks, 8) : "");
    }
    line("const int tid = threadIdx.x;");
    open("", groups_mask(p.kept_groups));
    line("const " + it_ + " row = (" + it_ + ")blockIdx.x / " + lit(splits) + ";");
    line("const " + it_ + " lo = ((" + it_ + ")blockIdx.x % " + lit(splits) + ") * " + lit(chunk) + ";");
    line("const " + it_ + " hi = lo + " + lit(chunk) + " < " + lit(R) + " ? lo + " + lit(chunk) + " : " + lit(R) + ";");
    decode("row", p.kept_groups);
    for (auto& r : reds) declare_acc(r);
    // Four vectors in flight per thread and iteration.
    open("for (" + it_ + " base = lo + (" + it_ + ")tid * " + lit(V) + "; base < hi; base += " + lit(4 * T * V) + ")");
    open("for (int u = 0; u < 4; ++u)", 0, "#pragma unroll");
    line("const " + it_ + " pos = base + (" + it_ + ")u * " + lit(T * V) + ";");
    open("if (pos < hi)", groups_mask(p.red_groups));
    decode("pos", p.red_groups);
    fold_body(reds, 1, false);
    close();
    close();
    close();
    block_reduce(reds, T);
    open("if (tid == 0)");
    for (std::size_t i = 0; i < reds.size(); ++i) {
      line(pv[i] + "[blockIdx.x] = " + acc_name(reds[i]) + ";");
      if (reds[i].arg) line(px[i] + "[blockIdx.x] = " + idx_name(reds[i]) + ";");
    }
    close();
    close();
    // The last block.
    std::string counter = counters(1) + "[0]";
    shared_decl("unsigned int", "kiln_last", 1);
    open("if (threadIdx.x == 0)");
    line("__threadfence();");
    line("kiln_last[0] = atomicAdd(&" + counter + ", 1u) == " + std::to_string(blocks - 1) + "u;");
    close();
    line("__syncthreads();");
    open("if (kiln_last[0])");
    line("__threadfence();");
    for (auto& r : fins) declare_acc(r, "f");
    open("for (" + it_ + " row = 0; row < " + lit(rows) + "; ++row)", groups_mask(p.kept_groups));
    decode("row", p.kept_groups);
    const int row_scope = top();
    set_vec(-1, 1);
    bind_picks();
    for (auto& r : reds) declare_acc(r);
    std::vector<PartialRead> reads;
    for (std::size_t i = 0; i < reds.size(); ++i)
      reads.push_back(
          {reds[i], pv[i], px[i], "", [&](const std::string& u) { return "row * " + lit(splits) + " + " + u; }});
    fold_partials(reads, "(" + it_ + ")tid", splits, T);
    block_reduce(reds, T);
    for (auto& r : reds) {
      std::string res = "r" + std::to_string(r.node);
      line_at(row_scope,
              "const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r), idx_name(r)) + ";");
      bound_[r.node] = Binding{{res}, 0, row_scope};
    }
    open("if (tid == 0)");
    row_stores();
    fold_finals(fins, 1);
    close();
    close();
    if (!fins.empty() || has_level(sched::Level::Final)) {
      for (auto& r : fins) {
        std::string res = "r" + std::to_string(r.node);
        line("const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, acc_name(r, "f"), idx_name(r, "f")) +
             ";");
        bound_[r.node] = Binding{{res}, 0, top()};
      }
      open("if (tid == 0)");
      for (auto& st : k_.stores)
        if (st.level == sched::Level::Final) store(st, sched::detail::zero_index(node(st.node).shape));
      close();
    }
    line("if (tid == 0) " + counter + " = 0u;");
    close();
  }

  // ---- column reductions ----------------------------------------------------------------------
  void columns() {
    const auto& p = k_.loops;
    const int cg = p.vec_group;
    const i64 C = extent(cg);
    int v0 = choose_vec(cg, true);
    if (v0 > 1 && t_.column_vectors_per_thread > 1 && extent(cg) % (v0 * t_.column_vectors_per_thread) == 0)
      v0 *= t_.column_vectors_per_thread;  // several 16-byte chunks per thread: longer runs per row
    set_vec(cg, v0);
    const int V = vec_;
    const i64 R = reduced_extent();
    i64 outer = 1;
    for (int gi : p.kept_groups) outer *= extent(gi);
    const i64 cvecs = (C + V - 1) / V;
    int BX = 32;
    while (BX > 1 && BX / 2 >= cvecs) BX /= 2;
    const int BY = 256 / BX;
    const i64 ct = (cvecs + BX - 1) / BX;  // column tiles per outer row
    const i64 tiles = outer * ct;
    const i64 target = static_cast<i64>(t_.sm_count) * std::max(1, t_.split_blocks_per_sm);
    i64 splits = 1;
    const bool single_pass = k_.phases <= 1 && k_.passes <= 1 && !has_level(sched::Level::Full);
    // Rounded down: every block of the grid runs in the first wave (a 17th split of 32 tiles
    // on 528 block slots would leave a second wave of 16 blocks).
    if (single_pass && tiles > 0 && tiles < target)
      splits = std::max<i64>(1, std::min<i64>(target / tiles, R / (BY * 8)));
    i64 rchunk = splits > 1 ? (R + splits - 1) / splits : R;
    if (splits > 1) splits = (R + rchunk - 1) / rchunk;
    info_.block = 256;
    const i64 units = std::max<i64>(1, tiles);  // an empty space still writes its finals
    info_.grid = static_cast<unsigned>(units * splits);
    info_.strategy = "column reduction, " + std::to_string(BX) + "x" + std::to_string(BY) + " threads, " +
                     std::to_string(V) + " column(s) per thread, " + std::to_string(splits) + " split(s) of the " +
                     std::to_string(R) + " reduced rows, grid " + std::to_string(info_.grid) + "x256";
    line("const int tx = threadIdx.x % " + std::to_string(BX) + ", ty = threadIdx.x / " + std::to_string(BX) + ";");
    // Blocks of one split of every tile are neighbours: blocks running together read whole
    // rows (long contiguous runs), which DRAM serves best.
    line("const " + it_ + " tile = (" + it_ + ")blockIdx.x % " + lit(units) + ";");
    line("const " + it_ + " cb = (tile % " + lit(ct) + ") * " + lit(BX * V) + " + (" + it_ + ")tx * " + lit(V) + ";");
    line("const bool cvalid = cb < " + lit(C) + ";");
    std::vector<Red> fins = final_reds();
    for (auto& r : fins) declare_acc(r, "f");
    std::uint64_t kept_dims = groups_mask(p.kept_groups) | group_mask(cg);
    open(tiles == 0 ? "if (false)" : "", kept_dims);
    decode("(tile / " + lit(ct) + ")", p.kept_groups);
    // Threads past the last column compute a copy of the last vector (valid addresses) and
    // neither store nor fold it.
    line("const " + it_ + " " + var(cg) + " = cb < " + lit(C - V) + " ? cb : " + lit(C - V) + ";");
    const int tile_scope = top();
    // Splits take contiguous runs of rows, or (interleaved) every splits-th group of BY rows,
    // so that all blocks read rows close together.
    const bool interleave = splits > 1 && t_.column_split_interleave;
    const std::string split = "((" + it_ + ")blockIdx.x / " + lit(units) + ")";
    const i64 step = interleave ? BY * splits : BY;
    if (interleave) {
      line("const " + it_ + " rlo = " + split + " * " + lit(BY) + ";");
      line("const " + it_ + " rhi = " + lit(R) + ";");
    } else {
      line("const " + it_ + " rlo = " + (splits > 1 ? split + " * " + lit(rchunk) : lit(0)) + ";");
      line("const " + it_ + " rhi = rlo + " + lit(rchunk) + " < " + lit(R) + " ? rlo + " + lit(rchunk) + " : " +
           lit(R) + ";");
    }
    std::string counter;
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::vector<Red> reds = phase_reds(pass);
      for (auto& r : reds)
        for (int j = 0; j < V; ++j) declare_acc(r, "_" + std::to_string(j));
      open("for (" + it_ + " rr = rlo + ty; rr < rhi; rr += " + lit(step) + ")", groups_mask(p.red_groups),
           "#pragma unroll " + std::to_string(std::max(1, t_.column_unroll)));
      decode("rr", p.red_groups);
      store_guard_ = "cvalid";
      fold_body(reds, pass, true);
      store_guard_.clear();
      close();
      if (reds.empty()) continue;
      // Combine the BY shares of each column in order through shared memory.
      auto combine_shares = [&] {
        for (auto& r : reds) {
          shared_decl(r.acc_t, "kiln_c" + std::to_string(r.node), 256 * V);
          if (r.arg) shared_decl("long long", "kiln_cx" + std::to_string(r.node), 256 * V);
          for (int j = 0; j < V; ++j) {
            std::string slot = "[threadIdx.x * " + std::to_string(V) + " + " + std::to_string(j) + "]";
            line("kiln_c" + std::to_string(r.node) + slot + " = " + acc_name(r, "_" + std::to_string(j)) + ";");
            if (r.arg)
              line("kiln_cx" + std::to_string(r.node) + slot + " = " + idx_name(r, "_" + std::to_string(j)) + ";");
          }
        }
        line("__syncthreads();");
        open("if (ty == 0)");
        for (auto& r : reds)
          for (int j = 0; j < V; ++j) {
            std::string sfx = "_" + std::to_string(j);
            std::string at =
                "[(y * " + std::to_string(BX) + " + tx) * " + std::to_string(V) + " + " + std::to_string(j) + "]";
            line("for (int y = 1; y < " + std::to_string(BY) + "; ++y) " +
                 merge(r, acc_name(r, sfx), idx_name(r, sfx), "kiln_c" + std::to_string(r.node) + at,
                       r.arg ? "kiln_cx" + std::to_string(r.node) + at : "0"));
          }
        close();
      };
      combine_shares();
      if (splits > 1) {
        // Publish this block's partials; the last block of the tile combines them, every row of
        // its threads a share of the splits, then the shares through shared memory.
        std::vector<std::string> pv, px;
        for (auto& r : reds) {
          pv.push_back(scratch_array(r.acc_t, tiles * splits * BX * V, acc_bytes(r.acc_t)));
          px.push_back(r.arg ? scratch_array("long long", tiles * splits * BX * V, 8) : "");
        }
        const std::string at = "(((" + it_ + ")blockIdx.x) * " + lit(BX * V) + " + tx * " + lit(V) + " + ";
        open("if (ty == 0)");
        for (std::size_t i = 0; i < reds.size(); ++i)
          for (int j = 0; j < V; ++j) {
            std::string sfx = "_" + std::to_string(j);
            line(pv[i] + "[" + at + std::to_string(j) + ")] = " + acc_name(reds[i], sfx) + ";");
            if (reds[i].arg) line(px[i] + "[" + at + std::to_string(j) + ")] = " + idx_name(reds[i], sfx) + ";");
          }
        close();
        counter = counters(tiles + 1);
        shared_decl("unsigned int", "kiln_last", 1);
        open("if (threadIdx.x == 0)");
        line("__threadfence();");
        line("kiln_last[0] = atomicAdd(&" + counter + "[tile], 1u) == " + std::to_string(splits - 1) + "u;");
        close();
        line("__syncthreads();");
        line("if (!kiln_last[0]) return;");
        line("__threadfence();");
        line("if (threadIdx.x == 0) " + counter + "[tile] = 0u;");
        std::vector<PartialRead> reads;
        for (std::size_t i = 0; i < reds.size(); ++i)
          for (int j = 0; j < V; ++j) {
            const std::string sfx = "_" + std::to_string(j);
            line(acc_name(reds[i], sfx) + " = " + reds[i].init + ";" +
                 (reds[i].arg ? " " + idx_name(reds[i], sfx) + " = -1;" : ""));
            reads.push_back({reds[i], pv[i], px[i], sfx, [&, j](const std::string& u) {
                               return "(" + u + " * " + lit(units) + " + tile) * " + lit(BX * V) + " + tx * " + lit(V) +
                                      " + " + std::to_string(j);
                             }});
          }
        fold_partials(reads, "(" + it_ + ")ty", splits, BY);
        combine_shares();
      }
      // Hand each column's result to every thread of the column.
      for (auto& r : reds)
        for (int j = 0; j < V; ++j) {
          std::string slot = "[tx * " + std::to_string(V) + " + " + std::to_string(j) + "]";
          line("if (ty == 0) kiln_c" + std::to_string(r.node) + slot + " = " + acc_name(r, "_" + std::to_string(j)) +
               ";");
          if (r.arg)
            line("if (ty == 0) kiln_cx" + std::to_string(r.node) + slot + " = " + idx_name(r, "_" + std::to_string(j)) +
                 ";");
        }
      line("__syncthreads();");
      for (auto& r : reds) {
        Binding b;
        b.min_scope = tile_scope;
        b.dims = group_mask(cg);
        for (int j = 0; j < V; ++j) {
          std::string slot = "[tx * " + std::to_string(V) + " + " + std::to_string(j) + "]";
          std::string res = "r" + std::to_string(r.node) + "_" + std::to_string(j);
          std::string a = "kiln_c" + std::to_string(r.node) + slot,
                      x = r.arg ? "kiln_cx" + std::to_string(r.node) + slot : "";
          line_at(tile_scope, "const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, a, x) + ";");
          b.text.push_back(res);
        }
        if (V == 1) b.dims = group_mask(cg);
        bound_[r.node] = b;
      }
      line("__syncthreads();");
    }
    if (has_level(sched::Level::Row) || !fins.empty()) {
      // cb and C are multiples of V: a valid thread's lanes are all valid columns.
      open("if (ty == 0 && cvalid)");
      row_stores();
      fold_finals(fins, V);
      close();
    }
    close();
    if (!fins.empty() || has_level(sched::Level::Final)) {
      // Row 0 of the block holds the tile's partials per column thread: combine them in
      // column order within warp 0 (threads of other rows hold the identity).
      if (BX < 32) {
        open("if (ty != 0)");
        for (auto& r : fins)
          line(acc_name(r, "f") + " = " + r.init + ";" + (r.arg ? " " + idx_name(r, "f") + " = -1;" : ""));
        close();
      }
      open("if (threadIdx.x < 32)");
      warp_reduce(fins, "f");
      close();
      if (counter.empty()) counter = counters(tiles + 1);
      finals_epilogue(fins, units, "tile", counter + "[" + std::to_string(tiles) + "]");
    }
  }

  // ---- state ----------------------------------------------------------------------------------
  const ir::Graph& g_;
  const sched::Schedule& s_;
  const sched::Kernel& k_;
  int kid_;
  const CudaTarget& t_;
  const CudaAlignment& al_;
  Needs& needs_;
  std::size_t scratch_offset_;
  std::size_t scratch_bytes_ = 0;
  std::size_t leaves_ = 0, nargs_ = 0;
  bool i64_ = false;
  bool sym_ = false;  ///< the space's leading dim is the schedule's symbolic size, read at launch
  std::string it_;
  int vec_group_ = -1, vec_ = 1, vec_dim_ = -1;
  std::uint64_t vec_mask_ = 0;
  int row_threads_ = 32;
  std::string store_guard_;  ///< condition every store is written under ("" none)
  std::string slot_var_ = "s";
  std::map<std::string, CacheSlot> cache_;
  struct ValueSlot {
    std::string name;
    int pass = 0;  ///< the pass that stores it (0: not yet)
  };
  std::map<std::string, ValueSlot> vcache_;  ///< value key -> register array (row kernels)
  int cur_pass_ = 0;                         ///< pass whose body is being written (row kernels)
  int loop_scope_ = -1;                      ///< scope of the per-position body
  std::vector<Scope> scopes_;
  std::unordered_map<int, Binding> bound_;
  std::set<std::string> declared_;
  std::vector<std::string> decls_;
  std::string globals_;
  int counter_ = 0;
  CudaKernelInfo info_;
};

/// The kernels' argument struct (see CudaSource).
inline std::string args_struct(const CudaSource& unit) {
  return "struct kiln_args { void* p[" + std::to_string(unit.num_args) + "];" + (unit.symbolic ? " long long n;" : "") +
         " };\n";
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
    cuda_detail::Writer w(g, s, static_cast<int>(k), per_kernel[k], align, needs, out.scratch_bytes);
    std::string code;
    std::size_t scratch = 0;
    out.kernels.push_back(w.write(name, code, scratch));
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
  if (needs.philox) {
    src += philox::kPhiloxSource;
    src += "\n";
  }
  src += kiln::detail::kKernelsBeginMarker;
  src += body;
  return out;
}

}  // namespace kiln::codegen
