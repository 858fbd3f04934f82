#pragma once
// Reductions, shape ops and composites: they return lazy Tensors (graph nodes).
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/decomp/decompose.hpp"
#include "kiln/tensor/ops.hpp"

namespace kiln {

namespace detail {

template <class E>
Tensor to_tensor(const E& e) {
  if constexpr (std::is_base_of_v<Tensor, E>) {
    if (!e.defined()) throw Error("operation on an undefined Tensor (default-constructed)");
    return e;
  } else {
    return Tensor(e);
  }
}

inline std::string describe(const Tensor& t) { return std::string(dtype_name(t.dtype())) + t.shape().str(); }

/// The input of one of autocast's float32 ops (sum, prod, softmax, log_softmax, logsumexp,
/// layer_norm, rms_norm, cross_entropy, cumsum, cumprod): f16/bf16 as float32 while autocast is
/// on for its device (tensor/autocast.hpp), else unchanged.
template <class E>
Tensor fp32_operand(const E& e) {
  return autocast_cast(to_tensor(e), AutocastClass::Fp32);
}

/// Maps a possibly negative axis of `t` into [0, rank) (0 and -1 for a 0-dim tensor) or throws
/// ShapeError naming `op`, the axis, t's shape and dtype.
KILN_ENTRY std::int64_t tensor_axis(std::int64_t axis, const Tensor& t, const char* op);

/// Normalized, sorted, unique axes of `t`; `{}` means all. Throws ShapeError naming `op`.
KILN_ENTRY std::vector<std::int64_t> reduce_axes(const Axes& axes, const Tensor& t, const char* op);

KILN_ENTRY Shape reduced_shape(const Shape& shape, const std::vector<std::int64_t>& axes, bool keepdim);

/// Drops the kept dims of a keepdim reduction result unless keepdim.
KILN_ENTRY Tensor finish_reduce(const ir::NodePtr& kept, const Shape& in_shape, const std::vector<std::int64_t>& axes,
                                bool keepdim);

KILN_ENTRY void require_float(const Tensor& t, const char* op);

KILN_ENTRY void require_nonempty_reduction(const Tensor& t, const std::vector<std::int64_t>& axes, const char* op);

}  // namespace detail

// ---- reductions ---------------------------------------------------------------------------

/// Sum over `axes` (all when omitted). Integer and bool inputs sum in int64 (as PyTorch).
template <class E>
requires TensorLike<E> Tensor sum(const E& x, const Axes& axes = {}, bool keepdim = false) {
  Tensor t = detail::fp32_operand(x);
  auto ax = detail::reduce_axes(axes, t, "sum");
  ir::NodePtr n = t.node();
  if (!is_floating(n->dtype)) n = ir::cast(n, DType::Int64);
  return detail::finish_reduce(ir::reduce(ir::Op::ReduceSum, n, ax), t.shape(), ax, keepdim);
}

/// Product over `axes`. Integer and bool inputs multiply in int64.
template <class E>
requires TensorLike<E> Tensor prod(const E& x, const Axes& axes = {}, bool keepdim = false) {
  Tensor t = detail::fp32_operand(x);
  auto ax = detail::reduce_axes(axes, t, "prod");
  ir::NodePtr n = t.node();
  if (!is_floating(n->dtype)) n = ir::cast(n, DType::Int64);
  return detail::finish_reduce(ir::reduce(ir::Op::ReduceProd, n, ax), t.shape(), ax, keepdim);
}

/// Arithmetic mean over `axes` (floating inputs only, as PyTorch).
template <class E>
requires TensorLike<E> Tensor mean(const E& x, const Axes& axes = {}, bool keepdim = false) {
  Tensor t = detail::to_tensor(x);
  detail::require_float(t, "mean");
  auto ax = detail::reduce_axes(axes, t, "mean");
  return detail::finish_reduce(decomp::mean_keep(t.node(), ax), t.shape(), ax, keepdim);
}

/// Largest value over `axes` (NaN propagates). ShapeError on an empty reduction.
template <class E>
requires TensorLike<E> Tensor max(const E& x, const Axes& axes = {}, bool keepdim = false) {
  Tensor t = detail::to_tensor(x);
  auto ax = detail::reduce_axes(axes, t, "max");
  detail::require_nonempty_reduction(t, ax, "max");
  return detail::finish_reduce(ir::reduce(ir::Op::ReduceMax, t.node(), ax), t.shape(), ax, keepdim);
}

/// Smallest value over `axes` (NaN propagates). ShapeError on an empty reduction.
template <class E>
requires TensorLike<E> Tensor min(const E& x, const Axes& axes = {}, bool keepdim = false) {
  Tensor t = detail::to_tensor(x);
  auto ax = detail::reduce_axes(axes, t, "min");
  detail::require_nonempty_reduction(t, ax, "min");
  return detail::finish_reduce(ir::reduce(ir::Op::ReduceMin, t.node(), ax), t.shape(), ax, keepdim);
}

/// Largest value over `axes` (torch.amax): the same as max over axes, under PyTorch's name.
template <class E>
requires TensorLike<E> Tensor amax(const E& x, const Axes& axes = {}, bool keepdim = false) {
  return max(x, axes, keepdim);
}

/// Smallest value over `axes` (torch.amin).
template <class E>
requires TensorLike<E> Tensor amin(const E& x, const Axes& axes = {}, bool keepdim = false) {
  return min(x, axes, keepdim);
}

/// The values and the int64 indices of a selection along one dim, as torch.max(x, dim) returns
/// them: `auto [values, indices] = max(x, 1);`, `std::get<1>(max(x, 1))`,
/// `std::tie(v, i) = min(x, 0, true)`. It is also the values Tensor itself, so `max(x, 1) + 1`
/// and `Tensor m = max(x, 1);` keep meaning the maxima.
struct ValuesIndices : Tensor, std::tuple<Tensor, Tensor> {
  ValuesIndices(Tensor values, Tensor indices) : Tensor(values), std::tuple<Tensor, Tensor>(values, indices) {}
  /// The selected values (torch's `.values`).
  const Tensor& values() const { return std::get<0>(static_cast<const std::tuple<Tensor, Tensor>&>(*this)); }
  /// Their positions along the dim, int64 (torch's `.indices`).
  const Tensor& indices() const { return std::get<1>(static_cast<const std::tuple<Tensor, Tensor>&>(*this)); }
};

namespace detail {
/// max or min along one dim with the position of the first extreme (a NaN counts as the
/// extreme, as torch.max(x, dim)); bool inputs take their positions from an int32 copy.
template <class E>
ValuesIndices select_along(const E& x, std::int64_t dim, bool keepdim, bool largest) {
  const char* op = largest ? "max" : "min";
  Tensor t = to_tensor(x);
  auto ax = reduce_axes(Axes{dim}, t, op);
  require_nonempty_reduction(t, ax, op);
  if (ax.empty())  // a 0-dim input: the value itself at position 0
    return {t, Tensor(ir::constant_int(0, DType::Int64, t.shape(), t.device()))};
  Tensor values =
      finish_reduce(ir::reduce(largest ? ir::Op::ReduceMax : ir::Op::ReduceMin, t.node(), ax), t.shape(), ax, keepdim);
  ir::NodePtr keyed = t.dtype() == DType::Bool ? ir::cast(t.node(), DType::Int32) : t.node();
  const ir::NodePtr position = ir::reduce(largest ? ir::Op::ArgMax : ir::Op::ArgMin, keyed, ax);
  Tensor indices = finish_reduce(position, t.shape(), ax, keepdim);
  // torch's rule along a dim: the whole gradient to the position returned (amax's splits it
  // among equal values).
  const ir::NodePtr xn = t.node();
  const std::int64_t axis = ax[0];
  decomp::with_gradient(values.node(), {xn}, [xn, position, axis](const ir::NodePtr&, const ir::NodePtr& g) {
    const Shape& s = xn->shape;
    const ir::NodePtr picked =
        ir::binary(ir::Op::Eq, ir::iota(s, axis, DType::Int64, xn->device), ir::broadcast(position, s));
    const ir::NodePtr spread = ir::broadcast(ir::reshape(g, position->shape), s);
    return std::vector<ir::NodePtr>{ir::where(picked, spread, ir::constant(0.0, g->dtype, s, xn->device))};
  });
  return {values, indices};
}
}  // namespace detail

/// The maxima along `dim` and their int64 indices (the first maximum; a NaN counts as the
/// maximum), as torch.max(x, dim, keepdim). Over several dims or all of them use
/// `max(x, Axes{...})` or `amax`, which give the values alone. (An int dim converts to this
/// overload's int64 before it would to Axes, so `max(x, 1)` lands here.)
template <class E>
requires TensorLike<E> ValuesIndices max(const E& x, std::int64_t dim, bool keepdim = false) {
  return detail::select_along(x, dim, keepdim, true);
}

/// The minima along `dim` and their int64 indices, as torch.min(x, dim, keepdim).
template <class E>
requires TensorLike<E> ValuesIndices min(const E& x, std::int64_t dim, bool keepdim = false) {
  return detail::select_along(x, dim, keepdim, false);
}

namespace detail {
template <class E>
Tensor arg_reduce(const E& x, const Axes& axes, bool keepdim, ir::Op op, const char* name) {
  Tensor t = detail::to_tensor(x);
  if (axes.axes.size() > 1)
    throw ShapeError(std::string(name) + ": expects one axis or none, got " + std::to_string(axes.axes.size()) +
                     " for input " + describe(t));
  if (t.dtype() == DType::Bool)
    throw DTypeError(std::string(name) + ": not supported for bool tensors, got " + describe(t));
  if (axes.axes.empty()) {  // over the flattened tensor
    if (t.numel() == 0) throw ShapeError(std::string(name) + ": cannot reduce an empty tensor " + describe(t));
    ir::NodePtr flat = ir::reshape(t.node(), Shape{t.numel()});
    ir::NodePtr r = ir::reduce(op, flat, {0});
    return Tensor(ir::reshape(r, keepdim ? Shape(t.shape().size(), 1) : Shape{}));
  }
  auto ax = detail::reduce_axes(axes, t, name);
  detail::require_nonempty_reduction(t, ax, name);
  if (ax.empty()) return Tensor(ir::constant_int(0, DType::Int64, t.shape(), t.device()));  // 0-dim input
  return detail::finish_reduce(ir::reduce(op, t.node(), ax), t.shape(), ax, keepdim);
}
}  // namespace detail

/// Index of the largest value (first on ties; a NaN counts as largest), over one axis or flattened.
template <class E>
requires TensorLike<E> Tensor argmax(const E& x, const Axes& axis = {}, bool keepdim = false) {
  return detail::arg_reduce(x, axis, keepdim, ir::Op::ArgMax, "argmax");
}

/// Index of the smallest value (first on ties; a NaN counts as smallest), over one axis or flattened.
template <class E>
requires TensorLike<E> Tensor argmin(const E& x, const Axes& axis = {}, bool keepdim = false) {
  return detail::arg_reduce(x, axis, keepdim, ir::Op::ArgMin, "argmin");
}

/// Variance over `axes` with Bessel's `correction` (1 = unbiased, torch.var's default).
template <class E>
requires TensorLike<E> Tensor var(const E& x, const Axes& axes = {}, bool keepdim = false, double correction = 1.0) {
  Tensor t = detail::to_tensor(x);
  detail::require_float(t, "var");
  auto ax = detail::reduce_axes(axes, t, "var");
  return detail::finish_reduce(decomp::var_keep(t.node(), ax, correction), t.shape(), ax, keepdim);
}

/// log(sum(exp(x))) over `axes`, computed stably. Integer inputs give float32.
template <class E>
requires TensorLike<E> Tensor logsumexp(const E& x, const Axes& axes = {}, bool keepdim = false) {
  Tensor t = detail::fp32_operand(x);
  auto ax = detail::reduce_axes(axes, t, "logsumexp");
  ir::NodePtr n = is_floating(t.dtype()) ? t.node() : ir::cast(t.node(), kDefaultFloat);
  return detail::finish_reduce(decomp::logsumexp_keep(n, ax), t.shape(), ax, keepdim);
}

// ---- shape ops (views where the layout allows) ------------------------------------------------

/// Same elements in a new shape; one size may be -1 (inferred).
template <class E>
requires TensorLike<E> Tensor reshape(const E& x, const Shape& shape) {
  Tensor t = detail::to_tensor(x);
  Shape s = shape;
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0)
        throw ShapeError("reshape: only one dimension can be -1, got " + shape.str() + " for input " +
                         detail::describe(t));
      infer = static_cast<std::int64_t>(i);
    } else if (s[i] < 0) {
      throw ShapeError("reshape: invalid size in " + shape.str() + " for input " + detail::describe(t));
    } else if (__builtin_mul_overflow(known, s[i], &known)) {
      throw ShapeError("reshape: shape " + shape.str() + " has too many elements for input " + detail::describe(t));
    }
  }
  if (infer >= 0) {
    if (known == 0 || t.numel() % known != 0)
      throw ShapeError("reshape: shape " + shape.str() + " is invalid for input " + detail::describe(t));
    s[infer] = t.numel() / known;
  }
  if (s.numel() != t.numel())
    throw ShapeError("reshape: shape " + shape.str() + " is invalid for input " + detail::describe(t) + " (" +
                     std::to_string(t.numel()) + " elements)");
  return Tensor(ir::reshape(t.node(), s));
}

/// Reorders dimensions: output dim i is input dim dims[i] (negative dims count from the end).
template <class E>
requires TensorLike<E> Tensor permute(const E& x, const std::vector<std::int64_t>& dims) {
  Tensor t = detail::to_tensor(x);
  std::int64_t r = t.dim();
  if (static_cast<std::int64_t>(dims.size()) != r)
    throw ShapeError("permute: " + std::to_string(dims.size()) + " dims given for input " + detail::describe(t));
  std::vector<std::int64_t> p(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    p[i] = detail::tensor_axis(dims[i], t, "permute");
    if (seen[p[i]])
      throw ShapeError("permute: repeated dim " + std::to_string(dims[i]) + " for input " + detail::describe(t));
    seen[p[i]] = true;
  }
  return Tensor(ir::permute(t.node(), p));
}

/// Swaps two dimensions.
template <class E>
requires TensorLike<E> Tensor transpose(const E& x, std::int64_t dim0, std::int64_t dim1) {
  Tensor t = detail::to_tensor(x);
  std::int64_t a = detail::tensor_axis(dim0, t, "transpose");
  std::int64_t b = detail::tensor_axis(dim1, t, "transpose");
  if (t.dim() == 0) return t;
  std::vector<std::int64_t> p(t.dim());
  for (std::int64_t i = 0; i < t.dim(); ++i) p[i] = i;
  std::swap(p[a], p[b]);
  return Tensor(ir::permute(t.node(), p));
}

/// Inserts a size-1 dimension at `dim` (in [-dim()-1, dim()]).
template <class E>
requires TensorLike<E> Tensor unsqueeze(const E& x, std::int64_t dim) {
  Tensor t = detail::to_tensor(x);
  std::int64_t r = t.dim() + 1;
  if (dim < -r || dim >= r)
    throw ShapeError("unsqueeze: dim " + std::to_string(dim) + " is out of range for input " + detail::describe(t) +
                     " (expected [" + std::to_string(-r) + ", " + std::to_string(r - 1) + "])");
  if (dim < 0) dim += r;
  Shape s = t.shape();
  s.insert(s.begin() + dim, 1);
  return Tensor(ir::reshape(t.node(), s));
}

/// Removes every size-1 dimension.
template <class E>
requires TensorLike<E> Tensor squeeze(const E& x) {
  Tensor t = detail::to_tensor(x);
  Shape s;
  for (auto d : t.shape())
    if (d != 1) s.push_back(d);
  return Tensor(ir::reshape(t.node(), s));
}

/// Removes dimension `dim` if its size is 1 (otherwise returns the input, as PyTorch).
template <class E>
requires TensorLike<E> Tensor squeeze(const E& x, std::int64_t dim) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) {
    detail::tensor_axis(dim, t, "squeeze");
    return t;
  }
  std::int64_t d = detail::tensor_axis(dim, t, "squeeze");
  if (t.shape()[d] != 1) return t;
  Shape s = t.shape();
  s.erase(s.begin() + d);
  return Tensor(ir::reshape(t.node(), s));
}

/// Repeats size-1 (and missing leading) dimensions up to `shape` (a view: no copy).
template <class E>
requires TensorLike<E> Tensor broadcast_to(const E& x, const Shape& shape) {
  Tensor t = detail::to_tensor(x);
  const Shape& in = t.shape();
  bool ok = in.size() <= shape.size();
  for (std::size_t i = 0; ok && i < in.size(); ++i) {
    std::int64_t d = in[in.size() - 1 - i], o = shape[shape.size() - 1 - i];
    ok = d == o || d == 1;
  }
  if (!ok) throw ShapeError("broadcast_to: cannot broadcast " + detail::describe(t) + " to shape " + shape.str());
  checked_numel(shape, "broadcast_to");
  return Tensor(decomp::expand(t.node(), shape));
}

/// Elements start, start+step, ... before stop along `axis` (Python slicing: negative
/// indices count from the end; out-of-range bounds are clamped; step > 0).
template <class E>
requires TensorLike<E> Tensor slice(const E& x, std::int64_t axis, std::int64_t start, std::int64_t stop,
                                    std::int64_t step = 1) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) throw ShapeError("slice: cannot slice a 0-dim tensor " + detail::describe(t));
  std::int64_t a = detail::tensor_axis(axis, t, "slice");
  if (step <= 0)
    throw ShapeError("slice: step must be positive, got " + std::to_string(step) + " for input " + detail::describe(t));
  std::int64_t n = t.shape()[a];
  auto clampi = [n](std::int64_t v) {
    if (v < 0) v += n;
    return std::clamp<std::int64_t>(v, 0, n);
  };
  std::int64_t b = clampi(start), e = clampi(stop);
  std::int64_t count = e > b ? 1 + (e - b - 1) / step : 0;  // no overflow for any step
  return Tensor(ir::slice(t.node(), a, count > 0 ? b : 0, count, step));
}

/// Joins tensors along `axis`; shapes must match elsewhere; dtypes promote (torch.cat).
KILN_ENTRY Tensor concat(const std::vector<Tensor>& xs, std::int64_t axis = 0);

/// Pieces of `split_size` elements along `axis` (the last one smaller when the size does not
/// divide), as torch.split; views where the layout allows.
template <class E>
requires TensorLike<E> std::vector<Tensor> split(const E& x, std::int64_t split_size, std::int64_t axis = 0) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) throw ShapeError("split: cannot split a 0-dim tensor " + detail::describe(t));
  std::int64_t a = detail::tensor_axis(axis, t, "split");
  const std::int64_t n = t.shape()[a];
  if (split_size < 0 || (split_size == 0 && n > 0))
    throw ShapeError("split: split_size must be positive, got " + std::to_string(split_size) + " for input " +
                     detail::describe(t));
  std::vector<Tensor> out;
  if (n == 0) return {t};
  for (std::int64_t start = 0; start < n; start += split_size)
    out.push_back(slice(t, a, start, std::min(n, start + split_size)));
  return out;
}

/// Pieces of the given sizes along `axis` (they must add up to its size), as torch.split with
/// a list.
template <class E>
requires TensorLike<E> std::vector<Tensor> split(const E& x, const std::vector<std::int64_t>& sizes,
                                                 std::int64_t axis = 0) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) throw ShapeError("split: cannot split a 0-dim tensor " + detail::describe(t));
  std::int64_t a = detail::tensor_axis(axis, t, "split");
  std::int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) throw ShapeError("split: negative size " + std::to_string(s) + " for input " + detail::describe(t));
    total += s;
  }
  if (total != t.shape()[a])
    throw ShapeError("split: sizes add up to " + std::to_string(total) + ", not to the size " +
                     std::to_string(t.shape()[a]) + " of axis " + std::to_string(a) + " of input " +
                     detail::describe(t));
  std::vector<Tensor> out;
  std::int64_t start = 0;
  for (auto s : sizes) {
    out.push_back(slice(t, a, start, start + s));
    start += s;
  }
  return out;
}

/// At most `chunks` pieces of equal size along `axis` (the last smaller), as torch.chunk:
/// each holds ceil(size / chunks) elements, so fewer pieces may come back.
template <class E>
requires TensorLike<E> std::vector<Tensor> chunk(const E& x, std::int64_t chunks, std::int64_t axis = 0) {
  Tensor t = detail::to_tensor(x);
  if (chunks <= 0)
    throw ShapeError("chunk: chunks must be positive, got " + std::to_string(chunks) + " for input " +
                     detail::describe(t));
  if (t.dim() == 0) throw ShapeError("chunk: cannot chunk a 0-dim tensor " + detail::describe(t));
  std::int64_t a = detail::tensor_axis(axis, t, "chunk");
  const std::int64_t n = t.shape()[a];
  if (n == 0) return std::vector<Tensor>(static_cast<std::size_t>(chunks), t);
  return split(t, (n + chunks - 1) / chunks, a);
}

/// The `length` elements of `x` from `start` along `dim` (torch.narrow; a view of an evaluated
/// tensor). A negative start counts from the end; a start outside [-size, size] is an
/// IndexError, a negative length or one past the end a ShapeError.
template <class E>
requires TensorLike<E> Tensor narrow(const E& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) throw ShapeError("narrow: cannot narrow a 0-dim tensor " + detail::describe(t));
  const std::int64_t a = detail::tensor_axis(dim, t, "narrow"), n = t.shape()[a];
  if (start < -n || start > n)
    throw IndexError("narrow: start " + std::to_string(start) + " out of range [" + std::to_string(-n) + ", " +
                     std::to_string(n) + "] for dim " + std::to_string(dim) + " of " + detail::describe(t));
  const std::int64_t s = start < 0 ? start + n : start;
  if (length < 0 || s + length > n)
    throw ShapeError("narrow: start " + std::to_string(s) + " + length " + std::to_string(length) +
                     " is outside dim " + std::to_string(dim) + " (size " + std::to_string(n) + ") of " +
                     detail::describe(t));
  return slice(t, a, s, s + length);
}

/// Element `index` of `dim`, that dim removed (torch.select; a view of an evaluated tensor). A
/// negative index counts from the end; out of range is an IndexError.
template <class E>
requires TensorLike<E> Tensor select(const E& x, std::int64_t dim, std::int64_t index) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) throw ShapeError("select: cannot select from a 0-dim tensor " + detail::describe(t));
  const std::int64_t a = detail::tensor_axis(dim, t, "select"), n = t.shape()[a];
  if (index < -n || index >= n)
    throw IndexError("select: index " + std::to_string(index) + " out of range for dim " + std::to_string(dim) +
                     " (size " + std::to_string(n) + ") of " + detail::describe(t));
  const std::int64_t i = index < 0 ? index + n : index;
  return squeeze(slice(t, a, i, i + 1), a);
}

/// Every element of `dim` as its own tensor with that dim removed (torch.unbind; views of an
/// evaluated tensor).
template <class E>
requires TensorLike<E> std::vector<Tensor> unbind(const E& x, std::int64_t dim = 0) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) throw ShapeError("unbind: cannot unbind a 0-dim tensor " + detail::describe(t));
  const std::int64_t a = detail::tensor_axis(dim, t, "unbind");
  std::vector<Tensor> out;
  for (std::int64_t i = 0; i < t.shape()[a]; ++i) out.push_back(select(t, a, i));
  return out;
}

// ---- composites (lowered by decomp/) -------------------------------------------------------

/// exp(x - max) / sum(exp(x - max)) along `axis` (floating inputs only, as PyTorch).
template <class E>
requires TensorLike<E> Tensor softmax(const E& x, std::int64_t axis = -1) {
  Tensor t = detail::fp32_operand(x);
  detail::require_float(t, "softmax");
  std::int64_t a = detail::tensor_axis(axis, t, "softmax");
  ir::NodePtr n = t.node();
  if (t.dim() == 0) n = ir::reshape(n, Shape{1});
  ir::NodePtr r = decomp::softmax(n, a);
  return Tensor(t.dim() == 0 ? ir::reshape(r, Shape{}) : r);
}

/// log(softmax(x)) along `axis`, computed stably.
template <class E>
requires TensorLike<E> Tensor log_softmax(const E& x, std::int64_t axis = -1) {
  Tensor t = detail::fp32_operand(x);
  detail::require_float(t, "log_softmax");
  std::int64_t a = detail::tensor_axis(axis, t, "log_softmax");
  ir::NodePtr n = t.node();
  if (t.dim() == 0) n = ir::reshape(n, Shape{1});
  ir::NodePtr r = decomp::log_softmax(n, a);
  return Tensor(t.dim() == 0 ? ir::reshape(r, Shape{}) : r);
}

namespace detail {
KILN_ENTRY ir::NodePtr norm_param(const Tensor& p, const Tensor& x, const char* op, const char* what);
}  // namespace detail

namespace detail {
/// IndexError naming `op`, the first target outside [0, classes) (other than ignore_index)
/// and the class count. `t` is a realized 1-d int32/int64 tensor in host memory.
KILN_ENTRY void check_class_targets(const Tensor& t, std::int64_t classes, std::int64_t ignore_index, const char* op);
}  // namespace detail

/// Normalises over the last axis: (x - mean) / sqrt(var + eps) * weight + bias. weight and
/// bias (shape [K]) may be undefined `Tensor{}`.
template <class E>
requires TensorLike<E> Tensor layer_norm(const E& x, const Tensor& weight_in = {}, const Tensor& bias_in = {},
                                         double eps = 1e-5) {
  Tensor t = detail::fp32_operand(x);
  const Tensor weight = detail::autocast_cast(weight_in, detail::AutocastClass::Fp32);
  const Tensor bias = detail::autocast_cast(bias_in, detail::AutocastClass::Fp32);
  detail::require_float(t, "layer_norm");
  if (t.dim() == 0) throw ShapeError("layer_norm: input must have at least one dimension, got " + detail::describe(t));
  return Tensor(decomp::layer_norm(t.node(), detail::norm_param(weight, t, "layer_norm", "weight"),
                                   detail::norm_param(bias, t, "layer_norm", "bias"), eps));
}

/// x * rsqrt(mean(x^2, -1) + eps) * weight over the last axis; eps defaults to the machine
/// epsilon of the dtype it computes in, as torch.nn.functional.rms_norm's kernels (opmath:
/// float32's 2^-23 for float16 and bfloat16 too, float64's 2^-52).
template <class E>
requires TensorLike<E> Tensor rms_norm(const E& x, const Tensor& weight_in = {},
                                       std::optional<double> eps = std::nullopt) {
  // On no autocast list (torch 2.11's ATen/autocast_mode.h): torch's rms_norm computes in
  // float32 and returns the input's dtype (type_as(input)), under autocast too.
  Tensor t = detail::to_tensor(x);
  const Tensor& weight = weight_in;
  detail::require_float(t, "rms_norm");
  if (t.dim() == 0) throw ShapeError("rms_norm: input must have at least one dimension, got " + detail::describe(t));
  const double e = eps ? *eps : t.dtype() == DType::Float64 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
  return Tensor(decomp::rms_norm(t.node(), detail::norm_param(weight, t, "rms_norm", "weight"), e));
}

namespace detail {
/// The checks of a loss over class targets (cross_entropy, nll_loss): float scores [N, C], int64
/// or int32 targets [N] on the same device, targets in host memory within [0, C) or ignore_index.
KILN_ENTRY void check_class_operands(const Tensor& scores, const Tensor& targets, std::int64_t ignore_index,
                                     const char* op);
/// cross_entropy after its front-end checks (shapes, dtypes, devices, targets in host memory),
/// shared by every overload; `logits` is already the float operand autocast gives.
KILN_ENTRY Tensor cross_entropy_checked(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index,
                                        decomp::Reduction reduction, double label_smoothing);
}  // namespace detail

/// Mean cross-entropy of `targets` (Int64 class indices [N]) under `logits` [N, C];
/// targets equal to `ignore_index` are left out of the mean. (tensor/losses.hpp has the
/// overload with PyTorch's `reduction` and `label_smoothing`.)
template <class E>
requires TensorLike<E> Tensor cross_entropy(const E& logits, const Tensor& targets, std::int64_t ignore_index = -100) {
  return detail::cross_entropy_checked(detail::fp32_operand(logits), targets, ignore_index, decomp::Reduction::Mean, 0.0);
}

}  // namespace kiln

// kiln::ValuesIndices is a pair for structured bindings: `auto [values, indices] = max(x, 1);`.
template <>
struct std::tuple_size<kiln::ValuesIndices> : std::integral_constant<std::size_t, 2> {};
template <std::size_t I>
struct std::tuple_element<I, kiln::ValuesIndices> {
  using type = kiln::Tensor;
};

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/functions_impl.hpp"
#endif
