#pragma once
// libtorch's method forms of the tensor functions (`x.sum({1})`, `x.reshape({2, 3})`,
// `w.grad().zero_()`), declared in tensor/tensor.hpp on every expression (and the in-place ones on
// Tensor). Each calls the free function of its name, so semantics, errors and gradients are the
// free function's; they are templates of the expression type (or inline), compiled where used in
// both build modes.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/tensor/composites.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/linalg.hpp"
#include "kiln/tensor/ops.hpp"
#include "kiln/tensor/scans.hpp"
#include "kiln/tensor/shape_ops.hpp"
#include "kiln/tensor/sorting.hpp"

namespace kiln {

/// x with dims start_dim..end_dim (inclusive; negative count from the end) merged into one, as
/// torch.flatten. A 0-dim x gives a one-element vector.
template <class E>
requires TensorLike<E> Tensor flatten(const E& x, std::int64_t start_dim = 0, std::int64_t end_dim = -1) {
  Tensor t = detail::to_tensor(x);
  if (t.dim() == 0) return reshape(t, Shape{1});
  const Shape s = t.shape();
  const std::int64_t a = normalize_axis(start_dim, t.dim(), "flatten", s);
  const std::int64_t b = normalize_axis(end_dim, t.dim(), "flatten", s);
  if (a > b)
    throw ShapeError("flatten: start_dim " + std::to_string(start_dim) + " comes after end_dim " +
                     std::to_string(end_dim) + " (input " + detail::describe(t) + ")");
  Shape out;
  std::int64_t merged = 1;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (d < a || d > b) {
      out.push_back(s[d]);
      continue;
    }
    merged *= s[d];
    if (d == b) out.push_back(merged);
  }
  return reshape(t, out);
}

/// Dim `dim` of x split into `sizes` (torch.unflatten): their product must be that dim's size;
/// one of them may be -1 (inferred). ShapeError otherwise.
template <class E>
requires TensorLike<E> Tensor unflatten(const E& x, std::int64_t dim, const std::vector<std::int64_t>& sizes) {
  Tensor t = detail::to_tensor(x);
  const Shape s = t.shape();
  const std::int64_t d = normalize_axis(dim, t.dim(), "unflatten", s);
  auto refuse = [&](const std::string& why) {
    std::string list;
    for (auto v : sizes) list += (list.empty() ? "" : ", ") + std::to_string(v);
    return ShapeError("unflatten: sizes [" + list + "] " + why + " (dim " + std::to_string(dim) + " of input " +
                      detail::describe(t) + ")");
  };
  if (sizes.empty()) throw refuse("must not be empty");
  std::int64_t known = 1, inferred = -1;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == -1) {
      if (inferred >= 0) throw refuse("have more than one -1");
      inferred = static_cast<std::int64_t>(k);
    } else if (sizes[k] < 0) {
      throw refuse("hold a negative size");
    } else {
      known *= sizes[k];
    }
  }
  std::vector<std::int64_t> split = sizes;
  const std::int64_t n = s[static_cast<std::size_t>(d)];
  if (inferred >= 0) {
    if (known == 0 || n % known != 0) throw refuse("cannot be completed to the dim's size " + std::to_string(n));
    split[static_cast<std::size_t>(inferred)] = n / known;
  } else if (known != n) {
    throw refuse("do not multiply up to the dim's size " + std::to_string(n));
  }
  Shape out;
  for (std::int64_t k = 0; k < t.dim(); ++k) {
    if (k != d) {
      out.push_back(s[static_cast<std::size_t>(k)]);
      continue;
    }
    for (auto v : split) out.push_back(v);
  }
  return reshape(t, out);
}

// ---- shape ops ------------------------------------------------------------------------------
template <class D>
Tensor Expr<D>::unflatten(std::int64_t dim, const std::vector<std::int64_t>& sizes) const {
  return kiln::unflatten(derived(), dim, sizes);
}
template <class D>
Tensor Expr<D>::reshape(const Shape& shape) const { return kiln::reshape(derived(), shape); }
template <class D>
Tensor Expr<D>::view(const Shape& shape) const { return kiln::reshape(derived(), shape); }
template <class D>
Tensor Expr<D>::flatten(std::int64_t start_dim, std::int64_t end_dim) const {
  return kiln::flatten(derived(), start_dim, end_dim);
}
template <class D>
Tensor Expr<D>::squeeze() const { return kiln::squeeze(derived()); }
template <class D>
Tensor Expr<D>::squeeze(std::int64_t dim) const { return kiln::squeeze(derived(), dim); }
template <class D>
Tensor Expr<D>::unsqueeze(std::int64_t dim) const { return kiln::unsqueeze(derived(), dim); }
template <class D>
Tensor Expr<D>::permute(const std::vector<std::int64_t>& dims) const { return kiln::permute(derived(), dims); }
template <class D>
Tensor Expr<D>::transpose(std::int64_t dim0, std::int64_t dim1) const { return kiln::transpose(derived(), dim0, dim1); }
template <class D>
Tensor Expr<D>::t() const {
  const std::int64_t r = derived().dim();
  if (r > 2)
    throw ShapeError("t: expects a tensor of at most 2 dims, got " + derived().shape().str() + " (use transpose)");
  return r < 2 ? Tensor(derived()) : kiln::transpose(derived(), 0, 1);
}
template <class D>
Tensor Expr<D>::expand(const Shape& shape) const { return kiln::broadcast_to(derived(), shape); }
template <class D>
Tensor Expr<D>::flip(const std::vector<std::int64_t>& dims) const { return kiln::flip(derived(), dims); }
template <class D>
Tensor Expr<D>::repeat(const std::vector<std::int64_t>& repeats) const { return kiln::repeat(derived(), repeats); }
template <class D>
std::vector<Tensor> Expr<D>::chunk(std::int64_t chunks, std::int64_t dim) const {
  return kiln::chunk(derived(), chunks, dim);
}
template <class D>
Tensor Expr<D>::narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
  return kiln::narrow(derived(), dim, start, length);
}
template <class D>
Tensor Expr<D>::select(std::int64_t dim, std::int64_t index) const { return kiln::select(derived(), dim, index); }
template <class D>
std::vector<Tensor> Expr<D>::unbind(std::int64_t dim) const { return kiln::unbind(derived(), dim); }
template <class D>
std::vector<Tensor> Expr<D>::split(std::int64_t split_size, std::int64_t dim) const {
  return kiln::split(derived(), split_size, dim);
}

// ---- reductions and row functions -------------------------------------------------------------
template <class D>
Tensor Expr<D>::sum(const Axes& axes, bool keepdim) const { return kiln::sum(derived(), axes, keepdim); }
template <class D>
Tensor Expr<D>::mean(const Axes& axes, bool keepdim) const { return kiln::mean(derived(), axes, keepdim); }
template <class D>
Tensor Expr<D>::prod(const Axes& axes, bool keepdim) const { return kiln::prod(derived(), axes, keepdim); }
template <class D>
Tensor Expr<D>::amax(const Axes& axes, bool keepdim) const { return kiln::amax(derived(), axes, keepdim); }
template <class D>
Tensor Expr<D>::amin(const Axes& axes, bool keepdim) const { return kiln::amin(derived(), axes, keepdim); }
template <class D>
Tensor Expr<D>::all(const Axes& axes, bool keepdim) const { return kiln::all(detail::to_tensor(derived()), axes, keepdim); }
template <class D>
Tensor Expr<D>::any(const Axes& axes, bool keepdim) const { return kiln::any(detail::to_tensor(derived()), axes, keepdim); }
// ---- the common composites' method forms --------------------------------------------------
template <class D>
Tensor Expr<D>::norm(double p, const Axes& dim, bool keepdim) const {
  return kiln::norm(detail::to_tensor(derived()), p, dim, keepdim);
}
template <class D>
Tensor Expr<D>::count_nonzero(const Axes& axes) const { return kiln::count_nonzero(detail::to_tensor(derived()), axes); }
template <class D>
Tensor Expr<D>::clamp_min(double min) const { return kiln::clamp_min(detail::to_tensor(derived()), min); }
template <class D>
Tensor Expr<D>::clamp_max(double max) const { return kiln::clamp_max(detail::to_tensor(derived()), max); }
template <class D>
Tensor Expr<D>::nan_to_num(double nan) const { return kiln::nan_to_num(detail::to_tensor(derived()), nan); }
template <class D>
Tensor Expr<D>::lerp(const Tensor& end, double weight) const { return kiln::lerp(detail::to_tensor(derived()), end, weight); }
template <class D>
Tensor Expr<D>::lerp(const Tensor& end, const Tensor& weight) const {
  return kiln::lerp(detail::to_tensor(derived()), end, weight);
}
template <class D>
Tensor Expr<D>::logit() const { return kiln::logit(detail::to_tensor(derived())); }
template <class D>
Tensor Expr<D>::median() const { return kiln::median(detail::to_tensor(derived())); }
template <class D>
ValuesIndices Expr<D>::median(std::int64_t dim, bool keepdim) const {
  return kiln::median(detail::to_tensor(derived()), dim, keepdim);
}
template <class D>
Tensor Expr<D>::nonzero() const { return kiln::nonzero(detail::to_tensor(derived())); }
template <class D>
Tensor Expr<D>::masked_select(const Tensor& mask) const { return kiln::masked_select(detail::to_tensor(derived()), mask); }
template <class D>
Tensor Expr<D>::diag(std::int64_t diagonal) const { return kiln::diag(detail::to_tensor(derived()), diagonal); }
template <class D>
Tensor Expr<D>::diagonal(std::int64_t offset, std::int64_t dim1, std::int64_t dim2) const {
  return kiln::diagonal(detail::to_tensor(derived()), offset, dim1, dim2);
}
template <class D>
Tensor Expr<D>::trace() const { return kiln::trace(detail::to_tensor(derived())); }
template <class D>
Tensor Expr<D>::dot(const Tensor& other) const { return kiln::dot(detail::to_tensor(derived()), other); }
template <class D>
Tensor Expr<D>::mv(const Tensor& vec) const { return kiln::mv(detail::to_tensor(derived()), vec); }
template <class D>
Tensor Expr<D>::outer(const Tensor& other) const { return kiln::outer(detail::to_tensor(derived()), other); }

template <class D>
Tensor Expr<D>::movedim(std::int64_t source, std::int64_t destination) const {
  return kiln::movedim(detail::to_tensor(derived()), source, destination);
}
template <class D>
Tensor Expr<D>::swapaxes(std::int64_t dim0, std::int64_t dim1) const { return kiln::transpose(derived(), dim0, dim1); }
template <class D>
Tensor Expr<D>::erfc() const {
  return kiln::erfc(derived());
}
template <class D>
Tensor Expr<D>::lgamma() const {
  return kiln::lgamma(derived());
}
template <class D>
Tensor Expr<D>::digamma() const {
  return kiln::digamma(derived());
}
template <class D>
Tensor Expr<D>::erfinv() const {
  return kiln::erfinv(derived());
}
template <class D>
Tensor Expr<D>::signbit() const {
  return kiln::signbit(detail::to_tensor(derived()));
}
template <class D>
Tensor Expr<D>::copysign(const Tensor& other) const {
  return kiln::copysign(derived(), other);
}
template <class D>
Tensor Expr<D>::floor_divide(const Tensor& other) const {
  return kiln::floor_divide(derived(), other);
}
template <class D>
Tensor Expr<D>::std(const Axes& axes, bool keepdim, double correction) const {
  return kiln::std(detail::to_tensor(derived()), axes, keepdim, correction);
}
template <class D>
Tensor Expr<D>::nanmedian() const {
  return kiln::nanmedian(detail::to_tensor(derived()));
}
template <class D>
ValuesIndices Expr<D>::nanmedian(std::int64_t dim, bool keepdim) const {
  return kiln::nanmedian(detail::to_tensor(derived()), dim, keepdim);
}
template <class D>
ValuesIndices Expr<D>::kthvalue(std::int64_t k, std::int64_t dim, bool keepdim) const {
  return kiln::kthvalue(detail::to_tensor(derived()), k, dim, keepdim);
}
template <class D>
Tensor Expr<D>::diff(std::int64_t n, std::int64_t dim) const {
  return kiln::diff(detail::to_tensor(derived()), n, dim);
}
template <class D>
Tensor Expr<D>::expand_as(const Tensor& other) const {
  return kiln::broadcast_to(derived(), other.shape());
}
template <class D>
Tensor Expr<D>::view_as(const Tensor& other) const { return kiln::reshape(derived(), other.shape()); }
template <class D>
Tensor Expr<D>::reshape_as(const Tensor& other) const { return kiln::reshape(derived(), other.shape()); }
template <class D>
Tensor Expr<D>::type_as(const Tensor& other) const { return detail::to_tensor(derived()).to(other.dtype()); }

template <class D>
Tensor Expr<D>::logsumexp(const Axes& axes, bool keepdim) const { return kiln::logsumexp(derived(), axes, keepdim); }
template <class D>
Tensor Expr<D>::var(const Axes& axes, bool keepdim, double correction) const {
  return kiln::var(derived(), axes, keepdim, correction);
}
template <class D>
Tensor Expr<D>::clone() const {
  return kiln::clone(derived());
}
template <class D>
Tensor Expr<D>::index_put(const std::vector<Tensor>& indices, const Tensor& values, bool accumulate) const {
  return kiln::index_put(detail::to_tensor(derived()), indices, values, accumulate);
}
template <class D>
Tensor Expr<D>::index_fill(std::int64_t dim, const Tensor& index, double value) const {
  return kiln::index_fill(detail::to_tensor(derived()), dim, index, value);
}
template <class D>
Tensor Expr<D>::masked_scatter(const Tensor& mask, const Tensor& source) const {
  return kiln::masked_scatter(detail::to_tensor(derived()), mask, source);
}
template <class D>
Tensor Expr<D>::max() const {
  return kiln::max(derived());
}
template <class D>
ValuesIndices Expr<D>::max(std::int64_t dim, bool keepdim) const { return kiln::max(derived(), dim, keepdim); }
template <class D>
Tensor Expr<D>::min() const { return kiln::min(derived()); }
template <class D>
ValuesIndices Expr<D>::min(std::int64_t dim, bool keepdim) const { return kiln::min(derived(), dim, keepdim); }
template <class D>
Tensor Expr<D>::argmax(const Axes& axis, bool keepdim) const { return kiln::argmax(derived(), axis, keepdim); }
template <class D>
Tensor Expr<D>::argmin(const Axes& axis, bool keepdim) const { return kiln::argmin(derived(), axis, keepdim); }
template <class D>
Tensor Expr<D>::softmax(std::int64_t dim) const { return kiln::softmax(derived(), dim); }
template <class D>
Tensor Expr<D>::log_softmax(std::int64_t dim) const { return kiln::log_softmax(derived(), dim); }
template <class D>
Tensor Expr<D>::cumsum(std::int64_t dim) const { return kiln::cumsum(Tensor(derived()), dim); }
template <class D>
Tensor Expr<D>::cumprod(std::int64_t dim) const { return kiln::cumprod(Tensor(derived()), dim); }
template <class D>
std::tuple<Tensor, Tensor> Expr<D>::topk(std::int64_t k, std::int64_t dim, bool largest, bool sorted) const {
  return kiln::topk(Tensor(derived()), k, dim, largest, sorted);
}
template <class D>
std::tuple<Tensor, Tensor> Expr<D>::sort(std::int64_t dim, bool descending) const {
  return kiln::sort(Tensor(derived()), dim, descending);
}

// ---- elementwise -------------------------------------------------------------------------------
#define KILN_UNARY_METHOD(name) \
  template <class D>            \
  Tensor Expr<D>::name() const { return Tensor(kiln::name(derived())); }
KILN_UNARY_METHOD(abs)
KILN_UNARY_METHOD(neg)
KILN_UNARY_METHOD(exp)
KILN_UNARY_METHOD(log)
KILN_UNARY_METHOD(sqrt)
KILN_UNARY_METHOD(rsqrt)
KILN_UNARY_METHOD(sin)
KILN_UNARY_METHOD(cos)
KILN_UNARY_METHOD(tanh)
KILN_UNARY_METHOD(sigmoid)
KILN_UNARY_METHOD(relu)
KILN_UNARY_METHOD(floor)
KILN_UNARY_METHOD(ceil)
KILN_UNARY_METHOD(round)
KILN_UNARY_METHOD(square)
KILN_UNARY_METHOD(reciprocal)
#undef KILN_UNARY_METHOD
template <class D>
Tensor Expr<D>::pow(double exponent) const { return Tensor(kiln::pow(derived(), exponent)); }
template <class D>
Tensor Expr<D>::pow(const Tensor& exponent) const { return Tensor(kiln::pow(derived(), exponent)); }
template <class D>
Tensor Expr<D>::clamp(double min, double max) const { return kiln::clamp(derived(), min, max); }

// ---- indexing -----------------------------------------------------------------------------------
template <class D>
Tensor Expr<D>::index_select(std::int64_t dim, const Tensor& index) const {
  return kiln::index_select(Tensor(derived()), dim, index);
}
template <class D>
Tensor Expr<D>::gather(std::int64_t dim, const Tensor& index) const { return kiln::gather(Tensor(derived()), dim, index); }
template <class D>
Tensor Expr<D>::masked_fill(const Tensor& mask, double value) const { return kiln::masked_fill(derived(), mask, value); }

// ---- in place -------------------------------------------------------------------------------------
inline Tensor& Tensor::zero_() { return assign(0); }
inline Tensor& Tensor::fill_(double value) { return assign(value); }
inline Tensor& Tensor::copy_(const Tensor& src) { return assign(src); }
namespace detail {
/// PyTorch's in-place rule (canCast): `value`, of the result type, is written into `self`
/// only if that keeps its category: no floating result into an integer or bool tensor, no
/// integer into a bool one.
template <class E>
Tensor& assign_in_place(Tensor& self, const E& value, const char* op) {
  const DType from = value.dtype(), to = self.dtype();
  if ((is_floating(from) && !is_floating(to)) || (from != DType::Bool && to == DType::Bool))
    throw DTypeError(std::string(op) + ": result type " + dtype_name(from) +
                     " can't be cast to the desired output type " + dtype_name(to) + " (destination " +
                     self.describe() + ")");
  return self.assign(value);
}
/// other * alpha for add_/sub_, whose result type is `common`: an integer alpha stays an
/// integer number (exact for int64), a fractional one is refused for an integer result, and a
/// bool result takes alpha as a bool, as PyTorch's alpha check and kernels.
inline Tensor scaled_by_alpha(DType common, const Tensor& self, const Tensor& other, double alpha, const char* op) {
  if (is_floating(common)) return other * alpha;
  if (alpha != std::trunc(alpha) || !(std::abs(alpha) < 9223372036854775808.0))
    throw DTypeError(std::string(op) + ": for integral input tensors, alpha must be an integer, got " +
                     std::to_string(alpha) + " (" + self.describe() + ", " + other.describe() + ")");
  if (common == DType::Bool) return logical_and(other, alpha != 0);
  return (other.dtype() == common ? other : other.to(common)) * static_cast<std::int64_t>(alpha);
}
}  // namespace detail

inline Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (alpha == 1.0) return detail::assign_in_place(*this, *this + other, "add_");
  const DType common = (*this + other).dtype();
  return detail::assign_in_place(*this, *this + detail::scaled_by_alpha(common, *this, other, alpha, "add_"), "add_");
}
template <class S>
requires Scalar<S> Tensor& Tensor::add_(S other) { return detail::assign_in_place(*this, *this + other, "add_"); }
inline Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  if (alpha == 1.0) return detail::assign_in_place(*this, *this - other, "sub_");
  const DType common = (*this - other).dtype();  // a bool operand is refused here, as PyTorch
  return detail::assign_in_place(*this, *this - detail::scaled_by_alpha(common, *this, other, alpha, "sub_"), "sub_");
}
template <class S>
requires Scalar<S> Tensor& Tensor::sub_(S other) { return detail::assign_in_place(*this, *this - other, "sub_"); }
inline Tensor& Tensor::mul_(const Tensor& other) { return detail::assign_in_place(*this, *this * other, "mul_"); }
template <class S>
requires Scalar<S> Tensor& Tensor::mul_(S other) { return detail::assign_in_place(*this, *this * other, "mul_"); }
inline Tensor& Tensor::div_(const Tensor& other) { return detail::assign_in_place(*this, *this / other, "div_"); }
template <class S>
requires Scalar<S> Tensor& Tensor::div_(S other) { return detail::assign_in_place(*this, *this / other, "div_"); }
inline Tensor& Tensor::masked_fill_(const Tensor& mask, double value) {
  return detail::assign_in_place(*this, kiln::masked_fill(*this, mask, value), "masked_fill_");
}
inline Tensor& Tensor::clamp_(double min, double max) {
  return detail::assign_in_place(*this, kiln::clamp(*this, min, max), "clamp_");
}
inline Tensor& Tensor::clamp_min_(double min) {
  return detail::assign_in_place(*this, kiln::clamp_min(*this, min), "clamp_min_");
}
inline Tensor& Tensor::clamp_max_(double max) {
  return detail::assign_in_place(*this, kiln::clamp_max(*this, max), "clamp_max_");
}
inline Tensor& Tensor::neg_() { return detail::assign_in_place(*this, -*this, "neg_"); }
inline Tensor& Tensor::abs_() { return detail::assign_in_place(*this, kiln::abs(*this), "abs_"); }
inline Tensor& Tensor::exp_() { return detail::assign_in_place(*this, kiln::exp(*this), "exp_"); }
inline Tensor& Tensor::log_() { return detail::assign_in_place(*this, kiln::log(*this), "log_"); }
inline Tensor& Tensor::sqrt_() { return detail::assign_in_place(*this, kiln::sqrt(*this), "sqrt_"); }
inline Tensor& Tensor::sigmoid_() { return detail::assign_in_place(*this, kiln::sigmoid(*this), "sigmoid_"); }
inline Tensor& Tensor::tanh_() { return detail::assign_in_place(*this, kiln::tanh(*this), "tanh_"); }
inline Tensor& Tensor::relu_() { return detail::assign_in_place(*this, kiln::relu(*this), "relu_"); }
inline Tensor& Tensor::pow_(double exponent) {
  return detail::assign_in_place(*this, kiln::pow(*this, exponent), "pow_");
}
inline Tensor& Tensor::lerp_(const Tensor& end, double weight) {
  return detail::assign_in_place(*this, kiln::lerp(*this, end, weight), "lerp_");
}
inline Tensor& Tensor::addcmul_(const Tensor& tensor1, const Tensor& tensor2, double value) {
  return detail::assign_in_place(*this, kiln::addcmul(*this, tensor1, tensor2, value), "addcmul_");
}
inline Tensor& Tensor::addcdiv_(const Tensor& tensor1, const Tensor& tensor2, double value) {
  return detail::assign_in_place(*this, kiln::addcdiv(*this, tensor1, tensor2, value), "addcdiv_");
}
inline Tensor& Tensor::scatter_(std::int64_t dim, const Tensor& index, const Tensor& src) {
  return detail::assign_in_place(*this, kiln::scatter(*this, dim, index, src), "scatter_");
}
inline Tensor& Tensor::scatter_add_(std::int64_t dim, const Tensor& index, const Tensor& src) {
  return detail::assign_in_place(*this, kiln::scatter_add(*this, dim, index, src), "scatter_add_");
}
inline Tensor& Tensor::index_add_(std::int64_t dim, const Tensor& index, const Tensor& source, double alpha) {
  return detail::assign_in_place(*this, kiln::index_add(*this, dim, index, source, alpha), "index_add_");
}
inline Tensor& Tensor::index_copy_(std::int64_t dim, const Tensor& index, const Tensor& source) {
  return detail::assign_in_place(*this, kiln::index_copy(*this, dim, index, source), "index_copy_");
}
inline Tensor& Tensor::index_fill_(std::int64_t dim, const Tensor& index, double value) {
  return detail::assign_in_place(*this, kiln::index_fill(*this, dim, index, value), "index_fill_");
}
inline Tensor& Tensor::masked_scatter_(const Tensor& mask, const Tensor& source) {
  return detail::assign_in_place(*this, kiln::masked_scatter(*this, mask, source), "masked_scatter_");
}
inline Tensor& Tensor::index_put_(const std::vector<Tensor>& indices, const Tensor& values, bool accumulate) {
  return detail::assign_in_place(*this, kiln::index_put(*this, indices, values, accumulate), "index_put_");
}

}  // namespace kiln
