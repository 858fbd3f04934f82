#pragma once
// Common torch functions that are compositions of kiln's ops: logical reductions (all, any,
// count_nonzero), statistics (var_mean, std_mean, median), vector norms, data-dependent
// selections (nonzero, masked_select, unique, where(cond), which read their input first),
// diagonals and cross products, shape utilities (movedim, hstack, vstack, meshgrid, triangle
// indices, bincount), eye and linspace, the samplers (randint, randperm, bernoulli,
// multinomial), and the pointwise helpers optimizers and numerical code reach for (lerp,
// addcmul, addcdiv, logaddexp, nan_to_num, clamp_min, clamp_max, logit, outer). Each follows
// its torch function's dtype rules, errors and gradients (derivatives.yaml), at the special
// values too; where a composite's gradient would differ from torch's formula (a norm at zero,
// logit at 0 and 1), it is written so that it does not.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/ops.hpp"
#include "kiln/tensor/sorting.hpp"

namespace kiln {

// ---- logical reductions -------------------------------------------------------------------

/// Whether every element over `axes` (all when omitted) is nonzero (NaN counts as nonzero), as
/// torch.all: a bool tensor, true over an empty reduction. Any dtype.
KILN_ENTRY Tensor all(const Tensor& x, const Axes& axes = {}, bool keepdim = false);

/// Whether some element over `axes` is nonzero, as torch.any: a bool tensor, false over an
/// empty reduction. Any dtype.
KILN_ENTRY Tensor any(const Tensor& x, const Axes& axes = {}, bool keepdim = false);

/// How many elements over `axes` are nonzero, int64 (torch.count_nonzero; no keepdim).
KILN_ENTRY Tensor count_nonzero(const Tensor& x, const Axes& axes = {});

/// The variance and the mean over `axes` together (torch.var_mean): {var(x, axes, keepdim,
/// correction), mean(x, axes, keepdim)}. Floating inputs only.
KILN_ENTRY std::tuple<Tensor, Tensor> var_mean(const Tensor& x, const Axes& axes = {}, bool keepdim = false,
                                               double correction = 1.0);

/// The standard deviation and the mean over `axes` (torch.std_mean): the square root of
/// var_mean's variance, whose gradient is 0 where the deviation is 0 (as torch's std backward).
KILN_ENTRY std::tuple<Tensor, Tensor> std_mean(const Tensor& x, const Axes& axes = {}, bool keepdim = false,
                                               double correction = 1.0);

/// The lower median of all elements (torch.median(x)): the element at position (n - 1) / 2 of
/// the sorted values, NaN when any element is NaN; its gradient goes to that element. An empty
/// tensor gives NaN (an integer dtype's lowest value), as torch's; bool is a DTypeError.
KILN_ENTRY Tensor median(const Tensor& x);

/// The lower median along `dim` and its int64 position (torch.median(x, dim, keepdim)): the
/// position among equal values is the stable sort's; a row with NaN gives NaN at its first NaN.
KILN_ENTRY ValuesIndices median(const Tensor& x, std::int64_t dim, bool keepdim = false);

// ---- data-dependent selections ----------------------------------------------------------------

/// The int64 indices [n, rank] of x's nonzero elements in row-major order (torch.nonzero). It
/// reads x (a synchronisation; inside kiln::compile a graph break, as a read of data is).
KILN_ENTRY Tensor nonzero(const Tensor& x);

/// torch.argwhere: the same as nonzero.
KILN_ENTRY Tensor argwhere(const Tensor& x);

/// The elements of x where the bool `mask` is true, x and mask broadcast, in row-major order, as
/// a 1-D tensor (torch.masked_select). Reads the mask (as nonzero); the gradient goes back to
/// the selected elements.
KILN_ENTRY Tensor masked_select(const Tensor& x, const Tensor& mask);

/// The positions of cond's true elements as one int64 index tensor per dim (torch.where(cond),
/// nonzero(cond, as_tuple=True)); a 0-dim cond gives one tensor, as a 1-D one would. Reads cond,
/// as nonzero.
KILN_ENTRY std::vector<Tensor> where(const Tensor& condition);

/// The distinct values of x in ascending order, the int64 position of each element's value among
/// them (x's shape) and how often each occurs (torch.unique with return_inverse and
/// return_counts): {values, inverse, counts}. NaNs are distinct from each other (each its own
/// value, after the numbers), as torch's. Always sorted (torch's `sorted = False` may return any
/// order). It reads x (a synchronisation; a graph break inside kiln::compile).
KILN_ENTRY std::tuple<Tensor, Tensor, Tensor> unique(const Tensor& x);

/// The values of runs of equal consecutive elements of x (flattened), the int64 run of each
/// element (x's shape) and each run's length (torch.unique_consecutive without dim):
/// {values, inverse, counts}. Reads x.
KILN_ENTRY std::tuple<Tensor, Tensor, Tensor> unique_consecutive(const Tensor& x);

// ---- diagonals, cross products ----------------------------------------------------------------

/// The diagonal `offset` (above the main one when positive) over dims dim1 and dim2, as a new
/// last dim (torch.diagonal, as a copy). ShapeError for equal dims or a rank below 2.
KILN_ENTRY Tensor diagonal(const Tensor& x, std::int64_t offset = 0, std::int64_t dim1 = 0, std::int64_t dim2 = 1);

/// torch.diag: a 1-D x gives the square matrix with x on its diagonal `diagonal`, a 2-D x gives
/// that diagonal; other ranks are a ShapeError.
KILN_ENTRY Tensor diag(const Tensor& x, std::int64_t diagonal = 0);

/// The sum of a matrix's diagonal (torch.trace; integers sum in int64). ShapeError unless 2-D.
KILN_ENTRY Tensor trace(const Tensor& x);

namespace linalg {
/// The cross product of 3-vectors along `dim` (torch.linalg.cross): a and b have one rank and
/// broadcast, the dim has size 3 in both (ShapeError otherwise), and one dtype (DTypeError
/// otherwise), as torch's.
KILN_ENTRY Tensor cross(const Tensor& a, const Tensor& b, std::int64_t dim = -1);
}  // namespace linalg

/// torch.cross: linalg::cross along `dim`, by default the first dim of size 3.
KILN_ENTRY Tensor cross(const Tensor& a, const Tensor& b, std::optional<std::int64_t> dim = std::nullopt);

/// softmax(-x, dim) (torch.softmin).
KILN_ENTRY Tensor softmin(const Tensor& x, std::int64_t dim);

// ---- norms ------------------------------------------------------------------------------------

namespace linalg {
/// The vector `ord`-norm over `dim` (all elements when omitted), as torch.linalg.vector_norm:
/// ord 2 (default) sqrt(sum x^2), 1 sum |x|, inf max |x|, -inf min |x|, 0 the count of nonzero
/// elements, any other p (sum |x|^p)^(1/p). Floating inputs only (DTypeError otherwise); float16
/// and bfloat16 compute in float32 and give their own dtype. Gradients as torch's: 0 where the
/// norm is 0 (not NaN), split evenly among the ties of max/min |x| for ord +-inf.
KILN_ENTRY Tensor vector_norm(const Tensor& x, double ord = 2.0, const Axes& dim = {}, bool keepdim = false);
}  // namespace linalg

/// torch.norm(x, p, dim, keepdim) for vector norms: linalg::vector_norm(x, p, dim, keepdim).
KILN_ENTRY Tensor norm(const Tensor& x, double p = 2.0, const Axes& dim = {}, bool keepdim = false);

// ---- creation ---------------------------------------------------------------------------------

/// The [n, m] matrix with ones on its diagonal and zeros elsewhere (torch.eye); ShapeError for a
/// negative size.
KILN_ENTRY Tensor eye(std::int64_t n, std::int64_t m, DType dtype = f32, Device device = Device::cpu());
/// The [n, n] identity (torch.eye(n)).
KILN_ENTRY Tensor eye(std::int64_t n, DType dtype = f32, Device device = Device::cpu());

/// `steps` values from start to end inclusive, evenly spaced (torch.linspace): the first half
/// as start + step * i, the second as end - step * (steps - 1 - i), so both ends are exact;
/// computed in the dtype (float64 for integer dtypes, then truncated, as torch's kernel).
/// ValueError for negative steps.
KILN_ENTRY Tensor linspace(double start, double end, std::int64_t steps, DType dtype = f32,
                           Device device = Device::cpu());

// ---- shape utilities ---------------------------------------------------------------------------

/// x with its dims `source` moved to positions `destination`, the others keeping their order
/// (torch.movedim / moveaxis; negative dims count from the end). ShapeError for repeated dims or
/// lists of different lengths.
KILN_ENTRY Tensor movedim(const Tensor& x, const std::vector<std::int64_t>& source,
                          const std::vector<std::int64_t>& destination);
KILN_ENTRY Tensor movedim(const Tensor& x, std::int64_t source, std::int64_t destination);
/// torch.moveaxis: movedim.
KILN_ENTRY Tensor moveaxis(const Tensor& x, std::int64_t source, std::int64_t destination);
/// torch.swapaxes / swapdims: transpose(x, dim0, dim1).
KILN_ENTRY Tensor swapaxes(const Tensor& x, std::int64_t dim0, std::int64_t dim1);
KILN_ENTRY Tensor swapdims(const Tensor& x, std::int64_t dim0, std::int64_t dim1);

/// The tensors side by side (torch.hstack): 1-D (or 0-dim) ones joined along dim 0, others
/// along dim 1; dtypes promote as cat's.
KILN_ENTRY Tensor hstack(const std::vector<Tensor>& tensors);
/// The tensors as rows (torch.vstack): each made at least 2-D ([n] -> [1, n]), joined along dim 0.
KILN_ENTRY Tensor vstack(const std::vector<Tensor>& tensors);

/// Coordinate grids of 1-D (or 0-dim) tensors (torch.meshgrid): with indexing "ij" output k has
/// shape [n0, n1, ...] and varies along dim k; with "xy" the first two dims are swapped.
/// ValueError for another indexing word.
KILN_ENTRY std::vector<Tensor> meshgrid(const std::vector<Tensor>& tensors, const std::string& indexing = "ij");

/// The [2, N] int64 coordinates of the lower (upper) triangle of a row x col matrix, at and below
/// (above) diagonal `offset`, row by row (torch.tril_indices / triu_indices).
KILN_ENTRY Tensor tril_indices(std::int64_t row, std::int64_t col, std::int64_t offset = 0, DType dtype = i64,
                               Device device = Device::cpu());
KILN_ENTRY Tensor triu_indices(std::int64_t row, std::int64_t col, std::int64_t offset = 0, DType dtype = i64,
                               Device device = Device::cpu());

/// The count of each value 0 .. max(x) in the 1-D non-negative integer x, or the sum of
/// `weights` at them, with at least `minlength` bins (torch.bincount): int64 counts; float32
/// weights give float32, others float64; an empty x gives int64 zeros, as torch's. It reads x (a synchronisation; a
/// graph break inside kiln::compile). ShapeError / DTypeError / ValueError for other ranks, dtypes, negative values.
KILN_ENTRY Tensor bincount(const Tensor& x, const Tensor& weights = {}, std::int64_t minlength = 0);

// ---- sampling (the global generator: manual_seed; refused inside kiln::compile, as rand) -------

/// Uniform integers in [low, high) (torch.randint), int64 unless a dtype is given. ValueError
/// when high <= low.
KILN_ENTRY Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, DType dtype = i64,
                          Device device = Device::cpu());
/// randint(0, high, shape).
KILN_ENTRY Tensor randint(std::int64_t high, const Shape& shape, DType dtype = i64, Device device = Device::cpu());

/// A random permutation of 0 .. n-1 (torch.randperm), int64 unless a dtype is given.
KILN_ENTRY Tensor randperm(std::int64_t n, DType dtype = i64, Device device = Device::cpu());

/// 1 with probability p, else 0, elementwise for the probabilities in `probs`
/// (torch.bernoulli(input)), in probs' (floating) dtype. Probabilities outside [0, 1] are not
/// checked (reading them would be a synchronisation): below 0 gives 0, above 1 gives 1.
KILN_ENTRY Tensor bernoulli(const Tensor& probs);
/// 1 with probability p, else 0, in x's shape and floating dtype (torch.bernoulli(input, p));
/// ValueError for p outside [0, 1].
KILN_ENTRY Tensor bernoulli(const Tensor& x, double p);

/// `num_samples` category indices drawn from each row of the non-negative weights `probs` (1-D
/// or 2-D; rows need not sum to 1), int64 (torch.multinomial): with replacement each draw is
/// the first category whose cumulative weight reaches a uniform point of the row's total;
/// without replacement the num_samples largest of log(p) + Gumbel noise (each order equally
/// likely as successive draws). It reads probs to check it, as torch's CPU kernel: negative,
/// infinite or NaN weights, a row summing to 0, or (without replacement) fewer positive weights
/// than samples are ValueErrors.
KILN_ENTRY Tensor multinomial(const Tensor& probs, std::int64_t num_samples, bool replacement = false);

// ---- pointwise --------------------------------------------------------------------------------

/// start + weight * (end - start), written as torch's kernel (from end when |weight| >= 0.5, so
/// weight 1 gives end exactly). start and end (and a weight tensor of one or more dims) must
/// have one dtype, and the dtype computed in must be floating: start's with a number weight,
/// the three's promotion with a tensor weight (a 0-dim weight of any dtype takes part as torch's
/// 0-dim operands do). DTypeError otherwise, as torch's; they broadcast; float16/bfloat16
/// compute in float32.
KILN_ENTRY Tensor lerp(const Tensor& start, const Tensor& end, double weight);
KILN_ENTRY Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);

/// input + value * tensor1 * tensor2 (torch.addcmul), in the dtype the three promote to; bool
/// is a DTypeError, a fractional value with an integer result is truncated (as torch converts it).
KILN_ENTRY Tensor addcmul(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, double value = 1.0);

/// input + value * tensor1 / tensor2 (torch.addcdiv); tensor1 and tensor2 both integral is a
/// DTypeError (torch no longer divides integers here).
KILN_ENTRY Tensor addcdiv(const Tensor& input, const Tensor& tensor1, const Tensor& tensor2, double value = 1.0);

/// log(exp(a) + exp(b)) without overflow (torch.logaddexp): max(a, b) + log1p(exp(-|a - b|)),
/// and a itself where a == b is infinite. Floating inputs only.
KILN_ENTRY Tensor logaddexp(const Tensor& a, const Tensor& b);

/// x with NaN, +inf and -inf replaced (torch.nan_to_num): by `nan` (0 by default), `posinf` and
/// `neginf` (by default the dtype's largest and lowest finite values). Integer and bool tensors
/// come back unchanged (a copy). The gradient is 1 at finite elements, 0 at replaced ones.
KILN_ENTRY Tensor nan_to_num(const Tensor& x, double nan = 0.0, std::optional<double> posinf = std::nullopt,
                             std::optional<double> neginf = std::nullopt);

/// Where x is neither infinite nor NaN (torch.isfinite), as bool; every element of an integer or
/// bool tensor is finite.
KILN_ENTRY Tensor isfinite(const Tensor& x);

/// Where x is +inf (torch.isposinf), as bool; no element of an integer or bool tensor is.
KILN_ENTRY Tensor isposinf(const Tensor& x);

/// Where x is -inf (torch.isneginf), as bool; no element of an integer or bool tensor is.
KILN_ENTRY Tensor isneginf(const Tensor& x);

/// max(x, min) (torch.clamp_min, torch.clamp(x, min=...)): the dtype torch.result_type gives (an
/// integer tensor with a floating number gives float32, with an integer number stays integer),
/// NaN propagating; with a number bound x gets no gradient at the bound or at NaN, as torch's.
template <class A, class B>
requires TensorLike<A> &&(TensorLike<B> || Scalar<B>)Tensor clamp_min(const A& x, const B& min) {
  return detail::clamp_side(x, min, true, "clamp_min");
}
/// min(x, max) (torch.clamp_max, torch.clamp(x, max=...)), as clamp_min.
template <class A, class B>
requires TensorLike<A> &&(TensorLike<B> || Scalar<B>)Tensor clamp_max(const A& x, const B& max) {
  return detail::clamp_side(x, max, false, "clamp_max");
}

/// log(x / (1 - x)) (torch.logit), x first clamped to [eps, 1 - eps] when eps is given (no
/// gradient outside, as torch's; without eps the gradient is NaN outside [0, 1], as torch's).
/// Integer and bool inputs give float32.
KILN_ENTRY Tensor logit(const Tensor& x, std::optional<double> eps = std::nullopt);

/// The outer product a[i] * b[j] of two 1-D tensors (torch.outer), in their promoted dtype;
/// ShapeError for other ranks.
KILN_ENTRY Tensor outer(const Tensor& a, const Tensor& b);

/// clamp's alias (torch.clip), the same dtypes, NaN and gradients.
template <class A, class L, class H>
requires TensorLike<A> &&(TensorLike<L> || Scalar<L>)&&(TensorLike<H> || Scalar<H>)Tensor
    clip(const A& x, const L& lo, const H& hi) {
  return clamp(x, lo, hi);
}

/// The tensors joined along `dim` (torch::cat, libtorch's name for concat).
KILN_ENTRY Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim = 0);

/// log(x) / log(10) (torch.log10), floating results (integers give float32), within two ulps of
/// the exact value; gradient 1 / (x ln 10).
KILN_ENTRY Tensor log10(const Tensor& x);

/// x - trunc(x) (torch.frac), the sign of x kept (frac(-1.5) = -0.5); floating inputs only
/// (torch has no integer frac). Gradient 1.
KILN_ENTRY Tensor frac(const Tensor& x);

/// The larger of a and b where one of them is NaN taken as missing (torch.fmax): NaN only where
/// both are; otherwise maximum's value, dtype and gradient (a tie splits it in halves).
KILN_ENTRY Tensor fmax(const Tensor& a, const Tensor& b);

/// The smaller of a and b, NaN as missing (torch.fmin), as fmax.
KILN_ENTRY Tensor fmin(const Tensor& a, const Tensor& b);

/// sum over `axes` with NaN taken as 0 (torch.nansum): floating inputs; integers as sum. The
/// gradient is 1 where x is not NaN, 0 where it is.
KILN_ENTRY Tensor nansum(const Tensor& x, const Axes& axes = {}, bool keepdim = false);

/// The mean over `axes` of the elements that are not NaN (torch.nanmean): NaN where all are;
/// floating inputs only (DTypeError otherwise, as torch).
KILN_ENTRY Tensor nanmean(const Tensor& x, const Axes& axes = {}, bool keepdim = false);

/// (amin, amax) over `axes` in one call (torch.aminmax; torch's `dim` as one axis or all).
KILN_ENTRY std::tuple<Tensor, Tensor> aminmax(const Tensor& x, const Axes& axes = {}, bool keepdim = false);

/// x repeated `reps` times along each dim (torch.tile): `reps` shorter than x's rank is
/// padded with leading 1s, longer adds leading dims (repeat's rule then).
KILN_ENTRY Tensor tile(const Tensor& x, const std::vector<std::int64_t>& reps);

/// Where |a - b| <= atol + rtol |b| (torch.isclose), as bool: equal values (infinities of one
/// sign included) are close, NaN is close to NaN only with `equal_nan`. a and b of one dtype
/// (DTypeError otherwise, as torch); integers subtract exactly, bools as float32 (as torch).
KILN_ENTRY Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
                          bool equal_nan = false);

/// Whether every element of a and b is close (torch.allclose): isclose's rule, reduced.
KILN_ENTRY bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
                         bool equal_nan = false);

/// Whether a and b have one shape and equal elements (torch.equal; NaN is not equal to NaN).
KILN_ENTRY bool equal(const Tensor& a, const Tensor& b);

/// The q-th quantile of x along `dim`, or of x flattened (torch.quantile): the sorted values at
/// rank q (n - 1), between two ranks by `interpolation` ("linear", "lower", "higher",
/// "midpoint", "nearest": round half to even); NaN where the slice holds a NaN. float32 or
/// float64 input (DTypeError otherwise, as torch), q in [0, 1] and a non-empty input
/// (ValueError). Differentiable through the sort, as torch's.
KILN_ENTRY Tensor quantile(const Tensor& x, double q, std::optional<std::int64_t> dim = std::nullopt,
                           bool keepdim = false, const std::string& interpolation = "linear");

/// The quantiles for each of `q`, stacked along a new first dim (torch.quantile with a 1-D q).
KILN_ENTRY Tensor quantile(const Tensor& x, const std::vector<double>& q, std::optional<std::int64_t> dim = std::nullopt,
                           bool keepdim = false, const std::string& interpolation = "linear");

/// x flipped along dim 0 (torch.flipud; at least 1-D) or dim 1 (torch.fliplr; at least 2-D).
KILN_ENTRY Tensor flipud(const Tensor& x);
KILN_ENTRY Tensor fliplr(const Tensor& x);

/// x rotated by 90 degrees k times in the plane of `dims`, from the first towards the second
/// (torch.rot90): k taken modulo 4; two distinct dims of a tensor of at least 2 dims.
KILN_ENTRY Tensor rot90(const Tensor& x, std::int64_t k = 1, const std::vector<std::int64_t>& dims = {0, 1});

/// x pi / 180 and x 180 / pi (torch.deg2rad, rad2deg): integers and bools give float32.
KILN_ENTRY Tensor deg2rad(const Tensor& x);
KILN_ENTRY Tensor rad2deg(const Tensor& x);

/// x log(y), 0 where x is 0 unless y is NaN (torch.xlogy), in the floating dtype the two
/// promote to (integers give float32). Gradients as torch 2.11's: x gets g log(y) (0 where x is
/// 0 and y <= 0; where x is 0 and y > 0 it is log(y), not 0), y gets g x / y (NaN at x = y = 0).
KILN_ENTRY Tensor xlogy(const Tensor& x, const Tensor& y);

/// 0 where x < 0, `values` where x == 0, 1 where x > 0 (torch.heaviside; a NaN x gives 0, as
/// torch's kernel); x and values of one dtype. Not differentiable (as torch).
KILN_ENTRY Tensor heaviside(const Tensor& x, const Tensor& values);

/// Each element of x repeated `repeats` times in a row along `dim` (torch.repeat_interleave
/// with an integer count); without `dim` over x flattened. A negative count is a ValueError.
KILN_ENTRY Tensor repeat_interleave(const Tensor& x, std::int64_t repeats, std::optional<std::int64_t> dim = std::nullopt);

// ---- rounding division, signs and powers ------------------------------------------------------

namespace detail {
/// a and b as tensors of the dtype torch.result_type gives them (a C++ number is a wrapped
/// number: it never widens a tensor's dtype), on the tensor operand's device.
template <class A, class B>
requires BinaryOperands<A, B> std::tuple<Tensor, Tensor> promoted_operands(const A& a, const B& b) {
  ResultType rt;
  rt.add(info_of(as_operand(a)));
  rt.add(info_of(as_operand(b)));
  const DType dt = rt.result();
  if constexpr (Scalar<A>) {
    const Tensor tb = clamp_operand(b.derived(), dt);
    return {clamp_bound(a, dt, tb.device()), tb};
  } else if constexpr (Scalar<B>) {
    const Tensor ta = clamp_operand(a.derived(), dt);
    return {ta, clamp_bound(b, dt, ta.device())};
  } else {
    return {clamp_operand(a.derived(), dt), clamp_operand(b.derived(), dt)};
  }
}

/// a / b of one dtype rounded toward zero ("trunc") or down ("floor"), as torch.div's
/// rounding modes; `op` names the caller in errors.
KILN_ENTRY Tensor rounded_div(const Tensor& a, const Tensor& b, std::string_view rounding_mode, const char* op);
}  // namespace detail

/// a / b (torch.div): without a rounding mode the true quotient (integers give float32); with
/// "trunc" rounded toward zero, with "floor" rounded down (Python's //), in the dtype a and b
/// promote to (integers stay integers). Rounded quotients have no gradient (as torch's). An
/// integer division by zero is a ValueError (torch's ZeroDivisionError; it reads the divisor);
/// a floating one gives torch's infinities and NaN.
template <class A, class B>
requires detail::BinaryOperands<A, B> Tensor div(const A& a, const B& b,
                                                 std::optional<std::string_view> rounding_mode) {
  if (!rounding_mode) return Tensor(div(a, b));
  auto [ta, tb] = detail::promoted_operands(a, b);
  return detail::rounded_div(ta, tb, *rounding_mode, "div");
}

/// a / b rounded down, as torch.floor_divide (div with rounding_mode "floor").
template <class A, class B>
requires detail::BinaryOperands<A, B> Tensor floor_divide(const A& a, const B& b) {
  auto [ta, tb] = detail::promoted_operands(a, b);
  return detail::rounded_div(ta, tb, "floor", "floor_divide");
}

/// a / b, the true quotient (torch.true_divide, an alias of div).
template <class A, class B>
requires detail::BinaryOperands<A, B> Tensor true_divide(const A& a, const B& b) { return Tensor(div(a, b)); }

/// Whether x's sign bit is set, as torch.signbit: bool, true at -0, negative infinity and a
/// NaN with its sign bit set (integers: x < 0; bools: false).
KILN_ENTRY Tensor signbit(const Tensor& x);

/// sign(x) for real tensors (torch.sgn, which extends sign to complex numbers).
KILN_ENTRY Tensor sgn(const Tensor& x);

/// a ** b computed in float64 (torch.float_power): both operands are converted to float64
/// first, so integer and negative exponents follow pow's floating rules; gradients as pow's.
KILN_ENTRY Tensor float_power(const Tensor& a, const Tensor& b);
template <class A, class B>
requires detail::BinaryOperands<A, B> &&(!(std::is_same_v<A, Tensor> && std::is_same_v<B, Tensor>)) Tensor
    float_power(const A& a, const B& b) {
  auto to64 = [](const auto& v) {
    if constexpr (Scalar<std::remove_cvref_t<decltype(v)>>)
      return static_cast<double>(v);
    else
      return Tensor(v.derived()).to(DType::Float64);
  };
  if constexpr (Scalar<A>)
    return float_power(full(Shape{}, to64(a), DType::Float64, Tensor(b.derived()).device()), to64(b));
  else if constexpr (Scalar<B>)
    return float_power(to64(a), full(Shape{}, to64(b), DType::Float64, Tensor(a.derived()).device()));
  else
    return float_power(to64(a), to64(b));
}

/// log2(2^a + 2^b) without overflow (torch.logaddexp2); floating tensors; gradients
/// 2^a / (2^a + 2^b) and 2^b / (2^a + 2^b).
KILN_ENTRY Tensor logaddexp2(const Tensor& a, const Tensor& b);

// ---- statistics that skip NaN, order statistics, search ------------------------------------------

/// The standard deviation over `axes` (torch.std) with Bessel's `correction`; its gradient is
/// 0 where the deviation is 0 (as torch's). Floating inputs only.
KILN_ENTRY Tensor std(const Tensor& x, const Axes& axes = {}, bool keepdim = false, double correction = 1.0);

/// The lower median of the elements that are not NaN (torch.nanmedian(x)): NaN only when all
/// are NaN (or x is empty); its gradient goes to that element.
KILN_ENTRY Tensor nanmedian(const Tensor& x);

/// The lower median along `dim` of the elements that are not NaN and its int64 position
/// (torch.nanmedian(x, dim, keepdim)); a row of NaN only gives NaN at position 0.
KILN_ENTRY ValuesIndices nanmedian(const Tensor& x, std::int64_t dim, bool keepdim = false);

/// quantile over the elements that are not NaN (torch.nanquantile): a slice of NaN only gives
/// NaN. The same arguments, dtypes and errors as quantile.
KILN_ENTRY Tensor nanquantile(const Tensor& x, double q, std::optional<std::int64_t> dim = std::nullopt,
                              bool keepdim = false, const std::string& interpolation = "linear");
KILN_ENTRY Tensor nanquantile(const Tensor& x, const std::vector<double>& q,
                              std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false,
                              const std::string& interpolation = "linear");

/// The k-th smallest element along `dim` (k from 1) and its int64 position (torch.kthvalue):
/// NaN counts as the largest, equal values keep their order (the stable sort's position).
/// IndexError unless 1 <= k <= the dim's size. Differentiable (the gradient goes to that element).
KILN_ENTRY ValuesIndices kthvalue(const Tensor& x, std::int64_t k, std::int64_t dim = -1, bool keepdim = false);

/// For each of `values`, the index at which it would be inserted into `sorted_sequence` to keep
/// it sorted (torch.searchsorted): the first such index (the count of elements below it), or
/// with `right` (or side "right") the last (the count not above it); a NaN value goes last.
/// A 1-D sequence serves every value; otherwise the sequence's and values' leading dims must be
/// equal and each row is searched separately. `sorter` holds the int64 positions that sort an
/// unsorted sequence along its last dim. int64 results, int32 with `out_int32`. The two dtypes
/// promote (torch's rule). Large sequences are merged with the values by one sort, small ones
/// are counted by comparison.
KILN_ENTRY Tensor searchsorted(const Tensor& sorted_sequence, const Tensor& values, bool out_int32 = false,
                               bool right = false, std::optional<std::string> side = std::nullopt,
                               const Tensor& sorter = {});

/// searchsorted of one number (a 0-dim result); the sequence must be 1-D.
KILN_ENTRY Tensor searchsorted(const Tensor& sorted_sequence, double value, bool out_int32 = false, bool right = false,
                               std::optional<std::string> side = std::nullopt, const Tensor& sorter = {});

/// The bucket of each element of `input` among the 1-D sorted `boundaries` (torch.bucketize):
/// i such that boundaries[i-1] < x <= boundaries[i], or with `right` boundaries[i-1] <= x <
/// boundaries[i]; searchsorted with the arguments swapped.
KILN_ENTRY Tensor bucketize(const Tensor& input, const Tensor& boundaries, bool out_int32 = false, bool right = false);

/// The covariance matrix of the variables in the rows of `input` (observations in columns; a
/// 1-D input is one variable: a 0-dim result), as torch.cov: `correction` 1 is Bessel's,
/// `fweights` (integer counts) and `aweights` (floating importances) weight the observations.
/// Integer inputs give float32. A sum of weights not above the correction gives inf/NaN as
/// torch's (which warns).
KILN_ENTRY Tensor cov(const Tensor& input, std::int64_t correction = 1, const Tensor& fweights = {},
                      const Tensor& aweights = {});

/// Pearson's correlation coefficients of the rows of `input` (torch.corrcoef): cov normalised
/// by the standard deviations, clipped to [-1, 1].
KILN_ENTRY Tensor corrcoef(const Tensor& input);

/// A histogram of x flattened into `bins` equal bins over [min, max] (torch.histc): elements
/// outside (and NaN) are not counted, max falls in the last bin. min == max takes the data's
/// range (it reads x), widened by 1 both ways if that is empty too. Floating inputs; the counts
/// in x's dtype. Not differentiable.
KILN_ENTRY Tensor histc(const Tensor& x, std::int64_t bins = 100, double min = 0, double max = 0);

// ---- writes at index tuples and masks -------------------------------------------------------

/// input with `values` written at the positions the index tensors select (torch.index_put,
/// `x[i0, i1, ...] = values`): `indices` index input's leading dims, int64 or int32 tensors
/// broadcast together to a shape B (negative positions count from the end), or bool masks, each
/// standing for the positions of its true elements over as many dims as it has (it reads the
/// mask, as nonzero). `values`, of input's dtype (torch's rule; else a DTypeError), broadcasts
/// to B + the dims not indexed. `accumulate` adds (repeated positions summed) instead of
/// writing (repeated positions: the last wins). Positions out of range are an IndexError. A new
/// tensor; `Tensor::index_put_` writes in place.
KILN_ENTRY Tensor index_put(const Tensor& input, const std::vector<Tensor>& indices, const Tensor& values,
                            bool accumulate = false);

/// input with the slices at `index` (1-d or 0-d, int64 or int32; negative counts from the end)
/// along `dim` set to `value` (torch.index_fill): a number, or a 0-dim tensor (whose gradient is
/// the sum over the filled places). An index out of range is an IndexError.
KILN_ENTRY Tensor index_fill(const Tensor& input, std::int64_t dim, const Tensor& index, double value);
KILN_ENTRY Tensor index_fill(const Tensor& input, std::int64_t dim, const Tensor& index, const Tensor& value);

/// input (broadcast with the bool `mask`) with source's elements written, in row-major order,
/// where mask is true (torch.masked_scatter). source, of input's dtype, needs at least as many
/// elements as the mask has true ones (else an IndexError); only that many are read.
KILN_ENTRY Tensor masked_scatter(const Tensor& input, const Tensor& mask, const Tensor& source);

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/composites_impl.hpp"
#endif
