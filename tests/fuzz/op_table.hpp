#pragma once
// The fuzzer's op table: one row per call of kiln's public API that a graph may contain. A row
// says which operand dtypes the documented rule accepts, how to choose operands and parameters
// (pick), what the result's dtype and shape must be by PyTorch's rules (predict: the fuzzer's
// own oracle, so front-end promotion bugs show up even though the JIT and the reference share
// the front end), how to build the call (build), and how to print it as C++ (cxx, a template).
// Adding an op is adding one row to op_table() below.
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "program.hpp"

namespace kiln::fuzz {

/// Knobs of the generator.
struct Limits {
  int min_ops = 1;
  int max_ops = 12;
  std::int64_t max_elems = 8192;  ///< per tensor
  double big_dim_rate = 0.02;     ///< chance that a dimension is 1000
  double special_rate = 0.35;     ///< chance that an input mixes in inf/NaN/-0/huge/tiny/denormals
  double noncontig_rate = 0.3;    ///< chance that an input is a strided or permuted view
  double eval_rate = 0.06;        ///< chance that a value is evaluated where it is built
  double assign_rate = 0.15;      ///< chance that an output is written with assign() into user memory
  double extra_output_rate = 0.3;
  /// Chance that a graph is "big": max_elems x16 and many 1000-sized dims, so that kernels take
  /// their parallel (OpenMP team above 32768 elements), blocked-sum (rows over 1024) and
  /// split-reduction paths.
  double big_graph_rate = 0.1;
  /// Chance that a graph is also run through kiln::compile (trace, then replay on new values).
  double compile_rate = 0.25;
  /// Rows whose OpDesc::since is above this are not generated: an older version regenerates
  /// the graphs a seed gave before those rows joined (the judged graphs named in
  /// tests/CMakeLists.txt were found with version 1). The latest by default.
  int table_version = 9;
  /// Gradient mode (kiln_fuzz --grad): every program also returns the gradients of its floating
  /// outputs with respect to its floating inputs (with_gradients); a compiled one traces both.
  bool grad = false;
};

/// How a program is built: on which device, and whether as its float64 twin (floating inputs
/// and floating dtype parameters widened to f64; see build_program).
struct BuildCtx {
  bool f64 = false;
  Device device = Device::cpu();
  /// Float64 twin only: when non-zero, the roundings in which the JIT may legitimately differ
  /// from the reference are imitated by factors 1 + d (drawn from this seed): the floating
  /// operands of reductions and composites (another summation order: blocked float sums
  /// against the reference's double ones) with |d| = 2 eps, and the results of the math
  /// functions with |d| = their documented ulp (OpDesc::ulp), signs random, eps being float's for
  /// f16/bf16/f32 (computed in float) and double's for f64; and the accumulating ops run with
  /// every dim of their operands flipped (build_program: the sums and products in the reverse
  /// order). How far the outputs move estimates how ill-conditioned they are (see judge).
  std::uint64_t perturb = 0;
  /// The JIT under judgement runs on a GPU: the nudge takes the larger of the CPU's and CUDA's
  /// documented bounds (OpDesc::cuda_ulp).
  bool cuda_math = false;
  /// Every nudge's sign times this: -1 is the mirrored twin, each rounding moved the other way
  /// (an integer cast of a value next to an integer moves only one way; see check_program).
  double sign = 1;
};

/// What a row's builder sees.
struct Args {
  const std::vector<Tensor>& t;  ///< tensor operands (undefined where the operand is a number)
  const OpInst& op;
  const BuildCtx& ctx;
  const Program& prog;
  /// A dtype parameter as this build uses it (floating -> f64 in the float64 twin).
  DType dt(DType d) const { return ctx.f64 && is_floating(d) ? f64 : d; }
  const Params& p() const { return op.p; }
  /// The predicted (normal-build) dtype of operand k.
  DType orig_dtype(std::size_t k) const { return prog.info(op.args[k].value).dtype; }
};

/// Calls f with operand k as a Tensor or as the C++ number of its kind.
template <class F>
Tensor with_operand(const Args& a, std::size_t k, F&& f) {
  const Operand& o = a.op.args[k];
  if (!o.is_number()) return f(a.t[k]);
  switch (o.number.kind) {
    case Number::Kind::Float:
      return f(static_cast<float>(o.number.value));
    case Number::Kind::Double:
      return f(o.number.value);
    case Number::Kind::Int:
      return f(static_cast<std::int64_t>(o.number.value));
    case Number::Kind::Bool:
      return f(o.number.value != 0);
  }
  throw Error("fuzz: bad number kind");
}

/// f(x, y) over two operands, either of which may be a number (not both: kiln's operators
/// need a tensor).
template <class F>
Tensor with_operands2(const Args& a, std::size_t i, std::size_t j, F&& f) {
  return with_operand(a, i, [&](const auto& x) {
    return with_operand(a, j, [&](const auto& y) -> Tensor {
      if constexpr (TensorLike<decltype(x)> || TensorLike<decltype(y)>)
        return f(x, y);
      else
        throw Error("fuzz: two numbers given to a binary op");
    });
  });
}

// ---- generation context -----------------------------------------------------------------------

inline std::vector<double> gen_values(Rng& r, DType t, std::int64_t n, double special_rate);

/// The state of one program being generated: operands come from earlier values or from new
/// inputs made here.
struct Gen {
  Rng& rng;
  Program& prog;
  const Limits& lim;

  const Info& info(int v) const { return prog.info(v); }

  std::int64_t dim() {
    if (rng.chance(lim.big_dim_rate)) return 1000;
    static const std::vector<std::int64_t> sizes = {0, 1, 1, 1, 3, 3, 3, 3, 3, 7, 7, 7, 7, 7, 33, 33, 33, 129, 129};
    return rng.pick(sizes);
  }

  Shape shape(int min_rank = 0, int max_rank = 4) {
    static const std::vector<int> ranks = {0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 4, 4};
    for (int attempt = 0;; ++attempt) {
      int r = rng.pick(ranks);
      if (r < min_rank) r = min_rank;
      if (r > max_rank) r = max_rank;
      Shape s;
      for (int d = 0; d < r; ++d) s.push_back(dim());
      if (s.numel() <= lim.max_elems || attempt > 20) {
        for (auto& d : s)
          while (s.numel() > lim.max_elems && d > 1) d = (d == 1000 ? 7 : d / 4 + 1);
        return s;
      }
    }
  }

  DType dtype(DTypeSet s) {
    std::vector<DType> ok;
    for (DType t : kDTypes)
      if (in(s, t)) ok.push_back(t);
    // f32 is what most users run: give it a double share.
    if (in(s, f32)) ok.push_back(f32);
    return rng.pick(ok);
  }

  /// A random layout for a tensor of `shape`.
  void layout(Input& in) {
    std::size_t r = in.shape.size();
    in.layout = Layout::Contiguous;
    if (r == 0 || !rng.chance(lim.noncontig_rate)) return;
    if (r >= 2 && rng.chance(0.5)) {
      in.layout = Layout::Permuted;
      in.perm.resize(r);
      for (std::size_t i = 0; i < r; ++i) in.perm[i] = static_cast<std::int64_t>(i);
      for (std::size_t i = r; i-- > 1;)
        std::swap(in.perm[i], in.perm[static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(i) + 1))]);
      if (r == 2) std::swap(in.perm[0], in.perm[1]);  // never the identity for a matrix
      return;
    }
    in.layout = Layout::Strided;
    in.step.assign(r, 1);
    in.start.assign(r, 0);
    for (std::size_t d = 0; d < r; ++d) {
      if (rng.chance(0.5)) in.step[d] = rng.range(2, 3);
      if (rng.chance(0.3)) in.start[d] = 1;
    }
  }

  /// A new data input; returns its value index.
  int input(DType t, const Shape& s, bool noncontig = true) {
    Step st;
    st.is_input = true;
    st.input.dtype = t;
    st.input.shape = s;
    st.input.values = gen_values(rng, t, s.numel(), lim.special_rate);
    if (noncontig) layout(st.input);
    st.info = {t, s};
    prog.steps.push_back(std::move(st));
    return prog.size() - 1;
  }

  /// True when no op reads value v yet.
  bool unused(int v) const {
    for (int w = v + 1; w < prog.size(); ++w) {
      const Step& s = prog.steps[static_cast<std::size_t>(w)];
      if (s.is_input) continue;
      for (auto& a : s.op.args)
        if (!a.is_number() && a.value == v) return false;
    }
    return true;
  }

  /// An earlier value satisfying `ok`, or -1: mostly the latest op result nothing reads yet, so
  /// that graphs form connected chains rather than dead branches.
  int existing(const std::function<bool(const Info&)>& ok) {
    std::vector<int> c, dangling;
    for (int v = 0; v < prog.size(); ++v) {
      if (!ok(info(v))) continue;
      c.push_back(v);
      if (!prog.steps[static_cast<std::size_t>(v)].is_input && unused(v)) dangling.push_back(v);
    }
    if (c.empty()) return -1;
    if (!dangling.empty() && rng.chance(0.75)) return rng.chance(0.7) ? dangling.back() : rng.pick(dangling);
    if (rng.chance(0.5)) return c.back();
    return rng.pick(c);
  }

  /// An operand of a dtype in `s` (and satisfying `ok`): an earlier value, else a new input.
  int operand(DTypeSet s, const std::function<bool(const Info&)>& ok = {}, int min_rank = 0, int max_rank = 4) {
    auto good = [&](const Info& i) {
      return in(s, i.dtype) && static_cast<int>(i.shape.size()) >= min_rank &&
             static_cast<int>(i.shape.size()) <= max_rank && (!ok || ok(i));
    };
    if (!rng.chance(0.15)) {
      int v = existing(good);
      if (v >= 0) return v;
    }
    for (int attempt = 0; attempt < 50; ++attempt) {
      Info i{dtype(s), shape(min_rank, max_rank)};
      if (good(i)) return input(i.dtype, i.shape);
    }
    return -1;
  }

  /// A shape that broadcasts with `s` (same, some dims 1, a suffix, 0-dim, extra leading dims,
  /// or sizes where s has 1).
  Shape broadcastable(const Shape& s) {
    int mode = static_cast<int>(rng.below(10));
    Shape o = s;
    if (mode < 4) return o;
    if (mode < 7) {
      for (auto& d : o) {
        if (d == 1 && rng.chance(0.5))
          d = dim();
        else if (rng.chance(0.4))
          d = 1;
      }
    } else if (mode < 8) {
      std::size_t drop = static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(s.size()) + 1));
      o = Shape(s.begin() + static_cast<std::ptrdiff_t>(drop), s.end());
    } else if (mode < 9) {
      o = Shape{};
    } else {
      o.insert(o.begin(), rng.pick(std::vector<std::int64_t>{1, 3, 7}));
    }
    Shape out = s;
    if (o.size() > out.size()) out.insert(out.begin(), o.size() - out.size(), 1);
    for (std::size_t i = 0; i < o.size(); ++i) {
      std::size_t j = out.size() - o.size() + i;
      if (out[j] == 1) out[j] = o[i];
    }
    if (out.numel() > lim.max_elems) return s;
    return o;
  }

  /// A tensor operand that broadcasts with value `a`.
  int partner(int a, DTypeSet s) {
    const Shape sa = info(a).shape;
    if (rng.chance(0.35)) {
      int v = existing([&](const Info& i) {
        if (!in(s, i.dtype)) return false;
        try {
          Shape b = broadcast_shapes(sa, i.shape, "fuzz");
          return b.numel() <= lim.max_elems;
        } catch (const Error&) {
          return false;
        }
      });
      if (v >= 0 && v != a) return v;
    }
    DType t = in(s, info(a).dtype) && rng.chance(0.6) ? info(a).dtype : dtype(s);
    return input(t, broadcastable(sa));
  }

  /// A random C++ number operand.
  Number number() {
    Number n;
    int k = static_cast<int>(rng.below(20));
    n.kind = k < 9    ? Number::Kind::Float
             : k < 12 ? Number::Kind::Double
             : k < 18 ? Number::Kind::Int
                      : Number::Kind::Bool;
    static const std::vector<double> reals = {0, 1, -1, 2, 0.5, -2.5, 3, 1e-3, 100, 1e4, 0.1};
    static const std::vector<double> special = {-0.0, HUGE_VAL, -HUGE_VAL, NAN, 1e30, 1e-40, 1e300};
    static const std::vector<double> ints = {0, 1, -1, 2, 3, -7, 100, 65536, 2147483647, -2147483648.0};
    switch (n.kind) {
      case Number::Kind::Float:
      case Number::Kind::Double: {
        double v = rng.chance(0.15) ? rng.pick(special) : rng.pick(reals);
        if (n.kind == Number::Kind::Float && v == 1e300) v = 1e30;
        n.value = v;
        break;
      }
      case Number::Kind::Int:
        n.value = rng.pick(ints);
        break;
      case Number::Kind::Bool:
        n.value = static_cast<double>(rng.below(2));
        break;
    }
    return n;
  }
};

// ---- input values ------------------------------------------------------------------------------

/// `n` elements of dtype `t`: a base distribution (uniform, normal, small integers, wide
/// magnitudes, positive) and, with probability special_rate, a share of special values.
inline std::vector<double> gen_values(Rng& r, DType t, std::int64_t n, double special_rate) {
  std::vector<double> v(static_cast<std::size_t>(n));
  if (t == bool_) {
    double p = r.pick(std::vector<double>{0.5, 0.1, 0.9});
    for (auto& x : v) x = r.chance(p) ? 1 : 0;
    return v;
  }
  bool special = r.chance(special_rate);
  double share = r.pick(std::vector<double>{0.05, 0.15, 0.4});
  if (t == i32 || t == i64) {
    int mode = static_cast<int>(r.below(10));
    std::int64_t lo = mode < 6 ? -5 : mode < 9 ? -100 : -70000, hi = -lo;
    std::vector<double> extremes = t == i32 ? std::vector<double>{-2147483648.0, 2147483647.0, 0, -1, 65536}
                                            : std::vector<double>{-9223372036854775808.0,
                                                                  4611686018427387904.0,
                                                                  -4611686018427387904.0,
                                                                  9007199254740993.0,
                                                                  0,
                                                                  -1,
                                                                  4294967296.0};
    for (auto& x : v) x = special && r.chance(share) ? r.pick(extremes) : static_cast<double>(r.range(lo, hi));
    for (auto& x : v) x = round_to(x, t);
    return v;
  }
  int mode = static_cast<int>(r.below(10));
  for (auto& x : v) {
    double u = r.uniform();
    if (mode < 4)
      x = -3 + 6 * u;
    else if (mode < 6)
      x = std::sqrt(-2 * std::log(1 - u)) * std::cos(6.283185307179586 * r.uniform());
    else if (mode < 7)
      x = static_cast<double>(r.range(-4, 4));
    else if (mode < 8)
      x = (r.chance(0.5) ? -1 : 1) * std::pow(10.0, -6 + 12 * u);
    else
      x = 10 * u;
  }
  if (special) {
    double huge = t == f16 ? 6e4 : t == f64 ? 1e300 : 1e30;
    double tiny = t == f16 ? 6.2e-5 : t == f64 ? 2.3e-308 : 1.2e-38;
    double denorm = t == f16 ? 3e-6 : t == f64 ? 1e-310 : t == bf16 ? 1e-39 : 1e-40;
    std::vector<double> sv = {HUGE_VAL, -HUGE_VAL, NAN,    -0.0,    0.0,          huge,
                              -huge,    tiny,      denorm, -denorm, kiln::largest_finite(t), -kiln::largest_finite(t)};
    for (auto& x : v)
      if (r.chance(share)) x = r.pick(sv);
  }
  for (auto& x : v) x = round_to(x, t);
  return v;
}

// ---- the rows -----------------------------------------------------------------------------------

using PickFn = std::function<bool(Gen&, OpInst&)>;
using PredictFn = std::function<std::optional<Info>(const Program&, const OpInst&)>;
using BuildFn = std::function<Tensor(const Args&)>;
/// Exact values of the op's result computed without kiln (leaves and casts), from the values
/// and dtypes of its operands.
/// `exact_ints` holds the values of int64 operands exactly (doubles round those beyond 2^53;
/// empty for other operands).
using OracleFn = std::function<std::vector<double>(
    const OpInst&, const Info& out, const std::vector<std::vector<double>>& operands,
    const std::vector<DType>& operand_dtypes, const std::vector<std::vector<std::int64_t>>& exact_ints)>;

struct OpDesc {
  std::string name;
  std::string group;  ///< unary, binary, ternary, cast, reduce, view, composite, creation
  PickFn pick;
  PredictFn predict;
  BuildFn build;
  /// The call as C++: {0} {1} {2} operands, {args} all operands as a braced list, {ints} the
  /// int list, {i0}..{i3} one int, {keep} the flag, {dt} the dtype, {real} a double, {seed}.
  std::string cxx;
  double weight = 1;
  /// The documented accuracy of the JIT's version in float, in ulp (docs/performance-math.md,
  /// "Accuracy (float)", test bounds); 0 where the JIT and the reference round the same IEEE
  /// operations. The nudged twin perturbs the op's result by this much (see judge).
  double ulp = 0;
  /// CUDA's bound for the function kiln's CUDA kernels call (the CUDA C++ Programming Guide's
  /// table of single-precision maximum ulp errors), where it is larger than `ulp`.
  double cuda_ulp = 0;
  /// The same as a function of the operand, for bounds that grow with it (gelu's tanh form).
  std::function<double(double)> ulp_of;
  /// The op sums or multiplies many values (reductions but max/min/argmax/argmin, composites
  /// holding such a reduction): the JIT's order of accumulation may differ from the reference's.
  bool accumulates = false;
  /// The op draws a key from the global generator (dropout): kiln::compile refuses that inside a
  /// traced function (docs/semantics.md: randomness inside kiln::compile needs a seed passed
  /// in), so a program holding it is never compiled.
  bool draws_key = false;
  /// How the op's result can depend on the order of its accumulation through the compute
  /// dtype's range (the judge's outputs_after_digitless, docs/fuzzing.md):
  /// - Product: partial products that overflow or underflow in some order (prod);
  /// - Sums: a kept position whose positive or negative terms alone reach the largest value
  ///   over the reduced dims (sum, mean, var); LastDimSums the same over the last dim
  ///   (layer_norm; sums of squares, rms_norm's, overflow in every order or in none);
  /// - Dot: max |a| max |b| K reaching the largest value (matmul);
  /// - Attention: the scores as Dot, the output as a weighted sum of v over S keys, and under
  ///   the causal mask any non-finite v (the fused kernels skip keys past the diagonal a block
  ///   at a time, the definition weighs them by 0).
  enum class OrderRisk { None, Product, Sums, LastDimSums, Dot, Attention };
  OrderRisk order_risk = OrderRisk::None;
  /// The result is the position of a running extreme (cummin's indices): where a later element
  /// lies within a few roundings of the extreme so far, the last ulp picks the position.
  bool running_extreme_position = false;
  /// The accumulation runs along a dim that another operand names positions of (cross_entropy's
  /// targets): the nudged twin keeps its order instead of reversing it.
  bool fixed_order = false;
  /// In the float64 twin, non-floating operands from index lift_from on are widened to f64
  /// when the result is floating (i32 * 2.5f is f32 in the program, f64 in its twin).
  bool lift = true;
  std::size_t lift_from = 0;
  OracleFn oracle;
  /// How far the nudged twin moves each floating operand of an accumulating op, in eps of the
  /// compute dtype (2 when unset; 0: not at all, the row's build models its rounding itself).
  std::function<double(const Program&, const OpInst&)> operand_ulps;
  /// The table version the row joined in (Limits::table_version). Rows are only appended, so
  /// a program's row indices stay valid across versions.
  int since = 1;
};

namespace rules {

inline const Info* tensor_info(const Program& p, const Operand& o) {
  return o.is_number() ? nullptr : &p.info(o.value);
}
inline Typed typed(const Program& p, const Operand& o) {
  if (o.is_number()) return {o.number.wrapped_dtype(), 0};
  const Info& i = p.info(o.value);
  return {i.dtype, i.shape.empty() ? 1 : 2};
}
inline std::optional<Shape> broadcast(const std::vector<Shape>& shapes) {
  Shape out;
  for (const Shape& s : shapes) {
    try {
      out = broadcast_shapes(out, s, "fuzz");
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  return out;
}
/// axis in [-r, r) with r = max(rank, 1) (PyTorch lets a 0-dim tensor use 0 and -1).
inline std::optional<std::int64_t> axis(std::int64_t a, std::size_t rank) {
  std::int64_t r = rank == 0 ? 1 : static_cast<std::int64_t>(rank);
  if (a < -r || a >= r) return std::nullopt;
  return a < 0 ? a + r : a;
}
inline DType float_of(DType t) { return is_floating(t) ? t : f32; }

enum class Unary { Same, Float, Bool };
enum class Binary { Arith, NoBool, TrueDiv, Compare, Logical, Pow };
enum class Reduce { SumProd, FloatOnly, MaxMin, Arg, LogSumExp };

}  // namespace rules

// Shared picks and predicts.

inline Operand T(int v) { return Operand{v, {}}; }
inline Operand N(Number n) { return Operand{-1, n}; }

/// The CUDA math library's documented error bounds (CUDA C++ Programming Guide, "Mathematical
/// Functions"), in ulps, where they exceed what the host gives: the GPU's JIT is judged with them.
inline const std::vector<std::pair<std::string, double>>& cuda_bounds() {
  static const std::vector<std::pair<std::string, double>> b = {
      {"exp", 2}, {"exp2", 2}, {"sin", 2}, {"cos", 2}, {"tan", 4}, {"hypot", 3}, {"pow", 4}};
  return b;
}

/// A float64 tensor of zeros shaped `shape` whose gradient with respect to each of `inputs` is
/// what `rule` makes of the gradient arriving at it (one tensor per input, of its shape): the
/// nudged twin's model of a backward's roundings, which depend on that gradient's magnitude.
inline Tensor zero_with_rule(const Shape& shape, Device device, const std::vector<Tensor>& inputs,
                             std::function<std::vector<Tensor>(const Tensor&)> rule) {
  ir::NodePtr out = ir::constant(0.0, DType::Float64, shape, device);
  std::vector<ir::NodePtr> nodes;
  bool records = false;
  for (const Tensor& t : inputs) {
    nodes.push_back(t.node());
    records = records || ir::records_grad(t.node());
  }
  if (!records) return Tensor(out);
  out->requires_grad = true;
  decomp::with_gradient(out, nodes, [rule](const ir::NodePtr&, const ir::NodePtr& g) {
    std::vector<ir::NodePtr> grads;
    for (const Tensor& t : rule(Tensor(g))) grads.push_back(t.node());
    return grads;
  });
  return Tensor(out);
}

/// The attention rows' value: scaled_dot_product_attention of the row's q, k, v (causal when
/// ints[0] is 1) with dropout p (the key from manual_seed(seed) just before each call, so every
/// build drops the same weights). The nudged twin also adds 2 sqrt(S) eps sum_j p_j |v_j| (the
/// attention of |v|, same mask) to each element, as matmul's row does: the output is a weighted
/// sum of v's rows over S keys, and its rounding is bounded by the terms' magnitudes (v's rows
/// of +-1e6 that cancel to 500 keep an error of a few ulps of 1e6), not by its value; the
/// operands' nudges stand for the scores' rounding. eps is the operands' own for half types:
/// the tensor-core kernels (kiln's and cuDNN's, as FlashAttention's) round the probabilities
/// to q's dtype before the product with v, each term then off by up to half an ulp of that
/// type; float32 and float64 keep them in their own precision.
inline Tensor sdpa_row(const Args& a, double p) {
  const bool causal = a.p().ints[0] != 0;
  auto attend = [&](const Tensor& v) {
    if (p > 0) manual_seed(a.p().seed);
    return scaled_dot_product_attention(a.t[0], a.t[1], v, {}, p, causal);
  };
  Tensor r = attend(a.t[2]);
  if (!a.ctx.perturb) return r;
  const auto& vs = a.t[2].shape();
  const double S = static_cast<double>(std::max<std::int64_t>(1, vs[vs.size() - 2]));
  const DType dt = a.orig_dtype(0);
  const double eps = dtype_eps(dt == DType::Float16 || dt == DType::BFloat16 ? dt : dt == f64 ? f64 : f32);
  Rng rng(a.ctx.perturb ^ (static_cast<std::uint64_t>(r.numel()) * 0x9e3779b97f4a7c15ull + 0xa77e));
  std::vector<double> sign(static_cast<std::size_t>(r.numel()));
  for (auto& v : sign) v = (rng.uniform() < 0.5 ? -1.0 : 1.0) * a.ctx.sign;
  Tensor signs = from_vector<double>(sign, r.shape(), a.ctx.device);
  Tensor nudge = attend(abs(a.t[2])) * (2 * std::sqrt(S) * eps);
  const Tensor &q = a.t[0], &k = a.t[1], &v = a.t[2];
  const std::int64_t L = q.shape()[q.shape().size() - 2], E = q.shape().back();
  const double scale = 1.0 / std::sqrt(static_cast<double>(std::max<std::int64_t>(1, E)));
  const double compute_eps = dt == f64 ? dtype_eps(f64) : dtype_eps(f32);
  Tensor scores = matmul(q, transpose(k, -2, -1)) * scale;
  if (causal) scores = where(triu(ones({L, vs[vs.size() - 2]}, bool_, a.ctx.device), 1), -INFINITY, scores);
  const Tensor probabilities = softmax(scores, -1);
  const Tensor weights = where(isnan(probabilities), 0.0, probabilities);  // P without dropout's mask
  {
    // The scores' rounding, bounded as a product's (matmul's row): each score s_ij off by up
    // to 2 sqrt(E) eps times scale sum_e |q_ie k_je| moves out_i by P_ij (v_j - out_i) times that
    // (fuzz seed 502, graph 276: float32 scores of 160 apart by 1.8; the operands' random
    // nudges happened to cancel). Bounded by (P s|.|) |v| + rowsum(P s|.|) |out|, P without
    // dropout's mask and its 1 / (1 - p) applied to the bound.
    const Tensor terms = matmul(abs(q), transpose(abs(k), -2, -1)) * scale;
    const Tensor w = weights * terms;
    const double factor = 2 * std::sqrt(static_cast<double>(E)) * compute_eps / (1.0 - p);
    nudge = nudge + (matmul(w, abs(v)) + sum(w, -1, true) * abs(r)) * factor;
  }
  if (dt == DType::Float16) {
    // Fused kernels round the weights P to float16 before P·v (as FlashAttention and cuDNN do):
    // a weight below float16's least normal keeps only an absolute precision of 2^-24, which a
    // large value multiplies (fuzz seed 92, graph 1994 on cuDNN: p 6.5e-8 stored as 6.0e-8,
    // times v 60000). The sum of the finite |v| over the keys bounds that error (an infinite
    // value's products are inf or NaN already, and its 0 weights exact).
    const Tensor magnitude = abs(a.t[2]).to(f64);
    nudge = nudge + sum(where(magnitude < INFINITY, magnitude, 0.0), -2, true) * std::ldexp(1.0, -24);
  }
  if (a.prog.grad) {
    // Gradient mode: a fused backward recomputes P as exp(s - lse) from the saved lse, rounded
    // in the compute dtype to an absolute error of about eps |lse|, which scales every P of the
    // row, and so the gradients, by up to 1 + eps |lse| (fuzz seed 502, graph 276: scores of
    // 515 gave the float32 gradients an error of 3e-5). The twin's gradients are scaled by that
    // much (its values stay as they are); |lse| <= max |s| + log S.
    auto largest = [](const Tensor& x) {
      double m = 0;
      for (double e : x.to(f64).to_vector<double>())
        if (std::isfinite(e)) m = std::max(m, std::fabs(e));
      return m;
    };
    const double lse = largest(q) * largest(k) * std::sqrt(static_cast<double>(std::max<std::int64_t>(1, E))) +
                       std::log(S) + 1;
    const double delta = (rng.uniform() < 0.5 ? -1.0 : 1.0) * a.ctx.sign * 2 * compute_eps * lse;
    // (x - x.detach() is 0 with x's gradient; where x is infinite it would be NaN)
    auto zero_with_gradient = [](const Tensor& x) { return where(isfinite(x.detach()), x - x.detach(), 0.0); };
    const Tensor out = r.detach();
    r = Tensor(r + zero_with_gradient(r) * delta);
    // The backward's own roundings, which the value's nudges do not carry into the gradients:
    // dS_ij = P_ij (dP_ij - D_i) with dP_ij = dO_i . v_j and D_i = dO_i . O_i, two dot products
    // over the value features that cancel where a row has one key or P is near one-hot (fuzz
    // seed 602, graph 817: one key, an exact 0 in float64, a float32 kernel's 1.2e-5); for
    // half types a fused backward also takes D from O as stored (rounded to the half type),
    // rounds dS to it before dS k and dS^T q, and P before P^T dO, as FlashAttention's and
    // cuDNN's do (seed 601 graph 659, seed 602 graphs 1285 and 2010 on cuDNN: float16
    // gradients 1-7 % off where P is near one-hot or two rows' terms cancel in dv). Each
    // rounding is at most a unit roundoff u (u_h of the half type, 0 for float32 and float64)
    // of what it rounds, and they add up as independent errors: the twin adds a term of value
    // 0 whose gradients are their root-sum-square, with a random sign per element (so that
    // the nudge moves each gradient by about its rounding, which random signs per term could
    // cancel: 659's two weights of 0.98 and 0.9988 times dO of +-0.8125):
    //   D's error e_i: sqrt(sum_c (dO_ic a_ic)^2), a = (u_h + 2u) |O|, coherent over the keys:
    //     dq_i moves by e_i scale (P k)_i, dk_j by sqrt(sum_i (e_i scale P_ij q_i)^2);
    //   dP's, sqrt(sum_c (dO_ic v_jc 2u)^2), and dS's own, u_h |dS_ij|, through P_ij and
    //     scale k_j (dq) or scale q_i (dk);
    //   dv_j: (u_h + 2u) sqrt(sum_i (P_ij dO_i)^2).
    // P is held without dropout's mask and its 1 / (1 - p) applied to the errors.
    const bool half = dt == DType::Float16 || dt == DType::BFloat16;
    const double u = compute_eps / 2, u_h = half ? dtype_eps(dt) / 2 : 0.0, kept = 1.0 / (1.0 - p);
    const Tensor P = weights.detach(), qd = q.detach(), kd = k.detach(), vd = v.detach();
    std::vector<Tensor> sign_of;  // a random sign per element of q, k and v
    for (const Tensor* x : {&q, &k, &v}) {
      std::vector<double> e(static_cast<std::size_t>(x->numel()));
      for (auto& s : e) s = (rng.uniform() < 0.5 ? -1.0 : 1.0) * a.ctx.sign;
      sign_of.push_back(from_vector<double>(e, x->shape(), a.ctx.device));
    }
    // variance summed over the dims where `like` is 1 or absent (undoing a broadcast)
    auto fold = [](Tensor var, const Shape& like) {
      while (var.dim() > static_cast<std::int64_t>(like.size())) var = sum(var, {0}, false);
      for (std::size_t d = 0; d < like.size(); ++d)
        if (like[d] == 1 && var.shape()[d] != 1) var = sum(var, {static_cast<std::int64_t>(d)}, true);
      return var;
    };
    auto kT = [](const Tensor& x) { return transpose(x, -2, -1); };
    const Tensor rounding = zero_with_rule(r.shape(), a.ctx.device, {q, k, v}, [=](const Tensor& g) {
      const Tensor G = where(isfinite(g), g, 0.0);
      const Tensor e2 = sum(square(G * abs(out) * (u_h + 2 * u)), -1, true);  // [.., L, 1]
      const Tensor dP2 = matmul(square(G), kT(square(vd))) * (4 * u * u);  // [.., L, S]
      const Tensor dS = P * (matmul(G, kT(vd)) - sum(G * out, -1, true));
      const Tensor own = square(P) * dP2 + square(dS) * (u_h * u_h);
      const double s2 = 1.0 / static_cast<double>(std::max<std::int64_t>(1, E));  // scale^2
      const Tensor dq2 = (e2 * square(matmul(P, kd)) + matmul(own, square(kd))) * s2;
      const Tensor dk2 = matmul(kT(square(P) * e2 + own), square(qd)) * s2;
      const Tensor dv2 = matmul(kT(square(P)), square(G)) * ((u_h + 2 * u) * (u_h + 2 * u));
      auto error = [&](const Tensor& var, std::size_t i, const Shape& like) {
        const Tensor e = sqrt(fold(var, like)) * kept;
        return Tensor(where(isfinite(e), e, 0.0) * sign_of[i]);
      };
      return std::vector<Tensor>{error(dq2, 0, q.shape()), error(dk2, 1, k.shape()), error(dv2, 2, v.shape())};
    });
    r = Tensor(r + rounding);
  }
  return Tensor(r + nudge * signs);
}

inline OpDesc unary_row(const char* name, DTypeSet accepts, rules::Unary rule, const char* cxx,
                        Tensor (*f)(const Tensor&), double weight = 0.35) {
  OpDesc d;
  d.name = name;
  d.group = "unary";
  d.cxx = cxx;
  d.weight = weight;
  d.pick = [accepts](Gen& g, OpInst& op) {
    int x = g.operand(accepts);
    if (x < 0) return false;
    op.args = {T(x)};
    return true;
  };
  d.predict = [accepts, rule](const Program& p, const OpInst& op) -> std::optional<Info> {
    if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
    const Info& x = p.info(op.args[0].value);
    if (!in(accepts, x.dtype)) return std::nullopt;
    DType out = rule == rules::Unary::Same ? x.dtype : rule == rules::Unary::Float ? rules::float_of(x.dtype) : bool_;
    return Info{out, x.shape};
  };
  d.build = [f](const Args& a) { return f(a.t[0]); };
  // docs/performance-math.md, "Accuracy (float)": the test bound of each kiln_<fn>_f32 (sin/cos/
  // tan beyond 2^20 are libm's, more accurate); "Composites with cancelling or overflowing
  // tails": the CPU bounds of gelu, silu and sigmoid, and gelu's tanh form 6 + 4|2u| ulp, u its
  // tanh argument.
  static const std::vector<std::pair<std::string, double>> bounds = {
      {"exp", 1.1}, {"exp2", 1.1},    {"expm1", 1.6}, {"log", 1.0}, {"log2", 1.8}, {"log1p", 1.0}, {"tanh", 2.6},
      {"erf", 2.0}, {"sigmoid", 2.5}, {"sin", 1.7},   {"cos", 1.9}, {"tan", 3.2},  {"gelu", 6},    {"silu", 5}};
  for (auto& [n, u] : bounds)
    if (n == name) d.ulp = u;
  for (auto& [n, u] : cuda_bounds())
    if (n == name) d.cuda_ulp = u;
  if (std::string(name) == "gelu_tanh") {
    d.ulp = 6;
    d.ulp_of = [](double x) { return 6 + 4 * std::fabs(2 * 0.7978845608028654 * (x + 0.044715 * x * x * x)); };
  }
  return d;
}

inline bool pick_binary(Gen& g, OpInst& op, DTypeSet accepts, bool pow_exponents = false) {
  int a = g.operand(accepts);
  if (a < 0) return false;
  Operand b;
  if (g.rng.chance(0.25)) {
    Number n = g.number();
    if (pow_exponents && g.rng.chance(0.7)) {
      static const std::vector<double> e = {2, 3, 0.5, -1, -2, 0, 1, 2.5, -0.5};
      n.value = g.rng.pick(e);
      if (n.kind == Number::Kind::Int || n.kind == Number::Kind::Bool) n.value = std::floor(n.value);
      if (n.kind == Number::Kind::Bool) n.value = n.value != 0;
    }
    b = N(n);
  } else {
    b = T(g.partner(a, accepts));
  }
  op.args = {T(a), b};
  if (g.rng.chance(0.15)) std::swap(op.args[0], op.args[1]);
  return true;
}

template <class F>
OpDesc binary_row(const char* name, DTypeSet accepts, rules::Binary rule, const char* cxx, F f, double weight = 1) {
  OpDesc d;
  d.name = name;
  d.group = "binary";
  d.cxx = cxx;
  d.weight = weight;
  d.pick = [accepts, rule](Gen& g, OpInst& op) { return pick_binary(g, op, accepts, rule == rules::Binary::Pow); };
  d.predict = [accepts, rule](const Program& p, const OpInst& op) -> std::optional<Info> {
    if (op.args.size() != 2 || (op.args[0].is_number() && op.args[1].is_number())) return std::nullopt;
    std::vector<Shape> shapes;
    for (auto& o : op.args) {
      if (o.is_number()) continue;
      if (!in(accepts, p.info(o.value).dtype)) return std::nullopt;
      shapes.push_back(p.info(o.value).shape);
    }
    auto shape = rules::broadcast(shapes);
    if (!shape) return std::nullopt;
    DType common = result_type({rules::typed(p, op.args[0]), rules::typed(p, op.args[1])});
    DType out = common;
    switch (rule) {
      case rules::Binary::Arith:
        break;
      case rules::Binary::NoBool:
        // semantics.md: a subtraction with any bool operand (a tensor or a number) is a
        // DTypeError (as PyTorch).
        if (common == bool_) return std::nullopt;
        for (auto& o : op.args)
          if (rules::typed(p, o).dtype == bool_) return std::nullopt;
        break;
      case rules::Binary::Pow:
        if (common == bool_) return std::nullopt;
        // PyTorch: "Integers to negative integer powers are not allowed" (a number exponent).
        if (category(common) == 1 && op.args[1].is_number() && op.args[1].number.value < 0) return std::nullopt;
        break;
      case rules::Binary::TrueDiv:
        out = rules::float_of(common);
        break;
      case rules::Binary::Compare:
      case rules::Binary::Logical:
        out = bool_;
        break;
    }
    return Info{out, *shape};
  };
  d.build = [f](const Args& a) { return with_operands2(a, 0, 1, f); };
  for (auto& [n, u] : cuda_bounds())
    if (n == name) d.cuda_ulp = u;
  return d;
}

/// Reduction axes for a tensor of rank r: all ({}), one (maybe negative), or a subset.
inline std::vector<std::int64_t> pick_axes(Rng& r, std::size_t rank, bool one_at_most = false) {
  std::vector<std::int64_t> ax;
  int mode = static_cast<int>(r.below(10));
  if (rank == 0) {
    if (mode < 5) return ax;
    return {r.chance(0.5) ? 0 : -1};
  }
  if (mode < 3) return ax;
  if (mode < 7 || one_at_most) {
    std::int64_t a = r.below(static_cast<std::int64_t>(rank));
    return {r.chance(0.3) ? a - static_cast<std::int64_t>(rank) : a};
  }
  for (std::size_t d = 0; d < rank; ++d)
    if (r.chance(0.5)) ax.push_back(static_cast<std::int64_t>(d));
  if (ax.empty()) ax.push_back(0);
  if (r.chance(0.3)) std::reverse(ax.begin(), ax.end());  // any order is accepted
  return ax;
}

inline std::optional<std::vector<std::int64_t>> norm_axes(const std::vector<std::int64_t>& ax, std::size_t rank) {
  std::vector<std::int64_t> out;
  for (auto a : ax) {
    auto n = rules::axis(a, rank);
    if (!n) return std::nullopt;
    if (rank == 0) continue;
    if (std::find(out.begin(), out.end(), *n) != out.end()) return std::nullopt;
    out.push_back(*n);
  }
  if (ax.empty())
    for (std::size_t d = 0; d < rank; ++d) out.push_back(static_cast<std::int64_t>(d));
  std::sort(out.begin(), out.end());
  return out;
}

inline Shape reduced_shape(const Shape& s, const std::vector<std::int64_t>& axes, bool keep) {
  Shape out;
  for (std::size_t d = 0; d < s.size(); ++d) {
    bool r = std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) != axes.end();
    if (!r)
      out.push_back(s[d]);
    else if (keep)
      out.push_back(1);
  }
  return out;
}

inline OpDesc reduce_row(const char* name, DTypeSet accepts, rules::Reduce rule, const char* cxx,
                         Tensor (*f)(const Tensor&, const Axes&, bool), double weight = 1.2) {
  OpDesc d;
  d.name = name;
  d.group = "reduce";
  d.cxx = cxx;
  d.weight = weight;
  d.pick = [accepts, rule](Gen& g, OpInst& op) {
    int x = g.operand(accepts);
    if (x < 0) return false;
    op.args = {T(x)};
    op.p.ints = pick_axes(g.rng, g.info(x).shape.size(), rule == rules::Reduce::Arg);
    op.p.flag = g.rng.chance(0.4);
    return true;
  };
  d.predict = [accepts, rule](const Program& p, const OpInst& op) -> std::optional<Info> {
    if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
    const Info& x = p.info(op.args[0].value);
    if (!in(accepts, x.dtype)) return std::nullopt;
    auto axes = norm_axes(op.p.ints, x.shape.size());
    if (!axes) return std::nullopt;
    DType out = x.dtype;
    switch (rule) {
      case rules::Reduce::SumProd:
        out = is_floating(x.dtype) ? x.dtype : i64;
        break;
      case rules::Reduce::FloatOnly:
        break;
      case rules::Reduce::LogSumExp:
        out = rules::float_of(x.dtype);
        break;
      case rules::Reduce::MaxMin:
      case rules::Reduce::Arg:
        // semantics.md: max/min/argmax/argmin over an empty dimension are ShapeErrors.
        for (auto a : *axes)
          if (x.shape[static_cast<std::size_t>(a)] == 0) return std::nullopt;
        if (rule == rules::Reduce::Arg) {
          out = i64;
          if (op.p.ints.size() > 1) return std::nullopt;
          if (op.p.ints.empty()) {
            if (x.shape.numel() == 0) return std::nullopt;
            return Info{out, op.p.flag ? Shape(x.shape.size(), 1) : Shape{}};
          }
        }
        break;
    }
    return Info{out, reduced_shape(x.shape, *axes, op.p.flag)};
  };
  d.build = [f](const Args& a) { return f(a.t[0], Axes(a.p().ints), a.p().flag); };
  d.accumulates = rule != rules::Reduce::MaxMin && rule != rules::Reduce::Arg;
  return d;
}

/// The values of a cast, by the documented rules (semantics.md, "Casts": floats truncate toward
/// zero, NaN and out-of-range values give the minimum; integer narrowing wraps, as in PyTorch).
/// `exact` holds the operand's values exactly when it is int64 (its low 32 bits decide a
/// narrowing, which the doubles in `v` lose beyond 2^53).
inline std::vector<double> cast_values(const std::vector<double>& v, DType from, DType to,
                                       const std::vector<std::int64_t>& exact = {}) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (from == i64 && to == i64 && i < exact.size())
      out[i] = static_cast<double>(exact[i]);  // the identity; through double it could leave int64's range
    else if (!is_floating(from) && to == i32)
      out[i] =
          static_cast<double>(static_cast<std::int32_t>(i < exact.size() ? exact[i] : static_cast<std::int64_t>(v[i])));
    else
      out[i] = round_to(v[i], to);
  }
  return out;
}

/// A random factorisation of n into 1..4 dims (a 0 somewhere when n == 0), maybe with one -1.
inline std::vector<std::int64_t> pick_reshape(Rng& r, std::int64_t n, bool& inferred) {
  std::vector<std::int64_t> dims;
  int rank = static_cast<int>(r.range(n == 1 ? 0 : 1, 4));
  if (n == 0) {
    for (int i = 0; i < rank; ++i) dims.push_back(r.pick(std::vector<std::int64_t>{1, 3, 7}));
    dims[static_cast<std::size_t>(r.below(rank))] = 0;
    inferred = false;
    return dims;
  }
  std::int64_t m = n;
  for (int i = 0; i + 1 < rank; ++i) {
    std::vector<std::int64_t> divs;
    for (std::int64_t k = 1; k <= m && k <= 1000; ++k)
      if (m % k == 0) divs.push_back(k);
    std::int64_t d = r.pick(divs);
    dims.push_back(d);
    m /= d;
  }
  if (rank > 0) dims.push_back(m);
  for (std::size_t i = dims.size(); i-- > 1;)
    std::swap(dims[i], dims[static_cast<std::size_t>(r.below(static_cast<std::int64_t>(i) + 1))]);
  inferred = !dims.empty() && r.chance(0.3);
  if (inferred) dims[static_cast<std::size_t>(r.below(static_cast<std::int64_t>(dims.size())))] = -1;
  return dims;
}

/// Python slicing's length, without the overflow of (stop - start + step - 1) / step.
inline std::int64_t slice_count(std::int64_t n, std::int64_t start, std::int64_t stop, std::int64_t step) {
  auto clampi = [n](std::int64_t v) {
    if (v < 0) v = v < -n ? 0 : v + n;
    return std::min(v, n);
  };
  std::int64_t b = clampi(start), e = clampi(stop);
  return e > b ? (e - b - 1) / step + 1 : 0;
}

// ---- the table -------------------------------------------------------------------------------

inline const std::vector<OpDesc>& op_table() {
  using rules::Binary;
  using rules::Reduce;
  using rules::Unary;
  static const std::vector<OpDesc> table = [] {
    std::vector<OpDesc> t;
    // -- unary pointwise
    t.push_back(unary_row(
        "neg", kNotBool, Unary::Same, "-{0}", [](const Tensor& x) -> Tensor { return -x; }, 0.6));
    t.push_back(unary_row(
        "abs", kAll, Unary::Same, "abs({0})", [](const Tensor& x) -> Tensor { return abs(x); }, 0.6));
    {  // PyTorch refuses abs of bool. Still picked from every dtype, so that the graphs of seeds
       // that never took a bool abs stay as they were.
      PredictFn base = t.back().predict;
      t.back().predict = [base](const Program& p, const OpInst& op) -> std::optional<Info> {
        auto info = base(p, op);
        if (info && info->dtype == bool_) return std::nullopt;
        return info;
      };
    }
    t.push_back(unary_row("exp", kAll, Unary::Float, "exp({0})", [](const Tensor& x) -> Tensor { return exp(x); }));
    t.push_back(unary_row("exp2", kAll, Unary::Float, "exp2({0})", [](const Tensor& x) -> Tensor { return exp2(x); }));
    t.push_back(unary_row("log", kAll, Unary::Float, "log({0})", [](const Tensor& x) -> Tensor { return log(x); }));
    t.push_back(unary_row("log2", kAll, Unary::Float, "log2({0})", [](const Tensor& x) -> Tensor { return log2(x); }));
    t.push_back(
        unary_row("log1p", kAll, Unary::Float, "log1p({0})", [](const Tensor& x) -> Tensor { return log1p(x); }));
    t.push_back(
        unary_row("expm1", kAll, Unary::Float, "expm1({0})", [](const Tensor& x) -> Tensor { return expm1(x); }));
    t.push_back(unary_row("sqrt", kAll, Unary::Float, "sqrt({0})", [](const Tensor& x) -> Tensor { return sqrt(x); }));
    t.push_back(
        unary_row("rsqrt", kAll, Unary::Float, "rsqrt({0})", [](const Tensor& x) -> Tensor { return rsqrt(x); }));
    t.push_back(unary_row("sin", kAll, Unary::Float, "sin({0})", [](const Tensor& x) -> Tensor { return sin(x); }));
    t.push_back(unary_row("cos", kAll, Unary::Float, "cos({0})", [](const Tensor& x) -> Tensor { return cos(x); }));
    t.push_back(unary_row("tan", kAll, Unary::Float, "tan({0})", [](const Tensor& x) -> Tensor { return tan(x); }));
    t.push_back(unary_row("tanh", kAll, Unary::Float, "tanh({0})", [](const Tensor& x) -> Tensor { return tanh(x); }));
    t.push_back(unary_row("erf", kAll, Unary::Float, "erf({0})", [](const Tensor& x) -> Tensor { return erf(x); }));
    t.push_back(
        unary_row("sigmoid", kAll, Unary::Float, "sigmoid({0})", [](const Tensor& x) -> Tensor { return sigmoid(x); }));
    t.push_back(
        unary_row("floor", kNotBool, Unary::Same, "floor({0})", [](const Tensor& x) -> Tensor { return floor(x); }));
    t.push_back(
        unary_row("ceil", kNotBool, Unary::Same, "ceil({0})", [](const Tensor& x) -> Tensor { return ceil(x); }));
    t.push_back(
        unary_row("round", kNotBool, Unary::Same, "round({0})", [](const Tensor& x) -> Tensor { return round(x); }));
    t.push_back(unary_row(
        "relu", kNotBool, Unary::Same, "relu({0})", [](const Tensor& x) -> Tensor { return relu(x); }, 0.6));
    // semantics.md / PyTorch: gelu and silu need a floating input.
    t.push_back(unary_row(
        "gelu", kFloats, Unary::Same, "gelu({0})", [](const Tensor& x) -> Tensor { return gelu(x); }, 0.5));
    t.push_back(unary_row(
        "gelu_tanh", kFloats, Unary::Same, "gelu({0}, true)", [](const Tensor& x) -> Tensor { return gelu(x, true); },
        0.5));
    t.push_back(unary_row(
        "silu", kFloats, Unary::Same, "silu({0})", [](const Tensor& x) -> Tensor { return silu(x); }, 0.5));
    t.push_back(unary_row(
        "logical_not", kAll, Unary::Bool, "!{0}", [](const Tensor& x) -> Tensor { return !x; }, 0.5));
    t.push_back(unary_row(
        "isnan", kAll, Unary::Bool, "isnan({0})", [](const Tensor& x) -> Tensor { return isnan(x); }, 0.5));
    t.push_back(unary_row(
        "isinf", kAll, Unary::Bool, "isinf({0})", [](const Tensor& x) -> Tensor { return isinf(x); }, 0.5));

    // -- binary pointwise (a tensor and a tensor or a C++ number, broadcasting)
    t.push_back(binary_row("add", kAll, Binary::Arith, "{0} + {1}",
                           [](const auto& a, const auto& b) -> Tensor { return a + b; }));
    t.push_back(binary_row("sub", kAll, Binary::NoBool, "{0} - {1}",
                           [](const auto& a, const auto& b) -> Tensor { return a - b; }));
    t.push_back(binary_row("mul", kAll, Binary::Arith, "{0} * {1}",
                           [](const auto& a, const auto& b) -> Tensor { return a * b; }));
    t.push_back(binary_row("div", kAll, Binary::TrueDiv, "{0} / {1}",
                           [](const auto& a, const auto& b) -> Tensor { return a / b; }));
    t.push_back(binary_row("pow", kAll, Binary::Pow, "pow({0}, {1})",
                           [](const auto& a, const auto& b) -> Tensor { return pow(a, b); }));
    t.push_back(binary_row("maximum", kAll, Binary::Arith, "maximum({0}, {1})",
                           [](const auto& a, const auto& b) -> Tensor { return maximum(a, b); }));
    t.push_back(binary_row("minimum", kAll, Binary::Arith, "minimum({0}, {1})",
                           [](const auto& a, const auto& b) -> Tensor { return minimum(a, b); }));
    t.push_back(binary_row(
        "eq", kAll, Binary::Compare, "{0} == {1}", [](const auto& a, const auto& b) -> Tensor { return a == b; }, 0.5));
    t.push_back(binary_row(
        "ne", kAll, Binary::Compare, "{0} != {1}", [](const auto& a, const auto& b) -> Tensor { return a != b; }, 0.5));
    t.push_back(binary_row(
        "lt", kAll, Binary::Compare, "{0} < {1}", [](const auto& a, const auto& b) -> Tensor { return a < b; }, 0.5));
    t.push_back(binary_row(
        "le", kAll, Binary::Compare, "{0} <= {1}", [](const auto& a, const auto& b) -> Tensor { return a <= b; }, 0.5));
    t.push_back(binary_row(
        "gt", kAll, Binary::Compare, "{0} > {1}", [](const auto& a, const auto& b) -> Tensor { return a > b; }, 0.5));
    t.push_back(binary_row(
        "ge", kAll, Binary::Compare, "{0} >= {1}", [](const auto& a, const auto& b) -> Tensor { return a >= b; }, 0.5));
    t.push_back(binary_row(
        "logical_and", kAll, Binary::Logical, "{0} && {1}",
        [](const auto& a, const auto& b) -> Tensor { return a && b; }, 0.5));
    t.push_back(binary_row(
        "logical_or", kAll, Binary::Logical, "{0} || {1}",
        [](const auto& a, const auto& b) -> Tensor { return a || b; }, 0.5));

    // -- ternary: where(cond, a, b) and clamp(x, lo, hi), operands tensors or numbers
    {
      OpDesc d;
      d.name = "where";
      d.group = "ternary";
      d.cxx = "where({0}, {1}, {2})";
      d.lift_from = 1;
      d.pick = [](Gen& g, OpInst& op) {
        int c = g.operand(bit(bool_));
        if (c < 0) return false;
        op.args = {T(c)};
        for (int k = 0; k < 2; ++k) op.args.push_back(g.rng.chance(0.3) ? N(g.number()) : T(g.partner(c, kAll)));
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 3 || op.args[0].is_number()) return std::nullopt;
        // semantics: the condition must be bool (DTypeError otherwise).
        if (p.info(op.args[0].value).dtype != bool_) return std::nullopt;
        std::vector<Shape> shapes;
        for (auto& o : op.args)
          if (!o.is_number()) shapes.push_back(p.info(o.value).shape);
        auto shape = rules::broadcast(shapes);
        if (!shape) return std::nullopt;
        return Info{result_type({rules::typed(p, op.args[1]), rules::typed(p, op.args[2])}), *shape};
      };
      d.build = [](const Args& a) {
        return with_operand(a, 1, [&](const auto& x) {
          return with_operand(a, 2, [&](const auto& y) -> Tensor { return where(a.t[0], x, y); });
        });
      };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "clamp";
      d.group = "ternary";
      d.cxx = "clamp({0}, {1}, {2})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        for (int k = 0; k < 2; ++k) op.args.push_back(g.rng.chance(0.5) ? N(g.number()) : T(g.partner(x, kAll)));
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 3 || op.args[0].is_number()) return std::nullopt;
        std::vector<Shape> shapes;
        for (auto& o : op.args)
          if (!o.is_number()) shapes.push_back(p.info(o.value).shape);
        auto shape = rules::broadcast(shapes);
        if (!shape) return std::nullopt;
        // torch.clamp promotes over all three operands at once (result_type(x, min, max)).
        DType out =
            result_type({rules::typed(p, op.args[0]), rules::typed(p, op.args[1]), rules::typed(p, op.args[2])});
        if (out == bool_) return std::nullopt;  // PyTorch: clamp is not implemented for bool
        return Info{out, *shape};
      };
      d.build = [](const Args& a) {
        return with_operand(a, 1, [&](const auto& lo) {
          return with_operand(a, 2, [&](const auto& hi) -> Tensor { return clamp(a.t[0], lo, hi); });
        });
      };
      t.push_back(d);
    }

    // -- casts
    {
      OpDesc d;
      d.name = "to";
      d.group = "cast";
      d.cxx = "{0}.to({dt})";
      d.weight = 3;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        op.p.dtype = g.dtype(kAll);
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
        return Info{op.p.dtype, p.info(op.args[0].value).shape};
      };
      d.build = [](const Args& a) { return a.t[0].to(a.dt(a.p().dtype)); };
      d.oracle = [](const OpInst& op, const Info&, const std::vector<std::vector<double>>& v,
                    const std::vector<DType>& dt, const std::vector<std::vector<std::int64_t>>& ints) {
        return cast_values(v[0], dt[0], op.p.dtype, ints[0]);
      };
      t.push_back(d);
    }

    // -- reductions
    t.push_back(reduce_row("sum", kAll, Reduce::SumProd, "sum({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return sum(x, a, k); }));
    t.back().order_risk = OpDesc::OrderRisk::Sums;
    t.push_back(reduce_row(
        "prod", kAll, Reduce::SumProd, "prod({0}, {ints}, {keep})",
        [](const Tensor& x, const Axes& a, bool k) { return prod(x, a, k); }, 0.8));
    t.back().order_risk = OpDesc::OrderRisk::Product;
    t.push_back(reduce_row("mean", kFloats, Reduce::FloatOnly, "mean({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return mean(x, a, k); }));
    t.back().order_risk = OpDesc::OrderRisk::Sums;
    t.push_back(reduce_row("max", kAll, Reduce::MaxMin, "max({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return max(x, a, k); }));
    t.push_back(reduce_row("min", kAll, Reduce::MaxMin, "min({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return min(x, a, k); }));
    // argmax/argmin of bool: a DTypeError in kiln and PyTorch ("not implemented for 'Bool'").
    t.push_back(reduce_row("argmax", kNotBool, Reduce::Arg, "argmax({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return argmax(x, a, k); }));
    t.push_back(reduce_row("argmin", kNotBool, Reduce::Arg, "argmin({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return argmin(x, a, k); }));
    t.push_back(reduce_row("logsumexp", kAll, Reduce::LogSumExp, "logsumexp({0}, {ints}, {keep})",
                           [](const Tensor& x, const Axes& a, bool k) { return logsumexp(x, a, k); }));
    {
      OpDesc d = reduce_row("var", kFloats, Reduce::FloatOnly, "var({0}, {ints}, {keep}, {real})", nullptr);
      d.order_risk = OpDesc::OrderRisk::Sums;
      PickFn base = d.pick;
      d.pick = [base](Gen& g, OpInst& op) {
        if (!base(g, op)) return false;
        op.p.real = g.rng.pick(std::vector<double>{1, 1, 0, 2});
        return true;
      };
      d.build = [](const Args& a) { return var(a.t[0], Axes(a.p().ints), a.p().flag, a.p().real); };
      t.push_back(d);
    }

    // -- views and shape ops
    {
      OpDesc d;
      d.name = "reshape";
      d.group = "view";
      d.cxx = "reshape({0}, {ints})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        bool inferred = false;
        op.p.ints = pick_reshape(g.rng, g.info(x).shape.numel(), inferred);
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        Shape s(op.p.ints.begin(), op.p.ints.end());
        std::int64_t known = 1;
        int infer = -1;
        for (std::size_t i = 0; i < s.size(); ++i) {
          if (s[i] == -1) {
            if (infer >= 0) return std::nullopt;
            infer = static_cast<int>(i);
          } else if (s[i] < 0) {
            return std::nullopt;
          } else {
            known *= s[i];
          }
        }
        if (infer >= 0) {
          if (known == 0 || x.shape.numel() % known != 0) return std::nullopt;
          s[static_cast<std::size_t>(infer)] = x.shape.numel() / known;
        }
        if (s.numel() != x.shape.numel() || s.size() > 8) return std::nullopt;
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return reshape(a.t[0], Shape(a.p().ints.begin(), a.p().ints.end())); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "permute";
      d.group = "view";
      d.cxx = "permute({0}, {ints})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 1);
        if (x < 0) return false;
        op.args = {T(x)};
        std::int64_t r = static_cast<std::int64_t>(g.info(x).shape.size());
        op.p.ints.resize(static_cast<std::size_t>(r));
        for (std::int64_t i = 0; i < r; ++i) op.p.ints[static_cast<std::size_t>(i)] = i;
        for (std::int64_t i = r; i-- > 1;)
          std::swap(op.p.ints[static_cast<std::size_t>(i)], op.p.ints[static_cast<std::size_t>(g.rng.below(i + 1))]);
        for (auto& v : op.p.ints)
          if (g.rng.chance(0.2)) v -= r;
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (op.p.ints.size() != x.shape.size()) return std::nullopt;
        Shape s;
        std::vector<bool> seen(x.shape.size(), false);
        for (auto v : op.p.ints) {
          auto a = rules::axis(v, x.shape.size());
          if (!a || x.shape.empty() || seen[static_cast<std::size_t>(*a)]) return std::nullopt;
          seen[static_cast<std::size_t>(*a)] = true;
          s.push_back(x.shape[static_cast<std::size_t>(*a)]);
        }
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return permute(a.t[0], a.p().ints); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "transpose";
      d.group = "view";
      d.cxx = "transpose({0}, {i0}, {i1})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        std::int64_t r = std::max<std::int64_t>(1, static_cast<std::int64_t>(g.info(x).shape.size()));
        op.p.ints = {g.rng.range(-r, r - 1), g.rng.range(-r, r - 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 2) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        auto a = rules::axis(op.p.ints[0], x.shape.size()), b = rules::axis(op.p.ints[1], x.shape.size());
        if (!a || !b) return std::nullopt;  // PyTorch: even a 0-dim tensor only takes dims 0 and -1
        Shape s = x.shape;
        if (!s.empty()) std::swap(s[static_cast<std::size_t>(*a)], s[static_cast<std::size_t>(*b)]);
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return transpose(a.t[0], a.p().ints[0], a.p().ints[1]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "slice";
      d.group = "view";
      d.cxx = "slice({0}, {i0}, {i1}, {i2}, {i3})";
      d.weight = 1.5;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 1);
        if (x < 0) return false;
        op.args = {T(x)};
        const Shape& s = g.info(x).shape;
        std::int64_t r = static_cast<std::int64_t>(s.size());
        std::int64_t axis = g.rng.below(r);
        std::int64_t n = s[static_cast<std::size_t>(axis)];
        auto bound = [&] {
          if (g.rng.chance(0.05)) return g.rng.chance(0.5) ? std::numeric_limits<std::int64_t>::max() : -n - 5;
          return g.rng.range(-n - 2, n + 2);
        };
        std::int64_t start = g.rng.chance(0.3) ? 0 : bound(), stop = g.rng.chance(0.3) ? n : bound();
        std::int64_t step = g.rng.chance(0.03) ? std::numeric_limits<std::int64_t>::max()
                                               : g.rng.pick(std::vector<std::int64_t>{1, 1, 1, 2, 3, 5});
        op.p.ints = {g.rng.chance(0.2) ? axis - r : axis, start, stop, step};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 4) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (x.shape.empty() || op.p.ints[3] <= 0) return std::nullopt;
        auto a = rules::axis(op.p.ints[0], x.shape.size());
        if (!a) return std::nullopt;
        Shape s = x.shape;
        s[static_cast<std::size_t>(*a)] =
            slice_count(s[static_cast<std::size_t>(*a)], op.p.ints[1], op.p.ints[2], op.p.ints[3]);
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return slice(a.t[0], a.p().ints[0], a.p().ints[1], a.p().ints[2], a.p().ints[3]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "broadcast_to";
      d.group = "view";
      d.cxx = "broadcast_to({0}, {ints})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        Shape s = g.info(x).shape;
        for (auto& v : s)
          if (v == 1 && g.rng.chance(0.6)) v = g.dim();
        if (g.rng.chance(0.4)) s.insert(s.begin(), g.rng.pick(std::vector<std::int64_t>{1, 3, 7}));
        if (s.numel() > g.lim.max_elems) s = g.info(x).shape;
        op.p.ints.assign(s.begin(), s.end());
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        Shape s(op.p.ints.begin(), op.p.ints.end());
        if (x.shape.size() > s.size() || s.size() > 8) return std::nullopt;
        for (std::size_t i = 0; i < x.shape.size(); ++i) {
          std::int64_t a = x.shape[x.shape.size() - 1 - i], b = s[s.size() - 1 - i];
          if (a != b && a != 1) return std::nullopt;
        }
        for (auto v : s)
          if (v < 0) return std::nullopt;
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return broadcast_to(a.t[0], Shape(a.p().ints.begin(), a.p().ints.end())); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "unsqueeze";
      d.group = "view";
      d.cxx = "unsqueeze({0}, {i0})";
      d.weight = 0.7;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 0, 3);
        if (x < 0) return false;
        op.args = {T(x)};
        std::int64_t r = static_cast<std::int64_t>(g.info(x).shape.size()) + 1;
        op.p.ints = {g.rng.range(-r, r - 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 1) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        std::int64_t r = static_cast<std::int64_t>(x.shape.size()) + 1, dim = op.p.ints[0];
        if (dim < -r || dim >= r || r > 8) return std::nullopt;
        if (dim < 0) dim += r;
        Shape s = x.shape;
        s.insert(s.begin() + dim, 1);
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return unsqueeze(a.t[0], a.p().ints[0]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "squeeze";
      d.group = "view";
      d.cxx = "squeeze({0})";
      d.weight = 0.5;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        Shape s;
        for (auto v : x.shape)
          if (v != 1) s.push_back(v);
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return squeeze(a.t[0]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "squeeze_dim";
      d.group = "view";
      d.cxx = "squeeze({0}, {i0})";
      d.weight = 0.5;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        std::int64_t r = std::max<std::int64_t>(1, static_cast<std::int64_t>(g.info(x).shape.size()));
        op.p.ints = {g.rng.range(-r, r - 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 1) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        auto a = rules::axis(op.p.ints[0], x.shape.size());
        if (!a) return std::nullopt;
        Shape s = x.shape;
        if (!s.empty() && s[static_cast<std::size_t>(*a)] == 1) s.erase(s.begin() + *a);
        return Info{x.dtype, s};
      };
      d.build = [](const Args& a) { return squeeze(a.t[0], a.p().ints[0]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "concat";
      d.group = "view";
      d.cxx = "concat({args}, {i0})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 1);
        if (x < 0) return false;
        const Shape s = g.info(x).shape;
        std::int64_t r = static_cast<std::int64_t>(s.size());
        std::int64_t axis = g.rng.below(r);
        op.args = {T(x)};
        int pieces = static_cast<int>(g.rng.range(1, 3));
        for (int k = 0; k < pieces; ++k) {
          Shape o = s;
          o[static_cast<std::size_t>(axis)] =
              g.rng.chance(0.3) ? s[static_cast<std::size_t>(axis)] : g.rng.pick(std::vector<std::int64_t>{0, 1, 3, 7});
          int v = g.rng.chance(0.3) ? g.existing([&](const Info& i) { return i.shape == o; }) : -1;
          if (v < 0) v = g.input(g.rng.chance(0.6) ? g.info(x).dtype : g.dtype(kAll), o);
          op.args.push_back(T(v));
        }
        if (g.rng.chance(0.3)) std::swap(op.args[0], op.args.back());
        op.p.ints = {g.rng.chance(0.2) ? axis - r : axis};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.empty() || op.p.ints.size() != 1) return std::nullopt;
        for (auto& o : op.args)
          if (o.is_number()) return std::nullopt;
        const Info& first = p.info(op.args[0].value);
        if (first.shape.empty()) return std::nullopt;
        auto a = rules::axis(op.p.ints[0], first.shape.size());
        if (!a) return std::nullopt;
        Shape s = first.shape;
        s[static_cast<std::size_t>(*a)] = 0;
        DType dt = first.dtype;
        for (auto& o : op.args) {
          const Info& i = p.info(o.value);
          if (i.shape.size() != first.shape.size()) return std::nullopt;
          for (std::size_t k = 0; k < s.size(); ++k)
            if (static_cast<std::int64_t>(k) != *a && i.shape[k] != first.shape[k]) return std::nullopt;
          s[static_cast<std::size_t>(*a)] += i.shape[static_cast<std::size_t>(*a)];
          dt = promote(dt, i.dtype);
        }
        return Info{dt, s};
      };
      d.build = [](const Args& a) { return concat(std::vector<Tensor>(a.t.begin(), a.t.end()), a.p().ints[0]); };
      t.push_back(d);
    }

    {
      // split / chunk return pieces; the row takes piece ints[2] (split: ints = {size, axis, k};
      // split_sizes: {axis, k, sizes...}; chunk: {chunks, axis, k}).
      auto piece_pick = [](int mode) {
        return [mode](Gen& g, OpInst& op) {
          int x = g.operand(kAll, {}, 1);
          if (x < 0) return false;
          op.args = {T(x)};
          const Shape& s = g.info(x).shape;
          std::int64_t r = static_cast<std::int64_t>(s.size()), axis = g.rng.below(r);
          std::int64_t n = s[static_cast<std::size_t>(axis)];
          std::int64_t ax = g.rng.chance(0.2) ? axis - r : axis;
          if (mode == 1) {
            std::vector<std::int64_t> sizes;
            for (std::int64_t left = n; left > 0;) {
              std::int64_t k = std::min(left, g.rng.range(0, std::max<std::int64_t>(1, n / 2 + 1)));
              sizes.push_back(k);
              left -= k;
            }
            if (sizes.empty() || g.rng.chance(0.2)) sizes.push_back(0);
            op.p.ints = {ax, g.rng.below(static_cast<std::int64_t>(sizes.size()))};
            op.p.ints.insert(op.p.ints.end(), sizes.begin(), sizes.end());
          } else {
            std::int64_t k = g.rng.pick(std::vector<std::int64_t>{1, 2, 3, 4, 7});
            op.p.ints = {k, ax, g.rng.below(4)};
          }
          return true;
        };
      };
      // PyTorch's piece sizes: split(n, s) gives ceil(n / s) pieces (one when n == 0); chunk(n, c)
      // splits by ceil(n / c), and c empty pieces when n == 0 (ATen's chunk).
      auto piece_predict = [](int mode) {
        return [mode](const Program& p, const OpInst& op) -> std::optional<Info> {
          if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() < (mode == 1 ? 2u : 3u))
            return std::nullopt;
          const Info& x = p.info(op.args[0].value);
          if (x.shape.empty()) return std::nullopt;
          auto a = rules::axis(op.p.ints[mode == 1 ? 0 : 1], x.shape.size());
          if (!a) return std::nullopt;
          std::int64_t n = x.shape[static_cast<std::size_t>(*a)];
          std::vector<std::int64_t> sizes;
          std::int64_t k = mode == 1 ? op.p.ints[1] : op.p.ints[2];
          if (mode == 1) {
            std::int64_t total = 0;
            for (std::size_t i = 2; i < op.p.ints.size(); ++i) {
              if (op.p.ints[i] < 0) return std::nullopt;
              total += op.p.ints[i];
              sizes.push_back(op.p.ints[i]);
            }
            if (total != n) return std::nullopt;
          } else {
            std::int64_t c = op.p.ints[0];
            if (c <= 0) return std::nullopt;
            std::int64_t size = c;
            if (mode == 2) {
              if (n == 0) sizes.assign(static_cast<std::size_t>(c), 0);
              size = (n + c - 1) / c;
            }
            if (sizes.empty()) {
              if (n == 0) sizes = {0};
              for (std::int64_t start = 0; start < n; start += size) sizes.push_back(std::min(size, n - start));
            }
          }
          if (k < 0 || k >= static_cast<std::int64_t>(sizes.size())) return std::nullopt;
          Shape s = x.shape;
          s[static_cast<std::size_t>(*a)] = sizes[static_cast<std::size_t>(k)];
          return Info{x.dtype, s};
        };
      };
      OpDesc d;
      d.group = "view";
      d.name = "split";
      d.cxx = "split({0}, {i0}, {i1})[{i2}]";
      d.pick = piece_pick(0);
      d.predict = piece_predict(0);
      d.build = [](const Args& a) {
        return split(a.t[0], a.p().ints[0], a.p().ints[1])[static_cast<std::size_t>(a.p().ints[2])];
      };
      t.push_back(d);
      d.name = "split_sizes";
      d.cxx = "split({0}, std::vector<std::int64_t>{ints2}, {i0})[{i1}]";
      d.pick = piece_pick(1);
      d.predict = piece_predict(1);
      d.build = [](const Args& a) {
        std::vector<std::int64_t> sizes(a.p().ints.begin() + 2, a.p().ints.end());
        return split(a.t[0], sizes, a.p().ints[0])[static_cast<std::size_t>(a.p().ints[1])];
      };
      t.push_back(d);
      d.name = "chunk";
      d.cxx = "chunk({0}, {i0}, {i1})[{i2}]";
      d.pick = piece_pick(2);
      d.predict = piece_predict(2);
      d.build = [](const Args& a) {
        return chunk(a.t[0], a.p().ints[0], a.p().ints[1])[static_cast<std::size_t>(a.p().ints[2])];
      };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "clone";
      d.group = "view";
      d.cxx = "clone({0})";
      d.weight = 0.6;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
        return p.info(op.args[0].value);
      };
      d.build = [](const Args& a) { return clone(a.t[0]); };
      t.push_back(d);
      // full_like / zeros_like / ones_like: the operand's shape, its dtype unless one is given.
      for (int kind = 0; kind < 3; ++kind) {
        d.name = kind == 0 ? "full_like" : kind == 1 ? "zeros_like" : "ones_like";
        d.group = "creation";
        d.cxx = kind == 0   ? "full_like({0}, {real}{optdt})"
                : kind == 1 ? "zeros_like({0}{optdt})"
                            : "ones_like({0}{optdt})";
        d.weight = 0.4;
        d.lift = false;
        d.pick = [kind](Gen& g, OpInst& op) {
          int x = g.operand(kAll);
          if (x < 0) return false;
          op.args = {T(x)};
          op.p.flag = g.rng.chance(0.5);
          op.p.dtype = g.dtype(kAll);
          static const std::vector<double> vals = {0, 1, -1, 2.5, -0.5, 1e-3, 1e30, NAN, HUGE_VAL, -0.0, 70000};
          if (kind == 0) op.p.real = g.rng.pick(vals);
          return true;
        };
        d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
          if (op.args.size() != 1 || op.args[0].is_number()) return std::nullopt;
          const Info& x = p.info(op.args[0].value);
          return Info{op.p.flag ? op.p.dtype : x.dtype, x.shape};
        };
        d.build = [kind](const Args& a) {
          DType want = a.p().flag ? a.p().dtype : a.orig_dtype(0);
          std::optional<DType> dt;
          if (a.p().flag) dt = a.dt(a.p().dtype);
          double v = kind == 0 ? a.p().real : kind == 1 ? 0.0 : 1.0;
          // The twin holds the very value the program's dtype holds.
          if (a.ctx.f64 && is_floating(want)) return full_like(a.t[0], round_to(v, want), dt.value_or(f64));
          if (kind == 0) return full_like(a.t[0], v, dt);
          return kind == 1 ? zeros_like(a.t[0], dt) : ones_like(a.t[0], dt);
        };
        d.oracle = [kind](const OpInst& op, const Info& out, const std::vector<std::vector<double>>&,
                          const std::vector<DType>&, const std::vector<std::vector<std::int64_t>>&) {
          double v = kind == 0 ? op.p.real : kind == 1 ? 0.0 : 1.0;
          return std::vector<double>(static_cast<std::size_t>(out.shape.numel()), round_to(v, out.dtype));
        };
        t.push_back(d);
      }
    }

    // -- composites
    auto softmax_like = [](const char* name, const char* cxx, Tensor (*f)(const Tensor&, std::int64_t)) {
      OpDesc d;
      d.name = name;
      d.group = "composite";
      d.cxx = cxx;
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll);
        if (x < 0) return false;
        op.args = {T(x)};
        std::int64_t r = std::max<std::int64_t>(1, static_cast<std::int64_t>(g.info(x).shape.size()));
        op.p.ints = {g.rng.chance(0.5) ? -1 : g.rng.range(-r, r - 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 1) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (!rules::axis(op.p.ints[0], x.shape.size())) return std::nullopt;
        if (!is_floating(x.dtype)) return std::nullopt;  // PyTorch: floating inputs only
        return Info{x.dtype, x.shape};
      };
      d.build = [f](const Args& a) { return f(a.t[0], a.p().ints[0]); };
      d.accumulates = true;
      return d;
    };
    // Their own roundings, beside the operand's nudge (which moves an element near 0 by almost
    // nothing): softmax is exp(x - max) times the row sum's reciprocal (exp's bound, then two
    // roundings, relative to the result); log_softmax is (x - max) - log1p(t), one subtraction
    // after a logarithm of a sum of exps, about an ulp of the result (two with CUDA's expf:
    // fuzz seed 601, graph 1255 on a GPU, log_softmax's -4.08 off by 1.3 ulp, which cosh and
    // exp2 amplified to 1.3e-5).
    t.push_back(
        softmax_like("softmax", "softmax({0}, {i0})", [](const Tensor& x, std::int64_t a) { return softmax(x, a); }));
    t.back().ulp = 2;
    t.back().cuda_ulp = 3;
    t.push_back(softmax_like("log_softmax", "log_softmax({0}, {i0})",
                             [](const Tensor& x, std::int64_t a) { return log_softmax(x, a); }));
    t.back().ulp = 1;
    t.back().cuda_ulp = 2;

    auto norm_predict = [](std::size_t params) {
      return [params](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 + params) return std::nullopt;
        for (auto& o : op.args)
          if (o.is_number()) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (!is_floating(x.dtype) || x.shape.empty()) return std::nullopt;
        for (std::size_t k = 1; k < op.args.size(); ++k) {
          const Info& w = p.info(op.args[k].value);
          if (w.dtype != x.dtype || w.shape != Shape{x.shape.back()}) return std::nullopt;
        }
        return Info{x.dtype, x.shape};
      };
    };
    auto norm_pick = [](std::size_t params) {
      return [params](Gen& g, OpInst& op) {
        int x = g.operand(kFloats, {}, 1);
        if (x < 0) return false;
        op.args = {T(x)};
        for (std::size_t k = 0; k < params; ++k)
          op.args.push_back(T(g.input(g.info(x).dtype, Shape{g.info(x).shape.back()})));
        op.p.real = g.rng.pick(std::vector<double>{1e-5, 1e-3, 0.0, 1e-6});
        return true;
      };
    };
    {
      OpDesc d;
      d.name = "layer_norm";
      d.group = "composite";
      d.accumulates = true;
      d.order_risk = OpDesc::OrderRisk::LastDimSums;
      d.cxx = "layer_norm({0})";
      d.pick = norm_pick(0);
      d.predict = norm_predict(0);
      d.build = [](const Args& a) { return layer_norm(a.t[0]); };
      t.push_back(d);
      d.name = "layer_norm_affine";
      d.cxx = "layer_norm({0}, {1}, {2}, {real})";
      d.pick = norm_pick(2);
      d.predict = norm_predict(2);
      d.build = [](const Args& a) { return layer_norm(a.t[0], a.t[1], a.t[2], a.p().real); };
      t.push_back(d);
      d.name = "rms_norm";
      d.order_risk = OpDesc::OrderRisk::None;  // sums of squares
      d.cxx = "rms_norm({0})";
      d.pick = norm_pick(0);
      d.predict = norm_predict(0);
      // The default eps is the machine epsilon of the dtype it computes in (float32's for the
      // half types, as torch's opmath): the float64 twin passes the program's.
      d.build = [](const Args& a) {
        if (a.ctx.f64) return rms_norm(a.t[0], Tensor{}, dtype_eps(a.orig_dtype(0) == f64 ? f64 : f32));
        return rms_norm(a.t[0]);
      };
      t.push_back(d);
      d.name = "rms_norm_weight";
      d.cxx = "rms_norm({0}, {1}, {real})";
      d.pick = norm_pick(1);
      d.predict = norm_predict(1);
      d.build = [](const Args& a) { return rms_norm(a.t[0], a.t[1], a.p().real); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "cross_entropy";
      d.group = "composite";
      d.accumulates = true;
      d.fixed_order = true;
      d.cxx = "cross_entropy({0}, {1}, {i0})";
      d.lift = false;  // the targets stay integers
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(
            kFloats, [](const Info& i) { return i.shape[1] > 0; }, 2, 2);
        if (x < 0) return false;
        std::int64_t n = g.info(x).shape[0], c = g.info(x).shape[1];
        std::int64_t ignore = g.rng.chance(0.7) ? -100 : g.rng.range(-1, c - 1);
        Step st;
        st.is_input = true;
        st.input.dtype = g.rng.chance(0.8) ? i64 : i32;
        st.input.shape = Shape{n};
        for (std::int64_t i = 0; i < n; ++i)
          st.input.values.push_back(g.rng.chance(0.2) ? static_cast<double>(ignore)
                                                      : static_cast<double>(g.rng.below(c)));
        g.layout(st.input);
        st.info = {st.input.dtype, st.input.shape};
        g.prog.steps.push_back(st);
        op.args = {T(x), T(g.prog.size() - 1)};
        op.p.ints = {ignore};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 2 || op.args[0].is_number() || op.args[1].is_number() || op.p.ints.size() != 1)
          return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        const Step& ts = p.steps[static_cast<std::size_t>(op.args[1].value)];
        if (!is_floating(x.dtype) || x.shape.size() != 2 || !ts.is_input ||
            (ts.info.dtype != i64 && ts.info.dtype != i32) || ts.info.shape != Shape{x.shape[0]})
          return std::nullopt;
        // A target outside [0, C) that is not ignore_index is an error (PyTorch: "Target 7 is out
        // of bounds"); the fuzzer only makes valid targets.
        for (double v : ts.input.values)
          if (v != static_cast<double>(op.p.ints[0]) && (v < 0 || v >= static_cast<double>(x.shape[1])))
            return std::nullopt;
        return Info{x.dtype, Shape{}};
      };
      d.build = [](const Args& a) { return cross_entropy(a.t[0], a.t[1], a.p().ints[0]); };
      t.push_back(d);
    }

    // -- creation (leaves)
    auto creation = [](const char* name, const char* cxx, DTypeSet dtypes, bool value) {
      OpDesc d;
      d.name = name;
      d.group = "creation";
      d.cxx = cxx;
      d.weight = 0.5;
      d.pick = [dtypes, value](Gen& g, OpInst& op) {
        Shape s = g.shape();
        op.p.ints.assign(s.begin(), s.end());
        op.p.dtype = g.dtype(dtypes);
        op.p.seed = static_cast<std::uint64_t>(g.rng.range(0, 1000));
        if (value) {
          static const std::vector<double> vals = {0,    1,   -1,       2.5,       -0.5, 1e-3,  3,    100,
                                                   1e30, NAN, HUGE_VAL, -HUGE_VAL, -0.0, 65504, 70000};
          op.p.real = g.rng.pick(vals);
        }
        return true;
      };
      d.predict = [dtypes](const Program&, const OpInst& op) -> std::optional<Info> {
        if (!op.args.empty() || !in(dtypes, op.p.dtype)) return std::nullopt;
        for (auto v : op.p.ints)
          if (v < 0) return std::nullopt;
        return Info{op.p.dtype, Shape(op.p.ints.begin(), op.p.ints.end())};
      };
      return d;
    };
    {
      OpDesc d = creation("full", "full({ints}, {real}, {dt})", kAll, true);
      // The twin holds the very value the program's dtype holds, then widens it.
      d.build = [](const Args& a) {
        Shape s(a.p().ints.begin(), a.p().ints.end());
        if (a.ctx.f64 && is_floating(a.p().dtype)) return full(s, round_to(a.p().real, a.p().dtype), f64, a.ctx.device);
        return full(s, a.p().real, a.p().dtype, a.ctx.device);
      };
      d.oracle = [](const OpInst& op, const Info& out, const std::vector<std::vector<double>>&,
                    const std::vector<DType>&, const std::vector<std::vector<std::int64_t>>&) {
        // semantics.md: the value converts as a cast does (NaN and out-of-range -> the minimum).
        return std::vector<double>(static_cast<std::size_t>(out.shape.numel()), round_to(op.p.real, op.p.dtype));
      };
      t.push_back(d);
    }
    {
      OpDesc d = creation("zeros", "zeros({ints}, {dt})", kAll, false);
      d.build = [](const Args& a) {
        return zeros(Shape(a.p().ints.begin(), a.p().ints.end()), a.dt(a.p().dtype), a.ctx.device);
      };
      d.oracle = [](const OpInst&, const Info& out, const std::vector<std::vector<double>>&, const std::vector<DType>&,
                    const std::vector<std::vector<std::int64_t>>&) {
        return std::vector<double>(static_cast<std::size_t>(out.shape.numel()), 0.0);
      };
      t.push_back(d);
      d = creation("ones", "ones({ints}, {dt})", kAll, false);
      d.build = [](const Args& a) {
        return ones(Shape(a.p().ints.begin(), a.p().ints.end()), a.dt(a.p().dtype), a.ctx.device);
      };
      d.oracle = [](const OpInst&, const Info& out, const std::vector<std::vector<double>>&, const std::vector<DType>&,
                    const std::vector<std::vector<std::int64_t>>&) {
        return std::vector<double>(static_cast<std::size_t>(out.shape.numel()), 1.0);
      };
      t.push_back(d);
    }
    {
      // PyTorch's arange has no bool kernel.
      OpDesc d = creation("arange", "arange({i0}, {dt})", kNotBool, false);
      PickFn base = d.pick;
      d.pick = [base](Gen& g, OpInst& op) {
        base(g, op);
        op.p.ints = {g.dim()};
        return true;
      };
      d.predict = [](const Program&, const OpInst& op) -> std::optional<Info> {
        if (!op.args.empty() || op.p.ints.size() != 1 || op.p.ints[0] < 0 || op.p.dtype == bool_) return std::nullopt;
        return Info{op.p.dtype, Shape{op.p.ints[0]}};
      };
      d.build = [](const Args& a) {
        Tensor r = arange(a.p().ints[0], a.p().dtype, a.ctx.device);
        return a.ctx.f64 && is_floating(a.p().dtype) ? r.to(f64) : r;
      };
      d.oracle = [](const OpInst& op, const Info& out, const std::vector<std::vector<double>>&,
                    const std::vector<DType>&, const std::vector<std::vector<std::int64_t>>&) {
        std::vector<double> v(static_cast<std::size_t>(out.shape.numel()));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = round_to(static_cast<double>(i), op.p.dtype);
        return v;
      };
      t.push_back(d);
    }
    for (int normal = 0; normal < 2; ++normal) {
      // semantics.md: rand/randn need a floating dtype.
      OpDesc d = creation(normal ? "randn" : "rand",
                          normal ? "randn({ints}, {seed}, {dt})" : "rand({ints}, {seed}, {dt})", kFloats, false);
      d.build = [normal](const Args& a) {
        Shape s(a.p().ints.begin(), a.p().ints.end());
        Tensor r =
            normal ? randn(s, a.p().seed, a.p().dtype, a.ctx.device) : rand(s, a.p().seed, a.p().dtype, a.ctx.device);
        return a.ctx.f64 ? r.to(f64) : r;
      };
      // Box-Muller through the GPU's log, sqrt and cos: one ulp from the host's values
      // (docs/semantics.md, random numbers).
      if (normal) d.cuda_ulp = 1;
      t.push_back(d);
    }
    // -- elementwise math of the op table's second round (table version 2)
    {
      const std::size_t first = t.size();
      t.push_back(unary_row("sign", kAll, Unary::Same, "sign({0})", [](const Tensor& x) -> Tensor { return sign(x); }));
      t.push_back(unary_row("reciprocal", kAll, Unary::Float, "reciprocal({0})",
                            [](const Tensor& x) -> Tensor { return reciprocal(x); }));
      t.push_back(unary_row("square", kNotBool, Unary::Same, "square({0})",
                            [](const Tensor& x) -> Tensor { return square(x); }));
      t.push_back(
          unary_row("trunc", kNotBool, Unary::Same, "trunc({0})", [](const Tensor& x) -> Tensor { return trunc(x); }));
      t.push_back(
          unary_row("atan", kAll, Unary::Float, "atan({0})", [](const Tensor& x) -> Tensor { return atan(x); }));
      t.push_back(
          unary_row("asin", kAll, Unary::Float, "asin({0})", [](const Tensor& x) -> Tensor { return asin(x); }));
      t.push_back(
          unary_row("acos", kAll, Unary::Float, "acos({0})", [](const Tensor& x) -> Tensor { return acos(x); }));
      t.push_back(
          unary_row("sinh", kAll, Unary::Float, "sinh({0})", [](const Tensor& x) -> Tensor { return sinh(x); }));
      t.push_back(
          unary_row("cosh", kAll, Unary::Float, "cosh({0})", [](const Tensor& x) -> Tensor { return cosh(x); }));
      t.push_back(
          unary_row("asinh", kAll, Unary::Float, "asinh({0})", [](const Tensor& x) -> Tensor { return asinh(x); }));
      t.push_back(
          unary_row("acosh", kAll, Unary::Float, "acosh({0})", [](const Tensor& x) -> Tensor { return acosh(x); }));
      t.push_back(
          unary_row("atanh", kAll, Unary::Float, "atanh({0})", [](const Tensor& x) -> Tensor { return atanh(x); }));
      t.push_back(unary_row("bitwise_not", kInts | bit(bool_), Unary::Same, "~{0}",
                            [](const Tensor& x) -> Tensor { return ~x; }));
      t.push_back(binary_row(
          "atan2", kAll, Binary::TrueDiv, "atan2({0}, {1})",
          [](const auto& a, const auto& b) -> Tensor { return atan2(a, b); }, 0.5));
      t.push_back(binary_row(
          "hypot", kFloats, Binary::Arith, "hypot({0}, {1})",
          [](const auto& a, const auto& b) -> Tensor { return hypot(a, b); }, 0.5));
      // Floats only: an integer divisor of 0 is PyTorch's ZeroDivisionError, not a value.
      t.push_back(binary_row(
          "fmod", kFloats, Binary::Arith, "fmod({0}, {1})",
          [](const auto& a, const auto& b) -> Tensor { return fmod(a, b); }, 0.5));
      t.push_back(binary_row(
          "remainder", kFloats, Binary::Arith, "remainder({0}, {1})",
          [](const auto& a, const auto& b) -> Tensor { return remainder(a, b); }, 0.5));
      t.push_back(binary_row(
          "logical_xor", kAll, Binary::Logical, "logical_xor({0}, {1})",
          [](const auto& a, const auto& b) -> Tensor { return logical_xor(a, b); }, 0.4));
      t.push_back(binary_row(
          "bitwise_and", kInts | bit(bool_), Binary::Arith, "{0} & {1}",
          [](const auto& a, const auto& b) -> Tensor { return a & b; }, 0.4));
      t.push_back(binary_row(
          "bitwise_or", kInts | bit(bool_), Binary::Arith, "{0} | {1}",
          [](const auto& a, const auto& b) -> Tensor { return a | b; }, 0.4));
      t.push_back(binary_row(
          "bitwise_xor", kInts | bit(bool_), Binary::Arith, "{0} ^ {1}",
          [](const auto& a, const auto& b) -> Tensor { return a ^ b; }, 0.4));
      for (std::size_t i = first; i < t.size(); ++i) {
        t[i].since = 2;
        // Bitwise ops take integers and bools only: a floating number operand promotes the
        // pair to float, which torch refuses (as kiln's DTypeError does).
        if (t[i].name.rfind("bitwise_", 0) == 0) {
          PredictFn base = t[i].predict;
          t[i].predict = [base](const Program& p, const OpInst& op) -> std::optional<Info> {
            auto info = base(p, op);
            if (info && is_floating(info->dtype)) return std::nullopt;
            return info;
          };
        }
        // atan, asin, acos and atan2 compute in double and round once (docs/performance-math.md).
        if (t[i].name == "atan" || t[i].name == "asin" || t[i].name == "acos" || t[i].name == "atan2") t[i].ulp = 0.51;
        // The hyperbolic decompositions, as measured (docs/performance-math.md, composites).
        static const std::vector<std::pair<std::string, double>> hyperbolic = {
            {"sinh", 3.5}, {"cosh", 3}, {"asinh", 1.5}, {"acosh", 1.5}, {"atanh", 1.5}};
        for (auto& [n, u] : hyperbolic)
          if (t[i].name == n) t[i].ulp = u;
      }
    }
    // -- shapes and masks (table version 2)
    {
      OpDesc d;
      d.name = "flip";
      d.group = "view";
      d.since = 2;
      d.cxx = "flip({0}, {ints})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 1);
        if (x < 0) return false;
        op.args = {T(x)};
        const std::int64_t r = static_cast<std::int64_t>(g.info(x).shape.size());
        op.p.ints = {g.rng.range(-r, r - 1)};
        if (r > 1 && g.rng.chance(0.4)) {
          std::int64_t b = g.rng.range(0, r - 1);
          if (b != (op.p.ints[0] + r) % r) op.p.ints.push_back(b);
        }
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.empty()) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        std::vector<std::int64_t> seen;
        for (auto d : op.p.ints) {
          auto a = rules::axis(d, x.shape.size());
          if (!a || x.shape.empty() || std::find(seen.begin(), seen.end(), *a) != seen.end()) return std::nullopt;
          seen.push_back(*a);
        }
        return Info{x.dtype, x.shape};
      };
      d.build = [](const Args& a) { return flip(a.t[0], a.p().ints); };
      t.push_back(d);
    }
    for (int upper = 0; upper < 2; ++upper) {
      OpDesc d;
      d.name = upper ? "triu" : "tril";
      d.group = "view";
      d.since = 2;
      d.weight = 0.6;
      d.cxx = upper ? "triu({0}, {i0})" : "tril({0}, {i0})";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 2);
        if (x < 0) return false;
        op.args = {T(x)};
        op.p.ints = {g.rng.range(-3, 3)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 1) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (x.shape.size() < 2) return std::nullopt;
        return Info{x.dtype, x.shape};
      };
      d.build = [upper](const Args& a) { return upper ? triu(a.t[0], a.p().ints[0]) : tril(a.t[0], a.p().ints[0]); };
      t.push_back(d);
    }

    // -- matrix products (table version 2): torch.matmul's rules; the second operand is an
    // earlier value whose shape fits, else a new input shaped to fit. Same dtype (matmul does
    // not promote).
    {
      OpDesc d;
      d.name = "matmul";
      d.group = "composite";
      d.accumulates = true;
      d.order_risk = OpDesc::OrderRisk::Dot;
      d.since = 2;
      d.weight = 1.5;
      d.cxx = "matmul({0}, {1})";
      d.pick = [](Gen& g, OpInst& op) {
        int a = g.operand(kFloats, {}, 1, 3);
        if (a < 0) return false;
        const Info ai = g.info(a);
        const std::int64_t k = ai.shape.back();
        // b: [K], [K, N] or [B.., K, N] (batch dims broadcasting with a's).
        auto fits = [&](const Info& i) {
          if (i.dtype != ai.dtype || i.shape.empty() || i.shape.size() > 3) return false;
          const std::size_t r = i.shape.size();
          return (r == 1 ? i.shape[0] : i.shape[r - 2]) == k;
        };
        int b = g.rng.chance(0.4) ? g.existing(fits) : -1;
        if (b < 0) {
          Shape bs;
          const int form = static_cast<int>(g.rng.below(4));
          if (form == 0) {
            bs = {k};
          } else {
            bs = {k, g.dim()};
            if (form == 3 && ai.shape.size() == 3) bs.insert(bs.begin(), g.rng.chance(0.5) ? ai.shape[0] : 1);
          }
          if (bs.numel() > g.lim.max_elems) bs.back() = 1;
          b = g.input(ai.dtype, bs);
        }
        op.args = {T(a), T(b)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 2 || op.args[0].is_number() || op.args[1].is_number()) return std::nullopt;
        const Info& a = p.info(op.args[0].value);
        const Info& b = p.info(op.args[1].value);
        if (!is_floating(a.dtype) || a.dtype != b.dtype || a.shape.empty() || b.shape.empty()) return std::nullopt;
        // torch.matmul: 1-D operands are promoted (a row, a column) and the added dim removed.
        Shape as = a.shape, bs = b.shape;
        if (as.size() == 1) as.insert(as.begin(), 1);
        if (bs.size() == 1) bs.push_back(1);
        if (as.back() != bs[bs.size() - 2]) return std::nullopt;
        auto batch = rules::broadcast({Shape(as.begin(), as.end() - 2), Shape(bs.begin(), bs.end() - 2)});
        if (!batch) return std::nullopt;
        Shape out = *batch;
        if (a.shape.size() > 1) out.push_back(as[as.size() - 2]);
        if (b.shape.size() > 1) out.push_back(bs.back());
        return Info{a.dtype, out};
      };
      // The nudged twin adds 2 sqrt(K) eps sum_k |a_ik b_kj| to each element: a dot product's
      // rounding is bounded by its terms' magnitudes, not its value (two terms of 770 that
      // cancel to 4.78 keep an error of one ulp of 770), and a library adds them in sequence,
      // so the bound grows with K (√K, as the tests' tolerance). Operand nudges with random
      // signs would estimate it by chance (they cancel between terms), so there are none.
      d.build = [](const Args& a) {
        Tensor r = matmul(a.t[0], a.t[1]);
        if (!a.ctx.perturb) return r;
        const double K = static_cast<double>(std::max<std::int64_t>(1, a.t[0].shape().back()));
        const double eps = a.orig_dtype(0) == f64 ? dtype_eps(f64) : dtype_eps(f32);
        // A random sign per element, so that what reads the product (an argmax among near
        // ties, a normalisation) sees independent moves, as from independent roundings.
        Rng rng(a.ctx.perturb ^ (static_cast<std::uint64_t>(r.numel()) * 0x9e3779b97f4a7c15ull + 0x51ed27));
        std::vector<double> sign(static_cast<std::size_t>(r.numel()));
        for (auto& v : sign) v = (rng.uniform() < 0.5 ? -1.0 : 1.0) * a.ctx.sign;
        Tensor signs = from_vector<double>(sign, r.shape(), a.ctx.device);
        return Tensor(r + matmul(abs(a.t[0]), abs(a.t[1])) * signs * (2 * std::sqrt(K) * eps));
      };
      d.operand_ulps = [](const Program&, const OpInst&) { return 0.0; };
      t.push_back(d);
    }

    // -- data-dependent reads and writes (table version 3). Indices are inputs holding values in
    // range (an out-of-range index is an error, tested apart), int64 or int32, any layout.
    auto index_input = [](Gen& g, const Shape& shape, std::int64_t bound) {
      Step st;
      st.is_input = true;
      st.input.dtype = g.rng.chance(0.7) ? i64 : i32;
      st.input.shape = shape;
      for (std::int64_t i = 0; i < shape.numel(); ++i) st.input.values.push_back(static_cast<double>(g.rng.below(bound)));
      g.layout(st.input);
      st.info = {st.input.dtype, st.input.shape};
      g.prog.steps.push_back(st);
      return g.prog.size() - 1;
    };
    // The index operand `k` of `op`: an int input whose every value is in [0, bound).
    auto index_ok = [](const Program& p, const OpInst& op, std::size_t k, std::int64_t bound) {
      if (op.args.size() <= k || op.args[k].is_number()) return false;
      const Step& st = p.steps[static_cast<std::size_t>(op.args[k].value)];
      if (!st.is_input || (st.info.dtype != i64 && st.info.dtype != i32)) return false;
      for (double v : st.input.values)
        if (v < 0 || v >= static_cast<double>(bound)) return false;
      if (st.input.arg)
        for (double v : st.input.values2)
          if (v < 0 || v >= static_cast<double>(bound)) return false;
      return true;
    };
    {
      OpDesc d;
      d.name = "gather";
      d.group = "index";
      d.since = 3;
      d.lift = false;
      d.cxx = "gather({0}, {i0}, {1})";
      d.pick = [index_input](Gen& g, OpInst& op) {
        int x = g.operand(kAll, [](const Info& i) { return i.shape.numel() > 0; }, 1, 3);
        if (x < 0) return false;
        const Shape xs = g.info(x).shape;
        const std::int64_t r = static_cast<std::int64_t>(xs.size()), axis = g.rng.range(0, r - 1);
        Shape is = xs;  // off the axis at most x's; along it any length
        for (std::int64_t d2 = 0; d2 < r; ++d2)
          is[static_cast<std::size_t>(d2)] =
              d2 == axis ? g.rng.range(1, 5) : g.rng.chance(0.7) ? xs[static_cast<std::size_t>(d2)] : g.rng.range(1, xs[static_cast<std::size_t>(d2)]);
        op.args = {T(x), T(index_input(g, is, xs[static_cast<std::size_t>(axis)]))};
        op.p.ints = {g.rng.chance(0.3) ? axis - r : axis};
        return true;
      };
      d.predict = [index_ok](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 2 || op.args[0].is_number() || op.args[1].is_number() || op.p.ints.size() != 1)
          return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        const Info& i = p.info(op.args[1].value);
        auto axis = rules::axis(op.p.ints[0], x.shape.size());
        if (!axis || x.shape.empty() || i.shape.size() != x.shape.size()) return std::nullopt;
        for (std::size_t d2 = 0; d2 < x.shape.size(); ++d2)
          if (static_cast<std::int64_t>(d2) != *axis && i.shape[d2] > x.shape[d2]) return std::nullopt;
        if (!index_ok(p, op, 1, x.shape[static_cast<std::size_t>(*axis)])) return std::nullopt;
        return Info{x.dtype, i.shape};
      };
      d.build = [](const Args& a) { return gather(a.t[0], a.p().ints[0], a.t[1]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "index_select";
      d.group = "index";
      d.since = 3;
      d.lift = false;
      d.cxx = "index_select({0}, {i0}, {1})";
      d.pick = [index_input](Gen& g, OpInst& op) {
        int x = g.operand(kAll, [](const Info& i) { return i.shape.numel() > 0; }, 1, 3);
        if (x < 0) return false;
        const Shape xs = g.info(x).shape;
        const std::int64_t axis = g.rng.range(0, static_cast<std::int64_t>(xs.size()) - 1);
        op.args = {T(x), T(index_input(g, Shape{g.rng.range(0, 6)}, xs[static_cast<std::size_t>(axis)]))};
        op.p.ints = {axis};
        return true;
      };
      d.predict = [index_ok](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 2 || op.args[0].is_number() || op.args[1].is_number() || op.p.ints.size() != 1)
          return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        const Info& i = p.info(op.args[1].value);
        auto axis = rules::axis(op.p.ints[0], x.shape.size());
        if (!axis || x.shape.empty() || i.shape.size() != 1) return std::nullopt;
        if (!index_ok(p, op, 1, x.shape[static_cast<std::size_t>(*axis)])) return std::nullopt;
        Shape out = x.shape;
        out[static_cast<std::size_t>(*axis)] = i.shape[0];
        return Info{x.dtype, out};
      };
      d.build = [](const Args& a) { return index_select(a.t[0], a.p().ints[0], a.t[1]); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "embedding";
      d.group = "index";
      d.since = 3;
      d.lift = false;
      d.weight = 0.6;
      d.cxx = "embedding({0}, {1})";
      d.pick = [index_input](Gen& g, OpInst& op) {
        int w = g.operand(kAll, [](const Info& i) { return i.shape[0] > 0; }, 2, 2);
        if (w < 0) return false;
        Shape is = g.rng.chance(0.5) ? Shape{g.rng.range(1, 6)} : Shape{g.rng.range(1, 3), g.rng.range(1, 4)};
        op.args = {T(w), T(index_input(g, is, g.info(w).shape[0]))};
        return true;
      };
      d.predict = [index_ok](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 2 || op.args[0].is_number() || op.args[1].is_number()) return std::nullopt;
        const Info& w = p.info(op.args[0].value);
        const Info& i = p.info(op.args[1].value);
        if (w.shape.size() != 2 || !index_ok(p, op, 1, w.shape[0])) return std::nullopt;
        Shape out = i.shape;
        out.push_back(w.shape[1]);
        return Info{w.dtype, out};
      };
      d.build = [](const Args& a) { return embedding(a.t[0], a.t[1]); };
      t.push_back(d);
    }
    {
      // index_add: repeated indices summed in index order (the reference's order, bit for bit
      // on the CPU); the source a new input of x's dtype.
      OpDesc d;
      d.name = "index_add";
      d.group = "index";
      d.since = 3;
      d.lift = false;
      d.accumulates = true;
      d.cxx = "index_add({0}, {i0}, {1}, {2})";
      d.pick = [index_input](Gen& g, OpInst& op) {
        int x = g.operand(kAll, [](const Info& i) { return i.shape.numel() > 0; }, 1, 3);
        if (x < 0) return false;
        const Info xi = g.info(x);
        const std::int64_t axis = g.rng.range(0, static_cast<std::int64_t>(xi.shape.size()) - 1);
        const std::int64_t k = g.rng.range(0, 7);
        Shape ss = xi.shape;
        ss[static_cast<std::size_t>(axis)] = k;
        const int idx = index_input(g, Shape{k}, xi.shape[static_cast<std::size_t>(axis)]);
        op.args = {T(x), T(idx), T(g.input(xi.dtype, ss))};
        op.p.ints = {axis};
        return true;
      };
      d.predict = [index_ok](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 3 || op.args[0].is_number() || op.args[2].is_number() || op.p.ints.size() != 1)
          return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        const Info& i = p.info(op.args[1].value);
        const Info& src = p.info(op.args[2].value);
        auto axis = rules::axis(op.p.ints[0], x.shape.size());
        if (!axis || x.shape.empty() || i.shape.size() != 1 || src.dtype != x.dtype) return std::nullopt;
        Shape ss = x.shape;
        ss[static_cast<std::size_t>(*axis)] = i.shape[0];
        if (src.shape != ss || !index_ok(p, op, 1, x.shape[static_cast<std::size_t>(*axis)])) return std::nullopt;
        return Info{x.dtype, x.shape};
      };
      d.build = [](const Args& a) { return index_add(a.t[0], a.p().ints[0], a.t[1], a.t[2]); };
      t.push_back(d);
    }

    // -- scans (table version 4): along any dim of any rank >= 1; cumsum of integers is int64.
    auto scan_row = [](const char* name, DTypeSet accepts, const char* cxx, bool accumulates,
                       Tensor (*f)(const Tensor&, std::int64_t), int out_rule) {
      OpDesc d;
      d.name = name;
      d.group = "scan";
      d.since = 4;
      d.weight = 0.5;
      d.cxx = cxx;
      d.accumulates = accumulates;
      d.pick = [accepts](Gen& g, OpInst& op) {
        int x = g.operand(accepts, {}, 1, 3);
        if (x < 0) return false;
        op.args = {T(x)};
        const std::int64_t r = static_cast<std::int64_t>(g.info(x).shape.size());
        op.p.ints = {g.rng.range(-r, r - 1)};
        return true;
      };
      // out_rule 0: the input's dtype; 1: int64 for integer and bool inputs (sums); 2: int64 (indices).
      d.predict = [accepts, out_rule](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 1) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (!in(accepts, x.dtype) || x.shape.empty() || !rules::axis(op.p.ints[0], x.shape.size())) return std::nullopt;
        const DType out = out_rule == 2 || (out_rule == 1 && !is_floating(x.dtype)) ? i64 : x.dtype;
        return Info{out, x.shape};
      };
      d.build = [f](const Args& a) { return f(a.t[0], a.p().ints[0]); };
      return d;
    };
    t.push_back(scan_row("cumsum", kAll, "cumsum({0}, {i0})", true,
                         [](const Tensor& x, std::int64_t d) -> Tensor { return cumsum(x, d); }, 1));
    t.push_back(scan_row("cummax", kAll, "std::get<0>(cummax({0}, {i0}))", false,
                         [](const Tensor& x, std::int64_t d) -> Tensor { return std::get<0>(cummax(x, d)); }, 0));
    t.push_back(scan_row("cummin_indices", kAll, "std::get<1>(cummin({0}, {i0}))", false,
                         [](const Tensor& x, std::int64_t d) -> Tensor { return std::get<1>(cummin(x, d)); }, 2));
    t.back().running_extreme_position = true;
    t.push_back(scan_row("logcumsumexp", kFloats, "logcumsumexp({0}, {i0})", true,
                         [](const Tensor& x, std::int64_t d) -> Tensor { return logcumsumexp(x, d); }, 0));
    t.back().ulp = 2;

    // -- sorting (table version 5): the sorted values along a dim, and a top-k's values. Their
    // positions are left out: which of two values a rounding apart comes first is decided by the
    // last ulp, where the float64 twin may differ; the values are judged whatever that order.
    {
      OpDesc d;
      d.name = "sort";
      d.group = "sort";
      d.since = 5;
      d.weight = 0.4;
      d.cxx = "std::get<0>(sort({0}, {i0}, {i1}))";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, {}, 0, 3);
        if (x < 0) return false;
        op.args = {T(x)};
        const std::int64_t r = std::max<std::int64_t>(1, static_cast<std::int64_t>(g.info(x).shape.size()));
        op.p.ints = {g.rng.range(-r, r - 1), g.rng.range(0, 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 2) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        if (!rules::axis(op.p.ints[0], x.shape.size())) return std::nullopt;
        return Info{x.dtype, x.shape};
      };
      d.build = [](const Args& a) { return std::get<0>(sort(a.t[0], a.p().ints[0], a.p().ints[1] != 0)); };
      t.push_back(d);
    }
    {
      OpDesc d;
      d.name = "topk";
      d.group = "sort";
      d.since = 5;
      d.weight = 0.4;
      d.cxx = "std::get<0>(topk({0}, {i1}, {i0}, {i2}))";
      d.pick = [](Gen& g, OpInst& op) {
        int x = g.operand(kAll, [](const Info& i) { return !i.shape.empty(); }, 1, 3);
        if (x < 0) return false;
        op.args = {T(x)};
        const Shape& s = g.info(x).shape;
        const std::int64_t r = static_cast<std::int64_t>(s.size());
        const std::int64_t dim = g.rng.range(-r, r - 1);
        const std::int64_t len = s[static_cast<std::size_t>(dim < 0 ? dim + r : dim)];
        op.p.ints = {dim, g.rng.range(0, len), g.rng.range(0, 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 1 || op.args[0].is_number() || op.p.ints.size() != 3) return std::nullopt;
        const Info& x = p.info(op.args[0].value);
        const auto axis = rules::axis(op.p.ints[0], x.shape.size());
        if (!axis || x.shape.empty() || x.dtype == bool_) return std::nullopt;  // PyTorch: no topk of bools
        Shape out = x.shape;
        if (op.p.ints[1] < 0 || op.p.ints[1] > out[static_cast<std::size_t>(*axis)]) return std::nullopt;
        out[static_cast<std::size_t>(*axis)] = op.p.ints[1];
        return Info{x.dtype, out};
      };
      d.build = [](const Args& a) {
        return std::get<0>(topk(a.t[0], a.p().ints[1], a.p().ints[0], a.p().ints[2] != 0));
      };
      t.push_back(d);
    }

    // -- fused attention (table version 6): q is an earlier floating value of rank 3 or 4
    // ([.., L, E]); k [.., S, E] and v [.., S, Ev] new inputs of its dtype and batch dims;
    // causal or not. The fused step runs where the reference runs its definition.
    {
      OpDesc d;
      d.name = "scaled_dot_product_attention";
      d.group = "composite";
      d.accumulates = true;
      d.order_risk = OpDesc::OrderRisk::Attention;
      d.since = 6;
      d.weight = 0.5;
      d.cxx = "scaled_dot_product_attention({0}, {1}, {2}, Tensor(), 0.0, {i0} != 0)";
      d.pick = [](Gen& g, OpInst& op) {
        int q = g.operand(kFloats, [](const Info& i) { return i.shape.size() >= 3 && i.shape.size() <= 4; }, 3, 4);
        if (q < 0) return false;
        const Info qi = g.info(q);
        Shape ks = qi.shape, vs = qi.shape;
        const std::int64_t S = g.dim();
        ks[ks.size() - 2] = vs[vs.size() - 2] = S;
        vs.back() = g.dim();
        if (ks.numel() > g.lim.max_elems || vs.numel() > g.lim.max_elems) return false;
        op.args = {T(q), T(g.input(qi.dtype, ks)), T(g.input(qi.dtype, vs))};
        op.p.ints = {g.rng.range(0, 1)};
        return true;
      };
      d.predict = [](const Program& p, const OpInst& op) -> std::optional<Info> {
        if (op.args.size() != 3 || op.p.ints.size() != 1) return std::nullopt;
        for (const auto& a : op.args)
          if (a.is_number()) return std::nullopt;
        const Info &q = p.info(op.args[0].value), &k = p.info(op.args[1].value), &v = p.info(op.args[2].value);
        const std::size_t r = q.shape.size();
        if (r < 3 || r > 4 || k.shape.size() != r || v.shape.size() != r || !is_floating(q.dtype) ||
            k.dtype != q.dtype || v.dtype != q.dtype || k.shape.back() != q.shape.back() ||
            k.shape[r - 2] != v.shape[r - 2])
          return std::nullopt;
        for (std::size_t d = 0; d + 2 < r; ++d)
          if (k.shape[d] != q.shape[d] || v.shape[d] != q.shape[d]) return std::nullopt;
        Shape out = q.shape;
        out.back() = v.shape.back();
        return Info{q.dtype, out};
      };
      d.build = [](const Args& a) { return sdpa_row(a, 0.0); };
      t.push_back(d);

      // -- the same op on operands shaped as attention libraries take them (table version 7):
      // new float16 or bfloat16 q, k, v of [B, H, L, E] with feature dims multiples of 8, so
      // that on a GPU with cuDNN the graph runs cuDNN's fused kernels (any L and S, causal or
      // not; a layout drawn as for every input, so some reach the generated kernels instead).
      OpDesc half = d;
      half.name = "sdpa_library_shaped";
      half.since = 7;
      half.weight = 0.6;
      half.pick = [](Gen& g, OpInst& op) {
        static const std::vector<std::int64_t> features = {8, 16, 32, 64, 64, 128};
        const DType dt = g.rng.chance(0.5) ? DType::Float16 : DType::BFloat16;
        const std::int64_t B = g.rng.range(1, 2), H = g.rng.range(1, 3), L = g.dim(), S = g.dim();
        const std::int64_t E = g.rng.pick(features), Ev = g.rng.pick(features);
        const Shape qs{B, H, L, E}, ks{B, H, S, E}, vs{B, H, S, Ev};
        if (qs.numel() > g.lim.max_elems || ks.numel() > g.lim.max_elems || vs.numel() > g.lim.max_elems)
          return false;
        op.args = {T(g.input(dt, qs)), T(g.input(dt, ks)), T(g.input(dt, vs))};
        op.p.ints = {g.rng.range(0, 1)};
        return true;
      };
      t.push_back(half);

      // -- with dropout (table version 8): p in {0.1, 0.5}, the key from manual_seed(seed) just
      // before (so every build of the program, on every backend, drops the same weights, and
      // the nudged twin's attention of |v| drops them too). The kernels draw the mask inside.
      OpDesc dropped = d;
      dropped.name = "sdpa_dropout";
      dropped.since = 8;
      dropped.weight = 0.4;
      dropped.draws_key = true;
      dropped.cxx = "(manual_seed({seed}), scaled_dot_product_attention({0}, {1}, {2}, Tensor(), {real}, {i0} != 0))";
      const auto base_pick = d.pick;
      dropped.pick = [base_pick](Gen& g, OpInst& op) {
        if (!base_pick(g, op)) return false;
        op.p.real = g.rng.chance(0.5) ? 0.1 : 0.5;
        op.p.seed = static_cast<std::uint64_t>(g.rng.range(0, 1000));
        return true;
      };
      dropped.build = [](const Args& a) { return sdpa_row(a, a.p().real); };
      t.push_back(dropped);
    }

    // -- table version 9: the C library's erfc and lgamma and the sign-bit copysign (primitives),
    // digamma and erfinv (composed of primitives). Their float bounds: glibc's (erfc 1, lgamma a
    // few ulp away from its roots, where the nudged twin's conditioning excuses the rest), the
    // composites' as measured in tests/tensor/test_composites.cpp (about 4e-7 relative);
    // CUDA's from its programming guide (erfcf 4, lgammaf 6).
    {
      const std::size_t first = t.size();
      t.push_back(
          unary_row("erfc", kAll, Unary::Float, "erfc({0})", [](const Tensor& x) -> Tensor { return erfc(x); }));
      t.back().ulp = 2, t.back().cuda_ulp = 4;
      t.push_back(
          unary_row("lgamma", kAll, Unary::Float, "lgamma({0})", [](const Tensor& x) -> Tensor { return lgamma(x); }));
      t.back().ulp = 4, t.back().cuda_ulp = 6;
      t.push_back(unary_row("digamma", kAll, Unary::Float, "digamma({0})",
                            [](const Tensor& x) -> Tensor { return digamma(x); }));
      t.back().ulp = 8;
      t.push_back(
          unary_row("erfinv", kAll, Unary::Float, "erfinv({0})", [](const Tensor& x) -> Tensor { return erfinv(x); }));
      t.back().ulp = 4;
      t.push_back(binary_row(
          "copysign", kAll, Binary::TrueDiv, "copysign({0}, {1})",
          [](const auto& a, const auto& b) -> Tensor { return copysign(a, b); }, 0.4));
      for (std::size_t i = first; i < t.size(); ++i) t[i].since = 9;
    }

    return t;
  }();
  return table;
}

/// The row named `name` (for tests and the reproducer printer).
inline int op_index(const std::string& name) {
  const auto& t = op_table();
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t[i].name == name) return static_cast<int>(i);
  throw Error("fuzz: no op named " + name);
}

// ---- programs ------------------------------------------------------------------------------------

/// Recomputes every step's predicted info; false when some op is no longer valid (the
/// shrinker's cheap filter).
inline bool revalidate(Program& p) {
  const auto& table = op_table();
  for (int v = 0; v < p.size(); ++v) {
    Step& s = p.steps[static_cast<std::size_t>(v)];
    if (s.is_input) {
      if (static_cast<std::int64_t>(s.input.values.size()) != s.input.shape.numel()) return false;
      if (s.input.arg && s.input.values2.size() != s.input.values.size()) return false;
      s.info = {s.input.dtype, s.input.shape};
      continue;
    }
    if (s.op.desc < 0 || s.op.desc >= static_cast<int>(table.size())) return false;
    for (auto& a : s.op.args)
      if (!a.is_number() && (a.value < 0 || a.value >= v)) return false;
    auto i = table[static_cast<std::size_t>(s.op.desc)].predict(p, s.op);
    if (!i) return false;
    s.info = *i;
  }
  if (p.outputs.empty()) return false;
  for (int o : p.outputs)
    if (o < 0 || o >= p.size()) return false;
  if (p.assign_output >= static_cast<int>(p.outputs.size())) return false;
  if (p.compile_mode && p.assign_output >= 0) return false;
  if (p.assign_output >= 0) {
    p.assign_dst.shape = p.info(p.outputs[static_cast<std::size_t>(p.assign_output)]).shape;
    p.assign_dst.values.assign(static_cast<std::size_t>(p.assign_dst.shape.numel()), 0.0);
    Input& d = p.assign_dst;
    if (d.layout == Layout::Permuted && d.perm.size() != d.shape.size()) d.layout = Layout::Contiguous;
    if (d.layout == Layout::Strided && d.step.size() != d.shape.size()) d.layout = Layout::Contiguous;
  }
  return true;
}

/// Drops steps no output depends on and renumbers the rest.
inline void compact(Program& p) {
  std::vector<bool> live(p.steps.size(), false);
  for (int o : p.outputs) live[static_cast<std::size_t>(o)] = true;
  for (int v = p.size(); v-- > 0;) {
    if (!live[static_cast<std::size_t>(v)] || p.steps[static_cast<std::size_t>(v)].is_input) continue;
    for (auto& a : p.steps[static_cast<std::size_t>(v)].op.args)
      if (!a.is_number()) live[static_cast<std::size_t>(a.value)] = true;
  }
  std::vector<int> map(p.steps.size(), -1);
  std::vector<Step> kept;
  for (std::size_t v = 0; v < p.steps.size(); ++v) {
    if (!live[v]) continue;
    map[v] = static_cast<int>(kept.size());
    kept.push_back(std::move(p.steps[v]));
  }
  for (auto& s : kept)
    if (!s.is_input)
      for (auto& a : s.op.args)
        if (!a.is_number()) a.value = map[static_cast<std::size_t>(a.value)];
  for (auto& o : p.outputs) o = map[static_cast<std::size_t>(o)];
  p.steps = std::move(kept);
}

/// Graph `index` of campaign `seed`: a random valid program of up to lim.max_ops ops.
inline Program generate(std::uint64_t seed, std::uint64_t index, const Limits& limits) {
  const auto& table = op_table();
  Rng rng = graph_rng(seed, index);
  Limits lim = limits;
  if (rng.chance(lim.big_graph_rate)) {
    lim.max_elems *= 16;
    lim.big_dim_rate = 0.2;
  }
  Program p;
  p.seed = seed;
  p.index = index;
  Gen g{rng, p, lim};
  double total = 0;
  std::size_t rows = 0;  // the rows of this table version: a prefix (rows are only appended)
  while (rows < table.size() && table[rows].since <= lim.table_version) total += table[rows++].weight;
  int ops = static_cast<int>(rng.range(lim.min_ops, lim.max_ops));
  int made = 0;
  for (int tries = 0; made < ops && tries < ops * 10; ++tries) {
    double w = rng.uniform() * total;
    std::size_t k = 0;
    while (k + 1 < rows && w >= table[k].weight) w -= table[k++].weight;
    const OpDesc& d = table[k];
    for (int attempt = 0; attempt < 6; ++attempt) {
      OpInst op;
      op.desc = static_cast<int>(k);
      if (!d.pick(g, op)) continue;
      auto info = d.predict(p, op);
      if (!info || info->shape.numel() > lim.max_elems * 4 || info->shape.size() > 8) continue;
      op.eval_after = rng.chance(lim.eval_rate);
      Step s;
      s.op = std::move(op);
      s.info = *info;
      p.steps.push_back(std::move(s));
      ++made;
      break;
    }
  }
  if (p.steps.empty() || p.steps.back().is_input) {  // nothing applied: a lone cast keeps the program non-empty
    int x = g.operand(kAll);
    OpInst op;
    op.desc = op_index("to");
    op.args = {T(x)};
    op.p.dtype = f32;
    Step s;
    s.op = op;
    s.info = *table[static_cast<std::size_t>(op.desc)].predict(p, op);
    p.steps.push_back(s);
  }
  int last = p.size() - 1;
  p.outputs = {last};
  // Other results nothing reads become outputs too (up to 4 in all: one eval of several roots),
  // and now and then a value that is also read further on, or an input.
  for (int v = last; v-- > 0 && p.outputs.size() < 4;)
    if (!p.steps[static_cast<std::size_t>(v)].is_input && g.unused(v) && rng.chance(0.7)) p.outputs.push_back(v);
  while (rng.chance(lim.extra_output_rate) && p.outputs.size() < 4) {
    int v = static_cast<int>(rng.below(last));
    if (std::find(p.outputs.begin(), p.outputs.end(), v) == p.outputs.end() &&
        (!p.steps[static_cast<std::size_t>(v)].is_input || rng.chance(0.2)))
      p.outputs.push_back(v);
  }
  const bool draws_key = std::any_of(p.steps.begin(), p.steps.end(), [&](const Step& st) {
    return !st.is_input && table[static_cast<std::size_t>(st.op.desc)].draws_key;
  });
  if (rng.chance(lim.compile_rate) && !draws_key) {
    p.compile_mode = static_cast<int>(rng.range(1, 3));
    // Up to three inputs become arguments (not class targets: their new values must stay valid).
    std::vector<bool> targets(p.steps.size(), false);
    // Indices of gathers and scatters may become arguments: their new values are drawn in range
    // (the smallest bound among the ops reading them).
    std::vector<std::int64_t> index_bound(p.steps.size(), -1);
    for (auto& st : p.steps) {
      if (st.is_input) continue;
      const OpDesc& desc = table[static_cast<std::size_t>(st.op.desc)];
      if (desc.name.rfind("cross_entropy", 0) == 0) targets[static_cast<std::size_t>(st.op.args[1].value)] = true;
      if (desc.group == "index") {
        const Info& x = p.info(st.op.args[0].value);
        const std::int64_t axis = desc.name == "embedding" ? 0 : *rules::axis(st.op.p.ints[0], x.shape.size());
        std::int64_t& b = index_bound[static_cast<std::size_t>(st.op.args[1].value)];
        const std::int64_t bound = x.shape[static_cast<std::size_t>(axis)];
        b = b < 0 ? bound : std::min(b, bound);
      }
    }
    int args = 0;
    for (std::size_t v = 0; v < p.steps.size() && args < 3; ++v) {
      Input& in = p.steps[v].input;
      if (!p.steps[v].is_input || targets[v] || !rng.chance(0.7)) continue;
      in.arg = true;
      if (index_bound[v] > 0) {
        in.values2.clear();
        for (std::int64_t i = 0; i < in.shape.numel(); ++i)
          in.values2.push_back(static_cast<double>(rng.below(index_bound[v])));
      } else {
        in.values2 = gen_values(rng, in.dtype, in.shape.numel(), lim.special_rate);
      }
      ++args;
    }
  } else if (rng.chance(lim.assign_rate)) {
    p.assign_output = 0;
    Input& d = p.assign_dst;
    d.dtype = rng.chance(0.7) ? p.info(last).dtype : g.dtype(kAll);
    d.shape = p.info(last).shape;
    g.layout(d);
  }
  if (lim.grad) {
    // After every draw, so that a seed gives the same graphs with and without --grad (a
    // compiled one then traces its forward and backward as one graph, a training step).
    p.grad = true;
    p.assign_output = -1;  // the loss reads the outputs themselves
  }
  compact(p);
  revalidate(p);
  return p;
}

}  // namespace kiln::fuzz
