#pragma once
// The definitions of ir/graph.hpp (hashing, comparing, capturing, printing and verifying
// graphs). Header-only mode includes them from that header (KILN_ENTRY is `inline`); compiled
// mode compiles them once into kiln::kiln_compiled (src/kiln_compiled.cpp), so the front end's
// headers parse the declarations only.
#include <algorithm>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/ir/builder.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::ir {

KILN_ENTRY void Graph::rehash() {
  using kiln::detail::hash_combine;
  std::uint64_t h = hash_combine(static_cast<std::uint64_t>(device.kind), static_cast<std::uint64_t>(device.index));
  for (auto& n : nodes) {
    h = hash_combine(h, static_cast<std::uint64_t>(n.op));
    h = hash_combine(h, static_cast<std::uint64_t>(n.dtype));
    for (auto d : n.shape) h = hash_combine(h, static_cast<std::uint64_t>(d));
    h = hash_combine(h, 0xabcdef + n.shape.size());
    h = hash_combine(h, n.attrs.hash());
    for (auto i : n.inputs) h = hash_combine(h, static_cast<std::uint64_t>(i));
    h = hash_combine(h, 0x1234 + n.inputs.size());
    for (auto s : n.strides) h = hash_combine(h, static_cast<std::uint64_t>(s));
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    h = hash_combine(h, static_cast<std::uint64_t>(outputs[i]));
    for (auto s : output_strides[i]) h = hash_combine(h, static_cast<std::uint64_t>(s));
  }
  for (auto l : donated) h = hash_combine(h, 0xd0a7ed00u + static_cast<std::uint64_t>(l));
  for (auto [o, l] : overwrites)
    h = hash_combine(h, 0x0e5e5000u + (static_cast<std::uint64_t>(o) << 32) + static_cast<std::uint64_t>(l));
  key = h;
}

KILN_ENTRY bool same_graph(const Graph& a, const Graph& b) {
  if (a.key != b.key || !(a.device == b.device) || a.outputs != b.outputs || a.output_strides != b.output_strides ||
      a.donated != b.donated || a.overwrites != b.overwrites || a.nodes.size() != b.nodes.size())
    return false;
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const GraphNode& x = a.nodes[i];
    const GraphNode& y = b.nodes[i];
    if (x.op != y.op || x.dtype != y.dtype || x.shape != y.shape || !(x.attrs == y.attrs) || x.inputs != y.inputs ||
        x.leaf != y.leaf || x.strides != y.strides)
      return false;
  }
  return true;
}

KILN_ENTRY Captured capture(const std::vector<NodePtr>& roots, Device device) {
  Captured c;
  c.graph.device = device;
  std::unordered_map<const Node*, std::int32_t> index_of;
  // Structural CSE: hash -> candidate indices with that hash.
  std::unordered_multimap<std::uint64_t, std::int32_t> by_hash;
  std::vector<std::uint64_t> hashes;

  // Iterative post-order DFS (graphs can be deep: no recursion).
  struct Frame {
    const NodePtr* node;
    std::size_t next;
    NodePtr view;  ///< the leaf a shape op of a realized node stands for, if it is one
  };
  auto visit_root = [&](const NodePtr& root) {
    if (index_of.count(root.get())) return;
    std::vector<Frame> stack{{&root, 0, as_leaf_view(*root)}};
    while (!stack.empty()) {
      Frame& f = stack.back();
      const Node& n = f.view ? *f.view : **f.node;
      bool leaf = n.realized();
      if (!leaf && f.next < n.inputs.size()) {
        const NodePtr& child = n.inputs[f.next++];
        if (!index_of.count(child.get())) stack.push_back({&child, 0, as_leaf_view(*child)});
        continue;
      }
      GraphNode g;
      std::uint64_t h;
      if (leaf) {
        g.op = Op::Input;
        g.strides = n.buffer->strides;
        h = leaf_hash(n) ^ reinterpret_cast<std::uintptr_t>(n.buffer->storage.get()) ^
            static_cast<std::uint64_t>(n.buffer->offset) * 0x9e3779b97f4a7c15ull;
      } else {
        g.op = n.op;
        g.attrs = n.attrs;
        h = n.local_hash;
        for (auto& in : n.inputs) {
          std::int32_t idx = index_of.at(in.get());
          g.inputs.push_back(idx);
          h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(idx));
        }
      }
      g.dtype = n.dtype;
      g.shape = n.shape;
      // Merge with an equal node already captured (same op, attrs, inputs; same buffer for leaves).
      std::int32_t found = -1;
      auto range = by_hash.equal_range(h);
      for (auto it = range.first; it != range.second && found < 0; ++it) {
        const GraphNode& o = c.graph.nodes[it->second];
        if (o.op != g.op || o.dtype != g.dtype || o.shape != g.shape || !(o.attrs == g.attrs) || o.inputs != g.inputs ||
            o.strides != g.strides)
          continue;
        if (leaf) {
          const Node& other = *c.leaves[o.leaf];
          if (other.buffer->storage != n.buffer->storage || other.buffer->offset != n.buffer->offset) continue;
        }
        found = it->second;
      }
      if (found < 0) {
        if (leaf) {
          g.leaf = static_cast<std::int32_t>(c.leaves.size());
          c.leaves.push_back(f.view ? f.view : *f.node);
        }
        found = static_cast<std::int32_t>(c.graph.nodes.size());
        c.graph.nodes.push_back(std::move(g));
        by_hash.emplace(h, found);
      }
      index_of[f.node->get()] = found;
      stack.pop_back();
    }
  };
  for (auto& r : roots) {
    visit_root(r);
    c.graph.outputs.push_back(index_of.at(r.get()));
    c.graph.output_strides.push_back(contiguous_strides(r->shape));
    c.roots.push_back(r);
  }
  c.graph.rehash();
  return c;
}

KILN_ENTRY std::string Graph::str() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& n = nodes[i];
    os << "%" << i << " = " << op_name(n.op);
    if (n.op == Op::Cast) os << "<" << dtype_name(n.dtype) << ">";
    os << "(";
    for (std::size_t k = 0; k < n.inputs.size(); ++k) os << (k ? ", " : "") << "%" << n.inputs[k];
    if (n.op == Op::Input) os << "#" << n.leaf;
    if (n.op == Op::Constant) {
      if (is_floating(n.dtype))
        os << n.attrs.scalar;
      else
        os << n.attrs.iscalar;
    }
    if (n.op == Op::Random)
      os << (n.inputs.empty() ? "seed=" + std::to_string(n.attrs.seed) : std::string("seed from its input"))
         << (n.attrs.ints[0] ? ", normal" : ", uniform");
    if (!n.attrs.ints.empty() && n.op != Op::Random) {
      os << (n.inputs.empty() && n.op != Op::Input ? "" : ", ") << "[";
      for (std::size_t k = 0; k < n.attrs.ints.size(); ++k) os << (k ? ", " : "") << n.attrs.ints[k];
      os << "]";
    }
    os << ") : " << dtype_name(n.dtype) << n.shape.str();
    if (n.op == Op::Input) {
      os << " strides [";
      for (std::size_t k = 0; k < n.strides.size(); ++k) os << (k ? ", " : "") << n.strides[k];
      os << "]";
    }
    os << "\n";
  }
  os << "outputs:";
  for (auto o : outputs) os << " %" << o;
  os << "\n";
  if (!donated.empty()) {
    os << "donated leaves:";
    for (auto l : donated) os << " #" << l;
    os << "\n";
  }
  for (auto [o, l] : overwrites) os << "output " << o << " overwrites leaf #" << l << "\n";
  return os.str();
}

KILN_ENTRY void Graph::verify() const {
  auto fail = [&](std::size_t i, const std::string& why) {
    throw Error("graph verifier: node %" + std::to_string(i) + " (" + op_name(nodes[i].op) + "): " + why + "\n" +
                str());
  };
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& n = nodes[i];
    for (auto in : n.inputs)
      if (in < 0 || static_cast<std::size_t>(in) >= i) fail(i, "input is not an earlier node");
    for (auto d : n.shape)
      if (d < 0) fail(i, "negative size");
    auto in = [&](int k) -> const GraphNode& { return nodes[n.inputs[k]]; };
    std::size_t arity = n.inputs.size();
    switch (op_kind(n.op)) {
      case OpKind::Leaf:
        // Random alone may take one input: its seed, a 0-dim int64 value (a kernel argument).
        if (n.op == Op::Random && arity == 1) {
          if (!in(0).shape.empty() || in(0).dtype != DType::Int64) fail(i, "random's seed is not a 0-dim int64");
        } else if (arity != 0) {
          fail(i, "leaf with inputs");
        }
        if (n.op == Op::Input && n.strides.size() != n.shape.size()) fail(i, "strides rank");
        if (n.op == Op::Iota &&
            (n.attrs.ints.size() != 1 || n.attrs.ints[0] >= static_cast<std::int64_t>(n.shape.size())))
          fail(i, "iota axis");
        break;
      case OpKind::Unary:
        if (arity != 1) fail(i, "arity");
        if (in(0).shape != n.shape) fail(i, "shape changes");
        if (n.op != Op::Cast && n.op != Op::Not && n.op != Op::IsNan && n.op != Op::IsInf && in(0).dtype != n.dtype)
          fail(i, "dtype changes");
        break;
      case OpKind::Binary:
        if (arity != 2) fail(i, "arity");
        if (in(0).shape != n.shape || in(1).shape != n.shape) fail(i, "shapes differ");
        if (in(0).dtype != in(1).dtype) fail(i, "dtypes differ");
        break;
      case OpKind::Ternary:
        if (arity != 3) fail(i, "arity");
        if (in(0).dtype != DType::Bool) fail(i, "condition is not bool");
        if (in(0).shape != n.shape || in(1).shape != n.shape || in(2).shape != n.shape) fail(i, "shapes differ");
        if (in(1).dtype != n.dtype || in(2).dtype != n.dtype) fail(i, "dtypes differ");
        break;
      case OpKind::Reduce: {
        if (arity != 1) fail(i, "arity");
        if (in(0).shape.size() != n.shape.size()) fail(i, "rank changes");
        for (std::size_t d = 0; d < n.shape.size(); ++d) {
          bool reduced =
              std::find(n.attrs.ints.begin(), n.attrs.ints.end(), static_cast<std::int64_t>(d)) != n.attrs.ints.end();
          if (reduced ? n.shape[d] != 1 : n.shape[d] != in(0).shape[d]) fail(i, "reduced shape");
        }
        break;
      }
      case OpKind::IndexMap:
        if (n.op == Op::Concat ? arity < 1 : arity != 1) fail(i, "arity");
        if (n.op == Op::Reshape && in(0).shape.numel() != n.shape.numel()) fail(i, "reshape numel");
        if (n.op == Op::Broadcast && in(0).shape.size() != n.shape.size()) fail(i, "broadcast rank");
        if (n.op == Op::Permute && n.attrs.ints.size() != n.shape.size()) fail(i, "permutation rank");
        break;
      case OpKind::Gather: {
        if (arity != 2 || n.attrs.ints.size() != 2) fail(i, "arity or attributes");
        const std::size_t r = in(0).shape.size();
        const std::int64_t axis = n.attrs.ints[0];
        if (in(1).dtype != DType::Int64) fail(i, "index is not int64");
        if (in(1).shape != n.shape || r != n.shape.size() || axis < 0 || axis >= static_cast<std::int64_t>(r))
          fail(i, "index shape or axis");
        for (std::size_t d = 0; d < r; ++d)
          if (static_cast<std::int64_t>(d) != axis && n.shape[d] > in(0).shape[d]) fail(i, "index larger than input");
        if (in(0).dtype != n.dtype) fail(i, "dtype changes");
        break;
      }
      case OpKind::Scatter: {
        if (arity != 3 || n.attrs.ints.size() != 4) fail(i, "arity or attributes");
        const std::size_t r = n.shape.size();
        const std::int64_t axis = n.attrs.ints[0];
        if (in(0).shape != n.shape || in(0).dtype != n.dtype || in(2).dtype != n.dtype) fail(i, "base or source");
        if (in(1).dtype != DType::Int64 || in(1).shape != in(2).shape || in(1).shape.size() != r || axis < 0 ||
            axis >= static_cast<std::int64_t>(r))
          fail(i, "index shape or axis");
        for (std::size_t d = 0; d < r; ++d)
          if (static_cast<std::int64_t>(d) != axis && in(1).shape[d] > n.shape[d]) fail(i, "index larger than base");
        break;
      }
      case OpKind::Scan:
        if (arity != 1 || n.attrs.ints.size() != 2 || in(0).shape != n.shape || n.attrs.ints[0] < 0 ||
            n.attrs.ints[0] >= static_cast<std::int64_t>(n.shape.size()))
          fail(i, "arity, shape or axis");
        break;
      case OpKind::Sort: {
        if (arity != 1 || n.attrs.ints.size() != 3 || n.dtype != DType::Int64) fail(i, "arity, attributes or dtype");
        const std::int64_t axis = n.attrs.ints[0];
        if (axis < 0 || axis >= static_cast<std::int64_t>(n.shape.size()) || in(0).shape.size() != n.shape.size())
          fail(i, "axis or rank");
        for (std::size_t d = 0; d < n.shape.size(); ++d)
          if (static_cast<std::int64_t>(d) == axis ? n.shape[d] != n.attrs.ints[1] || n.shape[d] > in(0).shape[d]
                                                    : n.shape[d] != in(0).shape[d])
            fail(i, "shape");
        break;
      }
      case OpKind::Attention: {
        if (n.attrs.ints.size() != 4 || n.attrs.ints[0] < 0 || n.attrs.ints[0] > 4) fail(i, "attributes");
        const AttentionAttrs a = AttentionAttrs::of(n.attrs);
        if (a.has_dropout() && !(a.dropout_p > 0.0 && a.dropout_p < 1.0)) fail(i, "dropout probability");
        if (arity != a.inputs()) fail(i, "arity");
        if (a.has_dropout() && (in(a.seed_input()).dtype != DType::Int64 ||
                                !in(a.seed_input()).shape.empty()))
          fail(i, "dropout key (a 0-dim int64)");
        const Shape &q = in(0).shape, &k = in(1).shape, &v = in(2).shape;
        if (q.size() != 4 || k.size() != 4 || v.size() != 4 || k[0] != q[0] || v[0] != q[0] || v[1] != k[1] ||
            v[2] != k[2] || k[3] != q[3] || (k[1] == 0 ? q[1] != 0 : q[1] % k[1] != 0))
          fail(i, "operand shapes");
        if (in(1).dtype != in(0).dtype || in(2).dtype != in(0).dtype) fail(i, "dtypes differ");
        break;
      }
      case OpKind::Contract: {
        if (arity != 2) fail(i, "arity");
        const Shape &a = in(0).shape, &b = in(1).shape;
        const std::size_t r = n.shape.size();
        if (r < 2 || a.size() != r || b.size() != r) fail(i, "operand ranks");
        if (a[r - 1] != b[r - 2] || n.shape[r - 2] != a[r - 2] || n.shape[r - 1] != b[r - 1])
          fail(i, "inner or outer sizes");
        for (std::size_t d = 0; d + 2 < r; ++d)
          if (a[d] != n.shape[d] || b[d] != n.shape[d]) fail(i, "batch sizes");
        if (in(0).dtype != n.dtype || in(1).dtype != n.dtype) fail(i, "dtypes differ");
        break;
      }
    }
  }
  for (auto o : outputs)
    if (o < 0 || static_cast<std::size_t>(o) >= nodes.size()) throw Error("graph verifier: bad output index");
}

}  // namespace kiln::ir
