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
  double growth_factor = 2.0;           ///< > 1
  double backoff_factor = 0.5;          ///< in (0, 1)
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
      throw ValueError("GradScaler: the backoff factor must be in (0, 1), got " +
                       std::to_string(options.backoff_factor));
    if (options.growth_interval <= 0)
      throw ValueError("GradScaler: growth_interval must be positive, got " + std::to_string(options.growth_interval));
    if (!(options.init_scale > 0) || !std::isfinite(options.init_scale))
      throw ValueError("GradScaler: init_scale must be positive and finite, got " + std::to_string(options.init_scale));
  }

  /// `loss` times the scale (a float32 0-dim tensor: PyTorch's promotion decides the dtype),
  /// recorded for backward; `loss` itself when disabled. The scale is a number in memory, not
  /// in the kernel's code: a new scale compiles nothing.
  Tensor scale(const Tensor& loss) const;

  /// Divides the gradients of `optimizer`'s parameters by the scale in place and records
  /// whether any of them holds an inf or a NaN (torch's unscale_). At most once per optimizer
  /// between update()s, and before step() (kiln::Error otherwise). float16 gradients are a
  /// ValueError (their parameters should be float32, as torch's rule).
  void unscale_(optim::Optimizer& optimizer);

  /// Unscales (unless unscale_ did already), then runs optimizer.step() unless a gradient
  /// holds an inf or a NaN (reads that one flag on the host). Once per optimizer between
  /// update()s; an optimizer none of whose parameters has a gradient is a kiln::Error (torch's
  /// "no inf checks were recorded"). A disabled scaler just steps.
  void step(optim::Optimizer& optimizer);

  /// The scale for the next iteration (torch's update): times backoff_factor if a step since
  /// the last update found an inf or a NaN (the run of good steps restarts), times
  /// growth_factor after growth_interval good steps in a row (kept if that overflows).
  /// kiln::Error if no step() or unscale_() checked gradients since the last update (an
  /// unscale_() of an optimizer without gradients checks none).
  void update();
  /// Sets the scale to `new_scale` (torch's update(new_scale)).
  void update(double new_scale);

  /// The current scale (1 when disabled).
  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  double get_growth_factor() const { return options_.growth_factor; }
  double get_backoff_factor() const { return options_.backoff_factor; }
  std::int64_t get_growth_interval() const { return options_.growth_interval; }
  bool is_enabled() const { return options_.enabled; }

  /// scale, growth_factor, backoff_factor (float64 0-d), growth_interval, _growth_tracker
  /// (int64 0-d), torch's keys; empty when disabled.
  nn::StateDict state_dict() const;
  /// Restores what state_dict() saved (ValueError for a missing or mis-shaped key; an empty
  /// dict is a ValueError unless this scaler is disabled).
  void load_state_dict(const nn::StateDict& dict);

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

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/optim/grad_scaler_impl.hpp"
#endif
