#pragma once
// The loss modules of torch.nn (libtorch's names): each holds its options and calls its loss
// function (tensor/losses.hpp), so values, dtypes, errors and gradients are the function's.
// `loss_fn(input, target)` as in libtorch; a loss is a Module (it can be a member and
// registered). forward(input) with one argument does not compile on a loss's own type; through
// a Module& it is Module's error naming the module. The losses of three tensors (MarginRankingLoss,
// CosineEmbeddingLoss, TripletMarginLoss, GaussianNLLLoss) are TernaryLoss: `loss_fn(a, b, c)`.
#include <cstdint>
#include <string>
#include <utility>

#include "kiln/nn/module.hpp"
#include "kiln/tensor/losses.hpp"

namespace kiln::nn {

/// A Module computing a loss of (input, target).
class Loss : public Module {
 public:
  using Module::forward;
  /// The loss of `input` against `target`.
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  /// forward(input, target), as libtorch's `loss_fn(input, target)`.
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
};

/// torch.nn.MSELoss: mse_loss(input, target, reduction).
class MSELoss : public Loss {
 public:
  explicit MSELoss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override { return mse_loss(input, target, reduction_); }
  std::string name() const override { return "MSELoss"; }

 private:
  std::string reduction_;
};

/// torch.nn.L1Loss: l1_loss(input, target, reduction).
class L1Loss : public Loss {
 public:
  explicit L1Loss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override { return l1_loss(input, target, reduction_); }
  std::string name() const override { return "L1Loss"; }

 private:
  std::string reduction_;
};

/// torch.nn.SmoothL1Loss: smooth_l1_loss(input, target, reduction, beta).
class SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(std::string reduction = "mean", double beta = 1.0)
      : reduction_(std::move(reduction)), beta_(beta) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return smooth_l1_loss(input, target, reduction_, beta_);
  }
  std::string name() const override { return "SmoothL1Loss"; }

 private:
  std::string reduction_;
  double beta_;
};

/// torch.nn.HuberLoss: huber_loss(input, target, reduction, delta).
class HuberLoss : public Loss {
 public:
  explicit HuberLoss(std::string reduction = "mean", double delta = 1.0)
      : reduction_(std::move(reduction)), delta_(delta) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return huber_loss(input, target, reduction_, delta_);
  }
  std::string name() const override { return "HuberLoss"; }

 private:
  std::string reduction_;
  double delta_;
};

/// torch.nn.BCELoss: binary_cross_entropy(input, target, reduction).
class BCELoss : public Loss {
 public:
  explicit BCELoss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return binary_cross_entropy(input, target, reduction_);
  }
  std::string name() const override { return "BCELoss"; }

 private:
  std::string reduction_;
};

/// torch.nn.BCEWithLogitsLoss: binary_cross_entropy_with_logits(input, target, reduction,
/// pos_weight); a defined pos_weight is the buffer "pos_weight", as torch's.
class BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(std::string reduction = "mean", Tensor pos_weight = {})
      : reduction_(std::move(reduction)), pos_weight_(std::move(pos_weight)) {
    if (pos_weight_.defined()) register_buffer("pos_weight", pos_weight_);
  }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return binary_cross_entropy_with_logits(input, target, reduction_, pos_weight_);
  }
  std::string name() const override { return "BCEWithLogitsLoss"; }

 private:
  std::string reduction_;
  Tensor pos_weight_;
};

/// torch.nn.NLLLoss: nll_loss(input, target, ignore_index, reduction).
class NLLLoss : public Loss {
 public:
  explicit NLLLoss(std::int64_t ignore_index = -100, std::string reduction = "mean")
      : ignore_index_(ignore_index), reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return nll_loss(input, target, ignore_index_, reduction_);
  }
  std::string name() const override { return "NLLLoss"; }

 private:
  std::int64_t ignore_index_;
  std::string reduction_;
};

/// torch.nn.CrossEntropyLoss: cross_entropy(input, target, options) (ignore_index, reduction,
/// label_smoothing).
class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions options = {}) : options_(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override { return cross_entropy(input, target, options_); }
  std::string name() const override { return "CrossEntropyLoss"; }

 private:
  CrossEntropyOptions options_;
};

/// torch.nn.KLDivLoss: kl_div(input, target, reduction, log_target).
class KLDivLoss : public Loss {
 public:
  explicit KLDivLoss(std::string reduction = "mean", bool log_target = false)
      : reduction_(std::move(reduction)), log_target_(log_target) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return kl_div(input, target, reduction_, log_target_);
  }
  std::string name() const override { return "KLDivLoss"; }

 private:
  std::string reduction_;
  bool log_target_;
};

/// A Module computing a loss of three tensors (libtorch's `loss_fn(input1, input2, target)`).
class TernaryLoss : public Module {
 public:
  using Module::forward;
  /// The loss of `a`, `b` and `c`, in the order of its function's arguments.
  virtual Tensor forward(const Tensor& a, const Tensor& b, const Tensor& c) = 0;
  /// forward(a, b, c).
  Tensor operator()(const Tensor& a, const Tensor& b, const Tensor& c) { return forward(a, b, c); }
};

/// torch.nn.MarginRankingLoss: margin_ranking_loss(input1, input2, target, margin, reduction).
class MarginRankingLoss : public TernaryLoss {
 public:
  explicit MarginRankingLoss(double margin = 0.0, std::string reduction = "mean")
      : margin_(margin), reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target) override {
    return margin_ranking_loss(input1, input2, target, margin_, reduction_);
  }
  std::string name() const override { return "MarginRankingLoss"; }

 private:
  double margin_;
  std::string reduction_;
};

/// torch.nn.SoftMarginLoss: soft_margin_loss(input, target, reduction).
class SoftMarginLoss : public Loss {
 public:
  explicit SoftMarginLoss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return soft_margin_loss(input, target, reduction_);
  }
  std::string name() const override { return "SoftMarginLoss"; }

 private:
  std::string reduction_;
};

/// torch.nn.HingeEmbeddingLoss: hinge_embedding_loss(input, target, margin, reduction).
class HingeEmbeddingLoss : public Loss {
 public:
  explicit HingeEmbeddingLoss(double margin = 1.0, std::string reduction = "mean")
      : margin_(margin), reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return hinge_embedding_loss(input, target, margin_, reduction_);
  }
  std::string name() const override { return "HingeEmbeddingLoss"; }

 private:
  double margin_;
  std::string reduction_;
};

/// torch.nn.PoissonNLLLoss: poisson_nll_loss(input, target, log_input, full, eps, reduction).
class PoissonNLLLoss : public Loss {
 public:
  explicit PoissonNLLLoss(bool log_input = true, bool full = false, double eps = 1e-8, std::string reduction = "mean")
      : log_input_(log_input), full_(full), eps_(eps), reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return poisson_nll_loss(input, target, log_input_, full_, eps_, reduction_);
  }
  std::string name() const override { return "PoissonNLLLoss"; }

 private:
  bool log_input_, full_;
  double eps_;
  std::string reduction_;
};

/// torch.nn.GaussianNLLLoss: gaussian_nll_loss(input, target, var, full, eps, reduction), called
/// as `loss_fn(input, target, var)`.
class GaussianNLLLoss : public TernaryLoss {
 public:
  explicit GaussianNLLLoss(bool full = false, double eps = 1e-6, std::string reduction = "mean")
      : full_(full), eps_(eps), reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target, const Tensor& var) override {
    return gaussian_nll_loss(input, target, var, full_, eps_, reduction_);
  }
  std::string name() const override { return "GaussianNLLLoss"; }

 private:
  bool full_;
  double eps_;
  std::string reduction_;
};

/// torch.nn.CosineEmbeddingLoss: cosine_embedding_loss(input1, input2, target, margin, reduction).
class CosineEmbeddingLoss : public TernaryLoss {
 public:
  explicit CosineEmbeddingLoss(double margin = 0.0, std::string reduction = "mean")
      : margin_(margin), reduction_(std::move(reduction)) {}
  Tensor forward(const Tensor& input1, const Tensor& input2, const Tensor& target) override {
    return cosine_embedding_loss(input1, input2, target, margin_, reduction_);
  }
  std::string name() const override { return "CosineEmbeddingLoss"; }

 private:
  double margin_;
  std::string reduction_;
};

/// torch.nn.TripletMarginLoss: triplet_margin_loss(anchor, positive, negative, margin, p, eps,
/// swap, reduction). The module, as torch's, refuses a margin that is not positive (ValueError);
/// the function takes any.
class TripletMarginLoss : public TernaryLoss {
 public:
  explicit TripletMarginLoss(double margin = 1.0, double p = 2.0, double eps = 1e-6, bool swap = false,
                             std::string reduction = "mean")
      : margin_(margin), p_(p), eps_(eps), swap_(swap), reduction_(std::move(reduction)) {
    if (!(margin > 0))
      throw ValueError("TripletMarginLoss: expected margin to be greater than 0, got " + std::to_string(margin) +
                       " instead");
  }
  Tensor forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative) override {
    return triplet_margin_loss(anchor, positive, negative, margin_, p_, eps_, swap_, reduction_);
  }
  std::string name() const override { return "TripletMarginLoss"; }

 private:
  double margin_, p_, eps_;
  bool swap_;
  std::string reduction_;
};

/// torch.nn.MultiLabelSoftMarginLoss: multilabel_soft_margin_loss(input, target, weight,
/// reduction); a defined weight is the buffer "weight", as torch's.
class MultiLabelSoftMarginLoss : public Loss {
 public:
  explicit MultiLabelSoftMarginLoss(Tensor weight = {}, std::string reduction = "mean")
      : weight_(std::move(weight)), reduction_(std::move(reduction)) {
    if (weight_.defined()) register_buffer("weight", weight_);
  }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return multilabel_soft_margin_loss(input, target, weight_, reduction_);
  }
  std::string name() const override { return "MultiLabelSoftMarginLoss"; }

 private:
  Tensor weight_;
  std::string reduction_;
};

/// torch.nn.MultiMarginLoss: multi_margin_loss(input, target, p, margin, weight, reduction); p
/// other than 1 or 2, or a weight that is not 1-D, is a ValueError at construction, as torch's. A
/// defined weight is the buffer "weight".
class MultiMarginLoss : public Loss {
 public:
  explicit MultiMarginLoss(std::int64_t p = 1, double margin = 1.0, Tensor weight = {}, std::string reduction = "mean")
      : p_(p), margin_(margin), weight_(std::move(weight)), reduction_(std::move(reduction)) {
    if (p_ != 1 && p_ != 2)
      throw ValueError("MultiMarginLoss: only p == 1 and p == 2 supported, got p " + std::to_string(p_));
    if (weight_.defined() && weight_.dim() != 1)
      throw ValueError("MultiMarginLoss: weight must be one-dimensional, got " + weight_.describe());
    if (weight_.defined()) register_buffer("weight", weight_);
  }
  Tensor forward(const Tensor& input, const Tensor& target) override {
    return multi_margin_loss(input, target, p_, margin_, weight_, reduction_);
  }
  std::string name() const override { return "MultiMarginLoss"; }

 private:
  std::int64_t p_;
  double margin_;
  Tensor weight_;
  std::string reduction_;
};

}  // namespace kiln::nn
