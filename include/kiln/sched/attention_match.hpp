#pragma once
// Written-out attention recognised, as Inductor's pattern matcher does: a product of a softmax
// of scaled scores with the values,
//   matmul(softmax(matmul(q, kᵀ) · c [+ mask], -1), v)   (or / c, or no factor)
// becomes one Attention node, so that the [L, S] scores and weights never reach memory. The
// softmax is recognised by the decomposition the front end itself produces
// (detail::pattern_of), so a change to decomp::softmax cannot silently stop the match.
//
// A match needs every value between q kᵀ and the product read only inside it: a backward that
// keeps the weights, a graph output holding them or the scores, or another reader of the
// softmax's row statistics keep the written-out form (the fused kernels keep none of them).
// The factor is either a constant of the graph (baked into the call) or a number bound at run
// time (a CPU number leaf: its value is not structure, so the plan cannot bake it; it multiplies
// q instead, an extra pass over q but not over the scores). One difference from the written-out form: a row whose keys
// are all masked gives 0 (the fused kernels'), where the written-out softmax gives NaN.
#include <charconv>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/core/log.hpp"
#include "kiln/decomp/decompose.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::sched {

namespace detail {

/// One recognised attention: the nodes it reads and the ones that die with it.
struct AttentionMatch {
  int root = -1;  ///< MatMul(weights, v): becomes the Attention node
  int q = -1, kt = -1, v = -1, mask = -1;
  int scale_leaf = -1;  ///< a number bound at run time (-1: `scale` is the factor)
  bool divide = false;  ///< scores / factor (with scale_leaf)
  double scale = 1.0;
  std::set<int> inside;  ///< the values computed between q kᵀ and the product
};

inline std::string attention_number(double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// The input x of a softmax whose result is `p` and the axis it runs along, if `p` has the
// shape of decomp::softmax's result (exp(x - max) * (1 / sum), between casts for half types);
// the caller confirms the whole subgraph against the decomposition.
inline bool softmax_input(const ir::Graph& g, int p, int& x, std::int64_t& axis) {
  auto at = [&](int i) -> const ir::GraphNode& { return g.nodes[static_cast<std::size_t>(i)]; };
  int r = p;
  if (at(r).op == ir::Op::Cast) r = at(r).inputs[0];
  if (at(r).op != ir::Op::Mul) return false;
  const int e = at(r).inputs[0];
  if (at(e).op != ir::Op::Exp || at(at(e).inputs[0]).op != ir::Op::Sub) return false;
  const ir::GraphNode& sub = at(at(e).inputs[0]);
  const ir::GraphNode& bmax = at(sub.inputs[1]);
  if (bmax.op != ir::Op::Broadcast || at(bmax.inputs[0]).op != ir::Op::ReduceMax) return false;
  const std::vector<std::int64_t>& axes = at(bmax.inputs[0]).attrs.ints;
  if (axes.size() != 1) return false;
  axis = axes[0];
  x = sub.inputs[0];
  if (at(p).op == ir::Op::Cast && at(x).op == ir::Op::Cast) x = at(x).inputs[0];
  return true;
}

// Whether node i is one number broadcast: a constant (`value` set) or a leaf whose strides
// are all 0 (`leaf` set: its value is bound at run time).
inline bool scalar_factor(const ir::Graph& g, int i, double& value, int& leaf) {
  const ir::GraphNode* n = &g.nodes[static_cast<std::size_t>(i)];
  if (n->op == ir::Op::Broadcast) n = &g.nodes[static_cast<std::size_t>(n->inputs[0])];
  if (n->op == ir::Op::Constant && is_floating(n->dtype)) {
    value = n->attrs.scalar;
    return true;
  }
  if (g.nodes[static_cast<std::size_t>(i)].op == ir::Op::Input) {
    for (auto s : n->strides)
      if (s != 0) return false;
    leaf = i;
    return true;
  }
  return false;
}

// The match rooted at MatMul `root`, or false. `candidate` says whether the weights are a
// softmax at all (only those are logged); `why` gets the reason a candidate is refused.
inline bool match_attention(const ir::Graph& g, int root, const std::vector<int>& uses, AttentionMatch& m,
                            bool& candidate, std::string& why) {
  auto at = [&](int i) -> const ir::GraphNode& { return g.nodes[static_cast<std::size_t>(i)]; };
  candidate = false;
  const ir::GraphNode& mm = at(root);
  const int p = mm.inputs[0];
  int x = -1;
  std::int64_t axis = -1;
  if (!softmax_input(g, p, x, axis)) return false;
  const ir::GraphNode& xn = at(x);
  if (axis < 0 || axis >= static_cast<std::int64_t>(xn.shape.size())) return false;
  const ir::Graph pattern = pattern_of(xn, [axis](const ir::NodePtr& v) { return decomp::softmax(v, axis); });
  std::map<int, int> seen;
  if (pattern.outputs[1] < 0 || !same_subgraph(g, p, pattern, pattern.outputs[0], x, seen)) return false;
  candidate = true;
  const std::size_t rank = xn.shape.size();
  if (rank != 4) {
    why = "rank " + std::to_string(rank) + " operands, not 4 (scores " + xn.shape.str() + ")";
    return false;
  }
  if (axis != 3) {
    why = "the softmax runs along axis " + std::to_string(axis) + ", not the keys' (the last)";
    return false;
  }
  if (xn.shape.numel() == 0 || at(mm.inputs[1]).shape.numel() == 0) {
    why = "empty scores or values " + xn.shape.str();  // nothing to fuse: the planner's zero products
    return false;
  }
  m = AttentionMatch{};
  m.root = root;
  m.v = mm.inputs[1];
  for (auto& [pi, gi] : seen)
    if (ir::op_kind(at(gi).op) != ir::OpKind::Leaf) m.inside.insert(gi);

  // The scores: [Add(] q kᵀ [· c | / c] [, mask)], either operand order where it commutes.
  int scaled = x;
  if (xn.op == ir::Op::Add) {
    auto product_like = [&](int i) {
      const ir::GraphNode& n = at(i);
      return n.op == ir::Op::MatMul || ((n.op == ir::Op::Mul || n.op == ir::Op::Div) &&
                                        (at(n.inputs[0]).op == ir::Op::MatMul || at(n.inputs[1]).op == ir::Op::MatMul));
    };
    const int a = xn.inputs[0], b = xn.inputs[1];
    scaled = product_like(a) ? a : product_like(b) ? b : -1;
    if (scaled < 0) {
      why = "the scores are not q kᵀ (times a number) plus a mask";
      return false;
    }
    m.mask = scaled == a ? b : a;
    m.inside.insert(x);
  }
  int product = scaled;
  const ir::GraphNode& sn = at(scaled);
  if (sn.op == ir::Op::Mul || sn.op == ir::Op::Div) {
    const bool first = at(sn.inputs[0]).op == ir::Op::MatMul;
    if (sn.op == ir::Op::Div && !first) {
      why = "the scores divide a value by q kᵀ";
      return false;
    }
    product = first ? sn.inputs[0] : sn.inputs[1];
    const int factor = first ? sn.inputs[1] : sn.inputs[0];
    double value = 1.0;
    if (!scalar_factor(g, factor, value, m.scale_leaf)) {
      why = "the scale is not a constant (" + at(factor).shape.str() + " " + ir::op_name(at(factor).op) + ")";
      return false;
    }
    if (m.scale_leaf >= 0) {
      m.divide = sn.op == ir::Op::Div;
    } else {
      m.scale = sn.op == ir::Op::Div ? 1.0 / value : value;
    }
    m.inside.insert(scaled);
  } else if (sn.op != ir::Op::MatMul) {
    why = std::string("the scores are ") + ir::op_name(sn.op) + ", not q kᵀ (times a number)";
    return false;
  }
  m.inside.insert(product);
  m.q = at(product).inputs[0];
  m.kt = at(product).inputs[1];

  const ir::GraphNode &q = at(m.q), &v = at(m.v);
  if (q.dtype != v.dtype || !is_floating(q.dtype) || (m.mask >= 0 && !is_floating(at(m.mask).dtype))) {
    why = std::string("dtypes differ (q ") + dtype_name(q.dtype) + ", v " + dtype_name(v.dtype) + ")";
    return false;
  }
  // A mask broadcast from [B|1, H|1, L, S] is read where it is (0 strides on its 1 dims).
  if (m.mask >= 0 && at(m.mask).op == ir::Op::Broadcast) {
    const Shape& small = at(at(m.mask).inputs[0]).shape;
    if (small[2] == xn.shape[2] && small[3] == xn.shape[3]) m.mask = at(m.mask).inputs[0];
  }
  for (int operand : {m.q, m.kt, m.v, m.mask, m.scale_leaf})
    if (operand >= 0 && m.inside.count(operand)) {
      why = "an operand is computed inside the pattern";
      return false;
    }
  // Every value of the match is read only inside it (constants are free leaves, shared).
  for (int i : m.inside) {
    int reads = 0;
    for (int j : m.inside)
      for (auto in : at(j).inputs) reads += in == i;
    for (auto in : mm.inputs) reads += in == i;
    if (reads == uses[static_cast<std::size_t>(i)]) continue;
    if (i == p)
      why = "the weights are read elsewhere (a backward keeps them, or an output)";
    else if (i == x || i == scaled || i == product)
      why = "the scores are read elsewhere";
    else
      why = "the softmax's row statistics are read elsewhere";
    return false;
  }
  return true;
}

}  // namespace detail

/// Rewrites each written-out attention of `g` (matmul(softmax(q kᵀ · c [+ mask], -1), v) over
/// rank-4 operands of one floating dtype, every value between the products read only there)
/// into one fused Attention node (see the header comment); `rewritten` gets the result, with
/// `g`'s leaf indices, outputs and output strides, its nodes renumbered. Logs each candidate (a
/// product of a softmax) under the schedule channel. Returns whether anything was rewritten.
inline bool fuse_written_out_attention(const ir::Graph& g, ir::Graph& rewritten) {
  const std::size_t n = g.nodes.size();
  std::vector<int> uses(n, 0);
  bool any_product = false;
  for (const auto& nd : g.nodes) {
    for (auto in : nd.inputs) ++uses[static_cast<std::size_t>(in)];
    any_product = any_product || nd.op == ir::Op::MatMul;
  }
  if (!any_product) return false;
  for (auto o : g.outputs) ++uses[static_cast<std::size_t>(o)];
  const bool logging = log_enabled(LogChannel::schedule);

  std::vector<detail::AttentionMatch> matches;
  std::set<int> taken;  // nodes of accepted matches: a match may not overlap another
  for (std::size_t i = 0; i < n; ++i) {
    const ir::GraphNode& nd = g.nodes[i];
    // Cheap pre-check: the weights' node is the softmax's root op (a Mul, or a Cast to a half type).
    if (nd.op != ir::Op::MatMul) continue;
    const ir::Op w = g.nodes[static_cast<std::size_t>(nd.inputs[0])].op;
    if (w != ir::Op::Mul && w != ir::Op::Cast) continue;
    detail::AttentionMatch m;
    bool candidate = false;
    std::string why;
    bool ok = detail::match_attention(g, static_cast<int>(i), uses, m, candidate, why);
    if (ok)
      for (int j : m.inside)
        if (taken.count(j)) {
          ok = false;
          why = "overlaps another attention";
        }
    if (!candidate) continue;
    if (ok) {
      taken.insert(m.inside.begin(), m.inside.end());
      matches.push_back(m);
    }
    if (!logging) continue;
    if (!ok) {
      log(LogChannel::schedule, "attention pattern: not fused: " + why);
      continue;
    }
    const std::string factor = m.scale_leaf >= 0 ? "s" : detail::attention_number(m.scale);
    std::string line = "attention pattern: matched softmax(q kᵀ · " + factor + (m.mask >= 0 ? " + mask" : "") + ") v " +
                       g.nodes[static_cast<std::size_t>(m.q)].shape.str() + " -> fused attention";
    if (m.scale_leaf >= 0) line += " (s, a number bound at run time, scales q)";
    log(LogChannel::schedule, line);
  }
  if (matches.empty()) return false;

  // The rewritten nodes, in the original order with each root's new operands just before it.
  std::vector<ir::GraphNode> nodes;
  std::vector<int> index(n, -1);  // original node -> rewritten node
  std::map<int, const detail::AttentionMatch*> root_of;
  std::set<int> dead;
  std::map<int, ir::GraphNode> edited;  // kᵀ leaves viewed untransposed (their sole reader dies)
  for (const auto& m : matches) {
    root_of[m.root] = &m;
    dead.insert(m.inside.begin(), m.inside.end());
    const ir::GraphNode& kt = g.nodes[static_cast<std::size_t>(m.kt)];
    if (kt.op == ir::Op::Input && uses[static_cast<std::size_t>(m.kt)] == 1) {
      // kᵀ a leaf read only by the scores: the same memory viewed untransposed.
      ir::GraphNode k = kt;
      std::swap(k.shape[2], k.shape[3]);
      std::swap(k.strides[2], k.strides[3]);
      edited[m.kt] = k;
    }
  }
  auto push = [&](ir::GraphNode nd) {
    nodes.push_back(std::move(nd));
    return static_cast<int>(nodes.size() - 1);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const int ii = static_cast<int>(i);
    if (dead.count(ii)) continue;
    auto r = root_of.find(ii);
    if (r == root_of.end()) {
      auto e = edited.find(ii);
      ir::GraphNode nd = e != edited.end() ? e->second : g.nodes[i];
      for (auto& in : nd.inputs) in = index[static_cast<std::size_t>(in)];
      index[i] = push(std::move(nd));
      continue;
    }
    const detail::AttentionMatch& m = *r->second;
    const ir::GraphNode& qn = g.nodes[static_cast<std::size_t>(m.q)];
    int q = index[static_cast<std::size_t>(m.q)];
    int k = index[static_cast<std::size_t>(m.kt)];
    const ir::GraphNode& kt = g.nodes[static_cast<std::size_t>(m.kt)];
    if (!edited.count(m.kt)) {
      // k = kᵀ's source through one permutation: the untransposed source itself when kᵀ is a
      // transpose, else a new permute (which the call reads through a copy).
      ir::GraphNode perm;
      perm.op = ir::Op::Permute;
      perm.dtype = kt.dtype;
      perm.shape = kt.shape;
      std::swap(perm.shape[2], perm.shape[3]);
      perm.attrs.ints = {0, 1, 3, 2};
      perm.inputs = {k};
      if (kt.op == ir::Op::Permute) {
        std::vector<std::int64_t> p = kt.attrs.ints;
        std::swap(p[2], p[3]);
        bool identity = true;
        for (std::size_t d = 0; d < p.size(); ++d) identity = identity && p[d] == static_cast<std::int64_t>(d);
        perm.attrs.ints = p;
        perm.inputs = {index[static_cast<std::size_t>(kt.inputs[0])]};
        k = identity ? perm.inputs[0] : -1;
      } else {
        k = -1;
      }
      if (k < 0) k = push(std::move(perm));
    }
    if (m.scale_leaf >= 0) {
      // The number at q's shape: one column of the scores-shaped leaf, broadcast (index maps,
      // free), then multiplying (or dividing) q.
      ir::GraphNode column = g.nodes[static_cast<std::size_t>(m.scale_leaf)];
      column.op = ir::Op::Slice;
      column.shape[3] = 1;
      column.strides.clear();
      column.leaf = -1;
      column.attrs = ir::Attrs{};
      column.attrs.ints = {3, 0, 1};
      column.inputs = {index[static_cast<std::size_t>(m.scale_leaf)]};
      ir::GraphNode number;
      number.op = ir::Op::Broadcast;
      number.dtype = qn.dtype;
      number.shape = qn.shape;
      number.inputs = {push(std::move(column))};
      ir::GraphNode scaled_q;
      scaled_q.op = m.divide ? ir::Op::Div : ir::Op::Mul;
      scaled_q.dtype = qn.dtype;
      scaled_q.shape = qn.shape;
      scaled_q.inputs = {q, push(std::move(number))};
      q = push(std::move(scaled_q));
    }
    ir::GraphNode att;
    att.op = ir::Op::Attention;
    att.dtype = g.nodes[i].dtype;
    att.shape = g.nodes[i].shape;
    att.inputs = {q, k, index[static_cast<std::size_t>(m.v)]};
    if (m.mask >= 0) att.inputs.push_back(index[static_cast<std::size_t>(m.mask)]);
    ir::AttentionAttrs attrs;
    attrs.has_mask = m.mask >= 0;
    att.attrs.ints = attrs.ints();
    att.attrs.scalar = m.scale;
    index[i] = push(std::move(att));
  }

  // Dead values removed (a mask's broadcast, constants of the softmax, a transpose of k);
  // leaves stay, whatever reads them, so that leaf indices keep their meaning.
  std::vector<char> live(nodes.size(), 0);
  for (auto o : g.outputs) live[static_cast<std::size_t>(index[static_cast<std::size_t>(o)])] = 1;
  for (std::size_t j = nodes.size(); j-- > 0;) {
    if (nodes[j].op == ir::Op::Input) live[j] = 1;
    if (live[j])
      for (auto in : nodes[j].inputs) live[static_cast<std::size_t>(in)] = 1;
  }
  std::vector<int> renumber(nodes.size(), -1);
  rewritten = ir::Graph{};
  rewritten.device = g.device;
  for (std::size_t j = 0; j < nodes.size(); ++j) {
    if (!live[j]) continue;
    for (auto& in : nodes[j].inputs) in = renumber[static_cast<std::size_t>(in)];
    renumber[j] = static_cast<int>(rewritten.nodes.size());
    rewritten.nodes.push_back(std::move(nodes[j]));
  }
  for (auto o : g.outputs)
    rewritten.outputs.push_back(renumber[static_cast<std::size_t>(index[static_cast<std::size_t>(o)])]);
  rewritten.output_strides = g.output_strides;
  rewritten.donated = g.donated;  // the same leaves, by index
  rewritten.rehash();
  return true;
}

}  // namespace kiln::sched

KILN_COLD_CODE_END
