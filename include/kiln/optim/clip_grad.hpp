#pragma once
// Gradient clipping (torch.nn.utils.clip_grad_norm_, clip_grad_value_), in place and fused: the
// gradients a fused optimizer keeps in one flat buffer are clipped as one tensor (one kernel for
// the norm, one for the scaling), and nothing waits for the norm on the host unless asked to.
#include <cmath>
#include <limits>
#include <source_location>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/optim/optimizer.hpp"

namespace kiln::nn::utils {

namespace detail {

/// The dtype two gradients' norm is reported in (PyTorch's promotion among floating dtypes).
KILN_ENTRY DType promote_floating(DType a, DType b);

/// x (any shape) as a 0-dim reduction `op` over all of its elements.
KILN_ENTRY ir::NodePtr reduce_all(ir::Op op, const ir::NodePtr& x);

}  // namespace detail

/// Scales the gradients of `params` in place so that their total norm (the `norm_type`-norm of
/// the gradients' norms, torch's definition: for 2, any p > 0, inf and -inf that is the norm of
/// all their elements together; for 0 it is the number of gradients that hold a nonzero) is at
/// most `max_norm`, as torch.nn.utils.clip_grad_norm_: every gradient is multiplied by
/// min(1, max_norm / (total + 1e-6)). Returns the total norm before clipping (0-dim, the
/// gradients' dtype; 0 without gradients). Parameters without a gradient are skipped. With
/// `error_if_nonfinite` a NaN or infinite total is a ValueError (the one case that reads the
/// norm on the host), the gradients untouched.
KILN_ENTRY Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                                  bool error_if_nonfinite = false);

/// Clamps the gradients of `params` in place to [-clip_value, clip_value] (torch's
/// clip_grad_value_; NaN stays NaN). Parameters without a gradient are skipped.
KILN_ENTRY void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace kiln::nn::utils

namespace kiln::optim {
using kiln::nn::utils::clip_grad_norm_;
using kiln::nn::utils::clip_grad_value_;
}  // namespace kiln::optim

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/optim/clip_grad_impl.hpp"
#endif
