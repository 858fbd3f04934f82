#pragma once
// kiln::nn::functional: the stateless forms of the layers (torch.nn.functional). Each is a
// composition of kiln's tensor ops, so it is lazy, fuses with its neighbours and
// differentiates through the ops' rules.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/nn/module.hpp"
#include "kiln/tensor/activations.hpp"
#include "kiln/tensor/composites.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/linalg.hpp"
#include "kiln/tensor/losses.hpp"
#include "kiln/tensor/ops.hpp"
#include "kiln/tensor/shape_ops.hpp"

namespace kiln::nn::functional {

/// x @ weight^T + bias (torch.nn.functional.linear): kiln::linear.
using ::kiln::linear;
// The tensor functions torch.nn.functional also has, under their torch.nn.functional names.
using ::kiln::cross_entropy;
using ::kiln::gelu;
using ::kiln::layer_norm;
using ::kiln::log_softmax;
using ::kiln::relu;
using ::kiln::rms_norm;
using ::kiln::sigmoid;
using ::kiln::silu;
using ::kiln::softmax;
using ::kiln::softmin;
using ::kiln::tanh;
// one_hot(tensor, num_classes) and pad(input, pad, mode, value), as torch.nn.functional's.
using ::kiln::one_hot;
using ::kiln::pad;
// The losses (tensor/losses.hpp), with torch.nn.functional's names and `reduction` strings.
using ::kiln::binary_cross_entropy;
using ::kiln::binary_cross_entropy_with_logits;
using ::kiln::cosine_embedding_loss;
using ::kiln::gaussian_nll_loss;
using ::kiln::hinge_embedding_loss;
using ::kiln::huber_loss;
using ::kiln::kl_div;
using ::kiln::l1_loss;
using ::kiln::margin_ranking_loss;
using ::kiln::mse_loss;
using ::kiln::multi_margin_loss;
using ::kiln::multilabel_soft_margin_loss;
using ::kiln::nll_loss;
using ::kiln::poisson_nll_loss;
using ::kiln::smooth_l1_loss;
using ::kiln::soft_margin_loss;
using ::kiln::triplet_margin_loss;
// pairwise_distance(x1, x2, p, eps, keepdim) lives beside triplet_margin_loss, which is built on it
// (tensor/losses.hpp: the tensor layer cannot reach nn/).
using ::kiln::pairwise_distance;
// The activations (tensor/activations.hpp), with torch.nn.functional's arguments and defaults.
using ::kiln::celu;
using ::kiln::elu;
using ::kiln::hardshrink;
using ::kiln::hardsigmoid;
using ::kiln::hardswish;
using ::kiln::hardtanh;
using ::kiln::leaky_relu;
using ::kiln::logsigmoid;
using ::kiln::mish;
using ::kiln::relu6;
using ::kiln::selu;
using ::kiln::softplus;
using ::kiln::softshrink;
using ::kiln::softsign;
using ::kiln::tanhshrink;

/// Layer normalisation over the trailing dims `normalized_shape` (torch.nn.functional.layer_norm):
/// the input must end in them (ShapeError otherwise), `weight` and `bias` (undefined: none) are
/// of that shape, an empty normalized_shape is a ValueError. kiln::layer_norm(x, weight, bias,
/// eps), over the last dim, is also here and unchanged: this overload is the one whose second
/// argument is a Shape (`layer_norm(x, {2, 3}, w, b)`).
KILN_ENTRY Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                             const Tensor& bias = {}, double eps = 1e-5);

/// RMS normalisation over the trailing dims `normalized_shape` (torch.nn.functional.rms_norm),
/// checked as layer_norm's; eps defaults as kiln::rms_norm's (the machine epsilon of the dtype it
/// computes in). kiln::rms_norm(x, weight, eps) is here too, unchanged.
KILN_ENTRY Tensor rms_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                           std::optional<double> eps = std::nullopt);

/// The rows of `weight` [num_embeddings, ...] that the integer `input` picks, in
/// torch.nn.functional.embedding's order (input first; kiln::embedding is torch.embedding's
/// weight-first form). The row of `padding_idx` (negative: counted from the end; outside the
/// table an IndexError) reads as the table holds it and gets no gradient.
KILN_ENTRY Tensor embedding(const Tensor& input, const Tensor& weight,
                            std::optional<std::int64_t> padding_idx = std::nullopt);

/// input / max(||input||_p over dim, eps) (torch.nn.functional.normalize): the p-norm as
/// kiln::linalg::vector_norm, clamped below by eps (no gradient through the norm where it is
/// clamped). Floating inputs only.
KILN_ENTRY Tensor normalize(const Tensor& input, double p = 2.0, std::int64_t dim = 1, double eps = 1e-12);

/// The cosine of the angle between x1 and x2 along dim (torch.nn.functional.cosine_similarity):
/// x1 and x2 broadcast; each is divided by its 2-norm along dim, the norms clamped below by eps
/// without changing their gradient (as torch's), and the products summed over dim. The
/// promoted dtype must be floating (integer operands beside a floating one are converted to it;
/// floating ones keep their dtype until the product).
KILN_ENTRY Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, std::int64_t dim = 1, double eps = 1e-8);

/// The p-norm distances between the rows of the 2-D `input` [N, M], pair (i, j) for i < j in
/// row-major order of the upper triangle: N (N - 1) / 2 values (torch.nn.functional.pdist). Other
/// ranks are a ShapeError, non-floating inputs a DTypeError, p < 0 a ValueError, as torch's. The
/// gradient is torch's _pdist_backward: 0 for a pair at distance 0, and for p = inf the full
/// gradient to every coordinate that ties for the largest |difference| (not split among them).
KILN_ENTRY Tensor pdist(const Tensor& input, double p = 2.0);

/// The gated linear unit (torch.nn.functional.glu): input split in halves a, b along dim,
/// a * sigmoid(b). The dim's size must be even (ShapeError); floating inputs only.
KILN_ENTRY Tensor glu(const Tensor& input, std::int64_t dim = -1);

namespace detail {
/// The Philox key of a dropout mask, as a 0-dim int64 node: from the compiled module's seed
/// argument while one is traced (draw k of the trace adds k), else a fresh key of the global
/// generator, passed as a kernel argument so every key runs the same kernel.
KILN_ENTRY ir::NodePtr dropout_key(Device device);
}  // namespace detail

/// Zeroes each element with probability `p` and scales the rest by 1 / (1 - p) while
/// `training` (torch.nn.functional.dropout). The mask comes from Philox keyed per call: the
/// same seed (manual_seed) gives the same mask on every device and thread count.
KILN_ENTRY Tensor dropout(const Tensor& x, double p = 0.5, bool training = true);

/// The additive mask of causal attention over [L, S]: 0 where key j <= query i, -inf elsewhere
/// (aligned to the top left, torch's tril(ones(L, S)) for is_causal, whatever L and S).
KILN_ENTRY Tensor causal_mask(std::int64_t L, std::int64_t S, DType dtype, Device device);

namespace detail {

/// The checked operands of scaled_dot_product_attention: q [..., Hq, L, E], k [..., Hk, S, E],
/// v [..., Hk, S, Ev] (ranks >= 2; the dim before the last two is the heads' dim).
struct AttentionOperands {
  std::int64_t L = 0, S = 0, E = 0, Ev = 0;
  double scale = 1.0;
};

KILN_ENTRY AttentionOperands check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                             double dropout_p, bool is_causal, std::optional<double> scale,
                                             bool enable_gqa);

/// Whether the fused kernels compute this call (else it is written out): dropout_p below 1, no
/// mask that requires grad (the kernels give the mask no gradient), and batch dims equal but
/// for grouped or single key/value heads, as many for the key as for the value (a broadcast
/// batch is written out too). `why` gets the reason when not.
KILN_ENTRY bool fusable_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                  double dropout_p, bool enable_gqa, std::string& why);

/// q, k, v and the mask as the fused kernels take them ([B, H, L, E] and an additive
/// [B|1, H|1, L, S] mask), one Attention node (dropout_p > 0: with a key drawn as dropout()
/// draws it), and its value in q's leading shape.
KILN_ENTRY Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                  double dropout_p, bool is_causal, const AttentionOperands& a);

}  // namespace detail

/// Attention written out as PyTorch's math backend computes it: softmax(q kᵀ · scale + mask) v
/// with products and a softmax (the scheduler fuses around the products), the [..., L, S]
/// scores in memory. A row whose keys are all masked gives 0 (torch's safe softmax). The
/// reference of the fused kernels, and what scaled_dot_product_attention runs where they do
/// not apply (dropout_p 1, a mask that requires grad, broadcast batch dims). Dropout draws
/// one Philox key per call (dropout()); the fused kernels, given the same key, drop the same
/// weights. float16 and bfloat16 operands are computed in float32 and the result rounded once
/// (torch's math backend; the fused kernels keep their scores in float32 too).
KILN_ENTRY Tensor scaled_dot_product_attention_math(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                                    bool is_causal = false, std::optional<double> scale = std::nullopt,
                                                    bool enable_gqa = false);

/// softmax(q kᵀ · scale + mask) v over the last two axes (torch.nn.functional.
/// scaled_dot_product_attention): q [..., L, E], k [..., S, E], v [..., S, Ev] of one floating
/// dtype; `attn_mask` a boolean (true = take part) or additive mask (float32 or q's dtype)
/// broadcastable to [..., L, S]; `is_causal` masks key j > query i (not with a mask); `scale`
/// defaults to 1 / sqrt(E); `enable_gqa`: q's heads (dim -3) a multiple of k's and of v's, each
/// key/value head serving a group of query heads. Runs as one fused kernel (an online softmax: no [L, S] scores
/// in memory) and differentiates through a fused backward that recomputes the scores from each
/// row's saved log-sum-exp. `dropout_p` > 0 drops weights after the softmax (scaling the kept
/// by 1 / (1 - p)) inside the kernels, with the same Philox mask in the forward and the
/// backward (torch applies it whatever the training flag: pass 0 in eval). With dropout_p 1, a
/// mask that requires grad or broadcast batch dims it is written out
/// (scaled_dot_product_attention_math). Under autocast it runs in the lower precision, as
/// torch's. A row whose keys are all masked gives 0.
KILN_ENTRY Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                               const Tensor& attn_mask = {}, double dropout_p = 0.0,
                                               bool is_causal = false, std::optional<double> scale = std::nullopt,
                                               bool enable_gqa = false);

}  // namespace kiln::nn::functional

namespace kiln {
/// torch.nn.functional.scaled_dot_product_attention (see nn::functional).
using nn::functional::scaled_dot_product_attention;
}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/nn/functional_impl.hpp"
#endif
