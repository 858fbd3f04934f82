#pragma once
// Grad mode as a scope: the one piece of the autodiff the tensor front end's headers need
// (NoGradGuard, EnableGradGuard), apart from the backward itself (backward.hpp), which only
// the front end's compiled bodies include.
#include "kiln/ir/node.hpp"

namespace kiln::autodiff {

/// Sets grad mode for its lifetime (restores the previous one after).
class GradModeScope {
 public:
  explicit GradModeScope(bool enabled) : saved_(ir::detail::grad_mode()) { ir::detail::grad_mode() = enabled; }
  ~GradModeScope() { ir::detail::grad_mode() = saved_; }
  GradModeScope(const GradModeScope&) = delete;
  GradModeScope& operator=(const GradModeScope&) = delete;

 private:
  bool saved_;
};

}  // namespace kiln::autodiff
