#pragma once
// Element types and PyTorch's type-promotion lattice.
#include <cstdint>
#include <string>

#include "kiln/core/error.hpp"
#include "kiln/core/half.hpp"

namespace kiln {

/// Element type of a tensor.
enum class DType : std::uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64 };

inline constexpr DType bool_ = DType::Bool;     ///< bool
inline constexpr DType i32 = DType::Int32;      ///< int32_t
inline constexpr DType i64 = DType::Int64;      ///< int64_t
inline constexpr DType f16 = DType::Float16;    ///< kiln::Half
inline constexpr DType bf16 = DType::BFloat16;  ///< kiln::BFloat16
inline constexpr DType f32 = DType::Float32;    ///< float
inline constexpr DType f64 = DType::Float64;    ///< double

inline constexpr int kNumDTypes = 7;

/// Size of one element in bytes.
constexpr std::size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool:
      return 1;
    case DType::Int32:
      return 4;
    case DType::Int64:
      return 8;
    case DType::Float16:
      return 2;
    case DType::BFloat16:
      return 2;
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
  }
  return 0;
}

/// Short name as PyTorch prints it ("float32", "int64", ...).
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::Float16:
      return "float16";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64;
}
constexpr bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }
constexpr bool is_bool(DType t) { return t == DType::Bool; }
/// 16-bit floats are stored narrow and computed in f32.
constexpr bool is_reduced_float(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

/// 0 = bool, 1 = integer, 2 = floating: the categories of PyTorch's promotion.
constexpr int dtype_category(DType t) { return is_bool(t) ? 0 : is_integral(t) ? 1 : 2; }

/// torch.promote_types: the smallest dtype both values fit in.
constexpr DType promote_types(DType a, DType b) {
  if (a == b) return a;
  int ca = dtype_category(a), cb = dtype_category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 1) return (a == DType::Int64 || b == DType::Int64) ? DType::Int64 : DType::Int32;
  // both floating
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16))
    return DType::Float32;
  auto rank = [](DType t) { return t == DType::Float64 ? 3 : t == DType::Float32 ? 2 : 1; };
  return rank(a) >= rank(b) ? a : b;
}

namespace detail {
/// `x` converted to the integer type D by kiln's rule (PyTorch's on x86): truncation toward
/// zero; NaN and values out of D's range give D's minimum (what cvttsd2si gives), never UB.
template <class D>
constexpr D float_to_int(double x) {
  constexpr bool narrow = sizeof(D) == 4;
  bool in_range =
      narrow ? (x > -2147483649.0 && x < 2147483648.0) : (x >= -9223372036854775808.0 && x < 9223372036854775808.0);
  return in_range ? static_cast<D>(x)
                  : (narrow ? static_cast<D>(-2147483647 - 1) : static_cast<D>(-9223372036854775807LL - 1));
}
}  // namespace detail

/// The largest finite value of a floating dtype (torch.finfo(t).max); 0 for other dtypes.
constexpr double largest_finite(DType t) {
  switch (t) {
    case DType::Float64:
      return 1.7976931348623157e308;
    case DType::Float32:
      return 3.4028234663852886e38;
    case DType::Float16:
      return 65504.0;
    case DType::BFloat16:
      return 3.3895313892515355e38;
    default:
      return 0.0;
  }
}

/// The dtype in which kiln computes values of `t` (f16/bf16 -> f32; others unchanged).
constexpr DType compute_dtype(DType t) { return is_reduced_float(t) ? DType::Float32 : t; }

/// Default floating dtype (torch.get_default_dtype()).
inline constexpr DType kDefaultFloat = DType::Float32;

/// Maps a C++ element type to its DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::Float16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

/// Calls f(T{}) with T the C++ storage type of `t`.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Bool:
      return f(bool{});
    case DType::Int32:
      return f(std::int32_t{});
    case DType::Int64:
      return f(std::int64_t{});
    case DType::Float16:
      return f(Half{});
    case DType::BFloat16:
      return f(BFloat16{});
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
  }
  throw DTypeError("unknown dtype");
}

}  // namespace kiln
