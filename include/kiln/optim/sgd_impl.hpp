#pragma once
// The member function bodies of optim::SGD (optim/sgd.hpp). Header-only mode includes them
// from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp), so users' translation units parse declarations.
#include "kiln/optim/sgd.hpp"

namespace kiln::optim {

KILN_ENTRY void SGD::add_param_group(std::vector<Tensor> params, const SGDOptions& o) {
  ParamGroup g;
  g.params = std::move(params);
  g.lr = o.lr;
  g.momentum = o.momentum;
  g.dampening = o.dampening;
  g.weight_decay = o.weight_decay;
  g.nesterov = o.nesterov;
  g.maximize = o.maximize;
  Optimizer::add_param_group(std::move(g));
}

KILN_ENTRY void SGD::check_options(const ParamGroup& g) const {
  if (!(g.lr >= 0)) throw ValueError("SGD: invalid learning rate: " + std::to_string(g.lr));
  if (!(g.momentum >= 0)) throw ValueError("SGD: invalid momentum value: " + std::to_string(g.momentum));
  if (!(g.weight_decay >= 0)) throw ValueError("SGD: invalid weight_decay value: " + std::to_string(g.weight_decay));
  if (g.nesterov && (g.momentum <= 0 || g.dampening != 0))
    throw ValueError("SGD: Nesterov momentum requires a momentum and zero dampening (momentum " +
                     std::to_string(g.momentum) + ", dampening " + std::to_string(g.dampening) + ")");
}

KILN_ENTRY std::vector<Optimizer::Field> SGD::fields() const {
  return {{"lr", &ParamGroup::lr},
          {"momentum", &ParamGroup::momentum},
          {"dampening", &ParamGroup::dampening},
          {"weight_decay", &ParamGroup::weight_decay},
          {"nesterov", nullptr, &ParamGroup::nesterov},
          {"maximize", nullptr, &ParamGroup::maximize}};
}

KILN_ENTRY std::vector<double> SGD::scalars(const ParamGroup& g, const detail::ParamState& ps) const {
  const bool first = !ps.initialized;
  return {g.lr, g.weight_decay, g.momentum, first ? 0.0 : g.momentum, first ? 1.0 : 1.0 - g.dampening};
}

KILN_ENTRY Optimizer::Updated SGD::update(const ParamGroup& g, const Update& in) const {
  using namespace detail;
  NodePtr grad = g.maximize ? neg(in.grad) : in.grad;
  if (g.weight_decay != 0) grad = add(grad, mul(in.scalar(1), in.param));
  Updated out;
  out.state.resize(1);
  if (g.momentum != 0) {
    NodePtr buf = add(mul(in.state[0], in.scalar(3)), mul(grad, in.scalar(4)));
    out.state[0] = buf;
    grad = g.nesterov ? add(grad, mul(in.scalar(2), buf)) : buf;
  }
  out.param = sub(in.param, mul(in.scalar(0), grad));
  return out;
}

}  // namespace kiln::optim
