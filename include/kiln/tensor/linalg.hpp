#pragma once
// Matrix products: matmul (torch.matmul's rules), mm, bmm, addmm, linear, einsum, tensordot. Each
// lowers to the MatMul primitive over views (transposes and broadcast batch dims are strides, not
// copies) plus pointwise ops, which the step planner fuses around the library call. Under an
// AutocastGuard each casts its floating inputs (not f64) to the autocast dtype first. Beside
// them the products and distances built from pointwise ops and reductions: kron, cdist, dist.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/runtime/gemm.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

/// How float32 products may be computed, as torch.set_float32_matmul_precision: "highest"
/// (the default: full float32) or "high" / "medium" (TF32 tensor cores allowed on the GPU; the
/// CPU always computes in full float32). ValueError for any other name.
KILN_ENTRY void set_float32_matmul_precision(const std::string& precision);

/// The current setting: "highest", "high" or "medium".
KILN_ENTRY std::string get_float32_matmul_precision();

namespace detail {

inline std::string describe_pair(const Tensor& a, const Tensor& b) { return describe(a) + " and " + describe(b); }

/// A product's operand as autocast gives it (torch's lower_precision_fp policy).
template <class E>
Tensor product_operand(const E& e) {
  return autocast_cast(to_tensor(e), AutocastClass::LowerPrecision);
}

/// The checks every product makes before it builds anything: one device, one floating dtype.
KILN_ENTRY void check_product_operands(const Tensor& a, const Tensor& b, const char* op);

/// `t` with leading size-1 dims added up to `rank` and then expanded to `shape` (a view).
KILN_ENTRY ir::NodePtr expand_to(const ir::NodePtr& t, const Shape& shape);

/// The product of a [..., M, K] and b [..., K, N] whose batch dims broadcast; the result has
/// the broadcast batch dims. A b without batch dims folds a's batch into M (one large product
/// instead of a batch of small ones, as PyTorch does).
KILN_ENTRY ir::NodePtr batched_product(const Tensor& a, const Tensor& b, const char* op);

}  // namespace detail

/// Matrix product with torch.matmul's rules: 1-D x 1-D is a dot product (0-dim result); 2-D x
/// 2-D a matrix product; a 1-D first operand is a row vector [1, K] and a 1-D second operand a
/// column vector [K, 1], the added dim removed from the result; operands of rank > 2 are
/// batches of matrices whose batch dims broadcast. float32, float64, float16 and bfloat16 (the
/// half types accumulate in float32); both operands of one dtype and one device. ShapeError
/// (rank 0, inner sizes, batch dims) or DTypeError naming matmul, both shapes and dtypes.
template <class A, class B>
requires(TensorLike<A>&& TensorLike<B>) Tensor matmul(const A& a_in, const B& b_in) {
  Tensor a = detail::product_operand(a_in), b = detail::product_operand(b_in);
  if (a.dim() == 0 || b.dim() == 0)
    throw ShapeError("matmul: both arguments need at least 1 dimension, got " + detail::describe_pair(a, b));
  detail::check_product_operands(a, b, "matmul");
  const bool a_vector = a.dim() == 1, b_vector = b.dim() == 1;
  Tensor a2 = a_vector ? Tensor(ir::reshape(a.node(), Shape{1, a.shape()[0]})) : a;
  Tensor b2 = b_vector ? Tensor(ir::reshape(b.node(), Shape{b.shape()[0], 1})) : b;
  if (a2.shape().back() != b2.shape()[b2.dim() - 2])
    throw ShapeError("matmul: inner dimensions differ: " + detail::describe_pair(a, b) + " (" +
                     std::to_string(a2.shape().back()) + " != " + std::to_string(b2.shape()[b2.dim() - 2]) + ")");
  ir::NodePtr p = detail::batched_product(a2, b2, "matmul");
  if (!a_vector && !b_vector) return Tensor(p);
  Shape out = p->shape;
  if (b_vector) out.erase(out.end() - 1);
  if (a_vector) out.erase(out.end() - (b_vector ? 1 : 2));
  return Tensor(ir::reshape(p, out));
}

/// Product of two matrices [M, K] x [K, N] (torch.mm): both 2-D, no broadcasting.
template <class A, class B>
requires(TensorLike<A>&& TensorLike<B>) Tensor mm(const A& a_in, const B& b_in) {
  Tensor a = detail::product_operand(a_in), b = detail::product_operand(b_in);
  if (a.dim() != 2 || b.dim() != 2)
    throw ShapeError("mm: expected two 2-D tensors, got " + detail::describe_pair(a, b));
  detail::check_product_operands(a, b, "mm");
  return Tensor(detail::batched_product(a, b, "mm"));
}

/// Batched product [B, M, K] x [B, K, N] (torch.bmm): both 3-D with equal batch sizes.
template <class A, class B>
requires(TensorLike<A>&& TensorLike<B>) Tensor bmm(const A& a_in, const B& b_in) {
  Tensor a = detail::product_operand(a_in), b = detail::product_operand(b_in);
  if (a.dim() != 3 || b.dim() != 3)
    throw ShapeError("bmm: expected two 3-D tensors, got " + detail::describe_pair(a, b));
  if (a.shape()[0] != b.shape()[0]) throw ShapeError("bmm: batch sizes differ: " + detail::describe_pair(a, b));
  detail::check_product_operands(a, b, "bmm");
  return Tensor(detail::batched_product(a, b, "bmm"));
}

namespace detail {
/// beta * c + alpha * p for addmm and baddbmm: c of p's dtype and device, broadcasting to p's
/// shape (DTypeError / ShapeError naming `op`); with beta 0 c is not read.
inline Tensor add_scaled_product(const Tensor& c, const Tensor& p, double beta, double alpha, const char* op) {
  check_same_device(c.device(), p.device(), op);
  if (c.dtype() != p.dtype())
    throw DTypeError(std::string(op) + ": expected c of the product's dtype, got c " + describe(c) + " and a product " +
                     describe(p));
  if (broadcast_shapes(c.shape(), p.shape(), op) != p.shape())
    throw ShapeError(std::string(op) + ": c " + describe(c) + " does not broadcast to the product's shape " +
                     p.shape().str());
  Tensor scaled = alpha == 1.0 ? p : Tensor(p * alpha);
  // beta 0: c's values are not read, but c stays in the graph with a zero gradient (torch's
  // backward gives it beta * grad = 0, not "unused").
  if (beta == 0.0)
    return c.requires_grad() ? Tensor(where(full(Shape{}, 0.0, DType::Bool, p.device()), c, scaled)) : scaled;
  return beta == 1.0 ? Tensor(c + scaled) : Tensor(c * beta + scaled);
}
}  // namespace detail

/// beta * c + alpha * (a @ b) (torch.addmm): a, b 2-D, c broadcastable to [M, N]. With beta 0
/// c is not read (NaN and inf in it do not propagate), as PyTorch.
template <class C, class A, class B>
requires(TensorLike<C>&& TensorLike<A>&& TensorLike<B>) Tensor
    addmm(const C& c_in, const A& a_in, const B& b_in, double beta = 1.0, double alpha = 1.0) {
  return detail::add_scaled_product(detail::product_operand(c_in), mm(a_in, b_in), beta, alpha, "addmm");
}

/// The inner product of two 1-D tensors of one length (torch.dot), a 0-dim tensor: matmul's for
/// floating dtypes; ShapeError for other ranks or lengths, DTypeError for differing dtypes.
template <class A, class B>
requires(TensorLike<A>&& TensorLike<B>) Tensor dot(const A& a_in, const B& b_in) {
  Tensor a = detail::to_tensor(a_in), b = detail::to_tensor(b_in);
  // On torch's autocast promote list: the widest of the inputs' dtypes, the product under it run
  // without autocast.
  detail::autocast_promote({&a, &b});
  detail::AutocastSuspend inner;
  if (a.dim() != 1 || b.dim() != 1 || a.shape()[0] != b.shape()[0])
    throw ShapeError("dot: expected two 1-D tensors of one length, got " + detail::describe_pair(a, b));
  if (a.dtype() != b.dtype()) throw DTypeError("dot: expected both vectors of one dtype, got " + detail::describe_pair(a, b));
  return matmul(a, b);
}

/// The product of a matrix [M, K] and a vector [K] (torch.mv), a vector [M].
template <class A, class B>
requires(TensorLike<A>&& TensorLike<B>) Tensor mv(const A& a_in, const B& b_in) {
  Tensor a = detail::to_tensor(a_in), b = detail::to_tensor(b_in);
  if (a.dim() != 2 || b.dim() != 1)
    throw ShapeError("mv: expected a matrix and a vector, got " + detail::describe_pair(a, b));
  return matmul(a, b);
}

/// beta * c + alpha * bmm(a, b) (torch.baddbmm): a [B, M, K], b [B, K, N], c broadcastable to
/// [B, M, N]. With beta 0 c is not read (NaN and inf in it do not propagate), as PyTorch.
template <class C, class A, class B>
requires(TensorLike<C>&& TensorLike<A>&& TensorLike<B>) Tensor
    baddbmm(const C& c_in, const A& a_in, const B& b_in, double beta = 1.0, double alpha = 1.0) {
  return detail::add_scaled_product(detail::product_operand(c_in), bmm(a_in, b_in), beta, alpha, "baddbmm");
}

/// x @ w^T + bias (torch.nn.functional.linear): x [..., in], w [out, in] (or [in]: the
/// output's last dim is dropped), bias [out] or broadcastable ([] only, for a 1-D weight), or
/// undefined `Tensor{}`.
template <class X, class W>
requires(TensorLike<X>&& TensorLike<W>) Tensor linear(const X& x_in, const W& w_in, const Tensor& bias_in = {}) {
  Tensor x = detail::product_operand(x_in), w = detail::product_operand(w_in);
  const Tensor bias = detail::autocast_cast(bias_in, detail::AutocastClass::LowerPrecision);
  if (x.dim() == 0 || w.dim() == 0 || w.dim() > 2)
    throw ShapeError("linear: expected an input of rank >= 1 and a 1-D or 2-D weight, got " +
                     detail::describe_pair(x, w));
  detail::check_product_operands(x, w, "linear");
  if (x.shape().back() != w.shape().back())
    throw ShapeError("linear: input features differ: input " + detail::describe(x) + ", weight " + detail::describe(w) +
                     " (" + std::to_string(x.shape().back()) + " != " + std::to_string(w.shape().back()) + ")");
  Tensor y = matmul(x, w.dim() == 2 ? transpose(w, 0, 1) : w);
  if (!bias.defined()) return y;
  detail::check_same_device(bias.device(), y.device(), "linear");
  if (bias.dtype() != y.dtype())
    throw DTypeError("linear: bias " + detail::describe(bias) + " is not of the input's dtype " +
                     dtype_name(y.dtype()));
  // torch's shapes: bias [out] or [] for a 2-D weight, [] for a 1-D one (no output features).
  if (w.dim() == 1 && bias.dim() != 0)
    throw ShapeError("linear: a 1-D weight " + detail::describe(w) + " takes a 0-dim bias, got bias " +
                     detail::describe(bias));
  if (broadcast_shapes(y.shape(), bias.shape(), "linear") != y.shape())
    throw ShapeError("linear: bias " + detail::describe(bias) + " does not broadcast to the output's shape " +
                     y.shape().str());
  return Tensor(y + bias);
}

template <class E>
Tensor Expr<E>::matmul(const Tensor& other) const {
  return kiln::matmul(derived(), other);
}

namespace detail {

/// One operand's letters and the output's, parsed from "ij,jk->ik" (or implicit output: the
/// letters that appear once, alphabetically, as torch.einsum).
struct EinsumSpec {
  std::vector<std::string> inputs;
  std::string output;
};

KILN_ENTRY EinsumSpec parse_einsum(const std::string& eq, std::size_t operands);

/// The sizes of every letter, checked across operands (a size of 1 broadcasts, as torch.einsum).
KILN_ENTRY std::map<char, std::int64_t> einsum_sizes(const EinsumSpec& spec, const std::vector<Tensor>& ts,
                                                     const std::string& eq);

/// `t` (letters `have`) summed over the letters not in `keep`, then permuted to the order of
/// `want` (every letter of `want` is in `have` after the sum).
/// A letter repeated within one operand ("ii->i", "ii", "bii->bi") takes that operand's
/// diagonal over those dims (torch.einsum): t with each repeat reduced to one dim at the end,
/// `letters` rewritten to match. Sizes that differ are a ShapeError naming the letter.
KILN_ENTRY Tensor einsum_diagonals(Tensor t, std::string& letters, std::size_t operand, const std::string& eq);

KILN_ENTRY Tensor einsum_arrange(Tensor t, std::string& have, const std::string& keep, const std::string& want);

}  // namespace detail

/// Einstein summation over one or two operands (torch.einsum), e.g. "bik,bkj->bij", "ij->ji",
/// "i,i->", "bhqd,bhkd->bhqk". Contracted indices become one matrix product over views; with
/// none, the result is a broadcast product (two operands) or a sum and permutation (one).
/// Indices of size 1 broadcast; an index repeated within one operand takes its diagonal
/// ("ii->i", "ii" is the trace). Not supported (ValueError): "...".
KILN_ENTRY Tensor einsum(const std::string& equation, const Tensor& a_in);

/// Two operands: see above.
KILN_ENTRY Tensor einsum(const std::string& equation, const Tensor& a_in, const Tensor& b_in);

/// The contraction of a's last `dims` dims with b's first `dims` dims (torch.tensordot with an
/// integer dims, default 2): the result has a's other dims followed by b's. ValueError for a
/// negative dims, ShapeError for more dims than either operand has.
KILN_ENTRY Tensor tensordot(const Tensor& a, const Tensor& b, std::int64_t dims = 2);

/// The contraction of a's dims `dims_a` with b's dims `dims_b`, paired in order (torch.tensordot
/// with two dim lists); the result has a's other dims followed by b's, each in its order. A
/// contracted pair whose size is 1 on one side is summed out of the other side first, as
/// torch's. a and b of one dtype (DTypeError otherwise; bool is a DTypeError, as torch's mm);
/// the floating dtypes run as one matrix product on the product kernels, the integer dtypes as a
/// broadcast product and an exact sum (kiln's products are floating only). ShapeError for lists
/// of different lengths, dims out of range or repeated, and contracted sizes that differ.
KILN_ENTRY Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<std::int64_t>& dims_a,
                            const std::vector<std::int64_t>& dims_b);

/// The Kronecker product (torch.kron): the operand of lower rank gets leading size-1 dims, and
/// result[i0 * q0 + j0, ...] = a[i0, ...] * b[j0, ...] for b's sizes q; dtypes promote as mul.
KILN_ENTRY Tensor kron(const Tensor& a, const Tensor& b);

/// The p-norm distance between each row of x1 [B..., P, M] and each row of x2 [B..., R, M]
/// (torch.cdist): [B..., P, R], the batch dims broadcast. p = 0 counts the differing columns,
/// 1 and 2 are the Manhattan and Euclidean distances, inf the largest |difference|, any other
/// p >= 0 (sum |x1 - x2|^p)^(1/p); no columns give 0. Always the direct |x1 - x2| formula
/// (torch switches p = 2 to a matrix-product formula for more than 25 rows, which differs from
/// it by rounding only). NaN propagates through every p. Gradients are torch's
/// _cdist_backward: 0 at a zero distance, for p < 1 also 0 where a difference is 0, and for
/// p = inf the full gradient to every column that attains the maximum. Floating inputs of one
/// dtype (DTypeError otherwise); float16 and bfloat16 compute in float32. ShapeError for ranks
/// below 2, column counts that differ and batch dims that do not broadcast; ValueError for a
/// negative (or NaN) p. Under autocast half inputs run in float32, as torch's fp32 list.
KILN_ENTRY Tensor cdist(const Tensor& x1, const Tensor& x2, double p = 2.0);

/// The p-norm of a - b over all elements, a and b broadcast (torch.dist): a 0-dim tensor,
/// linalg::vector_norm(a - b, p) with its values and gradients (0 at a zero distance). The two
/// promote to a floating dtype or it is a DTypeError, as torch's norm.
KILN_ENTRY Tensor dist(const Tensor& a, const Tensor& b, double p = 2.0);

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/linalg_impl.hpp"
#endif
