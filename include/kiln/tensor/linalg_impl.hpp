#pragma once
// The definitions of the matrix products (tensor/linalg.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/linalg.hpp"

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

}  // namespace kiln

namespace kiln {
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
  detail::einsum_sizes(spec, {a}, equation);
  std::string have = spec.inputs[0];
  return detail::einsum_arrange(a, have, spec.output, spec.output);
}

KILN_ENTRY Tensor einsum(const std::string& equation, const Tensor& a_in, const Tensor& b_in) {
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
