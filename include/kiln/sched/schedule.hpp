#pragma once
// The fusion scheduler: groups a captured graph into kernels and plans each kernel's loops.
//
// Every value that is cheap to recompute (leaves, pointwise ops, casts, index maps, iota,
// random) is computed inside the loops of whichever kernel needs it, at the index that kernel
// needs it at; nothing is materialised between them. Only reductions, the graph's outputs and
// costly pointwise values needed by several kernels (computed once, into memory) anchor
// kernels. The scheduler starts with one kernel per anchor and merges kernels while the
// result stays legal (every in-kernel reference to a reduction reads the row being computed,
// and the kernel graph stays acyclic), in this order of benefit:
//   1. a reduction into the reduction over the same rows that consumes it (softmax's max then
//      sum; layer_norm's mean then variance): one kernel, several passes over each row;
//   2. a reduction over the rows' results of another kernel into it, as a final cross-row
//      reduction (cross_entropy's mean over rows);
//   3. pointwise outputs that use a reduction's result into its kernel (the row kernel);
//   4. reductions over the same rows and axes, side by side (horizontal);
//   5. pointwise outputs of the reduction's shape that read its inputs (siblings) or that it
//      reads (a value stored because several kernels need it);
//   6. pointwise outputs of one shape, side by side (horizontal).
// See docs/fusion.md for the rules and why.
#include <algorithm>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/index.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::sched {

enum class KernelKind : std::uint8_t {
  Pointwise,  ///< one loop nest over the outputs' shape
  Reduce,     ///< rows of a reduction: passes over each row, then per-row and final work
};

/// Where in a reduction kernel a value is computed.
enum class Level : std::uint8_t {
  Full,   ///< at every element of the iteration space (a pass over the row)
  Row,    ///< once per row (after the row's reductions)
  Final,  ///< once per kernel (after the cross-row final reductions)
};

/// Memory that holds a node's value: a graph output (written with the graph's output
/// strides) or a temporary (contiguous) buffer.
struct Location {
  enum Kind : std::uint8_t { None, Output, Temp };
  Kind kind = None;
  int index = -1;   ///< output index or temp index
  Strides strides;  ///< element strides of the buffer
};

/// A value a kernel writes to memory.
struct Store {
  int node = -1;
  Level level = Level::Full;
  int pass = 1;                   ///< Full stores of Reduce kernels: the pass that writes it
  std::vector<Location> targets;  ///< every output (and temp) receiving the value
};

/// How a kernel's iteration space is walked.
struct LoopPlan {
  /// Coalesced dimensions, natural order; dims of size 1 dropped. A group is named by its
  /// last dimension's loop variable.
  std::vector<std::vector<int>> groups;
  /// Pointwise: group indices, outermost loop first (the unit-stride group innermost).
  std::vector<int> order;
  // Reduce kernels.
  bool column = false;           ///< the vectorised loop runs along a kept dimension
  std::vector<int> kept_groups;  ///< kept groups enumerated by the tile index (outer)
  int vec_group = -1;            ///< column: the kept group vectorised, in blocks
  std::vector<int> red_groups;   ///< reduced groups, outer to inner (row: innermost vectorised)
  i64 rows = 1;                  ///< product of the kept_groups extents
  i64 block = 1;                 ///< column: elements of vec_group per tile
  i64 blocks = 1;                ///< column: tiles along vec_group
  i64 chunks = 1;                ///< pieces of red_groups[0] combined in a fixed order afterwards
  i64 chunk_len = 0;             ///< elements of red_groups[0] per chunk
  bool parallel = false;         ///< enough work for an OpenMP team
  std::uint64_t opaque = 0;      ///< dims read by opaque (non-affine) index expressions

  i64 tiles() const { return rows * blocks; }
};

/// One generated kernel.
struct Kernel {
  KernelKind kind = KernelKind::Pointwise;
  Shape space;                  ///< iteration space (Reduce: the reductions' input shape)
  std::vector<char> reduced;    ///< Reduce: which dims of `space` are reduced
  std::vector<int> reductions;  ///< Reduce: reductions over the rows, by phase then node
  std::vector<int> phase;       ///< phase (1-based pass) of each of `reductions`
  int phases = 0;
  std::vector<int> finals;  ///< Reduce: reductions of per-row values over all rows
  std::vector<Store> stores;
  int passes = 1;          ///< Reduce: passes over each row (phases, plus one for late stores)
  std::vector<int> after;  ///< kernels whose results this one reads
  LoopPlan loops;

  /// The shape of one value per row (space with reduced dims set to 1).
  Shape row_shape() const {
    Shape s = space;
    for (std::size_t d = 0; d < s.size(); ++d)
      if (d < reduced.size() && reduced[d]) s[d] = 1;
    return s;
  }
  i64 num_rows() const { return row_shape().numel(); }
};

/// The flat position of the current element along kernel `k`'s reduced dims, row-major over
/// the reduced dims of extent > 1: the index an arg reduction records (both writers).
inline IndexExpr reduced_position(const Kernel& k) {
  IndexExpr f = ix_const(0);
  i64 mult = 1;
  for (std::size_t d = k.space.size(); d-- > 0;) {
    if (!k.reduced[d] || k.space[d] == 1) continue;
    f = ix_add(f, ix_scale(ix_var(static_cast<int>(d), static_cast<int>(k.space.size())), mult));
    mult *= k.space[d];
  }
  return f;
}

/// The flat position of the current row among all of `k`'s rows, row-major: the index an arg
/// reduction over all rows (a final) records.
inline IndexExpr row_position(const Kernel& k) {
  const Shape rs = k.row_shape();
  IndexExpr f = flat_index(identity_index(rs), rs);
  if (f.affine()) f.coeff.resize(k.space.size(), 0);
  return f;
}

/// A buffer between kernels.
struct Temp {
  int node = -1;
  DType dtype = DType::Float32;
  Shape shape;
};

/// The graph grouped into kernels, in launch order.
struct Schedule {
  std::vector<Kernel> kernels;
  std::vector<Temp> temps;
  std::vector<int> owner;          ///< per node: the kernel computing it (reductions, stored nodes), else -1
  std::vector<Location> location;  ///< per node: memory other kernels read it from, else None
  /// A symbolic leading size: dims of this (placeholder) size are read at launch (kiln::compile's
  /// dynamic shapes); 0 when every size is static. See symbolic_kernel().
  i64 symbolic = 0;
  /// Why the graph's outputs cannot be written over their leaves' memory (ir::Graph::overwrites)
  /// as asked; empty when they can (or none is asked). schedule() throws instead; the step
  /// planner asks overwrite_refusal() before it lets an output take a leaf's memory.
  std::string overwrite_refused;

  /// One line per kernel: kind, iteration space, what it computes and stores.
  std::string str(const ir::Graph& g) const;
};

/// Groups `g` into kernels (see the header comment for the rules).
inline Schedule schedule(const ir::Graph& g);

/// Schedules `g` whose dims of size `placeholder` stand for one symbolic size, read at launch
/// (kiln::compile's dynamic shapes). Decisions that depend on that size are made so that they
/// hold for every size: the kernels are marked parallel and the code generator decides at run
/// time whether a team pays; reductions are not split into chunks.
inline Schedule schedule(const ir::Graph& g, i64 placeholder);

/// Why `g`'s outputs cannot be written over the leaves ir::Graph::overwrites names (empty:
/// they can): the kernel writing such an output must be pointwise and read the leaf only at
/// the element it writes, no other value of it may read the leaf, and every other kernel
/// reading the leaf must be able to run before it.
inline std::string overwrite_refusal(const ir::Graph& g);

/// Whether kernel `k` of `s` can read its symbolic size at launch: pointwise kernels, and
/// reductions over rows (row strategy, no chunks, no final cross-row reduction), where the
/// symbolic size is the leading dim of the iteration space, and not a reduced one. `why` says
/// what fails. Kernels without the symbolic size always can.
inline bool symbolic_kernel(const Schedule& s, std::size_t k, std::string* why = nullptr);

/// The kernel grouping of `g` as text (what KILN_LOGS=schedule prints).
inline std::string explain_schedule(const ir::Graph& g);

/// Reductions' inputs are evaluated over a tile only when this many elements or more; below,
/// kernels run on one thread (an OpenMP region costs microseconds).
inline constexpr i64 kParallelThreshold = 32768;

// ---- walking a kernel's inline computation ----------------------------------------------

namespace detail {

/// Callbacks of `walk`: what an inline computation rooted at some node reads.
struct Visitor {
  std::function<void(int, const Index&)> leaf;       ///< an Input read at an index
  std::function<void(int, const Index&)> reduction;  ///< a boundary's value (reduction, stored node) read at an index
  std::function<bool(int)> boundary;                 ///< nodes not computed inline (default: reductions)
  std::function<void(int)> visit;                    ///< every node computed inline
  std::function<void(int, const Index&)> index_use;  ///< Iota / Random / Concat: the index itself is used
  std::function<void(int, const Index&)> gather;     ///< a Gather evaluated at an index
  std::uint64_t opaque = 0;                          ///< dims read by opaque index expressions
};

/// Visits the inline computation of `node` at `idx`: everything down to leaves and
/// reductions, each (node, index) once.
inline void walk(const ir::Graph& g, int node, const Index& idx, const Shape& space, Visitor& v,
                 std::unordered_set<std::string>& seen) {
  if (!seen.insert(std::to_string(node) + "|" + index_key(idx)).second) return;
  // Value terms (gathered indices) are variables, not functions of the loop variables: only
  // opaque text constrains how loops are laid out.
  for (auto& e : idx)
    if (!e.text.empty()) v.opaque |= e.deps;
  const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(node)];
  if (n.op == ir::Op::Input) {
    if (v.leaf) v.leaf(node, idx);
    return;
  }
  if (v.boundary ? v.boundary(node) : ir::is_reduction(n.op)) {
    if (v.reduction) v.reduction(node, idx);
    return;
  }
  if (v.visit) v.visit(node);
  if (n.op == ir::Op::Iota || n.op == ir::Op::Random || n.op == ir::Op::Concat)
    if (v.index_use) v.index_use(node, idx);
  if (v.gather && ir::is_gather(n.op)) v.gather(node, idx);
  for (std::size_t k = 0; k < n.inputs.size(); ++k)
    walk(g, n.inputs[k], input_index(g, n, k, idx, space), space, v, seen);
}

inline bool is_var(const IndexExpr& e, int d) {
  if (!e.affine() || e.constant != 0) return false;
  for (std::size_t k = 0; k < e.coeff.size(); ++k)
    if (e.coeff[k] != (static_cast<int>(k) == d ? 1 : 0)) return false;
  return e.coeff.size() > static_cast<std::size_t>(d);
}

/// True when `idx` (an index into a reduction's output, whose shape is the kernel's row shape)
/// names the row the kernel is at: every kept dimension read by its own loop variable.
inline bool reads_current_row(const Index& idx, const Shape& row_shape) {
  for (std::size_t d = 0; d < row_shape.size(); ++d) {
    if (row_shape[d] == 1) continue;
    if (!is_var(idx[d], static_cast<int>(d))) return false;
  }
  return true;
}

/// Index of a row-level value of `shape` (numel = number of rows) at the current row.
inline Index row_index(const Shape& shape, const Shape& row_shape, const Shape& space) {
  IndexExpr flat = flat_index(identity_index(row_shape), row_shape);
  if (flat.affine()) flat.coeff.resize(space.size(), 0);
  return unflatten(flat, shape, space);
}

inline Index zero_index(const Shape& shape) { return Index(shape.size(), ix_const(0)); }

/// Whether kernel `k` reads node `n`'s value from memory rather than computing it: reductions
/// always (their own kernel holds them in registers), stored values of other kernels.
inline bool reads_memory(const Schedule& s, int n, int k, const ir::Graph& g) {
  if (ir::is_reduction(g.nodes[static_cast<std::size_t>(n)].op)) return true;
  return s.location[static_cast<std::size_t>(n)].kind != Location::None && s.owner[static_cast<std::size_t>(n)] != k;
}

/// A kernel being formed.
struct Draft {
  bool reduce = false;
  Shape space;
  std::vector<char> reduced;
  std::vector<int> regular, finals, roots;
  bool alive = true;
  std::set<int> deps;           ///< drafts it reads results of
  std::set<int> leaves;         ///< Input nodes it reads
  std::vector<int> phase_of;    ///< parallel to regular
  std::vector<Level> level_of;  ///< parallel to roots
  std::vector<int> root_phase;  ///< parallel to roots: last phase of in-kernel reductions it uses
  std::set<int> external;       ///< reductions of other drafts it reads

  Shape row_shape() const {
    Shape s = space;
    for (std::size_t d = 0; d < s.size(); ++d)
      if (reduced[d]) s[d] = 1;
    return s;
  }
  int first_node() const {
    int m = 1 << 30;
    for (auto v : {&regular, &finals, &roots})
      for (int n : *v) m = std::min(m, n);
    return m;
  }
};

class Scheduler {
 public:
  explicit Scheduler(const ir::Graph& g, i64 symbolic = 0) : g_(g), symbolic_(symbolic) {}

  Schedule run() {
    const std::size_t count = g_.nodes.size();
    outputs_of_.assign(count, {});
    for (std::size_t k = 0; k < g_.outputs.size(); ++k)
      outputs_of_[static_cast<std::size_t>(g_.outputs[k])].push_back(static_cast<int>(k));
    forced_.assign(count, 0);
    // Second round only when the first inlined an expensive value into several kernels: then
    // that value is computed once, into memory, and the grouping is redone around it.
    for (int round = 0; round < 2; ++round) {
      group();
      if (round == 1 || !force_shared_expensive()) break;
    }
    return finish();
  }

 private:
  void group() {
    const std::size_t count = g_.nodes.size();
    owner_.assign(count, -1);
    drafts_.clear();
    summaries_.clear();  // walks stop at stored values, which changed
    // One draft per anchor, in node order.
    for (std::size_t i = 0; i < count; ++i) {
      const ir::GraphNode& n = g_.nodes[i];
      bool red = ir::is_reduction(n.op);
      if (!red && outputs_of_[i].empty() && !forced_[i]) continue;
      Draft d;
      if (red) {
        const ir::GraphNode& in = node(n.inputs[0]);
        d.reduce = true;
        d.space = in.shape;
        d.reduced.assign(in.shape.size(), 0);
        for (auto a : n.attrs.ints) d.reduced[static_cast<std::size_t>(a)] = 1;
        d.regular.push_back(static_cast<int>(i));
      } else {
        d.space = n.shape;
        d.roots.push_back(static_cast<int>(i));
      }
      owner_[i] = static_cast<int>(drafts_.size());
      drafts_.push_back(std::move(d));
    }
    for (std::size_t k = 0; k < drafts_.size(); ++k) {
      Analysis a = analyze(drafts_[k], static_cast<int>(k), [&](int n) { return owner_[static_cast<std::size_t>(n)]; });
      if (!a.ok) throw Error("kiln scheduler: a kernel of one anchor is not schedulable (internal error)\n" + g_.str());
      commit(static_cast<int>(k), drafts_[k], a);
    }
    merge_all();
  }

  /// Whether `n` is read from memory by kernels other than `self` (the draft owning it).
  template <class OwnerOf>
  bool is_boundary(int n, int self, OwnerOf&& owner_of) const {
    return ir::is_reduction(node(n).op) || (forced_[static_cast<std::size_t>(n)] && owner_of(n) != self);
  }

  /// Rough cost of recomputing `id` inline, down to leaves and boundaries.
  int cost(int id, std::vector<int>& memo) const {
    if (memo[static_cast<std::size_t>(id)] >= 0) return memo[static_cast<std::size_t>(id)];
    const ir::GraphNode& n = node(id);
    int c = inline_cost(n.op);
    if (!ir::is_reduction(n.op) && !forced_[static_cast<std::size_t>(id)])
      for (auto i : n.inputs) c = std::min(1 << 20, c + cost(i, memo));
    memo[static_cast<std::size_t>(id)] = c;
    return c;
  }

  /// Marks for materialisation the pointwise values that several kernels recompute and that
  /// are not cheap (a few arithmetic ops of leaves are cheaper to recompute than to store and
  /// load). Returns whether it marked any.
  bool force_shared_expensive() {
    const std::size_t count = g_.nodes.size();
    std::vector<std::set<int>> kernels_of(count);
    for (std::size_t k = 0; k < drafts_.size(); ++k) {
      const Draft& d = drafts_[k];
      if (!d.alive) continue;
      const int self = static_cast<int>(k);
      auto owner_of = [&](int n) { return owner_[static_cast<std::size_t>(n)]; };
      Visitor v;
      v.boundary = [&](int n) { return is_boundary(n, self, owner_of); };
      v.visit = [&](int n) { kernels_of[static_cast<std::size_t>(n)].insert(self); };
      std::unordered_set<std::string> seen;
      const Shape rows = d.reduce ? d.row_shape() : d.space;
      for (int r : d.regular) walk(g_, node(r).inputs[0], identity_index(d.space), d.space, v, seen);
      for (int f : d.finals) walk(g_, node(f).inputs[0], identity_index(rows), d.space, v, seen);
      for (std::size_t j = 0; j < d.roots.size(); ++j) {
        const Shape& sh = node(d.roots[j]).shape;
        Index idx = !d.reduce || d.level_of[j] == Level::Full ? identity_index(d.space)
                    : d.level_of[j] == Level::Row             ? row_index(sh, rows, d.space)
                                                              : zero_index(sh);
        walk(g_, d.roots[j], idx, d.space, v, seen);
      }
    }
    std::vector<int> memo(count, -1);
    std::vector<char> covered(count, 0);
    bool any = false;
    // Highest first, so that a marked value covers the values it is computed from.
    for (std::size_t i = count; i-- > 0;) {
      const ir::GraphNode& n = node(static_cast<int>(i));
      if (covered[i] || kernels_of[i].size() < 2 || !ir::is_pointwise(n.op) || forced_[i] ||
          cost(static_cast<int>(i), memo) < kCheapCost)
        continue;
      forced_[i] = 1;
      any = true;
      std::vector<int> stack(n.inputs.begin(), n.inputs.end());
      while (!stack.empty()) {
        int x = stack.back();
        stack.pop_back();
        if (covered[static_cast<std::size_t>(x)] || ir::is_reduction(node(x).op)) continue;
        covered[static_cast<std::size_t>(x)] = 1;
        for (auto y : node(x).inputs) stack.push_back(y);
      }
    }
    return any;
  }

  /// Values cheaper than this are recomputed by every kernel that needs them.
  static constexpr int kCheapCost = 10;

  /// The weight of computing `op` once, from its cost class; leaves (random numbers too) and
  /// index maps are free here: they are recomputed wherever they are needed.
  static int inline_cost(ir::Op op) {
    if (ir::op_kind(op) == ir::OpKind::Leaf) return 0;
    switch (ir::op_info(op).cost) {
      case ir::CostClass::Transcendental:
        return 20;
      case ir::CostClass::Divide:
        return 4;
      case ir::CostClass::Cheap:
        return 1;
      case ir::CostClass::Free:
        return 0;
    }
    return 1;
  }

  struct Analysis {
    bool ok = true;
    std::set<int> deps, leaves, external;
    std::vector<int> phase_of;
    std::vector<Level> level_of;
    std::vector<int> root_phase;
  };

  const ir::GraphNode& node(int i) const { return g_.nodes[static_cast<std::size_t>(i)]; }

  static bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

  /// Checks that `d` (draft `self`, with `owner_of` giving the draft of every anchor) is one
  /// legal kernel, and derives its dependencies, phases and levels.
  template <class OwnerOf>
  Analysis analyze(const Draft& d, int self, OwnerOf&& owner_of) const {
    Analysis a;
    const Shape& space = d.space;
    const Shape rows_shape = d.reduce ? d.row_shape() : d.space;
    const i64 rows = rows_shape.numel();
    std::vector<int> phase(g_.nodes.size(), 0);  // in-kernel regular reduction -> phase
    std::vector<int> regular = d.regular;
    std::sort(regular.begin(), regular.end());

    // Records a reference to reduction q; `ctx`: 0 regular input, 1 final input, 2 root of a level.
    auto on_red = [&](int q, const Index& idx, int ctx, Level level, int* need_phase) {
      int o = owner_of(q);
      if (o != self || !ir::is_reduction(node(q).op)) {
        a.deps.insert(o);
        a.external.insert(q);
        return;
      }
      if (contains(d.finals, q)) {
        if (!(ctx == 2 && level == Level::Final)) a.ok = false;
        return;
      }
      // Work done once per kernel runs after the loop over rows has ended, where no row's
      // reduction is in scope any more (even when there is one row only).
      if (ctx == 2 && level == Level::Final) {
        a.ok = false;
        return;
      }
      // An in-kernel reduction over the rows: only its current row is available.
      if (!reads_current_row(idx, rows_shape)) {
        a.ok = false;
        return;
      }
      if (need_phase) *need_phase = std::max(*need_phase, phase[static_cast<std::size_t>(q)]);
    };

    // The references of one item (cached walks), following values this kernel stores itself
    // (computed inline here) into their own references.
    std::unordered_set<std::string> expanded;
    std::function<void(const Summary&, int, Level, int*)> process = [&](const Summary& sm, int ctx, Level level,
                                                                        int* need_phase) {
      for (int l : sm.leaves) a.leaves.insert(l);
      for (auto& [q, qi] : sm.refs) {
        if (!ir::is_reduction(node(q).op) && owner_of(q) == self) {
          if (expanded.insert(std::to_string(q) + "|" + index_key(qi)).second)
            process(summary(q, qi, space, true), ctx, level, need_phase);
          continue;
        }
        on_red(q, qi, ctx, level, need_phase);
      }
    };
    // `own`: the item is a value this kernel computes and stores (a root), not a read of it.
    auto visit = [&](int root, const Index& idx, int ctx, Level level, int* need_phase, bool own = false) {
      expanded.clear();
      process(summary(root, idx, space, own), ctx, level, need_phase);
    };

    for (int r : regular) {
      const ir::GraphNode& n = node(r);
      const ir::GraphNode& in = node(n.inputs[0]);
      if (in.shape != space) return fail(a);
      for (std::size_t k = 0; k < space.size(); ++k) {
        bool red = std::find(n.attrs.ints.begin(), n.attrs.ints.end(), static_cast<i64>(k)) != n.attrs.ints.end();
        // Reduced dims of size 1 do not matter; the others must agree.
        if (space[k] != 1 && red != static_cast<bool>(d.reduced[k])) return fail(a);
      }
      int need = 0;
      visit(n.inputs[0], identity_index(space), 0, Level::Full, &need);
      phase[static_cast<std::size_t>(r)] = need + 1;
      if (!a.ok) return a;
    }
    for (int r : d.regular) a.phase_of.push_back(phase[static_cast<std::size_t>(r)]);

    for (int f : d.finals) {
      const ir::GraphNode& n = node(f);
      const ir::GraphNode& in = node(n.inputs[0]);
      if (in.shape != rows_shape || n.shape.numel() != 1) return fail(a);
      int need = 0;
      visit(n.inputs[0], identity_index(rows_shape), 1, Level::Row, &need);
      if (!a.ok) return a;
    }

    for (int r : d.roots) {
      const ir::GraphNode& n = node(r);
      Level level;
      Index idx;
      if (!d.reduce) {
        if (n.shape != space) return fail(a);
        level = Level::Full;
        idx = identity_index(space);
      } else if (n.shape == space) {
        level = Level::Full;
        idx = identity_index(space);
      } else if (n.shape.numel() == rows && !uses_finals(d, r, owner_of, self)) {
        level = Level::Row;
        idx = row_index(n.shape, rows_shape, space);
      } else if (n.shape.numel() == 1) {
        level = Level::Final;
        idx = zero_index(n.shape);
      } else {
        return fail(a);
      }
      int need = 0;
      visit(r, idx, 2, level, &need, true);
      if (!a.ok) return a;
      a.level_of.push_back(level);
      a.root_phase.push_back(need);
    }
    a.deps.erase(self);
    return a;
  }

  template <class OwnerOf>
  bool uses_finals(const Draft& d, int root, OwnerOf&& owner_of, int self) const {
    if (d.finals.empty()) return false;
    std::unordered_set<std::string> expanded;
    std::function<bool(const Summary&)> scan = [&](const Summary& sm) {
      for (auto& [q, qi] : sm.refs) {
        if (owner_of(q) != self) continue;
        if (contains(d.finals, q)) return true;
        if (!ir::is_reduction(node(q).op) && expanded.insert(std::to_string(q) + "|" + index_key(qi)).second &&
            scan(summary(q, qi, d.space, true)))
          return true;
      }
      return false;
    };
    return scan(summary(root, zero_index(node(root).shape), d.space, true));
  }

  /// What the inline computation of `root` at `idx` reads: its boundaries (reductions and
  /// stored values, with the index each is read at) and its leaves. With `own`, a stored value
  /// at the root is computed (its own kernel) rather than read. Cached: merge checks ask for
  /// the same walks again and again.
  struct Summary {
    std::vector<std::pair<int, Index>> refs;
    std::vector<int> leaves;
  };
  const Summary& summary(int root, const Index& idx, const Shape& space, bool own) const {
    std::string key = std::to_string(root) + (own ? "|o" : "|r") + index_key(idx) + "|" + space.str();
    auto it = summaries_.find(key);
    if (it != summaries_.end()) return it->second;
    Summary sm;
    Visitor v;
    v.boundary = [&](int n) { return ir::is_reduction(node(n).op) || forced_[static_cast<std::size_t>(n)]; };
    v.leaf = [&](int n, const Index&) { sm.leaves.push_back(n); };
    v.reduction = [&](int q, const Index& qi) { sm.refs.push_back({q, qi}); };
    std::unordered_set<std::string> seen;
    const ir::GraphNode& rn = node(root);
    if (own && forced_[static_cast<std::size_t>(root)] && !ir::is_reduction(rn.op)) {
      // A stored value's own computation: walk from its inputs (pointwise: same index).
      for (auto in : rn.inputs) walk(g_, in, idx, space, v, seen);
    } else {
      walk(g_, root, idx, space, v, seen);
    }
    std::sort(sm.leaves.begin(), sm.leaves.end());
    sm.leaves.erase(std::unique(sm.leaves.begin(), sm.leaves.end()), sm.leaves.end());
    return summaries_.emplace(std::move(key), std::move(sm)).first->second;
  }

  static Analysis fail(Analysis& a) {
    a.ok = false;
    return a;
  }

  void commit(int id, Draft d, const Analysis& a) {
    d.deps = a.deps;
    d.leaves = a.leaves;
    d.external = a.external;
    d.phase_of = a.phase_of;
    d.level_of = a.level_of;
    d.root_phase = a.root_phase;
    drafts_[static_cast<std::size_t>(id)] = std::move(d);
  }

  /// Whether some draft in `from` reaches `a` or `b` through the dependency graph.
  bool reaches(const std::set<int>& from, int a, int b) const {
    std::vector<char> seen(drafts_.size(), 0);
    std::vector<int> stack(from.begin(), from.end());
    while (!stack.empty()) {
      int x = stack.back();
      stack.pop_back();
      if (x == a || x == b) return true;
      if (seen[static_cast<std::size_t>(x)]) continue;
      seen[static_cast<std::size_t>(x)] = 1;
      for (int y : drafts_[static_cast<std::size_t>(x)].deps) stack.push_back(y);
    }
    return false;
  }

  enum class Merge { Union, AsFinal };

  /// Merges draft b into draft a if the result is one legal kernel; returns whether it did.
  bool try_merge(int a, int b, Merge how) {
    const Draft& da = drafts_[static_cast<std::size_t>(a)];
    const Draft& db = drafts_[static_cast<std::size_t>(b)];
    Draft m = da;
    if (how == Merge::AsFinal) {
      if (!db.finals.empty()) return false;
      for (int r : db.regular) m.finals.push_back(r);
    } else {
      for (int r : db.regular) m.regular.push_back(r);
      for (int r : db.finals) m.finals.push_back(r);
    }
    for (int r : db.roots) m.roots.push_back(r);
    std::sort(m.regular.begin(), m.regular.end());
    std::sort(m.finals.begin(), m.finals.end());
    std::sort(m.roots.begin(), m.roots.end());
    auto owner_of = [&](int n) {
      int o = owner_[static_cast<std::size_t>(n)];
      return o == b ? a : o;
    };
    Analysis an = analyze(m, a, owner_of);
    if (!an.ok) return false;
    // The merged kernel must not wait for a kernel that waits for it.
    std::set<int> outside = an.deps;
    outside.erase(a);
    outside.erase(b);
    for (int x : outside)
      if (reaches(drafts_[static_cast<std::size_t>(x)].deps, a, b)) return false;
    for (auto v : {&db.regular, &db.finals, &db.roots})
      for (int n : *v) owner_[static_cast<std::size_t>(n)] = a;
    commit(a, std::move(m), an);
    drafts_[static_cast<std::size_t>(b)].alive = false;
    drafts_[static_cast<std::size_t>(b)].deps.clear();
    for (auto& x : drafts_) {
      if (!x.alive) continue;
      if (x.deps.erase(b)) x.deps.insert(a);
      x.deps.erase(static_cast<int>(&x - drafts_.data()));
    }
    return true;
  }

  static bool same_rows(const Draft& a, const Draft& b) {
    if (a.space != b.space) return false;
    for (std::size_t d = 0; d < a.space.size(); ++d)
      if (a.space[d] != 1 && a.reduced[d] != b.reduced[d]) return false;
    return true;
  }

  /// A draft whose reductions each fold every non-trivial dim into one value.
  bool is_full_single_phase(const Draft& d) const {
    if (!d.reduce || !d.finals.empty()) return false;
    for (std::size_t k = 0; k < d.regular.size(); ++k)
      if (node(d.regular[k]).shape.numel() != 1 || d.phase_of[k] != 1) return false;
    return true;
  }

  static bool shares_leaf(const Draft& a, const Draft& b) {
    for (int l : b.leaves)
      if (a.leaves.count(l)) return true;
    return false;
  }

  /// Applies one rule over all pairs in one sweep; returns whether something merged (the
  /// caller then starts again from the first rule).
  template <class Pred>
  bool apply(Pred&& pred, Merge how) {
    bool merged = false;
    for (std::size_t b = 0; b < drafts_.size(); ++b) {
      for (std::size_t a = 0; a < drafts_.size() && drafts_[b].alive; ++a) {
        if (a == b || !drafts_[a].alive) continue;
        if (!pred(drafts_[a], drafts_[b], static_cast<int>(a), static_cast<int>(b))) continue;
        if (try_merge(static_cast<int>(a), static_cast<int>(b), how)) merged = true;
      }
    }
    return merged;
  }

  void merge_all() {
    for (;;) {
      // 1. A reduction over the same rows that consumes another's result.
      if (apply([&](const Draft& a, const Draft& b, int ia,
                    int) { return a.reduce && b.reduce && same_rows(a, b) && b.deps.count(ia); },
                Merge::Union))
        continue;
      // 2. A full reduction of per-row values: a final reduction of the row kernel.
      if (apply(
              [&](const Draft& a, const Draft& b, int, int) {
                return a.reduce && b.reduce && b.space == a.row_shape() && a.space != a.row_shape() &&
                       b.roots.empty() && is_full_single_phase(b);
              },
              Merge::AsFinal))
        continue;
      // 3. Pointwise work that uses a reduction's result.
      if (apply([&](const Draft& a, const Draft& b, int ia, int) { return a.reduce && !b.reduce && b.deps.count(ia); },
                Merge::Union))
        continue;
      // 4. Reductions over the same rows, side by side.
      if (apply([&](const Draft& a, const Draft& b, int, int) { return a.reduce && b.reduce && same_rows(a, b); },
                Merge::Union))
        continue;
      // 5. Pointwise values shaped like the rows that read the same inputs, or that the
      //    reduction reads (a value stored for several kernels is computed by one of them).
      if (apply(
              [&](const Draft& a, const Draft& b, int, int ib) {
                return a.reduce && !b.reduce && b.space == a.space && (shares_leaf(a, b) || a.deps.count(ib));
              },
              Merge::Union))
        continue;
      // 6. Pointwise outputs of one shape.
      if (apply([&](const Draft& a, const Draft& b, int, int) { return !a.reduce && !b.reduce && a.space == b.space; },
                Merge::Union))
        continue;
      break;
    }
  }

  Schedule finish();
  void plan_loops(Schedule& s, int k) const;

  const ir::Graph& g_;
  i64 symbolic_ = 0;  // placeholder of the symbolic leading size (0: none)
  std::vector<Draft> drafts_;
  /// Checks the outputs written over leaves' memory (ir::Graph::overwrites) and fills `waits`:
  /// the kernels each writing kernel must follow. Returns why it cannot be done ("" when it
  /// can; `waits` is then left empty). Conservative: the walk of the writing kernel goes
  /// through every value that is not a reduction, so it sees at least the reads it makes.
  std::string order_overwrites(std::vector<std::set<int>>& waits) const {
    std::vector<std::set<int>> want(drafts_.size());
    for (auto [out, leaf] : g_.overwrites) {
      const std::string what = "output " + std::to_string(out) + " over leaf #" + std::to_string(leaf) + ": ";
      if (out < 0 || static_cast<std::size_t>(out) >= g_.outputs.size()) return what + "no such output";
      const int node = g_.outputs[static_cast<std::size_t>(out)];
      const ir::GraphNode& n = g_.nodes[static_cast<std::size_t>(node)];
      const std::vector<int> leaf_nodes = g_.inputs_of(leaf);
      auto is_leaf_node = [&](int l) { return std::find(leaf_nodes.begin(), leaf_nodes.end(), l) != leaf_nodes.end(); };
      if (leaf_nodes.empty()) return what + "the graph does not read the leaf";
      for (int l : leaf_nodes)
        if (itemsize(g_.nodes[static_cast<std::size_t>(l)].dtype) != itemsize(n.dtype))
          return what + "the leaf's elements are another size";
      const int w = owner_[static_cast<std::size_t>(node)];
      if (w < 0 || !drafts_[static_cast<std::size_t>(w)].alive) return what + "no kernel writes it";
      const Draft& d = drafts_[static_cast<std::size_t>(w)];
      if (d.reduce) return what + "it is written by a reduction's kernel";
      if (d.space != n.shape) return what + "it is not its kernel's iteration space";
      const Index at = identity_index(d.space);
      const IndexExpr written = strided_offset(at, g_.output_strides[static_cast<std::size_t>(out)], n.shape);
      if (!written.affine()) return what + "it is written at a computed position";
      // Every value of the writing kernel: only this output's reads the leaf, each read at
      // the element written.
      std::string refused;
      for (std::size_t j = 0; j < d.roots.size() && refused.empty(); ++j) {
        const int r = d.roots[j];
        if (d.level_of[j] != Level::Full) {
          refused = "its kernel stores a value per row";
          break;
        }
        Visitor v;
        v.leaf = [&](int l, const Index& idx) {
          if (!is_leaf_node(l) || !refused.empty()) return;
          if (r != node) {
            refused = "another value of its kernel reads the leaf";
            return;
          }
          const ir::GraphNode& ln = g_.nodes[static_cast<std::size_t>(l)];
          const IndexExpr read = strided_offset(idx, ln.strides, ln.shape);
          if (!read.affine() || !(read == written))
            refused = "it reads the leaf at an element other than the one it writes";
        };
        std::unordered_set<std::string> seen;
        walk(g_, r, at, d.space, v, seen);
      }
      if (!refused.empty()) return what + refused;
      // Every other kernel reading the leaf runs first, so none may wait for this one.
      for (std::size_t k = 0; k < drafts_.size(); ++k) {
        if (static_cast<int>(k) == w || !drafts_[k].alive) continue;
        bool reads = false;
        for (int l : leaf_nodes) reads = reads || drafts_[k].leaves.count(l);
        if (!reads) continue;
        if (reaches(drafts_[k].deps, w, w)) return what + "a kernel reading the leaf needs the one writing it";
        want[static_cast<std::size_t>(w)].insert(static_cast<int>(k));
      }
    }
    // Two such outputs must not order each other's kernels both ways.
    for (std::size_t a = 0; a < want.size(); ++a)
      for (int b : want[a])
        if (want[static_cast<std::size_t>(b)].count(static_cast<int>(a)))
          return "two outputs written over leaves each need the other's kernel first";
    waits = std::move(want);
    return "";
  }

  std::vector<int> owner_;
  std::vector<char> forced_;  ///< pointwise values computed once, into memory
  mutable std::unordered_map<std::string, Summary> summaries_;
  std::vector<std::vector<int>> outputs_of_;
};

inline Schedule Scheduler::finish() {
  Schedule s;
  const std::size_t count = g_.nodes.size();
  // Launch order: dependencies first, else by the earliest node each kernel computes.
  std::vector<int> alive;
  for (std::size_t k = 0; k < drafts_.size(); ++k)
    if (drafts_[k].alive) alive.push_back(static_cast<int>(k));
  std::sort(alive.begin(), alive.end(), [&](int x, int y) {
    return drafts_[static_cast<std::size_t>(x)].first_node() < drafts_[static_cast<std::size_t>(y)].first_node();
  });
  std::vector<int> order, index_of(drafts_.size(), -1);
  std::vector<char> placed(drafts_.size(), 0);
  // An output written over a leaf's memory waits for every other kernel reading the leaf.
  std::vector<std::set<int>> waits(drafts_.size());
  s.overwrite_refused = order_overwrites(waits);
  while (order.size() < alive.size()) {
    bool progress = false;
    for (int k : alive) {
      if (placed[static_cast<std::size_t>(k)]) continue;
      bool ready = true;
      for (int dep : drafts_[static_cast<std::size_t>(k)].deps) ready = ready && placed[static_cast<std::size_t>(dep)];
      for (int dep : waits[static_cast<std::size_t>(k)]) ready = ready && placed[static_cast<std::size_t>(dep)];
      if (!ready) continue;
      placed[static_cast<std::size_t>(k)] = 1;
      index_of[static_cast<std::size_t>(k)] = static_cast<int>(order.size());
      order.push_back(k);
      progress = true;
      break;
    }
    if (!progress) throw Error("kiln scheduler: kernels depend on each other in a cycle (internal error)\n" + g_.str());
  }

  s.owner.assign(count, -1);
  for (std::size_t i = 0; i < count; ++i)
    if (owner_[i] >= 0) s.owner[i] = index_of[static_cast<std::size_t>(owner_[i])];

  // Reductions read by another kernel live in memory: the output buffer when they are an
  // output, else a temporary.
  std::vector<char> needed(count, 0);
  for (int k : order)
    for (int q : drafts_[static_cast<std::size_t>(k)].external) needed[static_cast<std::size_t>(q)] = 1;
  s.location.assign(count, Location{});
  for (std::size_t i = 0; i < count; ++i) {
    if (!needed[i]) continue;
    if (!outputs_of_[i].empty()) {
      int o = outputs_of_[i][0];
      s.location[i] = Location{Location::Output, o, g_.output_strides[static_cast<std::size_t>(o)]};
    } else {
      s.location[i] = Location{Location::Temp, static_cast<int>(s.temps.size()), contiguous_strides(g_.nodes[i].shape)};
      s.temps.push_back(Temp{static_cast<int>(i), g_.nodes[i].dtype, g_.nodes[i].shape});
    }
  }
  auto targets_of = [&](int n) {
    std::vector<Location> t;
    for (int o : outputs_of_[static_cast<std::size_t>(n)])
      t.push_back(Location{Location::Output, o, g_.output_strides[static_cast<std::size_t>(o)]});
    if (s.location[static_cast<std::size_t>(n)].kind == Location::Temp)
      t.push_back(s.location[static_cast<std::size_t>(n)]);
    return t;
  };

  for (int id : order) {
    const Draft& d = drafts_[static_cast<std::size_t>(id)];
    Kernel k;
    k.kind = d.reduce ? KernelKind::Reduce : KernelKind::Pointwise;
    k.space = d.space;
    k.reduced = d.reduce ? d.reduced : std::vector<char>(d.space.size(), 0);
    // Regular reductions by phase, then node.
    std::vector<std::pair<int, int>> by_phase;
    for (std::size_t j = 0; j < d.regular.size(); ++j) by_phase.push_back({d.phase_of[j], d.regular[j]});
    std::sort(by_phase.begin(), by_phase.end());
    for (auto& [p, r] : by_phase) {
      k.reductions.push_back(r);
      k.phase.push_back(p);
      k.phases = std::max(k.phases, p);
    }
    k.finals = d.finals;
    for (int r : k.reductions) {
      auto t = targets_of(r);
      if (!t.empty()) k.stores.push_back(Store{r, Level::Row, 0, std::move(t)});
    }
    for (int r : k.finals) {
      auto t = targets_of(r);
      if (!t.empty()) k.stores.push_back(Store{r, Level::Final, 0, std::move(t)});
    }
    k.passes = std::max(1, k.phases);
    for (std::size_t j = 0; j < d.roots.size(); ++j) {
      Store st{d.roots[j], d.level_of[j], 1, targets_of(d.roots[j])};
      if (st.targets.empty()) continue;  // a stored value all of whose readers ended up in this kernel
      if (st.level == Level::Full && k.kind == KernelKind::Reduce) {
        // Written in the pass after the last reduction it uses, possibly an extra one.
        st.pass = d.root_phase[j] + 1;
        k.passes = std::max(k.passes, st.pass);
      }
      k.stores.push_back(std::move(st));
    }
    for (int dep : d.deps) k.after.push_back(index_of[static_cast<std::size_t>(dep)]);
    std::sort(k.after.begin(), k.after.end());
    s.kernels.push_back(std::move(k));
  }
  for (std::size_t k = 0; k < s.kernels.size(); ++k) plan_loops(s, static_cast<int>(k));
  return s;
}

// ---- loop planning ------------------------------------------------------------------------

/// Index of a value computed at `level` in kernel `k`.
inline Index level_index(const Kernel& k, Level level, const Shape& shape) {
  switch (level) {
    case Level::Full:
      return identity_index(k.space);
    case Level::Row:
      return row_index(shape, k.row_shape(), k.space);
    case Level::Final:
      return zero_index(shape);
  }
  return {};
}

inline void Scheduler::plan_loops(Schedule& s, int kid) const {
  Kernel& k = s.kernels[static_cast<std::size_t>(kid)];
  LoopPlan& p = k.loops;
  const Shape& space = k.space;
  const int rank = static_cast<int>(space.size());
  if (rank > kMaxRank) throw Error("kiln scheduler: more than 64 dimensions");
  const double full = static_cast<double>(space.numel());
  const double rows = static_cast<double>(k.num_rows());

  // Every affine function the kernel evaluates (addresses, iota values, random counters),
  // weighted by the bytes it moves: they decide which dims merge and which one is innermost.
  // An address moves at most the distinct elements it reaches (a broadcast read, e.g. a
  // per-row target beside [rows, classes] logits, is read once per row, not once per element:
  // weighted per element, its 8-byte index outweighed the 4-byte logits and turned a row
  // reduction into a column one).
  struct Fn {
    IndexExpr e;
    double weight;
  };
  std::vector<Fn> fns;
  std::uint64_t opaque = 0;
  auto add = [&](const IndexExpr& e, double w) {
    if (!e.text.empty())
      opaque |= e.deps;
    else
      fns.push_back({affine_part(e), w});  // a gathered row x[ids[i], j] still walks j with unit stride
  };
  auto reach = [&](const IndexExpr& off, double evaluations) {
    double distinct = 1;
    const std::uint64_t m = off.dep_mask();
    for (int d = 0; d < rank; ++d)
      if ((m >> d) & 1) distinct *= static_cast<double>(space[static_cast<std::size_t>(d)]);
    return std::min(distinct, evaluations);
  };
  auto visit = [&](int root, const Index& idx, double weight) {
    Visitor v;
    v.boundary = [&](int n) { return reads_memory(s, n, kid, g_); };
    v.leaf = [&](int n, const Index& i) {
      const ir::GraphNode& nn = node(n);
      IndexExpr off = strided_offset(i, nn.strides, nn.shape);
      add(off, reach(off, weight) * static_cast<double>(itemsize(nn.dtype)));
    };
    v.reduction = [&](int q, const Index& i) {
      if (s.owner[static_cast<std::size_t>(q)] == kid) return;
      const ir::GraphNode& nn = node(q);
      IndexExpr off = strided_offset(i, s.location[static_cast<std::size_t>(q)].strides, nn.shape);
      add(off, reach(off, weight) * static_cast<double>(itemsize(nn.dtype)));
    };
    v.index_use = [&](int n, const Index& i) {
      const ir::GraphNode& nn = node(n);
      if (nn.op == ir::Op::Random)
        add(flat_index(i, nn.shape), 0);
      else
        add(i[static_cast<std::size_t>(nn.attrs.ints.at(0))], 0);
    };
    std::unordered_set<std::string> seen;
    walk(g_, root, idx, space, v, seen);
    opaque |= v.opaque;
  };
  for (int r : k.reductions) visit(node(r).inputs[0], identity_index(space), full);
  for (int f : k.finals) visit(node(f).inputs[0], identity_index(k.row_shape()), rows);
  for (auto& st : k.stores) {
    const ir::GraphNode& nn = node(st.node);
    Index idx = level_index(k, st.level, nn.shape);
    double w = st.level == Level::Full ? full : st.level == Level::Row ? rows : 1.0;
    if (!ir::is_reduction(nn.op)) visit(st.node, idx, w);
    for (auto& t : st.targets)
      add(strided_offset(idx, t.strides, nn.shape), w * static_cast<double>(itemsize(nn.dtype)));
  }

  p.opaque = opaque;
  // Coalesce neighbouring dims (of one kind) wherever every function sees them as one.
  p.groups.clear();
  for (int d = 0; d < rank; ++d) {
    if (space[static_cast<std::size_t>(d)] == 1) continue;
    if (!p.groups.empty()) {
      int prev = p.groups.back().back();
      bool ok = k.reduced[static_cast<std::size_t>(prev)] == k.reduced[static_cast<std::size_t>(d)] &&
                !((opaque >> prev) & 1) && !((opaque >> d) & 1);
      for (auto& f : fns)
        ok = ok && f.e.at(static_cast<std::size_t>(prev)) ==
                       f.e.at(static_cast<std::size_t>(d)) * space[static_cast<std::size_t>(d)];
      if (ok) {
        p.groups.back().push_back(d);
        continue;
      }
    }
    p.groups.push_back({d});
  }
  auto extent = [&](int gi) {
    i64 e = 1;
    for (int d : p.groups[static_cast<std::size_t>(gi)]) e *= space[static_cast<std::size_t>(d)];
    return e;
  };
  // The innermost loop: the group along which most bytes move with unit stride.
  const int ngroups = static_cast<int>(p.groups.size());
  int best = ngroups - 1;
  double best_score = -1;
  for (int gi = 0; gi < ngroups; ++gi) {
    int last = p.groups[static_cast<std::size_t>(gi)].back();
    double score = 0;
    for (auto& f : fns) {
      i64 c = f.e.at(static_cast<std::size_t>(last));
      if (c == 1 || c == -1) score += f.weight;
    }
    if (score > best_score || (score == best_score && gi == ngroups - 1)) {
      best = gi;
      best_score = score;
    }
  }
  const i64 numel = space.numel();
  const bool symbolic = symbolic_ != 0 && std::find(space.begin(), space.end(), symbolic_) != space.end();
  // A symbolic size: the generated code decides at launch (an `if` on its team).
  p.parallel = numel >= kParallelThreshold || symbolic;
  if (k.kind == KernelKind::Pointwise) {
    for (int gi = 0; gi < ngroups; ++gi)
      if (gi != best) p.order.push_back(gi);
    if (ngroups > 0) p.order.push_back(best);
    return;
  }
  bool best_reduced =
      ngroups > 0 && k.reduced[static_cast<std::size_t>(p.groups[static_cast<std::size_t>(best)].back())];
  bool any_reduced = false;
  for (int gi = 0; gi < ngroups; ++gi)
    any_reduced = any_reduced || k.reduced[static_cast<std::size_t>(p.groups[static_cast<std::size_t>(gi)].back())];
  p.column = ngroups > 0 && !best_reduced && any_reduced;
  for (int gi = 0; gi < ngroups; ++gi) {
    bool red = k.reduced[static_cast<std::size_t>(p.groups[static_cast<std::size_t>(gi)].back())];
    if (red) {
      if (!(!p.column && gi == best)) p.red_groups.push_back(gi);
    } else if (!(p.column && gi == best)) {
      p.kept_groups.push_back(gi);
    }
  }
  if (!p.column && best_reduced) p.red_groups.push_back(best);
  if (p.column) p.vec_group = best;
  p.rows = 1;
  for (int gi : p.kept_groups) p.rows *= extent(gi);
  if (p.column) {
    // Long blocks: each row of the block is one contiguous run that the prefetchers stream
    // (short runs at a large stride cost DRAM efficiency); the accumulators (double) stay in
    // L1/L2. Parallelism then comes from the rows (or from chunks of the reduced dim, below).
    const i64 ki = extent(p.vec_group);
    p.block = std::max<i64>(1, std::min<i64>(ki, 4096));
    p.blocks = ki == 0 ? 0 : (ki + p.block - 1) / p.block;
  }
  // Few tiles: split the outer reduced loop into chunks whose partial results are combined in
  // a fixed order afterwards (deterministic for any thread count).
  p.chunks = 1;
  if (!p.red_groups.empty()) {
    const i64 e0 = extent(p.red_groups.front());
    p.chunk_len = e0;
    const i64 tiles = p.tiles();
    if (p.parallel && !symbolic && tiles > 0 && tiles < 8 && e0 > 1) {
      i64 want = (16 + tiles - 1) / tiles;
      // Each chunk initialises, writes and later combines one partial per lane of its block:
      // it must carry enough elements to pay for that.
      i64 by_work = std::max<i64>(1, numel / tiles / std::max<i64>(4096, 32 * p.block));
      i64 ch = std::min({e0, want, by_work});
      if (ch > 1) {
        p.chunk_len = (e0 + ch - 1) / ch;
        p.chunks = (e0 + p.chunk_len - 1) / p.chunk_len;
      }
    }
  }
}

inline Schedule schedule(const ir::Graph& g) { return Scheduler(g).run(); }
inline Schedule schedule(const ir::Graph& g, i64 placeholder) {
  Schedule s = Scheduler(g, placeholder).run();
  s.symbolic = placeholder;
  return s;
}

inline const char* level_name(Level l) {
  switch (l) {
    case Level::Full:
      return "full";
    case Level::Row:
      return "row";
    case Level::Final:
      return "final";
  }
  return "?";
}

}  // namespace detail

namespace detail {
// A graph whose outputs take leaves' memory runs only as its plan promised.
inline Schedule honoring_overwrites(Schedule s, const ir::Graph& g) {
  if (!s.overwrite_refused.empty())
    throw InternalError("kiln scheduler: " + s.overwrite_refused + " (the step planner checks this first)\n" + g.str());
  return s;
}
}  // namespace detail

inline Schedule schedule(const ir::Graph& g) { return detail::honoring_overwrites(detail::schedule(g), g); }
inline Schedule schedule(const ir::Graph& g, i64 placeholder) {
  return detail::honoring_overwrites(detail::schedule(g, placeholder), g);
}
inline std::string overwrite_refusal(const ir::Graph& g) {
  return g.overwrites.empty() ? std::string() : detail::schedule(g).overwrite_refused;
}

inline bool symbolic_kernel(const Schedule& s, std::size_t k, std::string* why) {
  const Kernel& kk = s.kernels[k];
  auto no = [&](const char* reason) {
    if (why) *why = "kernel " + std::to_string(k) + " over " + kk.space.str() + ": " + reason;
    return false;
  };
  if (s.symbolic == 0) return true;
  bool uses = false;
  for (std::size_t d = 0; d < kk.space.size(); ++d)
    if (kk.space[d] == s.symbolic) {
      if (d != 0) return no("the symbolic size is not its leading dim");
      uses = true;
    }
  if (!uses) return true;
  if (kk.kind == KernelKind::Pointwise) return true;
  const LoopPlan& p = kk.loops;
  if (kk.reduced.empty() || kk.reduced[0]) return no("it reduces over the symbolic size");
  if (p.column) return no("column strategy");
  if (p.chunks > 1) return no("split reduction");
  if (!kk.finals.empty()) return no("a reduction over all rows");
  if (p.kept_groups.empty() || p.groups[static_cast<std::size_t>(p.kept_groups.front())].front() != 0)
    return no("the symbolic size is not the outermost kept loop");
  return true;
}

inline std::string Schedule::str(const ir::Graph& g) const {
  std::ostringstream os;
  auto name = [&](int n) {
    const ir::GraphNode& gn = g.nodes[static_cast<std::size_t>(n)];
    return "%" + std::to_string(n) + " " + ir::op_name(gn.op);
  };
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    const Kernel& kk = kernels[k];
    const LoopPlan& p = kk.loops;
    os << "kernel " << k << ": " << (kk.kind == KernelKind::Pointwise ? "pointwise" : "reduce") << " over "
       << kk.space.str();
    if (kk.kind == KernelKind::Reduce) {
      os << " reducing dims [";
      bool first = true;
      for (std::size_t d = 0; d < kk.reduced.size(); ++d)
        if (kk.reduced[d]) {
          os << (first ? "" : ", ") << d;
          first = false;
        }
      os << "], " << (p.column ? "column" : "row") << " strategy, " << p.tiles() << " tile(s)";
      if (p.column) os << " of " << p.block;
      if (p.chunks > 1) os << ", " << p.chunks << " chunks combined in order";
      os << ", " << kk.passes << " pass(es)";
    }
    os << (p.parallel ? ", parallel" : ", single-threaded");
    os << "; loop groups";
    for (auto& grp : p.groups) {
      os << " (";
      for (std::size_t j = 0; j < grp.size(); ++j) os << (j ? "," : "") << grp[j];
      os << ")";
    }
    if (!kk.after.empty()) {
      os << "; after kernel";
      for (int a : kk.after) os << " " << a;
    }
    os << "\n";
    for (std::size_t j = 0; j < kk.reductions.size(); ++j)
      os << "  reduce " << name(kk.reductions[j]) << " (phase " << kk.phase[j] << ")\n";
    for (int f : kk.finals) os << "  final reduce " << name(f) << " over all rows\n";
    for (auto& st : kk.stores) {
      os << "  store " << name(st.node) << " (" << detail::level_name(st.level);
      if (st.level == Level::Full && kk.kind == KernelKind::Reduce) os << ", pass " << st.pass;
      os << ") ->";
      for (auto& t : st.targets) os << (t.kind == Location::Output ? " output " : " temp ") << t.index;
      os << "\n";
    }
  }
  for (std::size_t t = 0; t < temps.size(); ++t)
    os << "temp " << t << ": " << name(temps[t].node) << " " << dtype_name(temps[t].dtype) << temps[t].shape.str()
       << "\n";
  return os.str();
}

inline std::string explain_schedule(const ir::Graph& g) { return schedule(g).str(g); }

}  // namespace kiln::sched

KILN_COLD_CODE_END
