#pragma once
// What each reduction computes, said once: its accumulator, identity, step (fold one element),
// merge (join two partial results) and finish. The reference executor folds values with the
// policies below; both C-family writers print the same rules (codegen/c/reduction.hpp renders
// them as C text, rule for rule):
//
//   op        accumulator                    identity         step / merge                         finish
//   sum       double (floats), wrapping u64  0                a + x                                rounded to the output dtype
//   prod      long double here, double in    1                a * x                                rounded to the output dtype
//             kernels (floats); wrapping u64
//   max/min   the compute type               -inf/+inf, the   NaN sticks: x replaces a when it is  the value
//                                            integer extremes more extreme or NaN
//   argmax/   (value, index), index -1:      (identity, -1)   the extreme wins, NaN counts as the  the index (0 when none won)
//   argmin    nothing seen yet                                extreme, ties go to the lower index
//
// The arg rule is index-aware, so partial results merge in any grouping; every other merge is
// the step applied to a partial result.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/core/half.hpp"

namespace kiln::ir::combine {

using i64 = std::int64_t;

/// The type values of a storage type are computed in: f16/bf16 in f32, bool as a 0/1 integer.
template <class T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<bool> {
  using type = i64;
};
template <>
struct ComputeOf<Half> {
  using type = float;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};
template <class T>
using compute_t = typename ComputeOf<T>::type;
template <class T>
inline constexpr bool floating_v = std::is_floating_point_v<compute_t<T>>;

/// A stored value in its compute type, and back (bool: nonzero is true).
template <class T>
inline compute_t<T> load(T v) {
  return static_cast<compute_t<T>>(v);
}
template <class T, class C>
inline T store(C c) {
  if constexpr (std::is_same_v<T, bool>)
    return c != 0;
  else
    return static_cast<T>(c);
}

// Policies over values of storage type T: Acc, init(), step(a, x, k) folding in element k (its
// flat index within the reduced axes), merge(a, b) joining two partial results (the first
// holding the lower indices) and finish(a).

/// Sum and product. Floats multiply in long double here (x86's 64-bit mantissa and 15-bit
/// exponent): a product whose partial products overflow double (171! does) but which holds a
/// 0 is 0 whatever the blocking, not 0 * inf = NaN (in a kernel that case is order-dependent).
template <class T, bool IsProd>
struct SumProd {
  using Float = std::conditional_t<IsProd, long double, double>;
  using Acc = std::conditional_t<floating_v<T>, Float, std::uint64_t>;
  using Out = T;
  static Acc init() { return Acc(IsProd ? 1 : 0); }
  static Acc step(Acc a, T x, i64) {
    Acc v;
    if constexpr (floating_v<T>)
      v = static_cast<Float>(static_cast<double>(load(x)));
    else
      v = static_cast<std::uint64_t>(static_cast<i64>(load(x)));
    return merge(a, v);
  }
  static Acc merge(Acc a, Acc b) {
    if constexpr (IsProd)
      return a * b;
    else
      return a + b;
  }
  static Out finish(Acc a) {
    if constexpr (floating_v<T>)
      return store<T>(static_cast<compute_t<T>>(a));
    else
      return store<T>(static_cast<compute_t<T>>(static_cast<i64>(a)));
  }
};

/// Max and min: NaN sticks (once the accumulator is NaN no comparison is true).
template <class T, bool IsMax>
struct Extreme {
  using Acc = compute_t<T>;
  using Out = T;
  static Acc init() {
    if constexpr (floating_v<T>)
      return IsMax ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::infinity();
    else
      return static_cast<Acc>(IsMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max());
  }
  static Acc merge(Acc a, Acc x) {
    if constexpr (floating_v<T>) {
      if (x != x) return x;
    }
    return (IsMax ? x > a : x < a) ? x : a;
  }
  static Acc step(Acc a, T x, i64) { return merge(a, load(x)); }
  static Out finish(Acc a) { return store<T>(a); }
};

/// Argmax and argmin: the first index of the extreme, a NaN counting as the extreme.
template <class T, bool IsMax>
struct ArgExtreme {
  using C = compute_t<T>;
  struct Acc {
    C val;
    i64 idx;  ///< -1: nothing better than the initial value seen (then index 0 is the answer)
  };
  using Out = std::int64_t;
  static Acc init() { return Acc{Extreme<T, IsMax>::init(), -1}; }
  /// Whether b replaces a (the rule above).
  static bool better(const Acc& a, const Acc& b) {
    if (b.idx < 0) return false;
    if (a.idx < 0) return true;
    if constexpr (floating_v<T>) {
      bool an = a.val != a.val, bn = b.val != b.val;
      if (an || bn) return an && bn ? b.idx < a.idx : bn;
    }
    if (IsMax ? b.val > a.val : b.val < a.val) return true;
    return b.val == a.val && b.idx < a.idx;
  }
  static Acc merge(Acc a, Acc b) { return better(a, b) ? b : a; }
  /// One accumulator sees its elements in increasing k, so on a tie (or a second NaN) the one
  /// it holds is the first.
  static Acc step(Acc a, T x, i64 k) {
    const C v = load(x);
    if constexpr (floating_v<T>) {
      if (v != v) return a.val != a.val ? a : Acc{v, k};
    }
    return (IsMax ? v > a.val : v < a.val) ? Acc{v, k} : a;
  }
  static Out finish(Acc a) { return a.idx < 0 ? 0 : a.idx; }
};

}  // namespace kiln::ir::combine
