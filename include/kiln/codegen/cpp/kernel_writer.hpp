#pragma once
// The C++ writer of one kernel: scopes and OpenMP worksharing, buffers, values (each node's
// expression, emitted once per scope; expensive values stashed between passes), stores
// (streamed when large), and the reductions' pieces (accumulators across lanes, blocked sums,
// passes, tiles, partials and finals). The kernel kinds' bodies are in cpp/pointwise.hpp and
// cpp/reductions.hpp; write() picks one.
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/codegen/cpp/dialect.hpp"
#include "kiln/core/half.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/sched/schedule.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::detail {

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
  }  /// Innermost open scope where everything index `e` reads is defined: its loop variables and
  /// the variables of its value terms (gathered indices, defined where they were computed).
  int scope_of(const IndexExpr& e) const { return sched::scope_with_values(e, scope_for(e.dep_mask()), value_scope_); }

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
    if (!e.text.empty()) return "(" + e.text + ")";
    std::string s = sched::value_terms_text(e.values);
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
      int sc = 0;
      for (auto& e : idx) sc = std::max(sc, scope_of(e));
      return sc;
    };
    const sched::Location& stored = s_.location[static_cast<std::size_t>(id)];
    if (!ir::is_reduction(n.op) && stored.kind != sched::Location::None &&
        s_.owner[static_cast<std::size_t>(id)] != kid_) {
      // Computed once by an earlier kernel (the scheduler found it too costly to recompute).
      IndexExpr off = sched::strided_offset(idx, stored.strides, n.shape);
      return emit(scope_of(off), key, n.dtype,
                  load(pointer(stored.kind, stored.index, n.dtype, false), render(off), n.dtype));
    }
    switch (ir::op_kind(n.op)) {
      case ir::OpKind::Leaf: {
        if (n.op == Op::Input) {
          IndexExpr off = sched::strided_offset(idx, n.strides, n.shape);
          return emit(scope_of(off), key, n.dtype, load(leaf_pointer(n), render(off), n.dtype));
        }
        if (n.op == Op::Constant) return Val{constant_literal(n), 0};
        if (n.op == Op::Iota) {
          const IndexExpr& e = idx[static_cast<std::size_t>(n.attrs.ints.at(0))];
          return emit(scope_of(e), key, n.dtype, cast_from_i64(render(e), n.dtype));
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
        return emit(scope_of(off), key, n.dtype,
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
        int sc = scope_of(idx[axis]);
        for (std::size_t k = 0; k < n.inputs.size(); ++k) {
          i64 len = node(n.inputs[k]).shape[axis];
          off += len;
          if (len == 0) continue;
          parts.push_back(value(n.inputs[k], sched::input_index(g_, n, k, idx, k_.space)));
          ends.push_back(off);
          sc = std::max(sc, parts.back().scope);
        }
        if (parts.empty()) {
          // Every piece, and so the concat, is empty along the axis: no position reads it (its
          // loops run no iteration), but the code is still written (fuzz seed 600, graph 852).
          ir::GraphNode zero = n;
          zero.attrs.scalar = 0;
          zero.attrs.iscalar = 0;
          return Val{constant_literal(zero), 0};
        }
        std::string e = parts.back().expr;
        for (std::size_t k = parts.size() - 1; k-- > 0;)
          e = "(" + pos + " < " + std::to_string(ends[k]) + "LL ? " + parts[k].expr + " : " + e + ")";
        return emit(sc, key, n.dtype, e);
      }
      case ir::OpKind::Gather: {
        // The index is computed first (checked and clamped where it is), then the input is read
        // at it: one load of the gathered element, fused like any other read.
        const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
        Val at = value(n.inputs[1], idx);
        const std::string checked = c_family::gather_index_expr(g_, n, at.expr, needs_);
        Val g = emit(at.scope, "G" + key, DType::Int64, checked);
        value_scope_[g.expr] = g.scope;
        std::uint64_t deps = 0;
        for (auto& e : idx) deps |= e.dep_mask();
        Val v = value(n.inputs[0], sched::gather_index(idx, axis, sched::ix_value(g.expr, deps), node(n.inputs[0]).shape));
        scopes_[static_cast<std::size_t>(v.scope)].memo[key] = v;
        return v;
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

  std::string math(const char* fn, const std::string& a, DType t, const std::string& b = "") {
    needs_.math = true;
    return std::string("kiln_") + fn + (t == DType::Float64 ? "_f64(" : "_f32(") + a + (b.empty() ? "" : ", " + b) +
           ")";
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
    // where cpp/math.hpp has one, else the scalar builtin (__builtin_atan2f(a, b), ...).
    if (ir::has_flag(n.op, ir::kLibmName)) {
      if (!fl) unsupported(n, it);
      const std::string fn = ir::op_name(n.op);
      if (n.op == Op::Exp && it == DType::Float32 && nonpositive_shift(n.inputs[0])) return math("exp_nonpos", a, it);
      if (std::find(std::begin(kVectorMath), std::end(kVectorMath), n.op) != std::end(kVectorMath))
        return round16(math(fn.c_str(), a, it, in.size() > 1 ? b : std::string()), t);
      return round16(
          c_family::libm_call(c_family::kCppDialect, fn, dbl) + a + (in.size() > 1 ? ", " + b : std::string()) + ")",
          t);
    }
    // fmod of floats: cpp/math.hpp's exact, vectorisable reduction (double: libm's).
    if (n.op == Op::Fmod && fl) return round16(math("fmod", a, it, b), t);
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
      if (streaming_ && chunk_ > 0 && streamable(t, n, off)) {
        // Into the chunk's buffer, stored around the cache when the chunk is done.
        std::string buf = "kch" + std::to_string(stream_count_++);
        line_at(chunk_scope_, std::string("alignas(64) ") + stype(n.dtype) + " " + buf + "[" + std::to_string(chunk_) + "];");
        line(buf + "[" + var(k_.loops.red_groups.front()) + " - kc] = " + to_storage(v.expr, n.dtype) + ";");
        chunk_streams_.push_back(Stream{buf, "&" + p + "[" + render(row_start(off)) + " + kc]",
                                        chunk_ * static_cast<i64>(itemsize(n.dtype))});
        continue;
      }
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
        streams_.push_back(Stream{buf, "&" + p + "[" + render(row_start(off)) + "]",
                                  row_length() * static_cast<i64>(itemsize(n.dtype))});
        continue;
      }
      line(p + "[" + render(off) + "] = " + to_storage(v.expr, n.dtype) + ";");
    }
  }

  /// `off` at the start of the row (the reduced group's position 0).
  IndexExpr row_start(IndexExpr off) const {
    for (int d : k_.loops.groups[static_cast<std::size_t>(k_.loops.red_groups.front())])
      off.coeff[static_cast<std::size_t>(d)] = 0;
    return off;
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
  /// Elements per chunk for the last pass `pass` of a row kernel when it has a streamed store
  /// and all its streamed stores share an item size (64 bytes of them, dividing the row); else 0.
  i64 stream_chunk_elems(int pass) const {
    const auto& p = k_.loops;
    if (sym_ || analysis_ || p.column || p.red_groups.size() != 1 || pass != k_.passes) return 0;
    const Index id = sched::identity_index(k_.space);
    std::size_t item = 0;
    for (auto& st : k_.stores) {
      if (st.level != sched::Level::Full || st.pass != pass) continue;
      const ir::GraphNode& n = node(st.node);
      for (auto& t : st.targets) {
        if (!streamable(t, n, sched::strided_offset(id, t.strides, n.shape))) continue;
        if (item != 0 && item != itemsize(n.dtype)) return 0;
        item = itemsize(n.dtype);
      }
    }
    if (item == 0 || 64 % item != 0) return 0;
    const i64 c = 64 / static_cast<i64>(item);
    return row_length() % c == 0 ? c : 0;
  }
  void flush_chunk_streams() { flush(chunk_streams_, "kiln_stream_chunk"); }
  void flush_streams() { flush(streams_, "kiln_stream_row"); }

  // ---- kernel kinds (cpp/pointwise.hpp, cpp/reductions.hpp) ---------------------------------
  void pointwise();
  void reduce_tiles();
  void reduce_split();

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

  /// The position of the current element along the reduced dims (arg reductions), and of the
  /// current row among all rows (arg finals): sched's index algebra, rendered.
  std::string reduced_position() const { return render(sched::reduced_position(k_)); }
  std::string row_position() const { return render(sched::row_position(k_)); }

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

  const ir::Graph& g_;
  const sched::Schedule& s_;
  const sched::Kernel& k_;
  int kid_;
  Needs& needs_;
  bool sym_ = false;  // the space's leading dim is the schedule's symbolic size
  std::vector<Scope> scopes_;
  std::unordered_map<int, Binding> bound_;
  /// The scope each gathered index variable (a value term's text) is defined in.
  std::unordered_map<std::string, int> value_scope_;
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
  /// The last pass of a streamed row in chunks (chunk_ elements: 64 bytes): each chunk is
  /// computed into a small buffer that stays in registers and stored around the cache right
  /// away, where a whole row buffer would be written, read back and stored in a second loop.
  i64 chunk_ = 0;
  int chunk_scope_ = 0;
  std::vector<Stream> chunk_streams_;
  /// Writes out `streams` with `helper` (kiln_stream_row or kiln_stream_chunk) and clears them.
  void flush(std::vector<Stream>& streams, const char* helper) {
    for (auto& st : streams)
      line(std::string(helper) + "(" + st.dst + ", " + st.buf + ", " + std::to_string(st.bytes) + "LL);");
    if (!streams.empty()) needs_.stream = true;
    streams.clear();
  }
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

}  // namespace kiln::codegen::detail

KILN_COLD_CODE_END
