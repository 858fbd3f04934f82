#pragma once
// Loss functions with PyTorch's names, semantics and reductions (torch.nn.functional): the
// regression losses (mse, l1, smooth l1, huber), the binary cross-entropies, nll_loss, and
// cross_entropy with `reduction` and `label_smoothing`, the margin and embedding losses (margin
// ranking, soft margin, hinge embedding, cosine embedding, triplet margin with pairwise_distance,
// multi-margin, multilabel soft margin) and the Poisson and Gaussian negative log-likelihoods.
// Each is a composite of kiln's ops (one fused kernel for the pointwise part and its reduction)
// and differentiates through them, except cross_entropy, which has its own rule
// (decomp::cross_entropy). Where torch's loss is itself a composite its clamps keep torch's
// subgradient (clamp_min passes the gradient at the bound). Under autocast they run in float32,
// as torch.autocast's lists say (multilabel_soft_margin_loss and gaussian_nll_loss, torch's
// Python composites, as their ops do).
#include <cstdint>
#include <string>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

/// Options of cross_entropy beyond the logits and targets (torch.nn.functional.cross_entropy's).
struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  ///< targets equal to it do not count
  std::string reduction = "mean";    ///< "mean" (over the counted rows), "sum" or "none" (one value per row)
  double label_smoothing = 0.0;      ///< e in [0, 1]: the target is (1 - e) one_hot + e / C
};

/// cross_entropy of `targets` (int64/int32 class indices [N]) under `logits` [N, C] with
/// PyTorch's reduction and label smoothing: `cross_entropy(x, y, {.reduction = "sum"})`.
KILN_ENTRY Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options);

/// Negative log-likelihood of `targets` (int64/int32 [N]) under log-probabilities
/// `log_probs` [N, C] (log_softmax's output), as torch.nn.functional.nll_loss: -log_probs[i,
/// target_i], folded by `reduction` ("mean" over the rows whose target is not ignore_index).
KILN_ENTRY Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, std::int64_t ignore_index = -100,
                           const std::string& reduction = "mean");

/// (input - target)^2 folded by `reduction` ("mean", "sum" or "none"); input and target
/// broadcast, as torch.nn.functional.mse_loss.
KILN_ENTRY Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

/// |input - target| folded by `reduction`, as torch.nn.functional.l1_loss.
KILN_ENTRY Tensor l1_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

/// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (d = input - target; beta = 0 is l1_loss),
/// folded by `reduction`, as torch.nn.functional.smooth_l1_loss.
KILN_ENTRY Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean",
                                 double beta = 1.0);

/// 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), folded by `reduction`, as
/// torch.nn.functional.huber_loss.
KILN_ENTRY Tensor huber_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean",
                             double delta = 1.0);

/// -(t log(x) + (1 - t) log(1 - x)) for probabilities x, each log clamped below at -100 (so 0 and
/// 1 give finite losses), folded by `reduction`, as torch.nn.functional.binary_cross_entropy.
/// Values of x outside [0, 1] give NaN (PyTorch's CPU kernel raises; reading them would be a
/// synchronisation).
KILN_ENTRY Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

/// binary_cross_entropy of sigmoid(logits), computed without forming it:
/// (1 - t) x + (1 + (pos_weight - 1) t) (log1p(exp(-|x|)) + max(-x, 0)), folded by `reduction`,
/// as torch.nn.functional.binary_cross_entropy_with_logits (`pos_weight` broadcasts against the
/// last dim; an undefined Tensor is 1).
KILN_ENTRY Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                                   const std::string& reduction = "mean", const Tensor& pos_weight = {});

/// The Kullback-Leibler divergence of `target` from the log-probabilities `input`
/// (torch.nn.functional.kl_div): target (log t - input) with 0 where t is 0 (xlogy), or with
/// `log_target` exp(target) (target - input); folded by `reduction`: "mean" (over every element,
/// as torch's), "batchmean" (the sum over input's first dim's size), "sum" or "none". Floating
/// inputs only. The gradient with respect to a target of exactly 0 is 0 (torch's xlogy backward
/// gives 0/0 there); the input's is torch's.
KILN_ENTRY Tensor kl_div(const Tensor& input, const Tensor& target, const std::string& reduction = "mean",
                         bool log_target = false);

/// max(0, -target (input1 - input2) + margin) folded by `reduction`, as
/// torch.nn.functional.margin_ranking_loss: the three operands must have one rank (ShapeError, as
/// torch's RuntimeError) and broadcast; the gradient at the hinge (a loss of exactly 0) is
/// torch's clamp_min subgradient, 1. Integer operands give float32 (torch adds the float margin);
/// bool operands are a DTypeError.
KILN_ENTRY Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                                      double margin = 0.0, const std::string& reduction = "mean");

/// log(1 + exp(-target * input)) folded by `reduction`, as torch.nn.functional.soft_margin_loss
/// (torch's kernel: the result has input's dtype, a floating one, and target must broadcast to
/// input's shape).
KILN_ENTRY Tensor soft_margin_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");

/// input where target is not -1, plus max(0, margin - input) where target is not 1, folded by
/// `reduction` (torch.nn.functional.hinge_embedding_loss; so a target of 1 gives input, -1 the
/// hinge, any other value their sum). target is only compared: any dtype that broadcasts with
/// input. At input == margin (target -1) the gradient is -1, torch's clamp_min subgradient.
KILN_ENTRY Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, double margin = 1.0,
                                       const std::string& reduction = "mean");

/// The negative log-likelihood of `target` under Poisson(rate) (torch.nn.functional.poisson_nll_loss):
/// exp(input) - target input with `log_input` (input is log rate), else input - target log(input +
/// eps); with `full` the Stirling term target log(target) - target + log(2 pi target) / 2 is added
/// where target > 1. Folded by `reduction`; operands broadcast; integers give float32.
KILN_ENTRY Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, bool log_input = true, bool full = false,
                                   double eps = 1e-8, const std::string& reduction = "mean");

/// 0.5 (log(v) + (input - target)^2 / v) with v = max(var, eps) (plus log(2 pi) / 2 with `full`),
/// folded by `reduction`, as torch.nn.functional.gaussian_nll_loss. var has input's shape
/// (heteroscedastic), or input's without its last dim, or with last dim 1 (homoscedastic: one
/// variance per row); any other shape is a ValueError, as torch's. A negative entry of var is a
/// ValueError too: checking it reads var (a synchronisation; a graph break inside kiln::compile),
/// as torch's `torch.any(var < 0)` does. The clamp carries no gradient (torch clamps under no_grad):
/// var's gradient is the loss's derivative at v, also where var < eps.
KILN_ENTRY Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var, bool full = false,
                                    double eps = 1e-6, const std::string& reduction = "mean");

/// With cos = sum(x1 x2) / sqrt((sum(x1^2) + 1e-12) (sum(x2^2) + 1e-12)) over the last dim:
/// 1 - cos where target is 1, max(0, cos - margin) where it is -1, 0 elsewhere, folded by
/// `reduction` (torch.nn.functional.cosine_embedding_loss, its float 1e-12). target is 1-D [N]
/// with inputs [N, D], or 0-dim with inputs [D] (ShapeError otherwise); the inputs broadcast.
KILN_ENTRY Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target,
                                        double margin = 0.0, const std::string& reduction = "mean");

/// The p-norm of x1 - x2 + eps over the last dim of their broadcast shape
/// (torch.nn.functional.pairwise_distance, torch.pairwise_distance), kept as a dim of 1 with
/// `keepdim`. Gradients are linalg::vector_norm's (0 where the distance is 0). Integer operands
/// give float32 (torch adds the float eps); bool ones are a DTypeError. Also in nn::functional.
KILN_ENTRY Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p = 2.0, double eps = 1e-6,
                                    bool keepdim = false);

/// max(0, margin + d(anchor, positive) - d(anchor, negative)) with d = pairwise_distance(., ., p,
/// eps); with `swap` the negative distance is min(d(a, n), d(p, n)) (a tie splits the gradient,
/// as torch.min). Folded by `reduction`, as torch.nn.functional.triplet_margin_loss; the three
/// must have one rank (ShapeError).
KILN_ENTRY Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                                      double margin = 1.0, double p = 2.0, double eps = 1e-6, bool swap = false,
                                      const std::string& reduction = "mean");

/// -(t logsigmoid(x) + (1 - t) logsigmoid(-x)), times `weight` (broadcast; undefined: none),
/// averaged over the last (class) dim and then folded by `reduction`, as
/// torch.nn.functional.multilabel_soft_margin_loss. Floating input.
KILN_ENTRY Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target, const Tensor& weight = {},
                                              const std::string& reduction = "mean");

/// The multi-class hinge (torch.nn.functional.multi_margin_loss): for each row x of input [N, C]
/// (or [C]) with class y = target[n], sum over i != y of w[y] max(0, margin - x[y] + x[i])^p,
/// divided by C, folded by `reduction` ("none": [N], or a 0-dim loss for a 0-dim target). p is 1
/// or 2 and a defined weight is 1-D with C elements (ValueError / ShapeError otherwise); targets
/// are int64 (or int32) in [0, C) (IndexError). The gradient is torch's: none where the hinge is
/// 0, none to weight (torch has no derivative for it).
KILN_ENTRY Tensor multi_margin_loss(const Tensor& input, const Tensor& target, std::int64_t p = 1, double margin = 1.0,
                                    const Tensor& weight = {}, const std::string& reduction = "mean");

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/losses_impl.hpp"
#endif
