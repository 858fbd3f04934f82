#pragma once
// The member function bodies of kiln::GradScaler (optim/grad_scaler.hpp). Header-only mode includes them
// from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp), so users' translation units parse declarations.
#include "kiln/optim/grad_scaler.hpp"

namespace kiln {

KILN_ENTRY Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  Tensor s = from_vector<float>({static_cast<float>(scale_)}, Shape{}, loss.device());
  return loss * s;
}

KILN_ENTRY void GradScaler::unscale_(optim::Optimizer& optimizer) {
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
  for (const optim::ParamGroup& g : optimizer.param_groups())
    params.insert(params.end(), g.params.begin(), g.params.end());
  const std::vector<ir::NodePtr> grads = od::defined_grads(params);
  for (const ir::NodePtr& g : grads)
    if (g->dtype == DType::Float16) throw ValueError("GradScaler.unscale_: attempting to unscale FP16 gradients");
  const std::vector<ir::NodePtr> pieces = od::coalesce(grads);
  // Whether a gradient is not finite, checked before they are scaled: one graph...
  std::map<std::string, ir::NodePtr> found_on;  // per device
  for (const ir::NodePtr& piece : pieces) {
    ir::NodePtr& slot = found_on[piece->device.str()];
    if (piece->numel() == 0) {  // nothing to check, but the device was (torch records it)
      if (!slot) slot = ir::constant(0.0, DType::Float32, Shape{}, piece->device);
      continue;
    }
    ir::NodePtr flat = ir::reshape(piece, Shape{piece->numel()});
    ir::NodePtr bad = ir::binary(ir::Op::Or, ir::unary(ir::Op::IsNan, flat), ir::unary(ir::Op::IsInf, flat));
    ir::NodePtr any = ir::reshape(ir::reduce(ir::Op::ReduceMax, ir::cast(bad, DType::Float32), {0}), Shape{});
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

KILN_ENTRY void GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  PerOptimizer& st = per_[&optimizer];
  if (st.stage == Stage::Stepped) throw Error("GradScaler.step() has already been called since the last update()");
  if (st.stage == Stage::Ready) unscale_(optimizer);
  if (st.found_inf.empty())  // torch's "No inf checks were recorded for this optimizer."
    throw Error(
        "GradScaler.step: no inf checks were recorded for this optimizer: none of its parameters has a gradient "
        "(call scaler.scale(loss).backward() first)");
  bool found = false;
  for (const Tensor& f : st.found_inf) found = found || f.item<float>() != 0.0f;
  if (!found) optimizer.step();
  st.stage = Stage::Stepped;
}

KILN_ENTRY void GradScaler::update() {
  if (!options_.enabled) return;
  bool any_check = false, found = false;
  for (const auto& [opt, st] : per_) {
    (void)opt;
    for (const Tensor& f : st.found_inf) {
      any_check = true;
      found = found || f.item<float>() != 0.0f;
    }
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

KILN_ENTRY void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  scale_ = to_f32(new_scale);
  per_.clear();
}

KILN_ENTRY nn::StateDict GradScaler::state_dict() const {
  nn::StateDict out;
  if (!options_.enabled) return out;
  out.insert("scale", from_vector<double>({scale_}, Shape{}));
  out.insert("growth_factor", from_vector<double>({options_.growth_factor}, Shape{}));
  out.insert("backoff_factor", from_vector<double>({options_.backoff_factor}, Shape{}));
  out.insert("growth_interval", from_vector<std::int64_t>({options_.growth_interval}, Shape{}));
  out.insert("_growth_tracker", from_vector<std::int64_t>({growth_tracker_}, Shape{}));
  return out;
}

KILN_ENTRY void GradScaler::load_state_dict(const nn::StateDict& dict) {
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

}  // namespace kiln
