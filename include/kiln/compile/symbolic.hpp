#pragma once
// Symbolic sizes of a captured graph, for kiln::compile's dynamic entries.
//
// A dynamic entry traces its function once. To serve a call with new sizes it needs the graph
// those sizes would have produced: the sizes of every node are inferred here as `coef * s`
// (s: a symbolic size, one per dynamic argument dimension, or the constant coef alone) by
// unifying the dimensions that the recorded ops tie together (pointwise operands, kept dims of
// reductions, permutations, reshapes grouped by equal products, identity slices). A size that
// the trace baked and that cannot be told from the symbolic ones (a slice or concat along a
// symbolic dim, a reshape mixing two symbols, a free leaf size equal to a symbolic one) makes
// the graph non-symbolic: the entry then re-traces for new sizes, as a static one would.
//
// C++ sizes are plain integers, so a literal in the function that happened to equal a dynamic
// size at trace time (reshape({3, 64}) traced with a batch of 3) cannot be told from one that
// was computed from the argument; it is taken to follow the argument (docs/semantics.md).
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::detail {

/// One dimension's size: coef * value(sym), or coef alone when sym < 0.
struct SymDim {
  std::int64_t coef = 0;
  int sym = -1;
  friend bool operator==(const SymDim& a, const SymDim& b) { return a.coef == b.coef && a.sym == b.sym; }
};

/// A graph whose sizes follow its arguments' dynamic dimensions.
struct SymbolicGraph {
  struct Symbol {
    int arg = -1;             ///< tensor argument index (among the tensor arguments)
    int label = -1;           ///< the argument's index among all arguments (for messages)
    int dim = -1;             ///< its dimension
    std::int64_t traced = 0;  ///< the size at trace time
  };
  ir::Graph base;                         ///< the graph at trace sizes
  std::vector<std::vector<SymDim>> dims;  ///< per node, per dimension (sym: a class representative)
  std::vector<Symbol> symbols;            ///< every dynamic argument dimension met
  std::vector<int> cls;                   ///< per symbol: its class (symbols of one class are equal)
  /// How a leaf reads its argument: per leaf dim, the argument dim it walks (its size and
  /// stride follow that dim), -1 for a broadcast (stride 0) dim, -2 for a dim whose size and
  /// stride the trace baked. arg -1: a captured constant.
  struct LeafView {
    int arg = -1;
    std::vector<int> dims;
    bool fixed_strides = false;  ///< an offset or a baked stride: the argument's strides must not change
    std::vector<int> pinned;     ///< argument dims the view does not walk: their sizes must not change
  };
  std::vector<LeafView> leaves;
  std::vector<Strides> arg_strides;  ///< per tensor argument, at trace time
  std::vector<Shape> arg_shapes;     ///< per tensor argument, at trace time
  /// The class every one of whose dimensions is a leading dim (index 0) of size 1 * s whose
  /// inner sizes are static: kernels can read it at launch. -1 when none.
  int leading = -1;

  /// "arg 0 dim 0" for each symbol of class `c`.
  std::string name_of(int c) const {
    std::string s;
    for (std::size_t i = 0; i < symbols.size(); ++i)
      if (cls[i] == c)
        s += (s.empty() ? "" : " = ") + std::string("arg ") + std::to_string(symbols[i].label) + " dim " +
             std::to_string(symbols[i].dim);
    return s;
  }
};

struct ArgDims {
  Shape shape;
  Strides strides;
  std::vector<bool> dynamic;
};

/// How a leaf of shape `shape` and strides `strides` at element `offset` reads argument `a`
/// (see SymbolicGraph::LeafView).
KILN_ENTRY SymbolicGraph::LeafView leaf_view(int a, const ArgDims& arg, const Shape& shape, const Strides& strides,
                                             std::int64_t offset);

/// Infers symbolic sizes for `g`. `leaves[l]`: how leaf l reads its argument; `args[a]`: the
/// argument's layout at trace time and which of its dims are dynamic. Returns nothing, with
/// `why` set, when some size cannot follow.
KILN_ENTRY std::optional<SymbolicGraph> infer_symbolic(const ir::Graph& g,
                                                       const std::vector<SymbolicGraph::LeafView>& leaves,
                                                       const std::vector<ArgDims>& args, std::string& why);

/// Sizes of each symbol class for arguments of shapes `shapes`; nothing when two symbols of
/// one class disagree (the function would see different sizes where the trace saw one).
KILN_ENTRY std::optional<std::vector<std::int64_t>> symbol_values(const SymbolicGraph& sg,
                                                                  const std::vector<Shape>& shapes,
                                                                  const std::vector<Strides>& strides,
                                                                  std::string& why);

/// The graph `sg` becomes for symbol values `values` (leaf strides from `strides`, per
/// argument; outputs contiguous).
KILN_ENTRY ir::Graph instantiate(const SymbolicGraph& sg, const std::vector<std::int64_t>& values,
                                 const std::vector<Strides>& strides);

/// Whether node `node` (a leaf) of `sg` has a dimension of the leading class.
KILN_ENTRY bool leaf_is_leading(const SymbolicGraph& sg, std::size_t node);

/// `sg`'s graph with the leading class at `placeholder` and the other symbols at `values`:
/// the graph symbolic kernels are generated from (every size of it a kernel may bake is one
/// that all calls share). The leading class must be dim 0 of contiguous arguments (the caller
/// checks), so that no stride depends on it.
KILN_ENTRY ir::Graph canonical_graph(const SymbolicGraph& sg, const std::vector<std::int64_t>& values,
                                     const std::vector<Strides>& strides, std::int64_t placeholder);

}  // namespace kiln::detail

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/compile/symbolic_impl.hpp"
#endif
