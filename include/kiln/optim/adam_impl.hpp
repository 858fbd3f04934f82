#pragma once
// The member function bodies of Adam and AdamW (optim/adam.hpp). Header-only mode includes them
// from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp), so users' translation units parse declarations.
#include "kiln/optim/adam.hpp"

namespace kiln::optim {

KILN_ENTRY void detail::AdamBase::check_options(const ParamGroup& g) const {
  const std::string who = name();
  if (!(g.lr >= 0)) throw ValueError(who + ": invalid learning rate: " + std::to_string(g.lr));
  if (!(g.eps >= 0)) throw ValueError(who + ": invalid epsilon value: " + std::to_string(g.eps));
  if (!(g.betas.first >= 0 && g.betas.first < 1))
    throw ValueError(who + ": invalid beta parameter at index 0: " + std::to_string(g.betas.first));
  if (!(g.betas.second >= 0 && g.betas.second < 1))
    throw ValueError(who + ": invalid beta parameter at index 1: " + std::to_string(g.betas.second));
  if (!(g.weight_decay >= 0)) throw ValueError(who + ": invalid weight_decay value: " + std::to_string(g.weight_decay));
}

KILN_ENTRY std::vector<Optimizer::Field> detail::AdamBase::fields() const {
  return {{"lr", &ParamGroup::lr},
          {"betas", nullptr, nullptr, &ParamGroup::betas},
          {"eps", &ParamGroup::eps},
          {"weight_decay", &ParamGroup::weight_decay},
          {"amsgrad", nullptr, &ParamGroup::amsgrad},
          {"maximize", nullptr, &ParamGroup::maximize}};
}

KILN_ENTRY std::vector<double> detail::AdamBase::scalars(const ParamGroup& g, const ParamState& ps) const {
  const double t = static_cast<double>(ps.step);
  const double b1 = g.betas.first, b2 = g.betas.second;
  const double bias_correction1 = 1 - std::pow(b1, t);
  const double bias_correction2 = 1 - std::pow(b2, t);
  return {g.weight_decay,           b1, 1 - b1, b2, 1 - b2, g.lr / bias_correction1, std::sqrt(bias_correction2), g.eps,
          1 - g.lr * g.weight_decay};
}

KILN_ENTRY Optimizer::Updated detail::AdamBase::update(const ParamGroup& g, const Update& in) const {
  NodePtr grad = g.maximize ? neg(in.grad) : in.grad;
  NodePtr param = in.param;
  if (g.weight_decay != 0) {
    if (decoupled_)
      param = mul(param, in.scalar(8));
    else
      grad = add(grad, mul(in.scalar(0), param));
  }
  Updated out;
  out.state.resize(3);
  NodePtr m = add(mul(in.state[0], in.scalar(1)), mul(grad, in.scalar(2)));
  NodePtr v = add(mul(in.state[1], in.scalar(3)), mul(mul(grad, grad), in.scalar(4)));
  out.state[0] = m;
  out.state[1] = v;
  NodePtr second = v;
  if (g.amsgrad) {
    second = maximum(in.state[2], v);
    out.state[2] = second;
  }
  NodePtr denom = add(div(sqrt(second), in.scalar(6)), in.scalar(7));
  out.param = sub(param, mul(in.scalar(5), div(m, denom)));
  return out;
}

}  // namespace kiln::optim
