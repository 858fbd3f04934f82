#pragma once
/// Eigen interop (include only where Eigen is available; nothing else in kiln needs Eigen).
///
///   Tensor t = kiln::from_eigen(matrix);           // a view: no copy, any storage order
///   auto m = kiln::to_eigen<Eigen::MatrixXf>(t);   // a copy, converted to float
///   auto v = kiln::to_eigen<Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>>(t);
///                                                  // a map over t's evaluated storage: no copy
///
/// Eigen's own 16-bit types map to kiln's: Eigen::half <-> f16, Eigen::bfloat16 <-> bf16.
#include <Eigen/Core>
#if __has_include(<unsupported/Eigen/CXX11/Tensor>)
#include <unsupported/Eigen/CXX11/Tensor>
#define KILN_HAS_EIGEN_TENSOR 1
#else
#define KILN_HAS_EIGEN_TENSOR 0
#endif

#include <array>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/kiln.hpp"

namespace kiln {

namespace detail {

/// The kiln storage type of an Eigen scalar (they share their bit layout).
template <class S>
struct eigen_to_kiln {
  using type = S;
};
template <>
struct eigen_to_kiln<Eigen::half> {
  using type = Half;
};
template <>
struct eigen_to_kiln<Eigen::bfloat16> {
  using type = BFloat16;
};
template <class S>
using eigen_to_kiln_t = typename eigen_to_kiln<std::remove_const_t<S>>::type;

template <class S>
concept EigenScalar = requires {
  dtype_of<eigen_to_kiln_t<S>>::value;
}
&&sizeof(eigen_to_kiln_t<S>) == sizeof(std::remove_const_t<S>);

template <class T>
concept EigenDense = std::is_base_of_v<Eigen::DenseBase<T>, T>;

/// Dense Eigen objects whose coefficients sit in memory at fixed strides (Matrix, Array, Map,
/// Ref, Block of those): these can be viewed without a copy.
template <class T>
concept EigenDirect = EigenDense<T> &&(int(T::Flags) & Eigen::DirectAccessBit) != 0;

/// Types that own their coefficients: viewing a temporary of one would dangle.
template <class T>
concept EigenPlain = std::is_base_of_v<Eigen::PlainObjectBase<T>, T>;

template <class T>
struct is_eigen_map : std::false_type {};
template <class P, int O, class S>
struct is_eigen_map<Eigen::Map<P, O, S>> : std::true_type {
  using plain = std::remove_const_t<P>;
  static constexpr int options = O;  // Eigen::Unaligned, Aligned16, ...
  using stride = S;
};

/// Eigen::Stride, OuterStride<> and InnerStride<> have different constructors.
template <class StrideT>
StrideT make_stride(Eigen::Index outer, Eigen::Index inner) {
  if constexpr (std::is_constructible_v<StrideT, Eigen::Index, Eigen::Index>)
    return StrideT(outer, inner);
  else if constexpr (StrideT::InnerStrideAtCompileTime == 0)
    return StrideT(outer);
  else
    return StrideT(inner);
}

#if KILN_HAS_EIGEN_TENSOR
template <class T>
struct is_eigen_tensor : std::false_type {};
template <class S, int R, int O, class I>
struct is_eigen_tensor<Eigen::Tensor<S, R, O, I>> : std::true_type {};
template <class T>
struct is_eigen_tensor_map : std::false_type {};
template <class P, int O, template <class> class MP>
struct is_eigen_tensor_map<Eigen::TensorMap<P, O, MP>> : std::true_type {
  using plain = P;
};
#endif

inline std::string strides_str(const Strides& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

inline void require_cpu(const Tensor& t, const char* op) {
  if (!t.device().is_cpu())
    throw DeviceError(std::string(op) + ": Eigen maps need a tensor on the CPU, got " + t.device().str() +
                      " (use t.to(Device::cpu()) first)");
}

/// Rows and columns a 1-D or 2-D tensor offers an Eigen matrix type `M` (vectors may come from
/// 1-D tensors, matrices need 2-D), checked against M's compile-time sizes.
template <class M>
std::pair<std::int64_t, std::int64_t> matrix_extent(const Tensor& t, const char* op) {
  const Shape& s = t.shape();
  std::int64_t rows = -1, cols = -1;
  if (s.size() == 2) {
    rows = s[0];
    cols = s[1];
  } else if (s.size() == 1 && M::IsVectorAtCompileTime) {
    rows = M::ColsAtCompileTime == 1 ? s[0] : 1;
    cols = M::ColsAtCompileTime == 1 ? 1 : s[0];
  } else {
    throw ShapeError(std::string(op) + ": a tensor of shape " + s.str() + " is not a " +
                     (M::IsVectorAtCompileTime ? "vector (1-D or 2-D)" : "matrix (2-D)"));
  }
  if ((M::RowsAtCompileTime != Eigen::Dynamic && M::RowsAtCompileTime != rows) ||
      (M::ColsAtCompileTime != Eigen::Dynamic && M::ColsAtCompileTime != cols))
    throw ShapeError(std::string(op) + ": tensor of shape " + s.str() + " does not fit the fixed size " +
                     std::to_string(int(M::RowsAtCompileTime)) + "x" + std::to_string(int(M::ColsAtCompileTime)));
  return {rows, cols};
}

template <class S>
void require_dtype(const Tensor& t, const char* op) {
  constexpr DType want = dtype_v<eigen_to_kiln_t<S>>;
  if (t.dtype() != want)
    throw DTypeError(std::string(op) + ": the Eigen type holds " + dtype_name(want) + " but the tensor of shape " +
                     t.shape().str() + " is " + dtype_name(t.dtype()) + " (convert with t.to(" + dtype_name(want) +
                     ") or copy with a plain Eigen type)");
}

/// The tensor's elements in row-major order, as Eigen scalar S, copied into `out` (numel
/// elements). Goes through to_vector, so dtype conversion follows kiln's casting rules.
template <class S>
void copy_row_major(const Tensor& t, S* out) {
  using K = eigen_to_kiln_t<S>;
  std::vector<K> host = t.to_vector<K>();
  if constexpr (std::is_same_v<K, bool>) {
    for (std::size_t i = 0; i < host.size(); ++i) out[i] = host[i];
  } else if (!host.empty()) {
    static_assert(std::is_trivially_copyable_v<K>);
    std::memcpy(static_cast<void*>(out), host.data(), host.size() * sizeof(K));
  }
}

}  // namespace detail

/// A tensor viewing the coefficients of an Eigen matrix, array, Map, Ref or Block: no copy.
/// Column-major storage becomes a view with column-major strides (still no copy); compile-time
/// vectors become 1-D tensors, everything else 2-D. Assigning to the tensor writes into the
/// Eigen object. The Eigen object must outlive every use of the tensor (as with from_blob), so
/// temporaries of owning types (Matrix, Array) are rejected at compile time.
template <class M>
requires detail::EigenDirect<std::remove_cvref_t<M>> && detail::EigenScalar<typename std::remove_cvref_t<M>::Scalar> &&
    (std::is_lvalue_reference_v<M> || !detail::EigenPlain<std::remove_cvref_t<M>>)Tensor from_eigen(M&& m) {
  using D = std::remove_cvref_t<M>;
  using K = detail::eigen_to_kiln_t<typename D::Scalar>;
  // const Eigen objects still give a tensor (kiln's views are not const-typed); writing
  // into such a view through assign() is the caller's error, as with a const from_blob.
  K* data = reinterpret_cast<K*>(const_cast<typename D::Scalar*>(m.data()));
  const std::int64_t inner = m.innerStride(), outer = m.outerStride();
  if constexpr (D::IsVectorAtCompileTime) {
    return from_blob(data, Shape{static_cast<std::int64_t>(m.size())}, Device::cpu(), Strides{inner});
  } else {
    const std::int64_t row_stride = D::IsRowMajor ? outer : inner;
    const std::int64_t col_stride = D::IsRowMajor ? inner : outer;
    return from_blob(data, Shape{static_cast<std::int64_t>(m.rows()), static_cast<std::int64_t>(m.cols())},
                     Device::cpu(), Strides{row_stride, col_stride});
  }
}

#if KILN_HAS_EIGEN_TENSOR
/// A tensor viewing an Eigen::Tensor or Eigen::TensorMap: no copy; ColMajor (Eigen's default)
/// gives column-major strides over the same shape, so `t[i, j, k]` is `e(i, j, k)`.
template <class E>
requires(detail::is_eigen_tensor<std::remove_cvref_t<E>>::value ||
         detail::is_eigen_tensor_map<std::remove_cvref_t<E>>::value) &&
    detail::EigenScalar<typename std::remove_cvref_t<E>::Scalar> &&
    (std::is_lvalue_reference_v<E> || !detail::is_eigen_tensor<std::remove_cvref_t<E>>::value) Tensor
    from_eigen(E&& e) {
  using D = std::remove_cvref_t<E>;
  using K = detail::eigen_to_kiln_t<typename D::Scalar>;
  constexpr int rank = D::NumIndices;
  Shape shape(rank);
  for (int i = 0; i < rank; ++i) shape[i] = static_cast<std::int64_t>(e.dimension(i));
  Strides strides(rank);
  std::int64_t step = 1;
  if constexpr (int(D::Layout) == int(Eigen::RowMajor)) {
    for (int i = rank - 1; i >= 0; --i) {
      strides[i] = step;
      step *= shape[i];
    }
  } else {
    for (int i = 0; i < rank; ++i) {
      strides[i] = step;
      step *= shape[i];
    }
  }
  K* data = reinterpret_cast<K*>(const_cast<std::remove_const_t<typename D::Scalar>*>(e.data()));
  return from_blob(data, shape, Device::cpu(), std::move(strides));
}
#endif

/// An Eigen object holding `t`'s values. The target type decides how:
/// - `Eigen::Map<Matrix or Array, Options, Stride>`: a map over `t`'s evaluated storage, no
///   copy. `t` must be on the CPU, of the same dtype, and laid out as the Map's storage order
///   and Stride type allow (a Stride<Dynamic, Dynamic> map takes any non-broadcast 2-D view);
///   else ShapeError / DTypeError / DeviceError. The map does not keep `t` alive.
/// - `Eigen::TensorMap<Eigen::Tensor<...>>`: likewise; `t` must be contiguous in the map's layout.
/// - a plain `Eigen::Matrix`/`Array`/`Tensor`: a copy, converted to its scalar type
///   (kiln's casting rules), from any device.
/// Vector types accept 1-D tensors; matrix types need 2-D ones.
template <class Target>
Target to_eigen(const Tensor& t) {
  if constexpr (detail::is_eigen_map<Target>::value) {
    using Plain = typename detail::is_eigen_map<Target>::plain;
    using S = typename Plain::Scalar;
    using K = detail::eigen_to_kiln_t<S>;
    using StrideT = typename detail::is_eigen_map<Target>::stride;
    detail::require_cpu(t, "to_eigen");
    detail::require_dtype<S>(t, "to_eigen");
    auto [rows, cols] = detail::matrix_extent<Plain>(t, "to_eigen");
    K* data = t.data_ptr<K>();  // evaluates; the strides below are the evaluated layout
    const Strides st = t.strides();
    std::int64_t row_stride = 0, col_stride = 0;
    if (st.size() == 2) {
      row_stride = st[0];
      col_stride = st[1];
    } else {  // a 1-D tensor as a vector
      (rows == 1 ? col_stride : row_stride) = st[0];
    }
    constexpr bool row_major = Plain::IsRowMajor;
    const std::int64_t inner_size = row_major ? cols : rows, outer_size = row_major ? rows : cols;
    std::int64_t inner = row_major ? col_stride : row_stride;
    std::int64_t outer = row_major ? row_stride : col_stride;
    // A stride along a dimension of size 1 is never used: normalise it to what Eigen expects.
    constexpr int ct_inner = StrideT::InnerStrideAtCompileTime, ct_outer = StrideT::OuterStrideAtCompileTime;
    if (inner_size <= 1) inner = ct_inner == Eigen::Dynamic || ct_inner == 0 ? 1 : ct_inner;
    const std::int64_t default_outer = inner_size * inner;
    if (outer_size <= 1) outer = ct_outer == Eigen::Dynamic || ct_outer == 0 ? default_outer : ct_outer;
    const bool inner_ok = ct_inner == Eigen::Dynamic ? inner > 0 : inner == (ct_inner == 0 ? 1 : ct_inner);
    bool outer_ok = ct_outer == Eigen::Dynamic ? outer > 0 : outer == (ct_outer == 0 ? default_outer : ct_outer);
    if (Plain::IsVectorAtCompileTime) outer_ok = true;  // a vector map only steps along one axis
    if (!inner_ok || !outer_ok)
      throw ShapeError("to_eigen: a tensor of shape " + t.shape().str() + " with strides " + detail::strides_str(st) +
                       " cannot be mapped by this Eigen::Map (" + (row_major ? "row" : "column") +
                       "-major, inner stride " + std::to_string(inner) + ", outer stride " + std::to_string(outer) +
                       "); map it with Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic> or copy it into a plain type");
    constexpr int map_options = detail::is_eigen_map<Target>::options;
    if constexpr (map_options != Eigen::Unaligned) {
      if (reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(map_options) != 0)
        throw ShapeError("to_eigen: the tensor's data is not aligned as the Map requires");
    }
    auto* eigen_data = reinterpret_cast<S*>(data);
    using Index = Eigen::Index;
    if constexpr (ct_inner == Eigen::Dynamic || ct_outer == Eigen::Dynamic) {
      const StrideT stride = detail::make_stride<StrideT>(static_cast<Index>(outer), static_cast<Index>(inner));
      if constexpr (Plain::IsVectorAtCompileTime)
        return Target(eigen_data, static_cast<Index>(rows * cols), stride);
      else
        return Target(eigen_data, static_cast<Index>(rows), static_cast<Index>(cols), stride);
    } else {
      if constexpr (Plain::IsVectorAtCompileTime)
        return Target(eigen_data, static_cast<Index>(rows * cols));
      else
        return Target(eigen_data, static_cast<Index>(rows), static_cast<Index>(cols));
    }
  } else if constexpr (detail::EigenPlain<Target>) {
    using S = typename Target::Scalar;
    static_assert(detail::EigenScalar<S>, "to_eigen: the Eigen scalar type has no kiln dtype");
    auto [rows, cols] = detail::matrix_extent<Target>(t, "to_eigen");
    Target out(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    // Row-major order of the transpose is column-major order of t.
    const bool flip = !Target::IsRowMajor && t.dim() == 2;
    detail::copy_row_major(flip ? transpose(t, 0, 1) : t, out.data());
    return out;
#if KILN_HAS_EIGEN_TENSOR
  } else if constexpr (detail::is_eigen_tensor_map<Target>::value) {
    using Plain = typename detail::is_eigen_tensor_map<Target>::plain;
    using S = std::remove_const_t<typename Plain::Scalar>;
    using K = detail::eigen_to_kiln_t<S>;
    constexpr int rank = Plain::NumIndices;
    detail::require_cpu(t, "to_eigen");
    detail::require_dtype<S>(t, "to_eigen");
    if (t.dim() != rank)
      throw ShapeError("to_eigen: a tensor of shape " + t.shape().str() + " cannot be mapped by a rank-" +
                       std::to_string(rank) + " Eigen::TensorMap");
    K* data = t.data_ptr<K>();
    const Strides st = t.strides();
    std::int64_t step = 1;
    bool ok = true;
    for (int k = 0; k < rank; ++k) {
      const int i = int(Plain::Layout) == int(Eigen::RowMajor) ? rank - 1 - k : k;
      if (t.shape()[i] > 1 && st[i] != step) ok = false;
      step *= t.shape()[i];
    }
    if (!ok)
      throw ShapeError("to_eigen: a tensor of shape " + t.shape().str() + " with strides " + detail::strides_str(st) +
                       " is not contiguous in the TensorMap's " +
                       (int(Plain::Layout) == int(Eigen::RowMajor) ? "row" : "column") +
                       "-major layout; copy it into an Eigen::Tensor instead");
    std::array<typename Plain::Index, rank> dims{};
    for (int i = 0; i < rank; ++i) dims[i] = static_cast<typename Plain::Index>(t.shape()[i]);
    return Target(reinterpret_cast<typename Plain::Scalar*>(data), dims);
  } else if constexpr (detail::is_eigen_tensor<Target>::value) {
    using S = typename Target::Scalar;
    static_assert(detail::EigenScalar<S>, "to_eigen: the Eigen scalar type has no kiln dtype");
    constexpr int rank = Target::NumIndices;
    if (t.dim() != rank)
      throw ShapeError("to_eigen: a tensor of shape " + t.shape().str() + " does not fit a rank-" +
                       std::to_string(rank) + " Eigen::Tensor");
    std::array<typename Target::Index, rank> dims{};
    for (int i = 0; i < rank; ++i) dims[i] = static_cast<typename Target::Index>(t.shape()[i]);
    Target out(dims);
    if constexpr (int(Target::Layout) == int(Eigen::RowMajor) || rank < 2) {
      detail::copy_row_major(t, out.data());
    } else {
      std::vector<std::int64_t> reversed(rank);
      std::iota(reversed.rbegin(), reversed.rend(), std::int64_t{0});
      detail::copy_row_major(permute(t, reversed), out.data());
    }
    return out;
#endif
  } else {
    static_assert(sizeof(Target) == 0,
                  "to_eigen: the target must be an Eigen Matrix/Array, a Map of one, or an Eigen Tensor/TensorMap");
  }
}

/// Maps must not outlive their tensor: a map over a temporary tensor would dangle at once.
template <class Target>
requires detail::is_eigen_map<Target>::value
#if KILN_HAS_EIGEN_TENSOR
    || detail::is_eigen_tensor_map<Target>::value
#endif
        Target
        to_eigen(Tensor&&)
= delete;

}  // namespace kiln
