#pragma once
// Loss functions with PyTorch's names, semantics and reductions (torch.nn.functional): the
// regression losses (mse, l1, smooth l1, huber), the binary cross-entropies, nll_loss, and
// cross_entropy with `reduction` and `label_smoothing`. Each is a composite of kiln's ops (one
// fused kernel for the pointwise part and its reduction) and differentiates through them, except
// cross_entropy, which has its own rule (decomp::cross_entropy). Under autocast they run in
// float32, as torch.autocast's lists say.
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

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/losses_impl.hpp"
#endif
