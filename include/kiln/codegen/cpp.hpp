#pragma once
// C++/OpenMP code generation: a scheduled graph -> one translation unit holding one
// `extern "C"` entry per kernel. Sizes and strides are baked in as constants. The outer loop
// of a kernel is shared among an OpenMP team (only when the work is large enough to pay for
// the team). Each kernel's body is a static function with orphaned worksharing (`omp for`,
// `omp single` for serial combine steps): its own entry wraps it in a parallel region, and
// the optional graph entry calls every body inside one region. Inner loops are contiguous `omp simd` loops whose
// reductions are split across lanes (and accumulate floats in double), so GCC vectorises them without -ffast-math: NaN,
// Inf and signed zeros behave as in the reference executor (backend/reference.hpp), whose
// semantics every expression below reproduces.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/codegen/cpu_math.hpp"
#include "kiln/core/error.hpp"
#include "kiln/codegen/c/integer.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/codegen/c/reduction.hpp"
#include "kiln/core/generated.hpp"
#include "kiln/core/half.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/index.hpp"
#include "kiln/sched/schedule.hpp"

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

namespace detail {

using ir::Op;
using sched::i64;
using sched::Index;
using sched::IndexExpr;

/// The kLibmName ops cpu_math.hpp vectorises (kiln_<name>_f32/_f64, within the bounds of
/// docs/performance-math.md); the others (atan, asin, acos, sqrt, atan2, hypot) call the
/// compiler's scalar builtin, correctly rounded or within 1 ulp.
inline constexpr Op kVectorMath[] = {Op::Exp, Op::Exp2, Op::Log, Op::Log2, Op::Log1p, Op::Expm1,
                                     Op::Sin, Op::Cos,  Op::Tan, Op::Tanh, Op::Erf};

/// How this writer's errors name it.
inline constexpr const char* kWriter = "kiln codegen";

// Types and literals: the C every dialect shares (codegen/c/literals.hpp).
using c_family::ctype;
using c_family::hex_double;
using c_family::int_literal;
using c_family::stype;
inline std::string float_literal(double v, bool is_double) {
  return c_family::float_literal(v, is_double, c_family::kCppDialect);
}
inline std::string constant_literal(const ir::GraphNode& n) {
  return c_family::constant_literal(n, c_family::kCppDialect);
}

/// What a translation unit needs in its prelude.
struct Needs : c_family::PreludeNeeds {
  bool math = false, stream = false;
};

// Writes a finished row to memory with non-temporal stores where the target has them: a large
// output is not read again soon, so writing it around the cache saves the read-for-ownership
// of every line (a third of the traffic of a read-once, write-once kernel) and keeps the
// cache for the rows being reduced. The tail and unaligned head go through memcpy.
inline constexpr const char* kStreamHelpers = R"(
#if defined(__AVX__)
#include <immintrin.h>
#endif
static inline void kiln_stream_row(void* dst, const void* src, long long bytes) {
  unsigned char* d = (unsigned char*)dst;
  const unsigned char* s = (const unsigned char*)src;
#if defined(__AVX__)
  long long head = (long long)((32u - ((unsigned long long)d & 31u)) & 31u);
  if (head > bytes) head = bytes;
  __builtin_memcpy(d, s, (unsigned long)head);
  long long i = head;
  for (; i + 32 <= bytes; i += 32)
    _mm256_stream_si256((__m256i*)(d + i), _mm256_loadu_si256((const __m256i*)(s + i)));
  __builtin_memcpy(d + i, s + i, (unsigned long)(bytes - i));
  _mm_sfence();
#else
  __builtin_memcpy(d, s, (unsigned long)bytes);
#endif
}
)";

// Helpers every generated unit may use. Integer arithmetic wraps (through unsigned, since
// signed overflow is UB); integer division by 0 gives 0 and by -1 negates, as the reference.
inline constexpr const char* kIntHelpers = R"(
static inline int kiln_idiv_i32(int a, int b) {
  int q = a / ((b == 0) | (b == -1) ? 1 : b);
  return b == 0 ? 0 : b == -1 ? (int)(0u - (unsigned)a) : q;
}
static inline long long kiln_idiv_i64(long long a, long long b) {
  long long q = a / ((b == 0) | (b == -1) ? 1 : b);
  return b == 0 ? 0 : b == -1 ? (long long)(0ull - (unsigned long long)a) : q;
}
static inline long long kiln_ipow_i64(long long base, long long e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  unsigned long long r = 1, b = (unsigned long long)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (long long)r;
}
static inline int kiln_ipow_i32(int base, int e) {
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  unsigned r = 1, b = (unsigned)base;
  while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
  return (int)r;
}
// fmod of integers: the dividend's sign, as %; by 0 and by -1 give 0 (as the reference).
static inline int kiln_ifmod_i32(int a, int b) { return (b == 0) | (b == -1) ? 0 : a % ((b == 0) | (b == -1) ? 1 : b); }
static inline long long kiln_ifmod_i64(long long a, long long b) { return (b == 0) | (b == -1) ? 0 : a % ((b == 0) | (b == -1) ? 1 : b); }
// Shifts by a count outside [0, bits) shift everything out, as PyTorch's.
static inline int kiln_shl_i32(int a, int b) { return (b < 0) | (b >= 32) ? 0 : (int)((unsigned)a << (b & 31)); }
static inline long long kiln_shl_i64(long long a, long long b) { return (b < 0) | (b >= 64) ? 0 : (long long)((unsigned long long)a << (b & 63)); }
static inline int kiln_shr_i32(int a, int b) { return (b < 0) | (b >= 32) ? (a < 0 ? -1 : 0) : a >> (b & 31); }
static inline long long kiln_shr_i64(long long a, long long b) { return (b < 0) | (b >= 64) ? (a < 0 ? -1 : 0) : a >> (b & 63); }
static inline int kiln_f2i32(double x) { return (x > -2147483649.0 && x < 2147483648.0) ? (int)x : (-2147483647 - 1); }
static inline long long kiln_f2i64(double x) {
  return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (long long)x : (-9223372036854775807LL - 1);
}
)";

// IEEE binary16 and bfloat16 <-> float, bit for bit as kiln/core/half.hpp, written with
// selects only so that loops converting them vectorise.
inline constexpr const char* kHalfHelpers = R"(
static inline unsigned short kiln_f2h(float f) {
  unsigned int x; __builtin_memcpy(&x, &f, 4);
  unsigned int sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  unsigned int naninf = 0x7c00u | (mag > 0x7f800000u ? (0x200u | ((mag >> 13) & 0x3ffu)) : 0u);
  float sf; __builtin_memcpy(&sf, &mag, 4); sf = sf + 0.5f;
  unsigned int sub; __builtin_memcpy(&sub, &sf, 4); sub -= 0x3f000000u;
  unsigned int norm = (mag + 0xc8000fffu + ((mag >> 13) & 1u)) >> 13;
  unsigned int r = mag >= 0x7f800000u ? naninf : mag >= 0x477ff000u ? 0x7c00u : mag < 0x38800000u ? sub : norm;
  return (unsigned short)(sign | r);
}
static inline float kiln_h2f(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float sv = (float)m * 5.9604644775390625e-08f;
  unsigned int sb; __builtin_memcpy(&sb, &sv, 4);
  unsigned int bits = e == 0x1fu ? (sign | 0x7f800000u | (m << 13)) : e == 0 ? (sign | sb) : (sign | ((e + 112u) << 23) | (m << 13));
  float r; __builtin_memcpy(&r, &bits, 4);
  return r;
}
static inline float kiln_rh(float f) { return kiln_h2f(kiln_f2h(f)); }
)";

inline constexpr const char* kBf16Helpers = R"(
static inline unsigned short kiln_f2b(float f) {
  unsigned int x; __builtin_memcpy(&x, &f, 4);
  unsigned int r = (x & 0x7fffffffu) > 0x7f800000u ? ((x >> 16) | 0x40u) : ((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  return (unsigned short)r;
}
static inline float kiln_b2f(unsigned short b) { unsigned int x = (unsigned int)b << 16; float r; __builtin_memcpy(&r, &x, 4); return r; }
static inline float kiln_rb(float f) { return kiln_b2f(kiln_f2b(f)); }
)";

/// Writes one kernel's function.
class KernelWriter {
 public:
  KernelWriter(const ir::Graph& g, const sched::Schedule& s, int kid, Needs& needs)
      : g_(g),
        s_(s),
        k_(s.kernels[static_cast<std::size_t>(kid)]),
        kid_(kid),
        needs_(needs),
        sym_(s.symbolic != 0 && !k_.space.empty() && k_.space[0] == s.symbolic) {
    std::string why;
    if (!sched::symbolic_kernel(s, static_cast<std::size_t>(kid), &why))
      throw Error("kiln codegen: no symbolic-size code for " + why);
  }

  std::string write(const std::string& name) {
    if (k_.kind == sched::KernelKind::Reduce && k_.loops.chunks == 1 && !k_.loops.column && k_.passes > 1 &&
        !analysis_) {
      // A dry run finds the expensive values that a later pass would recompute.
      Needs scratch;
      KernelWriter dry(g_, s_, kid_, scratch);
      dry.analysis_ = true;
      dry.write(name);
      stash_ = std::move(dry.stash_);
      plan_stash();
    }
    ws_ = k_.loops.parallel;
    if (sym_)
      decls_.push_back("const long long " + std::string(kSizeVar) + " = *(const long long*)args[" +
                       std::to_string(size_slot()) + "];");
    scopes_.push_back(Scope{});
    if (k_.kind == sched::KernelKind::Pointwise)
      pointwise();
    else if (k_.loops.chunks > 1)
      reduce_split();
    else
      reduce_tiles();
    end_serial();
    body_name_ = name + "_body";
    // The body's worksharing is orphaned: it runs inside whatever team calls it, so one body
    // serves both the kernel's own entry (a parallel region of its own) and the graph entry
    // (one region for every kernel). Its last construct skips its barrier: the caller's
    // barrier (the end of the region, or the one between kernels) follows at once.
    std::string& code = scopes_[0].code;
    if (ws_ && last_ws_pos_ != std::string::npos && last_ws_end_ == code.size())
      code.insert(code.find('\n', last_ws_pos_), " nowait");
    std::string out = "static void " + body_name_ + "(void* const* args, void* const* scratch) {\n";
    out += "  (void)scratch;\n";
    for (auto& d : decls_) out += "  " + d + "\n";
    // A single-threaded kernel runs on one thread of the team; the others go on to the barrier.
    if (ws_)
      out += code;
    else
      out += "  #pragma omp single nowait\n  {\n" + code + "  }\n";
    out += "}\n";
    out += "extern \"C\" void " + name + "(void* const* args, int nth) {\n";
    out += "  (void)nth;\n";
    out += scratch_alloc("scratch");
    // A symbolic size: whether a team pays is known only at launch.
    if (ws_) out += "  #pragma omp parallel num_threads(nth)" + team_if() + "\n";
    out += "  " + body_name_ + "(args, scratch);\n";
    out += scratch_free("scratch");
    out += "}\n";
    return out;
  }

  /// The body function written by write() (call it as `body(args, scratch)`).
  const std::string& body_name() const { return body_name_; }
  /// True when the body shares its loops among the calling team (else one thread runs it).
  bool worksharing() const { return ws_; }
  /// Declares and allocates the kernel's scratch arrays as `void* <var>[...]` (C text).
  std::string scratch_alloc(const std::string& var) const {
    if (arrays_.empty()) return "  void* const* " + var + " = 0;\n";
    std::string s = "  void* " + var + "[" + std::to_string(arrays_.size()) + "];\n";
    for (std::size_t i = 0; i < arrays_.size(); ++i)
      s += "  " + var + "[" + std::to_string(i) + "] = __builtin_malloc(" + arrays_[i] + ");\n";
    return s;
  }
  std::string scratch_free(const std::string& var) const {
    std::string s;
    for (std::size_t i = 0; i < arrays_.size(); ++i) s += "  __builtin_free(" + var + "[" + std::to_string(i) + "]);\n";
    return s;
  }

 private:
  struct Val {
    std::string expr;
    int scope = 0;
  };
  struct Scope {
    std::string code;
    std::unordered_map<std::string, Val> memo;
    std::uint64_t dims = 0;
    std::string header;
  };
  struct Binding {
    std::string text;
    std::uint64_t dims = 0;
    int min_scope = 0;
  };

  const ir::GraphNode& node(int i) const { return g_.nodes[static_cast<std::size_t>(i)]; }

  // ---- scopes ----------------------------------------------------------------------------

  int top() const { return static_cast<int>(scopes_.size()) - 1; }
  void line(const std::string& text) { line_at(top(), text); }
  void line_at(int scope, const std::string& text) {
    scopes_[static_cast<std::size_t>(scope)].code +=
        std::string(2 * static_cast<std::size_t>(scope + 1), ' ') + text + "\n";
  }
  /// Opens a block (`header` is e.g. a for statement, `pragma` a line above it) that defines
  /// the loop variables of `dims`.
  void open(const std::string& pragma, const std::string& header, std::uint64_t dims) {
    std::string h;
    if (!pragma.empty()) h += std::string(2 * static_cast<std::size_t>(top() + 1), ' ') + pragma + "\n";
    h += std::string(2 * static_cast<std::size_t>(top() + 1), ' ') + header + " {\n";
    Scope sc;
    sc.dims = dims;
    sc.header = h;
    scopes_.push_back(std::move(sc));
  }
  void close() {
    Scope sc = std::move(scopes_.back());
    scopes_.pop_back();
    Scope& parent = scopes_.back();
    const bool ws = scopes_.size() == 1 && sc.header.find("#pragma omp for") != std::string::npos;
    if (ws) last_ws_pos_ = parent.code.size();
    parent.code += sc.header + sc.code + std::string(2 * static_cast<std::size_t>(top() + 1), ' ') + "}\n";
    if (ws) last_ws_end_ = parent.code.size();
  }
  /// The chunk clause of a pointwise loop of `extent` iterations dealt in pointwise_pieces_.
  std::string piece(i64 extent) const {
    if (pointwise_pieces_ <= 1 || sym_) return "";
    return ", " + std::to_string(std::max<i64>(1, (extent + pointwise_pieces_ - 1) / pointwise_pieces_));
  }
  /// The pragma of a loop shared among the team (empty when the kernel runs single-threaded).
  std::string shared_loop(const std::string& clauses) {
    if (!ws_) return "";
    end_serial();
    return "#pragma omp for" + clauses;
  }
  /// Starts (or continues) a part of a worksharing kernel that one thread runs (combining
  /// partials, final stores). Values hoisted to the body's scope in here are private to that
  /// thread, so they are forgotten when the part ends.
  void begin_serial() {
    if (!ws_ || serial_open_) return;
    last_ws_pos_ = scopes_[0].code.size();
    line_at(0, "#pragma omp single");
    line_at(0, "{");
    serial_open_ = true;
    serial_memo_.clear();
    for (auto& [k, v] : scopes_[0].memo) serial_memo_.push_back(k);
  }
  void end_serial() {
    if (!serial_open_) return;
    line_at(0, "}");
    last_ws_end_ = scopes_[0].code.size();
    serial_open_ = false;
    auto& memo = scopes_[0].memo;
    std::unordered_set<std::string> keep(serial_memo_.begin(), serial_memo_.end());
    for (auto it = memo.begin(); it != memo.end();) it = keep.count(it->first) ? std::next(it) : memo.erase(it);
  }
  /// Innermost open scope defining a variable in `mask` (0: the function body).
  int scope_for(std::uint64_t mask) const {
    if (!mask) return 0;
    for (int i = top(); i > 0; --i)
      if (scopes_[static_cast<std::size_t>(i)].dims & mask) return i;
    throw Error("kiln codegen: index uses a loop variable that is not in scope (internal error)");
  }
  std::string fresh(const char* prefix) { return prefix + std::to_string(counter_++); }

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
  // ---- symbolic sizes: the leading dim of the space, read at launch -----------------------

  static constexpr const char* kSizeVar = "kiln_s0";
  /// The args slot of the symbolic size: after leaves, outputs and temps.
  std::size_t size_slot() const { return g_.num_leaves() + g_.outputs.size() + s_.temps.size(); }
  /// C text of a product of the space's dims `dims` (the symbolic one as kSizeVar).
  std::string product_text(const std::vector<int>& dims) const {
    i64 e = 1;
    bool sym = false;
    for (int d : dims) {
      if (sym_ && d == 0)
        sym = true;
      else
        e *= k_.space[static_cast<std::size_t>(d)];
    }
    if (!sym) return std::to_string(e) + "LL";
    return e == 1 ? std::string(kSizeVar) : "(" + std::string(kSizeVar) + " * " + std::to_string(e) + "LL)";
  }
  /// C text of a group's extent.
  std::string extent_text(int gi) const { return product_text(k_.loops.groups[static_cast<std::size_t>(gi)]); }
  /// C text of the product of groups' extents.
  std::string extents_text(const std::vector<int>& groups) const {
    std::vector<int> dims;
    for (int gi : groups)
      for (int d : k_.loops.groups[static_cast<std::size_t>(gi)]) dims.push_back(d);
    return product_text(dims);
  }
  /// The `if` clause of a symbolic kernel's team: as plan_loops decides for static sizes.
  std::string team_if() const {
    if (!sym_) return "";
    std::vector<int> all(k_.space.size());
    for (std::size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int>(d);
    std::string work = product_text(all);
    const std::string var = kSizeVar;
    work.replace(work.find(var), var.size(), "*(const long long*)args[" + std::to_string(size_slot()) + "]");
    return " if(" + work + " >= " + std::to_string(sched::kParallelThreshold) + "LL)";
  }
  std::string var(int gi) const { return sched::loop_var(k_.loops.groups[static_cast<std::size_t>(gi)].back()); }

  /// C text of an index expression in the kernel's (coalesced) loop variables.
  std::string render(const IndexExpr& e) const {
    if (!e.affine()) return "(" + e.text + ")";
    std::string s;
    // A merged group is walked by one variable (that of its last dim); every affine function
    // the scheduler saw scales consistently across the group, so its last coefficient says all.
    for (std::size_t gi = 0; gi < k_.loops.groups.size(); ++gi) {
      const auto& grp = k_.loops.groups[gi];
      i64 c = e.at(static_cast<std::size_t>(grp.back()));
      i64 expect = c;
      for (std::size_t j = grp.size() - 1; j-- > 0;) {
        expect *= k_.space[static_cast<std::size_t>(grp[j + 1])];
        if (e.at(static_cast<std::size_t>(grp[j])) != expect)
          throw Error("kiln codegen: index not affine in merged loop dims (internal error)");
      }
      if (c == 0) continue;
      s += (s.empty() ? "" : " + ") + (c == 1 ? std::string() : "(" + std::to_string(c) + "LL)*") +
           var(static_cast<int>(gi));
    }
    if (e.constant != 0 || s.empty())
      s += (s.empty() ? "" : " + ") + std::string("(") + std::to_string(e.constant) + "LL)";
    return "(" + s + ")";
  }

  // ---- buffers -----------------------------------------------------------------------------

  std::string pointer(sched::Location::Kind kind, int index, DType dt, bool write) {
    std::string name;
    std::size_t slot;
    if (kind == sched::Location::Output) {
      name = "out" + std::to_string(index);
      slot = g_.num_leaves() + static_cast<std::size_t>(index);
    } else {
      name = "tmp" + std::to_string(index);
      slot = g_.num_leaves() + g_.outputs.size() + static_cast<std::size_t>(index);
    }
    declare(name, dt, slot, write);
    return name;
  }
  std::string leaf_pointer(const ir::GraphNode& n) {
    std::string name = "in" + std::to_string(n.leaf);
    declare(name, n.dtype, static_cast<std::size_t>(n.leaf), false);
    return name;
  }
  void declare(const std::string& name, DType dt, std::size_t slot, bool write) {
    if (declared_.count(name)) return;
    declared_[name] = true;
    std::string t = stype(dt);
    // Outputs may alias inputs only element for element (the front end's rule), which keeps
    // __restrict's promise for every loop below (each element is read before it is written).
    decls_.push_back(std::string(write ? "" : "const ") + t + "* __restrict " + name + " = (" +
                     (write ? "" : "const ") + t + "*)args[" + std::to_string(slot) + "];");
  }
  std::string load(const std::string& ptr, const std::string& off, DType dt) {
    return c_family::from_storage(ptr + "[" + off + "]", dt, needs_);
  }

  std::string to_storage(const std::string& v, DType dt) { return c_family::to_storage(v, dt, needs_); }

  /// Rounds an f32 result to the precision of a 16-bit dtype (the reference rounds every op).
  std::string round16(const std::string& v, DType dt) { return c_family::round16(v, dt, needs_); }

  // ---- values ------------------------------------------------------------------------------

  Val emit(int scope, const std::string& key, DType dt, const std::string& expr) {
    std::string name = fresh("v");
    line_at(scope, "const " + std::string(ctype(dt)) + " " + name + " = " + expr + ";");
    Val v{name, scope};
    scopes_[static_cast<std::size_t>(scope)].memo[key] = v;
    return v;
  }

  /// The value of `id` at `idx`, computed inline (or read from memory / a register when the
  /// schedule says so), placed in the outermost scope where everything it uses is defined.
  Val value(int id, const Index& idx) {
    const std::string key = std::to_string(id) + "|" + sched::index_key(idx);
    for (int s = top(); s >= 0; --s) {
      auto& memo = scopes_[static_cast<std::size_t>(s)].memo;
      auto it = memo.find(key);
      if (it != memo.end()) return it->second;
    }
    if (pass_ > 0) {
      auto it = computed_in_.find(key);
      if (it != computed_in_.end() && it->second < pass_) {
        if (analysis_) {
          if (cost(id) >= kStashCost) stash_.insert(key);
          return Val{"0", top()};
        }
        auto sn = stash_names_.find(key);
        if (sn != stash_names_.end()) return emit(top(), key, node(id).dtype, sn->second + "[" + stash_pos_ + "]");
      }
    }
    Val v = compute(id, idx, key);
    if (pass_ > 0 && v.scope >= 2 && computed_in_.emplace(key, pass_).second && !analysis_) {
      auto sn = stash_names_.find(key);
      if (sn != stash_names_.end()) line(sn->second + "[" + stash_pos_ + "] = " + v.expr + ";");
    }
    return v;
  }

  /// Rough cost of computing `id` inline (transcendental functions dominate).
  int cost(int id) {
    auto it = cost_.find(id);
    if (it != cost_.end()) return it->second;
    const ir::GraphNode& n = node(id);
    // From the op's cost class; here an index map costs its index arithmetic (1) and a random
    // number its generator (1), a reduction's value is already in a register (0).
    int c = 1;
    switch (ir::op_info(n.op).cost) {
      case ir::CostClass::Transcendental:
        c = 20;
        break;
      case ir::CostClass::Divide:
        c = 4;
        break;
      case ir::CostClass::Free:
        c = ir::op_kind(n.op) == ir::OpKind::Leaf || ir::is_reduction(n.op) ? 0 : 1;
        break;
      case ir::CostClass::Cheap:
        c = 1;
        break;
    }
    if (!ir::is_reduction(n.op))
      for (auto i : n.inputs) c = std::min(1 << 20, c + cost(i));
    cost_[id] = c;
    return c;
  }

  /// Names the stash arrays (one row of each stashed value, per thread) within a budget.
  void plan_stash() {
    i64 row = 1;
    for (int gi : k_.loops.red_groups) row *= extent(gi);
    i64 total = 0;
    for (auto& key : stash_) {
      int id = std::stoi(key.substr(0, key.find('|')));
      DType dt = node(id).dtype;
      i64 bytes = row * static_cast<i64>(is_floating(dt) && dt != DType::Float64      ? 4
                                         : dt == DType::Float64 || dt == DType::Int64 ? 8
                                                                                      : 4);
      if (row > kStashMaxRow || total + bytes > kStashBudget) continue;
      total += bytes;
      std::string name = "stash" + std::to_string(stash_names_.size());
      stash_names_[key] = name;
      stash_decls_.push_back("alignas(64) " + std::string(ctype(dt)) + " " + name + "[" + std::to_string(row) + "];");
      stash_types_.emplace_back(name, ctype(dt));
    }
  }

  Val compute(int id, const Index& idx, const std::string& key) {
    const ir::GraphNode& n = node(id);
    auto idx_scope = [&]() {
      std::uint64_t m = 0;
      for (auto& e : idx) m |= e.dep_mask();
      return scope_for(m);
    };
    const sched::Location& stored = s_.location[static_cast<std::size_t>(id)];
    if (!ir::is_reduction(n.op) && stored.kind != sched::Location::None &&
        s_.owner[static_cast<std::size_t>(id)] != kid_) {
      // Computed once by an earlier kernel (the scheduler found it too costly to recompute).
      IndexExpr off = sched::strided_offset(idx, stored.strides, n.shape);
      return emit(scope_for(off.dep_mask()), key, n.dtype,
                  load(pointer(stored.kind, stored.index, n.dtype, false), render(off), n.dtype));
    }
    switch (ir::op_kind(n.op)) {
      case ir::OpKind::Leaf: {
        if (n.op == Op::Input) {
          IndexExpr off = sched::strided_offset(idx, n.strides, n.shape);
          return emit(scope_for(off.dep_mask()), key, n.dtype, load(leaf_pointer(n), render(off), n.dtype));
        }
        if (n.op == Op::Constant) return Val{constant_literal(n), 0};
        if (n.op == Op::Iota) {
          const IndexExpr& e = idx[static_cast<std::size_t>(n.attrs.ints.at(0))];
          return emit(scope_for(e.dep_mask()), key, n.dtype, cast_from_i64(render(e), n.dtype));
        }
        return emit(idx_scope(), key, n.dtype, random_expr(n, idx));
      }
      case ir::OpKind::Reduce: {
        if (s_.owner[static_cast<std::size_t>(id)] == kid_) {
          auto it = bound_.find(id);
          if (it == bound_.end()) throw Error("kiln codegen: reduction used before its pass (internal error)");
          int sc = std::max(it->second.min_scope, scope_for(it->second.dims));
          return Val{it->second.text, sc};
        }
        const sched::Location& loc = s_.location[static_cast<std::size_t>(id)];
        if (loc.kind == sched::Location::None)
          throw Error("kiln codegen: a reduction read from memory has no buffer (internal error)");
        IndexExpr off = sched::strided_offset(idx, loc.strides, n.shape);
        return emit(scope_for(off.dep_mask()), key, n.dtype,
                    load(pointer(loc.kind, loc.index, n.dtype, false), render(off), n.dtype));
      }
      case ir::OpKind::IndexMap: {
        if (n.op != Op::Concat) {
          Val v = value(n.inputs[0], sched::input_index(g_, n, 0, idx, k_.space));
          scopes_[static_cast<std::size_t>(v.scope)].memo[key] = v;
          return v;
        }
        // Every piece is loaded at a clamped (valid) index, then the right one is selected:
        // no branches in the loop.
        const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
        std::string pos = render(idx[axis]);
        std::vector<Val> parts;
        std::vector<i64> ends;
        i64 off = 0;
        int sc = scope_for(idx[axis].dep_mask());
        for (std::size_t k = 0; k < n.inputs.size(); ++k) {
          i64 len = node(n.inputs[k]).shape[axis];
          off += len;
          if (len == 0) continue;
          parts.push_back(value(n.inputs[k], sched::input_index(g_, n, k, idx, k_.space)));
          ends.push_back(off);
          sc = std::max(sc, parts.back().scope);
        }
        std::string e = parts.back().expr;
        for (std::size_t k = parts.size() - 1; k-- > 0;)
          e = "(" + pos + " < " + std::to_string(ends[k]) + "LL ? " + parts[k].expr + " : " + e + ")";
        return emit(sc, key, n.dtype, e);
      }
      default:
        break;
    }
    // Pointwise: inputs at the same index.
    std::vector<Val> in;
    int sc = 0;
    for (auto i : n.inputs) {
      in.push_back(value(i, idx));
      sc = std::max(sc, in.back().scope);
    }
    return emit(sc, key, n.dtype, pointwise_expr(n, in));
  }

  std::string cast_from_i64(const std::string& v, DType t) {
    switch (t) {
      case DType::Bool:
        return "(" + v + " != 0)";
      case DType::Int32:
        return "(int)" + v;
      case DType::Int64:
        return v;
      case DType::Float64:
        return "(double)" + v;
      case DType::Float32:
        return "(float)" + v;
      default:
        return round16("(float)" + v, t);
    }
  }

  std::string random_expr(const ir::GraphNode& n, const Index& idx) {
    // A seed input (a kernel argument: one kernel for every seed) is a 0-dim leaf, loaded once
    // in the outermost scope.
    const std::string seed = n.inputs.empty() ? "" : "(unsigned long long)" + value(n.inputs[0], Index{}).expr;
    return c_family::random_expr(n, render(sched::flat_index(idx, n.shape)), needs_, kWriter, seed);
  }

  [[noreturn]] void unsupported(const ir::GraphNode& n, DType in) const { c_family::unsupported(kWriter, n, in); }

  /// Whether node `id` is x - broadcast(max(x)) (softmax's shift): never above 0, so its exp
  /// needs no overflow clamp. Float subtraction keeps x <= m as x - m <= 0.
  bool nonpositive_shift(int id) const {
    const ir::GraphNode& d = node(id);
    if (d.op != Op::Sub) return false;
    const ir::GraphNode& b = node(d.inputs[1]);
    if (b.op != Op::Broadcast) return false;
    const ir::GraphNode& m = node(b.inputs[0]);
    return m.op == Op::ReduceMax && m.inputs[0] == d.inputs[0];
  }

  std::string math(const char* fn, const std::string& a, DType t) {
    needs_.math = true;
    return std::string("kiln_") + fn + (t == DType::Float64 ? "_f64(" : "_f32(") + a + ")";
  }

  std::string cast_expr(const std::string& a, DType from, DType to) {
    if (from == to) return a;
    if (to == DType::Bool) return "(" + a + " != 0)";
    if (from == DType::Bool)
      return is_floating(to) ? std::string(ctype(to)) + "(" + a + " ? 1 : 0)"
                             : "(" + std::string(ctype(to)) + ")(" + a + " ? 1 : 0)";
    if (is_integral(to)) {
      if (is_floating(from)) {
        needs_.ints = true;
        return std::string(to == DType::Int32 ? "kiln_f2i32" : "kiln_f2i64") + "((double)" + a + ")";
      }
      return "(" + std::string(ctype(to)) + ")" + a;  // integer narrowing wraps
    }
    // To a floating dtype. An integer converts to +0, never -0; but g++ 12 folds a float ->
    // int -> float round trip into one trunc(), which keeps the sign of -0.5 (-fno-trapping-
    // math allows the fold; signed zeros do not stop it). A zero picked by a select is not
    // folded (adding +0.0 is: g++ knows an int's conversion is never -0).
    const std::string ft = ctype(to);
    std::string c = is_integral(from) ? "(" + a + " == 0 ? (" + ft + ")0 : (" + ft + ")" + a + ")" : "(" + ft + ")" + a;
    return round16(c, to);
  }

  std::string pointwise_expr(const ir::GraphNode& n, const std::vector<Val>& in) {
    const DType t = n.dtype;
    const DType it = node(n.inputs[0]).dtype;
    const std::string a = in[0].expr;
    const std::string b = in.size() > 1 ? in[1].expr : std::string();
    const bool fl = is_floating(it);
    const bool dbl = it == DType::Float64;
    // Math by its C name (the op table's kLibmName): kiln's vectorised kiln_<name>_f32/_f64
    // where cpu_math.hpp has one, else the scalar builtin (__builtin_atan2f(a, b), ...).
    if (ir::has_flag(n.op, ir::kLibmName)) {
      if (!fl) unsupported(n, it);
      const std::string fn = ir::op_name(n.op);
      if (n.op == Op::Exp && it == DType::Float32 && nonpositive_shift(n.inputs[0])) return math("exp_nonpos", a, it);
      if (std::find(std::begin(kVectorMath), std::end(kVectorMath), n.op) != std::end(kVectorMath))
        return round16(math(fn.c_str(), a, it), t);
      return round16(
          c_family::libm_call(c_family::kCppDialect, fn, dbl) + a + (in.size() > 1 ? ", " + b : std::string()) + ")",
          t);
    }
    switch (n.op) {
      case Op::Cast:
        return cast_expr(a, it, t);
      case Op::Add:
        if (fl) return round16("(" + a + " + " + b + ")", t);
        break;
      case Op::Sub:
        if (fl) return round16("(" + a + " - " + b + ")", t);
        break;
      case Op::Mul:
        if (fl) return round16("(" + a + " * " + b + ")", t);
        break;
      case Op::Div:
        if (fl) return round16("(" + a + " / " + b + ")", t);
        break;
      default:
        break;
    }
    // Everything else reads the same in every dialect (codegen/c/pointwise.hpp).
    const std::string c = in.size() > 2 ? in[2].expr : std::string();
    const c_family::PointwiseHooks hooks{c_family::kCppDialect, needs_, kWriter};
    if (std::string e = c_family::pointwise_expr({n, it, a, b, c}, hooks); !e.empty()) return e;
    throw Error(std::string("kiln codegen: no code for op ") + ir::op_name(n.op));
  }

  // ---- stores ------------------------------------------------------------------------------

  void store(const sched::Store& st, const Index& idx) {
    const ir::GraphNode& n = node(st.node);
    Val v = value(st.node, idx);
    for (auto& t : st.targets) {
      IndexExpr off = sched::strided_offset(idx, t.strides, n.shape);
      std::string p = pointer(t.kind, t.index, n.dtype, true);
      if (streaming_ && streamable(t, n, off)) {
        // Into a row buffer, written out after the row's last pass (flush_streams).
        std::string buf = "srow" + std::to_string(stream_count_++);
        std::string reuse = pass_ == k_.passes ? free_stash(stype(n.dtype)) : "";
        if (!reuse.empty())
          // Stashes are dead after the last pass reads them, and each element is read before
          // the same position is written: the row buffer can be a stash (less cache traffic).
          line_at(tile_scope_, std::string(stype(n.dtype)) + "* " + buf + " = " + reuse + ";");
        else
          line_at(tile_scope_,
                  std::string("alignas(64) ") + stype(n.dtype) + " " + buf + "[" + std::to_string(row_length()) + "];");
        line(buf + "[" + stash_pos_ + "] = " + to_storage(v.expr, n.dtype) + ";");
        IndexExpr base = off;
        for (int d : k_.loops.groups[static_cast<std::size_t>(k_.loops.red_groups.front())])
          base.coeff[static_cast<std::size_t>(d)] = 0;
        streams_.push_back(
            Stream{buf, "&" + p + "[" + render(base) + "]", row_length() * static_cast<i64>(itemsize(n.dtype))});
        continue;
      }
      line(p + "[" + render(off) + "] = " + to_storage(v.expr, n.dtype) + ";");
    }
  }

  i64 row_length() const {
    i64 row = 1;
    for (int gi : k_.loops.red_groups) row *= extent(gi);
    return row;
  }
  /// Whether a full store of a row kernel goes through a row buffer and non-temporal stores:
  /// the output is large (it will not stay in cache anyway), the row is contiguous in it and
  /// the buffer is small enough for the stack.
  bool streamable(const sched::Location& t, const ir::GraphNode& n, const IndexExpr& off) const {
    const auto& p = k_.loops;
    // Symbolic sizes: how large the output is is known only at launch; rows are written directly.
    if (sym_ || t.kind != sched::Location::Output || !off.affine() || p.column || p.red_groups.size() != 1)
      return false;
    const i64 elem = static_cast<i64>(itemsize(n.dtype));
    const i64 row = row_length();
    if (row * elem > kStreamMaxRowBytes || row * elem < 256 || n.shape.numel() * elem < kStreamMinBytes) return false;
    const auto& dims = p.groups[static_cast<std::size_t>(p.red_groups.front())];
    i64 expect = 1;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      if (off.at(static_cast<std::size_t>(*it)) != expect) return false;
      expect *= k_.space[static_cast<std::size_t>(*it)];
    }
    return true;
  }
  /// A stash of element type `type` not yet used as a row buffer ("" when none).
  std::string free_stash(const std::string& type) {
    for (auto& [name, t] : stash_types_)
      if (t == type && !stash_reused_.count(name)) {
        stash_reused_.insert(name);
        return name;
      }
    return "";
  }
  void flush_streams() {
    for (auto& st : streams_)
      line("kiln_stream_row(" + st.dst + ", " + st.buf + ", " + std::to_string(st.bytes) + "LL);");
    if (!streams_.empty()) needs_.stream = true;
    streams_.clear();
  }

  // ---- pointwise kernels -------------------------------------------------------------------

  void pointwise() {
    const auto& p = k_.loops;
    std::vector<int> order = p.order;
    if (order.empty()) {
      begin_serial();
      for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
      return;
    }
    // Outer loops: merge the outermost while it is too short to share among threads.
    std::vector<int> outer(order.begin(), order.end() - 1);
    int inner = order.back();
    if (outer.empty()) {
      std::string pragma =
          p.parallel ? shared_loop(" simd schedule(simd:static" + piece(extent(inner)) + ")") : "#pragma omp simd";
      open(pragma,
           "for (long long " + var(inner) + " = 0; " + var(inner) + " < " + extent_text(inner) + "; ++" + var(inner) +
               ")",
           group_mask(inner));
    } else {
      std::size_t lead = 1;
      i64 lead_extent = extent(outer[0]);
      while (p.parallel && lead < outer.size() && lead_extent < 16) lead_extent *= extent(outer[lead++]);
      std::string pragma = p.parallel ? shared_loop(" schedule(static" + piece(lead_extent) + ")") : "";
      if (lead == 1) {
        open(pragma,
             "for (long long " + var(outer[0]) + " = 0; " + var(outer[0]) + " < " + extent_text(outer[0]) + "; ++" +
                 var(outer[0]) + ")",
             group_mask(outer[0]));
      } else {
        std::uint64_t m = 0;
        for (std::size_t j = 0; j < lead; ++j) m |= group_mask(outer[j]);
        open(pragma,
             "for (long long t = 0; t < " +
                 extents_text(std::vector<int>(outer.begin(), outer.begin() + static_cast<long>(lead))) + "; ++t)",
             m);
        decode("t", std::vector<int>(outer.begin(), outer.begin() + static_cast<long>(lead)));
      }
      for (std::size_t j = lead; j < outer.size(); ++j)
        open("",
             "for (long long " + var(outer[j]) + " = 0; " + var(outer[j]) + " < " + extent_text(outer[j]) + "; ++" +
                 var(outer[j]) + ")",
             group_mask(outer[j]));
      open("#pragma omp simd",
           "for (long long " + var(inner) + " = 0; " + var(inner) + " < " + extent_text(inner) + "; ++" + var(inner) +
               ")",
           group_mask(inner));
    }
    for (auto& st : k_.stores) store(st, sched::identity_index(k_.space));
    while (top() > 0) close();
  }

  /// Defines the variables of `groups` (outer to inner) from the flat position `t`.
  void decode(const std::string& t, const std::vector<int>& groups) {
    std::vector<int> below;
    std::vector<std::string> lines;
    for (std::size_t j = groups.size(); j-- > 0;) {
      int gi = groups[j];
      std::string e = t;
      std::string b = extents_text(below);
      if (b != "1LL") e = "(" + e + " / " + b + ")";
      if (j != 0) e = "(" + e + " % " + extent_text(gi) + ")";
      lines.push_back("const long long " + var(gi) + " = " + e + ";");
      below.push_back(gi);
    }
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) line(*it);
  }

  // ---- reductions ----------------------------------------------------------------------------

  /// A reduction of the kernel: its combiner (codegen/c/reduction.hpp: the text both writers
  /// print) and what the C++ writer adds.
  struct Red : c_family::Combiner {
    int node = -1;
    /// A float max/min carries a NaN flag beside its value (OpenMP's max/min reductions and
    /// the vector max instructions would drop a NaN); the result is NaN where the flag is set.
    bool flag = false;
    std::string name;  // accumulator base name
    /// Blocked sums: the float accumulator of the current block ("" when not blocked). A
    /// 32-bit lane adds at most kSumBlock / lanes values before the block's sum is folded into
    /// the double accumulator, so the error stays that of a short sum while the vector loop
    /// runs at float width (a double accumulator costs two conversions and two adds per vector).
    std::string sub;
  };
  static constexpr i64 kSumBlock = 1024;

  Red red_info(int id) {
    const ir::GraphNode& n = node(id);
    Red r;
    static_cast<c_family::Combiner&>(r) =
        c_family::combiner(n.op, node(n.inputs[0]).dtype, n.dtype, c_family::kCppDialect);
    r.node = id;
    r.name = "a" + std::to_string(id);
    r.flag = r.fl && (n.op == Op::ReduceMax || n.op == Op::ReduceMin);
    return r;
  }

  /// OpenMP reduction clauses for the scalar accumulators of `r`.
  std::string clause(const Red& r) const {
    switch (r.op) {
      case Op::ReduceSum:
        return " reduction(+:" + (r.sub.empty() ? r.name : r.sub) + ")";
      case Op::ReduceProd:
        return " reduction(*:" + r.name + ")";
      case Op::ReduceMax:
        return " reduction(max:" + r.name + ")" + (r.flag ? " reduction(|:f" + r.name + ")" : "");
      case Op::ReduceMin:
        return " reduction(min:" + r.name + ")" + (r.flag ? " reduction(|:f" + r.name + ")" : "");
      default:
        return "";
    }
  }

  void declare_acc(const Red& r, const std::string& lanes) {
    std::string arr = lanes.empty() ? "" : "[" + lanes + "]";
    if (lanes.empty()) {
      line(r.acc_t + " " + r.name + " = " + r.init + ";");
      if (r.flag) line("int f" + r.name + " = 0;");
      if (r.arg) line("long long x" + r.name + " = -1;");
    } else {
      line(r.acc_t + " " + r.name + arr + ";");
      if (r.arg) line("long long x" + r.name + arr + ";");
      line("for (long long kk = 0; kk < kn; ++kk) { " + r.name + "[kk] = " + r.init +
           (r.arg ? "; x" + r.name + "[kk] = -1" : "") + "; }");
    }
  }

  /// Folds value `v` (flat position `k` along the reduced dims, for arg reductions) into
  /// accumulator `a` (an lvalue; `x` its index, `f` its NaN flag or "" for sticky NaN): the
  /// shared combiner's step, or the float add of a blocked sum.
  std::string step(const Red& r, const std::string& a, const std::string& x, const std::string& f, const std::string& v,
                   const std::string& k) const {
    if (r.op == Op::ReduceSum && !r.sub.empty()) return r.sub + " += (float)" + v + ";";
    return c_family::step(r, a, x, v, k, f);
  }

  /// The reduction's result in ctype(out) from accumulator `a` (flag `f` or "").
  std::string finish(const Red& r, const std::string& a, const std::string& x, const std::string& f) {
    return c_family::finish(r, a, x, f, c_family::kCppDialect, needs_);
  }

  /// The position of the current element along the reduced dims, row-major (arg reductions).
  std::string reduced_position() const {
    IndexExpr f = sched::ix_const(0);
    i64 mult = 1;
    for (std::size_t d = k_.space.size(); d-- > 0;) {
      if (!k_.reduced[d] || k_.space[d] == 1) continue;
      f = sched::ix_add(f,
                        sched::ix_scale(sched::ix_var(static_cast<int>(d), static_cast<int>(k_.space.size())), mult));
      mult *= k_.space[d];
    }
    return render(f);
  }
  /// The position of the current row among all rows, row-major (arg final reductions).
  std::string row_position() const {
    Shape rs = k_.row_shape();
    IndexExpr f = sched::flat_index(sched::identity_index(rs), rs);
    if (f.affine()) f.coeff.resize(k_.space.size(), 0);
    return render(f);
  }

  std::vector<Red> phase_reds(int p) {
    std::vector<Red> v;
    for (std::size_t j = 0; j < k_.reductions.size(); ++j)
      if (k_.phase[j] == p) v.push_back(red_info(k_.reductions[j]));
    return v;
  }

  /// Whether the sums among `reds` are blocked (see Red::sub): row strategy, one reduced loop
  /// long enough to have several blocks, floating inputs narrower than double.
  bool block_sums(std::vector<Red>& reds) {
    const auto& p = k_.loops;
    if (p.column || p.red_groups.size() != 1 || extent(p.red_groups.front()) <= kSumBlock) return false;
    bool any = false;
    for (auto& r : reds) {
      if (r.op != Op::ReduceSum || !r.fl || r.in == DType::Float64) continue;
      r.sub = "s" + r.name;
      any = true;
    }
    return any;
  }

  /// Opens the loops over the reduced groups (the first limited to [lo, hi) when given) and,
  /// for the column strategy, the vectorised loop over the block. With blocked sums the single
  /// reduced loop is split into a loop over blocks and the vectorised loop within a block.
  /// Returns how many scopes it opened; close them with close_reduced_loops.
  int open_reduced_loops(const std::vector<Red>& reds, const std::string& lo, const std::string& hi) {
    const auto& p = k_.loops;
    int opened = 0;
    bool simd_ok = true, blocked = false;
    std::string clauses;
    for (auto& r : reds) {
      if (r.arg) simd_ok = false;
      blocked = blocked || !r.sub.empty();
      clauses += clause(r);
    }
    for (std::size_t j = 0; j < p.red_groups.size(); ++j) {
      int gi = p.red_groups[j];
      std::string a = j == 0 && !lo.empty() ? lo : "0LL";
      std::string b = j == 0 && !hi.empty() ? hi : std::to_string(extent(gi)) + "LL";
      bool innermost = j + 1 == p.red_groups.size() && !p.column;
      if (innermost && blocked) {
        const std::string len = std::to_string(kSumBlock) + "LL";
        open("", "for (long long bb = " + a + "; bb < " + b + "; bb += " + len + ")", 0);
        ++opened;
        for (auto& r : reds)
          if (!r.sub.empty()) line("float " + r.sub + " = 0.0f;");
        line("const long long be = bb + " + len + " < " + b + " ? bb + " + len + " : " + b + ";");
        a = "bb";
        b = "be";
      }
      std::string pragma = innermost && simd_ok ? "#pragma omp simd" + clauses : "";
      open(pragma, "for (long long " + var(gi) + " = " + a + "; " + var(gi) + " < " + b + "; ++" + var(gi) + ")",
           group_mask(gi));
      ++opened;
    }
    if (p.column) {
      open(simd_ok ? "#pragma omp simd" : "", "for (long long kk = 0; kk < kn; ++kk)", group_mask(p.vec_group));
      line("const long long " + var(p.vec_group) + " = k0 + kk;");
      ++opened;
    }
    return opened;
  }
  /// Closes what open_reduced_loops opened, folding each block's float sums into their
  /// accumulators between the vectorised loop and the loop over blocks.
  void close_reduced_loops(const std::vector<Red>& reds, int opened) {
    if (opened == 0) return;  // nothing reduced (rows of one element): nothing blocked either
    close();
    for (auto& r : reds)
      if (!r.sub.empty()) line(r.name + " += (double)" + r.sub + ";");
    for (int j = 1; j < opened; ++j) close();
  }

  /// The body of pass `pass`: folds the reductions of this phase, writes its full stores.
  void pass_body(const std::vector<Red>& reds, int pass) {
    const auto& p = k_.loops;
    Index id = sched::identity_index(k_.space);
    bool need_pos = false;
    for (auto& r : reds) need_pos = need_pos || r.arg;
    std::string pos = need_pos ? reduced_position() : "0";
    for (auto& r : reds) {
      Val v = value(node(r.node).inputs[0], id);
      if (p.column)
        line(step(r, r.name + "[kk]", "x" + r.name + "[kk]", "", v.expr, pos));
      else
        line(step(r, r.name, "x" + r.name, r.flag ? "f" + r.name : "", v.expr, pos));
    }
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Full && st.pass == pass) store(st, id);
  }

  /// Column strategy: k0 (block start) and kn (block length) of tile t.
  void block_vars(const std::string& t) {
    const auto& p = k_.loops;
    const i64 ki = extent(p.vec_group);
    line("const long long k0 = (" + t + " % " + std::to_string(p.blocks) + "LL) * " + std::to_string(p.block) + "LL;");
    line("const long long kn = " + std::to_string(ki) + "LL - k0 < " + std::to_string(p.block) + "LL ? " +
         std::to_string(ki) + "LL - k0 : " + std::to_string(p.block) + "LL;");
  }
  void tile_vars(const std::string& t) {
    const auto& p = k_.loops;
    if (p.column) {
      decode("(" + t + " / " + std::to_string(p.blocks) + "LL)", p.kept_groups);
      block_vars(t);
    } else {
      decode(t, p.kept_groups);
    }
  }
  std::uint64_t kept_mask() const {
    std::uint64_t m = 0;
    for (int gi : k_.loops.kept_groups) m |= group_mask(gi);
    return m;
  }

  void row_stores() {
    const auto& p = k_.loops;
    bool any = false;
    for (auto& st : k_.stores) any = any || st.level == sched::Level::Row;
    if (!any) return;
    if (p.column) {
      open("", "for (long long kk = 0; kk < kn; ++kk)", group_mask(p.vec_group));
      line("const long long " + var(p.vec_group) + " = k0 + kk;");
    }
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Row) store(st, sched::detail::level_index(k_, st.level, node(st.node).shape));
    if (p.column) close();
  }

  /// A scratch array shared by the team: allocated by the caller of the body (before the
  /// parallel region), so every thread sees the same one.
  std::string acc_array(const std::string& type, const std::string& name, i64 count) {
    arrays_.push_back(std::to_string(std::max<i64>(1, count)) + "LL * (long long)sizeof(" + type + ")");
    decls_.push_back(type + "* __restrict " + name + " = (" + type + "*)scratch[" + std::to_string(arrays_.size() - 1) +
                     "];");
    return name;
  }

  /// Finals: per-tile partials written inside the tile scope (the value of the final's input at
  /// the current row, or folded over the block), combined in tile order afterwards.
  void finals_partial(const std::vector<Red>& fins, const std::string& t) {
    const auto& p = k_.loops;
    Index ri = sched::identity_index(k_.row_shape());
    for (auto& r : fins) {
      const std::string id = std::to_string(r.node);
      const std::string pv = "fp" + id, px = "fx" + id, a = "fa" + id, x = "fax" + id, f = "faf" + id;
      // Unique names, no braces: values hoisted into this scope must stay visible after it.
      line(r.acc_t + " " + a + " = " + r.init + "; long long " + x + " = -1; int " + f + " = 0; (void)" + x +
           "; (void)" + f + ";");
      if (p.column) {
        open("", "for (long long kk = 0; kk < kn; ++kk)", group_mask(p.vec_group));
        line("const long long " + var(p.vec_group) + " = k0 + kk;");
      }
      Val v = value(node(r.node).inputs[0], ri);
      line(step(r, a, x, r.flag ? f : "", v.expr, r.arg ? row_position() : "0"));
      if (p.column) close();
      line(pv + "[" + t + "] = " + (r.flag ? f + " ? " + nan_of(r) + " : " + a : a) + ";");
      if (r.arg) line(px + "[" + t + "] = " + x + ";");
    }
  }
  std::string nan_of(const Red& r) const {
    return r.in == DType::Float64 ? c_family::kCppDialect.nan_d : c_family::kCppDialect.nan_f;
  }

  /// Merges partial (pv, px) into (a, x): the combine step of split and final reductions.
  std::string merge(const Red& r, const std::string& a, const std::string& x, const std::string& pv,
                    const std::string& px) const {
    return c_family::merge(r, a, x, pv, px);
  }

  void declare_final_partials(const std::vector<Red>& fins, i64 tiles) {
    for (auto& r : fins) {
      acc_array(r.acc_t, "fp" + std::to_string(r.node), tiles);
      if (r.arg) acc_array("long long", "fx" + std::to_string(r.node), tiles);
    }
  }
  /// Combines final partials in tile order and binds the finals; then the final stores.
  void finals_combine(const std::vector<Red>& fins, i64 tiles) {
    for (auto& r : fins) {
      std::string a = "fin" + std::to_string(r.node), x = "finx" + std::to_string(r.node);
      line(r.acc_t + " " + a + " = " + r.init + "; long long " + x + " = -1; (void)" + x + ";");
      line("for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t) { " +
           merge(r, a, x, "fp" + std::to_string(r.node) + "[t]", r.arg ? "fx" + std::to_string(r.node) + "[t]" : "0") +
           " }");
      std::string res = "r" + std::to_string(r.node);
      line("const " + std::string(ctype(r.out)) + " " + res + " = " + finish(r, a, x, "") + ";");
      bound_[r.node] = Binding{res, 0, top()};
    }
    for (auto& st : k_.stores)
      if (st.level == sched::Level::Final) store(st, sched::detail::zero_index(node(st.node).shape));
  }

  std::vector<Red> final_reds() {
    std::vector<Red> v;
    for (int f : k_.finals) v.push_back(red_info(f));
    return v;
  }

  /// Reduction kernels whose tiles each cover whole rows: every pass of a row runs back to back
  /// in one tile (the row stays in cache between passes).
  void reduce_tiles() {
    const auto& p = k_.loops;
    const i64 tiles = p.tiles();
    std::vector<Red> fins = final_reds();
    declare_final_partials(fins, tiles);
    open(shared_loop(" schedule(static)"),
         "for (long long t = 0; t < " + (sym_ ? extents_text(p.kept_groups) : std::to_string(tiles) + "LL") + "; ++t)",
         kept_mask());
    tile_vars("t");
    tile_scope_ = top();
    for (auto& d : stash_decls_) line(d);
    if (!stash_names_.empty() || analysis_ || !p.column) stash_pos_ = reduced_position();
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::vector<Red> reds = phase_reds(pass);
      block_sums(reds);
      for (auto& r : reds) declare_acc(r, p.column ? std::to_string(p.block) : "");
      int opened = open_reduced_loops(reds, "", "");
      pass_ = p.column ? 0 : pass;
      streaming_ = !analysis_ && !p.column && stash_pos_.size() > 0;
      pass_body(reds, pass);
      streaming_ = false;
      pass_ = 0;
      close_reduced_loops(reds, opened);
      flush_streams();
      for (auto& r : reds) {
        std::string res = "r" + std::to_string(r.node);
        if (p.column) {
          line(std::string(ctype(r.out)) + " " + res + "[" + std::to_string(p.block) + "];");
          line("for (long long kk = 0; kk < kn; ++kk) " + res +
               "[kk] = " + finish(r, r.name + "[kk]", "x" + r.name + "[kk]", "") + ";");
          bound_[r.node] = Binding{res + "[kk]", group_mask(p.vec_group), 1};
        } else {
          line("const " + std::string(ctype(r.out)) + " " + res + " = " +
               finish(r, r.name, "x" + r.name, r.flag ? "f" + r.name : "") + ";");
          bound_[r.node] = Binding{res, 0, 1};
        }
      }
    }
    row_stores();
    finals_partial(fins, "t");
    close();
    if (!fins.empty()) begin_serial();
    finals_combine(fins, tiles);
  }

  /// Reduction kernels with few rows: each pass is split into chunks along the outer reduced
  /// loop, computed in parallel, and the chunks' partials are combined in a fixed order.
  void reduce_split() {
    const auto& p = k_.loops;
    const i64 tiles = p.tiles();
    const i64 chunks = p.chunks;
    const i64 lanes = p.column ? p.block : 1;
    const i64 e0 = extent(p.red_groups.front());
    std::vector<Red> fins = final_reds();
    auto lane = [&](const std::string& base) {
      return p.column ? base + " * " + std::to_string(lanes) + "LL + kk" : base;
    };
    for (int pass = 1; pass <= k_.passes; ++pass) {
      std::vector<Red> reds = phase_reds(pass);
      for (auto& r : reds) {
        acc_array(r.acc_t, "pp" + std::to_string(r.node), tiles * chunks * lanes);
        if (r.arg) acc_array("long long", "px" + std::to_string(r.node), tiles * chunks * lanes);
      }
      open(shared_loop(" schedule(static)"), "for (long long u = 0; u < " + std::to_string(tiles * chunks) + "LL; ++u)",
           kept_mask());
      line("const long long t = u / " + std::to_string(chunks) + "LL, ch = u % " + std::to_string(chunks) + "LL;");
      tile_vars("t");
      line("const long long lo = ch * " + std::to_string(p.chunk_len) + "LL;");
      line("const long long hi = lo + " + std::to_string(p.chunk_len) + "LL < " + std::to_string(e0) + "LL ? lo + " +
           std::to_string(p.chunk_len) + "LL : " + std::to_string(e0) + "LL;");
      for (auto& r : reds) declare_acc(r, p.column ? std::to_string(p.block) : "");
      int opened = open_reduced_loops(reds, "lo", "hi");
      pass_body(reds, pass);
      close_reduced_loops(reds, opened);
      for (auto& r : reds) {
        std::string pv = "pp" + std::to_string(r.node), px = "px" + std::to_string(r.node);
        if (p.column) {
          line("for (long long kk = 0; kk < kn; ++kk) { " + pv + "[" + lane("u") + "] = " + r.name + "[kk];" +
               (r.arg ? " " + px + "[" + lane("u") + "] = x" + r.name + "[kk];" : "") + " }");
        } else {
          line(pv + "[u] = " + (r.flag ? "f" + r.name + " ? " + nan_of(r) + " : " + r.name : r.name) + ";");
          if (r.arg) line(px + "[u] = x" + r.name + ";");
        }
      }
      close();
      // Combine the chunks of every row in order.
      if (!reds.empty()) begin_serial();
      for (auto& r : reds) {
        std::string res = "rr" + std::to_string(r.node);
        acc_array(ctype(r.out), res, tiles * lanes);
        open("", "for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t)", 0);
        if (p.column) {
          block_vars("t");
          open("", "for (long long kk = 0; kk < kn; ++kk)", 0);
        }
        line(r.acc_t + " a = " + r.init + "; long long x = -1; (void)x;");
        std::string at = "(t * " + std::to_string(chunks) + "LL + c)";
        line("for (long long c = 0; c < " + std::to_string(chunks) + "LL; ++c) { " +
             merge(r, "a", "x", "pp" + std::to_string(r.node) + "[" + lane(at) + "]",
                   r.arg ? "px" + std::to_string(r.node) + "[" + lane(at) + "]" : "0") +
             " }");
        line(res + "[" + lane("t") + "] = " + finish(r, "a", "x", "") + ";");
        if (p.column) close();
        close();
        bound_[r.node] = Binding{res + "[" + lane("t") + "]", p.column ? group_mask(p.vec_group) : 0, 1};
      }
    }
    // Row-level stores and finals, one tile at a time (there are few tiles).
    bool any_row = false;
    for (auto& st : k_.stores) any_row = any_row || st.level == sched::Level::Row;
    if (any_row) {
      begin_serial();
      open("", "for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t)", kept_mask());
      tile_vars("t");
      row_stores();
      close();
    }
    if (!fins.empty()) begin_serial();
    if (!fins.empty()) {
      declare_final_partials(fins, tiles);
      open("", "for (long long t = 0; t < " + std::to_string(tiles) + "LL; ++t)", kept_mask());
      tile_vars("t");
      finals_partial(fins, "t");
      close();
    }
    finals_combine(fins, tiles);
  }

  const ir::Graph& g_;
  const sched::Schedule& s_;
  const sched::Kernel& k_;
  int kid_;
  Needs& needs_;
  bool sym_ = false;  // the space's leading dim is the schedule's symbolic size
  std::vector<Scope> scopes_;
  std::unordered_map<int, Binding> bound_;
  std::unordered_map<std::string, bool> declared_;
  std::vector<std::string> decls_;
  std::vector<std::string> arrays_;  // byte counts (C text) of the scratch arrays
  bool ws_ = false, serial_open_ = false;

 public:
  i64 pointwise_pieces_ = 0;  // CppOptions::pointwise_pieces, for this kernel
 private:
  std::vector<std::string> serial_memo_;
  std::size_t last_ws_pos_ = std::string::npos, last_ws_end_ = 0;
  std::string body_name_;
  int counter_ = 0;
  // Row cache of reduction kernels: values computed in one pass and needed again in a later
  // one are kept in a per-thread row buffer when recomputing them costs more than a load.
  struct Stream {
    std::string buf, dst;
    i64 bytes;
  };
  bool streaming_ = false;
  int tile_scope_ = 0, stream_count_ = 0;
  std::vector<Stream> streams_;
  /// Outputs at least this large are streamed (well past the 2-core machine's L2 and a fair
  /// share of the L3: a consumer would find little of it in cache).
  static constexpr i64 kStreamMinBytes = 16 << 20;
  static constexpr i64 kStreamMaxRowBytes = 64 << 10;
  static constexpr int kStashCost = 10;
  static constexpr i64 kStashMaxRow = 16384;
  static constexpr i64 kStashBudget = 256 * 1024;
  bool analysis_ = false;
  int pass_ = 0;
  std::string stash_pos_;
  std::unordered_map<std::string, int> computed_in_;
  std::unordered_set<std::string> stash_;
  std::unordered_map<std::string, std::string> stash_names_;
  std::vector<std::string> stash_decls_;
  std::vector<std::pair<std::string, std::string>> stash_types_;  // name, element type
  std::unordered_set<std::string> stash_reused_;
  std::unordered_map<int, int> cost_;
};

}  // namespace detail

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
  if (needs.half) src += detail::kHalfHelpers;
  if (needs.bf16) src += detail::kBf16Helpers;
  if (needs.math) {
    src += kCpuMathSource;
    src += "\n";
  }
  if (needs.stream) src += detail::kStreamHelpers;
  if (needs.philox) {
    src += philox::kPhiloxSource;
    src += "\n";
  }
  src += kiln::detail::kKernelsBeginMarker;
  src += body;
  return out;
}

}  // namespace kiln::codegen
