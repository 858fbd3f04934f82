#pragma once
// The loss modules of torch.nn (libtorch's names): each holds its options and calls its loss
// function (tensor/losses.hpp), so values, dtypes, errors and gradients are the function's.
// `loss_fn(input, target)` as in libtorch; a loss is a Module (it can be a member and
// registered). forward(input) with one argument does not compile on a loss's own type; through
// a Module& it is Module's error naming the module.
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

}  // namespace kiln::nn
