#pragma once
// Loss scaling for mixed precision (torch.amp.GradScaler): the loss is multiplied by a scale so
// that small float16 gradients do not underflow, the gradients are divided by it again before
// the optimizer's step, and a step whose gradients hold an inf or a NaN is skipped while the
// scale backs off. Unscaling a fused optimizer's gradients is one check and one scaling kernel.
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/nn/state_dict.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln {

/// GradScaler's settings (torch.amp.GradScaler's, same defaults).
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;   ///< > 1
  double backoff_factor = 0.5;  ///< in (0, 1)
  std::int64_t growth_interval = 2000;  ///< consecutive steps without inf/NaN before the scale grows
  bool enabled = true;                  ///< false: every call passes through
};

/// torch.amp.GradScaler:
///   scaler.scale(loss).backward();
///   scaler.unscale_(opt);                 // optional: to clip the true gradients
///   kiln::optim::clip_grad_norm_(params, 1.0);
///   scaler.step(opt);                     // skipped if a gradient has an inf or a NaN
///   scaler.update();                      // backoff after a skipped step, growth after
///                                         // growth_interval good ones
/// The scale is a float32 value, as torch's. A disabled scaler is a pass-through.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {}) : options_(options), scale_(to_f32(options.init_scale)) {
    if (!(options.growth_factor > 1.0))
      throw ValueError("GradScaler: the growth factor must be > 1.0, got " + std::to_string(options.growth_factor));
    if (!(options.backoff_factor > 0.0 && options.backoff_factor < 1.0))
      throw ValueError("GradScaler: the backoff factor must be in (0, 1), got " + std::to_string(options.backoff_factor));
    if (options.growth_interval <= 0)
      throw ValueError("GradScaler: growth_interval must be positive, got " + std::to_string(options.growth_interval));
    if (!(options.init_scale > 0) || !std::isfinite(options.init_scale))
      throw ValueError("GradScaler: init_scale must be positive and finite, got " + std::to_string(options.init_scale));
  }

  /// `loss` times the scale (a float32 0-dim tensor: PyTorch's promotion decides the dtype),
  /// recorded for backward; `loss` itself when disabled. The scale is a number in memory, not
  /// in the kernel's code: a new scale compiles nothing.
  Tensor scale(const Tensor& loss) const {
    if (!options_.enabled) return loss;
    Tensor s = from_vector<float>({static_cast<float>(scale_)}, Shape{}, loss.device());
    return loss * s;
  }

  /// Divides the gradients of `optimizer`'s parameters by the scale in place and records
  /// whether any of them holds an inf or a NaN (torch's unscale_). At most once per optimizer
  /// between update()s, and before step() (kiln::Error otherwise). float16 gradients are a
  /// ValueError (their parameters should be float32, as torch's rule).
  void unscale_(optim::Optimizer& optimizer) {
    if (!options_.enabled) return;
    PerOptimizer& st = per_[&optimizer];
    if (st.stage == Stage::Unscaled)
      throw Error("GradScaler.unscale_() has already been called on this optimizer since the last update()");
    if (st.stage == Stage::Stepped) throw Error("GradScaler.unscale_() is being called after step()");
    namespace od = optim::detail;
    kiln::detail::before_data_read("GradScaler.unscale_()", std::source_location::current());
    kiln::detail::SuspendTrace eager;
    NoGradGuard off;
    std::vector<Tensor> params;
    for (const optim::ParamGroup& g : optimizer.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
    const std::vector<ir::NodePtr> grads = od::defined_grads(params);
    for (const ir::NodePtr& g : grads)
      if (g->dtype == DType::Float16) throw ValueError("GradScaler.unscale_: attempting to unscale FP16 gradients");
    const std::vector<ir::NodePtr> pieces = od::coalesce(grads);
    // Whether a gradient is not finite, checked before they are scaled: one graph...
    std::map<std::string, ir::NodePtr> found_on;  // per device
    for (const ir::NodePtr& piece : pieces) {
      if (piece->numel() == 0) continue;
      ir::NodePtr flat = ir::reshape(piece, Shape{piece->numel()});
      ir::NodePtr bad = ir::binary(ir::Op::Or, ir::unary(ir::Op::IsNan, flat), ir::unary(ir::Op::IsInf, flat));
      ir::NodePtr any =
          ir::reshape(ir::reduce(ir::Op::ReduceMax, ir::cast(bad, DType::Float32), {0}), Shape{});
      ir::NodePtr& slot = found_on[piece->device.str()];
      slot = slot ? ir::binary(ir::Op::Maximum, slot, any) : any;
    }
    std::vector<ir::NodePtr> found;
    for (auto& [dev, n] : found_on) found.push_back(n);
    kiln::detail::evaluate(found);
    st.found_inf.clear();
    for (const ir::NodePtr& n : found) st.found_inf.push_back(Tensor(n));
    // ...then the scaling by 1 / scale (computed in double, rounded to float32, as torch), in
    // place: one more.
    const double inv = static_cast<double>(static_cast<float>(1.0 / scale_));
    std::vector<ir::NodePtr> values;
    for (const ir::NodePtr& piece : pieces) {
      const DType cd = od::opmath(piece->dtype);
      ir::NodePtr factor = od::scalars_tensor({inv}, cd, piece->device);
      values.push_back(ir::cast(od::mul(ir::cast(piece, cd), od::scalar_view(factor, 0, piece->shape)), piece->dtype));
    }
    kiln::detail::evaluate_into_many(values, pieces);
    st.stage = Stage::Unscaled;
  }

  /// Unscales (unless unscale_ did already), then runs optimizer.step() unless a gradient
  /// holds an inf or a NaN (reads that one flag on the host). Once per optimizer between
  /// update()s. A disabled scaler just steps.
  void step(optim::Optimizer& optimizer) {
    if (!options_.enabled) {
      optimizer.step();
      return;
    }
    PerOptimizer& st = per_[&optimizer];
    if (st.stage == Stage::Stepped)
      throw Error("GradScaler.step() has already been called since the last update()");
    if (st.stage == Stage::Ready) unscale_(optimizer);
    bool found = false;
    for (const Tensor& f : st.found_inf) found = found || f.item<float>() != 0.0f;
    if (!found) optimizer.step();
    st.stage = Stage::Stepped;
  }

  /// The scale for the next iteration (torch's update): times backoff_factor if a step since
  /// the last update found an inf or a NaN (the run of good steps restarts), times
  /// growth_factor after growth_interval good steps in a row (kept if that overflows).
  /// kiln::Error if no step() or unscale_() checked gradients since the last update.
  void update() {
    if (!options_.enabled) return;
    bool any_check = false, found = false;
    for (const auto& [opt, st] : per_) {
      (void)opt;
      for (const Tensor& f : st.found_inf) {
        any_check = true;
        found = found || f.item<float>() != 0.0f;
      }
      any_check = any_check || st.stage != Stage::Ready;
    }
    if (!any_check) throw Error("GradScaler.update: no inf checks were recorded prior to update()");
    if (found) {
      scale_ = to_f32(scale_ * options_.backoff_factor);
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == options_.growth_interval) {
      const double grown = to_f32(scale_ * options_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    }
    per_.clear();
  }
  /// Sets the scale to `new_scale` (torch's update(new_scale)).
  void update(double new_scale) {
    if (!options_.enabled) return;
    scale_ = to_f32(new_scale);
    per_.clear();
  }

  /// The current scale (1 when disabled).
  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  double get_growth_factor() const { return options_.growth_factor; }
  double get_backoff_factor() const { return options_.backoff_factor; }
  std::int64_t get_growth_interval() const { return options_.growth_interval; }
  bool is_enabled() const { return options_.enabled; }

  /// scale, growth_factor, backoff_factor (float64 0-d), growth_interval, _growth_tracker
  /// (int64 0-d), torch's keys; empty when disabled.
  nn::StateDict state_dict() const {
    nn::StateDict out;
    if (!options_.enabled) return out;
    out.insert("scale", from_vector<double>({scale_}, Shape{}));
    out.insert("growth_factor", from_vector<double>({options_.growth_factor}, Shape{}));
    out.insert("backoff_factor", from_vector<double>({options_.backoff_factor}, Shape{}));
    out.insert("growth_interval", from_vector<std::int64_t>({options_.growth_interval}, Shape{}));
    out.insert("_growth_tracker", from_vector<std::int64_t>({growth_tracker_}, Shape{}));
    return out;
  }
  /// Restores what state_dict() saved (ValueError for a missing or mis-shaped key; an empty
  /// dict is a ValueError unless this scaler is disabled).
  void load_state_dict(const nn::StateDict& dict) {
    if (!options_.enabled) return;
    if (dict.empty()) throw ValueError("GradScaler.load_state_dict: the state_dict is empty (of a disabled scaler?)");
    auto get = [&](const char* key) {
      const Tensor* t = dict.find(key);
      if (!t) throw ValueError(std::string("GradScaler.load_state_dict: missing key '") + key + "'");
      if (!t->defined() || t->numel() != 1)
        throw ValueError(std::string("GradScaler.load_state_dict: key '") + key + "' must hold one number");
      return t->to_vector<double>()[0];
    };
    const double scale = get("scale"), growth = get("growth_factor"), backoff = get("backoff_factor");
    const double interval = get("growth_interval"), tracker = get("_growth_tracker");
    scale_ = to_f32(scale);
    options_.growth_factor = growth;
    options_.backoff_factor = backoff;
    options_.growth_interval = std::llround(interval);
    growth_tracker_ = std::llround(tracker);
  }

 private:
  static double to_f32(double v) { return static_cast<double>(static_cast<float>(v)); }

  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    std::vector<Tensor> found_inf;  ///< 0-d float32 per device: 1 when a gradient is not finite
  };

  GradScalerOptions options_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
  std::map<const optim::Optimizer*, PerOptimizer> per_;
};

}  // namespace kiln
