#pragma once
// G3's MLP block `linear(gelu(linear(x, W1, b1), tanh), W2, b2)` and its gradients, as IR: the
// graph a training step's products and their epilogues are planned from (the step planner's
// tests, and the host run of a GPU's plan).
#include <memory>
#include <vector>

#include "kiln/autodiff/backward.hpp"
#include "ir_build.hpp"

namespace kiln_ir_build {

/// The block and its gradients with respect to all five inputs from a given gradient of the
/// output (bench_gpu's B2, small): roots {y, dx, dW1, db1, dW2, db2}, `hidden` wide, in `dt`.
/// `sequences`: x is [2, 8, 8] and each linear is what kiln::linear records for it, a product
/// over [16, 8] rows whose result a reshape splits back into [2, 8, N] before the bias.
inline std::vector<NodePtr> mlp_block_with_gradients(std::int64_t hidden, bool sequences = false, DType dt = bf16) {
  const double s = 0.25;
  std::vector<NodePtr> leaves{input(sequences ? Shape{2, 8, 8} : Shape{16, 8}, dt, 1), input({hidden, 8}, dt, 2, {}, -1, 0, s),
                              input({hidden}, dt, 3, {}, -1, 0, s), input({8, hidden}, dt, 4, {}, -1, 0, s),
                              input({8}, dt, 5, {}, -1, 0, s)};
  for (auto& l : leaves) {
    l->requires_grad = true;
    l->grad_leaf = std::make_shared<ir::GradLeaf>();
  }
  auto linear = [&](const NodePtr& x, const NodePtr& w, const NodePtr& b) {
    const std::int64_t n = w->shape[0];
    const NodePtr wt = ir::permute(w, {1, 0});
    if (!sequences)
      return add(ir::matmul(x, wt), ir::broadcast(ir::reshape(b, Shape{1, n}), Shape{16, n}));
    NodePtr rows = ir::matmul(ir::reshape(x, Shape{16, x->shape[2]}), wt);
    return add(ir::reshape(rows, Shape{2, 8, n}), ir::broadcast(ir::reshape(b, Shape{1, 1, n}), Shape{2, 8, n}));
  };
  NodePtr h = decomp::gelu(linear(leaves[0], leaves[1], leaves[2]), true);
  NodePtr y = linear(h, leaves[3], leaves[4]);
  auto reached = kiln::autodiff::backward_pass({y}, {input(y->shape, dt, 6)}, leaves, false, "mlp");
  std::vector<NodePtr> roots{y};
  for (auto& l : leaves)
    for (auto& r : reached)
      if (r.node == l) roots.push_back(r.grad);
  return roots;
}

}  // namespace kiln_ir_build
