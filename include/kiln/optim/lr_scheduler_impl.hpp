#pragma once
// The member function bodies of the learning-rate schedulers (optim/lr_scheduler.hpp). Header-only mode includes them
// from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp), so users' translation units parse declarations.
#include "kiln/optim/lr_scheduler.hpp"

namespace kiln::optim {

KILN_ENTRY void LRScheduler::step() {
  ++step_count_;
  update_lr(std::nullopt);
}

KILN_ENTRY nn::StateDict LRScheduler::state_dict() const {
  nn::StateDict out;
  out.insert("last_epoch", from_vector<std::int64_t>({last_epoch_}, Shape{}));
  out.insert("_step_count", from_vector<std::int64_t>({step_count_}, Shape{}));
  out.insert("base_lrs", from_vector<double>(base_lrs_, Shape{static_cast<std::int64_t>(base_lrs_.size())}));
  out.insert("_last_lr", from_vector<double>(last_lr_, Shape{static_cast<std::int64_t>(last_lr_.size())}));
  return out;
}

KILN_ENTRY void LRScheduler::load_state_dict(const nn::StateDict& dict) {
  const auto n = static_cast<std::int64_t>(base_lrs_.size());
  auto get = [&](const std::string& key, const Shape& shape) {
    const Tensor* t = dict.find(key);
    if (!t) throw ValueError("LRScheduler.load_state_dict: missing key '" + key + "'");
    if (!t->defined() || t->shape() != shape)
      throw ValueError("LRScheduler.load_state_dict: key '" + key + "' has shape " +
                       (t->defined() ? t->shape().str() : std::string("undefined")) + ", expected " + shape.str());
    return t->to_vector<double>();
  };
  const std::vector<double> epoch = get("last_epoch", Shape{}), count = get("_step_count", Shape{});
  std::vector<double> base = get("base_lrs", Shape{n}), last = get("_last_lr", Shape{n});
  last_epoch_ = std::llround(epoch[0]);
  step_count_ = std::llround(count[0]);
  base_lrs_ = std::move(base);
  last_lr_ = std::move(last);
}

KILN_ENTRY void LRScheduler::initial_step() {
  step_count_ = 0;
  is_initial_ = true;
  try {
    step();
  } catch (...) {
    is_initial_ = false;
    throw;
  }
  is_initial_ = false;
}

KILN_ENTRY void LRScheduler::update_lr(std::optional<std::int64_t> epoch) {
  std::vector<double> values;
  if (!epoch) {
    ++last_epoch_;
    values = get_lr();
  } else {
    last_epoch_ = *epoch;
    std::optional<std::vector<double>> closed = closed_form_lr();
    values = closed ? *closed : get_lr();
  }
  std::vector<ParamGroup>& groups = optimizer_->param_groups();
  for (std::size_t i = 0; i < groups.size() && i < values.size(); ++i) groups[i].lr = values[i];
  last_lr_ = group_lrs();
}

KILN_ENTRY std::vector<double> LRScheduler::group_lrs() const {
  std::vector<double> out;
  for (const ParamGroup& g : optimizer_->param_groups()) out.push_back(g.lr);
  return out;
}

KILN_ENTRY std::vector<double> LambdaLR::get_lr() const {
  std::vector<double> out;
  for (std::size_t i = 0; i < base_lrs_.size(); ++i) out.push_back(base_lrs_[i] * lambdas_[i](last_epoch_));
  return out;
}

KILN_ENTRY std::vector<double> StepLR::get_lr() const {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

KILN_ENTRY std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
  return out;
}

KILN_ENTRY std::vector<double> MultiStepLR::get_lr() const {
  std::vector<double> lrs = group_lrs();
  auto it = count_.find(last_epoch_);
  if (it == count_.end()) return lrs;
  for (double& lr : lrs) lr *= std::pow(gamma_, static_cast<double>(it->second));
  return lrs;
}

KILN_ENTRY std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  std::int64_t passed = 0;
  for (const auto& [m, c] : count_)
    if (m <= last_epoch_) passed += c;
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(passed)));
  return out;
}

KILN_ENTRY std::vector<double> ExponentialLR::get_lr() const {
  std::vector<double> lrs = group_lrs();
  if (is_initial_) return lrs;
  for (double& lr : lrs) lr *= gamma_;
  return lrs;
}

KILN_ENTRY std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return out;
}

KILN_ENTRY std::vector<double> CosineAnnealingLR::get_lr() const {
  const double pi = std::numbers::pi, T = static_cast<double>(t_max_), e = static_cast<double>(last_epoch_);
  std::vector<double> lrs = group_lrs();
  if (is_initial_) return lrs;
  if (step_count_ == 1 && last_epoch_ > 0) {
    for (std::size_t i = 0; i < lrs.size(); ++i)
      lrs[i] = eta_min_ + (base_lrs_[i] - eta_min_) * (1 + std::cos(e * pi / T)) / 2;
    return lrs;
  }
  if ((last_epoch_ - 1 - t_max_) % (2 * t_max_) == 0) {
    for (std::size_t i = 0; i < lrs.size(); ++i) lrs[i] += (base_lrs_[i] - eta_min_) * (1 - std::cos(pi / T)) / 2;
    return lrs;
  }
  for (double& lr : lrs)
    lr = (1 + std::cos(pi * e / T)) / (1 + std::cos(pi * (e - 1) / T)) * (lr - eta_min_) + eta_min_;
  return lrs;
}

KILN_ENTRY std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  const double pi = std::numbers::pi;
  std::vector<double> out;
  for (double b : base_lrs_)
    out.push_back(eta_min_ + (b - eta_min_) *
                                 (1 + std::cos(pi * static_cast<double>(last_epoch_) / static_cast<double>(t_max_))) /
                                 2);
  return out;
}

KILN_ENTRY std::vector<double> LinearLR::get_lr() const {
  std::vector<double> lrs = group_lrs();
  if (last_epoch_ == 0) {
    for (double& lr : lrs) lr *= start_;
    return lrs;
  }
  if (is_initial_ || last_epoch_ > total_) return lrs;
  const double f = 1.0 + (end_ - start_) / (static_cast<double>(total_) * start_ +
                                            static_cast<double>(last_epoch_ - 1) * (end_ - start_));
  for (double& lr : lrs) lr *= f;
  return lrs;
}

KILN_ENTRY std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  std::vector<double> out;
  const double done =
      total_ == 0 ? 0.0 : static_cast<double>(std::min(total_, last_epoch_)) / static_cast<double>(total_);
  for (double b : base_lrs_) out.push_back(b * (start_ + (end_ - start_) * done));
  return out;
}

KILN_ENTRY void SequentialLR::step() {
  ++last_epoch_;
  const auto idx = static_cast<std::size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) -
                                            milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  if (idx > 0 && milestones_[idx - 1] == last_epoch_)
    s.update_lr(0);
  else
    s.step();
  last_lr_ = s.get_last_lr();
}

KILN_ENTRY nn::StateDict SequentialLR::state_dict() const {
  nn::StateDict out = LRScheduler::state_dict();
  for (std::size_t i = 0; i < schedulers_.size(); ++i)
    for (const auto& [k, v] : schedulers_[i]->state_dict()) out.insert("_schedulers." + std::to_string(i) + "." + k, v);
  return out;
}

KILN_ENTRY void SequentialLR::load_state_dict(const nn::StateDict& dict) {
  LRScheduler::load_state_dict(dict);
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    const std::string prefix = "_schedulers." + std::to_string(i) + ".";
    nn::StateDict sub;
    for (const auto& [k, v] : dict)
      if (k.rfind(prefix, 0) == 0) sub.insert(k.substr(prefix.size()), v);
    schedulers_[i]->load_state_dict(sub);
  }
}

KILN_ENTRY LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(&optimizer) {
  for (ParamGroup& g : optimizer.param_groups()) {
    if (!g.initial_lr) g.initial_lr = g.lr;
    base_lrs_.push_back(*g.initial_lr);
  }
}

KILN_ENTRY LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<std::function<double(std::int64_t)>> lr_lambdas)
    : LRScheduler(optimizer), lambdas_(std::move(lr_lambdas)) {
  if (lambdas_.size() != optimizer.param_groups().size())
    throw ValueError("LambdaLR: expected " + std::to_string(optimizer.param_groups().size()) + " lr_lambdas, got " +
                     std::to_string(lambdas_.size()));
  for (const auto& f : lambdas_)
    if (!f) throw ValueError("LambdaLR: an lr_lambda is empty");
  initial_step();
}

KILN_ENTRY StepLR::StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  if (step_size <= 0) throw ValueError("StepLR: step_size must be positive, got " + std::to_string(step_size));
  initial_step();
}

KILN_ENTRY MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<std::int64_t> milestones, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  for (std::int64_t m : milestones) ++count_[m];
  initial_step();
}

KILN_ENTRY CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, std::int64_t T_max, double eta_min)
    : LRScheduler(optimizer), t_max_(T_max), eta_min_(eta_min) {
  if (T_max <= 0) throw ValueError("CosineAnnealingLR: T_max must be positive, got " + std::to_string(T_max));
  initial_step();
}

KILN_ENTRY LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, std::int64_t total_iters)
    : LRScheduler(optimizer), start_(start_factor), end_(end_factor), total_(total_iters) {
  if (start_factor > 1.0 || start_factor <= 0)
    throw ValueError(
        "LinearLR: starting multiplicative factor expected to be greater than 0 and less or equal to 1, got " +
        std::to_string(start_factor));
  if (end_factor > 1.0 || end_factor < 0)
    throw ValueError("LinearLR: ending multiplicative factor expected to be between 0 and 1, got " +
                     std::to_string(end_factor));
  // 0 is torch's too: the factor stays start_factor (no step reaches end_factor); a negative
  // count is refused (torch would treat it as 0).
  if (total_iters < 0) throw ValueError("LinearLR: total_iters must be non-negative, got " + std::to_string(total_iters));
  initial_step();
}

KILN_ENTRY SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                                      std::vector<std::int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  if (schedulers_.empty()) throw ValueError("SequentialLR expects at least one scheduler, but got none");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    if (!schedulers_[i]) throw ValueError("SequentialLR: scheduler " + std::to_string(i) + " is null");
    if (schedulers_[i]->optimizer_ != &optimizer)
      throw ValueError("SequentialLR expects all schedulers to belong to the same optimizer, but scheduler " +
                       std::to_string(i) + " belongs to another");
  }
  if (milestones_.size() != schedulers_.size() - 1)
    throw ValueError(
        "SequentialLR expects number of schedulers provided to be one more than the number of "
        "milestone points, but got " +
        std::to_string(schedulers_.size()) + " schedulers and " + std::to_string(milestones_.size()) + " milestones");
  last_epoch_ = 0;
  for (ParamGroup& g : optimizer.param_groups()) g.lr = *g.initial_lr;
  for (auto& s : schedulers_) s->undo_initial_step();
  // The scheduler of epoch 0: the first, or a later one when milestones start at 0 (torch's
  // bisect_right(milestones, 0)).
  const auto first = static_cast<std::size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), 0) -
                                              milestones_.begin());
  schedulers_[first]->initial_step();
  last_lr_ = schedulers_[first]->get_last_lr();
}

}  // namespace kiln::optim
