#pragma once
// The definitions of symbolic shapes (compile/symbolic.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/compile/symbolic.hpp"

namespace kiln::detail {

KILN_ENTRY SymbolicGraph::LeafView leaf_view(int a, const ArgDims& arg, const Shape& shape, const Strides& strides,
                                             std::int64_t offset) {
  SymbolicGraph::LeafView v;
  v.arg = a;
  v.fixed_strides = offset != 0;
  std::vector<bool> used(arg.shape.size(), false);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    int m = -2;
    if (strides[d] == 0 && shape[d] >= 2)
      m = -1;
    else if (shape[d] >= 2)
      for (std::size_t e = 0; e < arg.shape.size() && m == -2; ++e)
        if (!used[e] && arg.shape[e] == shape[d] && arg.strides[e] == strides[d]) {
          used[e] = true;
          m = static_cast<int>(e);
        }
    if (m == -2 && shape[d] >= 2) v.fixed_strides = true;
    v.dims.push_back(m);
  }
  // A reshaping or slicing view baked sizes of the dims it does not walk.
  for (std::size_t e = 0; e < arg.shape.size(); ++e)
    if (!used[e] && arg.shape[e] >= 2) v.pinned.push_back(static_cast<int>(e));
  return v;
}

KILN_ENTRY std::optional<SymbolicGraph> infer_symbolic(const ir::Graph& g,
                                                       const std::vector<SymbolicGraph::LeafView>& leaves,
                                                       const std::vector<ArgDims>& args, std::string& why) {
  SymbolicGraph sg;
  sg.base = g;
  sg.leaves = leaves;
  for (auto& a : args) {
    sg.arg_strides.push_back(a.strides);
    sg.arg_shapes.push_back(a.shape);
  }
  const std::size_t n = g.nodes.size();
  std::vector<std::size_t> first(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) first[i + 1] = first[i] + g.nodes[i].shape.size();
  const std::size_t slots = first[n];
  std::vector<int> parent(slots);
  std::iota(parent.begin(), parent.end(), 0);
  std::vector<std::optional<SymDim>> bound(slots);
  auto slot = [&](std::size_t node, std::size_t d) { return static_cast<int>(first[node] + d); };
  auto size_at = [&](std::size_t node, std::size_t d) { return g.nodes[node].shape[d]; };
  auto find = [&](int x) {
    while (parent[static_cast<std::size_t>(x)] != x)
      x = parent[static_cast<std::size_t>(x)] = parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(x)])];
    return x;
  };
  std::vector<int> sym_parent;
  auto sym_find = [&](int s) {
    while (sym_parent[static_cast<std::size_t>(s)] != s) s = sym_parent[static_cast<std::size_t>(s)];
    return s;
  };
  bool failed = false;
  auto fail = [&](const std::string& reason) {
    if (!failed) why = reason;
    failed = true;
  };
  auto node_text = [&](std::size_t i) {
    return "%" + std::to_string(i) + " " + ir::op_name(g.nodes[i].op) + g.nodes[i].shape.str();
  };
  // Two bindings of one class must agree; two symbols with one coefficient become one class.
  auto merge = [&](std::optional<SymDim>& into, const SymDim& v, std::size_t node) {
    if (!into) {
      into = v;
      return;
    }
    SymDim a = *into, b = v;
    if (a.sym >= 0) a.sym = sym_find(a.sym);
    if (b.sym >= 0) b.sym = sym_find(b.sym);
    if (a == b) return;
    if (a.sym >= 0 && b.sym >= 0 && a.coef == b.coef) {
      sym_parent[static_cast<std::size_t>(b.sym)] = a.sym;
      return;
    }
    fail("node " + node_text(node) + " ties a symbolic size to a baked one");
  };
  auto bind = [&](int s, const SymDim& v, std::size_t node) {
    merge(bound[static_cast<std::size_t>(find(s))], v, node);
  };
  auto unite = [&](int a, int b, std::size_t node) {
    a = find(a);
    b = find(b);
    if (a == b) return;
    parent[static_cast<std::size_t>(b)] = a;
    if (bound[static_cast<std::size_t>(b)])
      merge(bound[static_cast<std::size_t>(a)], *bound[static_cast<std::size_t>(b)], node);
  };
  auto resolved = [&](int s) -> std::optional<SymDim> {
    auto& b = bound[static_cast<std::size_t>(find(s))];
    if (!b) return std::nullopt;
    SymDim v = *b;
    if (v.sym >= 0) v.sym = sym_find(v.sym);
    return v;
  };

  // Leaves and the ties every op makes.
  for (std::size_t i = 0; i < n && !failed; ++i) {
    const ir::GraphNode& nd = g.nodes[i];
    const std::size_t rank = nd.shape.size();
    auto in_slot = [&](std::size_t k, std::size_t d) { return slot(static_cast<std::size_t>(nd.inputs[k]), d); };
    switch (ir::op_kind(nd.op)) {
      case ir::OpKind::Leaf:
        if (nd.op == ir::Op::Input) {
          const auto& lv = leaves.at(static_cast<std::size_t>(nd.leaf));
          const int a = lv.arg;
          for (std::size_t d = 0; d < rank; ++d) {
            std::int64_t v = nd.shape[d];
            const int e = a >= 0 ? lv.dims[d] : -2;
            if (e == -1) continue;  // broadcast: sized by what it meets
            if (e >= 0 && args[static_cast<std::size_t>(a)].dynamic[static_cast<std::size_t>(e)] && v >= 2) {
              int s = -1;
              for (std::size_t k = 0; k < sg.symbols.size(); ++k)
                if (sg.symbols[k].arg == a && sg.symbols[k].dim == e) s = static_cast<int>(k);
              if (s < 0) {
                s = static_cast<int>(sg.symbols.size());
                sg.symbols.push_back({a, a, e, v});
                sym_parent.push_back(s);
              }
              bind(slot(i, d), SymDim{1, s}, i);
            } else {
              bind(slot(i, d), SymDim{v, -1}, i);
            }
          }
        }
        break;  // constants, iota, random: sized by whatever they meet
      case ir::OpKind::Unary:
      case ir::OpKind::Binary:
      case ir::OpKind::Ternary:
        for (std::size_t k = 0; k < nd.inputs.size(); ++k)
          for (std::size_t d = 0; d < rank; ++d) unite(slot(i, d), in_slot(k, d), i);
        break;
      case ir::OpKind::Reduce:
        for (std::size_t d = 0; d < rank; ++d) {
          bool reduced = std::find(nd.attrs.ints.begin(), nd.attrs.ints.end(), static_cast<std::int64_t>(d)) !=
                         nd.attrs.ints.end();
          if (reduced)
            bind(slot(i, d), SymDim{1, -1}, i);
          else
            unite(slot(i, d), in_slot(0, d), i);
        }
        break;
      case ir::OpKind::IndexMap: {
        const std::size_t in0 = static_cast<std::size_t>(nd.inputs[0]);
        if (nd.op == ir::Op::Broadcast) {
          for (std::size_t d = 0; d < rank; ++d)
            if (size_at(in0, d) == nd.shape[d]) unite(slot(i, d), in_slot(0, d), i);
        } else if (nd.op == ir::Op::Permute) {
          for (std::size_t d = 0; d < rank; ++d)
            unite(slot(i, d), in_slot(0, static_cast<std::size_t>(nd.attrs.ints[d])), i);
        } else if (nd.op == ir::Op::Slice || nd.op == ir::Op::Concat) {
          const auto axis = static_cast<std::size_t>(nd.attrs.ints[0]);
          for (std::size_t d = 0; d < rank; ++d)
            if (d != axis)
              for (std::size_t k = 0; k < nd.inputs.size(); ++k) unite(slot(i, d), in_slot(k, d), i);
          if (nd.op == ir::Op::Slice && nd.attrs.ints[1] == 0 && nd.attrs.ints[2] == 1 &&
              nd.shape[axis] == size_at(in0, axis))
            unite(slot(i, axis), in_slot(0, axis), i);  // the whole dim: follows it
        }
        break;  // reshape, and the axis of slices and concats: below, once inputs are known
      }
      case ir::OpKind::Gather:
        // The index has the output's shape; the gathered input's other dims are at least the
        // index's (equal in every case but a smaller index): specialised unless equal.
        for (std::size_t d = 0; d < rank; ++d) {
          unite(slot(i, d), in_slot(1, d), i);
          if (static_cast<std::int64_t>(d) != nd.attrs.ints[0] &&
              size_at(static_cast<std::size_t>(nd.inputs[0]), d) == nd.shape[d])
            unite(slot(i, d), in_slot(0, d), i);
        }
        break;
      case ir::OpKind::Scatter:
        fail(node_text(i) + ": a scatter's sizes are specialised");
        break;
      case ir::OpKind::Scan:
        fail(node_text(i) + ": a scan's sizes are specialised");
        break;
      case ir::OpKind::Sort:
        fail(node_text(i) + ": a sort's sizes are specialised");
        break;
      case ir::OpKind::Attention:
        fail(node_text(i) + ": an attention's sizes are specialised");
        break;
      case ir::OpKind::Contract:
        // A library call is planned (layouts, algorithm) for static sizes: specialise.
        fail(node_text(i) + ": a matrix product's sizes are specialised");
        break;
    }
  }

  // Sizes that depend on their inputs' resolved sizes, in order (inputs come first).
  for (int round = 0; round < 3 && !failed; ++round) {
    for (std::size_t i = 0; i < n && !failed; ++i) {
      const ir::GraphNode& nd = g.nodes[i];
      if (nd.op != ir::Op::Reshape && nd.op != ir::Op::Slice && nd.op != ir::Op::Concat && nd.op != ir::Op::Gather)
        continue;
      const std::size_t in0 = static_cast<std::size_t>(nd.inputs[0]);
      auto in_dim = [&](std::size_t node, std::size_t d) {
        auto v = resolved(slot(node, d));
        return v ? *v : SymDim{size_at(node, d), -1};
      };
      if (nd.op == ir::Op::Gather) {
        // The range check bakes the gathered dim's size, and a gathered input larger than the
        // index elsewhere is addressed by its own sizes: both must be static.
        for (std::size_t d = 0; d < nd.shape.size(); ++d) {
          SymDim v = in_dim(in0, d), o = in_dim(i, d);
          if (v.sym >= 0 && (static_cast<std::int64_t>(d) == nd.attrs.ints[0] || o.sym != v.sym || o.coef != v.coef))
            fail("node " + node_text(i) + " gathers from symbolic dim " + std::to_string(d));
        }
        continue;
      }
      if (nd.op != ir::Op::Reshape) {
        const auto axis = static_cast<std::size_t>(nd.attrs.ints[0]);
        std::int64_t total = 0;
        bool symbolic = false;
        for (auto in : nd.inputs) {
          SymDim v = in_dim(static_cast<std::size_t>(in), axis);
          symbolic = symbolic || v.sym >= 0;
          total += v.coef;
        }
        if (!symbolic)
          bind(slot(i, axis), SymDim{nd.op == ir::Op::Slice ? nd.shape[axis] : total, -1}, i);
        else if (nd.op == ir::Op::Concat || !resolved(slot(i, axis)) || resolved(slot(i, axis))->sym < 0)
          fail("node " + node_text(i) + " baked the size of symbolic dim " + std::to_string(axis));
        continue;
      }
      // Reshape: dims grouped into runs of equal products; a run with one symbolic input dim
      // gives its symbol to one output dim (the first whose coefficient stays whole).
      const Shape& is = g.nodes[in0].shape;
      const Shape& os = nd.shape;
      if (is.numel() == 0) {
        for (std::size_t d = 0; d < os.size(); ++d) bind(slot(i, d), SymDim{os[d], -1}, i);
        continue;
      }
      std::size_t a = 0, b = 0;
      while ((a < is.size() || b < os.size()) && !failed) {
        std::size_t a0 = a, b0 = b;
        std::int64_t pa = 1, pb = 1;
        if (a < is.size()) pa *= is[a++];
        if (b < os.size()) pb *= os[b++];
        while (pa != pb) {
          if (pa < pb && a < is.size())
            pa *= is[a++];
          else if (b < os.size())
            pb *= os[b++];
          else
            break;
        }
        // Trailing 1s join the run (they carry nothing).
        while (a < is.size() && is[a] == 1 && (b >= os.size() || os[b] != 1)) ++a;
        while (b < os.size() && os[b] == 1 && (a >= is.size() || is[a] != 1)) ++b;
        std::int64_t k = 1;
        int sym = -1, nsym = 0;
        for (std::size_t d = a0; d < a; ++d) {
          SymDim v = in_dim(in0, d);
          if (v.sym >= 0) {
            ++nsym;
            sym = v.sym;
          }
          k *= v.coef;
        }
        if (nsym == 0) {
          for (std::size_t d = b0; d < b; ++d) bind(slot(i, d), SymDim{os[d], -1}, i);
          continue;
        }
        if (nsym > 1) {
          fail("node " + node_text(i) + " merges two symbolic sizes");
          break;
        }
        bool placed = false;
        for (std::size_t d = b0; d < b && !placed; ++d) {
          std::int64_t others = 1;
          for (std::size_t e = b0; e < b; ++e)
            if (e != d) others *= os[e];
          if (os[d] < 2 || others == 0 || k % others != 0) continue;
          for (std::size_t e = b0; e < b; ++e)
            bind(slot(i, e), e == d ? SymDim{k / others, sym} : SymDim{os[e], -1}, i);
          placed = true;
        }
        if (!placed) fail("node " + node_text(i) + " splits a symbolic size unevenly");
      }
    }
  }
  if (failed) return std::nullopt;

  // Every size is now resolved; one left free keeps its traced value unless it could have been
  // a symbolic size (then the trace may have baked it: not symbolic).
  sg.cls.resize(sg.symbols.size());
  for (std::size_t s = 0; s < sg.symbols.size(); ++s) sg.cls[s] = sym_find(static_cast<int>(s));
  sg.dims.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t d = 0; d < g.nodes[i].shape.size(); ++d) {
      auto v = resolved(slot(i, d));
      if (!v) {
        std::int64_t t = g.nodes[i].shape[d];
        for (auto& s : sg.symbols)
          if (s.traced == t) {
            why = "the size " + std::to_string(t) + " of node " + node_text(i) + " is baked and equals a symbolic size";
            return std::nullopt;
          }
        v = SymDim{t, -1};
      }
      if (v->sym >= 0 && v->coef * sg.symbols[static_cast<std::size_t>(v->sym)].traced != g.nodes[i].shape[d]) {
        why = "node " + node_text(i) + ": inferred size disagrees with the trace";
        return std::nullopt;
      }
      sg.dims[i].push_back(*v);
    }
  }
  // The class whose every use is a leading dim of coefficient 1 (a batch): kernels read it.
  for (std::size_t s = 0; s < sg.symbols.size() && sg.leading < 0; ++s) {
    int c = sg.cls[s];
    if (c != static_cast<int>(s)) continue;
    bool ok = true;
    for (std::size_t i = 0; i < n && ok; ++i)
      for (std::size_t d = 0; d < sg.dims[i].size() && ok; ++d)
        if (sg.dims[i][d].sym == c) ok = d == 0 && sg.dims[i][d].coef == 1;
    if (ok) sg.leading = c;
  }
  return sg;
}

KILN_ENTRY std::optional<std::vector<std::int64_t>> symbol_values(const SymbolicGraph& sg,
                                                                  const std::vector<Shape>& shapes,
                                                                  const std::vector<Strides>& strides,
                                                                  std::string& why) {
  for (auto& lv : sg.leaves)
    if (lv.arg >= 0 && lv.fixed_strides &&
        strides[static_cast<std::size_t>(lv.arg)] != sg.arg_strides[static_cast<std::size_t>(lv.arg)]) {
      why = "a view of a tensor argument at a baked offset or stride, and the argument's strides changed";
      return std::nullopt;
    }
  for (auto& lv : sg.leaves)
    for (int e : lv.pinned)
      if (shapes[static_cast<std::size_t>(lv.arg)][static_cast<std::size_t>(e)] !=
          sg.arg_shapes[static_cast<std::size_t>(lv.arg)][static_cast<std::size_t>(e)]) {
        why = "dim " + std::to_string(e) +
              " of a tensor argument changed, and the graph reads it through a view that baked its size";
        return std::nullopt;
      }
  std::vector<std::int64_t> v(sg.symbols.size(), -1);
  for (std::size_t s = 0; s < sg.symbols.size(); ++s) {
    const auto& sym = sg.symbols[s];
    std::int64_t x = shapes[static_cast<std::size_t>(sym.arg)][static_cast<std::size_t>(sym.dim)];
    std::int64_t& c = v[static_cast<std::size_t>(sg.cls[s])];
    if (c >= 0 && c != x) {
      why = "symbolic sizes " + sg.name_of(sg.cls[s]) + " were equal when traced and now differ";
      return std::nullopt;
    }
    c = x;
  }
  return v;
}

KILN_ENTRY ir::Graph instantiate(const SymbolicGraph& sg, const std::vector<std::int64_t>& values,
                                 const std::vector<Strides>& strides) {
  ir::Graph g = sg.base;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    ir::GraphNode& nd = g.nodes[i];
    for (std::size_t d = 0; d < nd.shape.size(); ++d) {
      const SymDim& s = sg.dims[i][d];
      nd.shape[d] = s.sym < 0 ? s.coef : s.coef * values[static_cast<std::size_t>(s.sym)];
    }
    if (nd.op == ir::Op::Input) {
      const auto& lv = sg.leaves[static_cast<std::size_t>(nd.leaf)];
      if (lv.arg >= 0)
        for (std::size_t d = 0; d < nd.strides.size(); ++d) {
          if (lv.dims[d] == -1)
            nd.strides[d] = 0;
          else if (lv.dims[d] >= 0)
            nd.strides[d] = strides[static_cast<std::size_t>(lv.arg)][static_cast<std::size_t>(lv.dims[d])];
        }
    }
  }
  for (std::size_t k = 0; k < g.outputs.size(); ++k)
    g.output_strides[k] = contiguous_strides(g.nodes[static_cast<std::size_t>(g.outputs[k])].shape);
  g.rehash();
  return g;
}

KILN_ENTRY bool leaf_is_leading(const SymbolicGraph& sg, std::size_t node) {
  for (auto& d : sg.dims[node])
    if (d.sym >= 0 && d.sym == sg.leading) return true;
  return false;
}

KILN_ENTRY ir::Graph canonical_graph(const SymbolicGraph& sg, const std::vector<std::int64_t>& values,
                                     const std::vector<Strides>& strides, std::int64_t placeholder) {
  std::vector<std::int64_t> v = values;
  v[static_cast<std::size_t>(sg.leading)] = placeholder;
  return instantiate(sg, v, strides);
}

}  // namespace kiln::detail
