#pragma once
// The fuzzer's program: a straight-line list of calls to kiln's public API over data inputs,
// kept as plain data so that it can be built on any backend, evaluated in float64, shrunk,
// and printed as C++. Nothing here calls an executor.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "../support/values.hpp"

namespace kiln::fuzz {

using testing::round_to;

// ---- random numbers -------------------------------------------------------------------------

/// splitmix64: the same stream on every platform (the standard distributions are not), so a
/// (seed, graph index) pair names one program forever.
struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform in [0, n).
  std::int64_t below(std::int64_t n) {
    return n <= 0 ? 0 : static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n));
  }
  std::int64_t range(std::int64_t lo, std::int64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(double p) { return uniform() < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(below(static_cast<std::int64_t>(v.size())))];
  }
};

/// The generator of graph `index` of campaign `seed` (independent streams per graph).
inline Rng graph_rng(std::uint64_t seed, std::uint64_t index) {
  Rng r(seed * 0x100000001b3ull ^ (index + 0x51ed27ull));
  r.next();
  return r;
}

// ---- dtypes -----------------------------------------------------------------------------------

using DTypeSet = std::uint8_t;  // bit i = DType(i)
constexpr DTypeSet bit(DType t) { return static_cast<DTypeSet>(1u << static_cast<unsigned>(t)); }
constexpr DTypeSet kAll = 0x7f;
constexpr DTypeSet kFloats = bit(f16) | bit(bf16) | bit(f32) | bit(f64);
constexpr DTypeSet kInts = bit(i32) | bit(i64);
constexpr DTypeSet kNotBool = kAll & ~bit(bool_);
constexpr bool in(DTypeSet s, DType t) { return (s & bit(t)) != 0; }

inline const DType kDTypes[] = {bool_, i32, i64, f16, bf16, f32, f64};

/// The C++ spelling of a dtype constant.
inline const char* dtype_cxx(DType t) {
  switch (t) {
    case DType::Bool:
      return "bool_";
    case DType::Int32:
      return "i32";
    case DType::Int64:
      return "i64";
    case DType::Float16:
      return "f16";
    case DType::BFloat16:
      return "bf16";
    case DType::Float32:
      return "f32";
    case DType::Float64:
      return "f64";
  }
  return "?";
}

/// The C++ element type of a dtype, as a reproducer spells it.
inline const char* ctype_cxx(DType t) {
  switch (t) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "std::int32_t";
    case DType::Int64:
      return "std::int64_t";
    case DType::Float16:
      return "Half";
    case DType::BFloat16:
      return "BFloat16";
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
  }
  return "?";
}

/// torch.finfo(t).eps (the default eps of rms_norm).
inline double dtype_eps(DType t) {
  switch (t) {
    case DType::Float16:
      return 0.0009765625;
    case DType::BFloat16:
      return 0.0078125;
    case DType::Float64:
      return 2.220446049250313e-16;
    default:
      return 1.1920928955078125e-07;
  }
}

// ---- PyTorch's type promotion, written from its definition (c10 ResultTypeState) --------------
// The fuzzer predicts every result dtype itself, so a front end that promotes wrongly is
// caught even though the JIT and the reference share that front end.

inline int category(DType t) { return t == bool_ ? 0 : (t == i32 || t == i64) ? 1 : 2; }

/// torch.promote_types.
inline DType promote(DType a, DType b) {
  if (a == b) return a;
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  if (category(a) == 1) return (a == i64 || b == i64) ? i64 : i32;
  if ((a == f16 && b == bf16) || (a == bf16 && b == f16)) return f32;
  auto rank = [](DType t) { return t == f64 ? 3 : t == f32 ? 2 : 1; };
  return rank(a) >= rank(b) ? a : b;
}

/// An operand as type promotion sees it: its dtype and tier (0 wrapped number, 1 0-dim
/// tensor, 2 tensor with dimensions).
struct Typed {
  DType dtype;
  int tier;
};

/// torch.result_type over any number of operands.
inline DType result_type(const std::vector<Typed>& ops) {
  bool has[3] = {false, false, false};
  DType dt[3] = {bool_, bool_, bool_};
  for (const Typed& o : ops) {
    dt[o.tier] = has[o.tier] ? promote(dt[o.tier], o.dtype) : o.dtype;
    has[o.tier] = true;
  }
  // combine_categories(higher, lower): a lower tier only counts when it is of a higher category.
  auto combine = [](bool& hh, DType& hi, bool hl, DType lo) {
    if (!hl) return;
    if (!hh) {
      hh = true;
      hi = lo;
      return;
    }
    if (category(hi) == 2) return;
    if (hi == bool_ || category(lo) == 2) hi = promote(hi, lo);
  };
  bool h1 = has[1];
  DType d1 = dt[1];
  combine(h1, d1, has[0], dt[0]);
  bool h2 = has[2];
  DType d2 = dt[2];
  combine(h2, d2, h1, d1);
  return d2;
}

// ---- the program ------------------------------------------------------------------------------

/// A C++ number operand ("wrapped number"): its C++ type decides its promotion.
struct Number {
  enum class Kind : std::uint8_t { Float, Double, Int, Bool } kind = Kind::Float;
  double value = 0;
  DType wrapped_dtype() const { return kind == Kind::Bool ? bool_ : kind == Kind::Int ? i64 : f32; }
};

/// How an input tensor's elements lie in memory.
enum class Layout : std::uint8_t {
  Contiguous,  ///< from_vector
  Permuted,    ///< a row-major buffer of the dims in `perm` order, viewed with permuted strides
  Strided,     ///< every step[d]-th element from start[d] of a padded buffer (gaps poisoned)
};

/// A data input: values in logical row-major order, exactly representable in `dtype`.
struct Input {
  DType dtype = f32;
  Shape shape;
  std::vector<double> values;
  Layout layout = Layout::Contiguous;
  std::vector<std::int64_t> perm;         // Permuted: buffer dim i holds logical dim perm[i]
  std::vector<std::int64_t> step, start;  // Strided
  /// kiln::compile mode: the input is an argument of the compiled function, called first with
  /// `values`, then with `values2` (same shape, dtype and layout: the replay).
  bool arg = false;
  std::vector<double> values2;
};

/// One operand of an op: an earlier value, or a C++ number.
struct Operand {
  int value = -1;  ///< index into the program's values (inputs first, then ops)
  Number number;
  bool is_number() const { return value < 0; }
};

/// Op parameters: what each descriptor's template and builder read.
struct Params {
  std::vector<std::int64_t> ints;  // axes, dims, shape, slice bounds
  bool flag = false;               // keepdim, tanh approximation, explicit eps
  double real = 0;                 // eps, fill value
  DType dtype = f32;               // cast target, creation dtype
  std::uint64_t seed = 0;          // rand/randn
};

struct OpInst {
  int desc = 0;  ///< row of the op table
  std::vector<Operand> args;
  Params p;
  bool eval_after = false;  ///< evaluate this value as soon as it is built (realized views downstream)
};

/// What a value is, as the generator predicts it (the front end must agree).
struct Info {
  DType dtype = f32;
  Shape shape;
};

/// One line of the program: a data input or an op. Its index is its value's name (v<index>).
struct Step {
  bool is_input = false;
  Input input;  // when is_input
  OpInst op;    // otherwise
  Info info;    // predicted dtype and shape
};

struct Program {
  std::uint64_t seed = 0;
  std::uint64_t index = 0;
  std::vector<Step> steps;
  std::vector<int> outputs;  ///< value indices, evaluated together by one eval()
  /// outputs[assign_output] is written with Tensor::assign into a user buffer laid out as
  /// `assign_dst` (its dtype may differ: assign casts); -1 when no output is.
  int assign_output = -1;
  Input assign_dst;
  /// 0: evaluated directly only; else also through kiln::compile (the inputs marked `arg` are
  /// its arguments, the others captured), called twice: 1 "default", 2 "reduce-overhead",
  /// 3 "default" with dynamic = true (kernels that read the sizes at launch).
  int compile_mode = 0;
  /// Also the gradients of the floating outputs with respect to the floating inputs
  /// (with_gradients): the backward graph judged as the forward is.
  bool grad = false;
  const Info& info(int v) const { return steps[static_cast<std::size_t>(v)].info; }
  int size() const { return static_cast<int>(steps.size()); }
};

// ---- C++ literals ----------------------------------------------------------------------------

/// Shortest round-trip spelling of a double (std::to_chars, as the design asks).
inline std::string shortest(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
inline std::string shortest_float(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

/// `v` as a C++ literal of float (or double when `dbl`): kInf/kNaN stand for the specials.
inline std::string real_literal(double v, bool dbl) {
  std::string inf = dbl ? "kInfD" : "kInf", nan = dbl ? "kNaND" : "kNaN";
  if (std::isnan(v)) return nan;
  if (std::isinf(v)) return v > 0 ? inf : "-" + inf;
  std::string s = dbl ? shortest(v) : shortest_float(static_cast<float>(v));
  bool has_dot = s.find_first_of(".e") != std::string::npos;
  if (!dbl) return s + (has_dot ? "f" : ".0f");
  return has_dot ? s : s + ".0";
}

inline std::string int_literal(double v, DType t) {
  if (t == i64 && v <= -9223372036854775808.0) return "std::numeric_limits<std::int64_t>::min()";
  if (t == i32 && v <= -2147483648.0) return "std::numeric_limits<std::int32_t>::min()";
  auto i = static_cast<std::int64_t>(v);
  std::string s = std::to_string(i);
  return t == i64 && (i > 2147483647 || i < -2147483647) ? s + "LL" : s;
}

/// An element of dtype `t` as a C++ expression of its storage type.
inline std::string element_literal(double v, DType t) {
  switch (t) {
    case DType::Bool:
      return v != 0 ? "true" : "false";
    case DType::Int32:
    case DType::Int64:
      return int_literal(v, t);
    case DType::Float16:
      return "Half(" + real_literal(v, false) + ")";
    case DType::BFloat16:
      return "BFloat16(" + real_literal(v, false) + ")";
    case DType::Float32:
      return real_literal(v, false);
    case DType::Float64:
      return real_literal(v, true);
  }
  return "?";
}

inline std::string number_literal(const Number& n) {
  switch (n.kind) {
    case Number::Kind::Float:
      return real_literal(n.value, false);
    case Number::Kind::Double:
      return real_literal(n.value, true);
    case Number::Kind::Int:
      return int_literal(n.value, i64);
    case Number::Kind::Bool:
      return n.value != 0 ? "true" : "false";
  }
  return "?";
}

inline std::string ints_literal(const std::vector<std::int64_t>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    if (v[i] == std::numeric_limits<std::int64_t>::max())
      s += "INT64_MAX";
    else
      s += std::to_string(v[i]);
  }
  return s + "}";
}

// ---- input memory ------------------------------------------------------------------------------

/// Where logical element `flat` of an input lies in its buffer, and how big the buffer is.
struct Placement {
  std::vector<std::int64_t> strides;  ///< element strides of the view
  std::int64_t offset = 0;            ///< first element's index in the buffer
  std::int64_t buffer_size = 0;
};

inline Placement placement(const Input& in) {
  Placement pl;
  const Shape& s = in.shape;
  std::size_t r = s.size();
  if (in.layout == Layout::Contiguous || r == 0) {
    pl.strides = contiguous_strides(s);
    pl.buffer_size = s.numel();
    return pl;
  }
  if (in.layout == Layout::Permuted) {
    Shape bs(r);
    for (std::size_t i = 0; i < r; ++i) bs[i] = s[static_cast<std::size_t>(in.perm[i])];
    Strides bst = contiguous_strides(bs);
    pl.strides.assign(r, 0);
    for (std::size_t i = 0; i < r; ++i) pl.strides[static_cast<std::size_t>(in.perm[i])] = bst[i];
    pl.buffer_size = s.numel();
    return pl;
  }
  Shape padded(r);
  for (std::size_t d = 0; d < r; ++d) padded[d] = in.start[d] + s[d] * in.step[d];
  Strides c = contiguous_strides(padded);
  pl.strides.assign(r, 0);
  for (std::size_t d = 0; d < r; ++d) {
    pl.strides[d] = c[d] * in.step[d];
    pl.offset += in.start[d] * c[d];
  }
  pl.buffer_size = padded.numel();
  return pl;
}

/// A value no correct kernel reads: the gaps of strided buffers hold it. 7680 = 15 * 2^9 is
/// exact in every dtype but bool (not NaN: a NaN would hide in a reduction that meets NaN anyway).
inline double poison(DType t) { return t == bool_ ? 1 : 7680.0; }

/// The whole buffer of an input in memory order (gaps poisoned).
inline std::vector<double> buffer_values(const Input& in) {
  Placement pl = placement(in);
  std::vector<double> buf(static_cast<std::size_t>(pl.buffer_size), poison(in.dtype));
  const Shape& s = in.shape;
  std::vector<std::int64_t> idx(s.size(), 0);
  for (std::int64_t i = 0; i < s.numel(); ++i) {
    std::int64_t off = pl.offset;
    for (std::size_t d = 0; d < s.size(); ++d) off += idx[d] * pl.strides[d];
    buf[static_cast<std::size_t>(off)] = in.values[static_cast<std::size_t>(i)];
    for (std::size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  return buf;
}

}  // namespace kiln::fuzz
