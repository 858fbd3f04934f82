#pragma once
// Tensor creation: from host data, over user memory, constants, ranges and random numbers.
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln {

namespace detail {
/// Negative sizes and shapes whose element or byte count overflows int64 are ShapeErrors.
inline void check_creation_shape(const Shape& shape, const char* op, DType dtype) {
  checked_numel(shape, op, itemsize(dtype));
}
}  // namespace detail

/// A tensor holding a copy of `data` (row-major) with `shape`.
template <class T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape, Device device = Device::cpu()) {
  detail::check_creation_shape(shape, "from_vector", dtype_v<T>);
  if (static_cast<std::int64_t>(data.size()) != shape.numel())
    throw ShapeError("from_vector: " + std::to_string(data.size()) + " values do not fill shape " + shape.str() + " (" +
                     std::to_string(shape.numel()) + " elements)");
  constexpr DType dt = dtype_v<T>;
  StoragePtr st = runtime::allocate_host(data.size() * sizeof(T));
  if constexpr (std::is_same_v<T, bool>) {
    auto* p = static_cast<unsigned char*>(st->data);
    for (std::size_t i = 0; i < data.size(); ++i) p[i] = data[i] ? 1 : 0;
  } else if (!data.empty()) {
    std::memcpy(st->data, data.data(), data.size() * sizeof(T));
  }
  Tensor t(ir::input(ir::BufferView{st, 0, contiguous_strides(shape)}, shape, dt, Device::cpu()));
  return device.is_cpu() ? t : t.to(device);
}

/// A tensor viewing memory the caller owns (no copy). Results assigned to it land in that
/// memory; the memory must outlive every use of the tensor. `strides` default to row-major.
/// `device` is where the memory is: host memory is a CPU tensor, a CUDA device pointer a
/// tensor of that GPU (as torch::from_blob). A DeviceError when the driver says the memory is
/// elsewhere: host memory CUDA does not know given as a GPU's, device memory given as another
/// GPU's or as the CPU's (checked once kiln has used a GPU).
template <class T>
Tensor from_blob(T* data, const Shape& shape, Device device = Device::cpu(), Strides strides = {}) {
  detail::check_creation_shape(shape, "from_blob", dtype_v<std::remove_const_t<T>>);
  if (data == nullptr && shape.numel() > 0)
    throw ValueError("from_blob: null data pointer for a " + std::string(dtype_name(dtype_v<std::remove_const_t<T>>)) +
                     shape.str() + " tensor (" + std::to_string(shape.numel() * static_cast<std::int64_t>(sizeof(T))) +
                     " bytes)");
  if (strides.empty()) strides = contiguous_strides(shape);
  if (strides.size() != shape.size())
    throw ShapeError("from_blob: " + std::to_string(strides.size()) + " strides for shape " + shape.str());
  std::int64_t extent = 0;
  bool overflow = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (strides[i] < 0)
      throw ShapeError("from_blob: negative strides are not supported, got strides for shape " + shape.str());
    std::int64_t span = 0;
    if (shape[i] > 0)
      overflow |=
          __builtin_mul_overflow(shape[i] - 1, strides[i], &span) || __builtin_add_overflow(extent, span, &extent);
  }
  if (overflow || (shape.numel() > 0 && extent >= INT64_MAX / static_cast<std::int64_t>(sizeof(T))))
    throw ShapeError("from_blob: shape " + shape.str() + " with its strides addresses more memory than int64 counts");
  if (shape.numel() > 0) {
    std::string why;
    try {
      why = backend::entry::memory_mismatch(data, device);
    } catch (const DeviceError& e) {  // CUDA unavailable, or no such GPU
      throw DeviceError("from_blob: " + std::string(e.what()));
    }
    if (!why.empty())
      throw DeviceError("from_blob: the memory of a " + std::string(dtype_name(dtype_v<std::remove_const_t<T>>)) +
                        shape.str() + " tensor on " + device.str() + " is " + why);
  }
  auto st = std::make_shared<Storage>();
  st->data = const_cast<std::remove_const_t<T>*>(data);
  st->bytes = shape.numel() == 0 ? 0 : static_cast<std::size_t>(extent + 1) * sizeof(T);
  st->device = device;
  return Tensor(ir::input(ir::BufferView{st, 0, std::move(strides)}, shape, dtype_v<std::remove_const_t<T>>, device));
}

/// A tensor of `shape` filled with `value` (lazy: fused into its consumers).
namespace detail {
/// `full` under the name the user called (errors name zeros and ones as such).
KILN_ENTRY Tensor filled(const Shape& shape, double value, DType dtype, Device device, const char* op);
}  // namespace detail
/// A tensor of `shape` holding `value` in `dtype`.
inline Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu()) {
  return detail::filled(shape, value, dtype, device, "full");
}
/// The dtype from the value, as torch.full: bool for a bool, int64 for an integer, the default
/// float (f32) for a floating-point number (`full({2}, 3)` is int64, `full({2}, 3.0)` float32).
template <class V>
requires std::is_arithmetic_v<V> Tensor full(const Shape& shape, V value) {
  constexpr DType dtype = std::is_same_v<V, bool> ? DType::Bool : std::is_integral_v<V> ? DType::Int64 : kDefaultFloat;
  return detail::filled(shape, static_cast<double>(value), dtype, Device::cpu(), "full");
}
inline Tensor zeros(const Shape& shape, DType dtype = f32, Device device = Device::cpu()) {
  return detail::filled(shape, 0.0, dtype, device, "zeros");
}
inline Tensor ones(const Shape& shape, DType dtype = f32, Device device = Device::cpu()) {
  return detail::filled(shape, 1.0, dtype, device, "ones");
}

/// 0, 1, ..., n-1.
KILN_ENTRY Tensor arange(std::int64_t n, DType dtype = i64, Device device = Device::cpu());

namespace detail {
/// torch.arange(start, end, step): ceil((end - start) / step) values start + i * step, computed
/// in int64 when every bound is an integer and the dtype is integral, else in double, then cast.
KILN_ENTRY Tensor arange_range(double start, double end, double step, bool integral_bounds, DType dtype, Device device);
}  // namespace detail

/// start, start + step, ... below `end` (above it for a negative step), as torch.arange: the
/// dtype is int64 when every bound is an integer, else the default float (f32).
template <class A, class B, class C = std::int64_t>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>&& std::is_arithmetic_v<C>) Tensor
    arange(A start, B end, C step = 1) {
  constexpr bool integral = std::is_integral_v<A> && std::is_integral_v<B> && std::is_integral_v<C>;
  return detail::arange_range(static_cast<double>(start), static_cast<double>(end), static_cast<double>(step), integral,
                              integral ? DType::Int64 : kDefaultFloat, Device::cpu());
}
/// The same with an explicit dtype and device.
template <class A, class B, class C>
requires(std::is_arithmetic_v<A>&& std::is_arithmetic_v<B>&& std::is_arithmetic_v<C>) Tensor
    arange(A start, B end, C step, DType dtype, Device device = Device::cpu()) {
  constexpr bool integral = std::is_integral_v<A> && std::is_integral_v<B> && std::is_integral_v<C>;
  return detail::arange_range(static_cast<double>(start), static_cast<double>(end), static_cast<double>(step), integral,
                              dtype, device);
}

namespace detail {
/// A Random node keyed by `seed`. On the CPU, outside a kiln::compile trace, the seed is a
/// 0-dim int64 leaf read at launch, as numbers are (one kernel for every seed); elsewhere it
/// is part of the code.
KILN_ENTRY ir::NodePtr random_node(const Shape& shape, std::uint64_t seed, int distribution, DType dtype,
                                   Device device);

/// rand's and randn's checks, before any key is drawn or node built.
KILN_ENTRY void check_random(const Shape& shape, const char* op, DType dtype);
}  // namespace detail

/// Uniform numbers in [0, 1) from Philox4x32-10 keyed by `seed` (element i uses counter i:
/// the same on every device and thread count).
KILN_ENTRY Tensor rand(const Shape& shape, std::uint64_t seed, DType dtype = f32, Device device = Device::cpu());

/// Standard normal numbers (Box-Muller over Philox4x32-10, counter = element index).
KILN_ENTRY Tensor randn(const Shape& shape, std::uint64_t seed, DType dtype = f32, Device device = Device::cpu());

namespace detail {

/// PyTorch's default seed (torch.initial_seed() of a fresh process).
inline constexpr std::uint64_t kDefaultSeed = 67280421310721ull;

/// The generator behind rand(shape) and randn(shape): the seed manual_seed set and how many
/// tensors have been drawn since.
struct GlobalGenerator {
  std::atomic<std::uint64_t> seed{kDefaultSeed};
  std::atomic<std::uint64_t> drawn{0};
};
KILN_ENTRY GlobalGenerator& global_generator();

/// The Philox key of the next tensor drawn from the global generator: splitmix64 of the seed
/// and the draw's index, so consecutive tensors get unrelated streams. Inside kiln::compile a
/// draw would be traced once and replayed with the same key on every call, so it is refused
/// there, before anything is built.
KILN_ENTRY std::uint64_t next_generator_key(const char* op);

}  // namespace detail

/// Seeds the generator that rand(shape) and randn(shape) draw from (torch.manual_seed): the
/// same seed gives the same sequence of tensors. Explicitly seeded rand/randn do not touch it.
KILN_ENTRY void manual_seed(std::uint64_t seed);

/// The seed of the global generator (torch.initial_seed): 67280421310721 until manual_seed.
inline std::uint64_t initial_seed() { return detail::global_generator().seed; }

/// Uniform numbers in [0, 1) from the global generator (torch.rand): each call draws a new
/// Philox key (see manual_seed). On the CPU the key is a kernel argument (one kernel for every
/// key); on CUDA each key is still its own kernel.
KILN_ENTRY Tensor rand(const Shape& shape, DType dtype = f32, Device device = Device::cpu());

/// Standard normal numbers from the global generator (torch.randn).
KILN_ENTRY Tensor randn(const Shape& shape, DType dtype = f32, Device device = Device::cpu());

/// rand with x's shape, dtype and device (torch.rand_like).
inline Tensor rand_like(const Tensor& x) { return rand(x.shape(), x.dtype(), x.device()); }
/// randn with x's shape, dtype and device (torch.randn_like).
inline Tensor randn_like(const Tensor& x) { return randn(x.shape(), x.dtype(), x.device()); }

}  // namespace kiln

namespace kiln {

/// A tensor of `shape` whose contents are unspecified (realized now: its storage is for
/// `assign` to write into).
KILN_ENTRY Tensor empty(const Shape& shape, DType dtype = f32, Device device = Device::cpu());

/// `full`, `zeros`, `ones` and `empty` with the shape, dtype and device of `t` (each may be
/// overridden), as torch.*_like.
template <class E>
requires TensorLike<E> Tensor full_like(const E& t, double value, std::optional<DType> dtype = std::nullopt) {
  return full(t.shape(), value, dtype.value_or(t.dtype()), t.device());
}
template <class E>
requires TensorLike<E> Tensor zeros_like(const E& t, std::optional<DType> dtype = std::nullopt) {
  return full_like(t, 0.0, dtype);
}
template <class E>
requires TensorLike<E> Tensor ones_like(const E& t, std::optional<DType> dtype = std::nullopt) {
  return full_like(t, 1.0, dtype);
}
template <class E>
requires TensorLike<E> Tensor empty_like(const E& t, std::optional<DType> dtype = std::nullopt) {
  return empty(t.shape(), dtype.value_or(t.dtype()), t.device());
}

namespace detail {
/// An identity of `n` that is a node of its own (a new value when evaluated, never a view of
/// n's memory): x + (-0.0) is x for every float (-0 included), x + 0 for integers, x || false
/// for bools. It records the gradient.
inline ir::NodePtr identity_node(const ir::NodePtr& n) {
  if (n->dtype == DType::Bool) return ir::binary(ir::Op::Or, n, ir::constant(0.0, n->dtype, n->shape, n->device));
  return ir::binary(ir::Op::Add, n, ir::constant(is_floating(n->dtype) ? -0.0 : 0.0, n->dtype, n->shape, n->device));
}
}  // namespace detail

/// A copy of `t`'s values that shares nothing with it: a later `t.assign(...)` leaves the
/// clone as it was. An evaluated tensor is copied now (row-major); a lazy one gets a node of
/// its own, computed where it is first used (inside kiln::compile, always so).
template <class E>
requires TensorLike<E> Tensor clone(const E& x) {
  Tensor t(x);
  if (!t.defined()) throw Error("clone: operation on an undefined Tensor (default-constructed)");
  const ir::NodePtr& n = t.node();
  // An identity that is a node of its own; it records the gradient (clone is differentiable).
  auto identity = [&] { return Tensor(detail::identity_node(n)); };
  if (n->realized() && !detail::deferring_eval()) {
    if (t.requires_grad()) return identity().eval();  // copied now, and its gradient flows to t
    return Tensor(detail::contiguous_copy(n));
  }
  return identity();
}

/// This tensor if its layout is row-major dense, else a row-major copy of it (as
/// torch.Tensor.contiguous; differentiable). A lazy tensor is always contiguous: it is
/// evaluated row-major.
inline Tensor Tensor::contiguous() const { return is_contiguous() ? *this : kiln::clone(*this); }

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/creation_impl.hpp"
#endif
