#pragma once
// The reference executor: a graph run primitive by primitive on the host, every intermediate
// in its own 64-byte aligned buffer. It defines what every primitive means (PyTorch's
// semantics); every fused kernel is tested against it, and it is the "eager" backend.
//
// Values are strided views: a node's value is a base pointer plus element strides. Pointwise
// ops, reductions, Concat and Random write fresh contiguous buffers; Broadcast, Permute, Slice
// and (where the layout allows) Reshape only restride their input, as PyTorch's eager views do;
// Constant and Iota are stored once and broadcast with zero strides. Buffers are released
// after their last use.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/backend/executor.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/ir/builder.hpp"
#include "kiln/ir/combiner.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::backend {

namespace detail {

using ir::Op;
using i64 = std::int64_t;

// ---- element types --------------------------------------------------------------------------

// The compute types and the reductions' policies: ir/combiner.hpp (what the kernels print too).
using ir::combine::compute_t;
using ir::combine::floating_v;
using ir::combine::load;
using ir::combine::store;
using ir::combine::ArgExtreme;
using ir::combine::Extreme;
using ir::combine::SumProd;

// Integer arithmetic wraps; done in unsigned because signed overflow is UB.
template <class C>
inline C wrap_add(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
}
template <class C>
inline C wrap_sub(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
}
template <class C>
inline C wrap_mul(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
}
template <class C>
inline C int_div(C a, C b) {
  if (b == 0) return 0;
  if (b == -1) return wrap_sub<C>(0, a);  // min / -1 overflows in hardware
  return a / b;
}
template <class C>
inline C int_pow(C base, C e) {
  if (e < 0) {
    if (base == 1) return 1;
    if (base == -1) return (e & 1) ? -1 : 1;
    return 0;
  }
  using U = std::make_unsigned_t<C>;
  U result = 1, b = static_cast<U>(base);
  while (e) {
    if (e & 1) result = static_cast<U>(result * b);
    b = static_cast<U>(b * b);
    e >>= 1;
  }
  return static_cast<C>(result);
}

/// Integer fmod: the sign of the dividend, as C's %; by 0 gives 0 (as integer division does),
/// and by -1 gives 0 (INT_MIN % -1 is undefined in C).
template <class C>
inline C int_fmod(C a, C b) {
  if (b == 0 || b == -1) return 0;
  return static_cast<C>(a % b);
}
/// PyTorch's shifts: a count outside [0, bits) shifts everything out (left: 0; right: the sign).
template <class C>
inline C shift_left(C a, C b) {
  constexpr C bits = static_cast<C>(sizeof(C) * 8);
  if (b < 0 || b >= bits) return 0;
  return static_cast<C>(static_cast<std::make_unsigned_t<C>>(a) << b);
}
template <class C>
inline C shift_right(C a, C b) {
  constexpr C bits = static_cast<C>(sizeof(C) * 8);
  if (b < 0 || b >= bits) return a < 0 ? C(-1) : C(0);
  return static_cast<C>(a >> b);
}

/// The value of `s` converted to `D` by kiln's (PyTorch's, on x86) rules.
template <class D, class S>
inline D cast_value(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    return load(s) != 0;  // NaN != 0, so NaN -> true
  } else if constexpr (std::is_same_v<S, bool>) {
    return static_cast<D>(static_cast<compute_t<D>>(s ? 1 : 0));
  } else if constexpr (!floating_v<D>) {
    if constexpr (floating_v<S>) {
      return kiln::detail::float_to_int<D>(static_cast<double>(load(s)));
    } else {
      return static_cast<D>(s);  // integer narrowing wraps (defined since C++20)
    }
  } else {
    return static_cast<D>(static_cast<compute_t<D>>(load(s)));
  }
}

// ---- strided iteration ----------------------------------------------------------------------

/// A node's value: element 0 and element strides; `owner` is set when the executor allocated it.
struct Value {
  char* data = nullptr;
  Strides strides;
  StoragePtr owner;
};

inline Value allocate(const Shape& shape, DType dtype) {
  Value v;
  v.owner = runtime::allocate_host(static_cast<std::size_t>(shape.numel()) * itemsize(dtype));
  v.data = static_cast<char*>(v.owner->data);
  v.strides = contiguous_strides(shape);
  return v;
}

/// N operands walked together over one shape: size-1 dims dropped, dims that are contiguous
/// for every operand merged (so a dense tensor is one flat loop).
template <std::size_t N>
struct Loop {
  std::vector<i64> sizes;
  std::vector<std::array<i64, N>> strides;
};

template <std::size_t N>
inline Loop<N> make_loop(const Shape& shape, const std::array<const i64*, N>& st) {
  Loop<N> l;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<i64, N> s;
    for (std::size_t k = 0; k < N; ++k) s[k] = st[k][d];
    if (!l.sizes.empty()) {
      bool merge = true;
      for (std::size_t k = 0; k < N; ++k) merge = merge && l.strides.back()[k] == s[k] * shape[d];
      if (merge) {
        l.sizes.back() *= shape[d];
        l.strides.back() = s;
        continue;
      }
    }
    l.sizes.push_back(shape[d]);
    l.strides.push_back(s);
  }
  return l;
}

/// Calls f(offsets, n, inner_strides) once per innermost row, rows in row-major order.
template <std::size_t N, class F>
inline void for_each_row(const Loop<N>& l, i64 numel, F&& f) {
  if (numel == 0) return;
  std::size_t r = l.sizes.size();
  if (r == 0) {
    f(std::array<i64, N>{}, i64{1}, std::array<i64, N>{});
    return;
  }
  const i64 n = l.sizes[r - 1];
  const std::array<i64, N> inner = l.strides[r - 1];
  std::vector<i64> idx(r - 1, 0);
  std::array<i64, N> off{};
  const i64 rows = numel / n;
  for (i64 row = 0; row < rows; ++row) {
    f(off, n, inner);
    for (std::size_t d = r - 1; d-- > 0;) {
      for (std::size_t k = 0; k < N; ++k) off[k] += l.strides[d][k];
      if (++idx[d] < l.sizes[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= l.strides[d][k] * l.sizes[d];
      idx[d] = 0;
    }
  }
}

template <class TO, class TA, class F>
inline void map1(TO* o, const Strides& os, const TA* a, const Strides& as, const Shape& shape, F f) {
  Loop<2> l = make_loop<2>(shape, {os.data(), as.data()});
  for_each_row(l, shape.numel(), [&](const std::array<i64, 2>& off, i64 n, const std::array<i64, 2>& s) {
    TO* __restrict po = o + off[0];
    const TA* __restrict pa = a + off[1];
    if (s[0] == 1 && s[1] == 1) {
      for (i64 j = 0; j < n; ++j) po[j] = f(pa[j]);
    } else if (s[1] == 0) {
      const TO v = f(*pa);
      for (i64 j = 0; j < n; ++j) po[j * s[0]] = v;
    } else {
      for (i64 j = 0; j < n; ++j) po[j * s[0]] = f(pa[j * s[1]]);
    }
  });
}

template <class TO, class TA, class TB, class F>
inline void map2(TO* o, const Strides& os, const TA* a, const Strides& as, const TB* b, const Strides& bs,
                 const Shape& shape, F f) {
  Loop<3> l = make_loop<3>(shape, {os.data(), as.data(), bs.data()});
  for_each_row(l, shape.numel(), [&](const std::array<i64, 3>& off, i64 n, const std::array<i64, 3>& s) {
    TO* __restrict po = o + off[0];
    const TA* __restrict pa = a + off[1];
    const TB* __restrict pb = b + off[2];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (i64 j = 0; j < n; ++j) po[j] = f(pa[j], pb[j]);
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
      const TB y = *pb;
      for (i64 j = 0; j < n; ++j) po[j] = f(pa[j], y);
    } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
      const TA x = *pa;
      for (i64 j = 0; j < n; ++j) po[j] = f(x, pb[j]);
    } else {
      for (i64 j = 0; j < n; ++j) po[j * s[0]] = f(pa[j * s[1]], pb[j * s[2]]);
    }
  });
}

template <class T>
inline void map_where(T* o, const Strides& os, const bool* c, const Strides& cs, const T* a, const Strides& as,
                      const T* b, const Strides& bs, const Shape& shape) {
  Loop<4> l = make_loop<4>(shape, {os.data(), cs.data(), as.data(), bs.data()});
  for_each_row(l, shape.numel(), [&](const std::array<i64, 4>& off, i64 n, const std::array<i64, 4>& s) {
    T* __restrict po = o + off[0];
    const bool* __restrict pc = c + off[1];
    const T* __restrict pa = a + off[2];
    const T* __restrict pb = b + off[3];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
      for (i64 j = 0; j < n; ++j) po[j] = pc[j] ? pa[j] : pb[j];
    } else {
      for (i64 j = 0; j < n; ++j) po[j * s[0]] = pc[j * s[1]] ? pa[j * s[2]] : pb[j * s[3]];
    }
  });
}

/// Copies `src` (any strides) into `dst` laid out with `dst_strides`.
inline void copy_value(const Value& src, char* dst, const Strides& dst_strides, const Shape& shape, DType dtype) {
  i64 n = shape.numel();
  if (n == 0) return;
  if (is_contiguous(shape, src.strides) && is_contiguous(shape, dst_strides)) {
    std::memmove(dst, src.data, static_cast<std::size_t>(n) * itemsize(dtype));
    return;
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    map1(reinterpret_cast<T*>(dst), dst_strides, reinterpret_cast<const T*>(src.data), src.strides, shape,
         [](T x) { return x; });
  });
}

inline Value materialize(const Value& v, const Shape& shape, DType dtype) {
  Value out = allocate(shape, dtype);
  copy_value(v, out.data, out.strides, shape, dtype);
  return out;
}

/// [lowest, highest] byte addresses a strided region touches; empty when it has no elements.
struct ByteRange {
  const char* lo = nullptr;
  const char* hi = nullptr;
  bool empty = true;
};
inline ByteRange byte_range(const char* base, const Strides& strides, const Shape& shape, DType dtype) {
  ByteRange r;
  if (shape.numel() == 0) return r;
  i64 lo = 0, hi = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    i64 extent = (shape[d] - 1) * strides[d];
    (extent < 0 ? lo : hi) += extent;
  }
  i64 sz = static_cast<i64>(itemsize(dtype));
  r.lo = base + lo * sz;
  r.hi = base + hi * sz + sz - 1;
  r.empty = false;
  return r;
}
inline bool overlaps(const ByteRange& a, const ByteRange& b) {
  return !a.empty && !b.empty && a.lo <= b.hi && b.lo <= a.hi;
}

[[noreturn]] inline void unsupported(const ir::GraphNode& n, DType in) {
  throw DTypeError(std::string("reference executor: ") + ir::op_name(n.op) + " is not defined for " + dtype_name(in) +
                   " (shape " + n.shape.str() + "); cast to a floating dtype first");
}

// ---- pointwise ------------------------------------------------------------------------------

template <class T, class F>
inline void map_unary(const Value& a, Value& o, const Shape& shape, F f) {
  using TO = std::decay_t<decltype(f(std::declval<T>()))>;
  map1(reinterpret_cast<TO*>(o.data), o.strides, reinterpret_cast<const T*>(a.data), a.strides, shape, f);
}

template <class T>
inline void exec_unary(const ir::GraphNode& n, DType in_dtype, const Value& a, Value& o) {
  using C = compute_t<T>;
  const Shape& shape = n.shape;
  auto math = [&](auto f) {
    if constexpr (floating_v<T>)
      map_unary<T>(a, o, shape, [f](T x) { return store<T>(f(load(x))); });
    else
      unsupported(n, in_dtype);
  };
  auto same = [&](auto f) { map_unary<T>(a, o, shape, [f](T x) { return store<T>(f(load(x))); }); };
  auto identity = [&] { map_unary<T>(a, o, shape, [](T x) { return x; }); };
  switch (n.op) {
    case Op::Neg:
      if constexpr (floating_v<T>)
        return same([](C x) { return -x; });
      else
        return same([](C x) { return wrap_sub<C>(0, x); });
    case Op::Abs:
      if constexpr (floating_v<T>)
        return same([](C x) { return std::fabs(x); });
      else
        return same([](C x) { return x < 0 ? wrap_sub<C>(0, x) : x; });
    case Op::Exp:
      return math([](auto x) { return std::exp(x); });
    case Op::Exp2:
      return math([](auto x) { return std::exp2(x); });
    case Op::Log:
      return math([](auto x) { return std::log(x); });
    case Op::Log2:
      return math([](auto x) { return std::log2(x); });
    case Op::Log1p:
      return math([](auto x) { return std::log1p(x); });
    case Op::Expm1:
      return math([](auto x) { return std::expm1(x); });
    case Op::Sqrt:
      return math([](auto x) { return std::sqrt(x); });
    case Op::Rsqrt:
      return math([](auto x) { return decltype(x)(1) / std::sqrt(x); });
    case Op::Sin:
      return math([](auto x) { return std::sin(x); });
    case Op::Cos:
      return math([](auto x) { return std::cos(x); });
    case Op::Tan:
      return math([](auto x) { return std::tan(x); });
    case Op::Tanh:
      return math([](auto x) { return std::tanh(x); });
    case Op::Erf:
      return math([](auto x) { return std::erf(x); });
    case Op::Erfc:
      return math([](auto x) { return std::erfc(x); });
    case Op::Lgamma:
      return math([](auto x) { return std::lgamma(x); });
    case Op::Atan:
      return math([](auto x) { return std::atan(x); });
    case Op::Asin:
      return math([](auto x) { return std::asin(x); });
    case Op::Acos:
      return math([](auto x) { return std::acos(x); });
    case Op::BitNot:
      if constexpr (std::is_same_v<T, bool>)
        return map_unary<T>(a, o, shape, [](T x) -> bool { return !x; });
      else if constexpr (!floating_v<T>)
        return same([](C x) { return static_cast<C>(~x); });
      else
        unsupported(n, in_dtype);
    case Op::Floor:
      if constexpr (floating_v<T>)
        return same([](C x) { return std::floor(x); });
      else
        return identity();
    case Op::Ceil:
      if constexpr (floating_v<T>)
        return same([](C x) { return std::ceil(x); });
      else
        return identity();
    case Op::Round:
      // nearbyint in the default rounding mode: halves to even, as torch.round.
      if constexpr (floating_v<T>)
        return same([](C x) { return std::nearbyint(x); });
      else
        return identity();
    case Op::Not:
      return map_unary<T>(a, o, shape, [](T x) -> bool { return load(x) == 0; });
    case Op::IsNan:
      return map_unary<T>(a, o, shape, [](T x) -> bool {
        if constexpr (floating_v<T>)
          return std::isnan(load(x));
        else
          return false;
      });
    case Op::IsInf:
      return map_unary<T>(a, o, shape, [](T x) -> bool {
        if constexpr (floating_v<T>)
          return std::isinf(load(x));
        else
          return false;
      });
    case Op::Cast:
      return visit_dtype(n.dtype, [&](auto out_tag) {
        using D = decltype(out_tag);
        map_unary<T>(a, o, shape, [](T x) { return cast_value<D>(x); });
      });
    default:
      break;
  }
  throw Error(std::string("reference executor: not a unary op: ") + ir::op_name(n.op));
}

template <class T>
inline void exec_binary(const ir::GraphNode& n, const Value& a, const Value& b, Value& o) {
  using C = compute_t<T>;
  const Shape& shape = n.shape;
  const T* pa = reinterpret_cast<const T*>(a.data);
  const T* pb = reinterpret_cast<const T*>(b.data);
  auto arith = [&](auto f) {
    map2(reinterpret_cast<T*>(o.data), o.strides, pa, a.strides, pb, b.strides, shape,
         [f](T x, T y) { return store<T>(f(load(x), load(y))); });
  };
  auto test = [&](auto f) {
    map2(reinterpret_cast<bool*>(o.data), o.strides, pa, a.strides, pb, b.strides, shape,
         [f](T x, T y) -> bool { return f(load(x), load(y)); });
  };
  constexpr bool fl = floating_v<T>;
  switch (n.op) {
    case Op::Add:
      if constexpr (fl)
        return arith([](C x, C y) { return x + y; });
      else
        return arith([](C x, C y) { return wrap_add(x, y); });
    case Op::Sub:
      if constexpr (fl)
        return arith([](C x, C y) { return x - y; });
      else
        return arith([](C x, C y) { return wrap_sub(x, y); });
    case Op::Mul:
      if constexpr (fl)
        return arith([](C x, C y) { return x * y; });
      else
        return arith([](C x, C y) { return wrap_mul(x, y); });
    case Op::Div:
      if constexpr (fl)
        return arith([](C x, C y) { return x / y; });
      else
        return arith([](C x, C y) { return int_div(x, y); });
    case Op::Pow:
      if constexpr (fl)
        return arith([](C x, C y) { return std::pow(x, y); });
      else
        return arith([](C x, C y) { return int_pow(x, y); });
    case Op::Maximum:
      if constexpr (fl)
        return arith([](C x, C y) { return x != x ? x : y != y ? y : (x < y ? y : x); });
      else
        return arith([](C x, C y) { return x < y ? y : x; });
    case Op::Minimum:
      if constexpr (fl)
        return arith([](C x, C y) { return x != x ? x : y != y ? y : (y < x ? y : x); });
      else
        return arith([](C x, C y) { return y < x ? y : x; });
    case Op::Eq:
      return test([](C x, C y) { return x == y; });
    case Op::Ne:
      return test([](C x, C y) { return x != y; });
    case Op::Lt:
      return test([](C x, C y) { return x < y; });
    case Op::Le:
      return test([](C x, C y) { return x <= y; });
    case Op::Gt:
      return test([](C x, C y) { return x > y; });
    case Op::Ge:
      return test([](C x, C y) { return x >= y; });
    case Op::And:
      return test([](C x, C y) { return x != 0 && y != 0; });
    case Op::Or:
      return test([](C x, C y) { return x != 0 || y != 0; });
    case Op::Atan2:
      if constexpr (fl)
        return arith([](C x, C y) { return std::atan2(x, y); });
      else
        break;
    case Op::Hypot:
      if constexpr (fl)
        return arith([](C x, C y) { return std::hypot(x, y); });
      else
        break;
    case Op::Copysign:
      if constexpr (fl)
        return arith([](C x, C y) { return std::copysign(x, y); });
      else
        break;
    case Op::Fmod:
      if constexpr (fl)
        return arith([](C x, C y) { return std::fmod(x, y); });
      else if constexpr (!std::is_same_v<T, bool>)
        return arith([](C x, C y) { return int_fmod(x, y); });
      else
        break;
    case Op::BitAnd:
      if constexpr (!fl)
        return arith([](C x, C y) { return static_cast<C>(x & y); });
      else
        break;
    case Op::BitOr:
      if constexpr (!fl)
        return arith([](C x, C y) { return static_cast<C>(x | y); });
      else
        break;
    case Op::BitXor:
      if constexpr (!fl)
        return arith([](C x, C y) { return static_cast<C>(x ^ y); });
      else
        break;
    case Op::Shl:
      if constexpr (!fl && !std::is_same_v<T, bool>)
        return arith([](C x, C y) { return shift_left(x, y); });
      else
        break;
    case Op::Shr:
      if constexpr (!fl && !std::is_same_v<T, bool>)
        return arith([](C x, C y) { return shift_right(x, y); });
      else
        break;
    default:
      break;
  }
  // A binary primitive that broke out of the switch is not defined for T's dtype.
  if (ir::op_kind(n.op) == ir::OpKind::Binary) unsupported(n, dtype_v<T>);
  throw InternalError(std::string("reference executor: not a binary op: ") + ir::op_name(n.op));
}

// ---- reductions -----------------------------------------------------------------------------

// The reduced region of one output: `outer` positions (coalesced dims) times a strided run.
// Summation is pairwise over runs and over positions, with double accumulators, so millions
// of elements keep full float accuracy.
template <class R, class T>
struct Reduction {
  using Acc = typename R::Acc;
  static constexpr i64 kBlock = 128;
  std::vector<i64> outer_sizes, outer_strides;
  i64 n_run = 1, s_run = 0, n_outer = 1;

  i64 offset_of(i64 q) const {
    i64 off = 0;
    for (std::size_t d = outer_sizes.size(); d-- > 0;) {
      off += (q % outer_sizes[d]) * outer_strides[d];
      q /= outer_sizes[d];
    }
    return off;
  }

  // One output: the run p[0], p[s], ... (n elements, flat indices from k0).
  template <bool Unit>
  static Acc run(const T* p, i64 n, i64 s, i64 k0) {
    const i64 st = Unit ? 1 : s;
    if (n > kBlock) {
      i64 half = (n / 2 + 7) / 8 * 8;
      Acc l = run<Unit>(p, half, s, k0);
      return R::merge(l, run<Unit>(p + half * st, n - half, s, k0 + half));
    }
    // Eight independent partials let the compiler vectorise the block.
    Acc part[8];
    for (auto& x : part) x = R::init();
    i64 j = 0;
    for (; j + 8 <= n; j += 8)
      for (int u = 0; u < 8; ++u) part[u] = R::step(part[u], p[(j + u) * st], k0 + j + u);
    Acc tail = R::init();
    for (; j < n; ++j) tail = R::step(tail, p[j * st], k0 + j);
    Acc a = R::merge(R::merge(part[0], part[1]), R::merge(part[2], part[3]));
    Acc b = R::merge(R::merge(part[4], part[5]), R::merge(part[6], part[7]));
    return R::merge(R::merge(a, b), tail);
  }

  Acc outer(const T* base, i64 lo, i64 hi) const {
    if (hi - lo == 1) {
      const T* p = base + offset_of(lo);
      return s_run == 1 ? run<true>(p, n_run, 1, lo * n_run) : run<false>(p, n_run, s_run, lo * n_run);
    }
    i64 mid = lo + (hi - lo) / 2;
    Acc l = outer(base, lo, mid);
    return R::merge(l, outer(base, mid, hi));
  }

  // `w` neighbouring outputs at once: lane l reads p[j * s + l], so each row of the reduced
  // run is one contiguous chunk (reductions across the rows of a dense tensor).
  static void run_wide(const T* p, i64 n, i64 s, i64 k0, i64 w, Acc* res) {
    if (n > kBlock) {
      i64 half = (n / 2 + 7) / 8 * 8;
      std::vector<Acc> r(static_cast<std::size_t>(w));
      run_wide(p, half, s, k0, w, res);
      run_wide(p + half * s, n - half, s, k0 + half, w, r.data());
      for (i64 l = 0; l < w; ++l) res[l] = R::merge(res[l], r[static_cast<std::size_t>(l)]);
      return;
    }
    for (i64 l = 0; l < w; ++l) res[l] = R::init();
    for (i64 j = 0; j < n; ++j) {
      const T* __restrict row = p + j * s;
      const i64 k = k0 + j;
      for (i64 l = 0; l < w; ++l) res[l] = R::step(res[l], row[l], k);
    }
  }

  void outer_wide(const T* base, i64 lo, i64 hi, i64 w, Acc* res) const {
    if (hi - lo == 1) return run_wide(base + offset_of(lo), n_run, s_run, lo * n_run, w, res);
    i64 mid = lo + (hi - lo) / 2;
    std::vector<Acc> r(static_cast<std::size_t>(w));
    outer_wide(base, lo, mid, w, res);
    outer_wide(base, mid, hi, w, r.data());
    for (i64 l = 0; l < w; ++l) res[l] = R::merge(res[l], r[static_cast<std::size_t>(l)]);
  }
};

template <class R, class T>
inline void reduce_kernel(const ir::GraphNode& n, const Shape& in_shape, const Value& in, Value& o) {
  using Out = typename R::Out;
  using Acc = typename R::Acc;
  constexpr i64 kTile = 1024;  // outputs reduced together on the wide path (accumulators stay in L1)
  const auto& axes = n.attrs.ints;
  Shape kshape, rshape;
  Strides kin, kout, rin;
  for (std::size_t d = 0; d < in_shape.size(); ++d) {
    if (std::find(axes.begin(), axes.end(), static_cast<i64>(d)) != axes.end()) {
      rshape.push_back(in_shape[d]);
      rin.push_back(in.strides[d]);
    } else {
      kshape.push_back(in_shape[d]);
      kin.push_back(in.strides[d]);
      kout.push_back(o.strides[d]);
    }
  }
  if (kshape.numel() == 0) return;
  const T* p = reinterpret_cast<const T*>(in.data);
  Out* out = reinterpret_cast<Out*>(o.data);
  Loop<2> kl = make_loop<2>(kshape, {kin.data(), kout.data()});
  if (rshape.numel() == 0) {
    const Out v = R::finish(R::init());
    for_each_row(kl, kshape.numel(), [&](const std::array<i64, 2>& off, i64 cnt, const std::array<i64, 2>& s) {
      for (i64 j = 0; j < cnt; ++j) out[off[1] + j * s[1]] = v;
    });
    return;
  }
  Reduction<R, T> red;
  Loop<1> rl = make_loop<1>(rshape, {rin.data()});
  if (!rl.sizes.empty()) {
    red.n_run = rl.sizes.back();
    red.s_run = rl.strides.back()[0];
    for (std::size_t d = 0; d + 1 < rl.sizes.size(); ++d) {
      red.outer_sizes.push_back(rl.sizes[d]);
      red.outer_strides.push_back(rl.strides[d][0]);
      red.n_outer *= rl.sizes[d];
    }
  }
  for_each_row(kl, kshape.numel(), [&](const std::array<i64, 2>& off, i64 cnt, const std::array<i64, 2>& s) {
    const T* pb = p + off[0];
    Out* ob = out + off[1];
    if (s[0] == 1 && red.s_run != 1 && cnt > 1) {
      // Reducing across rows: read rows, not columns (one element per cache line and page).
      std::vector<Acc> acc(static_cast<std::size_t>(std::min(cnt, kTile)));
      for (i64 j = 0; j < cnt; j += kTile) {
        const i64 w = std::min(kTile, cnt - j);
        red.outer_wide(pb + j, 0, red.n_outer, w, acc.data());
        for (i64 l = 0; l < w; ++l) ob[(j + l) * s[1]] = R::finish(acc[static_cast<std::size_t>(l)]);
      }
      return;
    }
    for (i64 j = 0; j < cnt; ++j) ob[j * s[1]] = R::finish(red.outer(pb + j * s[0], 0, red.n_outer));
  });
}

template <class T>
inline void exec_reduce(const ir::GraphNode& n, const Shape& in_shape, const Value& in, Value& o) {
  switch (n.op) {
    case Op::ReduceSum:
      return reduce_kernel<SumProd<T, false>, T>(n, in_shape, in, o);
    case Op::ReduceProd:
      return reduce_kernel<SumProd<T, true>, T>(n, in_shape, in, o);
    case Op::ReduceMax:
      return reduce_kernel<Extreme<T, true>, T>(n, in_shape, in, o);
    case Op::ReduceMin:
      return reduce_kernel<Extreme<T, false>, T>(n, in_shape, in, o);
    case Op::ArgMax:
      return reduce_kernel<ArgExtreme<T, true>, T>(n, in_shape, in, o);
    case Op::ArgMin:
      return reduce_kernel<ArgExtreme<T, false>, T>(n, in_shape, in, o);
    default:
      break;
  }
  throw Error(std::string("reference executor: not a reduction: ") + ir::op_name(n.op));
}

// ---- leaves ---------------------------------------------------------------------------------

// `into`, when given, is where the node's value goes (an output buffer, any strides).
/// Matrix product a [..., M, K] x b [..., K, N] of floating T: every element a dot product
/// accumulated in double (the reference every library product is tested against), rounded
/// once to T.
template <class T>
inline void exec_matmul(const ir::GraphNode& n, const Shape& a_shape, const Value& a, const Value& b, Value& o) {
  if constexpr (!floating_v<T>) {
    throw DTypeError(std::string("matmul: defined on floating dtypes only, not ") + dtype_name(n.dtype));
  } else {
    const std::size_t r = n.shape.size();
    const i64 M = n.shape[r - 2], N = n.shape[r - 1], K = a_shape[r - 1];
    Shape batch(std::vector<i64>(n.shape.begin(), n.shape.end() - 2));
    const i64 batches = batch.numel();
    const T* A = reinterpret_cast<const T*>(a.data);
    const T* B = reinterpret_cast<const T*>(b.data);
    T* O = reinterpret_cast<T*>(o.data);
    std::vector<i64> bi(batch.size(), 0);
    for (i64 t = 0; t < batches; ++t) {
      i64 ao = 0, bo = 0, oo = 0;
      for (std::size_t d = 0; d < bi.size(); ++d) {
        ao += bi[d] * a.strides[d];
        bo += bi[d] * b.strides[d];
        oo += bi[d] * o.strides[d];
      }
      for (i64 i = 0; i < M; ++i)
        for (i64 j = 0; j < N; ++j) {
          double acc = 0;
          for (i64 p = 0; p < K; ++p)
            acc += static_cast<double>(load(A[ao + i * a.strides[r - 2] + p * a.strides[r - 1]])) *
                   static_cast<double>(load(B[bo + p * b.strides[r - 2] + j * b.strides[r - 1]]));
          O[oo + i * o.strides[r - 2] + j * o.strides[r - 1]] = store<T>(static_cast<compute_t<T>>(acc));
        }
      for (std::size_t d = bi.size(); d-- > 0;) {
        if (++bi[d] < batch[d]) break;
        bi[d] = 0;
      }
    }
  }
}

inline Value exec_leaf(const ir::GraphNode& n, const Value* into, const Value* seed_input = nullptr) {
  if (n.op == Op::Constant) {
    // One element, broadcast with zero strides.
    Value v = allocate(Shape{}, n.dtype);
    v.strides.assign(n.shape.size(), 0);
    visit_dtype(n.dtype, [&](auto tag) {
      using T = decltype(tag);
      T x;
      if constexpr (floating_v<T>)
        x = cast_value<T>(n.attrs.scalar);
      else
        x = cast_value<T>(n.attrs.iscalar);
      std::memcpy(v.data, &x, sizeof(T));
    });
    return v;
  }
  if (n.op == Op::Iota) {
    // The values along the axis once; zero strides elsewhere.
    const i64 axis = n.attrs.ints.at(0);
    const i64 len = n.shape.at(static_cast<std::size_t>(axis));
    Value v = allocate(Shape{len}, n.dtype);
    v.strides.assign(n.shape.size(), 0);
    v.strides[static_cast<std::size_t>(axis)] = 1;
    visit_dtype(n.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* p = reinterpret_cast<T*>(v.data);
      for (i64 j = 0; j < len; ++j) p[j] = cast_value<T>(j);
    });
    return v;
  }
  // Random: element with flat row-major index i uses Philox counter i.
  if (!is_floating(n.dtype))
    throw DTypeError(std::string("reference executor: random of dtype ") + dtype_name(n.dtype) + " (shape " +
                     n.shape.str() + "): only floating dtypes");
  const bool normal = !n.attrs.ints.empty() && n.attrs.ints[0] == 1;
  // A seed passed as a 0-dim int64 input (a kernel argument, so every seed shares one kernel).
  std::uint64_t seed = n.attrs.seed;
  if (seed_input) std::memcpy(&seed, seed_input->data, sizeof seed);
  const i64 count = n.shape.numel();
  Value v = into ? *into : allocate(n.shape, n.dtype);
  // Rows come in row-major order, so a running counter is the flat index.
  Loop<1> l = make_loop<1>(n.shape, {v.strides.data()});
  auto fill = [&](auto* base, auto gen) {
    unsigned long long i = 0;
    for_each_row(l, count, [&](const std::array<i64, 1>& off, i64 len, const std::array<i64, 1>& s) {
      auto* p = base + off[0];
      if (s[0] == 1) {
        for (i64 j = 0; j < len; ++j) p[j] = gen(i + static_cast<unsigned long long>(j));
      } else {
        for (i64 j = 0; j < len; ++j) p[j * s[0]] = gen(i + static_cast<unsigned long long>(j));
      }
      i += static_cast<unsigned long long>(len);
    });
  };
  switch (n.dtype) {
    case DType::Float32:
      if (normal)
        fill(reinterpret_cast<float*>(v.data), [&](unsigned long long i) { return philox::normal_f32(seed, i); });
      else
        fill(reinterpret_cast<float*>(v.data), [&](unsigned long long i) { return philox::uniform_f32(seed, i); });
      break;
    case DType::Float64:
      if (normal)
        fill(reinterpret_cast<double*>(v.data), [&](unsigned long long i) { return philox::normal_f64(seed, i); });
      else
        fill(reinterpret_cast<double*>(v.data), [&](unsigned long long i) { return philox::uniform_f64(seed, i); });
      break;
    case DType::Float16:
      if (normal)
        fill(reinterpret_cast<Half*>(v.data), [&](unsigned long long i) { return Half(philox::normal_f32(seed, i)); });
      else
        fill(reinterpret_cast<Half*>(v.data), [&](unsigned long long i) { return Half(philox::uniform_f16(seed, i)); });
      break;
    default:  // BFloat16
      if (normal)
        fill(reinterpret_cast<BFloat16*>(v.data),
             [&](unsigned long long i) { return BFloat16(philox::normal_f32(seed, i)); });
      else
        fill(reinterpret_cast<BFloat16*>(v.data),
             [&](unsigned long long i) { return BFloat16(philox::uniform_bf16(seed, i)); });
      break;
  }
  return v;
}

// ---- index maps -----------------------------------------------------------------------------

inline Value exec_index_map(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals,
                            const Value* into) {
  const ir::GraphNode& src = g.nodes[static_cast<std::size_t>(n.inputs[0])];
  const Value& a = vals[static_cast<std::size_t>(n.inputs[0])];
  const i64 isz = static_cast<i64>(itemsize(n.dtype));
  switch (n.op) {
    case Op::Broadcast: {
      Value v = a;
      for (std::size_t d = 0; d < n.shape.size(); ++d)
        if (src.shape[d] != n.shape[d]) v.strides[d] = 0;
      return v;
    }
    case Op::Permute: {
      Value v = a;
      for (std::size_t d = 0; d < n.shape.size(); ++d)
        v.strides[d] = a.strides[static_cast<std::size_t>(n.attrs.ints[d])];
      return v;
    }
    case Op::Slice: {
      const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
      const i64 start = n.attrs.ints.at(1), step = n.attrs.ints.at(2);
      Value v = a;
      if (n.shape.numel() > 0) v.data += start * a.strides[axis] * isz;
      v.strides[axis] = a.strides[axis] * step;
      return v;
    }
    case Op::Reshape: {
      if (auto st = ir::view_strides(src.shape, a.strides, n.shape)) {
        Value v = a;
        v.strides = std::move(*st);
        return v;
      }
      Value v = materialize(a, src.shape, n.dtype);
      v.strides = contiguous_strides(n.shape);
      return v;
    }
    case Op::Concat: {
      const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
      Value out = into ? *into : allocate(n.shape, n.dtype);
      i64 pos = 0;
      for (auto in : n.inputs) {
        const ir::GraphNode& part = g.nodes[static_cast<std::size_t>(in)];
        if (part.shape.numel() > 0)
          copy_value(vals[static_cast<std::size_t>(in)], out.data + pos * out.strides[axis] * isz, out.strides,
                     part.shape, n.dtype);
        pos += part.shape[axis];
      }
      return out;
    }
    default:
      break;
  }
  throw Error(std::string("reference executor: not an index map: ") + ir::op_name(n.op));
}

/// Calls f(pos) for every position of `shape`, row-major (pos: one coordinate per dim).
template <class F>
inline void for_each_position(const Shape& shape, F&& f) {
  std::vector<i64> pos(shape.size(), 0);
  for (i64 flat = 0; flat < shape.numel(); ++flat) {
    f(static_cast<const std::vector<i64>&>(pos));
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++pos[d] < shape[d]) break;
      pos[d] = 0;
    }
  }
}

/// sum pos[d] * strides[d].
inline i64 offset_at(const std::vector<i64>& pos, const Strides& strides) {
  i64 off = 0;
  for (std::size_t d = 0; d < pos.size(); ++d) off += pos[d] * strides[d];
  return off;
}

/// out[p] = x[p with p[axis] = index[p]], every index checked first (an IndexError names the op
/// and writes nothing).
inline Value exec_gather(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals,
                         const Value* into) {
  const ir::GraphNode& xn = g.nodes[static_cast<std::size_t>(n.inputs[0])];
  const Value& x = vals[static_cast<std::size_t>(n.inputs[0])];
  const Value& index = vals[static_cast<std::size_t>(n.inputs[1])];
  const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
  const i64 bound = xn.shape[axis];
  auto for_each = [&](auto&& f) { for_each_position(n.shape, f); };
  auto at = [](const std::vector<i64>& pos, const Strides& st) { return offset_at(pos, st); };
  const auto* ip = reinterpret_cast<const std::int64_t*>(index.data);
  for_each([&](const std::vector<i64>& pos) {
    const i64 v = ip[at(pos, index.strides)];
    if (v < 0 || v >= bound) {
      const ir::GraphNode& in = g.nodes[static_cast<std::size_t>(n.inputs[1])];
      throw IndexError(std::string(ir::gather_site_name(n.attrs.ints.at(1))) + ": index " + std::to_string(v) +
                       " is out of bounds for dimension " + std::to_string(axis) + " with size " +
                       std::to_string(bound) + " (input " + dtype_name(xn.dtype) + xn.shape.str() + ", index " +
                       dtype_name(in.dtype) + in.shape.str() + ")");
    }
  });
  Value o = into ? *into : allocate(n.shape, n.dtype);
  const std::size_t isz = itemsize(n.dtype);
  for_each([&](const std::vector<i64>& pos) {
    std::vector<i64> src = pos;
    src[axis] = ip[at(pos, index.strides)];
    std::memcpy(o.data + at(pos, o.strides) * static_cast<i64>(isz), x.data + at(src, x.strides) * static_cast<i64>(isz),
                isz);
  });
  return o;
}

/// a + b as the Add primitive computes it in dtype T (half types rounded once, integers wrap,
/// bool is or).
template <class T>
inline T scatter_sum(T a, T b) {
  if constexpr (std::is_same_v<T, bool>)
    return a || b;
  else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(a) + static_cast<float>(b));
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) + static_cast<std::make_unsigned_t<T>>(b));
  else
    return a + b;
}

/// out = base, then src written (or added) at index along the axis, in index order; every index
/// checked before anything is written.
inline Value exec_scatter(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals,
                          const Value* into) {
  const Value& base = vals[static_cast<std::size_t>(n.inputs[0])];
  const Value& index = vals[static_cast<std::size_t>(n.inputs[1])];
  const Value& src = vals[static_cast<std::size_t>(n.inputs[2])];
  const ir::GraphNode& in = g.nodes[static_cast<std::size_t>(n.inputs[1])];
  const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
  const bool accumulate = n.attrs.ints.at(1) != 0;
  const i64 bound = n.shape[axis];
  const Shape& is = in.shape;
  auto for_each = [&](auto&& f) { for_each_position(is, f); };
  auto at = [](const std::vector<i64>& pos, const Strides& st) { return offset_at(pos, st); };
  const auto* ip = reinterpret_cast<const std::int64_t*>(index.data);
  for_each([&](const std::vector<i64>& pos) {
    const i64 v = ip[at(pos, index.strides)];
    if (v < 0 || v >= bound)
      throw IndexError(std::string(ir::gather_site_name(n.attrs.ints.at(3))) + ": index " + std::to_string(v) +
                       " is out of bounds for dimension " + std::to_string(axis) + " with size " +
                       std::to_string(bound) + " (output " + dtype_name(n.dtype) + n.shape.str() + ", index " +
                       dtype_name(in.dtype) + is.str() + ")");
  });
  Value o = into ? *into : allocate(n.shape, n.dtype);
  copy_value(base, o.data, o.strides, n.shape, n.dtype);
  visit_dtype(n.dtype, [&](auto tag) {
    using T = decltype(tag);
    T* out = reinterpret_cast<T*>(o.data);
    const T* sp = reinterpret_cast<const T*>(src.data);
    for_each([&](const std::vector<i64>& pos) {
      std::vector<i64> q = pos;
      q[axis] = ip[at(pos, index.strides)];
      T& dst = out[at(q, o.strides)];
      const T v = sp[at(pos, src.strides)];
      dst = accumulate ? scatter_sum<T>(dst, v) : v;
    });
  });
  return o;
}

/// The running sum / product / max / min / arg / log-sum-exp along the axis (ir::ScanKind),
/// each row walked in order; floats in double, rounded once per prefix; integers exactly.
inline Value exec_scan(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals, const Value* into) {
  const ir::GraphNode& xn = g.nodes[static_cast<std::size_t>(n.inputs[0])];
  const Value& x = vals[static_cast<std::size_t>(n.inputs[0])];
  const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
  const auto kind = static_cast<ir::ScanKind>(n.attrs.ints.at(1));
  Value o = into ? *into : allocate(n.shape, n.dtype);
  const Shape& shape = n.shape;
  const i64 len = shape[axis];
  Shape others = shape;
  others[axis] = 1;
  std::vector<i64> pos(shape.size(), 0);
  visit_dtype(xn.dtype, [&](auto xtag) {
    using X = decltype(xtag);
    visit_dtype(n.dtype, [&](auto otag) {
      using O = decltype(otag);
      const X* xp = reinterpret_cast<const X*>(x.data);
      O* op = reinterpret_cast<O*>(o.data);
      for (i64 row = 0; row < others.numel(); ++row) {
        i64 xo = 0, oo = 0;
        for (std::size_t d = 0; d < shape.size(); ++d) {
          xo += pos[d] * x.strides[d];
          oo += pos[d] * o.strides[d];
        }
        double acc = 0;
        std::uint64_t iacc = 0;
        X best{};
        i64 best_at = 0;
        for (i64 i = 0; i < len; ++i) {
          const X v = xp[xo + i * x.strides[axis]];
          O& dst = op[oo + i * o.strides[axis]];
          switch (kind) {
            case ir::ScanKind::Sum:
            case ir::ScanKind::Prod:
              if constexpr (std::is_floating_point_v<X> || std::is_same_v<X, Half> || std::is_same_v<X, BFloat16>) {
                const double dv = static_cast<double>(static_cast<float>(v));
                const double exact = std::is_same_v<X, double> ? static_cast<double>(v) : dv;
                // From the empty prefix (0 or 1), as torch accumulates: cumsum of -0.0 is +0.0.
                const double before = i == 0 ? (kind == ir::ScanKind::Sum ? 0.0 : 1.0) : acc;
                acc = kind == ir::ScanKind::Sum ? before + exact : before * exact;
                dst = static_cast<O>(static_cast<float>(acc));
                if constexpr (std::is_same_v<O, double>) dst = acc;
              } else {
                const auto iv = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
                iacc = i == 0 ? iv : kind == ir::ScanKind::Sum ? iacc + iv : iacc * iv;
                if constexpr (std::is_same_v<O, std::int64_t>) dst = static_cast<O>(iacc);
              }
              break;
            case ir::ScanKind::LogSumExp:
              if constexpr (std::is_floating_point_v<X> || std::is_same_v<X, Half> || std::is_same_v<X, BFloat16>) {
                const double dv = std::is_same_v<X, double> ? static_cast<double>(v) : static_cast<double>(static_cast<float>(v));
                if (i == 0) {
                  acc = dv;
                } else {
                  const double m = std::max(acc, dv);
                  acc = std::isnan(acc) || std::isnan(dv) ? std::numeric_limits<double>::quiet_NaN()
                        : std::isinf(m) && m < 0     ? m
                        : std::isinf(m)              ? (acc == dv ? m : m)
                                                     : m + std::log1p(std::exp(-std::fabs(acc - dv)));
                }
                dst = static_cast<O>(static_cast<float>(acc));
                if constexpr (std::is_same_v<O, double>) dst = acc;
              }
              break;
            default: {
              const bool is_max = kind == ir::ScanKind::Max || kind == ir::ScanKind::ArgMax;
              auto isnan = [](X a) {
                if constexpr (std::is_integral_v<X>) return false;
                else return std::isnan(static_cast<double>(static_cast<float>(a)));
              };
              auto ge = [&](X a, X b) {  // a >= b (max) or a <= b (min), in X's order
                if constexpr (std::is_same_v<X, Half> || std::is_same_v<X, BFloat16>)
                  return is_max ? static_cast<float>(a) >= static_cast<float>(b) : static_cast<float>(a) <= static_cast<float>(b);
                else
                  return is_max ? a >= b : a <= b;
              };
              if (i == 0 || (!isnan(best) && (isnan(v) || ge(v, best)))) {
                best = v;
                best_at = i;
              }
              if (kind == ir::ScanKind::ArgMax || kind == ir::ScanKind::ArgMin) {
                if constexpr (std::is_same_v<O, std::int64_t>) dst = best_at;
              } else if constexpr (std::is_same_v<O, X>) {
                dst = best;
              }
            }
          }
        }
        for (std::size_t d = shape.size(); d-- > 0;) {
          if (d == axis) continue;
          if (++pos[d] < shape[d]) break;
          pos[d] = 0;
        }
      }
    });
  });
  return o;
}

/// The positions of each row's k first elements in sorted order: a stable sort of the row's
/// positions by value (NaN the largest, -0 equal to +0), ascending or descending.
inline Value exec_sort(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals, const Value* into) {
  const ir::GraphNode& xn = g.nodes[static_cast<std::size_t>(n.inputs[0])];
  const Value& x = vals[static_cast<std::size_t>(n.inputs[0])];
  const auto axis = static_cast<std::size_t>(n.attrs.ints.at(0));
  const i64 k = n.attrs.ints.at(1);
  const bool descending = n.attrs.ints.at(2) != 0;
  Value o = into ? *into : allocate(n.shape, n.dtype);
  const i64 len = xn.shape[axis];
  Shape others = n.shape;
  others[axis] = 1;
  auto* op = reinterpret_cast<std::int64_t*>(o.data);
  visit_dtype(xn.dtype, [&](auto tag) {
    using X = decltype(tag);
    const X* xp = reinterpret_cast<const X*>(x.data);
    std::vector<i64> order(static_cast<std::size_t>(len));
    std::vector<double> keys(static_cast<std::size_t>(len));
    for_each_position(others, [&](const std::vector<i64>& pos) {
      const i64 xo = offset_at(pos, x.strides), oo = offset_at(pos, o.strides);
      for (i64 i = 0; i < len; ++i) {
        order[static_cast<std::size_t>(i)] = i;
        const X v = xp[xo + i * x.strides[axis]];
        if constexpr (std::is_integral_v<X>)
          keys[static_cast<std::size_t>(i)] = static_cast<double>(v);  // only compared: int64 order kept below
        else
          keys[static_cast<std::size_t>(i)] = std::is_same_v<X, double> ? static_cast<double>(v)
                                                                        : static_cast<double>(static_cast<float>(v));
      }
      auto less = [&](i64 a, i64 b) {
        if constexpr (std::is_integral_v<X>) {
          return xp[xo + a * x.strides[axis]] < xp[xo + b * x.strides[axis]];
        } else {
          const double va = keys[static_cast<std::size_t>(a)], vb = keys[static_cast<std::size_t>(b)];
          return std::isnan(vb) ? !std::isnan(va) : va < vb;
        }
      };
      std::stable_sort(order.begin(), order.end(), [&](i64 a, i64 b) { return descending ? less(b, a) : less(a, b); });
      for (i64 j = 0; j < k; ++j) op[oo + j * o.strides[axis]] = order[static_cast<std::size_t>(j)];
    });
  });
  return o;
}

/// One value of fused attention (ir::AttentionRole), from its definition in double: the scores
/// s = scale q·k + mask (causal: -inf past the diagonal), P = softmax over keys (0 for a row
/// whose keys are all masked); the gradients from the operands out and dout, P recomputed.
/// Dropout multiplies P's kept elements by 1 / (1 - p) after the lse, as ir::Op::Attention says.
inline Value exec_attention(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals,
                            const Value* into) {
  const ir::AttentionAttrs attrs = ir::AttentionAttrs::of(n.attrs);
  const auto role = attrs.role;
  const bool causal = attrs.causal, has_mask = attrs.has_mask;
  const bool backward = role != ir::AttentionRole::Out && role != ir::AttentionRole::Lse;
  auto node = [&](std::size_t k) -> const ir::GraphNode& { return g.nodes[static_cast<std::size_t>(n.inputs[k])]; };
  auto val = [&](std::size_t k) -> const Value& { return vals[static_cast<std::size_t>(n.inputs[k])]; };
  // Operand k read once into doubles, row-major in its shape: the loops below index plain rows
  // (reading each element through its dtype and strides there cost a dispatch per multiply).
  auto dense = [&](std::size_t k) {
    const Value& v = val(k);
    std::vector<double> out(static_cast<std::size_t>(node(k).shape.numel()));
    std::size_t f = 0;
    visit_dtype(node(k).dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* data = reinterpret_cast<const T*>(v.data);
      for_each_position(node(k).shape, [&](const std::vector<i64>& pos) {
        out[f++] = static_cast<double>(load(data[offset_at(pos, v.strides)]));
      });
    });
    return out;
  };
  const Shape &qs = node(0).shape, &ks = node(1).shape, &vs = node(2).shape;
  const i64 B = qs[0], H = qs[1], L = qs[2], E = qs[3], Hkv = ks[1], S = ks[2], Ev = vs[3], G = Hkv > 0 ? H / Hkv : 1;
  const double scale = n.attrs.scalar;
  const std::size_t mask_at = has_mask ? static_cast<std::size_t>(attrs.mask_input()) : 0;
  const std::vector<double> q = dense(0), k = dense(1);
  const std::vector<double> v = role == ir::AttentionRole::Lse || role == ir::AttentionRole::DV ? std::vector<double>{} : dense(2);
  // The backward roles read the forward's output (3) and its gradient (4).
  const std::vector<double> out = backward ? dense(3) : std::vector<double>{};
  const std::vector<double> dout = backward ? dense(4) : std::vector<double>{};
  const std::vector<double> mask = has_mask ? dense(mask_at) : std::vector<double>{};
  const Shape mask_shape = has_mask ? node(mask_at).shape : Shape{1, 1, 1, 1};
  std::uint64_t key = 0;
  if (attrs.has_dropout()) std::memcpy(&key, val(static_cast<std::size_t>(attrs.seed_input())).data, sizeof key);
  const float keep_from = static_cast<float>(attrs.dropout_p);
  const double keep_scale = 1.0 / (1.0 - attrs.dropout_p);
  Value o = into ? *into : allocate(n.shape, n.dtype);
  std::vector<double> result(static_cast<std::size_t>(n.shape.numel()), 0.0);
  std::vector<double> p(static_cast<std::size_t>(L * S)), lse(static_cast<std::size_t>(L));
  // Dropout's factor per score: 0 or 1 / (1 - p) (1 without dropout).
  std::vector<double> kept(static_cast<std::size_t>(L * S), 1.0);
  auto at = [](const std::vector<double>& x, i64 row, i64 width) { return x.data() + row * width; };
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h) {
      const i64 hk = h / G;
      const i64 q_rows = (b * H + h) * L, kv_rows = (b * Hkv + hk) * S;  // first row of the head
      const i64 mask_rows = ((mask_shape[0] == 1 ? 0 : b) * mask_shape[1] + (mask_shape[1] == 1 ? 0 : h)) * mask_shape[2];
      for (i64 i = 0; i < L; ++i) {
        const double* qi = at(q, q_rows + i, E);
        const double* mi = has_mask ? at(mask, mask_rows + (mask_shape[2] == 1 ? 0 : i), mask_shape[3]) : nullptr;
        double mx = -INFINITY;
        for (i64 j = 0; j < S; ++j) {
          double sc = -INFINITY;
          if (!(causal && j > i)) {
            const double* kj = at(k, kv_rows + j, E);
            sc = 0;
            for (i64 e = 0; e < E; ++e) sc += qi[e] * kj[e];
            sc *= scale;
            if (has_mask) sc += mi[mask_shape[3] == 1 ? 0 : j];
          }
          p[static_cast<std::size_t>(i * S + j)] = sc;
          if (std::isnan(sc) || sc > mx) mx = sc;  // a NaN score makes the row NaN
        }
        double sum = 0;
        for (i64 j = 0; j < S; ++j) sum += mx == -INFINITY ? 0.0 : std::exp(p[static_cast<std::size_t>(i * S + j)] - mx);
        lse[static_cast<std::size_t>(i)] = sum != 0 ? mx + std::log(sum) : -INFINITY;
        // The gradients recompute P from the row's own lse in double, as the definition does: the
        // lse they are given is rounded to float, and scores near 1e30 differ from it by far
        // more than exp's range (P would be inf or 0 where it is 1).
        const double rl = lse[static_cast<std::size_t>(i)];
        for (i64 j = 0; j < S; ++j) {
          double& x = p[static_cast<std::size_t>(i * S + j)];
          x = rl == -INFINITY || x == -INFINITY ? 0.0 : std::exp(x - rl);
          if (attrs.has_dropout()) {
            const auto counter = static_cast<unsigned long long>(((b * H + h) * L + i) * S + j);
            const bool keep = philox::uniform_f32(key, counter) >= keep_from;
            kept[static_cast<std::size_t>(i * S + j)] = keep ? keep_scale : 0.0;
          }
        }
      }
      // The result's row of (head, position): [B, H, L, Ev] for the output, [B, H, L] for the
      // lse, the operand's shape for the gradients (the key and value heads for dk and dv).
      auto res = [&](i64 head, i64 row) {
        const Shape& sh = n.shape;
        const i64 width = sh.size() > 3 ? sh[3] : 1;
        return result.data() + ((b * sh[1] + head) * sh[2] + row) * width;
      };
      for (i64 i = 0; i < L; ++i) {
        const double* pi = &p[static_cast<std::size_t>(i * S)];
        const double* zi = &kept[static_cast<std::size_t>(i * S)];
        switch (role) {
          case ir::AttentionRole::Out: {
            // A row without keys is 0 (its keys are never read: an infinite value gives no NaN).
            if (lse[static_cast<std::size_t>(i)] == -INFINITY) break;
            double* ri = res(h, i);
            for (i64 e = 0; e < Ev; ++e) {
              double a = 0;
              for (i64 j = 0; j < S; ++j) a += pi[j] * zi[j] * at(v, kv_rows + j, Ev)[e];
              ri[e] = a;
            }
            break;
          }
          case ir::AttentionRole::Lse:
            *res(h, i) = lse[static_cast<std::size_t>(i)];
            break;
          default: {
            const double* oi = at(out, q_rows + i, Ev);
            const double* gi = at(dout, q_rows + i, Ev);
            double delta = 0;
            for (i64 e = 0; e < Ev; ++e) delta += gi[e] * oi[e];
            for (i64 j = 0; j < S; ++j) {
              if (pi[j] == 0) continue;
              if (role == ir::AttentionRole::DV) {
                double* rj = res(hk, j);
                for (i64 e = 0; e < Ev; ++e) rj[e] += pi[j] * zi[j] * gi[e];
                continue;
              }
              const double* vj = at(v, kv_rows + j, Ev);
              double dp = 0;
              for (i64 e = 0; e < Ev; ++e) dp += gi[e] * vj[e];
              const double ds = pi[j] * (zi[j] * dp - delta) * scale;
              if (role == ir::AttentionRole::DQ) {
                const double* kj = at(k, kv_rows + j, E);
                double* ri = res(h, i);
                for (i64 e = 0; e < E; ++e) ri[e] += ds * kj[e];
              } else {
                const double* qi = at(q, q_rows + i, E);
                double* rj = res(hk, j);
                for (i64 e = 0; e < E; ++e) rj[e] += ds * qi[e];
              }
            }
          }
        }
      }
    }
  std::size_t flat = 0;
  for_each_position(n.shape, [&](const std::vector<i64>& pos) {
    const i64 off = offset_at(pos, o.strides);
    const double x = result[flat++];
    visit_dtype(n.dtype, [&](auto tag) {
      using T = decltype(tag);
      reinterpret_cast<T*>(o.data)[off] = store<T>(static_cast<compute_t<T>>(x));
    });
  });
  return o;
}

inline Value exec_node(const ir::Graph& g, const ir::GraphNode& n, const std::vector<Value>& vals, const Value* into) {
  auto in = [&](std::size_t k) -> const Value& { return vals[static_cast<std::size_t>(n.inputs[k])]; };
  auto in_node = [&](std::size_t k) -> const ir::GraphNode& { return g.nodes[static_cast<std::size_t>(n.inputs[k])]; };
  switch (ir::op_kind(n.op)) {
    case ir::OpKind::Leaf:
      return exec_leaf(n, into, n.op == Op::Random && !n.inputs.empty() ? &in(0) : nullptr);
    case ir::OpKind::IndexMap:
      return exec_index_map(g, n, vals, into);
    case ir::OpKind::Gather:
      return exec_gather(g, n, vals, into);
    case ir::OpKind::Scatter:
      return exec_scatter(g, n, vals, into);
    case ir::OpKind::Scan:
      return exec_scan(g, n, vals, into);
    case ir::OpKind::Sort:
      return exec_sort(g, n, vals, into);
    case ir::OpKind::Attention:
      return exec_attention(g, n, vals, into);
    case ir::OpKind::Unary: {
      Value o = into ? *into : allocate(n.shape, n.dtype);
      DType dt = in_node(0).dtype;
      visit_dtype(dt, [&](auto tag) { exec_unary<decltype(tag)>(n, dt, in(0), o); });
      return o;
    }
    case ir::OpKind::Binary: {
      Value o = into ? *into : allocate(n.shape, n.dtype);
      visit_dtype(in_node(0).dtype, [&](auto tag) { exec_binary<decltype(tag)>(n, in(0), in(1), o); });
      return o;
    }
    case ir::OpKind::Ternary: {
      Value o = into ? *into : allocate(n.shape, n.dtype);
      visit_dtype(n.dtype, [&](auto tag) {
        using T = decltype(tag);
        map_where(reinterpret_cast<T*>(o.data), o.strides, reinterpret_cast<const bool*>(in(0).data), in(0).strides,
                  reinterpret_cast<const T*>(in(1).data), in(1).strides, reinterpret_cast<const T*>(in(2).data),
                  in(2).strides, n.shape);
      });
      return o;
    }
    case ir::OpKind::Reduce: {
      Value o = into ? *into : allocate(n.shape, n.dtype);
      visit_dtype(in_node(0).dtype, [&](auto tag) { exec_reduce<decltype(tag)>(n, in_node(0).shape, in(0), o); });
      return o;
    }
    case ir::OpKind::Contract: {
      Value o = into ? *into : allocate(n.shape, n.dtype);
      visit_dtype(n.dtype, [&](auto tag) { exec_matmul<decltype(tag)>(n, in_node(0).shape, in(0), in(1), o); });
      return o;
    }
  }
  throw Error(std::string("reference executor: unknown op ") + ir::op_name(n.op));
}

}  // namespace detail

/// Runs `g` primitive by primitive on the host: the semantic reference of every kiln backend.
/// Leaves are read from args.inputs (leaf order), output i is written to args.outputs[i] with
/// g.output_strides[i]. Counts one launch per primitive executed. Throws DeviceError unless
/// the graph is on the CPU, DTypeError for a primitive on a dtype it is not defined for.
inline void run_reference(const ir::Graph& g, const RunArgs& args) {
  using namespace detail;
  if (!g.device.is_cpu())
    throw DeviceError("reference executor: the graph is on " + g.device.str() + "; it runs CPU graphs only");
  if (args.outputs.size() != g.outputs.size() || g.output_strides.size() != g.outputs.size())
    throw Error("reference executor: " + std::to_string(args.outputs.size()) + " output pointers for " +
                std::to_string(g.outputs.size()) + " outputs");
  const std::size_t count = g.nodes.size();
  const std::size_t nout = g.outputs.size();
  // Index of the last node reading each node (count for outputs), so buffers go early.
  std::vector<std::size_t> last_use(count, 0);
  for (std::size_t i = 0; i < count; ++i)
    for (auto in : g.nodes[i].inputs) last_use[static_cast<std::size_t>(in)] = i;
  for (auto o : g.outputs) last_use[static_cast<std::size_t>(o)] = count;

  std::vector<ByteRange> leaf_ranges;
  for (const ir::GraphNode& n : g.nodes) {
    if (n.op != Op::Input) continue;
    if (n.leaf < 0 || static_cast<std::size_t>(n.leaf) >= args.inputs.size())
      throw Error("reference executor: no input pointer for leaf #" + std::to_string(n.leaf));
    leaf_ranges.push_back(byte_range(static_cast<const char*>(args.inputs[static_cast<std::size_t>(n.leaf)]), n.strides,
                                     n.shape, n.dtype));
  }
  std::vector<ByteRange> dst(nout);
  for (std::size_t k = 0; k < nout; ++k) {
    const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(g.outputs[k])];
    dst[k] = byte_range(static_cast<const char*>(args.outputs[k]), g.output_strides[k], n.shape, n.dtype);
  }
  // A node that computes an output writes it in place (saving a copy of the result) when that
  // memory is no leaf's and no other output's. Views and zero-stride leaves are copied at the end.
  std::vector<std::ptrdiff_t> direct(count, -1);
  for (std::size_t k = 0; k < nout; ++k) {
    const std::size_t idx = static_cast<std::size_t>(g.outputs[k]);
    const Op op = g.nodes[idx].op;
    if (direct[idx] >= 0 || op == Op::Input || op == Op::Constant || op == Op::Iota ||
        (ir::is_index_map(op) && op != Op::Concat))
      continue;
    bool free = true;
    for (auto& r : leaf_ranges) free = free && !overlaps(dst[k], r);
    for (std::size_t j = 0; j < nout; ++j) free = free && (j == k || !overlaps(dst[k], dst[j]));
    if (free) direct[idx] = static_cast<std::ptrdiff_t>(k);
  }

  std::vector<Value> vals(count);
  for (std::size_t i = 0; i < count; ++i) {
    const ir::GraphNode& n = g.nodes[i];
    if (n.op == Op::Input) {
      vals[i].data = const_cast<char*>(static_cast<const char*>(args.inputs[static_cast<std::size_t>(n.leaf)]));
      vals[i].strides = n.strides;
    } else {
      Value into;
      if (direct[i] >= 0) {
        into.data = static_cast<char*>(args.outputs[static_cast<std::size_t>(direct[i])]);
        into.strides = g.output_strides[static_cast<std::size_t>(direct[i])];
      }
      vals[i] = exec_node(g, n, vals, direct[i] >= 0 ? &into : nullptr);
      kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
    }
    for (auto in : n.inputs)
      if (last_use[static_cast<std::size_t>(in)] == i) vals[static_cast<std::size_t>(in)] = Value{};
    if (last_use[i] <= i) vals[i] = Value{};  // read by nothing
  }

  // A value still pointing into a leaf's memory may overlap an output (x.assign(x.T)): copy
  // those out before any output is written.
  std::vector<Value> outs(nout);
  for (std::size_t k = 0; k < nout; ++k) {
    const std::size_t idx = static_cast<std::size_t>(g.outputs[k]);
    if (direct[idx] == static_cast<std::ptrdiff_t>(k)) continue;
    const ir::GraphNode& n = g.nodes[idx];
    outs[k] = vals[idx];
    if (outs[k].owner) continue;
    ByteRange src = byte_range(outs[k].data, outs[k].strides, n.shape, n.dtype);
    bool alias = false;
    for (std::size_t j = 0; j < nout; ++j) alias = alias || overlaps(src, dst[j]);
    if (alias) outs[k] = materialize(outs[k], n.shape, n.dtype);
  }
  for (std::size_t k = 0; k < nout; ++k) {
    const std::size_t idx = static_cast<std::size_t>(g.outputs[k]);
    if (direct[idx] == static_cast<std::ptrdiff_t>(k)) continue;
    const ir::GraphNode& n = g.nodes[idx];
    copy_value(outs[k], static_cast<char*>(args.outputs[k]), g.output_strides[k], n.shape, n.dtype);
  }
}

}  // namespace kiln::backend

KILN_COLD_CODE_END
