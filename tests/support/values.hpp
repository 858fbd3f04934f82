#pragma once
// Reading tensors back and rounding to a dtype, on the host, without doctest: shared by the
// doctest suite (support/reference.hpp) and the fuzzer's own executable (tests/fuzz/).
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kiln/kiln.hpp"

namespace kiln::testing {

/// `v` as an element of dtype `t` holds it (f16/bf16 round to nearest even; ints truncate with
/// the x86 rule kiln documents for out-of-range values; bool is v != 0).
inline double round_to(double v, DType t) {
  switch (t) {
    case DType::Bool:
      return v != 0.0 ? 1.0 : 0.0;
    case DType::Int32:
      if (!(v > -2147483649.0 && v < 2147483648.0)) return -2147483648.0;
      return static_cast<double>(static_cast<std::int32_t>(v));
    case DType::Int64:
      if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0)) return -9223372036854775808.0;
      return static_cast<double>(static_cast<std::int64_t>(v));
    case DType::Float16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case DType::BFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    case DType::Float32:
      return static_cast<double>(static_cast<float>(v));
    case DType::Float64:
      return v;
  }
  return v;
}

/// The elements of `t` in row-major order, read in t's own dtype and converted to double on
/// the host (no kiln cast involved).
inline std::vector<double> values(const Tensor& t) {
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto raw = t.to_vector<T>();
    std::vector<double> out;
    out.reserve(raw.size());
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if constexpr (std::is_same_v<T, bool>)
        out.push_back(raw[i] ? 1.0 : 0.0);
      else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        out.push_back(static_cast<float>(raw[i]));
      else
        out.push_back(static_cast<double>(raw[i]));
    }
    return out;
  });
}

}  // namespace kiln::testing
