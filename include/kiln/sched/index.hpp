#pragma once
// Index arithmetic of fused kernels. Inside a kernel every value is computed at an index that
// is a function of the kernel's loop indices i_0..i_{r-1} (one per dimension of its iteration
// space). Index maps (broadcast, permute, slice, reshape, concat) become arithmetic on those
// functions instead of copies. Most of them stay affine (sum c_d * i_d + k), which is what
// lets the scheduler prove that a reference reads "the current row" of a reduction, merge
// loop dimensions and find the unit-stride dimension; what is not affine (a reshape that
// splits an index unevenly, concat's clamped pieces) is carried as opaque C text. A gather's
// coordinate is a value the kernel computes (its index operand): it is carried as a "value
// term" beside the affine part, so that x[ids[i], j] keeps its unit stride along j (and its
// vector loads) while the scheduler still sees which loop dims the term depends on.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::sched {

using i64 = std::int64_t;

/// Most loop dimensions a kernel may have (opaque expressions track their dims in a bit mask).
inline constexpr int kMaxRank = 64;

/// scale * (text): a term whose value the kernel computes (a gathered index), not a function
/// of the loop variables that index arithmetic can see through.
struct ValueTerm {
  std::string text;        ///< C expression of the value (a variable of the generated code)
  i64 scale = 1;
  std::uint64_t deps = 0;  ///< the kernel dimensions the value may depend on
  friend bool operator==(const ValueTerm& a, const ValueTerm& b) {
    return a.text == b.text && a.scale == b.scale && a.deps == b.deps;
  }
};

/// One integer index as a function of the kernel's loop indices: affine
/// (sum coeff[d] * i_d + constant), affine plus value terms, or, when `text` is set, an opaque
/// C expression.
struct IndexExpr {
  std::vector<i64> coeff;         ///< one per kernel dimension (affine part)
  i64 constant = 0;               ///< affine part
  std::vector<ValueTerm> values;  ///< value terms added to the affine part (not with `text`)
  std::string text;               ///< opaque: C expression over the loop variables i<d>
  std::uint64_t deps = 0;         ///< opaque, or with value terms: the kernel dimensions read beyond coeff
  /// Opaque `split_scale` * (`split_of` / `divisor`), or the same of the remainder
  /// (ix_divmod): what lets ix_add see that k * p * (e / p) + k * (e % p) is k * e again (a
  /// reshape that splits a dim and one that merges it back, as [B*T, C] -> [B, T, C] ->
  /// [B*T, C], or strides that lay the two parts out contiguously).
  std::shared_ptr<const IndexExpr> split_of;
  i64 divisor = 0;
  i64 split_scale = 0;
  bool split_quotient = false;

  /// Purely affine: no opaque text and no value terms.
  bool affine() const { return text.empty() && values.empty(); }
  /// An affine part plus value terms (the affine part is exact, the terms are not looked into).
  bool has_values() const { return text.empty() && !values.empty(); }
  bool is_constant() const {
    if (!affine()) return false;
    for (auto c : coeff)
      if (c != 0) return false;
    return true;
  }
  /// Kernel dimensions the value depends on.
  std::uint64_t dep_mask() const {
    if (!text.empty()) return deps;
    std::uint64_t m = 0;
    for (auto& v : values) m |= v.deps;
    for (std::size_t d = 0; d < coeff.size(); ++d)
      if (coeff[d] != 0) m |= std::uint64_t(1) << d;
    return m;
  }
  i64 at(std::size_t d) const { return d < coeff.size() ? coeff[d] : 0; }
  /// A string that identifies the expression (memo keys).
  std::string key() const {
    std::string k;
    append_key(k);
    return k;
  }
  /// Appends the key (raw bytes: built often, in memo keys, so no decimal formatting).
  void append_key(std::string& k) const {
    if (!text.empty()) {
      k += 'o';
      k += text;
      k += '\0';
      return;
    }
    for (auto& v : values) {
      k += 'v';
      k += v.text;
      k += '\0';
      k.append(reinterpret_cast<const char*>(&v.scale), sizeof(i64));
    }
    k += 'a';
    for (std::size_t d = 0; d < coeff.size(); ++d) {
      if (coeff[d] == 0) continue;
      k += static_cast<char>(d);
      k.append(reinterpret_cast<const char*>(&coeff[d]), sizeof(i64));
    }
    k += '\xff';
    k.append(reinterpret_cast<const char*>(&constant), sizeof(i64));
  }
  friend bool operator==(const IndexExpr& a, const IndexExpr& b) {
    if (a.text.empty() != b.text.empty()) return false;
    if (!a.text.empty()) return a.text == b.text;
    if (a.values != b.values) return false;
    if (a.constant != b.constant) return false;
    for (std::size_t d = 0; d < std::max(a.coeff.size(), b.coeff.size()); ++d)
      if (a.at(d) != b.at(d)) return false;
    return true;
  }
};

/// An index into a node: one expression per dimension of the node's shape.
using Index = std::vector<IndexExpr>;

inline std::string index_key(const Index& idx) {
  std::string k;
  for (auto& e : idx) e.append_key(k);
  return k;
}

inline IndexExpr ix_const(i64 k) {
  IndexExpr e;
  e.constant = k;
  return e;
}

inline IndexExpr ix_var(int d, int rank) {
  IndexExpr e;
  e.coeff.assign(static_cast<std::size_t>(rank), 0);
  e.coeff[static_cast<std::size_t>(d)] = 1;
  return e;
}

/// The loop variable of kernel dimension d, as generated code names it.
inline std::string loop_var(int d) { return "i" + std::to_string(d); }

/// C text of value terms ("" when none), each `scale*(text)`, joined by " + ".
inline std::string value_terms_text(const std::vector<ValueTerm>& values) {
  std::string s;
  for (auto& v : values) {
    if (!s.empty()) s += " + ";
    s += (v.scale == 1 ? std::string() : "(" + std::to_string(v.scale) + "LL)*") + "(" + v.text + ")";
  }
  return s;
}

/// C text of an affine expression (with its value terms) with every dimension named by its own
/// loop variable.
inline std::string affine_text(const IndexExpr& e) {
  std::string s = value_terms_text(e.values);
  for (std::size_t d = 0; d < e.coeff.size(); ++d) {
    i64 c = e.coeff[d];
    if (c == 0) continue;
    if (!s.empty())
      s += c < 0 ? " - " : " + ";
    else if (c < 0)
      s += "-";
    i64 a = c < 0 ? -c : c;
    if (a != 1) s += std::to_string(a) + "LL*";
    s += loop_var(static_cast<int>(d));
  }
  if (e.constant != 0 || s.empty()) {
    if (!s.empty())
      s += e.constant < 0 ? " - " : " + ";
    else if (e.constant < 0)
      s += "-";
    s += std::to_string(e.constant < 0 ? -e.constant : e.constant) + "LL";
  }
  return s;
}

/// C text of any index expression, loop variables named per dimension.
inline std::string ix_text(const IndexExpr& e) {
  return e.text.empty() ? "(" + affine_text(e) + ")" : "(" + e.text + ")";
}

/// The innermost of `scope` and the scopes (`defined_in`: a writer's map from variable to
/// scope) where the variables of `e`'s value terms are defined: where `e` can be evaluated.
template <class Map>
inline int scope_with_values(const IndexExpr& e, int scope, const Map& defined_in) {
  for (auto& v : e.values) {
    auto it = defined_in.find(v.text);
    if (it != defined_in.end()) scope = std::max(scope, it->second);
  }
  return scope;
}

/// The affine part of `e` (without its value terms); `e` itself when purely affine. Undefined
/// for opaque text.
inline IndexExpr affine_part(const IndexExpr& e) {
  IndexExpr r = e;
  r.values.clear();
  r.deps = 0;
  return r;
}

/// The value `text` (a kernel value depending on loop dims `deps`) as an index.
inline IndexExpr ix_value(std::string text, std::uint64_t deps) {
  IndexExpr e;
  e.values.push_back(ValueTerm{std::move(text), 1, deps});
  e.deps = deps;
  return e;
}

inline IndexExpr ix_opaque(std::string text, std::uint64_t deps) {
  IndexExpr e;
  e.text = std::move(text);
  e.deps = deps;
  return e;
}

inline IndexExpr ix_scale(const IndexExpr& a, i64 k);

inline IndexExpr ix_add(const IndexExpr& a, const IndexExpr& b) {
  if (a.is_constant() && a.constant == 0) return b;
  if (b.is_constant() && b.constant == 0) return a;
  // k * p * (e / p) + k * (e % p), either order: k * e.
  for (const IndexExpr* q : {&a, &b}) {
    const IndexExpr* r = q == &a ? &b : &a;
    if (q->split_of && r->split_of && q->split_quotient && !r->split_quotient && q->divisor == r->divisor &&
        q->split_scale == q->divisor * r->split_scale && (q->split_of == r->split_of || *q->split_of == *r->split_of))
      return ix_scale(*q->split_of, r->split_scale);
  }
  if (a.text.empty() && b.text.empty()) {
    IndexExpr r;
    r.coeff.assign(std::max(a.coeff.size(), b.coeff.size()), 0);
    for (std::size_t d = 0; d < r.coeff.size(); ++d) r.coeff[d] = a.at(d) + b.at(d);
    r.constant = a.constant + b.constant;
    r.values = a.values;
    r.values.insert(r.values.end(), b.values.begin(), b.values.end());
    r.deps = a.deps | b.deps;
    return r;
  }
  return ix_opaque(ix_text(a) + " + " + ix_text(b), a.dep_mask() | b.dep_mask());
}

inline IndexExpr ix_scale(const IndexExpr& a, i64 k) {
  if (a.text.empty()) {
    IndexExpr r = a;
    for (auto& c : r.coeff) c *= k;
    r.constant *= k;
    for (auto& v : r.values) v.scale *= k;
    if (k == 0) {
      r.values.clear();
      r.deps = 0;
    }
    return r;
  }
  if (k == 1) return a;
  IndexExpr r = ix_opaque(std::to_string(k) + "LL*" + ix_text(a), a.deps);
  if (a.split_of) {
    r.split_of = a.split_of;
    r.divisor = a.divisor;
    r.split_scale = a.split_scale * k;
    r.split_quotient = a.split_quotient;
  }
  return r;
}

inline IndexExpr ix_add_const(const IndexExpr& a, i64 k) { return ix_add(a, ix_const(k)); }

/// (e / p, e % p) for an index e >= 0 and p > 0, affine when that is exact: the terms whose
/// coefficients are multiples of p form the quotient and the rest (which must stay below p
/// over the whole iteration space `space`) the remainder. Otherwise opaque division.
inline std::pair<IndexExpr, IndexExpr> ix_divmod(const IndexExpr& e, i64 p, const Shape& space) {
  if (p == 1) return {e, ix_const(0)};
  if (e.affine()) {
    IndexExpr q, r;
    q.coeff.assign(e.coeff.size(), 0);
    r.coeff.assign(e.coeff.size(), 0);
    bool ok = e.constant >= 0;
    i64 low_max = e.constant % p;
    q.constant = e.constant / p;
    r.constant = e.constant % p;
    for (std::size_t d = 0; d < e.coeff.size() && ok; ++d) {
      i64 c = e.coeff[d];
      if (c == 0) continue;
      if (c < 0)
        ok = false;
      else if (c % p == 0)
        q.coeff[d] = c / p;
      else {
        r.coeff[d] = c;
        i64 ext = d < space.size() ? space[d] : 1;
        low_max += c * (ext > 0 ? ext - 1 : 0);
      }
    }
    if (ok && low_max < p) return {q, r};
  }
  std::string t = ix_text(e);
  std::uint64_t m = e.dep_mask();
  auto split = std::make_shared<const IndexExpr>(e);
  IndexExpr q = ix_opaque(t + " / " + std::to_string(p) + "LL", m);
  IndexExpr r = ix_opaque(t + " % " + std::to_string(p) + "LL", m);
  q.split_of = r.split_of = split;
  q.divisor = r.divisor = p;
  q.split_scale = r.split_scale = 1;
  q.split_quotient = true;
  return {q, r};
}

/// Zero for every dimension of size 1 (its only index), so equal positions compare equal.
inline void normalize(Index& idx, const Shape& shape) {
  for (std::size_t d = 0; d < idx.size(); ++d)
    if (shape[d] == 1) idx[d] = ix_const(0);
}

/// The identity index of a kernel of rank r (dimension d read by loop variable d).
inline Index identity_index(const Shape& space) {
  Index idx;
  const int r = static_cast<int>(space.size());
  for (int d = 0; d < r; ++d) idx.push_back(ix_var(d, r));
  normalize(idx, space);
  return idx;
}

/// Row-major flat offset of `idx` in `shape` (sum idx[d] * contiguous stride[d]).
inline IndexExpr flat_index(const Index& idx, const Shape& shape) {
  Strides st = contiguous_strides(shape);
  IndexExpr f = ix_const(0);
  for (std::size_t d = 0; d < idx.size(); ++d)
    if (shape[d] != 1) f = ix_add(f, ix_scale(idx[d], st[d]));
  return f;
}

/// Splits a flat row-major position `f` (0 <= f < shape.numel()) into an index of `shape`.
inline Index unflatten(const IndexExpr& f, const Shape& shape, const Shape& space) {
  Index out(shape.size(), ix_const(0));
  if (shape.numel() == 0) return out;
  Strides st = contiguous_strides(shape);
  // Peel dimensions outermost first: rest < numel of the dims left, so each quotient is
  // already below its dimension's size and needs no modulo.
  IndexExpr rest = f;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    auto [q, r] = ix_divmod(rest, st[d], space);
    out[d] = q;
    rest = r;
  }
  return out;
}

/// Offset functional of a strided access: sum idx[d] * strides[d].
inline IndexExpr strided_offset(const Index& idx, const Strides& strides, const Shape& shape) {
  IndexExpr f = ix_const(0);
  for (std::size_t d = 0; d < idx.size(); ++d)
    if (shape[d] != 1 && strides[d] != 0) f = ix_add(f, ix_scale(idx[d], strides[d]));
  return f;
}

// ---- index maps: the index of an input given the index of the output --------------------

/// Broadcast: size-1 dimensions of the input read index 0.
inline Index map_broadcast(const Index& idx, const Shape& in_shape) {
  Index r = idx;
  normalize(r, in_shape);
  return r;
}

/// Permute: output dim i is input dim perm[i].
inline Index map_permute(const Index& idx, const std::vector<i64>& perm, const Shape& in_shape) {
  Index r(idx.size(), ix_const(0));
  for (std::size_t i = 0; i < perm.size(); ++i) r[static_cast<std::size_t>(perm[i])] = idx[i];
  normalize(r, in_shape);
  return r;
}

/// Slice {axis, start, step}.
inline Index map_slice(const Index& idx, const std::vector<i64>& attrs, const Shape& in_shape) {
  Index r = idx;
  auto axis = static_cast<std::size_t>(attrs.at(0));
  r[axis] = ix_add_const(ix_scale(idx[axis], attrs.at(2)), attrs.at(1));
  normalize(r, in_shape);
  return r;
}

/// Reshape: dimensions are matched in groups of equal size (size-1 dims dropped) so that a
/// reshape that only merges or splits neighbours evenly stays affine.
inline Index map_reshape(const Index& idx, const Shape& out_shape, const Shape& in_shape, const Shape& space) {
  Index r(in_shape.size(), ix_const(0));
  if (in_shape.numel() == 0) return r;
  std::vector<std::size_t> od, id;
  for (std::size_t d = 0; d < out_shape.size(); ++d)
    if (out_shape[d] != 1) od.push_back(d);
  for (std::size_t d = 0; d < in_shape.size(); ++d)
    if (in_shape[d] != 1) id.push_back(d);
  std::size_t a = 0, b = 0;
  while (a < od.size() && b < id.size()) {
    std::size_t a0 = a, b0 = b;
    i64 pa = out_shape[od[a++]], pb = in_shape[id[b++]];
    while (pa != pb) {
      if (pa < pb)
        pa *= out_shape[od[a++]];
      else
        pb *= in_shape[id[b++]];
    }
    // Flat position inside the group, then split over the input dims of the group.
    IndexExpr f = ix_const(0);
    i64 mult = 1;
    for (std::size_t k = a; k-- > a0;) {
      f = ix_add(f, ix_scale(idx[od[k]], mult));
      mult *= out_shape[od[k]];
    }
    if (b - b0 == 1) {
      r[id[b0]] = f;
      continue;
    }
    Shape sub;
    for (std::size_t k = b0; k < b; ++k) sub.push_back(in_shape[id[k]]);
    Index parts = unflatten(f, sub, space);
    for (std::size_t k = b0; k < b; ++k) r[id[k]] = parts[k - b0];
  }
  return r;
}

/// Concat piece k: the index into input k, clamped into range so that every piece can be
/// loaded unconditionally (the kernel then selects the right one without branches).
inline Index map_concat_piece(const Index& idx, std::size_t axis, i64 offset, i64 size, const Shape& in_shape) {
  Index r = idx;
  if (size <= 1) {
    r[axis] = ix_const(0);
  } else {
    IndexExpr shifted = ix_add_const(idx[axis], -offset);
    r[axis] =
        ix_opaque("kiln_iclamp(" + ix_text(shifted) + ", " + std::to_string(size - 1) + "LL)", shifted.dep_mask());
  }
  normalize(r, in_shape);
  return r;
}

/// Gather: the index of the gathered input, the output's index with the axis coordinate
/// `along` (the index operand's value, clamped into range by the writers).
inline Index gather_index(const Index& idx, std::size_t axis, IndexExpr along, const Shape& in_shape) {
  Index r = idx;
  r[axis] = std::move(along);
  normalize(r, in_shape);
  return r;
}

/// The index at which `node`'s input `k` is read when `node` is evaluated at `idx` (index
/// maps only; pointwise ops read their inputs at the same index).
inline Index input_index(const ir::Graph& g, const ir::GraphNode& n, std::size_t k, const Index& idx,
                         const Shape& space) {
  const ir::GraphNode& in = g.nodes[static_cast<std::size_t>(n.inputs[k])];
  switch (n.op) {
    case ir::Op::Broadcast:
      return map_broadcast(idx, in.shape);
    case ir::Op::Permute:
      return map_permute(idx, n.attrs.ints, in.shape);
    case ir::Op::Slice:
      return map_slice(idx, n.attrs.ints, in.shape);
    case ir::Op::Reshape:
      return map_reshape(idx, n.shape, in.shape, space);
    case ir::Op::Random:  // its seed: one 0-dim value
      return Index{};
    case ir::Op::Gather: {
      // The index operand is read where the output is; the gathered input along the axis at a
      // value the kernel computes. The scheduler names that value by the gather and the index it
      // is read at (the writers substitute the variable holding it, see gather_index).
      if (k == 1) return idx;
      std::uint64_t deps = 0;
      for (auto& e : idx) deps |= e.dep_mask();
      const auto id = static_cast<std::size_t>(&n - g.nodes.data());
      return gather_index(idx, static_cast<std::size_t>(n.attrs.ints.at(0)),
                          ix_value("kiln_gathered_" + std::to_string(id) + "_" +
                                       std::to_string(std::hash<std::string>{}(index_key(idx))),
                                   deps),
                          in.shape);
    }
    case ir::Op::Concat: {
      auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
      i64 offset = 0;
      for (std::size_t j = 0; j < k; ++j) offset += g.nodes[static_cast<std::size_t>(n.inputs[j])].shape[axis];
      return map_concat_piece(idx, axis, offset, in.shape[axis], in.shape);
    }
    default:
      return idx;
  }
}

}  // namespace kiln::sched

KILN_COLD_CODE_END
