#pragma once
// Constructors of primitive nodes. They check each primitive's invariants (inputs of equal
// shape and dtype for pointwise ops, valid axes, ...) and compute the node's hash and depth.
// Shape ops on realized inputs become strided views of the same storage (no copy) when the
// layout allows, as PyTorch's views do.
#include <algorithm>
#include <string>
#include <utility>

#include "kiln/ir/node.hpp"

namespace kiln::ir {

namespace detail {

inline std::uint64_t compute_local_hash(const Node& n) {
  std::uint64_t h = kiln::detail::hash_combine(static_cast<std::uint64_t>(n.op), static_cast<std::uint64_t>(n.dtype));
  h = kiln::detail::hash_combine(
      h, static_cast<std::uint64_t>(n.device.kind) * 131 + static_cast<std::uint64_t>(n.device.index));
  for (auto d : n.shape) h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(d));
  h = kiln::detail::hash_combine(h, n.shape.size());
  return kiln::detail::hash_combine(h, n.attrs.hash());
}

[[noreturn]] inline void invariant_failed(const std::string& what) {
  throw Error("kiln internal error (graph invariant): " + what);
}

}  // namespace detail

/// A node without attributes, hash or buffer yet.
inline Node blank(Op op, DType dtype, Device device, Shape shape, std::vector<NodePtr> inputs) {
  Node n;
  n.op = op;
  n.dtype = dtype;
  n.device = device;
  n.shape = std::move(shape);
  n.inputs = std::move(inputs);
  return n;
}

/// Records lazy `n` as a reader of the memory of each of its realized inputs (Storage::
/// lazy_readers), dropping entries that are gone or evaluated when a list grows.
inline void register_lazy_reader(const NodePtr& n) {
  const Storage* last = nullptr;
  for (const NodePtr& in : n->inputs) {
    if (!in->realized() || in->buffer->storage.get() == last) continue;
    Storage* s = in->buffer->storage.get();
    last = s;
    std::vector<NodePtr> released;  // destroyed after the lock is let go
    {
      std::lock_guard<std::mutex> lock(kiln::detail::storage_lock(s));
      std::vector<std::weak_ptr<Node>>& readers = s->lazy_readers;
      if (readers.size() >= 16 && readers.size() == readers.capacity())
        std::erase_if(readers, [&](const std::weak_ptr<Node>& w) {
          NodePtr p = w.lock();
          const bool gone = !p || p->realized();
          if (p) released.push_back(std::move(p));
          return gone;
        });
      readers.push_back(n);
    }
  }
}

/// Finishes a node: hash, depth. Every node is made through here.
inline NodePtr finish(Node n) {
  n.local_hash = detail::compute_local_hash(n);
  std::uint64_t h = n.local_hash;
  std::uint32_t depth = 0;
  std::uint64_t count = 1;
  for (auto& in : n.inputs) {
    h = kiln::detail::hash_combine(h, in->realized() ? leaf_hash(*in) : in->hash);
    depth = std::max(depth, in->realized() ? 1u : in->depth + 1);
    count += in->realized() ? 1u : in->count;
  }
  n.count = static_cast<std::uint32_t>(std::min<std::uint64_t>(count, 1u << 30));
  if (kiln::ir::detail::grad_mode() && is_floating(n.dtype))
    n.requires_grad = std::any_of(n.inputs.begin(), n.inputs.end(), [](const NodePtr& in) { return in->requires_grad; });
  if (n.op == Op::Input) h = kiln::detail::hash_combine(h, leaf_hash(n));
  n.hash = h;
  n.depth = depth;
  if (n.requires_grad)
    for (const NodePtr& in : n.inputs)
      if (in->realized()) n.saved_versions.emplace_back(in->buffer->storage.get(), in->buffer->storage->version);
  NodePtr out = std::make_shared<Node>(std::move(n));
  if (!out->realized()) register_lazy_reader(out);
  return out;
}

/// A realized leaf over `view` (the storage must hold every addressed element).
inline NodePtr input(BufferView view, Shape shape, DType dtype, Device device) {
  Node n = blank(Op::Input, dtype, device, std::move(shape), {});
  if (view.strides.size() != n.shape.size()) detail::invariant_failed("input strides rank");
  n.buffer = std::move(view);
  return finish(std::move(n));
}

/// Scalar `value` of `dtype` repeated over `shape`.
inline NodePtr constant(double value, DType dtype, Shape shape, Device device) {
  Node n = blank(Op::Constant, dtype, device, std::move(shape), {});
  // The value as a cast to `dtype` would give it (NaN -> true; NaN or out of range -> the
  // integer's minimum), so that full({3}, NAN, i32) equals full({3}, NAN).to(i32).
  if (is_floating(dtype))
    n.attrs.scalar = value;
  else if (dtype == DType::Bool)
    n.attrs.iscalar = value != 0.0;
  else if (dtype == DType::Int32)
    n.attrs.iscalar = kiln::detail::float_to_int<std::int32_t>(value);
  else
    n.attrs.iscalar = kiln::detail::float_to_int<std::int64_t>(value);
  return finish(std::move(n));
}

/// Exact integer constant (int64 values beyond 2^53 stay exact).
inline NodePtr constant_int(std::int64_t value, DType dtype, Shape shape, Device device) {
  Node n = blank(Op::Constant, dtype, device, std::move(shape), {});
  if (is_floating(dtype))
    n.attrs.scalar = static_cast<double>(value);
  else
    n.attrs.iscalar = dtype == DType::Bool ? (value != 0) : value;
  return finish(std::move(n));
}

inline NodePtr iota(Shape shape, std::int64_t axis, DType dtype, Device device) {
  Node n = blank(Op::Iota, dtype, device, std::move(shape), {});
  n.attrs.ints = {axis};
  return finish(std::move(n));
}

/// distribution: 0 uniform [0, 1), 1 standard normal.
inline NodePtr random(Shape shape, std::uint64_t seed, int distribution, DType dtype, Device device) {
  Node n = blank(Op::Random, dtype, device, std::move(shape), {});
  n.attrs.seed = seed;
  n.attrs.ints = {distribution};
  return finish(std::move(n));
}

/// The same with the seed read from `seed`, a 0-dim int64 node (its bits are the key): the
/// graph's structure no longer holds the seed, so every seed runs the same kernel.
inline NodePtr random(Shape shape, const NodePtr& seed, int distribution, DType dtype, Device device) {
  Node n = blank(Op::Random, dtype, device, std::move(shape), {seed});
  n.attrs.ints = {distribution};
  return finish(std::move(n));
}

inline NodePtr cast(const NodePtr& x, DType to) {
  if (x->dtype == to) return x;
  Node n = blank(Op::Cast, to, x->device, x->shape, {x});
  return finish(std::move(n));
}

/// Unary pointwise op; Not, IsNan, IsInf give Bool, the others keep the input's dtype.
inline NodePtr unary(Op op, const NodePtr& x) {
  if (op_kind(op) != OpKind::Unary || op == Op::Cast)
    detail::invariant_failed(std::string("not unary: ") + op_name(op));
  DType out = has_flag(op, kBoolResult) ? DType::Bool : x->dtype;
  Node n = blank(op, out, x->device, x->shape, {x});
  return finish(std::move(n));
}

/// Binary pointwise op on two nodes of equal shape and dtype.
inline NodePtr binary(Op op, const NodePtr& a, const NodePtr& b) {
  if (op_kind(op) != OpKind::Binary) detail::invariant_failed(std::string("not binary: ") + op_name(op));
  if (a->shape != b->shape || a->dtype != b->dtype)
    detail::invariant_failed(std::string(op_name(op)) + " inputs differ: " + a->shape.str() + " " +
                             dtype_name(a->dtype) + " vs " + b->shape.str() + " " + dtype_name(b->dtype));
  DType out = has_flag(op, kBoolResult) ? DType::Bool : a->dtype;
  Node n = blank(op, out, a->device, a->shape, {a, b});
  return finish(std::move(n));
}

inline NodePtr where(const NodePtr& cond, const NodePtr& a, const NodePtr& b) {
  if (cond->dtype != DType::Bool || cond->shape != a->shape || a->shape != b->shape || a->dtype != b->dtype)
    detail::invariant_failed("where inputs");
  Node n = blank(Op::Where, a->dtype, a->device, a->shape, {cond, a, b});
  return finish(std::move(n));
}

/// Reduction over `axes` (normalized, any order), reduced dims kept as size 1. Sum/Prod keep
/// the input dtype (the front end casts first); ArgMax/ArgMin give Int64.
inline NodePtr reduce(Op op, const NodePtr& x, std::vector<std::int64_t> axes) {
  if (!is_reduction(op)) detail::invariant_failed("not a reduction");
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  Shape out = x->shape;
  for (auto a : axes) {
    if (a < 0 || a >= static_cast<std::int64_t>(out.size())) detail::invariant_failed("reduce axis");
    out[a] = 1;
  }
  DType dt = (op == Op::ArgMax || op == Op::ArgMin) ? DType::Int64 : x->dtype;
  Node n = blank(op, dt, x->device, std::move(out), {x});
  n.attrs.ints = std::move(axes);
  return finish(std::move(n));
}

// ---- index maps -------------------------------------------------------------------------

/// A Constant (or Iota along a kept axis) needs no index map: rebuild it in the new shape.
inline NodePtr reshaped_constant(const NodePtr& x, const Shape& shape) {
  Node n = blank(Op::Constant, x->dtype, x->device, shape, {});
  n.attrs = x->attrs;
  return finish(std::move(n));
}

/// Whether gradients flowing from `x` are being recorded: then a shape op of x must be a node
/// of its own with x as its input (not a view of x's storage, not a rebuilt constant).
inline bool records_grad(const NodePtr& x) { return x->requires_grad && kiln::ir::detail::grad_mode(); }
/// Whether a shape op on realized `x` may be a view of its storage (a new leaf).
inline bool viewable(const NodePtr& x) { return x->realized() && !x->placeholder && !records_grad(x); }

/// View of a realized node with a new shape/offset/strides over the same storage.
inline NodePtr restride(const NodePtr& x, Shape shape, std::int64_t offset, Strides strides) {
  BufferView v{x->buffer->storage, offset, std::move(strides)};
  return input(std::move(v), std::move(shape), x->dtype, x->device);
}

/// Strides that view `old` (with `old_strides`) as `shape`, if the layout allows (PyTorch's rule).
inline std::optional<Strides> view_strides(const Shape& old, const Strides& old_strides, const Shape& shape) {
  Strides out(shape.size());
  if (old.numel() <= 1 || shape.numel() <= 1) return contiguous_strides(shape);
  std::int64_t view_d = static_cast<std::int64_t>(shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t tensor_d = static_cast<std::int64_t>(old.size()) - 1; tensor_d >= 0; tensor_d--) {
    tensor_numel *= old[tensor_d];
    if (tensor_d == 0 || (old[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

/// Where a shape op's result lies in its input's memory: an element offset and element strides.
struct StridedLayout {
  std::int64_t offset = 0;
  Strides strides;
};

/// The layout of shape op `op` (Broadcast, Reshape, Permute or Slice, with `attrs` as their
/// nodes hold them) applied to an input of shape `in` laid out as `at`, giving shape `out`;
/// nullopt for other ops and for a reshape that those strides cannot express. The one rule for
/// every strided view: a realized tensor's shape ops (shape_op_view) and the step planner's
/// reads and writes in place.
inline std::optional<StridedLayout> view_layout(Op op, const Attrs& attrs, const Shape& in, const StridedLayout& at,
                                                const Shape& out) {
  StridedLayout r = at;
  switch (op) {
    case Op::Broadcast:
      if (in.size() != out.size() || at.strides.size() != in.size()) return std::nullopt;
      for (std::size_t i = 0; i < out.size(); ++i)
        if (in[i] != out[i]) r.strides[i] = 0;
      return r;
    case Op::Reshape: {
      std::optional<Strides> st = view_strides(in, at.strides, out);
      if (!st) return std::nullopt;
      r.strides = std::move(*st);
      return r;
    }
    case Op::Permute: {
      const std::vector<std::int64_t>& perm = attrs.ints;
      if (perm.size() != at.strides.size()) return std::nullopt;
      for (std::size_t i = 0; i < perm.size(); ++i) r.strides[i] = at.strides[static_cast<std::size_t>(perm[i])];
      return r;
    }
    case Op::Slice: {
      const auto a = static_cast<std::size_t>(attrs.ints.at(0));
      const std::int64_t start = attrs.ints.at(1), step = attrs.ints.at(2);
      if (a >= at.strides.size()) return std::nullopt;
      if (out[a] > 0) r.offset += start * at.strides[a];
      r.strides[a] *= step;
      return r;
    }
    default:
      return std::nullopt;
  }
}

/// The strided view of realized x's storage that shape op `op` (with `attrs`) of x is, as a new
/// leaf of shape `out`; null where its layout allows none.
inline NodePtr shape_op_view(const NodePtr& x, Op op, const Attrs& attrs, Shape out) {
  std::optional<StridedLayout> l = view_layout(op, attrs, x->shape, {x->buffer->offset, x->buffer->strides}, out);
  if (!l) return nullptr;
  return restride(x, std::move(out), l->offset, std::move(l->strides));
}

/// Same rank; size-1 dims of x repeat to `shape`.
inline NodePtr broadcast(const NodePtr& x, const Shape& shape) {
  if (x->shape == shape) return x;
  if (x->shape.size() != shape.size()) detail::invariant_failed("broadcast rank");
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (x->shape[i] != shape[i] && x->shape[i] != 1) detail::invariant_failed("broadcast size");
  if (x->op == Op::Constant && !x->realized() && !records_grad(x)) return reshaped_constant(x, shape);
  if (viewable(x)) return shape_op_view(x, Op::Broadcast, {}, shape);
  Node n = blank(Op::Broadcast, x->dtype, x->device, shape, {x});
  return finish(std::move(n));
}

inline NodePtr reshape(const NodePtr& x, const Shape& shape) {
  if (x->shape == shape) return x;
  if (x->shape.numel() != shape.numel()) detail::invariant_failed("reshape numel");
  if (x->op == Op::Constant && !x->realized() && !records_grad(x)) return reshaped_constant(x, shape);
  if (viewable(x))
    if (NodePtr v = shape_op_view(x, Op::Reshape, {}, shape)) return v;
  Node n = blank(Op::Reshape, x->dtype, x->device, shape, {x});
  return finish(std::move(n));
}

/// Output dim i is input dim perm[i].
inline NodePtr permute(const NodePtr& x, const std::vector<std::int64_t>& perm) {
  bool identity = true;
  for (std::size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<std::int64_t>(i);
  if (identity) return x;
  // A permute of a lazy permute is one permute of its input (a transpose of a transpose, as
  // the gradient of a transposed weight makes, is the weight).
  if (!x->realized() && x->op == Op::Permute) {
    std::vector<std::int64_t> composed(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i)
      composed[i] = x->attrs.ints[static_cast<std::size_t>(perm[i])];
    return permute(x->inputs[0], composed);
  }
  Shape out(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) out[i] = x->shape[perm[i]];
  Node n = blank(Op::Permute, x->dtype, x->device, std::move(out), {x});
  n.attrs.ints = perm;
  if (viewable(x)) return shape_op_view(x, Op::Permute, n.attrs, n.shape);
  return finish(std::move(n));
}

/// Elements start, start+step, ... (`size` of them) along `axis`; start and size already clamped.
inline NodePtr slice(const NodePtr& x, std::int64_t axis, std::int64_t start, std::int64_t size, std::int64_t step) {
  if (start == 0 && step == 1 && size == x->shape[axis]) return x;
  Shape out = x->shape;
  out[axis] = size;
  Node n = blank(Op::Slice, x->dtype, x->device, std::move(out), {x});
  n.attrs.ints = {axis, start, step};
  // A reversal (step < 0, a flip) is a copy in PyTorch, not a view: it stays a node of its own,
  // which a graph reading it still reads in place (as_leaf_view).
  if (viewable(x) && step > 0) return shape_op_view(x, Op::Slice, n.attrs, n.shape);
  return finish(std::move(n));
}

/// The leaf view that the shape op `n` of a realized node amounts to (what the builders above
/// make when no gradient is recorded through it), or null. Capture folds such ops into its
/// leaves: a graph recorded for gradients (where x's transpose is a node, so that the
/// gradient flows back through it) then reads a weight's transpose in place, as a product's
/// transposed operand, instead of copying it first.
inline NodePtr as_leaf_view(const Node& n) {
  if (n.realized() || n.inputs.size() != 1) return nullptr;
  const NodePtr& x = n.inputs[0];
  if (!x->realized() || x->placeholder) return nullptr;
  return shape_op_view(x, n.op, n.attrs, n.shape);
}

/// x reversed along `axis` (a slice of step -1; fused by the kernel that reads it).
inline NodePtr flip(const NodePtr& x, std::int64_t axis) {
  const std::int64_t n = x->shape[static_cast<std::size_t>(axis)];
  if (n <= 1) return x;
  return slice(x, axis, n - 1, n, -1);
}

/// Inputs of one dtype and rank, equal except along `axis`.
inline NodePtr concat(const std::vector<NodePtr>& xs, std::int64_t axis) {
  if (xs.empty()) detail::invariant_failed("concat of nothing");
  if (xs.size() == 1) return xs[0];
  Shape out = xs[0]->shape;
  out[axis] = 0;
  for (auto& x : xs) out[axis] += x->shape[axis];
  Node n = blank(Op::Concat, xs[0]->dtype, xs[0]->device, std::move(out), xs);
  n.attrs.ints = {axis};
  return finish(std::move(n));
}

/// x read where `index` (Int64, x's rank) says along `axis`: out[p] = x[p with p[axis] =
/// index[p]], of index's shape; x's other dims are at least index's (the front end checks).
/// `site` names the user-facing op in range errors (GatherSite).
inline NodePtr gather(const NodePtr& x, const NodePtr& index, std::int64_t axis, GatherSite site) {
  const std::size_t r = x->shape.size();
  if (index->dtype != DType::Int64 || index->shape.size() != r || axis < 0 || axis >= static_cast<std::int64_t>(r) ||
      !(x->device == index->device))
    detail::invariant_failed("gather of " + x->shape.str() + " by " + index->shape.str());
  for (std::size_t d = 0; d < r; ++d)
    if (static_cast<std::int64_t>(d) != axis && index->shape[d] > x->shape[d])
      detail::invariant_failed("gather index " + index->shape.str() + " larger than " + x->shape.str());
  if (x->shape[static_cast<std::size_t>(axis)] == 0 && index->shape.numel() > 0)
    detail::invariant_failed("gather from an empty dim of " + x->shape.str());
  // Nothing to read: no index is looked at (a kernel over an empty space may still hoist the
  // index's load out of its loops).
  if (index->shape.numel() == 0) return constant(0.0, x->dtype, index->shape, x->device);
  Node n = blank(Op::Gather, x->dtype, x->device, index->shape, {x, index});
  n.attrs.ints = {axis, static_cast<std::int64_t>(site)};
  return finish(std::move(n));
}

/// base with src written (`accumulate`: added) where `index` (Int64, src's shape, base's rank)
/// says along `axis`, in index order; `atomic`: accumulation in any order (faster on a GPU, not
/// deterministic). `site` names the user-facing op in range errors.
inline NodePtr scatter(const NodePtr& base, const NodePtr& index, const NodePtr& src, std::int64_t axis,
                       bool accumulate, bool atomic, GatherSite site) {
  const std::size_t r = base->shape.size();
  if (index->dtype != DType::Int64 || index->shape.size() != r || src->shape != index->shape ||
      src->dtype != base->dtype || axis < 0 || axis >= static_cast<std::int64_t>(r) || !(base->device == index->device) ||
      !(base->device == src->device))
    detail::invariant_failed("scatter into " + base->shape.str() + " by " + index->shape.str() + " of " +
                             src->shape.str());
  for (std::size_t d = 0; d < r; ++d)
    if (static_cast<std::int64_t>(d) != axis && index->shape[d] > base->shape[d])
      detail::invariant_failed("scatter index " + index->shape.str() + " larger than " + base->shape.str());
  Node n = blank(Op::Scatter, base->dtype, base->device, base->shape, {base, index, src});
  n.attrs.ints = {axis, accumulate ? 1 : 0, atomic ? 1 : 0, static_cast<std::int64_t>(site)};
  return finish(std::move(n));
}

/// The running `kind` of x along `axis` (ScanKind), of dtype `out`.
inline NodePtr scan(const NodePtr& x, std::int64_t axis, ScanKind kind, DType out) {
  if (axis < 0 || axis >= static_cast<std::int64_t>(x->shape.size()))
    detail::invariant_failed("scan of " + x->shape.str() + " along " + std::to_string(axis));
  Node n = blank(Op::Scan, out, x->device, x->shape, {x});
  n.attrs.ints = {axis, static_cast<std::int64_t>(kind)};
  return finish(std::move(n));
}

/// The int64 positions along `axis` of x's `k` first elements in sorted order: largest first
/// when `descending`, else smallest first (NaN the largest, equal values by position).
inline NodePtr sort(const NodePtr& x, std::int64_t axis, std::int64_t k, bool descending) {
  if (axis < 0 || axis >= static_cast<std::int64_t>(x->shape.size()) || k < 0 ||
      k > x->shape[static_cast<std::size_t>(axis)])
    detail::invariant_failed("sort of " + x->shape.str() + " along " + std::to_string(axis) + " keeping " +
                             std::to_string(k));
  Shape out = x->shape;
  out[static_cast<std::size_t>(axis)] = k;
  Node n = blank(Op::Sort, DType::Int64, x->device, std::move(out), {x});
  n.attrs.ints = {axis, k, descending ? 1 : 0};
  return finish(std::move(n));
}

/// Matrix product a [..., M, K] x b [..., K, N] -> [..., M, N]: equal ranks >= 2, equal batch
/// dims (the front end broadcasts them first), one dtype.
inline NodePtr matmul(const NodePtr& a, const NodePtr& b) {
  const std::size_t r = a->shape.size();
  if (r < 2 || b->shape.size() != r || a->shape[r - 1] != b->shape[r - 2] || a->dtype != b->dtype ||
      !(a->device == b->device))
    detail::invariant_failed("matmul of " + a->shape.str() + " and " + b->shape.str());
  for (std::size_t d = 0; d + 2 < r; ++d)
    if (a->shape[d] != b->shape[d]) detail::invariant_failed("matmul batch dims " + a->shape.str() + " " + b->shape.str());
  Shape out = a->shape;
  out[r - 1] = b->shape[r - 1];
  return finish(blank(Op::MatMul, a->dtype, a->device, std::move(out), {a, b}));
}

/// Dropout inside a fused attention (see Op::Attention): probability `p` (0: none) and the
/// Philox key, a 0-dim int64 node.
struct AttentionDropout {
  double p = 0.0;
  NodePtr seed;
};

/// One value (`role`) of fused attention over q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev]
/// (see Op::Attention): `grads` are {out, dout, lse} for the gradient roles, empty for Out and
/// Lse; `mask` an additive [B|1, H|1, L, S] mask or null.
inline NodePtr attention(AttentionRole role, const NodePtr& q, const NodePtr& k, const NodePtr& v, const NodePtr& mask,
                         bool causal, double scale, const std::vector<NodePtr>& grads = {},
                         const AttentionDropout& dropout = {}) {
  auto bad = [&](const std::string& why) {
    detail::invariant_failed("attention of " + q->shape.str() + ", " + k->shape.str() + ", " + v->shape.str() + ": " +
                             why);
  };
  if (q->shape.size() != 4 || k->shape.size() != 4 || v->shape.size() != 4) bad("not rank 4");
  const std::int64_t B = q->shape[0], H = q->shape[1], L = q->shape[2], E = q->shape[3];
  const std::int64_t Hkv = k->shape[1], S = k->shape[2], Ev = v->shape[3];
  if (k->shape[0] != B || v->shape[0] != B || v->shape[1] != Hkv || v->shape[2] != S || k->shape[3] != E ||
      (Hkv == 0 ? H != 0 : H % Hkv != 0))
    bad("shapes do not match");
  if (k->dtype != q->dtype || v->dtype != q->dtype || !is_floating(q->dtype)) bad("dtypes");
  if (mask && (mask->shape.size() != 4 || (mask->shape[0] != 1 && mask->shape[0] != B) ||
               (mask->shape[1] != 1 && mask->shape[1] != H) || mask->shape[2] != L || mask->shape[3] != S ||
               !is_floating(mask->dtype)))
    bad("mask " + mask->shape.str());
  if (dropout.p != 0.0 && (!(dropout.p > 0.0 && dropout.p < 1.0) || !dropout.seed ||
                           dropout.seed->dtype != DType::Int64 || !dropout.seed->shape.empty()))
    bad("dropout (p in (0, 1) with a 0-dim int64 key)");
  AttentionAttrs attrs;
  attrs.role = role;
  attrs.causal = causal;
  attrs.has_mask = mask != nullptr;
  attrs.dropout_p = dropout.p;
  if (grads.size() != (attrs.gradient() ? 3u : 0u)) bad("gradient operands");
  std::vector<NodePtr> in{q, k, v};
  for (const auto& g : grads) in.push_back(g);
  if (mask) in.push_back(mask);
  if (attrs.has_dropout()) in.push_back(dropout.seed);
  Shape out;
  DType dt = q->dtype;
  switch (role) {
    case AttentionRole::Out:
      out = Shape{B, H, L, Ev};
      break;
    case AttentionRole::Lse:
      out = Shape{B, H, L};
      dt = q->dtype == DType::Float64 ? DType::Float64 : DType::Float32;
      break;
    case AttentionRole::DQ:
      out = q->shape;
      break;
    case AttentionRole::DK:
      out = k->shape;
      break;
    case AttentionRole::DV:
      out = v->shape;
      break;
  }
  Node n = blank(Op::Attention, dt, q->device, std::move(out), std::move(in));
  n.attrs.ints = attrs.ints();
  n.attrs.scalar = scale;
  return finish(std::move(n));
}

/// The gradients {dq, dk, dv} of attention output `out` (the Out node over q, k, v, mask, with
/// `dropout`) given its incoming gradient `g` and the rows' log-sum-exp `lse`: one backward call
/// when planned.
inline std::vector<NodePtr> attention_gradients(const NodePtr& q, const NodePtr& k, const NodePtr& v,
                                                const NodePtr& mask, bool causal, double scale, const NodePtr& out,
                                                const NodePtr& g, const NodePtr& lse,
                                                const AttentionDropout& dropout = {}) {
  const std::vector<NodePtr> saved{out, g->dtype == out->dtype ? g : cast(g, out->dtype), lse};
  return {attention(AttentionRole::DQ, q, k, v, mask, causal, scale, saved, dropout),
          attention(AttentionRole::DK, q, k, v, mask, causal, scale, saved, dropout),
          attention(AttentionRole::DV, q, k, v, mask, causal, scale, saved, dropout)};
}

}  // namespace kiln::ir
