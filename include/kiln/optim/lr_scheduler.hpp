#pragma once
// Learning-rate schedulers (torch.optim.lr_scheduler): each sets the lr of every parameter
// group of its optimizer, step by step, with PyTorch's chainable (recursive) forms, so that
// several schedulers and manual changes compose as they do there. The lr is read by the
// optimizer's kernel as a number in memory: a schedule never recompiles anything.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/nn/state_dict.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

class SequentialLR;

/// The base of the schedulers (torch's LRScheduler). Making one records each group's lr as its
/// initial_lr (unless a scheduler did already) and takes the first step (epoch 0); call step()
/// after each optimizer.step() (or each epoch).
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances the schedule by one and sets the groups' lr.
  KILN_ENTRY virtual void step();
  /// The lr of each group that the last step set.
  std::vector<double> get_last_lr() const { return last_lr_; }
  /// Steps taken since epoch 0 (torch's last_epoch: 0 right after construction).
  std::int64_t last_epoch() const { return last_epoch_; }
  /// The initial lr of each group: the base of the closed forms.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return *optimizer_; }

  /// last_epoch, the steps counted, base_lrs and the last lrs, for checkpoints.
  KILN_ENTRY virtual nn::StateDict state_dict() const;
  /// Restores what state_dict() saved (ValueError naming a missing or mis-shaped key).
  KILN_ENTRY virtual void load_state_dict(const nn::StateDict& dict);

 protected:
  KILN_ENTRY explicit LRScheduler(Optimizer& optimizer);

  /// The lrs of the next step from the groups' current ones (torch's get_lr).
  virtual std::vector<double> get_lr() const = 0;
  /// The lrs at last_epoch from base_lrs, where the schedule has a closed form.
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }

  /// torch's _initial_step: derived constructors call it last.
  void initial_step();
  /// Sets the groups' lr for the next epoch, or for `epoch` by the closed form if there is one.
  void update_lr(std::optional<std::int64_t> epoch);
  /// Undoes the step a scheduler took when it was made (SequentialLR re-takes it).
  virtual void undo_initial_step() { --last_epoch_; }
  std::vector<double> group_lrs() const;

  Optimizer* optimizer_;
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
  bool is_initial_ = false;
  std::vector<double> last_lr_;

  friend class SequentialLR;
};

/// lr = initial lr * lr_lambda(epoch) (torch's LambdaLR), one function for every group or one
/// per group.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(std::int64_t)> lr_lambda)
      : LambdaLR(optimizer, std::vector<std::function<double(std::int64_t)>>(optimizer.param_groups().size(),
                                                                             std::move(lr_lambda))) {}
  KILN_ENTRY LambdaLR(Optimizer& optimizer, std::vector<std::function<double(std::int64_t)>> lr_lambdas);

 protected:
  KILN_ENTRY std::vector<double> get_lr() const override;

 private:
  std::vector<std::function<double(std::int64_t)>> lambdas_;
};

/// lr *= gamma every step_size epochs (torch's StepLR): initial lr * gamma^(epoch / step_size).
class StepLR : public LRScheduler {
 public:
  KILN_ENTRY StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);

 protected:
  KILN_ENTRY std::vector<double> get_lr() const override;
  KILN_ENTRY std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  std::int64_t step_size_;
  double gamma_;
};

/// lr *= gamma at each milestone epoch (torch's MultiStepLR; a milestone listed twice
/// multiplies by gamma twice).
class MultiStepLR : public LRScheduler {
 public:
  KILN_ENTRY MultiStepLR(Optimizer& optimizer, std::vector<std::int64_t> milestones, double gamma = 0.1);

 protected:
  KILN_ENTRY std::vector<double> get_lr() const override;
  KILN_ENTRY std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  std::map<std::int64_t, std::int64_t> count_;
  double gamma_;
};

/// lr *= gamma every epoch (torch's ExponentialLR): initial lr * gamma^epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) { initial_step(); }

 protected:
  KILN_ENTRY std::vector<double> get_lr() const override;
  KILN_ENTRY std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double gamma_;
};

/// Cosine annealing from the initial lr to eta_min over T_max epochs (torch's
/// CosineAnnealingLR, its recursive form): closed form eta_min + (lr0 - eta_min)(1 +
/// cos(pi epoch / T_max)) / 2, rising again after T_max (no restarts).
class CosineAnnealingLR : public LRScheduler {
 public:
  KILN_ENTRY CosineAnnealingLR(Optimizer& optimizer, std::int64_t T_max, double eta_min = 0);

 protected:
  KILN_ENTRY std::vector<double> get_lr() const override;
  KILN_ENTRY std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  std::int64_t t_max_;
  double eta_min_;
};

/// The linear warm-up (torch's LinearLR): the lr's factor goes linearly from start_factor at
/// epoch 0 to end_factor at total_iters, then stays (with total_iters 0 it stays start_factor,
/// as torch's; a negative total_iters is a ValueError).
class LinearLR : public LRScheduler {
 public:
  KILN_ENTRY LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                      std::int64_t total_iters = 5);

 protected:
  KILN_ENTRY std::vector<double> get_lr() const override;
  KILN_ENTRY std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double start_, end_;
  std::int64_t total_;
};

/// Schedulers one after another (torch's SequentialLR): schedulers[0] until milestones[0],
/// then schedulers[1] (restarted at its epoch 0), and so on. Every scheduler must belong to
/// `optimizer`; milestones has one entry fewer than schedulers (ValueError otherwise).
/// `SequentialLR s(opt, {std::make_shared<LinearLR>(opt, 0.1, 1.0, 5),
///                       std::make_shared<CosineAnnealingLR>(opt, 95)}, {5});`
class SequentialLR : public LRScheduler {
 public:
  KILN_ENTRY SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                          std::vector<std::int64_t> milestones);

  KILN_ENTRY void step() override;

  KILN_ENTRY nn::StateDict state_dict() const override;
  KILN_ENTRY void load_state_dict(const nn::StateDict& dict) override;

 protected:
  std::vector<double> get_lr() const override {
    throw ValueError("SequentialLR has no lr of its own: it steps its schedulers");
  }
  void undo_initial_step() override {
    for (auto& s : schedulers_) s->undo_initial_step();
  }

 private:
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
};

}  // namespace kiln::optim

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/optim/lr_scheduler_impl.hpp"
#endif
