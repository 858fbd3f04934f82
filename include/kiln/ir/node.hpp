#pragma once
// The lazy graph the front end builds: immutable nodes, each with a structural hash computed
// once at construction from its own attributes and its inputs' hashes (hash-consing), so that
// structurally equal subgraphs hash equal without a walk.
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/ir/op.hpp"

namespace kiln::ir {

/// Per-op attributes; which fields mean what is documented at each Op.
struct Attrs {
  double scalar = 0.0;       ///< Constant of floating dtype
  std::int64_t iscalar = 0;  ///< Constant of integer or bool dtype (exact beyond 2^53)
  std::vector<std::int64_t> ints;
  std::uint64_t seed = 0;  ///< Random

  friend bool operator==(const Attrs& a, const Attrs& b) {
    // Bitwise equality of scalar so that NaN constants compare equal and -0.0 != 0.0.
    return hash_double_bits(a.scalar) == hash_double_bits(b.scalar) && a.iscalar == b.iscalar && a.ints == b.ints &&
           a.seed == b.seed;
  }
  static std::uint64_t hash_double_bits(double d) {
    std::uint64_t u;
    std::memcpy(&u, &d, 8);
    return u;
  }
  std::uint64_t hash() const {
    std::uint64_t h = kiln::detail::hash_combine(hash_double_bits(scalar), static_cast<std::uint64_t>(iscalar));
    h = kiln::detail::hash_combine(h, seed);
    for (auto v : ints) h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(v));
    return kiln::detail::hash_combine(h, ints.size());
  }
};

/// An Attention node's attributes as named values (see Op::Attention): attrs.ints = {role,
/// causal, has_mask, dropout}, the last the bits of the dropout probability (0: none).
struct AttentionAttrs {
  AttentionRole role = AttentionRole::Out;
  bool causal = false, has_mask = false;
  double dropout_p = 0.0;

  static AttentionAttrs of(const Attrs& a) {
    AttentionAttrs r;
    r.role = static_cast<AttentionRole>(a.ints.at(0));
    r.causal = a.ints.at(1) != 0;
    r.has_mask = a.ints.at(2) != 0;
    if (a.ints.size() > 3) std::memcpy(&r.dropout_p, &a.ints[3], sizeof r.dropout_p);
    return r;
  }
  std::vector<std::int64_t> ints() const {
    std::int64_t bits = 0;
    std::memcpy(&bits, &dropout_p, sizeof bits);
    return {static_cast<std::int64_t>(role), causal ? 1 : 0, has_mask ? 1 : 0, bits};
  }
  bool has_dropout() const { return dropout_p != 0.0; }
  bool gradient() const { return role == AttentionRole::DQ || role == AttentionRole::DK || role == AttentionRole::DV; }
  /// Inputs of a node with these attributes: q, k, v, {out, dout, lse} for a gradient, the mask,
  /// the dropout's seed.
  std::size_t inputs() const { return (gradient() ? 6u : 3u) + (has_mask ? 1u : 0u) + (has_dropout() ? 1u : 0u); }
  /// Where the mask and the seed are among the inputs (-1 where absent).
  int mask_input() const { return has_mask ? (gradient() ? 6 : 3) : -1; }
  int seed_input() const { return has_dropout() ? static_cast<int>(inputs()) - 1 : -1; }
};

/// Where a realized node's values live: storage plus an element offset and element strides.
struct BufferView {
  StoragePtr storage;
  std::int64_t offset = 0;
  Strides strides;

  void* data() const { return static_cast<char*>(storage->data); }
};

struct Node;
using NodePtr = std::shared_ptr<Node>;

/// Autograd state of a leaf that requires grad (a tensor the user marked): the gradient that
/// backward passes accumulate into it.
struct GradLeaf {
  NodePtr grad;  ///< null until a backward reaches the leaf
  /// Where a fresh gradient is written (a row-major view of the leaf's shape and dtype, on its
  /// device), if set: a backward that finds `grad` null evaluates the gradient into this memory
  /// instead of new memory, and `grad` becomes a leaf over it. A fused optimizer gives each of
  /// its parameters a slice of one flat gradient buffer, so that every gradient of a step lies
  /// in one tensor it updates from (optim/optimizer.hpp). Setting `grad` to null keeps it.
  std::optional<BufferView> home;
  /// Called after each backward that accumulated into `grad`, with the leaf's node, in the
  /// order the backward reached the leaves (Tensor::register_post_accumulate_grad_hook), each
  /// under the id that removes it.
  std::vector<std::pair<std::uint64_t, std::function<void(const NodePtr& leaf)>>> post_accumulate_hooks;
  /// Where a backward evaluates this leaf's gradient: -1 (the default) with every other gradient,
  /// in one graph; a group g >= 0 in a graph of its own, after the groups below g and before the
  /// rest, with the hooks of its leaves run before the next group's graph is evaluated.
  /// DistributedDataParallel gives each bucket its own group, so that a bucket's reduction
  /// starts while the gradients of the next are computed (Tensor::backward).
  int evaluation_group = -1;
};

/// A composite's own gradient rule, attached to the node that is its result: a backward
/// applies `rule` (the result, its gradient -> one gradient per entry of `inputs`, null for
/// none) and continues at `inputs` instead of walking the composite's decomposition. For
/// composites whose decomposition is built for accurate values (piecewise, with rounding
/// steps or branches that overflow where they are not taken), not for differentiation.
struct CustomGradient {
  std::vector<NodePtr> inputs;
  std::function<std::vector<NodePtr>(const NodePtr& result, const NodePtr& grad)> rule;
  /// Values computed beside the result that the rule reads (an attention's row log-sum-exp):
  /// a compiled forward computes them with the result and keeps them for its backward.
  std::vector<NodePtr> companions;
};

namespace detail {
/// Whether nodes built on this thread record the gradient flow (kiln::NoGradGuard turns it off).
inline bool& grad_mode() {
  thread_local bool enabled = true;
  return enabled;
}
}  // namespace detail

/// One value of the lazy graph. Only `buffer` and the autograd state change after construction
/// (realizing a node also drops its inputs so that the subgraph's memory can go, unless
/// gradients flow through it: then the inputs are the tape, dropped when a backward has run).
struct Node {
  Op op;
  DType dtype;
  Device device;
  Shape shape;
  std::vector<NodePtr> inputs;
  Attrs attrs;
  std::uint64_t local_hash = 0;      ///< op, dtype, device, shape, attrs (and strides for inputs)
  std::uint64_t hash = 0;            ///< local_hash combined with the inputs' hashes
  std::uint32_t depth = 0;           ///< longest path from a leaf (realized inputs count as leaves)
  std::uint32_t count = 1;           ///< nodes in the unrealized subgraph (shared nodes counted per use, saturating)
  std::optional<BufferView> buffer;  ///< set once realized
  /// Autograd: gradients flow to this node's inputs (a floating node built, with grad mode on,
  /// from an input that requires grad) or it is a leaf the user marked (grad_leaf set).
  bool requires_grad = false;
  /// A backward without retain_graph has run through this node and dropped its inputs.
  bool graph_freed = false;
  std::shared_ptr<GradLeaf> grad_leaf;  ///< set on the leaves the user marked
  std::shared_ptr<const CustomGradient> custom_gradient;  ///< a composite's own rule, if it has one
  /// A stand-in leaf whose value is bound when the graph is rebuilt (a compiled backward's
  /// incoming gradient): shape ops on it stay nodes, never views of its (empty) storage.
  bool placeholder = false;
  /// Autograd: the memory of each input that was evaluated when this node was recorded, and its
  /// Storage::version then (what a backward reading it expects).
  std::vector<std::pair<const Storage*, std::uint64_t>> saved_versions;

  bool realized() const { return buffer.has_value(); }
  std::int64_t numel() const { return shape.numel(); }
};

/// Hash of a realized node seen as a leaf of a new graph: its layout, never its address.
inline std::uint64_t leaf_hash(const Node& n) {
  std::uint64_t h =
      kiln::detail::hash_combine(static_cast<std::uint64_t>(Op::Input) + 1000, static_cast<std::uint64_t>(n.dtype));
  h = kiln::detail::hash_combine(
      h, static_cast<std::uint64_t>(n.device.kind) * 131 + static_cast<std::uint64_t>(n.device.index));
  for (auto d : n.shape) h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(d));
  h = kiln::detail::hash_combine(h, n.shape.size());
  for (auto s : n.buffer->strides) h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(s));
  return h;
}

}  // namespace kiln::ir
