// Reductions: sum mean max min prod argmax argmin var logsumexp over all axes, one axis,
// several axes, negative axes, keepdim, every dtype they support, size-0/size-1/0-dim
// inputs, NaN, strided and lazy inputs, and the accuracy of float sums over millions of
// elements.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_reductions {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using ReduceFn = std::function<Tensor(const Tensor&, const Axes&, bool)>;
using GroupFn = std::function<double(const std::vector<double>&)>;

struct Reduction {
  const char* name;
  ReduceFn f;
  GroupFn ref;
  bool arg;         // argmax/argmin: one axis or none, int64 result
  bool float_only;  // mean, var: DTypeError on integer/bool inputs
};

std::vector<Reduction> reductions() {
  return {
      {"sum", [](const Tensor& x, const Axes& a, bool k) { return sum(x, a, k); }, kt::ref_sum, false, false},
      {"mean", [](const Tensor& x, const Axes& a, bool k) { return mean(x, a, k); }, kt::ref_mean, false, true},
      {"max", [](const Tensor& x, const Axes& a, bool k) { return max(x, a, k); }, kt::ref_max, false, false},
      {"min", [](const Tensor& x, const Axes& a, bool k) { return min(x, a, k); }, kt::ref_min, false, false},
      {"prod", [](const Tensor& x, const Axes& a, bool k) { return prod(x, a, k); }, kt::ref_prod, false, false},
      {"argmax", [](const Tensor& x, const Axes& a, bool k) { return argmax(x, a, k); },
       [](const std::vector<double>& g) { return kt::ref_argext(g, true); }, true, false},
      {"argmin", [](const Tensor& x, const Axes& a, bool k) { return argmin(x, a, k); },
       [](const std::vector<double>& g) { return kt::ref_argext(g, false); }, true, false},
      {"var", [](const Tensor& x, const Axes& a, bool k) { return var(x, a, k); },
       [](const std::vector<double>& g) { return kt::ref_var(g, 1.0); }, false, true},
      {"logsumexp", [](const Tensor& x, const Axes& a, bool k) { return logsumexp(x, a, k); }, kt::ref_logsumexp, false,
       false},
  };
}

/// PyTorch's result dtype of reduction `name` on `in`.
DType result_dtype(const std::string& name, DType in) {
  if (name == "argmax" || name == "argmin") return DType::Int64;
  if (name == "sum" || name == "prod") return is_floating(in) ? in : DType::Int64;
  if (name == "logsumexp") return is_floating(in) ? in : DType::Float32;
  return in;
}

std::vector<double> inputs_for(const std::string& name, DType dt, std::size_t n, std::uint64_t seed) {
  if (name == "prod") {  // keep products representable (exactly, for integers)
    if (is_floating(dt)) return kt::uniform_values(n, 0.6, 1.5, dt, seed);
    if (dt == DType::Bool) return kt::integer_values(n, 0, 1, seed);
    return kt::integer_values(n, -2, 2, seed);
  }
  return kt::values_for(dt, n, -3, 3, seed);
}

const std::vector<std::vector<std::int64_t>> kAxesCases = {{},   {0},    {1},      {2},       {-1},
                                                           {-2}, {0, 2}, {-1, -3}, {2, 0, 1}, {1, -1}};

}  // namespace

TEST_CASE("every reduction x every dtype x axes x keepdim") {
  for (const auto& r : reductions()) {
    for (DType dt : kt::kAllDTypes) {
      auto in = inputs_for(r.name, dt, 24, 100 + static_cast<int>(dt));
      Tensor x = kt::make_tensor(in, {2, 3, 4}, dt);
      if ((r.float_only && !is_floating(dt)) || (r.arg && dt == DType::Bool)) {
        CAPTURE(r.name);
        CAPTURE(dt);
        CHECK_THROWS_AS(r.f(x, Axes{}, false), DTypeError);
        continue;
      }
      for (const auto& axes : kAxesCases) {
        if (r.arg && axes.size() > 1) continue;
        for (bool keepdim : {false, true}) {
          CAPTURE(r.name);
          CAPTURE(dt);
          CAPTURE(keepdim);
          std::string axes_str = Shape(axes).str();
          CAPTURE(axes_str);
          Tensor y = r.f(x, Axes(axes), keepdim);
          CHECK(y.dtype() == result_dtype(r.name, dt));
          kt::Ref expected = kt::reduce({in, {2, 3, 4}}, axes, keepdim, r.ref);
          KILN_CHECK_CLOSE(y, expected);
        }
      }
    }
  }
}

TEST_CASE("integer sums accumulate in int64 (no int32 overflow)") {
  const std::int64_t big = 2147483647;  // INT32_MAX
  Tensor x = kt::make_int_tensor({big, big, big, -5}, {2, 2}, DType::Int32);
  Tensor s = sum(x);
  CHECK(s.dtype() == DType::Int64);
  KILN_CHECK_EXACT(s, {3 * big - 5});
  KILN_CHECK_EXACT(sum(x, 0), {2 * big, big - 5});
  KILN_CHECK_EXACT(prod(kt::make_int_tensor({65536, 65536, 3}, {3}, DType::Int32)), {std::int64_t(3) << 32});
  Tensor b = kt::make_tensor({1, 0, 1, 1, 1, 0}, {2, 3}, DType::Bool);
  CHECK(sum(b).dtype() == DType::Int64);
  KILN_CHECK_EXACT(sum(b), {4});
  KILN_CHECK_EXACT(sum(b, 1), {2, 2});
  // int64 sums stay exact beyond 2^53.
  const std::int64_t huge = (std::int64_t(1) << 60) + 1;
  KILN_CHECK_EXACT(sum(kt::make_int_tensor({huge, 1, -3}, {3})), {huge - 2});
  KILN_CHECK_EXACT(max(kt::make_int_tensor({huge, huge - 1}, {2})), {huge});
  KILN_CHECK_EXACT(argmax(kt::make_int_tensor({huge - 1, huge}, {2})), {1});
}

TEST_CASE("keepdim shapes and negative axes") {
  Tensor x = kt::make_tensor(kt::uniform_values(120, -1, 1, DType::Float32), {2, 3, 4, 5}, DType::Float32);
  CHECK(sum(x).shape() == Shape{});
  CHECK(sum(x, Axes{}, true).shape() == Shape{1, 1, 1, 1});
  CHECK(sum(x, 1).shape() == Shape{2, 4, 5});
  CHECK(sum(x, -1, true).shape() == Shape{2, 3, 4, 1});
  CHECK(sum(x, {0, -1}).shape() == Shape{3, 4});
  CHECK(sum(x, {-4, 3}, true).shape() == Shape{1, 3, 4, 1});
  CHECK(argmax(x, -2).shape() == Shape{2, 3, 5});
  CHECK(argmax(x, Axes{}, true).shape() == Shape{1, 1, 1, 1});
  CHECK(argmin(x).shape() == Shape{});
  KILN_CHECK_CLOSE(sum(x, -3), kt::reduce(kt::ref_of(x), {1}, false, kt::ref_sum));
  KILN_CHECK_CLOSE(max(x, {-1, -2}), kt::reduce(kt::ref_of(x), {2, 3}, false, kt::ref_max));
}

TEST_CASE("size-0, size-1 and 0-dim inputs") {
  SUBCASE("empty reductions") {
    Tensor e = kt::make_tensor({}, {0, 3}, DType::Float32);
    Tensor s = sum(e);
    CHECK(s.shape() == Shape{});
    KILN_CHECK_CLOSE(s, std::vector<double>{0});
    KILN_CHECK_CLOSE(sum(e, 0), kt::Ref{{0, 0, 0}, {3}});
    CHECK(sum(e, 1).shape() == Shape{0});
    CHECK(sum(e, 1).numel() == 0);
    KILN_CHECK_CLOSE(prod(e), std::vector<double>{1});
    KILN_CHECK_CLOSE(prod(e, 0, true), kt::Ref{{1, 1, 1}, {1, 3}});
    KILN_CHECK_CLOSE(mean(e), std::vector<double>{NAN});
    KILN_CHECK_CLOSE(logsumexp(e), std::vector<double>{-INFINITY});
    KILN_CHECK_CLOSE(logsumexp(e, 0), kt::Ref{{-INFINITY, -INFINITY, -INFINITY}, {3}});
    KILN_CHECK_CLOSE(var(e, 0), kt::Ref{{NAN, NAN, NAN}, {3}});
    KILN_CHECK_EXACT(sum(kt::make_tensor({}, {0}, DType::Int32)), {0});
    CHECK(sum(kt::make_tensor({}, {0}, DType::Int32)).dtype() == DType::Int64);
    // max/min/argmax of nothing have no value: ShapeError (PyTorch raises too).
    CHECK_THROWS_AS(max(e), ShapeError);
    CHECK_THROWS_AS(min(e), ShapeError);
    CHECK_THROWS_AS(max(e, 0), ShapeError);
    CHECK_THROWS_AS(argmax(e), ShapeError);
    CHECK_THROWS_AS(argmin(e, 0), ShapeError);
    // Reducing a non-empty axis of an empty tensor is fine: an empty result.
    Tensor m = max(e, 1);
    CHECK(m.shape() == Shape{0});
    CHECK(m.to_vector<float>().empty());
    CHECK(argmax(e, 1).shape() == Shape{0});
  }
  SUBCASE("size-1 dims") {
    auto in = kt::uniform_values(6, -2, 2, DType::Float32, 9);
    Tensor x = kt::make_tensor(in, {3, 1, 2}, DType::Float32);
    for (const auto& r : reductions()) {
      CAPTURE(r.name);
      if (std::string(r.name) == "var") {  // one element: correction 1 divides by zero -> NaN
        KILN_CHECK_CLOSE(r.f(x, 1, false), kt::Ref{std::vector<double>(6, NAN), {3, 2}});
        continue;
      }
      KILN_CHECK_CLOSE(r.f(x, 1, false), kt::reduce({in, {3, 1, 2}}, {1}, false, r.ref));
      KILN_CHECK_CLOSE(r.f(x, 1, true), kt::reduce({in, {3, 1, 2}}, {1}, true, r.ref));
      if (!r.arg) KILN_CHECK_CLOSE(r.f(x, {0, 1}, false), kt::reduce({in, {3, 1, 2}}, {0, 1}, false, r.ref));
    }
    Tensor one = kt::make_tensor({4.5}, {1, 1}, DType::Float32);
    KILN_CHECK_CLOSE(sum(one), kt::Ref{{4.5}, {}});
    KILN_CHECK_EXACT(argmax(one), {0});
  }
  SUBCASE("0-dim inputs") {
    Tensor z = kt::make_tensor({2.5}, {}, DType::Float32);
    KILN_CHECK_CLOSE(sum(z), kt::Ref{{2.5}, {}});
    KILN_CHECK_CLOSE(sum(z, 0), kt::Ref{{2.5}, {}});
    KILN_CHECK_CLOSE(sum(z, -1, true), kt::Ref{{2.5}, {}});
    KILN_CHECK_CLOSE(max(z), kt::Ref{{2.5}, {}});
    KILN_CHECK_CLOSE(mean(z), kt::Ref{{2.5}, {}});
    KILN_CHECK_CLOSE(logsumexp(z), kt::Ref{{2.5}, {}});
    KILN_CHECK_EXACT(argmax(z), {0});
    KILN_CHECK_EXACT(argmin(z, 0), {0});
    CHECK_THROWS_AS(sum(z, 1), ShapeError);
  }
}

TEST_CASE("NaN propagation and ties") {
  const double nan = NAN;
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    Tensor x = kt::make_tensor({1, nan, 3, nan, 5, 2, 7, 0}, {2, 4}, dt);
    KILN_CHECK_CLOSE(max(x), std::vector<double>{nan});
    KILN_CHECK_CLOSE(min(x), std::vector<double>{nan});
    KILN_CHECK_CLOSE(sum(x), std::vector<double>{nan});
    KILN_CHECK_CLOSE(max(x, 1), std::vector<double>{nan, 7});
    KILN_CHECK_CLOSE(min(x, 1), std::vector<double>{nan, 0});
    KILN_CHECK_CLOSE(max(x, 0), std::vector<double>{5, nan, 7, nan});
    KILN_CHECK_CLOSE(logsumexp(x, 1), std::vector<double>{nan, kt::ref_logsumexp({5, 2, 7, 0})});
    // argmax/argmin treat NaN as the extreme value: the first NaN is picked.
    KILN_CHECK_EXACT(argmax(x), {1});
    KILN_CHECK_EXACT(argmin(x), {1});
    KILN_CHECK_EXACT(argmax(x, 1), {1, 2});
    KILN_CHECK_EXACT(argmin(x, 1), {1, 3});
    KILN_CHECK_EXACT(argmax(x, 0), {1, 0, 1, 0});
  }
  // Ties: the first index.
  Tensor t = kt::make_tensor({3, 1, 3, 1, 2, 3}, {6}, DType::Float32);
  KILN_CHECK_EXACT(argmax(t), {0});
  KILN_CHECK_EXACT(argmin(t), {1});
  Tensor ti = kt::make_tensor({-1, 4, 4, -1}, {2, 2}, DType::Int32);
  KILN_CHECK_EXACT(argmax(ti, 0), {1, 0});
  KILN_CHECK_EXACT(argmin(ti, 1), {0, 1});
  // Infinities are ordinary values for max/min.
  Tensor inf = kt::make_tensor({-INFINITY, 1, INFINITY, 0}, {4}, DType::Float32);
  KILN_CHECK_CLOSE(max(inf), std::vector<double>{INFINITY});
  KILN_CHECK_CLOSE(min(inf), std::vector<double>{-INFINITY});
  KILN_CHECK_EXACT(argmax(inf), {2});
  KILN_CHECK_EXACT(argmin(inf), {0});
}

TEST_CASE("reductions of strided views and of lazy expressions") {
  auto in = kt::uniform_values(60, -2, 2, DType::Float32, 17);
  Tensor base = kt::make_tensor(in, {3, 4, 5}, DType::Float32);
  base.eval();
  kt::Ref rb = kt::ref_of(base);
  // A permuted view: [5, 3, 4] with strides (1, 20, 5).
  Tensor p = permute(base, {2, 0, 1});
  REQUIRE_FALSE(p.is_contiguous());
  kt::Ref rp;
  rp.shape = {5, 3, 4};
  for (std::int64_t k = 0; k < 5; ++k)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 4; ++j) rp.v.push_back(in[i * 20 + j * 5 + k]);
  for (const auto& r : reductions()) {
    CAPTURE(r.name);
    for (const auto& axes : kAxesCases) {
      if (r.arg && axes.size() > 1) continue;
      std::string axes_str = Shape(axes).str();
      CAPTURE(axes_str);
      KILN_CHECK_CLOSE(r.f(p, Axes(axes), false), kt::reduce(rp, axes, false, r.ref));
    }
  }
  // A stepped slice: every other column.
  Tensor s = slice(base, 2, 0, 5, 2);  // [3, 4, 3]
  kt::Ref rs;
  rs.shape = {3, 4, 3};
  for (std::int64_t i = 0; i < 12; ++i)
    for (std::int64_t j = 0; j < 5; j += 2) rs.v.push_back(in[i * 5 + j]);
  KILN_CHECK_CLOSE(sum(s, -1), kt::reduce(rs, {-1}, false, kt::ref_sum));
  KILN_CHECK_CLOSE(max(s, {0, 2}), kt::reduce(rs, {0, 2}, false, kt::ref_max));
  KILN_CHECK_EXACT(argmin(s, 1), [&] {
    auto r = kt::reduce(rs, {1}, false, [](const std::vector<double>& g) { return kt::ref_argext(g, false); });
    return std::vector<std::int64_t>(r.v.begin(), r.v.end());
  }());
  // Lazy input: a pointwise expression reduced without being evaluated first.
  Tensor lazy = base * 2.0f + 1.0f;
  CHECK_FALSE(lazy.is_evaluated());
  kt::Ref rl = kt::map(rb, [](double v) { return v * 2 + 1; });
  KILN_CHECK_CLOSE(sum(lazy, 1), kt::reduce(rl, {1}, false, kt::ref_sum));
  KILN_CHECK_CLOSE(var(lazy, {0, 2}, true), kt::reduce(rl, {0, 2}, true, [](auto& g) { return kt::ref_var(g); }));
  KILN_CHECK_CLOSE(logsumexp(base * 3.0f, -1),
                   kt::reduce(kt::map(rb, [](double v) { return v * 3; }), {-1}, false, kt::ref_logsumexp));
  // A reduction of a reduction, and of a broadcast.
  KILN_CHECK_CLOSE(max(sum(base, 2), 0), kt::reduce(kt::reduce(rb, {2}, false, kt::ref_sum), {0}, false, kt::ref_max));
  Tensor row = kt::make_tensor({1, 2, 3}, {3, 1}, DType::Float32);
  KILN_CHECK_CLOSE(sum(broadcast_to(row, {3, 4})), std::vector<double>{24});
}

TEST_CASE("var: correction argument") {
  auto in = kt::uniform_values(12, -2, 2, DType::Float64, 5);
  Tensor x = kt::make_tensor(in, {3, 4}, DType::Float64);
  KILN_CHECK_CLOSE(var(x, 1, false, 0.0),
                   kt::reduce({in, {3, 4}}, {1}, false, [](auto& g) { return kt::ref_var(g, 0.0); }));
  KILN_CHECK_CLOSE(var(x, 1, false, 1.0),
                   kt::reduce({in, {3, 4}}, {1}, false, [](auto& g) { return kt::ref_var(g, 1.0); }));
  KILN_CHECK_CLOSE(var(x), std::vector<double>{kt::ref_var(in, 1.0)});
}

TEST_CASE("logsumexp with infinities") {
  Tensor x =
      kt::make_tensor({-INFINITY, -INFINITY, INFINITY, 1, INFINITY, -INFINITY, 1000, 1000}, {4, 2}, DType::Float32);
  // Rows: all -inf -> -inf; +inf with a number -> +inf; +inf with -inf -> +inf; large finite stays finite.
  KILN_CHECK_CLOSE(logsumexp(x, 1), std::vector<double>{-INFINITY, INFINITY, INFINITY, 1000 + std::log(2.0)});
}

TEST_CASE("float sums over millions of elements stay accurate (pairwise/cascaded summation)") {
  const Device dev = kt::device();
  SUBCASE("sum of 16M float32 elements") {
    const std::int64_t n = std::int64_t(1) << 24;
    Tensor x = rand({n}, 123, f32, dev);
    x.eval();
    auto host = x.to_vector<float>();
    double exact = 0;
    for (float v : host) exact += v;
    double got = sum(x).item<float>();
    CAPTURE(exact);
    CAPTURE(got);
    CHECK(std::fabs(got - exact) / exact < 1e-6);
    double got_mean = mean(x).item<float>();
    CHECK(std::fabs(got_mean - exact / static_cast<double>(n)) / (exact / static_cast<double>(n)) < 1e-6);
    // R1-like: sum of squares, computed from a lazy expression.
    double exact_sq = 0;
    for (float v : host) exact_sq += static_cast<double>(v * v);  // x*x rounds to float before summing
    double got_sq = sum(x * x).item<float>();
    CHECK(std::fabs(got_sq - exact_sq) / exact_sq < 1e-6);
  }
  SUBCASE("row sums of 4M elements and column sums over 2M rows") {
    const std::int64_t k = std::int64_t(1) << 22;
    Tensor rows = rand({4, k}, 7, f32, dev) + 0.5f;
    rows.eval();
    auto host = rows.to_vector<float>();
    auto got = sum(rows, 1).to_vector<float>();
    for (std::int64_t i = 0; i < 4; ++i) {
      double exact = 0;
      for (std::int64_t j = 0; j < k; ++j) exact += host[i * k + j];
      CAPTURE(i);
      CHECK(std::fabs(got[i] - exact) / exact < 1e-6);
    }
    Tensor cols = reshape(rows, {k / 2, 8});
    auto gotc = sum(cols, 0).to_vector<float>();
    for (std::int64_t j = 0; j < 8; ++j) {
      double exact = 0;
      for (std::int64_t i = 0; i < k / 2; ++i) exact += host[i * 8 + j];
      CAPTURE(j);
      CHECK(std::fabs(gotc[j] - exact) / exact < 1e-6);
    }
  }
}

TEST_CASE("rows of a large output (streamed around the cache) hold the same values, aligned or not") {
  // softmax over [4096, 1024] f32 writes 16 MiB: on the CPU its rows are stored around the
  // cache 64 bytes at a time (plain stores where the output is not 32-byte aligned). The values
  // must be those of the same softmax evaluated in pieces (no fused row kernel).
  const Device cpu = Device::cpu();
  manual_seed(11);
  Tensor x = (randn({4096, 1024}, DType::Float32, cpu) * 3.0).eval();
  Tensor m = amax(x, {1}, true).eval();
  Tensor e = exp(x - m).eval();
  Tensor ref = (e / sum(e, {1}, true)).eval();
  const std::vector<float> want = ref.to_vector<float>();
  auto same = [&](const float* got) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      bad += std::fabs(got[i] - want[i]) > 2e-6f * std::max(1.0f, std::fabs(want[i])) + 1e-12f;
    return bad;
  };
  Tensor y = softmax(x, 1).eval();
  CHECK(same(y.to_vector<float>().data()) == 0);
  std::vector<float> buf(4096 * 1024 + 1, -1.0f);  // one float in: 4-byte aligned only
  from_blob(buf.data() + 1, {4096, 1024}, cpu).assign(softmax(x, 1));
  CHECK(same(buf.data() + 1) == 0);
  CHECK(buf[0] == -1.0f);
  // bf16 rows (16 MiB at [8192, 1024]): 32 elements a chunk.
  Tensor xb = randn({8192, 1024}, DType::Float32, cpu).to(DType::BFloat16).eval();
  Tensor yb = softmax(xb.to(DType::Float32), 1).to(DType::BFloat16).eval();
  Tensor xf = xb.to(DType::Float32).eval();
  Tensor mb = amax(xf, {1}, true).eval();
  Tensor eb = exp(xf - mb).eval();
  Tensor rb = (eb / sum(eb, {1}, true)).to(DType::BFloat16).eval();
  const std::vector<float> gb = yb.to(DType::Float32).to_vector<float>(), wb = rb.to(DType::Float32).to_vector<float>();
  std::size_t badb = 0;
  for (std::size_t i = 0; i < wb.size(); ++i) badb += std::fabs(gb[i] - wb[i]) > 1e-2f * std::fabs(wb[i]) + 1e-12f;
  CHECK(badb == 0);
}

}  // namespace kiln_test_tensor_reductions
