#pragma once
// Shapes and masks built from views, concatenation and pointwise primitives (so they fuse
// with what reads them): stack, flip, roll, repeat, pad, tril, triu, one_hot, masked_fill,
// block_diag, diag_embed, diagflat, dstack, column_stack, cartesian_prod, vander.
// PyTorch's names, argument orders and dtype rules.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

namespace detail {

KILN_ENTRY std::string ints_str(const std::vector<std::int64_t>& v);

/// Normalised, unique axes of `t` for `op` (ShapeError when out of range or repeated).
KILN_ENTRY std::vector<std::int64_t> distinct_axes(const std::vector<std::int64_t>& dims, const Tensor& t,
                                                   const char* op);

/// x reversed along axis a (a view-like slice with step -1; fused by the kernel that reads it).
inline ir::NodePtr flip_node(const ir::NodePtr& x, std::int64_t a) { return ir::flip(x, a); }

/// A 2-D mask over the last two dims of `shape`: keep (i, j) where j - i <= k (lower) or
/// j - i >= k (upper), broadcast over the leading dims.
KILN_ENTRY ir::NodePtr triangle_mask(const Shape& shape, std::int64_t k, bool lower, Device device);

KILN_ENTRY Tensor triangle(const Tensor& t, std::int64_t k, bool lower, const char* op);

/// where(mask, value, t) for masked_fill: `value` already a node of t's dtype and shape.
KILN_ENTRY Tensor masked_fill_with(const Tensor& t, const Tensor& mask, const ir::NodePtr& value);

}  // namespace detail

/// Joins tensors of one shape along a new dimension `axis` (in [-dim()-1, dim()]), as torch.stack;
/// dtypes promote.
KILN_ENTRY Tensor stack(const std::vector<Tensor>& xs, std::int64_t axis = 0);

/// Reverses the order of elements along each of `dims`, as torch.flip.
template <class E>
requires TensorLike<E> Tensor flip(const E& x, const std::vector<std::int64_t>& dims) {
  Tensor t = detail::to_tensor(x);
  const std::vector<std::int64_t> axes = detail::distinct_axes(dims, t, "flip");
  ir::NodePtr n = t.node();
  if (t.dim() > 0)
    for (auto a : axes) n = detail::flip_node(n, a);
  // A copy, as PyTorch's flip (never a view of x's memory, even where nothing moves).
  if (n == t.node() || n->realized()) n = detail::identity_node(n);
  return Tensor(n);
}

/// Reverses one dim (flip(x, {dim})).
template <class E>
requires TensorLike<E> Tensor flip(const E& x, std::int64_t dim) { return flip(x, std::vector<std::int64_t>{dim}); }

/// Rolls elements along `dims` by `shifts` (elements leaving one end come back at the other);
/// with no dims, the flattened tensor is rolled and its shape restored, as torch.roll.
template <class E>
requires TensorLike<E> Tensor roll(const E& x, const std::vector<std::int64_t>& shifts,
                                   const std::vector<std::int64_t>& dims = {}) {
  Tensor t = detail::to_tensor(x);
  if (dims.empty()) {
    if (shifts.size() != 1)
      throw ShapeError("roll: without dims, expected one shift, got " + detail::ints_str(shifts) + " for input " +
                       detail::describe(t));
    Tensor flat = reshape(t, Shape{t.numel()});
    return reshape(roll(flat, shifts, {0}), t.shape());
  }
  if (shifts.size() != dims.size())
    throw ShapeError("roll: shifts " + detail::ints_str(shifts) + " and dims " + detail::ints_str(dims) +
                     " differ in length for input " + detail::describe(t));
  Tensor out = t;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t a = detail::tensor_axis(dims[i], t, "roll");
    const std::int64_t n = t.dim() == 0 ? 1 : t.shape()[static_cast<std::size_t>(a)];
    if (n == 0 || t.dim() == 0) continue;
    const std::int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    out = concat({slice(out, a, n - s, n), slice(out, a, 0, n - s)}, a);
  }
  return out;
}

/// Rolls one dim by `shift` (roll(x, {shift}, {dim})).
template <class E>
requires TensorLike<E> Tensor roll(const E& x, std::int64_t shift, std::int64_t dim) {
  return roll(x, std::vector<std::int64_t>{shift}, std::vector<std::int64_t>{dim});
}

/// Rolls the flattened tensor by `shift`, shape restored (torch.roll(x, shift)).
template <class E>
requires TensorLike<E> Tensor roll(const E& x, std::int64_t shift) { return roll(x, std::vector<std::int64_t>{shift}); }

/// Tiles the tensor `repeats[d]` times along each dim (more repeats than dims add leading
/// dims), as torch.Tensor.repeat.
template <class E>
requires TensorLike<E> Tensor repeat(const E& x, const std::vector<std::int64_t>& repeats) {
  Tensor t = detail::to_tensor(x);
  if (repeats.size() < static_cast<std::size_t>(t.dim()))
    throw ShapeError("repeat: the number of repeats " + detail::ints_str(repeats) +
                     " can not be smaller than the number of dimensions of " + detail::describe(t));
  for (auto r : repeats)
    if (r < 0) throw ShapeError("repeat: negative repeat " + detail::ints_str(repeats) + " for " + detail::describe(t));
  Shape in = t.shape();
  in.insert(in.begin(), repeats.size() - in.size(), 1);
  // [r0, s0, r1, s1, ...]: each input dim behind a new dim broadcast to its repeat count.
  Shape split, wide, out;
  for (std::size_t d = 0; d < in.size(); ++d) {
    split.push_back(1);
    split.push_back(in[d]);
    wide.push_back(repeats[d]);
    wide.push_back(in[d]);
    std::int64_t o = 0;
    if (__builtin_mul_overflow(repeats[d], in[d], &o))
      throw ShapeError("repeat: the result's size overflows int64 for " + detail::describe(t) + " and repeats " +
                       detail::ints_str(repeats));
    out.push_back(o);
  }
  checked_numel(out, "repeat");
  ir::NodePtr n = ir::reshape(ir::broadcast(ir::reshape(t.node(), split), wide), out);
  // A copy, as PyTorch's repeat (a view of x's memory would alias it, or repeat its elements).
  if (n == t.node() || n->realized()) n = detail::identity_node(n);
  return Tensor(n);
}

/// The lower triangle of the last two dims (elements with j - i <= k), the rest 0, as torch.tril.
template <class E>
requires TensorLike<E> Tensor tril(const E& x, std::int64_t k = 0) {
  return detail::triangle(detail::to_tensor(x), k, true, "tril");
}

/// The upper triangle of the last two dims (elements with j - i >= k), the rest 0, as torch.triu.
template <class E>
requires TensorLike<E> Tensor triu(const E& x, std::int64_t k = 0) {
  return detail::triangle(detail::to_tensor(x), k, false, "triu");
}

namespace detail {
/// ValueError unless `value` converts to t's dtype without overflow, as PyTorch's scalar check:
/// integers take finite values within their range, f16/bf16 finite values within theirs (the
/// infinities and NaN pass), bool and the wider floats anything.
KILN_ENTRY void check_fill_value(double value, const Tensor& t, const char* op);
}  // namespace detail

/// `value` where `mask` is true, else x (mask broadcasts to x's shape; value is cast to x's
/// dtype as `to` casts), as torch.Tensor.masked_fill.
template <class E>
requires TensorLike<E> Tensor masked_fill(const E& x, const Tensor& mask, double value) {
  Tensor t = detail::to_tensor(x);
  detail::check_fill_value(value, t, "masked_fill");
  return detail::masked_fill_with(t, mask, ir::constant(value, t.dtype(), t.shape(), t.device()));
}

/// masked_fill with a 0-dim tensor `value` (cast to x's dtype), as torch's Tensor overload.
template <class E>
requires TensorLike<E> Tensor masked_fill(const E& x, const Tensor& mask, const Tensor& value) {
  Tensor t = detail::to_tensor(x);
  Tensor v = detail::to_tensor(value);
  if (v.dim() != 0)
    throw ShapeError("masked_fill: only supports a 0-dimensional value tensor, got " + detail::describe(v) +
                     " for input " + detail::describe(t));
  detail::check_same_device(t.device(), v.device(), "masked_fill");
  return detail::masked_fill_with(t, mask, broadcast_to(v.to(t.dtype()), t.shape()).node());
}

/// int64 one-hot rows of `num_classes` entries for an integer `index` of any shape (result
/// [..., num_classes]), as torch.nn.functional.one_hot. Indices outside [0, num_classes) give an
/// IndexError when the index is in host memory; otherwise their rows are all zeros.
/// num_classes = -1 reads the index for its maximum + 1 (a synchronisation).
KILN_ENTRY Tensor one_hot(const Tensor& index, std::int64_t num_classes = -1);

/// Pads the last dims: `pads` holds (before, after) pairs starting from the last dim, as
/// torch.nn.functional.pad. mode "constant" fills `value` (negative pads crop), "reflect"
/// mirrors without repeating the edge, "replicate" repeats the edge, "circular" wraps around.
template <class E>
requires TensorLike<E> Tensor pad(const E& x, const std::vector<std::int64_t>& pads,
                                  const std::string& mode = "constant", double value = 0.0) {
  Tensor t = detail::to_tensor(x);
  if (pads.size() % 2 != 0 || pads.size() / 2 > static_cast<std::size_t>(t.dim()))
    throw ShapeError("pad: expected (before, after) pairs for at most " + std::to_string(t.dim()) + " dims, got " +
                     detail::ints_str(pads) + " for " + detail::describe(t));
  if (mode != "constant" && mode != "reflect" && mode != "replicate" && mode != "circular")
    throw ValueError("pad: mode must be \"constant\", \"reflect\", \"replicate\" or \"circular\", got \"" + mode +
                     "\"");
  Tensor out = t;
  for (std::size_t p = 0; p < pads.size() / 2; ++p) {
    const std::int64_t a = t.dim() - 1 - static_cast<std::int64_t>(p);
    std::int64_t before = pads[2 * p], after = pads[2 * p + 1];
    const std::int64_t n = out.shape()[static_cast<std::size_t>(a)];
    if (mode != "constant") {
      const bool reflect = mode == "reflect";
      if (before < 0 || after < 0 || (reflect && (before >= n || after >= n)) || (!reflect && n == 0) ||
          (mode == "circular" && (before > n || after > n)))
        throw ShapeError("pad: " + mode + " padding " + detail::ints_str(pads) + " does not fit dim " +
                         std::to_string(a) + " of " + detail::describe(t));
    }
    if (before < 0) out = slice(out, a, -before, n), before = 0;
    const std::int64_t m = out.shape()[static_cast<std::size_t>(a)];
    if (after < 0) out = slice(out, a, 0, std::max<std::int64_t>(0, m + after)), after = 0;
    if (before == 0 && after == 0) continue;
    const std::int64_t len = out.shape()[static_cast<std::size_t>(a)];
    auto filler = [&](std::int64_t count, bool front) -> Tensor {
      if (mode == "constant") {
        Shape s = out.shape();
        s[static_cast<std::size_t>(a)] = count;
        return full(s, value, out.dtype(), out.device());
      }
      if (mode == "replicate") {
        Tensor edge = front ? slice(out, a, 0, 1) : slice(out, a, len - 1, len);
        Shape s = out.shape();
        s[static_cast<std::size_t>(a)] = count;
        return broadcast_to(edge, s);
      }
      if (mode == "circular") return front ? slice(out, a, len - count, len) : slice(out, a, 0, count);
      // reflect: the `count` elements next to the edge, mirrored.
      Tensor part = front ? slice(out, a, 1, 1 + count) : slice(out, a, len - 1 - count, len - 1);
      return flip(part, {a});
    };
    std::vector<Tensor> parts;
    if (before > 0) parts.push_back(filler(before, true));
    parts.push_back(out);
    if (after > 0) parts.push_back(filler(after, false));
    out = concat(parts, a);
  }
  return out;
}

/// Constant padding with `value` (pad(x, pads, "constant", value)).
template <class E>
requires TensorLike<E> Tensor pad(const E& x, const std::vector<std::int64_t>& pads, double value) {
  return pad(x, pads, "constant", value);
}

/// The tensors as blocks along the diagonal of a matrix, zeros elsewhere (torch.block_diag): a
/// 0-dim tensor is a 1 x 1 block, a 1-D one a single row; the dtype is torch.result_type over
/// the inputs. No inputs give an empty float32 [1, 0]. ShapeError for a tensor of more than 2 dims.
KILN_ENTRY Tensor block_diag(const std::vector<Tensor>& tensors);

/// A tensor whose diagonals `offset` over the new dims dim1 and dim2 (of the result, which has
/// one dim more than the input) hold the input's last dim, zeros elsewhere (torch.diag_embed):
/// the last dim of size n becomes two dims of size n + |offset|. ShapeError for a 0-dim input,
/// dims out of range or equal.
KILN_ENTRY Tensor diag_embed(const Tensor& input, std::int64_t offset = 0, std::int64_t dim1 = -2,
                             std::int64_t dim2 = -1);

/// The square matrix with the flattened input on its diagonal `offset` (torch.diagflat).
KILN_ENTRY Tensor diagflat(const Tensor& input, std::int64_t offset = 0);

/// The tensors joined along a third dim (torch.dstack): each made at least 3-D first ([] ->
/// [1, 1, 1], [n] -> [1, n, 1], [m, n] -> [m, n, 1]); dtypes promote as cat's. ValueError for no
/// tensors, ShapeError for sizes that differ outside the third dim.
KILN_ENTRY Tensor dstack(const std::vector<Tensor>& tensors);

/// The tensors as columns (torch.column_stack): 0-dim and 1-D ones become [numel, 1], then all
/// are joined along dim 1; dtypes promote as cat's. ValueError for no tensors, ShapeError for
/// row counts that differ.
KILN_ENTRY Tensor column_stack(const std::vector<Tensor>& tensors);

/// Every combination of one element from each 1-D tensor, in itertools.product's order, as the
/// rows of an [n0 * n1 * ..., count] tensor (torch.cartesian_prod); one tensor comes back as
/// itself. The tensors must share one dtype (DTypeError otherwise, as torch's meshgrid);
/// ValueError for no tensors, ShapeError for one that is not 1-D.
KILN_ENTRY Tensor cartesian_prod(const std::vector<Tensor>& tensors);

/// The Vandermonde matrix of the 1-D x (torch.vander, not torch.linalg.vander): N columns
/// (x's length when omitted) of the powers x^(N-1), ..., x^1, x^0, or increasing from x^0. The
/// powers are running products, as torch's cumprod; integer and bool inputs give int64.
/// ShapeError unless x is 1-D, ValueError for a negative N.
KILN_ENTRY Tensor vander(const Tensor& x, std::optional<std::int64_t> N = std::nullopt, bool increasing = false);

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/shape_ops_impl.hpp"
#endif
