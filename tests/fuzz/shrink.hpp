#pragma once
// The shrinker: reduces a failing program to a small one that fails the same way (same
// Verdict::signature). Greedy passes, repeated until a round changes nothing or the budget is
// spent: fewer outputs, ops bypassed (a use of an op replaced by one of its operands), inputs
// contiguous, sizes smaller, dtypes plainer, values simpler, numbers and parameters plainer.
// Each candidate is first re-predicted by the op table (revalidate), so invalid ones cost
// nothing; only valid candidates are run (each is a JIT compile, ~0.5 s).
#include <chrono>
#include <functional>
#include <set>

#include "run.hpp"

namespace kiln::fuzz {

struct ShrinkBudget {
  double seconds = 120;
  int max_runs = 400;
};

struct ShrinkStats {
  int runs = 0, accepted = 0;
  int ops_before = 0, ops_after = 0;
};

inline int count_ops(const Program& p) {
  int n = 0;
  for (auto& s : p.steps) n += s.is_input ? 0 : 1;
  return n;
}

/// The element of `in` at the multi-index of `to`'s flat index i, for a smaller shape.
inline Input resized(const Input& in, const Shape& to) {
  Input out = in;
  out.shape = to;
  out.values.assign(static_cast<std::size_t>(to.numel()), 0.0);
  if (in.arg) out.values2.assign(out.values.size(), 0.0);
  Strides from = contiguous_strides(in.shape);
  std::vector<std::int64_t> idx(to.size(), 0);
  for (std::int64_t i = 0; i < to.numel(); ++i) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < to.size(); ++d) off += idx[d] * from[d];
    out.values[static_cast<std::size_t>(i)] = in.values[static_cast<std::size_t>(off)];
    if (in.arg) out.values2[static_cast<std::size_t>(i)] = in.values2[static_cast<std::size_t>(off)];
    for (std::size_t d = to.size(); d-- > 0;) {
      if (++idx[d] < to[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

class Shrinker {
 public:
  using Fails = std::function<bool(const Program&)>;
  Shrinker(Fails fails, ShrinkBudget budget) : fails_(std::move(fails)), budget_(budget) {}

  Program run(Program p, ShrinkStats* stats = nullptr) {
    start_ = std::chrono::steady_clock::now();
    stats_.ops_before = count_ops(p);
    best_ = std::move(p);
    for (bool progress = true; progress && !out_of_budget();) {
      progress = false;
      progress |= pass_outputs();
      progress |= pass_bypass();
      progress |= pass_flags();
      progress |= pass_layouts();
      progress |= pass_sizes();
      progress |= pass_dtypes();
      progress |= pass_values();
      progress |= pass_numbers();
      progress |= pass_params();
      progress |= pass_compile();
    }
    stats_.ops_after = count_ops(best_);
    if (stats) *stats = stats_;
    return best_;
  }

 private:
  bool out_of_budget() const {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return s > budget_.seconds || stats_.runs >= budget_.max_runs;
  }

  /// Accepts `c` if it is valid, new, and still fails.
  bool attempt(Program c) {
    if (out_of_budget()) return false;
    compact(c);
    if (!revalidate(c)) return false;
    std::string key = program_cxx(c);
    if (!seen_.insert(key).second) return false;
    ++stats_.runs;
    if (!fails_(c)) return false;
    ++stats_.accepted;
    best_ = std::move(c);
    return true;
  }

  bool pass_outputs() {
    bool any = false;
    if (best_.outputs.size() > 1) {
      for (std::size_t k = 0; k < best_.outputs.size() && best_.outputs.size() > 1; ++k) {
        Program c = best_;
        c.outputs = {best_.outputs[k]};
        c.assign_output = best_.assign_output == static_cast<int>(k) ? 0 : -1;
        if (attempt(c)) {
          any = true;
          break;
        }
      }
    }
    if (best_.assign_output >= 0) {
      Program c = best_;
      c.assign_output = -1;
      any |= attempt(c);
    }
    if (best_.assign_output >= 0 && best_.assign_dst.layout != Layout::Contiguous) {
      Program c = best_;
      c.assign_dst.layout = Layout::Contiguous;
      any |= attempt(c);
    }
    return any;
  }

  /// Replaces every use of op v by one of its tensor operands (later values and outputs).
  bool pass_bypass() {
    bool any = false;
    for (int v = best_.size(); v-- > 0;) {
      if (v >= best_.size() || best_.steps[static_cast<std::size_t>(v)].is_input) continue;
      std::vector<int> operands;
      for (auto& a : best_.steps[static_cast<std::size_t>(v)].op.args)
        if (!a.is_number()) operands.push_back(a.value);
      for (int a : operands) {
        Program c = best_;
        for (int w = v + 1; w < c.size(); ++w)
          if (!c.steps[static_cast<std::size_t>(w)].is_input)
            for (auto& o : c.steps[static_cast<std::size_t>(w)].op.args)
              if (!o.is_number() && o.value == v) o.value = a;
        for (auto& o : c.outputs)
          if (o == v) o = a;
        std::vector<int> uniq;
        for (int o : c.outputs)
          if (std::find(uniq.begin(), uniq.end(), o) == uniq.end()) uniq.push_back(o);
        if (uniq.size() != c.outputs.size()) {
          c.outputs = uniq;
          c.assign_output = -1;
        }
        if (attempt(c)) {
          any = true;
          break;
        }
      }
    }
    return any;
  }

  bool pass_flags() {
    bool any = false;
    for (int v = 0; v < best_.size(); ++v) {
      if (best_.steps[static_cast<std::size_t>(v)].is_input || !best_.steps[static_cast<std::size_t>(v)].op.eval_after)
        continue;
      Program c = best_;
      c.steps[static_cast<std::size_t>(v)].op.eval_after = false;
      any |= attempt(c);
    }
    return any;
  }

  bool pass_layouts() {
    bool any = false;
    for (int v = 0; v < best_.size(); ++v) {
      const Step& s = best_.steps[static_cast<std::size_t>(v)];
      if (!s.is_input || s.input.layout == Layout::Contiguous) continue;
      Program c = best_;
      c.steps[static_cast<std::size_t>(v)].input.layout = Layout::Contiguous;
      any |= attempt(c);
    }
    return any;
  }

  /// Smaller sizes: one dim of one input, or one size value everywhere (input shapes and the
  /// int parameters that hold it), so broadcast partners shrink together.
  bool pass_sizes() {
    bool any = false;
    std::set<std::int64_t> sizes;
    for (auto& s : best_.steps) {
      if (s.is_input)
        for (auto d : s.input.shape) sizes.insert(d);
      else if (op_table()[static_cast<std::size_t>(s.op.desc)].group == "creation")
        for (auto d : s.op.p.ints) sizes.insert(d);
    }
    for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
      std::int64_t x = *it;
      if (x <= 1) continue;
      for (std::int64_t y : {std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, x / 2, x - 1}) {
        if (y >= x || y < 1) continue;
        for (int with_params = 0; with_params < 2; ++with_params) {
          Program c = best_;
          for (auto& s : c.steps) {
            if (s.is_input) {
              Shape to = s.input.shape;
              for (auto& d : to)
                if (d == x) d = y;
              if (to != s.input.shape) s.input = resized(s.input, to);
            } else if (with_params || op_table()[static_cast<std::size_t>(s.op.desc)].group == "creation") {
              for (auto& d : s.op.p.ints)
                if (d == x) d = y;
            }
          }
          if (attempt(c)) {
            any = true;
            goto next_size;
          }
        }
      }
    next_size:;
    }
    for (int v = 0; v < best_.size(); ++v) {
      if (!best_.steps[static_cast<std::size_t>(v)].is_input) continue;
      for (std::size_t d = 0; d < best_.steps[static_cast<std::size_t>(v)].input.shape.size(); ++d) {
        std::int64_t x = best_.steps[static_cast<std::size_t>(v)].input.shape[d];
        for (std::int64_t y : {std::int64_t{1}, x / 2}) {
          if (y >= x || y < 1) continue;
          Program c = best_;
          Shape to = c.steps[static_cast<std::size_t>(v)].input.shape;
          to[d] = y;
          c.steps[static_cast<std::size_t>(v)].input = resized(c.steps[static_cast<std::size_t>(v)].input, to);
          if (attempt(c)) {
            any = true;
            break;
          }
        }
      }
    }
    return any;
  }

  bool pass_dtypes() {
    bool any = false;
    for (int v = 0; v < best_.size(); ++v) {
      Step& s = best_.steps[static_cast<std::size_t>(v)];
      DType cur = s.is_input ? s.input.dtype : s.op.p.dtype;
      bool creation = !s.is_input && op_table()[static_cast<std::size_t>(s.op.desc)].group == "creation";
      if (!s.is_input && !creation) continue;
      DType plain = is_floating(cur) ? f32 : cur == i32 ? i64 : cur;
      if (plain == cur) continue;
      Program c = best_;
      Step& cs = c.steps[static_cast<std::size_t>(v)];
      if (cs.is_input) {
        cs.input.dtype = plain;
        for (auto& x : cs.input.values) x = round_to(x, plain);
        for (auto& x : cs.input.values2) x = round_to(x, plain);
      } else {
        cs.op.p.dtype = plain;
      }
      any |= attempt(c);
    }
    return any;
  }

  /// Simpler input values: all equal to a plain value, then halves, then single elements.
  bool pass_values() {
    bool any = false;
    for (int v = 0; v < best_.size(); ++v) {
      if (!best_.steps[static_cast<std::size_t>(v)].is_input) continue;
      const std::vector<double> orig = best_.steps[static_cast<std::size_t>(v)].input.values;
      std::size_t n = orig.size();
      if (n == 0) continue;
      DType t = best_.steps[static_cast<std::size_t>(v)].input.dtype;
      auto simple = [&](double x) { return x == 0 || x == 1 || x == -1; };
      bool all_simple = true;
      for (double x : orig) all_simple = all_simple && simple(x);
      if (all_simple) continue;
      auto with = [&](std::size_t lo, std::size_t hi, double val) {
        Program c = best_;
        auto& vals = c.steps[static_cast<std::size_t>(v)].input.values;
        for (std::size_t i = lo; i < hi; ++i) vals[i] = round_to(val, t);
        return c;
      };
      bool done = false;
      for (double val : {1.0, 0.0, orig[0]}) {
        if (attempt(with(0, n, val))) {
          any = done = true;
          break;
        }
      }
      if (done) continue;
      // Chunks of n/2, n/4, ... set to 1 (a neutral, exact value), while they stay failing.
      for (std::size_t chunk = n / 2; chunk >= 1 && !out_of_budget(); chunk /= 2) {
        for (std::size_t lo = 0; lo < n; lo += chunk) {
          std::size_t hi = std::min(n, lo + chunk);
          bool already = true;
          for (std::size_t i = lo; i < hi; ++i)
            already = already && simple(best_.steps[static_cast<std::size_t>(v)].input.values[i]);
          if (already) continue;
          any |= attempt(with(lo, hi, 1.0)) || attempt(with(lo, hi, 0.0));
        }
        if (chunk == 1 || n > 256) break;
      }
    }
    return any;
  }

  bool pass_numbers() {
    bool any = false;
    for (int v = 0; v < best_.size(); ++v) {
      if (best_.steps[static_cast<std::size_t>(v)].is_input) continue;
      for (std::size_t k = 0; k < best_.steps[static_cast<std::size_t>(v)].op.args.size(); ++k) {
        const Operand& o = best_.steps[static_cast<std::size_t>(v)].op.args[k];
        if (!o.is_number() || o.number.value == 1 || o.number.value == 0) continue;
        for (double val : {1.0, 0.0, 2.0}) {
          Program c = best_;
          c.steps[static_cast<std::size_t>(v)].op.args[k].number.value = val;
          if (attempt(c)) {
            any = true;
            break;
          }
        }
      }
    }
    return any;
  }

  bool pass_params() {
    bool any = false;
    for (int v = 0; v < best_.size(); ++v) {
      if (best_.steps[static_cast<std::size_t>(v)].is_input) continue;
      const OpInst& op = best_.steps[static_cast<std::size_t>(v)].op;
      const std::string& g = op_table()[static_cast<std::size_t>(op.desc)].group;
      if (op.p.flag) {
        Program c = best_;
        c.steps[static_cast<std::size_t>(v)].op.p.flag = false;
        any |= attempt(c);
      }
      if (g == "reduce" && !op.p.ints.empty()) {
        Program c = best_;
        c.steps[static_cast<std::size_t>(v)].op.p.ints.clear();
        any |= attempt(c);
      }
    }
    return any;
  }

  /// kiln::compile programs: the plain mode, fewer arguments, the replay on the same values.
  bool pass_compile() {
    if (!best_.compile_mode) return false;
    bool any = false;
    if (best_.compile_mode != 1) {
      Program c = best_;
      c.compile_mode = 1;
      any |= attempt(c);
    }
    for (int v = 0; v < best_.size(); ++v) {
      const Step& s = best_.steps[static_cast<std::size_t>(v)];
      if (!s.is_input || !s.input.arg) continue;
      Program c = best_;
      c.steps[static_cast<std::size_t>(v)].input.arg = false;
      c.steps[static_cast<std::size_t>(v)].input.values2.clear();
      if (attempt(c)) {
        any = true;
        continue;
      }
      if (s.input.values2 != s.input.values) {
        c = best_;
        c.steps[static_cast<std::size_t>(v)].input.values2 = s.input.values;
        any |= attempt(c);
      }
    }
    return any;
  }

  Fails fails_;
  ShrinkBudget budget_;
  ShrinkStats stats_;
  Program best_;
  std::set<std::string> seen_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kiln::fuzz
