// The elementwise functions added through the op table (atan, asin, acos, atan2, hypot, fmod,
// the bitwise ops and shifts as primitives; sign, reciprocal, square, trunc, the hyperbolic
// functions, remainder and logical_xor as composites): against a float64 evaluation with
// special values, in every floating dtype, on the device under test (KILN_DEVICE); integer ops
// exactly; PyTorch's dtype rules; and every primitive of the table, on every dtype it is
// defined for, fused by the CPU JIT as the reference executor computes it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "../codegen/cuda_test_util.hpp"
#include "../support/reference.hpp"
#include "kiln/backend/cpu_jit.hpp"

namespace kiln_test_tensor_new_ops {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::numeric_limits<double>::quiet_NaN();

/// Inputs over each function's whole domain: zeros of both signs, tiny, around 1, large, huge,
/// infinities and NaN.
const std::vector<double> kValues = {-0.0, 0.0,   1e-30,  -1e-30, 1e-6, -1e-6, 0.25,   -0.25, 0.5,
                                     -0.5, 0.999, -0.999, 1.0,    -1.0, 1.001, -1.001, 1.5,   -1.5,
                                     2.0,  -3.25, 7.0,    -10.0,  30.0, -60.0, 88.5,   -89.2, 200.0,
                                     1e10, -1e10, 1e30,   -1e30,  kInf, -kInf, kNan};

/// float64 of `v` as it is stored in `dt` (the reference a dtype's result is held to).
double stored(double v, DType dt) {
  switch (dt) {
    case DType::Float32:
      return static_cast<float>(v);
    case DType::Float16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case DType::BFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    default:
      return v;
  }
}

/// Compares f(x) in `dt` with the float64 `ref` of the stored inputs, with torch.testing's
/// tolerance of `dt`; NaN where the reference is NaN, infinities of the right sign.
void check_unary(const char* name, const std::function<Tensor(const Tensor&)>& f, double (*ref)(double), DType dt) {
  std::vector<double> in;
  for (double v : kValues) in.push_back(stored(v, dt));
  Tensor x = kt::make_tensor(in, {static_cast<std::int64_t>(in.size())}, dt);
  std::vector<double> want;
  for (double v : in) want.push_back(stored(ref(v), dt));
  CAPTURE(std::string(name));
  CAPTURE(std::string(dtype_name(dt)));
  KILN_CHECK_CLOSE(f(x), want);
}

void check_binary(const char* name, const std::function<Tensor(const Tensor&, const Tensor&)>& f,
                  double (*ref)(double, double), DType dt) {
  std::vector<double> a, b;
  for (double u : kValues)
    for (double v : {-2.5, -1.0, -0.0, 0.0, 0.75, 3.0, 1e20, kInf, kNan}) {
      a.push_back(stored(u, dt));
      b.push_back(stored(v, dt));
    }
  const std::int64_t n = static_cast<std::int64_t>(a.size());
  std::vector<double> want;
  for (std::size_t i = 0; i < a.size(); ++i) want.push_back(stored(ref(a[i], b[i]), dt));
  CAPTURE(std::string(name));
  CAPTURE(std::string(dtype_name(dt)));
  KILN_CHECK_CLOSE(f(kt::make_tensor(a, {n}, dt), kt::make_tensor(b, {n}, dt)), want);
}

double py_remainder(double a, double b) {  // PyTorch's: fmod, moved by b when the signs differ
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
double torch_sign(double x) { return (0 < x) - (x < 0); }  // NaN gives 0, as torch.sign

const DType kFloats[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};

}  // namespace

TEST_CASE("new unary functions against float64, special values included, in every floating dtype") {
  for (DType dt : kFloats) {
    check_unary(
        "atan", [](const Tensor& x) { return Tensor(atan(x)); }, [](double v) { return std::atan(v); }, dt);
    check_unary(
        "asin", [](const Tensor& x) { return Tensor(asin(x)); }, [](double v) { return std::asin(v); }, dt);
    check_unary(
        "acos", [](const Tensor& x) { return Tensor(acos(x)); }, [](double v) { return std::acos(v); }, dt);
    check_unary(
        "sinh", [](const Tensor& x) { return Tensor(sinh(x)); }, [](double v) { return std::sinh(v); }, dt);
    check_unary(
        "cosh", [](const Tensor& x) { return Tensor(cosh(x)); }, [](double v) { return std::cosh(v); }, dt);
    check_unary(
        "asinh", [](const Tensor& x) { return Tensor(asinh(x)); }, [](double v) { return std::asinh(v); }, dt);
    check_unary(
        "acosh", [](const Tensor& x) { return Tensor(acosh(x)); }, [](double v) { return std::acosh(v); }, dt);
    check_unary(
        "atanh", [](const Tensor& x) { return Tensor(atanh(x)); }, [](double v) { return std::atanh(v); }, dt);
    check_unary(
        "reciprocal", [](const Tensor& x) { return Tensor(reciprocal(x)); }, [](double v) { return 1.0 / v; }, dt);
    check_unary(
        "sign", [](const Tensor& x) { return Tensor(sign(x)); }, torch_sign, dt);
    check_unary(
        "square", [](const Tensor& x) { return Tensor(square(x)); }, [](double v) { return v * v; }, dt);
    check_unary(
        "trunc", [](const Tensor& x) { return Tensor(trunc(x)); }, [](double v) { return std::trunc(v); }, dt);
  }
  // Signs of zero: odd functions keep -0, trunc(-0.5) is -0.
  Tensor z = kt::make_tensor({-0.0, -0.5}, {2}, DType::Float32);
  for (Tensor r :
       {Tensor(sinh(z)), Tensor(asinh(z)), Tensor(atanh(z)), Tensor(atan(z)), Tensor(asin(z)), Tensor(trunc(z))})
    CHECK(std::signbit(r.to_vector<float>()[0]));
  CHECK(std::signbit(Tensor(trunc(z)).to_vector<float>()[1]));
}

TEST_CASE("new binary functions against float64, special values included") {
  for (DType dt : kFloats) {
    check_binary(
        "atan2", [](const Tensor& a, const Tensor& b) { return Tensor(atan2(a, b)); },
        [](double a, double b) { return std::atan2(a, b); }, dt);
    check_binary(
        "hypot", [](const Tensor& a, const Tensor& b) { return Tensor(hypot(a, b)); },
        [](double a, double b) { return std::hypot(a, b); }, dt);
    check_binary(
        "fmod", [](const Tensor& a, const Tensor& b) { return Tensor(fmod(a, b)); },
        [](double a, double b) { return std::fmod(a, b); }, dt);
    check_binary(
        "remainder", [](const Tensor& a, const Tensor& b) { return Tensor(remainder(a, b)); }, py_remainder, dt);
  }
  // Python's sign rule: the result takes the divisor's sign; operator% is remainder.
  KILN_CHECK_CLOSE(
      kt::make_tensor({-7, 7, -7, 7}, {4}, DType::Float32) % kt::make_tensor({3, -3, -3, 3}, {4}, DType::Float32),
      std::vector<double>{2, -2, -1, 1});
}

TEST_CASE("integer functions: bitwise ops, shifts, fmod, remainder, sign, square exactly, as PyTorch") {
  Tensor a = kt::make_int_tensor({-7, -1, 0, 5, 64, 3, INT64_MIN}, {7});
  Tensor s = kt::make_int_tensor({1, 63, 64, -1, 2, 0, 1}, {7});
  KILN_CHECK_EXACT(bitwise_and(a, 6), {0, 6, 0, 4, 0, 2, 0});
  KILN_CHECK_EXACT(a | 1, {-7, -1, 1, 5, 65, 3, INT64_MIN + 1});
  KILN_CHECK_EXACT(a ^ s, {-8, -64, 64, -6, 66, 3, INT64_MIN + 1});
  KILN_CHECK_EXACT(~a, {6, 0, -1, -6, -65, -4, INT64_MAX});
  // A count outside [0, 64) shifts everything out: 0 to the left, the sign to the right.
  KILN_CHECK_EXACT(left_shift(a, s), {-14, INT64_MIN, 0, 0, 256, 3, 0});
  KILN_CHECK_EXACT(a >> s, {-4, -1, 0, 0, 16, 3, INT64_MIN / 2});
  KILN_CHECK_EXACT(right_shift(kt::make_int_tensor({-5, 5}, {2}, DType::Int32), 40), {-1, 0});
  KILN_CHECK_EXACT(
      left_shift(kt::make_int_tensor({1, 1}, {2}, DType::Int32), kt::make_int_tensor({31, 32}, {2}, DType::Int32)),
      {INT32_MIN, 0});
  // fmod keeps the dividend's sign; remainder takes the divisor's; by 0 both give 0 (kiln's
  // integer division rule; PyTorch raises there).
  KILN_CHECK_EXACT(fmod(a, 3), {-1, -1, 0, 2, 1, 0, -2});
  KILN_CHECK_EXACT(remainder(a, 3), {2, 2, 0, 2, 1, 0, 1});
  KILN_CHECK_EXACT(a % -3, {-1, -1, 0, -1, -2, 0, -2});
  KILN_CHECK_EXACT(fmod(a, 0), {0, 0, 0, 0, 0, 0, 0});
  KILN_CHECK_EXACT(fmod(a, -1), {0, 0, 0, 0, 0, 0, 0});
  KILN_CHECK_EXACT(sign(a), {-1, -1, 0, 1, 1, 1, -1});
  KILN_CHECK_EXACT(square(kt::make_int_tensor({-3, 4}, {2}, DType::Int32)), {9, 16});
  // bools: bitwise ops are logical; square gives int64 (torch.square is pow(x, 2)); sign keeps bool.
  Tensor t = kt::make_tensor({1, 0, 1, 0}, {4}, DType::Bool), u = kt::make_tensor({1, 1, 0, 0}, {4}, DType::Bool);
  CHECK((t & u).dtype() == DType::Bool);
  KILN_CHECK_EXACT(t & u, {1, 0, 0, 0});
  KILN_CHECK_EXACT(t | u, {1, 1, 1, 0});
  KILN_CHECK_EXACT(bitwise_xor(t, u), {0, 1, 1, 0});
  KILN_CHECK_EXACT(bitwise_not(t), {0, 1, 0, 1});
  CHECK(square(t).dtype() == DType::Int64);
  CHECK(sign(t).dtype() == DType::Bool);
  // logical_xor on any dtype: nonzero is true, NaN is true.
  KILN_CHECK_EXACT(
      logical_xor(kt::make_tensor({0, 2.5, kNan, 0}, {4}, DType::Float32), kt::make_int_tensor({0, 0, 1, 3}, {4})),
      {0, 1, 0, 1});
}

TEST_CASE("new functions follow PyTorch's dtype rules, with typed errors") {
  Tensor i = kt::make_int_tensor({1, 2}, {2}, DType::Int32), f = kt::make_tensor({1, 2}, {2}, DType::Float16);
  CHECK(atan(i).dtype() == DType::Float32);
  CHECK(sinh(i).dtype() == DType::Float32);
  CHECK(reciprocal(i).dtype() == DType::Float32);
  CHECK(atan2(i, i).dtype() == DType::Float32);
  CHECK(atan2(f, i).dtype() == DType::Float16);
  CHECK(trunc(i).dtype() == DType::Int32);
  CHECK(fmod(i, 2.5).dtype() == DType::Float32);
  CHECK(remainder(f, 2).dtype() == DType::Float16);
  CHECK(bitwise_and(i, kt::make_int_tensor({3, 3}, {2})).dtype() == DType::Int64);
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)bitwise_and(f, i), "bitwise_and", "float16");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)bitwise_not(f), "bitwise_not", "float16[2]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)left_shift(f, 1), "left_shift");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)hypot(i, i), "hypot", "int32");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)trunc(kt::make_tensor({1}, {1}, DType::Bool)), "trunc", "bool");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, (void)fmod(kt::make_tensor({1}, {1}, DType::Bool), true), "fmod", "bool");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, (void)atan2(f, kt::make_tensor({1, 2, 3}, {3}, DType::Float32)), "atan2",
                               "[2]", "[3]");
}

TEST_CASE(
    "every primitive of the op table, on every dtype it is defined for, fused by the CPU JIT as the reference computes "
    "it") {
  if (!backend::cpu_jit_available()) return;
  for (DType dt : kiln_cuda_test::kDTypes) {
    CAPTURE(std::string(dtype_name(dt)));
    std::vector<ir::NodePtr> roots = kiln_cuda_test::op_batch(dt);
    ir::Captured c = kiln_cuda_test::capture(roots);
    kiln_cuda_test::Outputs got = kiln_cuda_test::make_outputs(c.graph, 0xAB),
                            want = kiln_cuda_test::make_outputs(c.graph, 0xCD);
    backend::run_reference(c.graph, kiln_cuda_test::args_for(c, want));
    backend::run_cpu_jit(c.graph, kiln_cuda_test::args_for(c, got));
    std::string diff = kiln_cuda_test::compare(c.graph, got.pointers, want.pointers);
    CHECK_MESSAGE(diff.empty(), diff);
  }
  // The table and the kinds agree (a row added out of place would break op_kind).
  for (ir::Op op : ir::kAllOps) {
    const ir::OpInfo& info = ir::op_info(op);
    CHECK(info.name != nullptr);
    if (ir::op_kind(op) == ir::OpKind::Binary) CHECK(info.arity == 2);
    if (ir::has_flag(op, ir::kComparison)) CHECK(ir::has_flag(op, ir::kBoolResult));
  }
}

}  // namespace kiln_test_tensor_new_ops
