#pragma once
// What every CUDA kernel's writer shares: the kernel's scopes and their lines, the loop
// groups and their decoding, loads and stores (16-byte vectors where aligned), values (each
// node's expression, emitted once per scope and lane), and the row cache's slots. A kernel
// kind (pointwise.hpp, rows.hpp, split_rows.hpp, columns.hpp) derives from it: its plan step
// decides the launch, its print step writes the text through these pieces.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/codegen/cuda/dialect.hpp"
#include "kiln/codegen/cuda/target.hpp"
#include "kiln/core/half.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/sched/schedule.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::cuda_detail {

/// The shared half of a kernel's writer (see the file comment). A kernel kind derives from it
/// and supplies `Plan plan()` (the launch: threads, lanes, slots, shared memory, grid; no text)
/// and `void print(const Plan&)` (the kernel's body); write_kernel (unit.hpp) runs begin,
/// plan, print and finish_kernel.
class KernelWriter {
 public:
  KernelWriter(const ir::Graph& g, const sched::Schedule& s, int kid, const CudaTarget& target,
               const CudaAlignment& align, Needs& needs, std::size_t scratch_offset)
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
  KernelWriter(const KernelWriter&) = delete;
  KernelWriter& operator=(const KernelWriter&) = delete;

  /// Opens kernel `name`'s body.
  void begin(const std::string& name) {
    info_.name = name;
    scopes_.push_back(Scope{});
  }

  /// Closes the body: the kernel's source (after the unit's prelude) and its launch; `scratch`
  /// receives the bytes of scratch this kernel uses (at the offset given to the constructor).
  CudaKernelInfo finish_kernel(std::string& code, std::size_t& scratch) {
    while (scopes_.size() > 1) close();
    if (info_.grid == 0 && info_.grid_rule.units_per_size == 0)
      throw InternalError("kiln CUDA codegen: kernel " + info_.name + " has neither a grid nor a rule for one");
    std::string out;
    if (!globals_.empty()) out += globals_;
    out += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(info_.block) + ") " + info_.name +
           "(const kiln_args a) {\n";
    for (auto& d : decls_) out += "  " + d + "\n";
    out += scopes_[0].code;
    out += "}\n";
    code = out;
    scratch = scratch_bytes_;
    return info_;
  }
 protected:
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
  }  /// Innermost open scope where everything index `e` reads is defined: its loop variables and
  /// the variables of its value terms (gathered indices, defined where they were computed).
  int scope_of(const IndexExpr& e) const { return sched::scope_with_values(e, scope_for(e.dep_mask()), value_scope_); }

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
    if (!e.text.empty()) {
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
    // Value terms (gathered indices) name each lane's own variable already.
    if (!e.values.empty()) s += " + " + sched::value_terms_text(e.values);
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
    if (!off.text.empty()) return false;
    // A gathered row (x[ids[i], j]): its value terms must be one for every lane and keep the
    // row start a multiple of the vector.
    for (auto& v : off.values)
      if ((v.deps & vec_mask_) != 0 || v.scale % std::max(vec_, 1) != 0) return false;
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
        // 16-byte chunks kept on chip: read with an L2 evict_last policy (CudaTarget::row_cache_load_keep).
        const bool keep = t_.row_cache_load_keep && c.chunk_bytes == 16;
        for (std::size_t j = 0; j < nch; ++j) {
          const std::string at = ptr + " + " + render(off) + (j ? " + " + lit(static_cast<i64>(j * per)) : "");
          line_at(sc, c.text[j] + " = " + (keep ? "kiln_ld_keep(" + at + ")" : "*(const " + std::string(ct) + "*)(" + at + ")") + ";");
        }
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
    // Rows read through a gathered index: an L2 evict_last policy when CudaTarget::gather_load_keep.
    const bool keep = t_.gather_load_keep && off.has_values() && c.chunk_bytes == 16;
    for (std::size_t j = 0; j < nch; ++j) {
      const std::string at = ptr + " + " + render(off) + (j ? " + " + lit(static_cast<i64>(j * per)) : "");
      line_at(sc, "const " + std::string(ct) + " " + name + "_" + std::to_string(j) + " = " +
                      (keep ? "kiln_ld_keep(" + at + ")" : "*(const " + std::string(ct) + "*)(" + at + ")") + ";");
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
    const int sc = scope_of(off);
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
          return emit(scope_of(e), key, ld, lane, n.dtype,
                      cast_from_index(render(e, ld ? lane : 0), n.dtype));
        }
        IndexExpr flat = sched::flat_index(idx, n.shape);
        bool ld = lane_dep(flat);
        // A seed input (dropout's key, a 0-dim int64 value in device memory) is read once per
        // thread: one kernel for every key.
        const std::string seed =
            n.inputs.empty() ? "" : "(unsigned long long)" + value(n.inputs[0], Index{}, 0).expr;
        return emit(scope_of(flat), key, ld, lane, n.dtype, random_expr(n, render(flat, ld ? lane : 0), seed));
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
        int sc = scope_of(idx[axis]);
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
        if (parts.empty()) {
          // Every piece, and so the concat, is empty along the axis: no position reads it (its
          // loops run no iteration), but the code is still written (fuzz seed 600, graph 852).
          ir::GraphNode zero = n;
          zero.attrs.scalar = 0;
          zero.attrs.iscalar = 0;
          return Val{constant_literal(zero), 0, false};
        }
        std::string e = parts.back().expr;
        for (std::size_t k = parts.size() - 1; k-- > 0;)
          e = "(" + pos + " < " + lit(ends[k]) + " ? " + parts[k].expr + " : " + e + ")";
        return emit(sc, key, ld, lane, n.dtype, e);
      }
      case ir::OpKind::Gather: {
        // The index is computed (and checked, clamped) first, then the input is read at it.
        const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
        Val at = value(n.inputs[1], idx, lane);
        // The checked index once for every lane that shares it (each lane's element of a
        // gathered row is a lane of one vector load).
        const Val* known = find("G" + key + (at.lane ? "|" + std::to_string(lane) : "|*"));
        Val g = known ? *known
                      : emit(at.scope, "G" + key, at.lane, lane, DType::Int64,
                             c_family::gather_index_expr(g_, n, at.expr, needs_));
        value_scope_[g.expr] = g.scope;
        // The lanes of a vector share the variable unless it is lane-dependent itself.
        std::uint64_t deps = g.lane ? vec_mask_ : 0;
        for (auto& e : idx) deps |= e.dep_mask() & ~vec_mask_;
        Val v = value(n.inputs[0],
                      sched::gather_index(idx, axis, sched::ix_value(g.expr, deps), node(n.inputs[0]).shape), lane);
        remember(key, v, lane);
        return v;
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
      // A value that is one for every lane is computed once (the other lanes find it in the
      // memo) but read back per lane by later passes: every lane's slot gets it now.
      const int lanes = v.lane || vec_ <= 1 ? 1 : vec_;
      for (int j = 0; j < lanes; ++j)
        line_at(v.scope, cached->second.name + "[" + value_slot(lanes == 1 ? lane : j) + "] = " + v.expr + ";");
      cached->second.pass = cur_pass_;
    }
    return v;
  }

  /// Register slot of the current position's lane in a row's value cache.
  std::string value_slot(int lane) const {
    return "(" + slot_var_ + ") * " + std::to_string(vec_) + " + " + std::to_string(lane);
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

  std::string random_expr(const ir::GraphNode& n, const std::string& flat, const std::string& seed = "") {
    return c_family::random_expr(n, flat, needs_, kWriter, seed);
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
  /// The scope each gathered index variable (a value term's text) is defined in.
  std::unordered_map<std::string, int> value_scope_;
  std::set<std::string> declared_;
  std::vector<std::string> decls_;
  std::string globals_;
  int counter_ = 0;
  CudaKernelInfo info_;
};

}  // namespace kiln::codegen::cuda_detail

KILN_COLD_CODE_END
