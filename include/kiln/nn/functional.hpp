#pragma once
// kiln::nn::functional: the stateless forms of the layers (torch.nn.functional). Each is a
// composition of kiln's tensor ops, so it is lazy, fuses with its neighbours and
// differentiates through the ops' rules.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/nn/module.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/linalg.hpp"
#include "kiln/tensor/ops.hpp"
#include "kiln/tensor/shape_ops.hpp"

namespace kiln::nn::functional {

/// x @ weight^T + bias (torch.nn.functional.linear): kiln::linear.
using ::kiln::linear;
// The tensor functions torch.nn.functional also has, under their torch.nn.functional names.
using ::kiln::cross_entropy;
using ::kiln::embedding;
using ::kiln::gelu;
using ::kiln::layer_norm;
using ::kiln::log_softmax;
using ::kiln::relu;
using ::kiln::rms_norm;
using ::kiln::silu;
using ::kiln::softmax;

namespace detail {
/// The Philox key of a dropout mask, as a 0-dim int64 node: from the compiled module's seed
/// argument while one is traced (draw k of the trace adds k), else a fresh key of the global
/// generator, passed as a kernel argument so every key runs the same kernel.
inline ir::NodePtr dropout_key(Device device) {
  if (nn::detail::traced_randomness) {
    nn::detail::TracedRandomness& r = *nn::detail::traced_randomness;
    const std::int64_t k = r.draws++;
    ir::NodePtr seed = r.seed.node();
    if (seed->device != device) throw DeviceError("dropout: the input is on " + device.str() + ", the module's seed on " + seed->device.str());
    return k == 0 ? seed : ir::binary(ir::Op::Add, seed, ir::constant_int(k, DType::Int64, Shape{}, device));
  }
  return nn::detail::fresh_key("dropout", device);
}
}  // namespace detail

/// Zeroes each element with probability `p` and scales the rest by 1 / (1 - p) while
/// `training` (torch.nn.functional.dropout). The mask comes from Philox keyed per call: the
/// same seed (manual_seed) gives the same mask on every device and thread count.
inline Tensor dropout(const Tensor& x, double p = 0.5, bool training = true) {
  if (!(p >= 0.0 && p <= 1.0))
    throw ValueError("dropout: probability has to be between 0 and 1, but got " + std::to_string(p));
  if (!training || p == 0.0) return x;
  if (!is_floating(x.dtype())) throw DTypeError("dropout: input must be floating point, got " + x.describe());
  if (p == 1.0) return x * 0.0;
  Tensor keep(ir::random(x.shape(), detail::dropout_key(x.device()), 0, DType::Float32, x.device()));
  keep = (keep >= p).to(x.dtype());
  return x * keep * (1.0 / (1.0 - p));
}

/// The additive mask of causal attention over [L, S]: 0 where key j <= query i + (S - L),
/// -inf elsewhere (torch's is_causal aligns the mask to the top left: j <= i).
inline Tensor causal_mask(std::int64_t L, std::int64_t S, DType dtype, Device device) {
  Tensor i = reshape(arange(L, DType::Int64, device), {L, 1});
  Tensor j = reshape(arange(S, DType::Int64, device), {1, S});
  return where(j <= i, 0.0, -INFINITY).to(dtype);
}

/// softmax(q k^T * scale + mask) v over the last two axes (torch.nn.functional.
/// scaled_dot_product_attention): q [..., L, E], k [..., S, E], v [..., S, Ev]; `attn_mask` a
/// boolean (true = take part) or additive float mask broadcastable to [..., L, S]; `is_causal`
/// masks key j > query i; `scale` defaults to 1 / sqrt(E). Written out as products and a
/// softmax (which the scheduler fuses around the products).
inline Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                           bool is_causal = false, std::optional<double> scale = std::nullopt) {
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2 || q.shape().back() != k.shape().back() ||
      k.shape()[k.dim() - 2] != v.shape()[v.dim() - 2])
    throw ShapeError("scaled_dot_product_attention: query " + q.describe() + ", key " + k.describe() + " and value " +
                     v.describe() + " do not match ([..., L, E], [..., S, E], [..., S, Ev])");
  if (is_causal && attn_mask.defined())
    throw ValueError("scaled_dot_product_attention: pass either attn_mask or is_causal, not both");
  const std::int64_t L = q.shape()[q.dim() - 2], S = k.shape()[k.dim() - 2];
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.shape().back()));
  Tensor scores = matmul(q, transpose(k, -2, -1)) * s;
  if (is_causal) {
    scores = scores + causal_mask(L, S, scores.dtype(), q.device());
  } else if (attn_mask.defined()) {
    scores = attn_mask.dtype() == DType::Bool ? masked_fill(scores, logical_not(attn_mask), -INFINITY)
                                              : Tensor(scores + attn_mask.to(scores.dtype()));
  }
  Tensor weights = softmax(scores, -1);
  if (dropout_p > 0.0) weights = dropout(weights, dropout_p, true);
  return matmul(weights, v);
}

}  // namespace kiln::nn::functional
