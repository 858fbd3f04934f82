#pragma once
// The definitions of the functional forms of the layers (nn/functional.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/nn/functional.hpp"

namespace kiln::nn::functional {
namespace detail {

KILN_ENTRY ir::NodePtr dropout_key(Device device) {
  if (nn::detail::traced_randomness) {
    nn::detail::TracedRandomness& r = *nn::detail::traced_randomness;
    const std::int64_t k = r.draws++;
    ir::NodePtr seed = r.seed.node();
    if (seed->device != device)
      throw DeviceError("dropout: the input is on " + device.str() + ", the module's seed on " + seed->device.str());
    return k == 0 ? seed : ir::binary(ir::Op::Add, seed, ir::constant_int(k, DType::Int64, Shape{}, device));
  }
  return nn::detail::fresh_key("dropout", device);
}

}  // namespace detail
}  // namespace kiln::nn::functional

namespace kiln::nn::functional {

KILN_ENTRY Tensor normalize(const Tensor& input, double p, std::int64_t dim, double eps) {
  ::kiln::detail::require_float(input, "normalize");
  const Tensor denom = clamp_min(linalg::vector_norm(input, p, Axes{dim}, true), eps);
  return input / denom;
}

KILN_ENTRY Tensor cosine_similarity(const Tensor& x1_in, const Tensor& x2_in, std::int64_t dim, double eps) {
  const DType dt = promote_types(x1_in.dtype(), x2_in.dtype());
  if (!is_floating(dt))
    throw DTypeError("cosine_similarity: expected the operands' common dtype to be floating point, got " +
                     ::kiln::detail::describe(x1_in) + " and " + ::kiln::detail::describe(x2_in));
  const Shape shape = broadcast_shapes(x1_in.shape(), x2_in.shape(), "cosine_similarity");
  // Only integer (and bool) operands are converted first, as torch's: a floating operand's norm
  // and quotient are computed in its own dtype, the product promotes.
  const Tensor x1 = (is_floating(x1_in.dtype()) ? x1_in : x1_in.to(dt)).expand(shape);
  const Tensor x2 = (is_floating(x2_in.dtype()) ? x2_in : x2_in.to(dt)).expand(shape);
  // torch clamps the norms in place under no_grad: the value is clamped, the gradient is the
  // norm's own.
  auto clamped = [&](const Tensor& x) {
    const Tensor n = linalg::vector_norm(x, 2.0, Axes{dim}, true);
    return n + (clamp_min(n, eps) - n).detach();
  };
  return sum((x1 / clamped(x1)) * (x2 / clamped(x2)), Axes{dim}, false);
}

KILN_ENTRY Tensor pdist(const Tensor& input, double p) {
  if (input.dim() != 2) throw ShapeError("pdist: only supports 2D tensors, got " + ::kiln::detail::describe(input));
  if (!is_floating(input.dtype()))
    throw DTypeError("pdist: only supports floating-point dtypes, got " + ::kiln::detail::describe(input));
  if (!(p >= 0))
    throw ValueError("pdist: only supports non-negative p values, got p " + std::to_string(p) + " for input " +
                     ::kiln::detail::describe(input));
  const Tensor x = ::kiln::detail::fp32_operand(input);
  const std::int64_t n = x.shape()[0], m = x.shape()[1];
  std::vector<std::int64_t> rows_i, rows_j;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = i + 1; j < n; ++j) {
      rows_i.push_back(i);
      rows_j.push_back(j);
    }
  const std::int64_t pairs = static_cast<std::int64_t>(rows_i.size());
  // Rows of no columns are at distance 0 (torch fills them without its kernel).
  if (m == 0) return zeros({pairs}, x.dtype(), x.device());
  const Tensor diff = index_select(x, 0, from_vector(rows_i, Shape{pairs}, x.device())) -
                      index_select(x, 0, from_vector(rows_j, Shape{pairs}, x.device()));
  if (!std::isinf(p)) return linalg::vector_norm(diff, p, Axes{1});
  // torch's backward for p = inf gives each coordinate tied for the largest |difference| the whole
  // gradient (vector_norm splits it): the sum of the tied |d| carries that gradient, its value
  // taken away again (an exact 0 wherever it is finite).
  const Tensor a = abs(diff);
  const Tensor dist = amax(a, Axes{1});
  const Tensor tied = sum(where(a == reshape(dist, {pairs, 1}).detach(), a, 0.0), Axes{1});
  return dist.detach() + where(isfinite(tied), tied - tied.detach(), 0.0);
}

KILN_ENTRY Tensor glu(const Tensor& input, std::int64_t dim) {
  ::kiln::detail::require_float(input, "glu");
  if (input.dim() == 0)
    throw ShapeError("glu: does not support 0-dim tensors (halving size must be even), got " +
                     ::kiln::detail::describe(input));
  const std::int64_t d = ::kiln::detail::tensor_axis(dim, input, "glu");
  const std::int64_t n = input.shape()[static_cast<std::size_t>(d)];
  if (n % 2 != 0)
    throw ShapeError("glu: halving dimension must be even, but dimension " + std::to_string(d) + " is size " +
                     std::to_string(n) + " (input " + ::kiln::detail::describe(input) + ")");
  const Tensor a = narrow(input, d, 0, n / 2), b = narrow(input, d, n / 2, n / 2);
  return a * sigmoid(b);
}

KILN_ENTRY Tensor embedding(const Tensor& input, const Tensor& weight, std::optional<std::int64_t> padding_idx) {
  if (!padding_idx) return ::kiln::embedding(weight, input);
  const std::int64_t n = weight.dim() > 0 ? weight.shape()[0] : 0;
  if (*padding_idx >= n || *padding_idx < -n)
    throw IndexError("embedding: padding_idx " + std::to_string(*padding_idx) + " is out of range for weight " +
                     weight.describe());
  const std::int64_t p = *padding_idx < 0 ? *padding_idx + n : *padding_idx;
  // As torch: the padding row reads as what the table holds there, but gets no gradient: its
  // rows of the result are cut from the tape.
  Tensor rows = ::kiln::embedding(weight, input);
  Tensor pad = reshape(input == p, [&] {
    std::vector<std::int64_t> s(input.shape().begin(), input.shape().end());
    s.resize(static_cast<std::size_t>(rows.dim()), 1);
    return Shape(s);
  }());
  return where(pad, rows.detach(), rows);
}

KILN_ENTRY Tensor dropout(const Tensor& x, double p, bool training) {
  if (!(p >= 0.0 && p <= 1.0))
    throw ValueError("dropout: probability has to be between 0 and 1, but got " + std::to_string(p));
  if (!training || p == 0.0) return x;
  if (!is_floating(x.dtype())) throw DTypeError("dropout: input must be floating point, got " + x.describe());
  if (p == 1.0) return x * 0.0;
  Tensor keep(ir::random(x.shape(), detail::dropout_key(x.device()), 0, DType::Float32, x.device()));
  keep = (keep >= p).to(x.dtype());
  return x * keep * (1.0 / (1.0 - p));
}

KILN_ENTRY Tensor causal_mask(std::int64_t L, std::int64_t S, DType dtype, Device device) {
  Tensor i = reshape(arange(L, DType::Int64, device), {L, 1});
  Tensor j = reshape(arange(S, DType::Int64, device), {1, S});
  return where(j <= i, 0.0, -INFINITY).to(dtype);
}

}  // namespace kiln::nn::functional

namespace kiln::nn::functional {
namespace detail {

KILN_ENTRY AttentionOperands check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                             double dropout_p, bool is_causal, std::optional<double> scale,
                                             bool enable_gqa) {
  const std::string op = "scaled_dot_product_attention";
  const std::string all = "query " + q.describe() + ", key " + k.describe() + " and value " + v.describe();
  if (!q.defined() || !k.defined() || !v.defined()) throw ValueError(op + ": query, key and value must be defined");
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2 || q.shape().back() != k.shape().back() ||
      k.shape()[k.dim() - 2] != v.shape()[v.dim() - 2])
    throw ShapeError(op + ": " + all + " do not match ([..., L, E], [..., S, E], [..., S, Ev])");
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) throw DTypeError(op + ": " + all + " must have one dtype");
  if (!is_floating(q.dtype())) throw DTypeError(op + ": " + all + " must be floating point");
  if (!(q.device() == k.device()) || !(q.device() == v.device()))
    throw DeviceError(op + ": " + all + " are on different devices");
  if (!(dropout_p >= 0.0 && dropout_p <= 1.0))
    throw ValueError(op + ": dropout_p has to be between 0 and 1, but got " + std::to_string(dropout_p));
  if (is_causal && attn_mask.defined()) throw ValueError(op + ": pass either attn_mask or is_causal, not both");
  if (scale && !std::isfinite(*scale)) throw ValueError(op + ": scale must be finite, got " + std::to_string(*scale));
  AttentionOperands a;
  a.L = q.shape()[q.dim() - 2], a.S = k.shape()[k.dim() - 2], a.E = q.shape().back(), a.Ev = v.shape().back();
  a.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(a.E));
  if (enable_gqa) {
    // As torch's: the key's and the value's heads each divide the query's (they may differ).
    auto divides = [&](const Tensor& t) {
      return t.dim() >= 3 && t.shape()[t.dim() - 3] > 0 && q.shape()[q.dim() - 3] % t.shape()[t.dim() - 3] == 0;
    };
    if (q.dim() < 3 || !divides(k) || !divides(v))
      throw ShapeError(op + ": enable_gqa needs query heads a multiple of key and value heads (dim -3), got " + all);
  }
  // The batch dims (the heads' too, but for grouped heads) broadcast as matmul's do.
  auto batch = [](const Tensor& t, bool drop_heads) {
    std::vector<std::int64_t> b(t.shape().begin(), t.shape().end() - (drop_heads && t.dim() >= 3 ? 3 : 2));
    return Shape(b);
  };
  const bool grouped = enable_gqa && q.dim() >= 3;
  Shape qb = batch(q, grouped), kb = batch(k, grouped), vb = batch(v, grouped);
  try {
    broadcast_shapes(broadcast_shapes(qb, kb, "scaled_dot_product_attention"), vb, "scaled_dot_product_attention");
  } catch (const ShapeError&) {
    throw ShapeError(op + ": the batch dims of " + all + " do not broadcast");
  }
  if (attn_mask.defined()) {
    // torch's rule: a boolean mask, or an additive one of float32 or the query's dtype.
    if (attn_mask.dtype() != DType::Bool && attn_mask.dtype() != DType::Float32 && attn_mask.dtype() != q.dtype())
      throw DTypeError(op + ": attn_mask must be bool, float32 or the query's dtype, got attn_mask " +
                       attn_mask.describe() + " with " + all);
    if (!(attn_mask.device() == q.device()))
      throw DeviceError(op + ": attn_mask " + attn_mask.describe() + " is not on " + q.device().str());
    std::vector<std::int64_t> scores(q.shape().begin(), q.shape().end() - 1);
    scores.push_back(a.S);
    Shape want(scores);
    bool ok = attn_mask.dim() <= static_cast<std::int64_t>(want.size());
    for (std::int64_t d = 1; ok && d <= attn_mask.dim(); ++d) {
      const std::int64_t m = attn_mask.shape()[static_cast<std::size_t>(attn_mask.dim() - d)];
      const std::int64_t w = want[want.size() - static_cast<std::size_t>(d)];
      ok = m == 1 || m == w;
    }
    if (!ok)
      throw ShapeError(op + ": attn_mask " + attn_mask.describe() + " does not broadcast to the scores " + want.str());
  }
  return a;
}

KILN_ENTRY bool fusable_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                  double dropout_p, bool enable_gqa, std::string& why) {
  if (dropout_p >= 1.0) {
    why = "dropout_p is 1 (everything dropped)";
    return false;
  }
  if (attn_mask.defined() && attn_mask.requires_grad()) {
    why = "the mask requires grad";
    return false;
  }
  if (q.dim() != k.dim() || q.dim() != v.dim()) {
    why = "operand ranks differ";
    return false;
  }
  const std::size_t r = static_cast<std::size_t>(q.dim());
  for (std::size_t d = 0; d + 2 < r; ++d) {
    const bool heads = d + 3 == r;
    if (k.shape()[d] == q.shape()[d] && v.shape()[d] == q.shape()[d]) continue;
    if (heads && k.shape()[d] == v.shape()[d] && (enable_gqa || k.shape()[d] == 1) && k.shape()[d] > 0 &&
        q.shape()[d] % k.shape()[d] == 0)
      continue;
    why = heads && k.shape()[d] != v.shape()[d] ? "the key's and the value's heads differ" : "the batch dims broadcast";
    return false;
  }
  return true;
}

KILN_ENTRY Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                  double dropout_p, bool is_causal, const AttentionOperands& a) {
  const std::size_t r = static_cast<std::size_t>(q.dim());
  auto four = [&](const Tensor& t, std::int64_t rows, std::int64_t width) {
    std::int64_t B = 1, H = 1;
    for (std::size_t d = 0; d + 3 < r; ++d) B *= t.shape()[d];
    if (r >= 3) H = t.shape()[r - 3];
    return reshape(t, {B, H, rows, width});
  };
  Tensor q4 = four(q, a.L, a.E), k4 = four(k, a.S, a.E), v4 = four(v, a.S, a.Ev);
  ir::NodePtr mask;
  if (attn_mask.defined()) {
    Tensor m = attn_mask.dtype() == DType::Bool ? where(attn_mask, 0.0, -INFINITY).to(q.dtype()) : attn_mask;
    // To q's rank, then [B|1, H|1, L, S]: a dim of the batch or heads broadcasts only as a
    // whole (all 1, or all full); L and S are expanded where they are 1.
    std::vector<std::int64_t> ms(r, 1);
    for (std::int64_t d = 1; d <= m.dim(); ++d)
      ms[r - static_cast<std::size_t>(d)] = m.shape()[static_cast<std::size_t>(m.dim() - d)];
    m = reshape(m, Shape(ms));
    std::vector<std::int64_t> full(ms);
    bool batch_ones = true, batch_full = true;
    for (std::size_t d = 0; d + 3 < r; ++d) {
      batch_ones = batch_ones && ms[d] == 1;
      batch_full = batch_full && ms[d] == q.shape()[d];
    }
    if (!batch_ones)
      for (std::size_t d = 0; d + 3 < r; ++d) full[d] = q.shape()[d];
    full[r - 2] = a.L, full[r - 1] = a.S;
    if (full != ms) m = broadcast_to(m, Shape(full));
    std::int64_t Bm = 1;
    for (std::size_t d = 0; d + 3 < r; ++d) Bm *= full[d];
    const std::int64_t Hm = r >= 3 ? full[r - 3] : 1;
    mask = reshape(m, {Bm, Hm, a.L, a.S}).node();
    (void)batch_full;
  }
  // Dropout's key is drawn as the written-out form's dropout draws it, and the kernels number
  // P's elements as a Random node of its shape does: the same key drops the same weights.
  ir::AttentionDropout dropout;
  if (dropout_p > 0.0) dropout = {dropout_p, dropout_key(q.device())};
  ir::NodePtr out =
      ir::attention(ir::AttentionRole::Out, q4.node(), k4.node(), v4.node(), mask, is_causal, a.scale, {}, dropout);
  if (out->requires_grad) {
    // The backward's row log-sum-exp is the forward's sibling: built now, so that a compiled
    // forward computes it in the same step as the output and saves it (the op table's rule
    // would build it in the backward, a second pass over the keys). It carries the dropout too
    // (its value does not depend on it), so that the two are one step.
    ir::NodePtr lse =
        ir::attention(ir::AttentionRole::Lse, q4.node(), k4.node(), v4.node(), mask, is_causal, a.scale, {}, dropout);
    auto rule = [q = q4.node(), k = k4.node(), v = v4.node(), mask, lse, is_causal, s = a.scale, dropout](
                    const ir::NodePtr& y, const ir::NodePtr& g) {
      return ir::attention_gradients(q, k, v, mask, is_causal, s, y, g, lse, dropout);
    };
    out->custom_gradient =
        std::make_shared<const ir::CustomGradient>(ir::CustomGradient{{q4.node(), k4.node(), v4.node()}, rule, {lse}});
  }
  std::vector<std::int64_t> shape(q.shape().begin(), q.shape().end() - 1);
  shape.push_back(a.Ev);
  return reshape(Tensor(out), Shape(shape));
}

}  // namespace detail
}  // namespace kiln::nn::functional

namespace kiln::nn::functional {

KILN_ENTRY Tensor scaled_dot_product_attention_math(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                                    std::optional<double> scale, bool enable_gqa) {
  const detail::AttentionOperands a =
      detail::check_attention(q_in, k_in, v_in, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  // Half-type operands are computed in float32 and the result rounded once, as torch's math
  // backend does (and as the fused kernels keep their scores): scores rounded to bfloat16
  // before the softmax lose several percent. The products run without autocast, which would
  // round them back.
  ::kiln::detail::AutocastSuspend inner;
  const DType wide = compute_dtype(q_in.dtype());
  auto widened = [wide](const Tensor& t) { return t.dtype() == wide || !is_floating(t.dtype()) ? t : t.to(wide); };
  const Tensor q = widened(q_in), k = widened(k_in), v = widened(v_in);
  Tensor kk = k, vv = v;
  if (enable_gqa && q.dim() >= 3) {
    // Each key/value head repeated for its group of query heads (torch's repeat_interleave);
    // the key's and the value's groups may differ.
    auto repeat_heads = [&q](const Tensor& t) {
      const std::int64_t group = q.shape()[q.dim() - 3] / t.shape()[t.dim() - 3];
      std::vector<std::int64_t> split(t.shape().begin(), t.shape().end()), wide;
      split.insert(split.end() - 2, 1);
      wide = split;
      wide[wide.size() - 3] = group;
      std::vector<std::int64_t> joined(t.shape().begin(), t.shape().end());
      joined[joined.size() - 3] *= group;
      return reshape(broadcast_to(reshape(t, Shape(split)), Shape(wide)), Shape(joined));
    };
    kk = repeat_heads(k);
    vv = repeat_heads(v);
  }
  Tensor scores = matmul(q, transpose(kk, -2, -1)) * a.scale;
  if (is_causal) {
    scores = scores + causal_mask(a.L, a.S, scores.dtype(), q.device());
  } else if (attn_mask.defined()) {
    scores = attn_mask.dtype() == DType::Bool ? masked_fill(scores, logical_not(attn_mask), -INFINITY)
                                              : Tensor(scores + attn_mask.to(scores.dtype()));
  }
  Tensor weights = softmax(scores, -1);
  // A row of -inf scores softmaxes to NaN; torch's math backend (_safe_softmax) gives 0.
  if (!is_causal && attn_mask.defined() && a.S > 0)  // no keys: no weights to correct (amax has no identity)
    weights = where(amax(scores, {-1}, true) == -INFINITY, 0.0, weights).to(weights.dtype());
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, true);
  const Tensor out = matmul(weights, vv);
  return out.dtype() == q_in.dtype() ? out : out.to(q_in.dtype());
}

KILN_ENTRY Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                               const Tensor& attn_mask, double dropout_p, bool is_causal,
                                               std::optional<double> scale, bool enable_gqa) {
  using ::kiln::detail::AutocastClass;
  const Tensor q = ::kiln::detail::autocast_cast(query, AutocastClass::LowerPrecision);
  const Tensor k = ::kiln::detail::autocast_cast(key, AutocastClass::LowerPrecision);
  const Tensor v = ::kiln::detail::autocast_cast(value, AutocastClass::LowerPrecision);
  // torch's lower-precision policy casts every floating argument, an additive mask too.
  const Tensor mask = ::kiln::detail::autocast_cast(attn_mask, AutocastClass::LowerPrecision);
  const detail::AttentionOperands a =
      detail::check_attention(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
  std::string why;
  if (!detail::fusable_attention(q, k, v, mask, dropout_p, enable_gqa, why)) {
    if (log_enabled(LogChannel::schedule))
      log(LogChannel::schedule, "scaled_dot_product_attention " + q.shape().str() + " written out: " + why);
    ::kiln::detail::AutocastSuspend inner;
    return scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal, a.scale, enable_gqa);
  }
  return detail::fused_attention(q, k, v, mask, dropout_p, is_causal, a);
}

}  // namespace kiln::nn::functional

namespace kiln::nn::detail {

/// Checks that `x` ends in `normalized` and that each defined parameter is of that shape
/// (ShapeErrors naming `op`), then applies `norm` (over the last axis) to x with its normalised
/// dims flattened into one, the parameters flattened alike. Shared by functional::layer_norm and
/// functional::rms_norm, and so by nn::LayerNorm and nn::RMSNorm.
template <class F>
Tensor norm_over(const char* op, const Tensor& x, const Shape& normalized, const Tensor& weight, const Tensor& bias,
                 F norm) {
  const std::size_t k = normalized.size();
  if (static_cast<std::size_t>(x.dim()) < k || !std::equal(normalized.begin(), normalized.end(), x.shape().end() - k))
    throw ShapeError(std::string(op) + ": input " + x.describe() + " must be of shape [*, " +
                     normalized.str().substr(1) + " (it must end in normalized_shape " + normalized.str() + ")");
  auto check = [&](const Tensor& p, const char* what) {
    if (p.defined() && p.shape() != normalized)
      throw ShapeError(std::string(op) + ": " + what + " " + p.describe() +
                       " must be of the shape of normalized_shape " + normalized.str() + " (input " + x.describe() +
                       ")");
  };
  check(weight, "weight");
  check(bias, "bias");
  if (k == 1) return norm(x, weight, bias);
  const std::int64_t n = normalized.numel();
  Shape flat(x.shape().begin(), x.shape().end() - static_cast<std::ptrdiff_t>(k));
  flat.push_back(n);
  auto flatten = [&](const Tensor& p) { return p.defined() ? reshape(p, {n}) : Tensor(); };
  return reshape(norm(reshape(x, flat), flatten(weight), flatten(bias)), x.shape());
}

/// `shape` if it is a valid normalized_shape: at least one dim, none negative (ValueError naming
/// `op` otherwise).
inline Shape checked_normalized_shape(const char* op, Shape shape) {
  if (shape.empty()) throw ValueError(std::string(op) + ": normalized_shape must have at least one dimension");
  for (std::int64_t d : shape)
    if (d < 0) throw ValueError(std::string(op) + ": normalized_shape " + shape.str() + " has a negative size");
  return shape;
}

}  // namespace kiln::nn::detail

namespace kiln::nn::functional {

KILN_ENTRY Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                             const Tensor& bias, double eps) {
  return nn::detail::norm_over(
      "layer_norm", input, nn::detail::checked_normalized_shape("layer_norm", normalized_shape), weight, bias,
      [&](const Tensor& v, const Tensor& w, const Tensor& b) { return ::kiln::layer_norm(v, w, b, eps); });
}

KILN_ENTRY Tensor rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                           std::optional<double> eps) {
  return nn::detail::norm_over(
      "rms_norm", input, nn::detail::checked_normalized_shape("rms_norm", normalized_shape), weight, Tensor(),
      [&](const Tensor& v, const Tensor& w, const Tensor&) { return ::kiln::rms_norm(v, w, eps); });
}

}  // namespace kiln::nn::functional
