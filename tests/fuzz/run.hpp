#pragma once
// Building a program through kiln's public API, evaluating it on one backend, judging the JIT
// against the reference executor (and a float64 twin), and printing a program as C++.
#include <cxxabi.h>

#include <algorithm>
#include <map>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "op_table.hpp"

namespace kiln::fuzz {

// ---- building ------------------------------------------------------------------------------

/// The elements of `t` in row-major order as doubles (read in t's own dtype: no kiln cast).
inline std::vector<double> read_values(const Tensor& t) { return testing::values(t); }

/// The tensors of one build, and the memory that from_blob views read.
struct Built {
  std::vector<Tensor> values;
  std::vector<std::shared_ptr<void>> memory;
  std::vector<Tensor> outputs;  ///< what is read back (an assigned output is its destination)
  /// The assign destination's whole buffer (CPU) or base tensor (CUDA), to check its gaps.
  std::shared_ptr<void> assign_memory;
  Tensor assign_base;
  /// Predicted dtype/shape that the front end contradicted ("v3: predicted f32[3], got f64[3]").
  std::vector<std::string> rule_failures;
  /// Gradient mode: the floating inputs, leaves that require grad, in program order.
  std::vector<Tensor> leaves;
};

template <class T>
std::shared_ptr<void> host_array(const std::vector<double>& v, T** out) {
  std::shared_ptr<T[]> a(new T[v.size() ? v.size() : 1]);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, bool>)
      a[i] = v[i] != 0;
    else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      a[i] = T(static_cast<float>(v[i]));
    else
      a[i] = static_cast<T>(v[i]);
  }
  *out = a.get();
  return a;
}

template <class T>
std::vector<T> typed_vector(const std::vector<double>& v) {
  std::vector<T> out;
  out.reserve(v.size());
  for (double x : v) {
    if constexpr (std::is_same_v<T, bool>)
      out.push_back(x != 0);
    else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      out.push_back(T(static_cast<float>(x)));
    else
      out.push_back(static_cast<T>(x));
  }
  return out;
}

/// A tensor laid out as `in` says, on `device`: from_blob over host memory on the CPU; on a GPU
/// a realized buffer and views of it (permute / slices), which keep its strides.
inline Tensor make_input(const Input& in, Device device, Built& b, bool assign_target = false) {
  return visit_dtype(in.dtype, [&](auto tag) -> Tensor {
    using T = decltype(tag);
    Placement pl = placement(in);
    if (in.layout == Layout::Contiguous && !assign_target)
      return from_vector<T>(typed_vector<T>(in.values), in.shape, device);
    std::vector<double> buf = assign_target
                                  ? std::vector<double>(static_cast<std::size_t>(pl.buffer_size), poison(in.dtype))
                                  : buffer_values(in);
    if (device.is_cpu()) {
      T* p = nullptr;
      auto mem = host_array<T>(buf, &p);
      if (assign_target)
        b.assign_memory = mem;
      else
        b.memory.push_back(mem);
      return from_blob(p + pl.offset, in.shape, Device::cpu(), pl.strides);
    }
    std::size_t r = in.shape.size();
    if (in.layout == Layout::Permuted) {
      Shape bs(r);
      for (std::size_t i = 0; i < r; ++i) bs[i] = in.shape[static_cast<std::size_t>(in.perm[i])];
      Tensor base = from_vector<T>(typed_vector<T>(buf), bs, device);
      if (assign_target) b.assign_base = base;
      std::vector<std::int64_t> inv(r);
      for (std::size_t i = 0; i < r; ++i) inv[static_cast<std::size_t>(in.perm[i])] = static_cast<std::int64_t>(i);
      return permute(base, inv);
    }
    Shape padded(r, 1);
    if (in.layout == Layout::Strided)
      for (std::size_t d = 0; d < r; ++d) padded[d] = in.start[d] + in.shape[d] * in.step[d];
    else
      padded = in.shape;
    Tensor base = from_vector<T>(typed_vector<T>(buf), padded, device);
    if (assign_target) b.assign_base = base;
    Tensor v = base;
    if (in.layout == Layout::Strided)
      for (std::size_t d = 0; d < r; ++d)
        v = slice(v, static_cast<std::int64_t>(d), in.start[d], in.start[d] + in.shape[d] * in.step[d], in.step[d]);
    return v;
  });
}

inline std::string info_str(DType t, const Shape& s) { return std::string(dtype_name(t)) + s.str(); }

/// `x` (a host tensor) with every dim flipped: its row-major elements in reverse order.
inline Tensor reversed(const Tensor& x) {
  return visit_dtype(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> v = x.to_vector<T>();
    std::reverse(v.begin(), v.end());
    return from_vector<T>(v, x.shape());
  });
}

/// Gradient mode's weights of output `k`: fixed values in [-1.25, 1.25], multiples of 1/16
/// (exact in every floating dtype), so that no output's gradient is a plain sum (a softmax's
/// would be 0).
inline Tensor cotangent(const Shape& shape, std::size_t k, Device device) {
  std::vector<double> c(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<double>(static_cast<std::int64_t>((i * 7919 + k * 104729) % 41) - 20) / 16.0;
  return from_vector<double>(c, shape, device);
}

/// Gradient mode: `outputs` followed by the gradients of sum_k sum(outputs[k] · cotangent(k))
/// over the floating outputs that require grad, with respect to each of `leaves` (zeros where
/// a leaf does not reach them, as torch's None); `outputs` alone when none requires grad.
/// What the printed reproducers of gradient findings return.
inline std::vector<Tensor> with_gradients(std::vector<Tensor> outputs, const std::vector<Tensor>& leaves) {
  Tensor loss;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Tensor& o = outputs[k];
    if (!is_floating(o.dtype()) || !o.requires_grad()) continue;
    Tensor term = sum(o.to(DType::Float64) * cotangent(o.shape(), k, o.device()));
    loss = loss.defined() ? Tensor(loss + term) : term;
  }
  if (!loss.defined() || leaves.empty()) return outputs;
  std::vector<Tensor> grads = autograd::grad({loss}, leaves, {}, false, true);
  for (std::size_t i = 0; i < grads.size(); ++i)
    outputs.push_back(grads[i].defined() ? grads[i] : zeros_like(leaves[i]));
  return outputs;
}

/// Builds `p` through the public API. In the float64 twin (ctx.f64) floating inputs are read in
/// their own dtype and widened, floating dtype parameters become f64, and ops whose result is
/// floating widen their non-floating operands first (OpDesc::lift). Throws what the front end
/// throws.
inline Built build_program(const Program& p, const BuildCtx& ctx, const std::vector<Tensor>* args = nullptr) {
  const auto& table = op_table();
  Built b;
  std::size_t next_arg = 0;
  // The nudged twin also accumulates in another order: an accumulating op runs on its operands
  // with every dim flipped and its result is flipped back. Flipping all dims commutes with
  // broadcasting, pointwise ops and reductions over any dims, so only the order of the sums
  // and products changes, and with it whether a partial result overflows (a sum of +-1e300
  // and DBL_MAX, a product that meets its 0 before or after it overflowed). cross_entropy's
  // targets name positions along the class dim, so it keeps its order.
  auto reorders = [&](const OpDesc& d) { return ctx.perturb && d.accumulates && !d.fixed_order; };
  // Gradient mode flips through the graph (flip is differentiable; reversed reads the values).
  auto reverse = [&](const Tensor& x) {
    if (!p.grad) return reversed(x);
    std::vector<std::int64_t> dims(x.shape().size());
    for (std::size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<std::int64_t>(d);
    return dims.empty() ? x : flip(x, dims);
  };
  for (int v = 0; v < p.size(); ++v) {
    const Step& s = p.steps[static_cast<std::size_t>(v)];
    Tensor t;
    // The nudged twin (BuildCtx::perturb): x times 1 + d, |d| = ulps of the compute dtype of
    // `program_dtype` (float for f16/bf16/f32).
    // `may_overflow`: a device function's documented error (ulps above a half) can round a result
    // within that many ulps of the largest finite value up to infinity (CUDA's double hypot at
    // DBL_MAX), so there the nudge may too.
    auto nudge = [&](Tensor x, DType program_dtype, double ulps, std::uint64_t salt, bool may_overflow = false) {
      if (!ctx.perturb || !is_floating(program_dtype) || x.dtype() != f64 || ulps <= 0) return x;
      Rng r(ctx.perturb ^ ((static_cast<std::uint64_t>(v) * 8 + salt) * 0x9e3779b97f4a7c15ull));
      double eps = program_dtype == f64 ? dtype_eps(f64) : dtype_eps(f32);
      std::vector<double> f(static_cast<std::size_t>(x.numel()));
      // The bound itself, with a random sign: a spread drawn inside the bound can come out
      // near 0 and then stands for less than the error the JIT may have.
      for (auto& e : f) e = 1 + (r.uniform() < 0.5 ? -1 : 1) * ctx.sign * ulps * eps;
      // A finite value the factor would push past DBL_MAX stays as it is: a nudge imitates a
      // rounding, which never makes a finite operand infinite.
      Tensor y = x * from_vector<double>(f, x.shape());
      return may_overflow ? y : Tensor(where(isinf(y) && !isinf(x), x, y));
    };
    if (s.is_input) {
      // Inside kiln::compile the arguments stand for the inputs marked `arg`.
      t = args && s.input.arg ? (*args)[next_arg++] : make_input(s.input, ctx.device, b);
      if (ctx.f64 && is_floating(s.input.dtype)) t = t.to(f64);
      if (p.grad && is_floating(t.dtype())) {
        t = t.detach().requires_grad_();
        b.leaves.push_back(t);
      }
    } else {
      const OpDesc& d = table[static_cast<std::size_t>(s.op.desc)];
      std::vector<Tensor> args;
      for (std::size_t k = 0; k < s.op.args.size(); ++k) {
        const Operand& o = s.op.args[k];
        Tensor a = o.is_number() ? Tensor{} : b.values[static_cast<std::size_t>(o.value)];
        if (ctx.f64 && d.lift && k >= d.lift_from && a.defined() && !is_floating(a.dtype()) &&
            is_floating(s.info.dtype))
          a = a.to(f64);
        if (a.defined() && d.accumulates)
          a = nudge(a, p.info(o.value).dtype == f64 ? f64 : f32, d.operand_ulps ? d.operand_ulps(p, s.op) : 2.0, k);
        // (the nudged twin's matmul adds its own rounding bound: see its row)
        if (a.defined() && reorders(d)) a = reverse(a);
        args.push_back(a);
      }
      t = d.build(Args{args, s.op, ctx, p});
      // The twin computes in float64 throughout: an op whose floating result came out narrower
      // (where(mask, 0.1f, 3) of two C++ numbers is float32) is widened, exactly, so that what
      // reads it meets float64 operands (a matmul with a float64 leaf refused the mix: seed 507,
      // graph 23, where the twin then judged nothing).
      if (ctx.f64 && t.defined() && is_floating(t.dtype()) && t.dtype() != f64) t = t.to(f64);
      if (reorders(d)) t = reverse(t);
      // f64 programs call libm (within 4 ulp with libmvec, docs/performance-math.md "Double").
      if (d.ulp > 0 && ctx.perturb && d.ulp_of && is_floating(s.info.dtype) && t.dtype() == f64) {
        std::vector<double> xv = read_values(args[0]);  // the twin runs on the reference: cheap
        Rng r(ctx.perturb ^ ((static_cast<std::uint64_t>(v) * 8 + 7) * 0x9e3779b97f4a7c15ull));
        double eps = s.info.dtype == f64 ? dtype_eps(f64) : dtype_eps(f32);
        std::vector<double> f(xv.size());
        for (std::size_t i = 0; i < f.size(); ++i)
          f[i] = 1 + (r.uniform() < 0.5 ? -1 : 1) * ctx.sign * std::max(d.ulp, d.ulp_of(xv[i])) * eps;
        Tensor y = t * from_vector<double>(f, t.shape());
        t = Tensor(where(isinf(y) && !isinf(t), t, y));
      } else if (d.ulp > 0) {
        const double ulp = ctx.cuda_math ? std::max(d.ulp, d.cuda_ulp) : d.ulp;
        t = nudge(t, s.info.dtype, s.info.dtype == f64 ? std::max(4.0, ulp) : ulp, 7, ctx.cuda_math && d.cuda_ulp > 0);
      } else if (ctx.cuda_math && d.cuda_ulp > 0) {
        t = nudge(t, s.info.dtype, d.cuda_ulp, 7, true);  // exact on the host, not on the GPU (randn, hypot)
      }
      if (s.op.eval_after) t.eval();
    }
    if (!ctx.f64 && (t.dtype() != s.info.dtype || t.shape() != s.info.shape)) {
      std::string what = s.is_input ? "input" : table[static_cast<std::size_t>(s.op.desc)].name;
      b.rule_failures.push_back(what + ": v" + std::to_string(v) + " = " + what + "(...): PyTorch's rules give " +
                                info_str(s.info.dtype, s.info.shape) + ", kiln gives " +
                                info_str(t.dtype(), t.shape()));
    }
    b.values.push_back(t);
  }
  for (int o : p.outputs) b.outputs.push_back(b.values[static_cast<std::size_t>(o)]);
  if (p.grad) b.outputs = with_gradients(b.outputs, b.leaves);
  return b;
}

// ---- evaluating ----------------------------------------------------------------------------

/// The exception's type as C++ spells it ("kiln::CompileError", "std::bad_alloc").
inline std::string error_type(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string s = status == 0 && name ? name : typeid(e).name();
  std::free(name);
  return s;
}

/// The outcome of one program on one backend.
struct Result {
  enum class Status { Ok, BuildError, EvalError } status = Status::Ok;
  std::string error_type, error;
  std::vector<std::vector<double>> values;  ///< per output
  std::vector<Info> infos;                  ///< actual dtype and shape per output
  std::vector<std::string> rule_failures;   ///< front-end dtype/shape against PyTorch's rules
  std::vector<std::string> checks;          ///< other failed checks (assign gaps, oracles)
};

/// Runs `p` with backend `mode` (Eager: the reference executor; Jit: generated kernels) on ctx.
/// With `oracles`, also checks the reference against the op table's exact oracles and notes
/// where documented accuracy limits apply.
inline Result run_program(const Program& p, Backend mode, const BuildCtx& ctx, bool oracles = false) {
  Result r;
  set_backend(mode);
  Built b;
  try {
    b = build_program(p, ctx);
  } catch (const std::exception& e) {
    r.status = Result::Status::BuildError;
    r.error_type = error_type(e);
    r.error = e.what();
    return r;
  }
  r.rule_failures = b.rule_failures;
  try {
    std::vector<Tensor> to_eval;
    for (std::size_t k = 0; k < b.outputs.size(); ++k)
      if (static_cast<int>(k) != p.assign_output) to_eval.push_back(b.outputs[k]);
    eval(to_eval);
    if (p.assign_output >= 0) {
      Tensor dst = make_input(p.assign_dst, ctx.device, b, true);
      if (ctx.f64 && is_floating(p.assign_dst.dtype)) {
        // The twin has no user buffer of the program's dtype: it casts as assign would.
        b.outputs[static_cast<std::size_t>(p.assign_output)] =
            b.outputs[static_cast<std::size_t>(p.assign_output)].to(f64);
      } else {
        dst.assign(b.outputs[static_cast<std::size_t>(p.assign_output)]);
        b.outputs[static_cast<std::size_t>(p.assign_output)] = dst;
      }
    }
    for (auto& o : b.outputs) {
      r.values.push_back(read_values(o));
      r.infos.push_back({o.dtype(), o.shape()});
    }
    if (p.assign_output >= 0 && !ctx.f64) {
      // Every element outside the destination's view must still hold the poison value.
      Placement pl = placement(p.assign_dst);
      std::vector<double> whole;
      if (ctx.device.is_cpu()) {
        visit_dtype(p.assign_dst.dtype, [&](auto tag) {
          using T = decltype(tag);
          const T* q = static_cast<const T*>(b.assign_memory.get());
          for (std::int64_t i = 0; i < pl.buffer_size; ++i) {
            if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
              whole.push_back(static_cast<float>(q[i]));
            else
              whole.push_back(static_cast<double>(q[i]));
          }
        });
      } else if (b.assign_base.defined()) {
        whole = read_values(b.assign_base);
      }
      Input mark = p.assign_dst;
      mark.values.assign(static_cast<std::size_t>(mark.shape.numel()), -1.0);
      std::vector<double> marked = buffer_values(mark);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < whole.size() && i < marked.size(); ++i)
        if (marked[i] != -1.0 && whole[i] != poison(p.assign_dst.dtype)) ++bad;
      if (bad) r.checks.push_back("assign wrote " + std::to_string(bad) + " elements outside its destination view");
    }
    if (oracles) {
      const auto& table = op_table();
      for (int v = 0; v < p.size(); ++v) {
        const Step& s = p.steps[static_cast<std::size_t>(v)];
        if (s.is_input) continue;
        const OpDesc& d = table[static_cast<std::size_t>(s.op.desc)];
        std::vector<std::vector<double>> operand_values;
        if (!d.oracle) continue;
        for (auto& o : s.op.args)
          operand_values.push_back(o.is_number() ? std::vector<double>{o.number.value}
                                                 : read_values(b.values[static_cast<std::size_t>(o.value)]));
        std::vector<DType> operand_dtypes;
        for (auto& o : s.op.args)
          operand_dtypes.push_back(o.is_number() ? o.number.wrapped_dtype() : p.info(o.value).dtype);
        std::vector<std::vector<std::int64_t>> exact_ints;
        for (auto& o : s.op.args)
          exact_ints.push_back(!o.is_number() && p.info(o.value).dtype == DType::Int64
                                   ? b.values[static_cast<std::size_t>(o.value)].to_vector<std::int64_t>()
                                   : std::vector<std::int64_t>{});
        std::vector<double> want = d.oracle(s.op, s.info, operand_values, operand_dtypes, exact_ints);
        std::vector<double> got = read_values(b.values[static_cast<std::size_t>(v)]);
        for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
          bool same = (std::isnan(want[i]) && std::isnan(got[i])) || want[i] == got[i];
          if (!same) {
            std::ostringstream os;
            os.precision(17);
            os << d.name << ": v" << v << " element " << i << " is " << got[i] << ", the documented rule gives "
               << want[i];
            if (!s.op.args.empty() && !s.op.args[0].is_number() && i < operand_values[0].size())
              os << " (operand " << operand_values[0][i] << ")";
            r.checks.push_back(os.str());
            break;
          }
        }
      }
    }
  } catch (const std::exception& e) {
    r.status = Result::Status::EvalError;
    r.error_type = error_type(e);
    r.error = e.what();
  }
  return r;
}

// ---- judging --------------------------------------------------------------------------------

/// |actual - expected| <= atol + rtol * |expected| (torch.testing.assert_close's defaults).
struct Tolerance {
  double rtol = 0, atol = 0;
};
inline Tolerance tolerance(DType t) {
  switch (t) {
    case DType::Float16:
      return {1e-3, 1e-5};
    case DType::BFloat16:
      return {1.6e-2, 1e-5};
    case DType::Float32:
      return {1.3e-6, 1e-5};
    case DType::Float64:
      return {1e-7, 1e-7};
    default:
      return {0, 0};
  }
}

/// How far the JIT may be from the float64 twin, as a multiple of the reference's own distance
/// from it (see docs/fuzzing.md, "Tolerance model").
inline constexpr double kTwinFactor = 4.0;

enum class Kind {
  Pass,
  Mismatch,    ///< values differ beyond the tolerance model
  JitError,    ///< the JIT threw (CompileError, ...) where the reference evaluated
  RefError,    ///< the reference threw where the JIT evaluated
  EvalError,   ///< both threw while evaluating a valid program
  BuildError,  ///< the front end rejected a program PyTorch's rules accept
  Rule,        ///< the front end's dtype or shape contradicts PyTorch's rules
  Oracle,      ///< the reference contradicts an exact documented rule (casts, creation)
  Assign,      ///< assign wrote outside its destination
  Crash,       ///< the process died (signal)
  Timeout,
  ProbeFailed,      ///< an invalid call did not raise the documented error
  CompileMismatch,  ///< a kiln::compile call's values differ from the reference's
  CompileError,     ///< a kiln::compile call threw where the reference evaluated
};

/// The program as kiln::compile's second call sees it: argument inputs hold their values2.
inline Program second_call(const Program& p) {
  Program q = p;
  for (auto& st : q.steps)
    if (st.is_input && st.input.arg) st.input.values = st.input.values2;
  return q;
}

inline const char* compile_mode_name(int m) { return m == 2 ? "reduce-overhead" : "default"; }

/// Calls `p` through kiln::compile twice (trace and compile, then replay on the second values)
/// with its argument inputs; the outputs of each call.
inline std::pair<Result, Result> run_compiled(const Program& p, Device dev) {
  Result r[2];
  set_backend(Backend::Jit);
  std::vector<std::shared_ptr<void>> keep;  // host memory the captured inputs view
  BuildCtx ctx{false, dev};
  auto fn = [&p, &keep, ctx](const auto&... ts) {
    std::vector<Tensor> given{ts...};
    Built b = build_program(p, ctx, &given);
    keep.insert(keep.end(), b.memory.begin(), b.memory.end());
    return b.outputs;  // the outputs, then (gradient mode) the gradients
  };
  CompileOptions opts;
  opts.mode = compile_mode_name(p.compile_mode);
  if (p.compile_mode == 3) opts.dynamic = true;
  Program p2 = second_call(p);
  Built held;
  std::vector<Tensor> args[2];
  try {
    auto f = kiln::compile(fn, opts);
    for (int c = 0; c < 2; ++c)
      for (auto& st : (c ? p2 : p).steps)
        if (st.is_input && st.input.arg) args[c].push_back(make_input(st.input, dev, held));
    for (int c = 0; c < 2; ++c) {
      try {
        const auto& a = args[c];
        const std::vector<Tensor> o =
            a.size() == 0 ? f() : a.size() == 1 ? f(a[0]) : a.size() == 2 ? f(a[0], a[1]) : f(a[0], a[1], a[2]);
        for (const Tensor& t : o) {
          r[c].values.push_back(read_values(t));
          r[c].infos.push_back({t.dtype(), t.shape()});
        }
      } catch (const std::exception& e) {
        r[c].status = Result::Status::EvalError;
        r[c].error_type = error_type(e);
        r[c].error = e.what();
      }
    }
  } catch (const std::exception& e) {
    for (auto& x : r) {
      x.status = Result::Status::EvalError;
      x.error_type = error_type(e);
      x.error = e.what();
    }
  }
  set_backend(Backend::Auto);
  return {r[0], r[1]};
}

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Pass:
      return "pass";
    case Kind::Mismatch:
      return "mismatch";
    case Kind::JitError:
      return "jit-error";
    case Kind::RefError:
      return "reference-error";
    case Kind::EvalError:
      return "eval-error";
    case Kind::BuildError:
      return "build-error";
    case Kind::Rule:
      return "dtype-shape-rule";
    case Kind::Oracle:
      return "oracle";
    case Kind::Assign:
      return "assign";
    case Kind::Crash:
      return "crash";
    case Kind::Timeout:
      return "timeout";
    case Kind::ProbeFailed:
      return "probe-failed";
    case Kind::CompileMismatch:
      return "compile-mismatch";
    case Kind::CompileError:
      return "compile-error";
  }
  return "?";
}

inline bool is_bug(Kind k) { return k != Kind::Pass; }

struct Verdict {
  Kind kind = Kind::Pass;
  std::string detail;
  /// Elements outside the dtype's tolerance of the reference that the float64 twin excused
  /// (the JIT no further from float64 than kTwinFactor times the reference): reported so that
  /// the tolerance model's slack stays visible.
  std::size_t excused = 0;
  /// What must stay the same while shrinking: the kind plus, for errors, the error type.
  std::string signature() const {
    std::string s = kind_name(kind);
    if (kind == Kind::JitError || kind == Kind::RefError || kind == Kind::EvalError || kind == Kind::BuildError ||
        kind == Kind::Rule || kind == Kind::Oracle || kind == Kind::CompileError)
      s += ":" + detail.substr(0, detail.find(": "));
    return s;
  }
};

inline std::string num_str(double x) {
  std::ostringstream os;
  os.precision(9);
  os << x;
  return os.str();
}

/// One element. `t` is the float64 twin's value (cast back to the dtype) when have_t, and
/// `spread` how far the twin moved when its inputs were nudged by one epsilon (+inf when it
/// moved to or from a non-finite value). Rules:
///  - integers and bool: equal;
///  - NaN must meet NaN, an infinity the same infinity (or the largest finite value of the
///    same sign: one rounding at the overflow threshold), unless the output is ill-conditioned
///    (spread not finite: the order of a sum decides between inf, NaN and a finite value);
///  - finite values: within torch.testing's tolerance of the reference, widened by twice the
///    spread; or else no further from the twin than kTwinFactor times the reference is.
/// `excused` is set when an element passes only through the spread or the twin.
inline bool element_close(double j, double r, double t, bool have_t, DType dt, double spread = 0,
                          bool* excused = nullptr) {
  auto excuse = [&] {
    if (excused) *excused = true;
    return true;
  };
  // An integer or bool that the nudge changes (a comparison, cast, argmax or floor of a value
  // at a tie or threshold) depends on roundings the JIT may do differently.
  // Also when the JIT gives the float64 twin's value: the reference's own roundings decided
  // (an argmax among values that round to one float in one order and not in another).
  if (!is_floating(dt)) return j == r || (have_t && (spread != 0 || j == t) && excuse());
  bool ill = have_t && !std::isfinite(spread);
  if (std::isnan(j) || std::isnan(r)) {
    if (std::isnan(j) && std::isnan(r)) return true;
    return ill ? excuse() : false;
  }
  Tolerance tol = tolerance(dt);
  if (std::isinf(j) || std::isinf(r)) {
    if (j == r) return true;
    double f = std::isinf(j) ? r : j, inf = std::isinf(j) ? j : r;
    if (std::signbit(f) == std::signbit(inf) && std::fabs(f) >= kiln::largest_finite(dt) * (1 - 4 * tol.rtol))
      return true;
    return ill ? excuse() : false;
  }
  if (std::fabs(j - r) <= tol.atol + tol.rtol * std::fabs(r)) return true;
  if (!have_t) return false;
  if (ill) return excuse();
  double slack = 2 * spread;
  if (std::fabs(j - r) <= tol.atol + tol.rtol * std::fabs(r) + slack) return excuse();
  if (!std::isfinite(t)) return false;
  double ej = std::fabs(j - t), er = std::fabs(r - t);
  if (ej <= kTwinFactor * er + tol.atol + tol.rtol * std::fabs(t) + slack) return excuse();
  return false;
}

/// How far each twin output element moved under the nudge: +inf where it became or stopped
/// being finite, and where it moved by as much as its own magnitude (to 0 or across it: a
/// cancellation left it no correct digit, so a quotient by it may be anything up to inf).
inline std::vector<double> spread_of(const std::vector<double>& twin, const std::vector<double>& nudged, DType dt) {
  std::vector<double> s(twin.size(), 0.0);
  for (std::size_t i = 0; i < twin.size() && i < nudged.size(); ++i) {
    double a = round_to(twin[i], dt), b = round_to(nudged[i], dt);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (a == b) continue;
    s[i] = (std::isfinite(a) && std::isfinite(b)) ? std::fabs(a - b) : HUGE_VAL;
    if (a != 0 && s[i] >= std::fabs(a)) s[i] = HUGE_VAL;
  }
  return s;
}

inline std::string describe_index(std::size_t i, const Shape& s) {
  std::vector<std::int64_t> idx(s.size());
  std::int64_t f = static_cast<std::int64_t>(i);
  for (std::size_t d = s.size(); d-- > 0;) {
    if (s[d] > 0) {
      idx[d] = f % s[d];
      f /= s[d];
    }
  }
  return ints_literal(idx);
}

/// The outputs of `p` downstream of a digitless intermediate: a floating value that the nudged
/// twin moves by its own magnitude or into or out of the finite range (a sum of +-1e300 and
/// DBL_MAX that cancels, whose sign and size the order of the additions decides). A quotient or
/// logarithm of it may be finite, infinite, NaN or any size in a correct implementation, and
/// the outputs computed from it have no reference value. So has a product with a 0 or an
/// infinity among factors whose partial products leave the dtype's range (0, inf or NaN by
/// the order). Which of their elements depend on the digitless ones is not tracked (a row's
/// mean may overflow in one order and not in another without moving under the nudge), so every
/// element of such an output is excused. Runs both
/// twins again, recording every step: only called for a mismatch, so it excuses nothing in the
/// graphs that pass.
inline std::vector<char> outputs_after_digitless(const Program& p, std::uint64_t perturb, bool cuda_math) {
  std::vector<char> loose(p.outputs.size(), 0);
  std::vector<char> digitless(static_cast<std::size_t>(p.size()), 0);
  std::vector<std::vector<double>> twin_values;  // gradient mode: the float64 twin's values
  try {
    set_backend(Backend::Eager);
    Built a = build_program(p, BuildCtx{true, Device::cpu()});
    Built b = build_program(p, BuildCtx{true, Device::cpu(), perturb, cuda_math});
    eval(a.values);
    eval(b.values);
    if (p.grad)
      for (const Tensor& t : a.values) twin_values.push_back(is_floating(t.dtype()) ? read_values(t) : std::vector<double>{});
    for (int v = 0; v < p.size(); ++v) {
      const auto k = static_cast<std::size_t>(v);
      if (!is_floating(p.steps[k].info.dtype) || !is_floating(a.values[k].dtype())) continue;
      std::vector<double> x = read_values(a.values[k]), y = read_values(b.values[k]);
      for (std::size_t i = 0; i < x.size() && i < y.size() && !digitless[k]; ++i) {
        if (std::isnan(x[i]) && std::isnan(y[i])) continue;
        digitless[k] = std::isfinite(x[i]) != std::isfinite(y[i]) ||
                       (std::isfinite(x[i]) && x[i] != 0 && std::fabs(x[i] - y[i]) >= std::fabs(x[i]));
      }
    }
    // cummin's indices over an inexact operand (one the nudged twin moves): where a later
    // element lies within a few roundings of the running minimum, which of the two is the
    // minimum (or whether they tie, when the last one wins) is the last ulp's decision, made
    // differently by a JIT whose tanh is within its bound but one ulp from the reference's
    // (tanh(8.897) rounds to 0.99999994 or 1 = tanh(FLT_MAX)). Sort and topk positions are
    // left out of the table for the same reason.
    const auto& rows = op_table();
    for (int v = 0; v < p.size(); ++v) {
      const Step& st = p.steps[static_cast<std::size_t>(v)];
      if (st.is_input || !rows[static_cast<std::size_t>(st.op.desc)].running_extreme_position) continue;
      const int operand = st.op.args[0].value;
      if (!is_floating(p.info(operand).dtype)) continue;
      const std::vector<double> x = read_values(a.values[static_cast<std::size_t>(operand)]),
                                y = read_values(b.values[static_cast<std::size_t>(operand)]);
      bool inexact = false;
      for (std::size_t i = 0; i < x.size() && i < y.size() && !inexact; ++i)
        inexact = x[i] != y[i] && !(std::isnan(x[i]) && std::isnan(y[i]));
      if (!inexact) continue;
      const Shape& shape = p.info(operand).shape;
      const auto axis = static_cast<std::size_t>(st.op.p.ints[0] < 0 ? st.op.p.ints[0] + static_cast<std::int64_t>(shape.size())
                                                                     : st.op.p.ints[0]);
      std::int64_t inner = 1;
      for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
      const std::int64_t len = shape[axis], outer = len > 0 && inner > 0 ? static_cast<std::int64_t>(x.size()) / (len * inner) : 0;
      const double near = 8 * (p.info(operand).dtype == f64 ? dtype_eps(f64) : dtype_eps(f32));
      for (std::int64_t o = 0; o < outer && !digitless[static_cast<std::size_t>(v)]; ++o)
        for (std::int64_t i = 0; i < inner && !digitless[static_cast<std::size_t>(v)]; ++i) {
          double m = HUGE_VAL;
          for (std::int64_t k = 0; k < len; ++k) {
            const double e = x[static_cast<std::size_t>((o * len + k) * inner + i)];
            if (std::isnan(e)) break;  // NaN is the minimum from here on, in every rounding
            if (k > 0 && std::fabs(e - m) <= near * std::max(std::fabs(e), std::fabs(m))) {
              digitless[static_cast<std::size_t>(v)] = 1;
              break;
            }
            m = std::min(m, e);
          }
        }
    }
    // Ops whose result depends on the order of their accumulation through the range of the
    // compute dtype (float for the half types), judged on the twin's operands; the op table's
    // order_risk column says which rule an op takes (OpDesc::OrderRisk):
    //  - prod: factors whose partial products overflow or underflow in some order (with a 0
    //    or an infinity among them 0 * inf meets NaN or not as the blocking decides; without
    //    one a finite product becomes inf or 0; the reference multiplies in long double);
    //  - sum, mean, var, layer_norm: a row whose positive or negative terms alone reach the
    //    largest value while the row's total stays within it (ones with DBL_MAX and two
    //    -DBL_MAX: the reference's lanes overflow, the JIT's blocked sum cancels first); sums
    //    of one sign, and of squares (rms_norm), overflow in every order or in none;
    //  - matmul: max |a| max |b| K reaching the largest value (a library's float dot product
    //    meets inf - inf, or a partial sum past FLT_MAX that later cancels; the reference
    //    accumulates in f64).
    for (int v = 0; v < p.size(); ++v) {
      const Step& st = p.steps[static_cast<std::size_t>(v)];
      if (st.is_input || st.op.args.empty() || st.op.args[0].is_number() || !is_floating(st.info.dtype)) continue;
      using Risk = OpDesc::OrderRisk;
      const Risk risk = rows[static_cast<std::size_t>(st.op.desc)].order_risk;
      if (risk == Risk::None) continue;
      const bool norm = risk == Risk::LastDimSums, attention = risk == Risk::Attention;
      const bool f64_compute = st.info.dtype == f64;
      const double top = kiln::largest_finite(f64_compute ? f64 : f32);
      const Shape& shape = p.info(st.op.args[0].value).shape;
      const std::vector<double> x = read_values(a.values[static_cast<std::size_t>(st.op.args[0].value)]);
      bool order_dependent = false;
      if (risk == Risk::Product) {
        // log2 of the compute dtype's largest and smallest (subnormal) sizes, and of the
        // largest and the smallest partial product's size
        const double up_limit = f64_compute ? 1024 : 128, down_limit = f64_compute ? -1074 : -149;
        double up = 0, down = 0;
        for (double e : x) {
          if (e == 0 || !std::isfinite(e)) continue;
          const double l = std::log2(std::fabs(e));
          (l > 0 ? up : down) += l;
        }
        order_dependent = up >= up_limit || down < down_limit;
      } else if (risk == Risk::Dot || attention) {
        if (st.op.args[1].is_number()) continue;
        auto largest = [](const std::vector<double>& vals) {
          double m = 0;
          for (double e : vals)
            if (std::isfinite(e)) m = std::max(m, std::fabs(e));
          return m;
        };
        const double b = largest(read_values(a.values[static_cast<std::size_t>(st.op.args[1].value)]));
        const double K = static_cast<double>(std::max<std::int64_t>(1, shape.back()));
        order_dependent = largest(x) * b * K >= top;
        // Attention's scores are q kT (the same rule), and its output a weighted sum of v's
        // rows over the keys (weights at most 1).
        if (attention && st.op.args.size() > 2 && !st.op.args[2].is_number()) {
          const std::vector<std::int64_t>& ks = p.info(st.op.args[1].value).shape;
          const double S = ks.size() >= 2 ? static_cast<double>(std::max<std::int64_t>(1, ks[ks.size() - 2])) : 1;
          const std::vector<double> vv = read_values(a.values[static_cast<std::size_t>(st.op.args[2].value)]);
          order_dependent = order_dependent || largest(vv) * S >= top;
          // Under the causal mask the fused kernels skip the keys past the diagonal a block at
          // a time (as PyTorch's flash kernels do), while the definition weighs every key by 0:
          // a non-finite value of v there gives 0 * inf = NaN in one and nothing in the other.
          const bool causal = !st.op.p.ints.empty() && st.op.p.ints[0] != 0;
          if (causal)
            for (double x : vv) order_dependent = order_dependent || !std::isfinite(x);
        }
      } else {
        std::vector<bool> reduced(shape.size(), false);
        if (norm) {
          if (!reduced.empty()) reduced.back() = true;
        } else if (auto ax = norm_axes(st.op.p.ints, shape.size())) {
          for (auto d : *ax) reduced[static_cast<std::size_t>(d)] = true;
        }
        // Per kept position: the positive and the negative terms, scaled by the largest value
        // so that nothing overflows here.
        std::map<std::int64_t, std::pair<double, double>> rows;
        for (std::size_t f = 0; f < x.size(); ++f) {
          if (!std::isfinite(x[f])) continue;
          std::int64_t rest = static_cast<std::int64_t>(f), key = 0, scale = 1;
          for (std::size_t d = shape.size(); d-- > 0;) {
            const std::int64_t at = shape[d] > 0 ? rest % shape[d] : 0;
            rest = shape[d] > 0 ? rest / shape[d] : 0;
            if (!reduced[d]) key += at * scale, scale *= shape[d];
          }
          auto& r = rows[key];
          (x[f] > 0 ? r.first : r.second) += std::fabs(x[f]) / top;
        }
        for (auto& [key, r] : rows)
          order_dependent = order_dependent || (std::max(r.first, r.second) >= 1 && std::fabs(r.first - r.second) <= 1);
      }
      if (order_dependent) digitless[static_cast<std::size_t>(v)] = 1;
    }
  } catch (const std::exception&) {
    return loose;  // a twin that cannot run excuses nothing
  }
  // Steps are in program order: one forward pass carries the mark to every dependent.
  for (int v = 0; v < p.size(); ++v) {
    const Step& st = p.steps[static_cast<std::size_t>(v)];
    if (st.is_input) continue;
    for (auto& o : st.op.args)
      if (!o.is_number() && digitless[static_cast<std::size_t>(o.value)]) digitless[static_cast<std::size_t>(v)] = 1;
  }
  for (std::size_t o = 0; o < p.outputs.size(); ++o) loose[o] = digitless[static_cast<std::size_t>(p.outputs[o])];
  if (p.grad) {
    // Gradient mode: the backward reads the forward's values, so a gradient is as loose as any
    // step of the program (the outputs come first, then one gradient per floating input); and
    // a backward multiplies forward values together (a cotangent times v, a chain of factors),
    // so a value past the square root of its dtype's largest may overflow the float backward
    // where the float64 twin does not (fuzz seed 502, graph 444: dout · v with v of -3.4e38).
    bool any = std::any_of(digitless.begin(), digitless.end(), [](char d) { return d != 0; });
    for (int v = 0; v < p.size() && !any; ++v) {
      const DType dt = p.info(v).dtype;
      if (!is_floating(dt)) continue;
      const double root = std::sqrt(kiln::largest_finite(dt));
      for (double x : twin_values[static_cast<std::size_t>(v)])
        if (std::isfinite(x) && std::fabs(x) >= root) {
          any = true;
          break;
        }
    }
    for (const Step& st : p.steps)
      if (st.is_input && is_floating(st.input.dtype)) loose.push_back(any ? 1 : 0);
  }
  return loose;
}

/// The verdict on the JIT's result given the reference's, the float64 twin's and the nudged
/// twin's (and `more` nudged twins: the mirrored one, nudged the other way, and ones nudged
/// with other seeds; an element's spread is the largest move); `loose` marks the outputs
/// excused whole (outputs_after_digitless).
inline Verdict judge(const Program& p, const Result& ref, const Result& jit, const Result* twin,
                     const Result* nudged = nullptr, const std::vector<char>* loose = nullptr,
                     const std::vector<const Result*>& more = {}) {
  Verdict v;
  auto fail = [&](Kind k, std::string d) {
    v.kind = k;
    v.detail = std::move(d);
    return v;
  };
  if (ref.status == Result::Status::BuildError) return fail(Kind::BuildError, ref.error_type + ": " + ref.error);
  if (!ref.rule_failures.empty()) return fail(Kind::Rule, ref.rule_failures[0]);
  if (ref.status == Result::Status::EvalError && jit.status == Result::Status::EvalError)
    return fail(Kind::EvalError, ref.error_type + ": " + ref.error);
  if (ref.status == Result::Status::EvalError) return fail(Kind::RefError, ref.error_type + ": " + ref.error);
  if (jit.status != Result::Status::Ok) return fail(Kind::JitError, jit.error_type + ": " + jit.error);
  for (auto& c : ref.checks)
    if (c.rfind("assign", 0) != 0) return fail(Kind::Oracle, c);
  for (auto& c : ref.checks) return fail(Kind::Assign, "reference: " + c);
  for (auto& c : jit.checks) return fail(Kind::Assign, "jit: " + c);
  bool twin_ok = twin && twin->status == Result::Status::Ok && twin->values.size() == ref.values.size();
  for (std::size_t o = 0; o < ref.values.size(); ++o) {
    const Info& ri = ref.infos[o];
    const Info& ji = jit.infos[o];
    if (ri.dtype != ji.dtype || ri.shape != ji.shape)
      return fail(Kind::Mismatch, "output " + std::to_string(o) + ": jit " + info_str(ji.dtype, ji.shape) +
                                      ", reference " + info_str(ri.dtype, ri.shape));
    const auto& rv = ref.values[o];
    const auto& jv = jit.values[o];
    bool have_t = twin_ok && twin->values[o].size() == rv.size();
    std::vector<double> spread(rv.size(), 0.0);
    if (have_t && nudged && nudged->status == Result::Status::Ok && nudged->values.size() == ref.values.size())
      spread = spread_of(twin->values[o], nudged->values[o], ri.dtype);
    for (const Result* m : more) {
      if (!have_t || !m || m->status != Result::Status::Ok || m->values.size() != ref.values.size()) continue;
      const std::vector<double> other = spread_of(twin->values[o], m->values[o], ri.dtype);
      for (std::size_t i = 0; i < spread.size() && i < other.size(); ++i) spread[i] = std::max(spread[i], other[i]);
    }
    if (have_t && loose && o < loose->size() && (*loose)[o])
      for (std::size_t i = 0; i < rv.size(); ++i) spread[i] = HUGE_VAL;
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < rv.size(); ++i) {
      double t = have_t ? round_to(twin->values[o][i], ri.dtype) : 0;
      bool excused = false;
      if (!element_close(jv[i], rv[i], t, have_t, ri.dtype, spread[i], &excused)) {
        if (!bad) first = i;
        ++bad;
      }
      v.excused += excused ? 1 : 0;
    }
    if (bad) {
      double t = have_t ? twin->values[o][first] : NAN;
      const std::string which = o < p.outputs.size() ? "v" + std::to_string(p.outputs[o])
                                                     : "gradient " + std::to_string(o - p.outputs.size());
      std::string d = "output " + std::to_string(o) + " (" + which + ", " +
                      info_str(ri.dtype, ri.shape) + "): " + std::to_string(bad) + " of " + std::to_string(rv.size()) +
                      " elements differ; first at " + describe_index(first, ri.shape) + ": jit " + num_str(jv[first]) +
                      ", reference " + num_str(rv[first]) + ", float64 twin " + num_str(t) + " (moves by " +
                      num_str(spread[first]) + " under a 1-eps nudge)";
      return fail(Kind::Mismatch, d);
    }
  }
  return v;
}

/// Makes `r` wrong in one element (the first of the first output): the checker's self-test
/// (kiln_fuzz --selftest) counts how often such a corruption is caught.
inline void corrupt(Result& r) {
  for (std::size_t o = 0; o < r.values.size(); ++o) {
    if (r.values[o].empty()) continue;
    double& x = r.values[o][0];
    DType t = r.infos[o].dtype;
    if (t == bool_)
      x = x != 0 ? 0 : 1;
    else if (!is_floating(t))
      x += 1;
    else if (!std::isfinite(x))
      x = std::isnan(x) ? 0 : -x;
    else
      x = x * 1.05 + (x >= 0 ? 0.05 : -0.05);
    return;
  }
}

/// The nudged twin of `p` with every nudge's sign reversed (BuildCtx::sign).
inline Result mirrored_twin(const Program& p, std::uint64_t perturb, bool cuda_math) {
  BuildCtx ctx{true, Device::cpu(), perturb, cuda_math};
  ctx.sign = -1;
  Result r = run_program(p, Backend::Eager, ctx);
  set_backend(Backend::Auto);
  return r;
}

/// How many more nudged twins, each with its own seed, a mismatch that the first nudge and its
/// mirror leave is judged against.
inline constexpr int kExtraNudges = 3;

/// The judge's verdict on `jit`, escalated while it is a mismatch: first against the nudged
/// twin alone; then with the outputs downstream of a digitless step excused; then with the
/// mirrored twin; then with kExtraNudges twins nudged with other seeds. The nudges' signs are
/// random, so the spread they give an element can cancel by chance (a value next to an integer
/// moved away from it only, which the mirror covers; two products' nudges that cancel through a
/// second product, as in fuzz seed 602, graph 1772: 5.7e-6 where other seeds give 1e-4 and
/// more, which the mirror does not). The later steps run only for a mismatch: the graphs that
/// pass cost one nudged twin.
inline Verdict judge_escalating(const Program& p, const Result& ref, const Result& jit, const Result* twin,
                                const Result* nudged, std::uint64_t perturb, bool cuda_math) {
  Verdict v = judge(p, ref, jit, twin, nudged);
  if (v.kind != Kind::Mismatch || !twin) return v;
  const std::vector<char> loose = outputs_after_digitless(p, perturb, cuda_math);
  v = judge(p, ref, jit, twin, nudged, &loose);
  if (v.kind != Kind::Mismatch) return v;
  std::vector<Result> more;
  more.reserve(1 + kExtraNudges);
  more.push_back(mirrored_twin(p, perturb, cuda_math));
  for (int k = 0; k <= kExtraNudges; ++k) {
    if (k > 0) {
      more.push_back(run_program(p, Backend::Eager,
                                 BuildCtx{true, Device::cpu(), perturb ^ (0x5851f42d4c957f2dull * static_cast<std::uint64_t>(k)),
                                          cuda_math}));
      set_backend(Backend::Auto);
    }
    std::vector<const Result*> views;
    for (const Result& r : more) views.push_back(&r);
    v = judge(p, ref, jit, twin, nudged, &loose, views);
    if (v.kind != Kind::Mismatch) return v;
  }
  return v;
}

/// Runs the reference, the JIT (on `device`) and the float64 twin, and judges.
inline Verdict check_program(const Program& p, Device device = Device::cpu(), bool selftest = false) {
  Result ref = run_program(p, Backend::Eager, BuildCtx{false, Device::cpu()}, true);
  if (ref.status == Result::Status::BuildError || !ref.rule_failures.empty()) return judge(p, ref, ref, nullptr);
  Result jit = run_program(p, Backend::Jit, BuildCtx{false, device});
  if (selftest) corrupt(jit);
  bool floating = false;  // the twins matter wherever a float is computed, even if the outputs are integers
  for (auto& st : p.steps) floating = floating || is_floating(st.info.dtype);
  Result twin, nudged;
  if (floating && jit.status == Result::Status::Ok) {
    twin = run_program(p, Backend::Eager, BuildCtx{true, Device::cpu()});
    nudged = run_program(p, Backend::Eager, BuildCtx{true, Device::cpu(), p.seed * 31 + p.index + 1, device.is_cuda()});
  }
  Verdict v = judge_escalating(p, ref, jit, floating ? &twin : nullptr, floating ? &nudged : nullptr,
                               p.seed * 31 + p.index + 1, device.is_cuda());
  set_backend(Backend::Auto);
  if (v.kind != Kind::Pass || !p.compile_mode) return v;
  // kiln::compile: the first call against the same reference, the replay on new values against
  // the reference of the program holding them.
  auto calls = run_compiled(p, device);
  Program p2 = second_call(p);
  Result ref2 = run_program(p2, Backend::Eager, BuildCtx{false, Device::cpu()});
  Result twin2, nudged2;
  if (floating && calls.second.status == Result::Status::Ok) {
    twin2 = run_program(p2, Backend::Eager, BuildCtx{true, Device::cpu()});
    nudged2 =
        run_program(p2, Backend::Eager, BuildCtx{true, Device::cpu(), p.seed * 31 + p.index + 2, device.is_cuda()});
  }
  set_backend(Backend::Auto);
  for (int c = 0; c < 2; ++c) {
    Verdict cv = c == 0 ? judge_escalating(p, ref, calls.first, floating ? &twin : nullptr,
                                           floating ? &nudged : nullptr, p.seed * 31 + p.index + 1, device.is_cuda())
                        : judge_escalating(p2, ref2, calls.second, floating ? &twin2 : nullptr,
                                           floating ? &nudged2 : nullptr, p.seed * 31 + p.index + 2, device.is_cuda());
    set_backend(Backend::Auto);
    v.excused += cv.excused;
    if (cv.kind == Kind::Pass) continue;
    std::string what = std::string("kiln::compile(mode ") + compile_mode_name(p.compile_mode) +
                       (p.compile_mode == 3 ? ", dynamic" : "") +
                       (c == 0 ? "), first call: " : "), replay on new values: ");
    if (cv.kind == Kind::Mismatch)
      cv.kind = Kind::CompileMismatch;
    else if (cv.kind == Kind::JitError)
      cv.kind = Kind::CompileError;
    // An error keeps its type first, as signatures read it.
    cv.detail = cv.kind == Kind::CompileError ? cv.detail.substr(0, cv.detail.find(": ")) + ": " + what +
                                                    cv.detail.substr(cv.detail.find(": ") + 2)
                                              : what + cv.detail;
    return cv;
  }
  return v;
}

// ---- printing as C++ --------------------------------------------------------------------------

/// `tpl` with its {tokens} replaced (see OpDesc::cxx).
inline std::string render(const std::string& tpl, const std::vector<std::string>& args, const Params& p) {
  std::string out;
  for (std::size_t i = 0; i < tpl.size(); ++i) {
    if (tpl[i] == '{') {
      std::size_t j = tpl.find('}', i);
      std::string tok = j == std::string::npos ? "" : tpl.substr(i + 1, j - i - 1);
      std::string rep;
      bool known = true;
      if (tok.size() == 1 && tok[0] >= '0' && tok[0] <= '9' && static_cast<std::size_t>(tok[0] - '0') < args.size())
        rep = args[static_cast<std::size_t>(tok[0] - '0')];
      else if (tok == "args") {
        rep = "{";
        for (std::size_t k = 0; k < args.size(); ++k) rep += (k ? ", " : "") + args[k];
        rep += "}";
      } else if (tok == "ints")
        rep = ints_literal(p.ints);
      else if (tok.size() == 2 && tok[0] == 'i' && tok[1] >= '0' && tok[1] <= '3' &&
               static_cast<std::size_t>(tok[1] - '0') < p.ints.size()) {
        std::int64_t x = p.ints[static_cast<std::size_t>(tok[1] - '0')];
        rep = x == std::numeric_limits<std::int64_t>::max() ? "INT64_MAX" : std::to_string(x);
      } else if (tok == "ints2") {
        rep = ints_literal(p.ints.size() > 2 ? std::vector<std::int64_t>(p.ints.begin() + 2, p.ints.end())
                                             : std::vector<std::int64_t>{});
      } else if (tok == "optdt")
        rep = p.flag ? std::string(", ") + dtype_cxx(p.dtype) : "";
      else if (tok == "keep")
        rep = p.flag ? "true" : "false";
      else if (tok == "dt")
        rep = dtype_cxx(p.dtype);
      else if (tok == "real")
        rep = real_literal(p.real, true);
      else if (tok == "seed")
        rep = std::to_string(p.seed);
      else
        known = false;
      if (known) {
        out += rep;
        i = j;
        continue;
      }
    }
    out += tpl[i];
  }
  return out;
}

inline std::string values_literal(const std::vector<double>& v, DType t) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += i % 8 == 0 ? ",\n      " : ", ";
    s += element_literal(v[i], t);
  }
  return s + "}";
}

/// Declares the buffer of `in` named `name` (before the lambda) and returns the expression
/// that makes the tensor from it (inside the lambda).
inline std::string input_cxx(const Input& in, const std::string& name, std::string& decls, bool assign_target = false) {
  Placement pl = placement(in);
  const char* ct = ctype_cxx(in.dtype);
  if (in.layout == Layout::Contiguous && !assign_target)
    return std::string("from_vector<") + ct + ">(" + values_literal(in.values, in.dtype) + ", " +
           ints_literal(in.shape) + ")";
  std::vector<double> buf = assign_target
                                ? std::vector<double>(static_cast<std::size_t>(pl.buffer_size), poison(in.dtype))
                                : buffer_values(in);
  if (buf.empty()) buf.push_back(poison(in.dtype));  // an empty vector's data() may be null, which from_blob rejects
  if (in.dtype == bool_) {
    std::string n = std::to_string(std::max<std::size_t>(buf.size(), 1));
    if (assign_target)
      decls += "  std::unique_ptr<bool[]> " + name + "(new bool[" + n + "]);\n  std::fill_n(" + name + ".get(), " + n +
               ", true);\n";
    else
      decls += "  std::unique_ptr<bool[]> " + name + "(new bool[" + n + "]" + values_literal(buf, in.dtype) + ");\n";
    return "from_blob(" + name + ".get() + " + std::to_string(pl.offset) + ", " + ints_literal(in.shape) +
           ", Device::cpu(), " + ints_literal(pl.strides) + ")";
  }
  if (assign_target)
    decls += "  std::vector<" + std::string(ct) + "> " + name + "(" + std::to_string(buf.size()) + ", " +
             element_literal(poison(in.dtype), in.dtype) + ");\n";
  else
    decls += "  std::vector<" + std::string(ct) + "> " + name + " = " + values_literal(buf, in.dtype) + ";\n";
  std::string what = in.layout == Layout::Permuted  ? "permuted"
                     : in.layout == Layout::Strided ? "strided"
                                                    : "contiguous";
  return "from_blob(" + name + ".data() + " + std::to_string(pl.offset) + ", " + ints_literal(in.shape) +
         ", Device::cpu(), " + ints_literal(pl.strides) + ")  /* " + what + " */";
}

/// The op call of step v as C++.
inline std::string op_cxx(const Program& p, int v) {
  const Step& s = p.steps[static_cast<std::size_t>(v)];
  std::vector<std::string> args;
  for (auto& a : s.op.args) args.push_back(a.is_number() ? number_literal(a.number) : "v" + std::to_string(a.value));
  return render(op_table()[static_cast<std::size_t>(s.op.desc)].cxx, args, s.op.p);
}

/// The program as the body of a lambda returning its outputs, with buffers declared before it:
///   <decls>  auto program = [&] { Tensor v0 = ...; ...; return std::vector<Tensor>{...}; };
inline std::string program_cxx(const Program& p) {
  std::string decls, body, params, leaves;
  bool kinf = false, kinfd = false;
  int argn = 0;
  for (int v = 0; v < p.size(); ++v) {
    const Step& s = p.steps[static_cast<std::size_t>(v)];
    std::string rhs;
    if (s.is_input && p.compile_mode && s.input.arg) {
      // An argument of the compiled function: both calls' tensors are made before the lambda.
      std::string a = "a" + std::to_string(argn++);
      params += std::string(params.empty() ? "" : ", ") + "const Tensor& " + a;
      Input second = s.input;
      second.values = s.input.values2;
      std::string e1 = input_cxx(s.input, "b" + std::to_string(v) + "_1", decls);
      std::string e2 = input_cxx(second, "b" + std::to_string(v) + "_2", decls);
      decls += "  Tensor " + a + "_1 = " + e1 + ";\n  Tensor " + a + "_2 = " + e2 + ";\n";
      rhs = a;
    } else {
      rhs = s.is_input ? input_cxx(s.input, "b" + std::to_string(v), decls) : op_cxx(p, v);
    }
    if (s.is_input && p.grad && is_floating(s.input.dtype)) {
      rhs = "(" + rhs + ").detach().requires_grad_()";
      leaves += std::string(leaves.empty() ? "" : ", ") + "v" + std::to_string(v);
    }
    body += "    Tensor v" + std::to_string(v) + " = " + rhs + ";";
    if (!s.is_input && s.op.eval_after) body += " v" + std::to_string(v) + ".eval();";
    body += "  // " + info_str(s.info.dtype, s.info.shape) + "\n";
  }
  std::string outs;
  for (std::size_t k = 0; k < p.outputs.size(); ++k) {
    std::string name = "v" + std::to_string(p.outputs[k]);
    if (static_cast<int>(k) == p.assign_output) {
      std::string dst = input_cxx(p.assign_dst, "out", decls, true);
      body += "    Tensor dst = " + dst + ";\n    dst.assign(" + name + ");\n";
      name = "dst";
    }
    outs += (k ? ", " : "") + name;
  }
  if (p.grad)
    body += "    return kiln::fuzz::with_gradients({" + outs + "}, {" + leaves + "});\n";
  else
    body += "    return std::vector<Tensor>{" + outs + "};\n";
  std::string all = decls + body;
  kinf = all.find("kInf") != std::string::npos || all.find("kNaN") != std::string::npos;
  kinfd = all.find("kInfD") != std::string::npos || all.find("kNaND") != std::string::npos;
  std::string consts;
  if (kinf)
    consts +=
        "  [[maybe_unused]] const float kInf = std::numeric_limits<float>::infinity(), kNaN = "
        "std::numeric_limits<float>::quiet_NaN();\n";
  if (kinfd)
    consts +=
        "  [[maybe_unused]] const double kInfD = std::numeric_limits<double>::infinity(), kNaND = "
        "std::numeric_limits<double>::quiet_NaN();\n";
  std::string lam = "  auto program = [&](" + params + ") {\n" + body + "  };\n";
  std::string res = consts + decls + lam;
  return res;
}

/// A doctest case that fails while the JIT disagrees with the reference on `p`.
inline std::string test_case_cxx(const Program& p, const std::string& title, const std::string& comment) {
  std::string s;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) s += "// " + line + "\n";
  s += "TEST_CASE(\"" + title + "\") {\n" + program_cxx(p);
  if (!p.compile_mode) return s + "  kiln::fuzz::check_against_reference(program);\n}\n";
  int n = 0;
  std::string a1, a2;
  for (auto& st : p.steps)
    if (st.is_input && st.input.arg) {
      a1 += std::string(n ? ", " : "") + "a" + std::to_string(n) + "_1";
      a2 += std::string(n ? ", " : "") + "a" + std::to_string(n) + "_2";
      ++n;
    }
  return s + "  kiln::fuzz::check_compiled<" + std::to_string(n) + ">(program, \"" + compile_mode_name(p.compile_mode) +
         "\", " + (p.compile_mode == 3 ? "true" : "false") + ", {" + a1 + "}, {" + a2 + "});\n}\n";
}

}  // namespace kiln::fuzz
