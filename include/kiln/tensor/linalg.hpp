#pragma once
// Matrix products: matmul (torch.matmul's rules), mm, bmm, addmm, linear, einsum. Each lowers
// to the MatMul primitive over views (transposes and broadcast batch dims are strides, not
// copies) plus pointwise ops, which the step planner fuses around the library call. Under an
// AutocastGuard each casts its floating inputs (not f64) to the autocast dtype first.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kiln/runtime/gemm.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

/// How float32 products may be computed, as torch.set_float32_matmul_precision: "highest"
/// (the default: full float32) or "high" / "medium" (TF32 tensor cores allowed on the GPU; the
/// CPU always computes in full float32). ValueError for any other name.
inline void set_float32_matmul_precision(const std::string& precision) {
  if (precision != "highest" && precision != "high" && precision != "medium")
    throw ValueError("set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"" + precision +
                     "\"");
  runtime::float32_matmul_precision_setting().store(precision == "highest" ? 0 : precision == "high" ? 1 : 2);
}

/// The current setting: "highest", "high" or "medium".
inline std::string get_float32_matmul_precision() {
  int v = runtime::float32_matmul_precision_setting().load();
  return v == 0 ? "highest" : v == 1 ? "high" : "medium";
}

namespace detail {

inline std::string describe_pair(const Tensor& a, const Tensor& b) { return describe(a) + " and " + describe(b); }

/// A product's operand as autocast gives it (torch's lower_precision_fp policy).
template <class E>
Tensor product_operand(const E& e) {
  return autocast_cast(to_tensor(e), AutocastClass::LowerPrecision);
}

/// The checks every product makes before it builds anything: one device, one floating dtype.
inline void check_product_operands(const Tensor& a, const Tensor& b, const char* op) {
  check_same_device(a.device(), b.device(), op);
  if (a.dtype() != b.dtype())
    throw DTypeError(std::string(op) + ": expected both operands of one dtype, got " + describe_pair(a, b));
  if (!is_floating(a.dtype()))
    throw DTypeError(std::string(op) + ": defined for float32, float64, float16 and bfloat16, got " +
                     describe_pair(a, b));
}

/// `t` with leading size-1 dims added up to `rank` and then expanded to `shape` (a view).
inline ir::NodePtr expand_to(const ir::NodePtr& t, const Shape& shape) {
  if (t->shape == shape) return t;
  Shape padded(shape.size() - t->shape.size(), 1);
  for (auto d : t->shape) padded.push_back(d);
  ir::NodePtr n = padded == t->shape ? t : ir::reshape(t, padded);
  return padded == shape ? n : decomp::expand(n, shape);
}

/// The product of a [..., M, K] and b [..., K, N] whose batch dims broadcast; the result has
/// the broadcast batch dims. A b without batch dims folds a's batch into M (one large product
/// instead of a batch of small ones, as PyTorch does).
inline ir::NodePtr batched_product(const Tensor& a, const Tensor& b, const char* op) {
  const Shape &as = a.shape(), &bs = b.shape();
  const std::size_t ra = as.size(), rb = bs.size();
  if (as[ra - 1] != bs[rb - 2])
    throw ShapeError(std::string(op) + ": inner dimensions differ: " + describe_pair(a, b) + " (" +
                     std::to_string(as[ra - 1]) + " != " + std::to_string(bs[rb - 2]) + ")");
  const std::int64_t M = as[ra - 2], K = as[ra - 1], N = bs[rb - 1];
  if (rb == 2 && ra > 2) {
    Shape rows(std::vector<std::int64_t>(as.begin(), as.end() - 1));
    ir::NodePtr p = ir::matmul(ir::reshape(a.node(), Shape{rows.numel(), K}), b.node());
    rows.push_back(N);
    return ir::reshape(p, rows);
  }
  Shape a_batch(std::vector<std::int64_t>(as.begin(), as.end() - 2));
  Shape b_batch(std::vector<std::int64_t>(bs.begin(), bs.end() - 2));
  Shape batch;
  try {
    batch = broadcast_shapes(a_batch, b_batch, op);
  } catch (const ShapeError&) {
    throw ShapeError(std::string(op) + ": batch dimensions " + a_batch.str() + " and " + b_batch.str() +
                     " cannot be broadcast, for " + describe_pair(a, b));
  }
  Shape a_full = batch, b_full = batch;
  a_full.push_back(M);
  a_full.push_back(K);
  b_full.push_back(K);
  b_full.push_back(N);
  checked_numel(a_full, op);
  checked_numel(b_full, op);
  return ir::matmul(expand_to(a.node(), a_full), expand_to(b.node(), b_full));
}

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

/// beta * c + alpha * (a @ b) (torch.addmm): a, b 2-D, c broadcastable to [M, N]. With beta 0
/// c is not read (NaN and inf in it do not propagate), as PyTorch.
template <class C, class A, class B>
requires(TensorLike<C>&& TensorLike<A>&& TensorLike<B>) Tensor
    addmm(const C& c_in, const A& a_in, const B& b_in, double beta = 1.0, double alpha = 1.0) {
  Tensor c = detail::product_operand(c_in);
  Tensor p = mm(a_in, b_in);
  detail::check_same_device(c.device(), p.device(), "addmm");
  if (c.dtype() != p.dtype())
    throw DTypeError("addmm: expected c of the product's dtype, got c " + detail::describe(c) + " and a product " +
                     detail::describe(p));
  if (broadcast_shapes(c.shape(), p.shape(), "addmm") != p.shape())
    throw ShapeError("addmm: c " + detail::describe(c) + " does not broadcast to the product's shape " +
                     p.shape().str());
  Tensor scaled = alpha == 1.0 ? p : Tensor(p * alpha);
  if (beta == 0.0) return scaled;
  return beta == 1.0 ? Tensor(c + scaled) : Tensor(c * beta + scaled);
}

/// x @ w^T + bias (torch.nn.functional.linear): x [..., in], w [out, in] (or [in]: the
/// output's last dim is dropped), bias [out] or broadcastable, or undefined `Tensor{}`.
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

inline EinsumSpec parse_einsum(const std::string& eq, std::size_t operands) {
  auto fail = [&](const std::string& why) { throw ValueError("einsum(\"" + eq + "\"): " + why); };
  EinsumSpec spec;
  std::string lhs = eq, rhs;
  const auto arrow = eq.find("->");
  const bool explicit_out = arrow != std::string::npos;
  if (explicit_out) {
    lhs = eq.substr(0, arrow);
    rhs = eq.substr(arrow + 2);
  }
  auto clean = [&](const std::string& s) {
    std::string out;
    for (char ch : s) {
      if (ch == ' ') continue;
      if (ch == '.') fail("'...' (ellipsis) is not supported; name every dimension");
      if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
        fail(std::string("unexpected character '") + ch + "'");
      out.push_back(ch);
    }
    return out;
  };
  std::size_t start = 0;
  for (;;) {
    auto comma = lhs.find(',', start);
    spec.inputs.push_back(clean(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (spec.inputs.size() != operands)
    fail(std::to_string(spec.inputs.size()) + " operand(s) in the equation, " + std::to_string(operands) + " given");
  std::map<char, int> count;
  for (auto& in : spec.inputs) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (in.find(in[i], i + 1) != std::string::npos)
        fail(std::string("index '") + in[i] + "' repeats within one operand (diagonals are not supported)");
      ++count[in[i]];
    }
  }
  if (explicit_out) {
    spec.output = clean(rhs);
    for (std::size_t i = 0; i < spec.output.size(); ++i) {
      if (!count.count(spec.output[i])) fail(std::string("output index '") + spec.output[i] + "' is in no operand");
      if (spec.output.find(spec.output[i], i + 1) != std::string::npos)
        fail(std::string("output index '") + spec.output[i] + "' repeats");
    }
  } else {
    for (auto& [c, n] : count)
      if (n == 1) spec.output.push_back(c);
  }
  return spec;
}

/// The sizes of every letter, checked across operands (a size of 1 broadcasts, as torch.einsum).
inline std::map<char, std::int64_t> einsum_sizes(const EinsumSpec& spec, const std::vector<Tensor>& ts,
                                                 const std::string& eq) {
  std::map<char, std::int64_t> size;
  for (std::size_t k = 0; k < ts.size(); ++k) {
    const std::string& in = spec.inputs[k];
    if (static_cast<std::int64_t>(in.size()) != ts[k].dim())
      throw ShapeError("einsum(\"" + eq + "\"): operand " + std::to_string(k) + " " + describe(ts[k]) + " has " +
                       std::to_string(ts[k].dim()) + " dims, the equation names " + std::to_string(in.size()));
    for (std::size_t d = 0; d < in.size(); ++d) {
      std::int64_t s = ts[k].shape()[d];
      auto it = size.find(in[d]);
      if (it == size.end() || it->second == 1)
        size[in[d]] = s;
      else if (s != 1 && s != it->second)
        throw ShapeError("einsum(\"" + eq + "\"): index '" + std::string(1, in[d]) + "' has sizes " +
                         std::to_string(it->second) + " and " + std::to_string(s));
    }
  }
  return size;
}

/// `t` (letters `have`) summed over the letters not in `keep`, then permuted to the order of
/// `want` (every letter of `want` is in `have` after the sum).
inline Tensor einsum_arrange(Tensor t, std::string& have, const std::string& keep, const std::string& want) {
  std::vector<std::int64_t> drop;
  std::string left;
  for (std::size_t d = 0; d < have.size(); ++d) {
    if (keep.find(have[d]) == std::string::npos)
      drop.push_back(static_cast<std::int64_t>(d));
    else
      left.push_back(have[d]);
  }
  if (!drop.empty()) t = sum(t, Axes(drop), false);
  have = left;
  std::vector<std::int64_t> perm;
  for (char c : want) perm.push_back(static_cast<std::int64_t>(have.find(c)));
  bool identity = true;
  for (std::size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<std::int64_t>(i);
  if (!identity) t = permute(t, perm);
  have = want;
  return t;
}

}  // namespace detail

/// Einstein summation over one or two operands (torch.einsum), e.g. "bik,bkj->bij", "ij->ji",
/// "i,i->", "bhqd,bhkd->bhqk". Contracted indices become one matrix product over views; with
/// none, the result is a broadcast product (two operands) or a sum and permutation (one).
/// Indices of size 1 broadcast. Not supported (ValueError): "..." and an index repeated within
/// one operand (a diagonal).
inline Tensor einsum(const std::string& equation, const Tensor& a_in) {
  Tensor a = detail::product_operand(a_in);
  detail::AutocastSuspend inner;  // its sum runs in the dtype autocast chose (torch's einsum)
  auto spec = detail::parse_einsum(equation, 1);
  detail::einsum_sizes(spec, {a}, equation);
  std::string have = spec.inputs[0];
  return detail::einsum_arrange(a, have, spec.output, spec.output);
}

/// Two operands: see above.
inline Tensor einsum(const std::string& equation, const Tensor& a_in, const Tensor& b_in) {
  Tensor a = detail::product_operand(a_in), b = detail::product_operand(b_in);
  detail::AutocastSuspend inner;  // sums of letters in one operand keep the product's dtype
  auto spec = detail::parse_einsum(equation, 2);
  auto size = detail::einsum_sizes(spec, {a, b}, equation);
  detail::check_same_device(a.device(), b.device(), "einsum");
  const std::string &la = spec.inputs[0], &lb = spec.inputs[1], &out = spec.output;
  auto in = [](const std::string& s, char c) { return s.find(c) != std::string::npos; };
  std::string batch, left, right, contracted;
  for (char c : la) {
    if (in(lb, c))
      (in(out, c) ? batch : contracted).push_back(c);
    else if (in(out, c))
      left.push_back(c);
  }
  for (char c : lb)
    if (!in(la, c) && in(out, c)) right.push_back(c);
  // Letters in one operand only and not in the output are summed out of that operand first.
  std::string ha = la, hb = lb;
  if (contracted.empty()) {
    // No contraction: a broadcast product in the output's order.
    auto spread = [&](Tensor t, std::string& have) {
      t = detail::einsum_arrange(t, have, out, [&] {
        std::string w;
        for (char c : out)
          if (in(have, c)) w.push_back(c);
        return w;
      }());
      Shape s;
      for (char c : out) s.push_back(in(have, c) ? t.shape()[have.find(c)] : 1);
      return reshape(t, s);
    };
    Tensor ta = spread(a, ha), tb = spread(b, hb);
    if (ta.dtype() != tb.dtype())
      throw DTypeError("einsum(\"" + equation + "\"): expected both operands of one dtype, got " +
                       detail::describe_pair(a, b));
    return Tensor(ta * tb);
  }
  detail::check_product_operands(a, b, "einsum");
  Tensor ta = detail::einsum_arrange(a, ha, batch + left + contracted, batch + left + contracted);
  Tensor tb = detail::einsum_arrange(b, hb, batch + contracted + right, batch + contracted + right);
  auto extent = [&](const std::string& letters) {
    std::int64_t n = 1;
    for (char c : letters) n *= size[c];
    return n;
  };
  // Broadcast size-1 letters to their full size before the batch dims are merged.
  auto full = [&](const Tensor& t, const std::string& letters) {
    Shape s;
    for (char c : letters) s.push_back(size[c]);
    return t.shape() == s ? t : broadcast_to(t, s);
  };
  ta = full(ta, batch + left + contracted);
  tb = full(tb, batch + contracted + right);
  Tensor ma = reshape(ta, Shape{extent(batch), extent(left), extent(contracted)});
  Tensor mb = reshape(tb, Shape{extent(batch), extent(contracted), extent(right)});
  Tensor p = Tensor(ir::matmul(ma.node(), mb.node()));
  Shape s;
  for (char c : batch + left + right) s.push_back(size[c]);
  std::string have = batch + left + right;
  return detail::einsum_arrange(reshape(p, s), have, out, out);
}

}  // namespace kiln
