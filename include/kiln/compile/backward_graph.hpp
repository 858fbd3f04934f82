#pragma once
// The backward of a compiled function, as AOTAutograd builds it: when a traced function's
// results require grad, its backward is derived once, at trace time, from the traced forward
// (the autodiff stage's rules over the lazy graph) and kept as one captured graph per result.
// The forward graph then also outputs the values the backward needs and that are costly to
// recompute (products, reductions, scans, sorts, gathers: AOTAutograd's default partition);
// pointwise chains are recomputed inside the backward's kernels from those and from the
// function's inputs. Each replay gives its results a gradient rule that rebuilds the backward
// graph over that call's buffers and incoming gradient: lazy nodes that fuse with the rest of
// the user's backward and whose kernels are compiled once and cached like any other.
#include <algorithm>
#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/ir/rebuild.hpp"
#include "kiln/tensor/tensor.hpp"

namespace kiln::detail {

/// The index of the tensor argument whose storage is `st`, or -1 (a tensor the function captured).
KILN_ENTRY int argument_of_storage(const StoragePtr& st, const std::vector<const Tensor*>& args);

/// Where a leaf of a backward graph comes from when the backward runs.
struct BackwardLeaf {
  enum class Kind : std::uint8_t { Seed, Saved, Arg, Constant } kind = Kind::Constant;
  int index = 0;            ///< Saved: index among the saved values; Arg: tensor argument index
  std::int64_t offset = 0;  ///< Saved, Arg: element offset of the leaf's view (relative to the argument's own)
  ir::NodePtr constant;     ///< Constant: a tensor the function captured
  Shape shape;              ///< Saved, Arg: the view the graph reads
  Strides strides;
  DType dtype = DType::Float32;
};

/// A forward input that gradients flow to: a tensor argument, or a tensor the function captured
/// (a parameter).
struct GradInput {
  int arg = -1;          ///< tensor argument index, or -1
  ir::NodePtr constant;  ///< arg == -1: the captured node itself (it holds the parameter's grad)
};

/// The backward of one result: its gradient in, the gradients of the grad inputs out.
struct ResultBackward {
  std::size_t result = 0;  ///< index among the function's flattened results
  ir::Graph graph;
  std::vector<BackwardLeaf> leaves;          ///< by leaf index
  std::int32_t seed_leaf = -1;               ///< the leaf the result's gradient binds to
  std::vector<std::size_t> input_of_output;  ///< graph output k is the gradient of inputs[input_of_output[k]]
};

/// Everything a replay needs to give its results gradients.
struct CompiledBackward {
  std::vector<GradInput> inputs;
  std::vector<ResultBackward> results;
  std::size_t saved_first = 0;  ///< flattened result index of the first saved value
};

/// The traced backward before the forward has run: lazy gradient nodes over the traced forward.
struct PendingBackward {
  std::vector<ir::NodePtr> grad_inputs;  ///< realized forward inputs that require grad
  std::vector<GradInput> inputs;
  struct PerResult {
    std::size_t result;
    StoragePtr seed;                    ///< placeholder storage of the incoming gradient's leaf
    std::vector<ir::NodePtr> grads;     ///< gradient of each reached grad input
    std::vector<std::size_t> input_of;  ///< its index in grad_inputs
  };
  std::vector<PerResult> results;
  std::vector<ir::NodePtr> saved;  ///< forward nodes the backward reads (outputs of the forward graph)
  /// Results that require grad but whose recorded graph a backward inside the function freed
  /// (the loss of `autograd::grad({loss}, ...)` returned beside its gradients): no backward is
  /// derived for them, and a replay's copy of them stays as the eager result is: requiring grad,
  /// its graph freed (a later backward through it raises the same error).
  std::vector<std::size_t> freed;
};

/// Values that are costly to recompute in the backward: kept from the forward instead.
KILN_ENTRY bool save_for_backward(ir::Op op);

/// Of the forward's pointwise values the backward needs (`needed`, reached through values it
/// recomputes), those it should read from the forward instead: a branch point of the forward
/// (read by two or more forward values) whose recomputation would read three or more large
/// values (a sixteenth of its elements or more; the step planner's kRecomputeReadLimit) from
/// memory. Memory is what the
/// forward realized, what it keeps anyway (`kept`: products, reductions, ...) and the values
/// chosen below it: decided from the inputs up, a residual stream `x + f(x) + g(..)` through a
/// transformer's layers is saved every other add, where recomputing reads three values, and
/// a value only one forward value reads (a normalised input, a cast) is recomputed from it. The
/// forward computes and stores these values anyway (docs/fusion.md, "What crosses steps");
/// saved, the backward does not compute them again at its start.
KILN_ENTRY std::vector<ir::NodePtr> saved_branch_points(std::vector<ir::NodePtr> needed,
                                                        const std::unordered_set<const ir::Node*>& forward,
                                                        const std::function<bool(const ir::Node&)>& kept);

/// Derives the backward of the traced results `outs` (lazy; those that require grad are
/// differentiated) towards every realized tensor they were computed from that requires grad.
/// `args` are the call's tensor arguments (to tell arguments from captured tensors).
KILN_ENTRY PendingBackward trace_backward(const std::vector<Tensor>& outs, const std::vector<const Tensor*>& args);

/// Captures the backward graphs once the forward has run: `saved` are the forward's values of
/// `pending.saved` (its extra outputs, from this first call), which become the graphs' leaves.
KILN_ENTRY std::shared_ptr<const CompiledBackward> capture_backward(PendingBackward& pending,
                                                                    const std::vector<Tensor>& saved,
                                                                    std::size_t saved_first,
                                                                    const std::vector<const Tensor*>& args);

/// Leaves a replay's result as the eager call leaves it when the function's own backward freed
/// its graph (PendingBackward::freed): requiring grad, a backward through it an error.
KILN_ENTRY void mark_graph_freed(Tensor& result);

/// Gives a replay's results their gradients: `results` are the flattened results of one call
/// (the saved values after the function's own), `args` its tensor arguments.
KILN_ENTRY void attach_backward(const std::shared_ptr<const CompiledBackward>& cb, std::vector<Tensor>& results,
                                const std::vector<const Tensor*>& args);

}  // namespace kiln::detail

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/compile/backward_graph_impl.hpp"
#endif
