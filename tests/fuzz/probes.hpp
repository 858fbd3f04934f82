#pragma once
// Error probes: calls the documentation says are errors, made with random shapes and dtypes,
// must throw the documented kiln::Error subtype (semantics.md "Errors"; PyTorch's rules). The
// generator only makes valid programs, so without these nothing would notice an invalid call
// that silently evaluates (F8's pow(int, -1), F9's transpose of a 0-dim tensor at dims 5, 7).
// Probes run no kernels: building the call (and evaluating it, for data-dependent rules) is
// enough.
#include <functional>
#include <string>
#include <vector>

#include "run.hpp"

namespace kiln::fuzz {

enum class Expect { Shape, DType, Any };

struct Probe {
  std::string name;
  Expect expect;
  /// Makes the invalid call with random operands; returns the call as C++ (for the report).
  std::function<std::string(Rng&)> call;
};

namespace probe_detail {

inline Shape small_shape(Rng& r, int min_rank = 1) {
  Shape s;
  int rank = static_cast<int>(r.range(min_rank, 3));
  for (int i = 0; i < rank; ++i) s.push_back(r.pick(std::vector<std::int64_t>{1, 2, 3, 5}));
  return s;
}
inline DType pick(Rng& r, DTypeSet set) {
  std::vector<DType> ok;
  for (DType t : kDTypes)
    if (in(set, t)) ok.push_back(t);
  return r.pick(ok);
}
inline std::string zeros_cxx(const Shape& s, DType t) {
  return std::string("zeros(") + ints_literal(s) + ", " + dtype_cxx(t) + ")";
}
/// An axis outside [-max(rank,1), max(rank,1)).
inline std::int64_t bad_axis(Rng& r, std::size_t rank) {
  std::int64_t n = rank == 0 ? 1 : static_cast<std::int64_t>(rank);
  return r.chance(0.5) ? n + r.below(5) : -n - 1 - r.below(5);
}

}  // namespace probe_detail

inline const std::vector<Probe>& probe_table() {
  using namespace probe_detail;
  static const std::vector<Probe> table = [] {
    std::vector<Probe> t;
    // semantics.md: mean, var, layer_norm and rms_norm need a floating input (DTypeError).
    t.push_back({"mean/var/norms of an integer or bool", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r);
                   DType d = pick(r, kInts | bit(bool_));
                   Tensor x = zeros(s, d);
                   int k = static_cast<int>(r.below(4));
                   if (k == 0)
                     Tensor y = mean(x);
                   else if (k == 1)
                     Tensor y = var(x);
                   else if (k == 2)
                     Tensor y = layer_norm(x);
                   else
                     Tensor y = rms_norm(x);
                   return std::string(k == 0   ? "mean"
                                      : k == 1 ? "var"
                                      : k == 2 ? "layer_norm"
                                               : "rms_norm") +
                          "(" + zeros_cxx(s, d) + ")";
                 }});
    t.push_back({"gelu/silu of an integer or bool", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r);
                   DType d = pick(r, kInts | bit(bool_));
                   bool g = r.chance(0.5);
                   if (g)
                     Tensor y = gelu(zeros(s, d));
                   else
                     Tensor y = silu(zeros(s, d));
                   return std::string(g ? "gelu(" : "silu(") + zeros_cxx(s, d) + ")";
                 }});
    // semantics.md: `bool - bool` is a DTypeError; PyTorch: pow of bools too.
    t.push_back({"bool - bool, pow(bool, bool)", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r);
                   bool sub = r.chance(0.5);
                   if (sub)
                     Tensor y = zeros(s, bool_) - ones(s, bool_);
                   else
                     Tensor y = pow(zeros(s, bool_), ones(s, bool_));
                   return sub ? zeros_cxx(s, bool_) + " - ones(...)" : "pow(" + zeros_cxx(s, bool_) + ", ones(...))";
                 }});
    t.push_back({"neg/floor/ceil/round/relu of bool", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r);
                   Tensor x = zeros(s, bool_);
                   int k = static_cast<int>(r.below(5));
                   if (k == 0)
                     Tensor y = -x;
                   else if (k == 1)
                     Tensor y = floor(x);
                   else if (k == 2)
                     Tensor y = ceil(x);
                   else if (k == 3)
                     Tensor y = round(x);
                   else
                     Tensor y = relu(x);
                   const char* names[] = {"-", "floor", "ceil", "round", "relu"};
                   return std::string(names[k]) + "(" + zeros_cxx(s, bool_) + ")";
                 }});
    t.push_back({"where with a non-bool condition", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r);
                   DType d = pick(r, kNotBool);
                   Tensor y = where(zeros(s, d), 1.0f, 0.0f);
                   return "where(" + zeros_cxx(s, d) + ", 1.0f, 0.0f)";
                 }});
    t.push_back({"argmax/argmin of bool", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r);
                   if (r.chance(0.5))
                     Tensor y = argmax(zeros(s, bool_));
                   else
                     Tensor y = argmin(zeros(s, bool_));
                   return "argmax(" + zeros_cxx(s, bool_) + ")";
                 }});
    t.push_back({"rand/randn of a non-floating dtype", Expect::DType, [](Rng& r) {
                   Shape s = small_shape(r, 0);
                   DType d = pick(r, kInts | bit(bool_));
                   if (r.chance(0.5))
                     Tensor y = rand(s, 1, d);
                   else
                     Tensor y = randn(s, 1, d);
                   return std::string("randn(") + ints_literal(s) + ", 1, " + dtype_cxx(d) + ")";
                 }});
    // semantics.md: max/min/argmax/argmin over an empty dimension are ShapeErrors.
    t.push_back({"max/min/argmax/argmin over an empty dimension", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r);
                   std::size_t d = static_cast<std::size_t>(r.below(static_cast<std::int64_t>(s.size())));
                   s[d] = 0;
                   Tensor x = zeros(s);
                   int k = static_cast<int>(r.below(4));
                   std::int64_t a = static_cast<std::int64_t>(d);
                   if (k == 0)
                     Tensor y = max(x, a);
                   else if (k == 1)
                     Tensor y = min(x, a);
                   else if (k == 2)
                     Tensor y = argmax(x, a);
                   else
                     Tensor y = argmin(x, a);
                   return "max/min/argmax/argmin #" + std::to_string(k) + "(" + zeros_cxx(s, f32) + ", " +
                          std::to_string(d) + ")";
                 }});
    t.push_back({"shapes that do not broadcast", Expect::Shape, [](Rng& r) {
                   Shape a = small_shape(r), b = a;
                   std::size_t d = static_cast<std::size_t>(r.below(static_cast<std::int64_t>(a.size())));
                   a[d] = 2;
                   b[d] = 3;
                   Tensor y = zeros(a) + zeros(b);
                   return zeros_cxx(a, f32) + " + " + zeros_cxx(b, f32);
                 }});
    // Axes outside [-rank, rank) (0-dim tensors take 0 and -1 only, as PyTorch): F9.
    t.push_back({"an axis out of range", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r, 0);
                   std::int64_t a = bad_axis(r, s.size());
                   Tensor x = zeros(s);
                   int k = static_cast<int>(r.below(9));
                   const char* names[] = {"sum",    "softmax",   "log_softmax", "transpose", "squeeze",
                                          "argmax", "logsumexp", "slice",       "unsqueeze"};
                   switch (k) {
                     case 0: {
                       Tensor y = sum(x, a);
                       break;
                     }
                     case 1: {
                       Tensor y = softmax(x, a);
                       break;
                     }
                     case 2: {
                       Tensor y = log_softmax(x, a);
                       break;
                     }
                     case 3: {
                       Tensor y = transpose(x, a, 0);
                       break;
                     }
                     case 4: {
                       Tensor y = squeeze(x, a);
                       break;
                     }
                     case 5: {
                       Tensor y = argmax(x, a);
                       break;
                     }
                     case 6: {
                       Tensor y = logsumexp(x, a);
                       break;
                     }
                     case 7: {
                       Tensor y = slice(x, a, 0, 1);
                       break;
                     }
                     default: {
                       std::int64_t u = a >= 0 ? a + 1 : a - 1;  // unsqueeze takes [-rank-1, rank]
                       Tensor y = unsqueeze(x, u);
                       a = u;
                     }
                   }
                   return std::string(names[k]) + "(" + zeros_cxx(s, f32) + ", " + std::to_string(a) + ")";
                 }});
    // F8; PyTorch: "Integers to negative integer powers are not allowed".
    t.push_back({"pow(integer tensor, negative integer)", Expect::Any, [](Rng& r) {
                   Shape s = small_shape(r);
                   DType d = pick(r, kInts);
                   std::int64_t e = -1 - r.below(3);
                   Tensor y = pow(ones(s, d), e);
                   y.eval();
                   return "pow(ones(" + ints_literal(s) + ", " + dtype_cxx(d) + "), " + std::to_string(e) + ")";
                 }});
    t.push_back({"reshape to another element count", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r);
                   Shape to{s.numel() + 1 + r.below(3)};
                   Tensor y = reshape(zeros(s), to);
                   return "reshape(" + zeros_cxx(s, f32) + ", " + ints_literal(to) + ")";
                 }});
    t.push_back({"a negative size", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r);
                   s[0] = -1 - r.below(3);
                   int k = static_cast<int>(r.below(3));
                   if (k == 0)
                     Tensor y = zeros(s);
                   else if (k == 1)
                     Tensor y = full(s, 1.0);
                   else
                     Tensor y = randn(s, 1);
                   return std::string(k == 0 ? "zeros(" : k == 1 ? "full(" : "randn(") + ints_literal(s) + ", ...)";
                 }});
    // F6: sizes whose element count overflows int64.
    t.push_back({"a shape past int64", Expect::Shape, [](Rng& r) {
                   std::int64_t a = std::int64_t{1} << r.range(32, 40), b = std::int64_t{1} << r.range(32, 40);
                   int k = static_cast<int>(r.below(3));
                   if (k == 0)
                     Tensor y = zeros({a, b});
                   else if (k == 1)
                     Tensor y = broadcast_to(ones({1}), {a, b});
                   else
                     Tensor y = randn({a, b, 4}, 1);
                   return std::string(k == 0   ? "zeros"
                                      : k == 1 ? "broadcast_to"
                                               : "randn") +
                          " of " + std::to_string(a) + " x " + std::to_string(b);
                 }});
    t.push_back({"slice with a step <= 0", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r);
                   std::int64_t step = -r.below(3);
                   Tensor y = slice(zeros(s), 0, 0, s[0], step);
                   return "slice(" + zeros_cxx(s, f32) + ", 0, 0, " + std::to_string(s[0]) + ", " +
                          std::to_string(step) + ")";
                 }});
    t.push_back({"split/chunk by a size or count <= 0", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r);
                   std::int64_t n = -r.below(3);
                   bool sp = r.chance(0.5);
                   if (sp)
                     auto y = split(zeros(s), n, 0);
                   else
                     auto y = chunk(zeros(s), n, 0);
                   return std::string(sp ? "split(" : "chunk(") + zeros_cxx(s, f32) + ", " + std::to_string(n) + ")";
                 }});
    t.push_back({"concat of 0-dim tensors or mismatched shapes", Expect::Shape, [](Rng& r) {
                   if (r.chance(0.5)) {
                     Tensor y = concat({full({}, 1.0), full({}, 2.0)});
                     return std::string("concat({full({}, 1.0), full({}, 2.0)})");
                   }
                   Shape a = small_shape(r, 2), b = a;
                   b[1] += 1;
                   Tensor y = concat({zeros(a), zeros(b)}, 0);
                   return "concat({" + zeros_cxx(a, f32) + ", " + zeros_cxx(b, f32) + "}, 0)";
                 }});
    t.push_back({"layer_norm weight of the wrong shape", Expect::Shape, [](Rng& r) {
                   Shape s = small_shape(r);
                   Shape w{s.back() + 1};
                   Tensor y = layer_norm(zeros(s), ones(w));
                   return "layer_norm(" + zeros_cxx(s, f32) + ", ones(" + ints_literal(w) + "))";
                 }});
    // F5: a class target outside [0, C) (not ignore_index); PyTorch: "Target 7 is out of bounds".
    t.push_back({"cross_entropy target out of range", Expect::Any, [](Rng& r) {
                   std::int64_t n = r.range(1, 4), c = r.range(1, 5);
                   std::vector<std::int64_t> tv(static_cast<std::size_t>(n), 0);
                   std::int64_t bad = r.chance(0.5) ? c + r.below(3) : -1 - r.below(3);
                   tv[static_cast<std::size_t>(r.below(n))] = bad;
                   Tensor y = cross_entropy(zeros({n, c}), from_vector<std::int64_t>(tv, {n}));
                   y.eval();
                   return "cross_entropy(zeros({" + std::to_string(n) + ", " + std::to_string(c) +
                          "}), targets holding " + std::to_string(bad) + ")";
                 }});
    // F7.
    t.push_back({"from_blob of a null pointer", Expect::Any, [](Rng& r) {
                   Shape s = small_shape(r);
                   Tensor y = from_blob(static_cast<float*>(nullptr), s);
                   return "from_blob((float*)nullptr, " + ints_literal(s) + ")";
                 }});
    return t;
  }();
  return table;
}

/// Runs probe k with the stream of graph `index`: Pass when the documented error came.
inline Verdict run_probe(std::size_t k, std::uint64_t seed, std::uint64_t index) {
  const Probe& p = probe_table()[k % probe_table().size()];
  Rng r = graph_rng(seed ^ 0x9b0beull, index);
  Verdict v;
  std::string cxx = "?";
  set_backend(Backend::Eager);
  try {
    cxx = p.call(r);
    v.kind = Kind::ProbeFailed;
    v.detail = p.name + ": no error from " + cxx;
  } catch (const std::exception& e) {
    bool ok = p.expect == Expect::Shape   ? dynamic_cast<const ShapeError*>(&e) != nullptr
              : p.expect == Expect::DType ? dynamic_cast<const DTypeError*>(&e) != nullptr
                                          : dynamic_cast<const Error*>(&e) != nullptr;
    if (!ok) {
      v.kind = Kind::ProbeFailed;
      v.detail = p.name + ": expected " +
                 (p.expect == Expect::Shape   ? "kiln::ShapeError"
                  : p.expect == Expect::DType ? "kiln::DTypeError"
                                              : "a kiln::Error") +
                 ", got " + error_type(e) + ": " + e.what();
    }
  }
  set_backend(Backend::Auto);
  return v;
}

}  // namespace kiln::fuzz
