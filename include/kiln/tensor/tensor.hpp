#pragma once
// Tensor: a handle to one node of the lazy graph. Copying a Tensor copies the handle (as in
// libtorch); `assign` writes into the existing storage.
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/ir/builder.hpp"

namespace kiln {

class Tensor;
struct ValuesIndices;

/// CRTP base of every tensor expression (Tensor itself and the typed expression nodes). An
/// expression has the read side of Tensor's API: `auto e = x * 2.0f + y; e.to_vector<float>()`
/// evaluates it as `Tensor(e)` would (the same graph, the same cached kernels).
template <class Derived>
struct Expr {
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
  /// Shape, dtype and device of the expression's result (known without evaluating).
  Shape shape() const { return derived().out_shape.to_shape(); }
  DType dtype() const { return derived().out_dtype; }
  Device device() const { return derived().out_device; }
  /// Number of dimensions and of elements of the result (known without evaluating).
  std::int64_t dim() const { return derived().out_shape.rank; }
  std::int64_t numel() const { return shape().numel(); }
  /// Size of dimension `d` (negative counts from the end).
  std::int64_t size(std::int64_t d) const {
    const Shape s = shape();
    return s[normalize_axis(d, dim(), "size", s)];
  }
  /// The result as an evaluated Tensor (as Eigen's `.eval()`; deferred inside kiln::compile).
  Tensor eval() const;
  /// The elements in row-major order, converted to T (evaluates, copies to the host).
  template <class T>
  std::vector<T> to_vector(std::source_location where = std::source_location::current()) const;
  /// The single element, converted to T (evaluates). ShapeError unless numel() == 1.
  template <class T>
  T item(std::source_location where = std::source_location::current()) const;
  /// The result converted to `dtype` (lazy), or copied to `device`.
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  /// Shape, dtype, device and values, as `std::cout << tensor` prints them (evaluates).
  std::string str() const;
  /// The matrix product with `other`, as kiln::matmul (torch.Tensor.matmul).
  Tensor matmul(const Tensor& other) const;

  // ---- libtorch's method forms (defined in tensor/methods.hpp): each is the free function of
  // its name applied to this expression, `x.sum({1}, true)` as `sum(x, {1}, true)` ----
  /// Shape ops: reshape (view is the same: kiln's reshape needs no contiguous input), flatten
  /// (dims start_dim..end_dim into one), squeeze, unsqueeze, permute, transpose, t (the last
  /// two dims of a matrix swapped, as torch's for rank <= 2), expand (broadcast_to), flip,
  /// repeat, chunk, split, narrow, select, unbind.
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;
  Tensor flatten(std::int64_t start_dim = 0, std::int64_t end_dim = -1) const;
  Tensor unflatten(std::int64_t dim, const std::vector<std::int64_t>& sizes) const;
  Tensor squeeze() const;
  Tensor squeeze(std::int64_t dim) const;
  Tensor unsqueeze(std::int64_t dim) const;
  Tensor permute(const std::vector<std::int64_t>& dims) const;
  Tensor transpose(std::int64_t dim0, std::int64_t dim1) const;
  Tensor t() const;
  Tensor expand(const Shape& shape) const;
  Tensor flip(const std::vector<std::int64_t>& dims) const;
  Tensor repeat(const std::vector<std::int64_t>& repeats) const;
  std::vector<Tensor> chunk(std::int64_t chunks, std::int64_t dim = 0) const;
  std::vector<Tensor> split(std::int64_t split_size, std::int64_t dim = 0) const;
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  Tensor select(std::int64_t dim, std::int64_t index) const;
  std::vector<Tensor> unbind(std::int64_t dim = 0) const;
  /// Reductions (axes {} = all) and the row functions.
  Tensor sum(const Axes& axes = {}, bool keepdim = false) const;
  Tensor mean(const Axes& axes = {}, bool keepdim = false) const;
  Tensor prod(const Axes& axes = {}, bool keepdim = false) const;
  Tensor amax(const Axes& axes = {}, bool keepdim = false) const;
  Tensor amin(const Axes& axes = {}, bool keepdim = false) const;
  Tensor all(const Axes& axes = {}, bool keepdim = false) const;
  Tensor any(const Axes& axes = {}, bool keepdim = false) const;
  Tensor logsumexp(const Axes& axes, bool keepdim = false) const;
  Tensor var(const Axes& axes = {}, bool keepdim = false, double correction = 1.0) const;
  Tensor max() const;
  ValuesIndices max(std::int64_t dim, bool keepdim = false) const;
  Tensor min() const;
  ValuesIndices min(std::int64_t dim, bool keepdim = false) const;
  Tensor argmax(const Axes& axis = {}, bool keepdim = false) const;
  Tensor argmin(const Axes& axis = {}, bool keepdim = false) const;
  Tensor softmax(std::int64_t dim) const;
  Tensor log_softmax(std::int64_t dim) const;
  Tensor cumsum(std::int64_t dim) const;
  Tensor cumprod(std::int64_t dim) const;
  std::tuple<Tensor, Tensor> topk(std::int64_t k, std::int64_t dim = -1, bool largest = true, bool sorted = true) const;
  std::tuple<Tensor, Tensor> sort(std::int64_t dim = -1, bool descending = false) const;
  /// Elementwise functions.
  Tensor abs() const;
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor floor() const;
  Tensor ceil() const;
  Tensor round() const;
  Tensor square() const;
  Tensor reciprocal() const;
  Tensor pow(double exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor clamp(double min, double max) const;
  /// Indexing.
  Tensor index_select(std::int64_t dim, const Tensor& index) const;
  Tensor gather(std::int64_t dim, const Tensor& index) const;
  Tensor masked_fill(const Tensor& mask, double value) const;
  /// torch's method forms of the common composites (tensor/composites.hpp, tensor/linalg.hpp).
  Tensor norm(double p = 2.0, const Axes& dim = {}, bool keepdim = false) const;
  Tensor count_nonzero(const Axes& axes = {}) const;
  Tensor clamp_min(double min) const;
  Tensor clamp_max(double max) const;
  Tensor nan_to_num(double nan = 0.0) const;
  Tensor lerp(const Tensor& end, double weight) const;
  Tensor lerp(const Tensor& end, const Tensor& weight) const;
  Tensor logit() const;
  Tensor median() const;
  ValuesIndices median(std::int64_t dim, bool keepdim = false) const;
  Tensor nonzero() const;
  Tensor masked_select(const Tensor& mask) const;
  Tensor diag(std::int64_t diagonal = 0) const;
  Tensor diagonal(std::int64_t offset = 0, std::int64_t dim1 = 0, std::int64_t dim2 = 1) const;
  Tensor trace() const;
  Tensor dot(const Tensor& other) const;
  Tensor mv(const Tensor& vec) const;
  Tensor outer(const Tensor& other) const;
  Tensor movedim(std::int64_t source, std::int64_t destination) const;
  Tensor swapaxes(std::int64_t dim0, std::int64_t dim1) const;
  Tensor erfc() const;
  Tensor lgamma() const;
  Tensor digamma() const;
  Tensor erfinv() const;
  Tensor signbit() const;
  Tensor copysign(const Tensor& other) const;
  Tensor floor_divide(const Tensor& other) const;
  Tensor std(const Axes& axes = {}, bool keepdim = false, double correction = 1.0) const;
  Tensor nanmedian() const;
  ValuesIndices nanmedian(std::int64_t dim, bool keepdim = false) const;
  ValuesIndices kthvalue(std::int64_t k, std::int64_t dim = -1, bool keepdim = false) const;
  Tensor diff(std::int64_t n = 1, std::int64_t dim = -1) const;
  /// Shaped or typed like `other`: expand(other.shape()), view/reshape(other.shape()), to(other.dtype()).
  Tensor expand_as(const Tensor& other) const;
  Tensor view_as(const Tensor& other) const;
  Tensor reshape_as(const Tensor& other) const;
  Tensor type_as(const Tensor& other) const;
  /// A copy with storage of its own (torch's clone; kiln::clone).
  Tensor clone() const;
  /// The out-of-place writes (tensor/composites.hpp): index_put, index_fill, masked_scatter.
  Tensor index_put(const std::vector<Tensor>& indices, const Tensor& values, bool accumulate = false) const;
  Tensor index_fill(std::int64_t dim, const Tensor& index, double value) const;
  Tensor masked_scatter(const Tensor& mask, const Tensor& source) const;
  /// Gradients of the expression's value, as Tensor's (tensor/autograd.hpp).
  bool requires_grad() const;
  void backward(const Tensor& gradient, bool retain_graph = false) const;
  void backward() const;
  Tensor detach() const;

  /// An expression is a value, not storage: write into a Tensor (`t.assign(e)`) instead.
  template <class V>
  void assign(const V&) const {
    static_assert(sizeof(V) == 0,
                  "kiln: an expression has no storage to assign to; assign into a Tensor: t.assign(expr)");
  }
  /// Raw data of an expression does not exist before it is evaluated.
  template <class T>
  T* data_ptr() const {
    static_assert(sizeof(T) == 0,
                  "kiln: an expression has no data yet; evaluate it first: Tensor t = expr.eval(); t.data_ptr<T>()");
    return nullptr;
  }
};

/// True for Tensor (and types derived from it, such as ValuesIndices) and for typed expressions.
template <class E>
concept TensorLike = std::is_base_of_v<Expr<std::remove_cvref_t<E>>, std::remove_cvref_t<E>> ||
                     std::is_base_of_v<Tensor, std::remove_cvref_t<E>>;

namespace detail {
/// The type an expression holds operand `A` as: Tensor for Tensor and the types derived from it,
/// else the expression itself.
template <class A>
using expr_t = std::conditional_t<std::is_base_of_v<Tensor, std::remove_cvref_t<A>>, Tensor, std::remove_cvref_t<A>>;
}  // namespace detail

/// A C++ arithmetic value usable as a "wrapped number" operand.
template <class T>
concept Scalar = std::is_arithmetic_v<std::remove_cvref_t<T>>;

namespace detail {

/// Receives the reads of tensor data that happen while kiln::compile traces a function (each
/// one is a graph break there).
struct TraceHook {
  virtual ~TraceHook() = default;
  virtual void on_data_read(const char* what, std::source_location where) = 0;
};
inline thread_local TraceHook* active_trace = nullptr;
inline void before_data_read(const char* what, std::source_location where) {
  if (active_trace) active_trace->on_data_read(what, where);
}
/// While tracing, evaluation is deferred to the end of the trace (or to a data read).
inline bool deferring_eval() { return active_trace != nullptr; }
/// Evaluation happens at once while it lives, even inside a trace (the work after a graph break).
class SuspendTrace {
 public:
  SuspendTrace() : saved_(active_trace) { active_trace = nullptr; }
  ~SuspendTrace() { active_trace = saved_; }
  SuspendTrace(const SuspendTrace&) = delete;
  SuspendTrace& operator=(const SuspendTrace&) = delete;

 private:
  TraceHook* saved_;
};

void evaluate(const std::vector<ir::NodePtr>& roots);
void evaluate_into(const ir::NodePtr& value, const ir::NodePtr& destination);
ir::NodePtr maybe_eval_big(ir::NodePtr node);
void copy_to_host_contiguous(const ir::NodePtr& node, void* out);
}  // namespace detail

/// An n-dimensional array on a device, lazily computed. Default-constructed tensors are
/// undefined (e.g. an absent layer_norm weight).
class Tensor : public Expr<Tensor> {
 public:
  Tensor() = default;
  /// Wraps a graph node (mainly for kiln's own stages).
  explicit Tensor(ir::NodePtr node) : node_(detail::maybe_eval_big(std::move(node))) {}
  /// Converts a typed expression into a lazy tensor (nothing runs).
  template <class E>
  requires(TensorLike<E> && !std::is_base_of_v<Tensor, std::remove_cvref_t<E>>) Tensor(const E& expr)
      : Tensor(expr.build()) {}  // NOLINT: implicit, like `Tensor t = x + y;`

  /// False for a default-constructed tensor.
  bool defined() const { return node_ != nullptr; }
  const Shape& shape() const { return checked().shape; }
  /// Size of dimension `d` (negative counts from the end).
  std::int64_t size(std::int64_t d) const { return shape()[normalize_axis(d, dim(), "size", shape())]; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t numel() const { return shape().numel(); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().device; }

  /// Evaluates this tensor now (no-op if already evaluated; deferred inside kiln::compile).
  Tensor& eval() {
    if (!checked().realized() && !detail::deferring_eval()) detail::evaluate({node_});
    return *this;
  }
  const Tensor& eval() const {
    if (!checked().realized() && !detail::deferring_eval()) detail::evaluate({node_});
    return *this;
  }
  bool is_evaluated() const { return checked().realized(); }

  /// Element strides (a lazy tensor will be evaluated row-major, so it reports those).
  Strides strides() const { return checked().realized() ? node_->buffer->strides : contiguous_strides(node_->shape); }
  /// True when the layout is row-major dense.
  bool is_contiguous() const { return kiln::is_contiguous(shape(), strides()); }
  /// This tensor if is_contiguous(), else a row-major copy (torch.Tensor.contiguous; defined
  /// in tensor/creation.hpp).
  Tensor contiguous() const;

  /// Pointer to the first element of the evaluated tensor on its device (evaluates).
  /// T must match dtype(); use strides() to address elements.
  template <class T>
  T* data_ptr(std::source_location where = std::source_location::current()) const {
    if (dtype_v<T> != dtype())
      throw DTypeError(std::string("data_ptr: requested ") + dtype_name(dtype_v<T>) + " from a " + dtype_name(dtype()) +
                       " tensor of shape " + shape().str());
    detail::before_data_read("data_ptr()", where);
    if (!node_->realized()) detail::evaluate({node_});
    return static_cast<T*>(node_->buffer->data()) + node_->buffer->offset;
  }

  /// All elements in row-major order, converted to T as `to(dtype_v<T>)` would (evaluates,
  /// copies to the host).
  template <class T>
  std::vector<T> to_vector(std::source_location where = std::source_location::current()) const;

  /// The single element, converted to T (evaluates). ShapeError unless numel() == 1.
  template <class T>
  T item(std::source_location where = std::source_location::current()) const;

  /// This tensor converted to `dtype` (lazy; PyTorch's casting rules).
  Tensor to(DType dtype) const;
  /// This tensor's values on `device` (copies).
  Tensor to(Device device) const;

  /// Evaluates `value` into this tensor's storage (broadcast and cast to this tensor's shape
  /// and dtype). Writes through views into user memory (`from_blob`).
  /// Lazy tensors built on this memory earlier are evaluated first (they keep the values they
  /// were built on, as PyTorch's eager results do); a lazy view (slice, transpose, ...) of a lazy
  /// tensor writes that tensor, evaluated first, as PyTorch's view would.
  template <class E>
  requires TensorLike<E> Tensor& assign(const E& value);
  /// The same for a value no one else holds (a temporary): when it reads this memory, the write
  /// itself computes it (in place, in one kernel, where that is safe) rather than evaluating it
  /// first.
  Tensor& assign(Tensor&& value);
  template <class S>
  requires Scalar<S> Tensor& assign(S value);

  /// libtorch's in-place forms (tensor/methods.hpp), each an assign() into this storage:
  /// zero_, fill_, copy_ (a broadcast, cast copy of src), and add_/sub_ (of alpha times other),
  /// mul_, div_. Subject to assign's rules (under gradient recording, a leaf that requires grad
  /// is not written; use NoGradGuard for hand-written updates).
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);
  /// As PyTorch's, the result type (torch.result_type of this and other, a number being a
  /// wrapped number of its C++ type) must cast to this tensor's dtype within its category: a
  /// floating result into an integer tensor, or anything but bool into a bool tensor, is a
  /// DTypeError (`i32.add_(1)` is fine, `i32.add_(0.5)` is not). An alpha that is not an integer
  /// is a DTypeError for an integer result.
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  template <class S>
  requires Scalar<S> Tensor& add_(S other);
  Tensor& sub_(const Tensor& other, double alpha = 1.0);
  template <class S>
  requires Scalar<S> Tensor& sub_(S other);
  Tensor& mul_(const Tensor& other);
  template <class S>
  requires Scalar<S> Tensor& mul_(S other);
  Tensor& div_(const Tensor& other);
  template <class S>
  requires Scalar<S> Tensor& div_(S other);
  /// More of libtorch's in-place forms, each the function of its name assigned into this
  /// storage under add_'s dtype rule (`w.clamp_(-1, 1)`, `m.mul_(b1).add_(g, 1 - b1)`,
  /// `v.addcmul_(g, g, 1 - b2)`, `x.masked_fill_(mask, 0)`, `x.index_put_({i}, v)`).
  Tensor& masked_fill_(const Tensor& mask, double value);
  Tensor& clamp_(double min, double max);
  Tensor& clamp_min_(double min);
  Tensor& clamp_max_(double max);
  Tensor& neg_();
  Tensor& abs_();
  Tensor& exp_();
  Tensor& log_();
  Tensor& sqrt_();
  Tensor& sigmoid_();
  Tensor& tanh_();
  Tensor& relu_();
  Tensor& pow_(double exponent);
  Tensor& lerp_(const Tensor& end, double weight);
  Tensor& addcmul_(const Tensor& tensor1, const Tensor& tensor2, double value = 1.0);
  Tensor& addcdiv_(const Tensor& tensor1, const Tensor& tensor2, double value = 1.0);
  Tensor& scatter_(std::int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& scatter_add_(std::int64_t dim, const Tensor& index, const Tensor& src);
  Tensor& index_add_(std::int64_t dim, const Tensor& index, const Tensor& source, double alpha = 1.0);
  Tensor& index_copy_(std::int64_t dim, const Tensor& index, const Tensor& source);
  Tensor& index_fill_(std::int64_t dim, const Tensor& index, double value);
  Tensor& masked_scatter_(const Tensor& mask, const Tensor& source);
  Tensor& index_put_(const std::vector<Tensor>& indices, const Tensor& values, bool accumulate = false);

  // ---- gradients (tensor/autograd.hpp; libtorch's names and PyTorch's semantics) ----
  /// Marks this tensor as a leaf whose gradient backward() accumulates into grad() (floating
  /// dtypes only; `false` stops recording on a leaf). Returns *this.
  Tensor& requires_grad_(bool requires_grad = true);
  /// Whether gradients flow to this tensor (a marked leaf, or computed from one with grad mode on).
  bool requires_grad() const;
  /// The gradient accumulated by backward passes: an undefined Tensor until one reaches this leaf.
  Tensor grad() const;
  /// Accumulates d(this)/d(leaf) into every leaf's grad(), weighted by `gradient` (of this
  /// tensor's shape; omitted: 1, for a single-element tensor only). Without `retain_graph`, the
  /// recorded graph is freed and a second backward through it is an AutogradError. Inside a
  /// function kiln::compile traces it is a graph break (its effect, the leaves' grad(), is not
  /// a result of the graph): the function then runs on every call.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false,
                std::source_location where = std::source_location::current()) const;
  /// Sets grad() to zeros in place (nothing if it is undefined). Returns *this.
  Tensor& zero_grad_();
  /// Calls `hook(*this)` after every backward that accumulates into this leaf's grad(), once
  /// the gradient is in grad() (torch's register_post_accumulate_grad_hook); leaves are called
  /// in the order the backward reaches them. Returns the id that removes it. AutogradError
  /// unless this is a leaf that requires grad.
  std::uint64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook);
  /// Removes the hook registered under `id` (nothing if there is none).
  void remove_post_accumulate_grad_hook(std::uint64_t id);
  /// The same values, outside the recorded graph (no gradient flows through the result).
  Tensor detach() const;
  /// True for tensors that need no grad and for the leaves the user marked.
  bool is_leaf() const;

  /// The graph node this handle points to.
  const ir::NodePtr& node() const { return node_; }
  /// The node, for expression building (a Tensor is a leaf of typed expressions).
  ir::NodePtr build() const { return node_; }

  /// Values, dtype, shape and device as PyTorch's repr prints them: "tensor([1., 2.],
  /// dtype=float32, shape=[2], device=cpu)", the middle elided when large (evaluates; see
  /// print.hpp). `std::cout << t` prints the same.
  std::string str() const;
  /// "Tensor(float32[2, 3], cpu, lazy)": what the handle is, without evaluating.
  std::string describe() const {
    if (!node_) return "Tensor(undefined)";
    return std::string("Tensor(") + dtype_name(node_->dtype) + node_->shape.str() + ", " + node_->device.str() +
           (node_->realized() ? ")" : ", lazy)");
  }

 private:
  template <class E>
  Tensor& assign_value(const E& value);
  template <class T>
  std::vector<T> read_host() const;
  const ir::Node& checked() const {
    if (!node_) throw Error("operation on an undefined Tensor (default-constructed)");
    return *node_;
  }
  ir::NodePtr node_;
};

}  // namespace kiln
