// Type promotion as PyTorch does it (torch.result_type: c10's promoteTypes within a tier and
// combine_categories across the tiers "dimensioned tensor" > "0-dim tensor" > "wrapped
// number"), checked on result dtypes and on the values computed in them.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_promotion {

using namespace kiln;
namespace kt = kiln::testing;

namespace {
Tensor vec(std::vector<double> v, DType dt) {
  auto n = static_cast<std::int64_t>(v.size());
  return kt::make_tensor(v, {n}, dt);
}
Tensor scalar0(double v, DType dt) { return kt::make_tensor({v}, {}, dt); }
}  // namespace

TEST_CASE("promote_types is torch.promote_types") {
  using D = DType;
  // The full table for kiln's dtypes (rows/cols: bool, i32, i64, f16, bf16, f32, f64), from
  // PyTorch's c10/core/ScalarType.cpp.
  const D table[7][7] = {
      /* bool */ {D::Bool, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      /* i32  */ {D::Int32, D::Int32, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      /* i64  */ {D::Int64, D::Int64, D::Int64, D::Float16, D::BFloat16, D::Float32, D::Float64},
      /* f16  */ {D::Float16, D::Float16, D::Float16, D::Float16, D::Float32, D::Float32, D::Float64},
      /* bf16 */ {D::BFloat16, D::BFloat16, D::BFloat16, D::Float32, D::BFloat16, D::Float32, D::Float64},
      /* f32  */ {D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float32, D::Float64},
      /* f64  */ {D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64, D::Float64},
  };
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 7; ++j) {
      CAPTURE(kt::kAllDTypes[i]);
      CAPTURE(kt::kAllDTypes[j]);
      CHECK(promote_types(kt::kAllDTypes[i], kt::kAllDTypes[j]) == table[i][j]);
    }
}

TEST_CASE("tensor-tensor promotion: every pair of dtypes, result dtype and values") {
  for (DType a : kt::kAllDTypes)
    for (DType b : kt::kAllDTypes) {
      CAPTURE(a);
      CAPTURE(b);
      DType common = promote_types(a, b);
      auto av = kt::values_for(a, 6, -3, 3, 5), bv = kt::values_for(b, 6, -3, 3, 6);
      Tensor x = kt::make_tensor(av, {2, 3}, a), y = kt::make_tensor(bv, {2, 3}, b);
      Tensor s = x + y;
      CHECK(s.dtype() == common);
      Tensor m = x * y;
      CHECK(m.dtype() == common);
      Tensor c = x < y;
      CHECK(c.dtype() == DType::Bool);
      std::vector<double> es, em;
      std::vector<std::int64_t> ec;
      for (int i = 0; i < 6; ++i) {
        double p = kt::round_to(av[i], common), q = kt::round_to(bv[i], common);
        es.push_back(common == DType::Bool ? double(p || q) : p + q);
        em.push_back(common == DType::Bool ? double(p && q) : p * q);
        ec.push_back(p < q);
      }
      KILN_CHECK_CLOSE(s, es);
      KILN_CHECK_CLOSE(m, em);
      KILN_CHECK_EXACT(c, ec);
      if (a == DType::Bool || b == DType::Bool) {  // any bool operand, as PyTorch
        CHECK_THROWS_AS(x - y, DTypeError);
      } else {
        Tensor d = x - y;
        CHECK(d.dtype() == common);
      }
      Tensor q = x / y;
      CHECK(q.dtype() == (is_floating(common) ? common : DType::Float32));
    }
}

TEST_CASE("wrapped numbers do not widen a tensor of the same or higher category") {
  struct Case {
    const char* what;
    Tensor result;
    DType dtype;
    std::vector<double> expected;
  };
  Tensor i32v = vec({1, 2, 3}, DType::Int32);
  Tensor i64v = vec({1, 2, 3}, DType::Int64);
  Tensor f16v = vec({1, 2, 3}, DType::Float16);
  Tensor bf16v = vec({1, 2, 3}, DType::BFloat16);
  Tensor f32v = vec({1, 2, 3}, DType::Float32);
  Tensor f64v = vec({1, 2, 3}, DType::Float64);
  Tensor boolv = vec({1, 0, 1}, DType::Bool);
  std::vector<Case> cases = {
      {"int32 + 2", i32v + 2, DType::Int32, {3, 4, 5}},
      {"int32 + int64 number", i32v + std::int64_t(2), DType::Int32, {3, 4, 5}},
      {"int32 + 2.5 -> default float", i32v + 2.5, DType::Float32, {3.5, 4.5, 5.5}},
      {"int64 * 0.5f", i64v * 0.5f, DType::Float32, {0.5, 1, 1.5}},
      {"f16 * 2.0 stays f16", f16v * 2.0, DType::Float16, {2, 4, 6}},
      {"bf16 + 1.0 stays bf16", bf16v + 1.0, DType::BFloat16, {2, 3, 4}},
      {"f16 + 1 (int) stays f16", f16v + 1, DType::Float16, {2, 3, 4}},
      {"f32 * 2.0 (double) stays f32", f32v * 2.0, DType::Float32, {2, 4, 6}},
      {"f64 + 1.5f stays f64", f64v + 1.5f, DType::Float64, {2.5, 3.5, 4.5}},
      {"bool + 1 -> int64", boolv + 1, DType::Int64, {2, 1, 2}},
      {"bool * 1.5 -> float32", boolv * 1.5, DType::Float32, {1.5, 0, 1.5}},
      {"bool + true stays bool", boolv + true, DType::Bool, {1, 1, 1}},
      {"int32 + true stays int32", i32v + true, DType::Int32, {2, 3, 4}},
      {"2 - int32", 2 - i32v, DType::Int32, {1, 0, -1}},
      {"1.5 - int32", 1.5 - i32v, DType::Float32, {0.5, -0.5, -1.5}},
      {"int32 / 2 -> float32", i32v / 2, DType::Float32, {0.5, 1, 1.5}},
      {"int64 / int64 -> float32", i64v / i64v, DType::Float32, {1, 1, 1}},
      {"int32 < 2.5 compares in float", i32v < 2.5, DType::Bool, {1, 1, 0}},
      {"f16 == 2 -> bool", f16v == 2, DType::Bool, {0, 1, 0}},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    CHECK(c.result.dtype() == c.dtype);
    KILN_CHECK_CLOSE(c.result, c.expected);
  }
}

TEST_CASE("0-dim tensors: only a higher category than the dimensioned operands counts") {
  struct Case {
    const char* what;
    Tensor result;
    DType dtype;
    std::vector<double> expected;
  };
  Tensor i32v = vec({1, 2, 3}, DType::Int32);
  Tensor f16v = vec({1, 2, 3}, DType::Float16);
  Tensor f32v = vec({1, 2, 3}, DType::Float32);
  Tensor boolv = vec({1, 0, 1}, DType::Bool);
  std::vector<Case> cases = {
      // Same category: the dimensioned tensor's dtype wins (PyTorch docs: int_tensor + long_zerodim -> int32).
      {"int32[3] + int64[]", i32v + scalar0(1, DType::Int64), DType::Int32, {2, 3, 4}},
      {"f16[3] + f64[]", f16v + scalar0(0.5, DType::Float64), DType::Float16, {1.5, 2.5, 3.5}},
      {"f32[3] + f64[]", f32v + scalar0(0.5, DType::Float64), DType::Float32, {1.5, 2.5, 3.5}},
      {"f16[3] * bf16[]", f16v * scalar0(2, DType::BFloat16), DType::Float16, {2, 4, 6}},
      // Higher category: the 0-dim tensor's own dtype (not the default float) is used:
      // torch.ones(3, dtype=torch.int32) + torch.tensor(1.5, dtype=torch.float64) -> float64.
      {"int32[3] + f64[]", i32v + scalar0(1.5, DType::Float64), DType::Float64, {2.5, 3.5, 4.5}},
      {"int32[3] + f16[]", i32v + scalar0(1.5, DType::Float16), DType::Float16, {2.5, 3.5, 4.5}},
      {"int32[3] + bf16[]", i32v + scalar0(1.5, DType::BFloat16), DType::BFloat16, {2.5, 3.5, 4.5}},
      {"bool[3] + int32[]", boolv + scalar0(2, DType::Int32), DType::Int32, {3, 2, 3}},
      {"bool[3] + f64[]", boolv + scalar0(0.5, DType::Float64), DType::Float64, {1.5, 0.5, 1.5}},
      // 0-dim with 0-dim: ordinary promotion.
      {"int32[] + f16[]", scalar0(2, DType::Int32) + scalar0(0.5, DType::Float16), DType::Float16, {2.5}},
      {"f16[] + bf16[]", scalar0(2, DType::Float16) + scalar0(0.5, DType::BFloat16), DType::Float32, {2.5}},
      {"int32[] + int64[]", scalar0(2, DType::Int32) + scalar0(5, DType::Int64), DType::Int64, {7}},
      // 0-dim with a wrapped number: the number does not widen the 0-dim tensor's category.
      {"f16[] * 2.0", scalar0(3, DType::Float16) * 2.0, DType::Float16, {6}},
      {"int32[] + 2.5", scalar0(3, DType::Int32) + 2.5, DType::Float32, {5.5}},
      // A 0-dim operand of higher category beats a wrapped number of the same category.
      {"int32[3] + f64[] + 1.5", i32v + scalar0(0.5, DType::Float64) + 1.5, DType::Float64, {3, 4, 5}},
      // f16 + bf16 tensors: float32.
      {"f16[3] + bf16[3]", f16v + vec({0.5, 0.5, 0.5}, DType::BFloat16), DType::Float32, {1.5, 2.5, 3.5}},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    CHECK(c.result.dtype() == c.dtype);
    KILN_CHECK_CLOSE(c.result, c.expected);
  }
  // The result of an op is an ordinary tensor: its dimensionality decides its tier.
  Tensor zero_dim_sum = scalar0(1, DType::Float64) + scalar0(1, DType::Float64);
  CHECK(zero_dim_sum.dim() == 0);
  CHECK(Tensor(i32v + zero_dim_sum).dtype() == DType::Float64);
  CHECK(Tensor(f32v + zero_dim_sum).dtype() == DType::Float32);
}

TEST_CASE("promotion of functions: where, maximum, pow, clamp, unary float functions") {
  Tensor i32v = vec({1, 2, 3}, DType::Int32);
  Tensor f16v = vec({1, 2, 3}, DType::Float16);
  Tensor bf16v = vec({1, 2, 3}, DType::BFloat16);
  Tensor f64v = vec({1, 2, 3}, DType::Float64);
  CHECK(Tensor(maximum(i32v, f16v)).dtype() == DType::Float16);
  CHECK(Tensor(minimum(f16v, bf16v)).dtype() == DType::Float32);
  CHECK(Tensor(pow(i32v, 2.0)).dtype() == DType::Float32);
  CHECK(Tensor(pow(i32v, 2)).dtype() == DType::Int32);
  CHECK(Tensor(pow(f16v, 2)).dtype() == DType::Float16);
  CHECK(Tensor(pow(2, i32v)).dtype() == DType::Int32);
  CHECK(Tensor(pow(2.5, i32v)).dtype() == DType::Float32);
  CHECK(Tensor(where(i32v > 1, i32v, f64v)).dtype() == DType::Float64);
  CHECK(Tensor(where(i32v > 1, f16v, bf16v)).dtype() == DType::Float32);
  CHECK(Tensor(exp(i32v)).dtype() == DType::Float32);
  CHECK(Tensor(sqrt(vec({1, 0, 1}, DType::Bool))).dtype() == DType::Float32);
  CHECK(Tensor(abs(i32v)).dtype() == DType::Int32);
  KILN_CHECK_CLOSE(maximum(i32v, f16v * 1.5), std::vector<double>{1.5, 3, 4.5});
  KILN_CHECK_CLOSE(pow(2.5, i32v), std::vector<double>{2.5, 6.25, 15.625});
  KILN_CHECK_EXACT(pow(2, i32v), {2, 4, 8});
}

TEST_CASE("what PyTorch refuses: abs/topk of bool, softmax of integers, clamp to bool") {
  // Each is a DTypeError in kiln as in torch 2.x (checked against torch over every dtype and
  // operand kind); the same calls of the neighbouring dtype work.
  Tensor b = vec({1, 0, 1}, DType::Bool), i = vec({1, 2, 3}, DType::Int32), l = vec({1, 2, 3}, DType::Int64);
  struct Case {
    const char* what;
    std::function<Tensor()> bad, good;
  };
  std::vector<Case> cases = {
      {"abs(bool)", [&] { return Tensor(abs(b)); }, [&] { return Tensor(abs(i)); }},
      {"topk(bool)", [&] { return std::get<0>(topk(b, 1)); }, [&] { return std::get<0>(sort(b)); }},
      {"softmax(int32)", [&] { return softmax(i, 0); }, [&] { return softmax(i.to(DType::Float32), 0); }},
      {"log_softmax(int64)", [&] { return log_softmax(l, 0); }, [&] { return logsumexp(l, 0); }},
      {"clamp(bool, true, true)", [&] { return clamp(b, true, true); }, [&] { return clamp(b, 0, true); }},
      {"clamp(bool, bool, bool)", [&] { return clamp(b, b, b); }, [&] { return clamp(b, i, b); }},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    CHECK_THROWS_AS(c.bad(), DTypeError);
    CHECK_NOTHROW(c.good().eval());
  }
  // torch.pow's scalar-exponent shortcuts: pow(bool, true) is x, pow(bool, false) ones.
  CHECK(Tensor(pow(b, true)).dtype() == DType::Bool);
  KILN_CHECK_EXACT(pow(b, true), {1, 0, 1});
  KILN_CHECK_EXACT(pow(b, false), {1, 1, 1});
  CHECK_THROWS_AS(pow(b, b), DTypeError);
}

TEST_CASE("in place: the result type must cast to the destination's category, as PyTorch") {
  auto i32v = [] { return vec({5, -3, 2}, DType::Int32); };
  auto boolv = [] { return vec({1, 0, 1}, DType::Bool); };
  struct Case {
    const char* what;
    std::function<Tensor()> run;
    DType dtype;  // Bool with empty expected: a DTypeError
    std::vector<double> expected;
  };
  const std::int64_t big = (std::int64_t(1) << 53) + 1;  // not a float64
  std::vector<Case> cases = {
      {"i32.add_(2): an int number stays int", [&] { Tensor x = i32v(); return x.add_(2); }, DType::Int32, {7, -1, 4}},
      {"i32.add_(0.5)", [&] { Tensor x = i32v(); return x.add_(0.5); }, DType::Bool, {}},
      {"i32.add_(f16 0-dim)", [&] { Tensor x = i32v(); return x.add_(scalar0(1, DType::Float16)); }, DType::Bool, {}},
      {"i32.div_(i32)", [&] { Tensor x = i32v(); return x.div_(i32v()); }, DType::Bool, {}},
      {"i32.mul_(i64)", [&] { Tensor x = i32v(); return x.mul_(vec({2, 2, 2}, DType::Int64)); }, DType::Int32,
       {10, -6, 4}},
      {"i32.add_(i32, alpha 3)", [&] { Tensor x = i32v(); return x.add_(i32v(), 3); }, DType::Int32, {20, -12, 8}},
      {"i32.sub_(i32, alpha 0.5)", [&] { Tensor x = i32v(); return x.sub_(i32v(), 0.5); }, DType::Bool, {}},
      {"f16.sub_(bool, alpha 2)", [&] { Tensor x = vec({1, 2, 3}, DType::Float16); return x.sub_(boolv(), 2); },
       DType::Bool, {}},
      {"f16.add_(f64)",
       [&] {
         Tensor x = vec({1, 2, 3}, DType::Float16);
         return x.add_(vec({1, 1, 1}, DType::Float64));
       },
       DType::Float16, {2, 3, 4}},
      {"bool.add_(1)", [&] { Tensor x = boolv(); return x.add_(1); }, DType::Bool, {}},
      {"bool.mul_(i32)", [&] { Tensor x = boolv(); return x.mul_(i32v()); }, DType::Bool, {}},
      {"bool.add_(true)", [&] { Tensor x = boolv(); return x.add_(true); }, DType::Bool, {1, 1, 1}},
      {"bool.add_(bool, alpha 2): alpha as a bool",
       [&] {
         Tensor x = vec({0, 0, 1}, DType::Bool);
         return x.add_(boolv(), 2);
       },
       DType::Bool, {1, 0, 1}},
  };
  for (auto& c : cases) {
    CAPTURE(c.what);
    if (c.expected.empty()) {
      CHECK_THROWS_AS(c.run(), DTypeError);
      continue;
    }
    Tensor r = c.run();
    CHECK(r.dtype() == c.dtype);
    KILN_CHECK_CLOSE(r, c.expected);
  }
  // Integer numbers and alphas are exact in int64 (not through float32).
  Tensor x = kiln::from_vector<std::int64_t>({big}, {1});
  x.add_(2);
  CHECK(x.item<std::int64_t>() == big + 2);
  x.add_(kiln::from_vector<std::int64_t>({1}, {1}), 3);
  CHECK(x.item<std::int64_t>() == big + 5);
}

}  // namespace kiln_test_tensor_promotion
