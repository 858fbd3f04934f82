#pragma once
// Evaluation: capture the lazy graph under the requested tensors, bind buffers, hand the graph
// to the selected executor, and turn the results into realized leaves.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/backend/entry.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/linkage.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln {

/// Which executor evaluates graphs (see set_backend).
using Backend = backend::Mode;

namespace detail {

/// Graphs deeper than this (or larger than kMaxLazyNodes) are evaluated as they are built,
/// so memory and compile time stay bounded (ArrayFire's rule).
inline constexpr std::uint32_t kMaxLazyDepth = 100;
inline constexpr std::uint32_t kMaxLazyNodes = 4096;

KILN_ENTRY Backend backend_from_env();

KILN_ENTRY Backend& backend_mode();

inline StoragePtr allocate(std::size_t bytes, Device device) { return backend::entry::allocate(bytes, device); }

/// Memory for the value of `n` (row-major). An impossible request is an OutOfMemoryError that
/// names the op, the shape, the dtype and the bytes, raised before anything is compiled.
KILN_ENTRY StoragePtr allocate_value(const ir::Node& n, const char* op);

/// Runs a captured graph with the executor `mode` selects.
KILN_ENTRY void run_graph_with(const ir::Graph& g, const backend::RunArgs& args, Backend mode);

/// Runs a captured graph with the executor set_backend / KILN_BACKEND selects.
inline void run_graph(const ir::Graph& g, const backend::RunArgs& args) { run_graph_with(g, args, backend_mode()); }

/// How the selected executor would run `g` (its kernels), as text.
inline std::string explain_graph(const ir::Graph& g) { return backend::entry::explain(g, backend_mode()); }

/// Drops every compiled kernel and plan the executors keep in memory.
inline void clear_kernel_caches() { backend::entry::clear_caches(); }

KILN_ENTRY const void* leaf_pointer(const ir::Node& n);

KILN_ENTRY void evaluate_group(const std::vector<ir::NodePtr>& roots, Device device);

/// Storages the graphs evaluated now may overwrite once they have read them for the last time
/// (ir::Graph::donated): set by a backward for its one evaluation (DonationScope), empty else.
KILN_ENTRY std::vector<const Storage*>& donated_storages();

/// Marks the leaves of `c` whose memory donated_storages() names, each the only leaf of its
/// storage, as donated (and rehashes the graph).
KILN_ENTRY void mark_donated(ir::Captured& c);

/// Sets donated_storages() for its lifetime.
class DonationScope {
 public:
  explicit DonationScope(std::vector<const Storage*> storages) { donated_storages() = std::move(storages); }
  ~DonationScope() { donated_storages().clear(); }
  DonationScope(const DonationScope&) = delete;
  DonationScope& operator=(const DonationScope&) = delete;
};

KILN_ENTRY void evaluate(const std::vector<ir::NodePtr>& roots);

KILN_ENTRY ir::NodePtr maybe_eval_big(ir::NodePtr node);

/// True if some element is reachable through two different indices (a broadcast view). A view
/// with no elements has none to share, whatever its strides.
KILN_ENTRY bool has_self_overlap(const Shape& shape, const Strides& strides);

/// Evaluates the nodes built on the memory of `storages` that are still lazy (Storage::
/// lazy_readers), before that memory is written: a lazy tensor reads the values it was built
/// on, as PyTorch's eager ops compute them then. `values` are the graphs the write computes: their
/// roots, and the nodes under them that nothing outside them holds, are left to the write.
KILN_ENTRY void evaluate_pending_reads(const std::vector<const Storage*>& storages,
                                       const std::vector<ir::NodePtr>& values);

/// Writes `value` (already cast and broadcast to destination's dtype and shape) into the
/// realized `destination`.
KILN_ENTRY void evaluate_into(const ir::NodePtr& value, const ir::NodePtr& destination);

/// The bytes [lo, hi) of its storage that a realized node's view addresses (lo == hi: none).
struct ViewSpan {
  const Storage* storage = nullptr;
  std::int64_t lo = 0, hi = 0;
};
KILN_ENTRY ViewSpan view_span(const ir::Node& n);
inline bool spans_overlap(const ViewSpan& a, const ViewSpan& b) {
  return a.storage == b.storage && a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}
/// Whether two realized nodes are the same elements in the same order (one view).
KILN_ENTRY bool same_view(const ir::Node& a, const ir::Node& b);

/// Writes each `values[i]` (of `destinations[i]`'s shape and dtype, on its device) into the
/// realized `destinations[i]`: one graph per device, so that the writes fuse (an optimizer's
/// update of parameters and state, gradients accumulated in place). The destinations must not
/// overlap. A value may read a destination's memory in place when that cannot see a written
/// element: the leaf is exactly the destination's view and everything computed from it is
/// pointwise (it is read only at the index being written), and either only that destination's
/// value reads it, or the whole graph is pointwise and every value reading it has its shape and
/// includes that destination's (then one fused kernel reads each element of all of them before
/// it writes that element). Otherwise the values are computed into new memory first, then copied.
KILN_ENTRY void evaluate_into_many(const std::vector<ir::NodePtr>& values,
                                   const std::vector<ir::NodePtr>& destinations);

/// A new row-major copy of a realized node on its own device.
KILN_ENTRY ir::NodePtr contiguous_copy(const ir::NodePtr& node);

/// Copies an evaluated node's elements, row-major, into `out` on the host.
KILN_ENTRY void copy_to_host_contiguous(const ir::NodePtr& node, void* out);

}  // namespace detail

/// Selects the executor for every later evaluation: Backend::Eager runs graphs op by op with
/// the reference executor (also `KILN_BACKEND=eager`); Backend::Auto (default) uses fused,
/// compiled kernels when a compiler is available.
inline void set_backend(Backend b) { detail::backend_mode() = b; }
/// The executor selected by set_backend or KILN_BACKEND.
inline Backend get_backend() { return detail::backend_mode(); }

/// Evaluates several tensors in one graph (shared inputs are read once, shared work done once).
template <class... Ts>
requires(std::is_same_v<std::remove_cvref_t<Ts>, Tensor>&&...) void eval(Ts&&... tensors) {
  if (!detail::deferring_eval()) detail::evaluate({tensors.node()...});
}

/// Evaluates every tensor of the list in one graph.
KILN_ENTRY void eval(const std::vector<Tensor>& tensors);

// ---- Tensor members that need the whole front end ------------------------------------------

template <class T>
std::vector<T> Tensor::to_vector(std::source_location where) const {
  detail::before_data_read("to_vector()", where);
  return read_host<T>();
}

template <class T>
std::vector<T> Tensor::read_host() const {
  Tensor src = dtype() == dtype_v<T> ? *this : to(dtype_v<T>);
  if (!src.node()->realized()) detail::evaluate({src.node()});
  std::vector<T> out(static_cast<std::size_t>(src.numel()));
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<unsigned char> bytes(out.size());
    detail::copy_to_host_contiguous(src.node(), bytes.data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = bytes[i] != 0;
  } else {
    detail::copy_to_host_contiguous(src.node(), out.data());
  }
  return out;
}

template <class T>
T Tensor::item(std::source_location where) const {
  if (numel() != 1)
    throw ShapeError("item: a tensor with " + std::to_string(numel()) + " elements (shape " + shape().str() +
                     ") cannot be converted to a scalar");
  detail::before_data_read("item()", where);
  return read_host<T>()[0];
}

template <class Derived>
Tensor Expr<Derived>::eval() const {
  Tensor t(derived());
  t.eval();
  return t;
}
template <class Derived>
template <class T>
std::vector<T> Expr<Derived>::to_vector(std::source_location where) const {
  return Tensor(derived()).template to_vector<T>(where);
}
template <class Derived>
template <class T>
T Expr<Derived>::item(std::source_location where) const {
  return Tensor(derived()).template item<T>(where);
}
template <class Derived>
Tensor Expr<Derived>::to(DType dtype) const {
  return Tensor(derived()).to(dtype);
}
template <class Derived>
Tensor Expr<Derived>::to(Device device) const {
  return Tensor(derived()).to(device);
}

namespace detail {
template <class E>
bool typed_assign(const E& value, const ir::NodePtr& dest);

KILN_ENTRY bool broadcasts_to(const SmallShape& from, const Shape& to);
}  // namespace detail

namespace detail {
/// A destination computed from tensors that require grad (a slice of a marked leaf, say) is a
/// node of its own while grad mode records, not a view of the leaf's storage: a write would land
/// in a fresh buffer, not in the leaf, and would change a value the backward reads. An error,
/// as PyTorch's for in-place writes through such views.
KILN_ENTRY void check_assign_destination(const Tensor& destination);
}  // namespace detail

namespace detail {
/// Evaluates the destination of a write (a lazy view of a lazy tensor, as slice(x, ...) of a
/// lazy x: that tensor, then the view of its memory, as PyTorch's view shares it; anything else:
/// into new memory) and then the lazy tensors built on the memory it is about to write.
KILN_ENTRY void prepare_write(const ir::NodePtr& destination, const std::vector<ir::NodePtr>& values);
}  // namespace detail

template <class E>
requires TensorLike<E> Tensor& Tensor::assign(const E& value) {
  checked();
  detail::check_assign_destination(*this);
  // Writing into existing memory is a side effect a compiled replay could not repeat.
  detail::before_data_read("assign()", std::source_location::current());
  detail::prepare_write(node_, {});
  return assign_value(value);
}

inline Tensor& Tensor::assign(Tensor&& value) {
  checked();
  detail::check_assign_destination(*this);
  detail::before_data_read("assign()", std::source_location::current());
  if (value.defined() && value.node().use_count() == 1) {
    detail::prepare_write(node_, {value.node()});
  } else {
    detail::prepare_write(node_, {});
  }
  return assign_value(value);
}

template <class E>
Tensor& Tensor::assign_value(const E& value) {
  // Typed expressions over evaluated tensors: the cached fast path (no graph building).
  if constexpr (!std::is_base_of_v<Tensor, E>) {
    if (!detail::active_trace && node_ && node_->realized() && value.out_device == device() &&
        detail::broadcasts_to(value.out_shape, shape()) && !detail::has_self_overlap(shape(), node_->buffer->strides) &&
        detail::typed_assign(value, node_))
      return *this;
  }
  Tensor v = detail::to_tensor(value.derived());
  detail::check_same_device(device(), v.device(), "assign");
  if (detail::has_self_overlap(shape(), node_->buffer->strides))
    throw ShapeError("assign: destination " + describe() + " has elements that share memory (a broadcast view)");
  const Shape& s = shape();
  bool ok = v.dim() <= dim();
  for (std::int64_t i = 0; ok && i < v.dim(); ++i) {
    std::int64_t d = v.shape()[v.dim() - 1 - i];
    ok = d == s[s.size() - 1 - i] || d == 1;
  }
  if (!ok)
    throw ShapeError("assign: value of shape " + v.shape().str() + " cannot be broadcast to destination shape " +
                     s.str());
  ir::NodePtr n = decomp::expand(ir::cast(v.node(), dtype()), s);
  detail::evaluate_into(n, node_);
  return *this;
}

template <class S>
requires Scalar<S> Tensor& Tensor::assign(S value) {
  checked();
  detail::check_assign_destination(*this);
  detail::before_data_read("assign()", std::source_location::current());
  detail::prepare_write(node_, {});
  // A broadcast view (expand): every element of a stride-0 dim is the same memory, so the fill
  // writes each distinct element once, through the view with those dims of size 1 (PyTorch's
  // fill_ and zero_ accept expanded views too).
  ir::NodePtr target = node_;
  if (detail::has_self_overlap(shape(), node_->buffer->strides)) {
    Shape distinct = shape();
    for (std::size_t d = 0; d < distinct.size(); ++d)
      if (node_->buffer->strides[d] == 0) distinct[d] = 1;
    target = ir::input(*node_->buffer, distinct, dtype(), device());
  }
  const Shape& s = target->shape;
  // A fill with a new number reuses the kernel of the last (the number is an argument).
  ir::NodePtr n = detail::number_is_argument(ScalarExpr<S>(value), device())
                      ? detail::number_leaf(value, dtype(), s, device())
                  : std::is_integral_v<S>
                      ? ir::constant_int(static_cast<std::int64_t>(value), dtype(), s, device())
                      : ir::constant(static_cast<double>(value), dtype(), s, device());
  detail::evaluate_into(n, target);
  return *this;
}

}  // namespace kiln

// The typed fast path of assign() (defined after everything it uses).
#include "kiln/tensor/typed_eval.hpp"

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/eval_impl.hpp"
#endif
