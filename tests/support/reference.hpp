#pragma once
// A small float64 reference library for kiln's API-level tests: deterministic test data
// rounded to each dtype, tensors made from it on the device under test, values read back in
// the tensor's own dtype, NumPy-style broadcasting and reductions in double, and closeness
// checks with torch.testing's per-dtype tolerances. Everything here is plain host code that
// never goes through kiln's executors, so it can judge them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "device.hpp"
#include "values.hpp"

namespace kiln::testing {

// ---- tolerances -----------------------------------------------------------------------------

/// |actual - expected| <= atol + rtol * |expected| (torch.testing.assert_close).
struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

/// torch.testing's default tolerances for results of `dtype`; integers and bool are exact.
inline Tolerance tolerance(DType dtype) {
  switch (dtype) {
    case DType::Float16:
      return {1e-3, 1e-5};
    case DType::BFloat16:
      return {1.6e-2, 1e-5};
    case DType::Float32:
      return {1.3e-6, 1e-5};
    case DType::Float64:
      return {1e-7, 1e-7};
    default:
      return {0.0, 0.0};
  }
}

inline const DType kAllDTypes[] = {DType::Bool,     DType::Int32,   DType::Int64,  DType::Float16,
                                   DType::BFloat16, DType::Float32, DType::Float64};
inline const DType kFloatDTypes[] = {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};
inline const DType kIntDTypes[] = {DType::Int32, DType::Int64};

// ---- test data --------------------------------------------------------------------------------

/// splitmix64: a tiny deterministic generator, identical on every platform (unlike the
/// standard library's distributions).
struct SplitMix {
  std::uint64_t state;
  explicit SplitMix(std::uint64_t seed) : state(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

/// `n` values uniform in [lo, hi), each exactly representable in `dtype`.
inline std::vector<double> uniform_values(std::size_t n, double lo, double hi, DType dtype, std::uint64_t seed = 1) {
  SplitMix g(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = round_to(lo + (hi - lo) * g.uniform(), dtype);
  return v;
}

/// `n` integers uniform in [lo, hi] (as doubles).
inline std::vector<double> integer_values(std::size_t n, std::int64_t lo, std::int64_t hi, std::uint64_t seed = 1) {
  SplitMix g(seed);
  std::vector<double> v(n);
  const auto span = static_cast<std::uint64_t>(hi - lo + 1);
  for (auto& x : v) x = static_cast<double>(lo + static_cast<std::int64_t>(g.next() % span));
  return v;
}

/// Values suited to `dtype`: integers in [-5, 5] for integer types, 0/1 for bool, uniform
/// in [lo, hi) otherwise.
inline std::vector<double> values_for(DType dtype, std::size_t n, double lo = -3.0, double hi = 3.0,
                                      std::uint64_t seed = 1) {
  if (dtype == DType::Bool) return integer_values(n, 0, 1, seed);
  if (is_integral(dtype)) return integer_values(n, -5, 5, seed);
  return uniform_values(n, lo, hi, dtype, seed);
}

/// A tensor of `dtype` and `shape` holding `v` (converted as round_to does), on `dev`.
inline Tensor make_tensor(const std::vector<double>& v, const Shape& shape, DType dtype, Device dev = device()) {
  return visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> data;
    data.reserve(v.size());
    for (double x : v) {
      if constexpr (std::is_same_v<T, bool>)
        data.push_back(x != 0.0);
      else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        data.push_back(T(static_cast<float>(x)));
      else
        data.push_back(static_cast<T>(x));
    }
    return from_vector<T>(data, shape, dev);
  });
}

/// An Int32 or Int64 tensor holding `v` exactly.
inline Tensor make_int_tensor(const std::vector<std::int64_t>& v, const Shape& shape, DType dtype = DType::Int64,
                              Device dev = device()) {
  if (dtype == DType::Int64) return from_vector<std::int64_t>(v, shape, dev);
  std::vector<std::int32_t> w(v.begin(), v.end());
  return from_vector<std::int32_t>(w, shape, dev);
}

/// The elements of an integer or bool tensor, exactly.
inline std::vector<std::int64_t> int_values(const Tensor& t) {
  switch (t.dtype()) {
    case DType::Int64:
      return t.to_vector<std::int64_t>();
    case DType::Int32: {
      auto v = t.to_vector<std::int32_t>();
      return std::vector<std::int64_t>(v.begin(), v.end());
    }
    case DType::Bool: {
      auto v = t.to_vector<bool>();
      std::vector<std::int64_t> out;
      for (bool b : v) out.push_back(b ? 1 : 0);
      return out;
    }
    default:
      throw std::invalid_argument(std::string("int_values of a ") + dtype_name(t.dtype()) + " tensor");
  }
}

// ---- reference computations in double ---------------------------------------------------------

/// A row-major array of doubles with a shape.
struct Ref {
  std::vector<double> v;
  Shape shape;
};

inline Ref ref_of(const Tensor& t) { return {values(t), t.shape()}; }

inline std::vector<std::int64_t> unravel(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return idx;
}

/// Flat row-major index into `shape` of the output index `idx` (of rank >= shape's rank),
/// broadcasting size-1 and missing leading dims.
inline std::int64_t broadcast_flat(const std::vector<std::int64_t>& idx, const Shape& shape) {
  std::int64_t flat = 0;
  const std::size_t lead = idx.size() - shape.size();
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : idx[lead + d]);
  return flat;
}

/// NumPy broadcast of two shapes (the test's own implementation).
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
  std::size_t n = std::max(a.size(), b.size());
  Shape out(n, 1);
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

template <class F>
Ref map(const Ref& a, F f) {
  Ref r{a.v, a.shape};
  for (auto& x : r.v) x = f(x);
  return r;
}

/// f(a, b) elementwise with NumPy broadcasting.
template <class F>
Ref zip(const Ref& a, const Ref& b, F f) {
  Ref r;
  r.shape = broadcast_shape(a.shape, b.shape);
  r.v.resize(static_cast<std::size_t>(r.shape.numel()));
  for (std::int64_t i = 0; i < r.shape.numel(); ++i) {
    auto idx = unravel(i, r.shape);
    r.v[i] = f(a.v[broadcast_flat(idx, a.shape)], b.v[broadcast_flat(idx, b.shape)]);
  }
  return r;
}

/// Axes normalised and sorted; empty means all.
inline std::vector<std::int64_t> norm_axes(std::vector<std::int64_t> axes, std::size_t rank) {
  if (axes.empty())
    for (std::size_t d = 0; d < rank; ++d) axes.push_back(static_cast<std::int64_t>(d));
  for (auto& a : axes)
    if (a < 0) a += static_cast<std::int64_t>(rank);
  std::sort(axes.begin(), axes.end());
  return axes;
}

/// The elements folded into each output of a reduction over `axes` (empty = all), in
/// row-major order of the reduced positions; and the output shape.
struct Groups {
  std::vector<std::vector<double>> groups;
  Shape shape;
};
inline Groups group_by(const Ref& a, std::vector<std::int64_t> axes_in, bool keepdim) {
  auto axes = norm_axes(std::move(axes_in), a.shape.size());
  auto reduced = [&](std::size_t d) {
    return std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) != axes.end();
  };
  Shape kept_full;  // keepdim shape
  for (std::size_t d = 0; d < a.shape.size(); ++d) kept_full.push_back(reduced(d) ? 1 : a.shape[d]);
  Groups g;
  g.groups.resize(static_cast<std::size_t>(kept_full.numel()));
  for (std::int64_t i = 0; i < a.shape.numel(); ++i) {
    auto idx = unravel(i, a.shape);
    std::int64_t o = 0;
    for (std::size_t d = 0; d < a.shape.size(); ++d) o = o * kept_full[d] + (reduced(d) ? 0 : idx[d]);
    g.groups[o].push_back(a.v[i]);
  }
  for (std::size_t d = 0; d < a.shape.size(); ++d)
    if (!reduced(d))
      g.shape.push_back(a.shape[d]);
    else if (keepdim)
      g.shape.push_back(1);
  return g;
}

template <class F>
Ref reduce(const Ref& a, std::vector<std::int64_t> axes, bool keepdim, F f) {
  Groups g = group_by(a, std::move(axes), keepdim);
  Ref r;
  r.shape = g.shape;
  for (auto& grp : g.groups) r.v.push_back(f(grp));
  return r;
}

// Reductions of one group, PyTorch's semantics, in double.
inline double ref_sum(const std::vector<double>& g) {
  long double s = 0;  // the reference must be far more accurate than what it judges
  for (double x : g) s += x;
  return static_cast<double>(s);
}
inline double ref_prod(const std::vector<double>& g) {
  double p = 1;
  for (double x : g) p *= x;
  return p;
}
inline double ref_mean(const std::vector<double>& g) { return ref_sum(g) / static_cast<double>(g.size()); }
inline double ref_max(const std::vector<double>& g) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : g) {
    if (std::isnan(x)) return x;
    m = std::max(m, x);
  }
  return m;
}
inline double ref_min(const std::vector<double>& g) {
  double m = std::numeric_limits<double>::infinity();
  for (double x : g) {
    if (std::isnan(x)) return x;
    m = std::min(m, x);
  }
  return m;
}
/// First index of the largest (max) or smallest value; the first NaN wins.
inline double ref_argext(const std::vector<double>& g, bool max) {
  std::size_t best = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (max ? g[i] > g[best] : g[i] < g[best]) best = i;
  }
  return static_cast<double>(best);
}
inline double ref_var(const std::vector<double>& g, double correction = 1.0) {
  double m = ref_mean(g), ss = 0;
  for (double x : g) ss += (x - m) * (x - m);
  return ss / (static_cast<double>(g.size()) - correction);
}
inline double ref_logsumexp(const std::vector<double>& g) {
  double m = ref_max(g);
  if (std::isnan(m)) return m;
  if (std::isinf(m)) {
    if (m > 0) return m;
    return -std::numeric_limits<double>::infinity();  // every element is -inf (or none)
  }
  double s = 0;
  for (double x : g) s += std::exp(x - m);
  return std::log(s) + m;
}

// Composites over the last axis of a row-major array, in double.
inline Ref ref_softmax_last(const Ref& a) {
  Ref r = a;
  const std::int64_t k = a.shape.back(), rows = k ? a.shape.numel() / k : 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::vector<double> row(a.v.begin() + i * k, a.v.begin() + (i + 1) * k);
    double m = ref_max(row), s = 0;
    for (double x : row) s += std::exp(x - m);
    for (std::int64_t j = 0; j < k; ++j) r.v[i * k + j] = std::exp(row[j] - m) / s;
  }
  return r;
}
inline Ref ref_log_softmax_last(const Ref& a) {
  Ref r = a;
  const std::int64_t k = a.shape.back(), rows = k ? a.shape.numel() / k : 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::vector<double> row(a.v.begin() + i * k, a.v.begin() + (i + 1) * k);
    double lse = ref_logsumexp(row);
    for (std::int64_t j = 0; j < k; ++j) r.v[i * k + j] = row[j] - lse;
  }
  return r;
}
/// weight/bias empty = absent.
inline Ref ref_layer_norm_last(const Ref& a, const std::vector<double>& w, const std::vector<double>& b, double eps) {
  Ref r = a;
  const std::int64_t k = a.shape.back(), rows = k ? a.shape.numel() / k : 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    std::vector<double> row(a.v.begin() + i * k, a.v.begin() + (i + 1) * k);
    double m = ref_mean(row), var = ref_var(row, 0.0);
    for (std::int64_t j = 0; j < k; ++j) {
      double y = (row[j] - m) / std::sqrt(var + eps);
      if (!w.empty()) y *= w[j];
      if (!b.empty()) y += b[j];
      r.v[i * k + j] = y;
    }
  }
  return r;
}
inline Ref ref_rms_norm_last(const Ref& a, const std::vector<double>& w, double eps) {
  Ref r = a;
  const std::int64_t k = a.shape.back(), rows = k ? a.shape.numel() / k : 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (std::int64_t j = 0; j < k; ++j) ss += a.v[i * k + j] * a.v[i * k + j];
    double scale = 1.0 / std::sqrt(ss / static_cast<double>(k) + eps);
    for (std::int64_t j = 0; j < k; ++j) r.v[i * k + j] = a.v[i * k + j] * scale * (w.empty() ? 1.0 : w[j]);
  }
  return r;
}
/// Mean of -log_softmax(logits)[i, target[i]] over targets != ignore_index (NaN when none).
inline double ref_cross_entropy(const Ref& logits, const std::vector<std::int64_t>& targets,
                                std::int64_t ignore_index = -100) {
  Ref lp = ref_log_softmax_last(logits);
  const std::int64_t c = logits.shape[1];
  double total = 0, count = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == ignore_index) continue;
    total -= lp.v[static_cast<std::int64_t>(i) * c + targets[i]];
    count += 1;
  }
  return total / count;
}

inline double ref_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2)); }
inline double ref_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
inline double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- closeness checks ---------------------------------------------------------------------------

inline std::string fmt(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

/// "" when every actual[i] is close to expected[i] (NaN matches NaN; infinities must match
/// exactly), else a description of the first mismatches.
inline std::string close_report(const std::vector<double>& actual, const std::vector<double>& expected, Tolerance tol) {
  if (actual.size() != expected.size())
    return "size " + std::to_string(actual.size()) + " != expected " + std::to_string(expected.size());
  std::string out;
  int shown = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool ok;
    if (std::isnan(e) || std::isnan(a))
      ok = std::isnan(e) && std::isnan(a);
    else if (std::isinf(e) || std::isinf(a))
      ok = a == e;
    else
      ok = std::fabs(a - e) <= tol.atol + tol.rtol * std::fabs(e);
    if (!ok) {
      ++bad;
      if (shown++ < 5) out += "  [" + std::to_string(i) + "] actual " + fmt(a) + " expected " + fmt(e) + "\n";
    }
  }
  if (!bad) return "";
  return std::to_string(bad) + " of " + std::to_string(actual.size()) + " elements differ (rtol " + fmt(tol.rtol) +
         ", atol " + fmt(tol.atol) + "):\n" + out;
}

/// Compares t's values with `expected`, with the tolerance of t's dtype.
inline std::string close_report(const Tensor& t, const std::vector<double>& expected) {
  return close_report(values(t), expected, tolerance(t.dtype()));
}
inline std::string close_report(const Tensor& t, const std::vector<double>& expected, Tolerance tol) {
  return close_report(values(t), expected, tol);
}
/// Also checks the shape.
inline std::string close_report(const Tensor& t, const Ref& expected) {
  if (t.shape() != expected.shape) return "shape " + t.shape().str() + " != expected " + expected.shape.str();
  return close_report(values(t), expected.v, tolerance(t.dtype()));
}
inline std::string close_report(const Tensor& t, const Ref& expected, Tolerance tol) {
  if (t.shape() != expected.shape) return "shape " + t.shape().str() + " != expected " + expected.shape.str();
  return close_report(values(t), expected.v, tol);
}

/// Exact comparison of an integer or bool tensor.
inline std::string exact_report(const Tensor& t, const std::vector<std::int64_t>& expected) {
  auto a = int_values(t);
  if (a.size() != expected.size())
    return "size " + std::to_string(a.size()) + " != expected " + std::to_string(expected.size());
  std::string out;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != expected[i] && bad++ < 5)
      out += "  [" + std::to_string(i) + "] actual " + std::to_string(a[i]) + " expected " +
             std::to_string(expected[i]) + "\n";
  if (!bad) return "";
  return std::to_string(bad) + " of " + std::to_string(a.size()) + " elements differ:\n" + out;
}

/// True when `what` contains every one of `parts`.
inline bool mentions(const std::string& what, std::initializer_list<std::string> parts) {
  for (auto& p : parts)
    if (what.find(p) == std::string::npos) return false;
  return true;
}

}  // namespace kiln::testing

/// CHECK that a tensor (or vector) is close to the expected values; reports the first mismatches.
#define KILN_CHECK_CLOSE(...)                                                    \
  do {                                                                           \
    const std::string kiln_report_ = ::kiln::testing::close_report(__VA_ARGS__); \
    CHECK_MESSAGE(kiln_report_.empty(), kiln_report_);                           \
  } while (0)

/// CHECK that an integer or bool tensor equals the expected values exactly.
#define KILN_CHECK_EXACT(...)                                                    \
  do {                                                                           \
    const std::string kiln_report_ = ::kiln::testing::exact_report(__VA_ARGS__); \
    CHECK_MESSAGE(kiln_report_.empty(), kiln_report_);                           \
  } while (0)

/// CHECK that `stmt` throws `Type` whose message mentions every string that follows.
#define KILN_CHECK_THROWS_MENTIONING(Type, stmt, ...)                                  \
  do {                                                                                 \
    bool kiln_thrown_ = false;                                                         \
    try {                                                                              \
      stmt;                                                                            \
    } catch (const Type& kiln_e_) {                                                    \
      kiln_thrown_ = true;                                                             \
      const std::string kiln_what_ = kiln_e_.what();                                   \
      CHECK_MESSAGE(::kiln::testing::mentions(kiln_what_, {__VA_ARGS__}),              \
                    "message \"" << kiln_what_ << "\" should mention: " #__VA_ARGS__); \
    } catch (const std::exception& kiln_e_) {                                          \
      FAIL_CHECK("threw the wrong type (" #Type " expected): " << kiln_e_.what());     \
      kiln_thrown_ = true;                                                             \
    }                                                                                  \
    CHECK_MESSAGE(kiln_thrown_, #stmt " did not throw " #Type);                        \
  } while (0)

namespace doctest {
template <>
struct StringMaker<kiln::DType> {
  static String convert(kiln::DType t) { return kiln::dtype_name(t); }
};
template <>
struct StringMaker<kiln::Shape> {
  static String convert(const kiln::Shape& s) { return s.str().c_str(); }
};
}  // namespace doctest
