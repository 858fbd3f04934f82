#pragma once
// The definitions of the matrix products (tensor/linalg.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/linalg.hpp"
// tensordot's dim lists (detail::ints_str), dist's norm (linalg::vector_norm).
#include "kiln/tensor/composites.hpp"
#include "kiln/tensor/shape_ops.hpp"

namespace kiln {

KILN_ENTRY void set_float32_matmul_precision(const std::string& precision) {
  if (precision != "highest" && precision != "high" && precision != "medium")
    throw ValueError("set_float32_matmul_precision: expected \"highest\", \"high\" or \"medium\", got \"" + precision +
                     "\"");
  runtime::float32_matmul_precision_setting().store(precision == "highest" ? 0 : precision == "high" ? 1 : 2);
}

KILN_ENTRY std::string get_float32_matmul_precision() {
  int v = runtime::float32_matmul_precision_setting().load();
  return v == 0 ? "highest" : v == 1 ? "high" : "medium";
}

namespace detail {

KILN_ENTRY void check_product_operands(const Tensor& a, const Tensor& b, const char* op) {
  check_same_device(a.device(), b.device(), op);
  if (a.dtype() != b.dtype())
    throw DTypeError(std::string(op) + ": expected both operands of one dtype, got " + describe_pair(a, b));
  if (!is_floating(a.dtype()))
    throw DTypeError(std::string(op) + ": defined for float32, float64, float16 and bfloat16, got " +
                     describe_pair(a, b));
}

KILN_ENTRY ir::NodePtr expand_to(const ir::NodePtr& t, const Shape& shape) {
  if (t->shape == shape) return t;
  Shape padded(shape.size() - t->shape.size(), 1);
  for (auto d : t->shape) padded.push_back(d);
  ir::NodePtr n = padded == t->shape ? t : ir::reshape(t, padded);
  return padded == shape ? n : decomp::expand(n, shape);
}

KILN_ENTRY ir::NodePtr batched_product(const Tensor& a, const Tensor& b, const char* op) {
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

KILN_ENTRY EinsumSpec parse_einsum(const std::string& eq, std::size_t operands) {
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
    for (char c : in) ++count[c];
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

KILN_ENTRY std::map<char, std::int64_t> einsum_sizes(const EinsumSpec& spec, const std::vector<Tensor>& ts,
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

KILN_ENTRY Tensor einsum_diagonals(Tensor t, std::string& letters, std::size_t operand, const std::string& eq) {
  if (static_cast<std::int64_t>(letters.size()) != t.dim()) return t;  // einsum_sizes reports it
  for (std::size_t first = 0; first < letters.size(); ++first) {
    const std::size_t again = letters.find(letters[first], first + 1);
    if (again == std::string::npos) continue;
    const auto d1 = static_cast<std::int64_t>(first), d2 = static_cast<std::int64_t>(again);
    if (t.shape()[d1] != t.shape()[d2])
      throw ShapeError("einsum(\"" + eq + "\"): index '" + std::string(1, letters[first]) +
                       "' is repeated in operand " + std::to_string(operand) + " " + describe(t) +
                       " but the sizes don't match, " + std::to_string(t.shape()[d1]) +
                       " != " + std::to_string(t.shape()[d2]));
    // The diagonal replaces both dims with one at the end.
    const char c = letters[first];
    t = diagonal(t, 0, d1, d2);
    letters.erase(again, 1);
    letters.erase(first, 1);
    letters.push_back(c);
    first = static_cast<std::size_t>(-1);  // look again from the start
  }
  return t;
}

KILN_ENTRY Tensor einsum_arrange(Tensor t, std::string& have, const std::string& keep, const std::string& want) {
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
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor einsum(const std::string& equation, const Tensor& a_in) {
  Tensor a = detail::product_operand(a_in);
  detail::AutocastSuspend inner;  // its sum runs in the dtype autocast chose (torch's einsum)
  auto spec = detail::parse_einsum(equation, 1);
  a = detail::einsum_diagonals(a, spec.inputs[0], 0, equation);
  detail::einsum_sizes(spec, {a}, equation);
  std::string have = spec.inputs[0];
  return detail::einsum_arrange(a, have, spec.output, spec.output);
}

KILN_ENTRY Tensor einsum(const std::string& equation, const Tensor& a_in, const Tensor& b_in) {
  Tensor a = detail::product_operand(a_in), b = detail::product_operand(b_in);
  detail::AutocastSuspend inner;  // sums of letters in one operand keep the product's dtype
  auto spec = detail::parse_einsum(equation, 2);
  a = detail::einsum_diagonals(a, spec.inputs[0], 0, equation);
  b = detail::einsum_diagonals(b, spec.inputs[1], 1, equation);
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

namespace kiln {

KILN_ENTRY Tensor tensordot(const Tensor& a_in, const Tensor& b_in, std::int64_t dims) {
  const Tensor a = detail::to_tensor(a_in), b = detail::to_tensor(b_in);
  if (dims < 0)
    throw ValueError("tensordot: expects dims >= 0, got dims=" + std::to_string(dims) + " for " +
                     detail::describe_pair(a, b));
  if (dims > std::min(a.dim(), b.dim()))
    throw ShapeError("tensordot: dims=" + std::to_string(dims) + " exceeds the rank of " + detail::describe_pair(a, b));
  std::vector<std::int64_t> dims_a, dims_b;
  for (std::int64_t i = 0; i < dims; ++i) {
    dims_a.push_back(a.dim() - dims + i);
    dims_b.push_back(i);
  }
  return tensordot(a, b, dims_a, dims_b);
}

KILN_ENTRY Tensor tensordot(const Tensor& a_in, const Tensor& b_in, const std::vector<std::int64_t>& dims_a,
                            const std::vector<std::int64_t>& dims_b) {
  // On torch's autocast promote list: the inputs in the widest of their dtypes, and the product
  // under it run without autocast (float32 inputs give a float32 result).
  Tensor a = detail::to_tensor(a_in), b = detail::to_tensor(b_in);
  detail::autocast_promote({&a, &b});
  detail::AutocastSuspend inner;
  const std::string lists = detail::ints_str(dims_a) + " and " + detail::ints_str(dims_b);
  if (dims_a.size() != dims_b.size())
    throw ShapeError("tensordot: both dimension lists should have the same length, got " + lists + " for " +
                     detail::describe_pair(a, b));
  detail::check_same_device(a.device(), b.device(), "tensordot");
  if (a.dtype() != b.dtype())
    throw DTypeError("tensordot: both inputs should have one dtype, got " + detail::describe_pair(a, b));
  if (a.dtype() == DType::Bool)
    throw DTypeError("tensordot: not supported for bool tensors, got " + detail::describe_pair(a, b));
  // Unlike tensor_axis, no dim of a 0-dim operand can be contracted (torch's sizes() has none).
  auto axes = [&](const std::vector<std::int64_t>& dims, const Tensor& t) {
    std::vector<std::int64_t> out;
    for (auto d : dims) {
      const std::int64_t r = t.dim();
      if (d < -r || d >= r)
        throw ShapeError("tensordot: dim " + std::to_string(d) + " of " + lists + " is out of range for " +
                         detail::describe(t));
      const std::int64_t k = d < 0 ? d + r : d;
      if (std::find(out.begin(), out.end(), k) != out.end())
        throw ShapeError("tensordot: dim " + std::to_string(k) + " appears more than once in " + lists + " for " +
                         detail::describe(t));
      out.push_back(k);
    }
    return out;
  };
  const std::vector<std::int64_t> ca = axes(dims_a, a), cb = axes(dims_b, b);
  for (std::size_t i = 0; i < ca.size(); ++i) {
    const std::int64_t s1 = a.shape()[static_cast<std::size_t>(ca[i])], s2 = b.shape()[static_cast<std::size_t>(cb[i])];
    if (s1 != s2 && s1 != 1 && s2 != 1)
      throw ShapeError("tensordot: contracted dimensions need to match, but first has size " + std::to_string(s1) +
                       " in dim " + std::to_string(ca[i]) + " and second has size " + std::to_string(s2) + " in dim " +
                       std::to_string(cb[i]) + " (" + detail::describe_pair(a, b) + ")");
  }
  Tensor ta = a, tb = b;
  std::int64_t csize = 1;
  // A pair with size 1 on one side broadcasts: the other side is summed over it first (in its own
  // dtype, as torch's sum(dim, keepdim, dtype)), leaving size 1 on both.
  auto summed = [](const Tensor& t, std::int64_t axis) {
    Tensor s = sum(t, {axis}, true);
    return s.dtype() == t.dtype() ? s : s.to(t.dtype());
  };
  for (std::size_t i = 0; i < ca.size(); ++i) {
    const std::int64_t s1 = a.shape()[static_cast<std::size_t>(ca[i])], s2 = b.shape()[static_cast<std::size_t>(cb[i])];
    if (s2 == 1)
      ta = summed(ta, ca[i]);
    else if (s1 == 1)
      tb = summed(tb, cb[i]);
    else
      csize *= s1;
  }
  std::vector<std::int64_t> pa, pb;
  Shape out;
  std::int64_t size1 = 1, size2 = 1;
  for (std::int64_t i = 0; i < a.dim(); ++i)
    if (std::find(ca.begin(), ca.end(), i) == ca.end()) {
      pa.push_back(i);
      size1 *= a.shape()[static_cast<std::size_t>(i)];
      out.push_back(a.shape()[static_cast<std::size_t>(i)]);
    }
  pa.insert(pa.end(), ca.begin(), ca.end());
  pb = cb;
  for (std::int64_t i = 0; i < b.dim(); ++i)
    if (std::find(cb.begin(), cb.end(), i) == cb.end()) {
      pb.push_back(i);
      size2 *= b.shape()[static_cast<std::size_t>(i)];
      out.push_back(b.shape()[static_cast<std::size_t>(i)]);
    }
  checked_numel(out, "tensordot");
  const Tensor ma = reshape(permute(ta, pa), Shape{size1, csize});
  const Tensor mb = reshape(permute(tb, pb), Shape{csize, size2});
  if (is_floating(a.dtype())) return reshape(mm(ma, mb), out);
  // Integers: the products summed exactly in int64, then wrapped to the dtype as torch's
  // integer matrix product wraps.
  const Tensor prod = reshape(ma, Shape{size1, csize, 1}) * reshape(mb, Shape{1, csize, size2});
  return reshape(sum(prod, {1}).to(a.dtype()), out);
}

KILN_ENTRY Tensor kron(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = detail::to_tensor(a_in), b = detail::to_tensor(b_in);
  detail::check_same_device(a.device(), b.device(), "kron");
  const std::int64_t rank = std::max(a.dim(), b.dim());
  const std::size_t pad_a = static_cast<std::size_t>(rank - a.dim()), pad_b = static_cast<std::size_t>(rank - b.dim());
  // a's sizes on the even dims, b's on the odd ones: their product, merged pairwise, is the result.
  Shape sa, sb, out;
  for (std::size_t i = 0; i < static_cast<std::size_t>(rank); ++i) {
    const std::int64_t da = i >= pad_a ? a.shape()[i - pad_a] : 1, db = i >= pad_b ? b.shape()[i - pad_b] : 1;
    sa.push_back(da);
    sa.push_back(1);
    sb.push_back(1);
    sb.push_back(db);
    std::int64_t o = 0;
    if (__builtin_mul_overflow(da, db, &o))
      throw ShapeError("kron: the result's size overflows int64 for " + detail::describe_pair(a, b));
    out.push_back(o);
  }
  checked_numel(out, "kron");
  return reshape(Tensor(reshape(a, sa) * reshape(b, sb)), out);
}

namespace detail {

/// torch's _cdist_backward for each difference d = x1 - x2 [..., P, R, M] of the distances
/// `dist` [..., P, R], times the gradient g of the distances.
KILN_ENTRY Tensor cdist_gradient(const Tensor& d, const Tensor& dist_in, const Tensor& g_in, double p) {
  const Tensor dist = unsqueeze(dist_in, -1), g = unsqueeze(g_in, -1);
  if (p == 0) return Tensor(ir::constant(0.0, d.dtype(), d.shape(), d.device()));
  const Tensor ad = abs(d), s = sign(d);
  Tensor h;
  if (p == 1) {
    h = s;
  } else if (p < 2) {
    // For p < 1 |d|^(p-1) is infinite at d = 0, where torch takes 0.
    const Tensor zero = p < 1 ? Tensor(logical_or(dist == 0, d == 0)) : Tensor(dist == 0);
    h = where(zero, 0.0, Tensor(s * pow(ad, p - 1) / pow(dist, p - 1)));
  } else if (p == 2) {
    h = where(dist == 0, 0.0, Tensor(d / dist));
  } else if (std::isinf(p)) {
    h = where(ad == dist, s, 0.0);
  } else {
    h = where(dist == 0, 0.0, Tensor(d * pow(ad, p - 2) / pow(dist, p - 1)));
  }
  return h * g;
}

}  // namespace detail

KILN_ENTRY Tensor cdist(const Tensor& x1_in, const Tensor& x2_in, double p) {
  const Tensor x1 = detail::to_tensor(x1_in), x2 = detail::to_tensor(x2_in);
  if (x1.dim() < 2 || x2.dim() < 2)
    throw ShapeError("cdist: only supports at least 2-D tensors, got X1 " + detail::describe(x1) + " and X2 " +
                     detail::describe(x2));
  if (x1.shape().back() != x2.shape().back())
    throw ShapeError("cdist: X1 and X2 must have the same number of columns, got X1 " + detail::describe(x1) +
                     " and X2 " + detail::describe(x2));
  if (!is_floating(x1.dtype()) || !is_floating(x2.dtype()))
    throw DTypeError("cdist: only supports floating-point dtypes, got X1 " + detail::describe(x1) + " and X2 " +
                     detail::describe(x2));
  if (x1.dtype() != x2.dtype())
    throw DTypeError("cdist: X1 and X2 must have one dtype, got X1 " + detail::describe(x1) + " and X2 " +
                     detail::describe(x2));
  if (!(p >= 0))
    throw ValueError("cdist: only supports non-negative p values, got p=" + std::to_string(p) + " for X1 " +
                     detail::describe(x1) + " and X2 " + detail::describe(x2));
  detail::check_same_device(x1.device(), x2.device(), "cdist");
  const Shape b1(std::vector<std::int64_t>(x1.shape().begin(), x1.shape().end() - 2));
  const Shape b2(std::vector<std::int64_t>(x2.shape().begin(), x2.shape().end() - 2));
  try {
    checked_numel(broadcast_shapes(b1, b2, "cdist"), "cdist");
  } catch (const ShapeError&) {
    throw ShapeError("cdist: batch dimensions " + b1.str() + " and " + b2.str() + " cannot be broadcast, for X1 " +
                     detail::describe(x1) + " and X2 " + detail::describe(x2));
  }
  // Autocast runs cdist in float32 (torch's fp32 list); the half types compute in float32 anyway.
  const Tensor a = detail::fp32_operand(x1), b = detail::fp32_operand(x2);
  const DType ct = compute_dtype(a.dtype());
  const Tensor ac = a.dtype() == ct ? a : a.to(ct), bc = b.dtype() == ct ? b : b.to(ct);
  // [..., P, 1, M] - [..., 1, R, M]: every pair of rows, the batch dims broadcast.
  const Tensor d = unsqueeze(ac, -2) - unsqueeze(bc, -3);
  const std::int64_t m = x1.shape().back();
  Tensor out;
  if (m == 0) {
    // No columns: 0 for every p (amax has no identity); the sum keeps the graph connected.
    out = sum(d, {-1});
  } else if (p == 0) {
    // Counts the differing columns; NaN stays NaN (torch's min(ceil(|d|), 1)).
    out = sum(minimum(ceil(abs(d)), 1.0), {-1});
  } else if (p == 1) {
    out = sum(abs(d), {-1});
  } else if (p == 2) {
    out = sqrt(sum(d * d, {-1}));
  } else if (std::isinf(p)) {
    out = amax(abs(d), {-1});
  } else {
    out = pow(sum(pow(abs(d), p), {-1}), 1.0 / p);
  }
  if (m > 0) {
    // torch's own rule rather than the composite's: 0 at a zero distance (not NaN), and for
    // p = inf every tied column gets the whole gradient (amax would split it).
    ir::NodePtr dn = d.node();
    decomp::with_gradient(out.node(), {dn}, [dn, p](const ir::NodePtr& r, const ir::NodePtr& g) {
      return std::vector<ir::NodePtr>{detail::cdist_gradient(Tensor(dn), Tensor(r), Tensor(g), p).node()};
    });
  }
  return out.dtype() == a.dtype() ? out : out.to(a.dtype());
}

KILN_ENTRY Tensor dist(const Tensor& a_in, const Tensor& b_in, double p) {
  const Tensor a = detail::to_tensor(a_in), b = detail::to_tensor(b_in);
  try {
    broadcast_shapes(a.shape(), b.shape(), "dist");
  } catch (const ShapeError&) {
    throw ShapeError("dist: the inputs cannot be broadcast together, got " + detail::describe_pair(a, b));
  }
  detail::ResultType rt;
  rt.add(detail::info_of(a));
  rt.add(detail::info_of(b));
  if (!is_floating(rt.result()))
    throw DTypeError("dist: expected inputs that promote to a floating dtype, got " + detail::describe_pair(a, b));
  detail::check_same_device(a.device(), b.device(), "dist");
  // Autocast runs dist in float32 (torch's fp32 list).
  return linalg::vector_norm(Tensor(detail::fp32_operand(a) - detail::fp32_operand(b)), p);
}

}  // namespace kiln
