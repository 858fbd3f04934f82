// Programs the differential fuzzer (tests/fuzz/, docs/fuzzing.md) or a review found wrong, kept
// so that they stay fixed. Each case is a shrunk program with the PyTorch result it must give;
// the "fuzz: seed S graph G" cases came out of `kiln_fuzz --seed S --one G` and say what was
// wrong. Cases run on the host (the programs view host memory through from_blob) with the
// default backend, i.e. the CPU JIT when a compiler is found.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "regression.hpp"

namespace kiln_test_fuzz_fuzz_regressions {

using namespace kiln;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

/// The values of `t` read in its own dtype, as doubles.
std::vector<double> vals(const Tensor& t) { return kiln::fuzz::read_values(t); }

/// Every element of `actual` within float32's torch.testing tolerance of `expected` (NaN
/// matches NaN, infinities must be equal, signs included).
void check_f32(const Tensor& t, const std::vector<double>& expected) {
  CHECK(dtype_name(t.dtype()) == std::string("float32"));
  std::vector<double> a = vals(t);
  REQUIRE(a.size() == expected.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CAPTURE(a[i]);
    CAPTURE(expected[i]);
    CHECK(kiln::fuzz::element_close(a[i], expected[i], 0, false, DType::Float32));
  }
}

/// The message of the kiln::Error that f() throws ("" and a failed check if none is thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw " << kiln::fuzz::error_type(e) << " instead of a kiln::Error: " << e.what());
    return "";
  }
  FAIL_CHECK("no error was thrown");
  return "";
}

template <class E, class F>
void check_throws(F&& f) {
  try {
    f();
  } catch (const E&) {
    return;
  } catch (const std::exception& e) {
    FAIL_CHECK("threw " << kiln::fuzz::error_type(e) << ": " << e.what());
    return;
  }
  FAIL_CHECK("no error was thrown");
}

}  // namespace

// ---- F1: a kernel that reads a reduction's value it never declared ---------------------------

TEST_CASE("F1: rms_norm of a keepdim max compiles (CompileError 'v5' was not declared)") {
  std::vector<float> x = randn({4}, 3).to_vector<float>();  // the same numbers (Philox), evaluated apart
  double m = *std::max_element(x.begin(), x.end());
  Tensor y = rms_norm(max(randn({4}, 3), 0, true));
  CHECK(y.shape() == Shape{1});
  check_f32(y, {m / std::sqrt(m * m + 1.1920928955078125e-07)});
}

TEST_CASE("F1: a keepdim sum plus the sum of it compiles") {
  std::vector<float> x = randn({3, 4}, 1).to_vector<float>();
  double total = 0;
  for (float v : x) total += v;
  Tensor s = sum(randn({3, 4}, 1), {0, 1}, true);
  Tensor y = s + sum(s);
  CHECK(y.shape() == Shape{1, 1});
  check_f32(y, {2 * total});
}

// ---- F2: an integer converts to +0.0, never -0.0 ---------------------------------------------

TEST_CASE("F2: -0.5 -> int -> float is +0 (1/x is +inf, not -inf)") {
  Tensor x = from_vector(std::vector<float>(7, -0.5f), {7});
  check_f32(1.0f / x.to(i32).to(f32), std::vector<double>(7, kInf));
  check_f32(rsqrt(x.to(i64)), std::vector<double>(7, kInf));
  check_f32(rsqrt(x.to(i32)), std::vector<double>(7, kInf));
}

// ---- F4: clamp promotes over all three operands -----------------------------------------------

TEST_CASE("F4: clamp(bool[3], f64 0-dim, f32[3]) is float32 (torch.result_type of all three)") {
  Tensor y = clamp(ones({3}, bool_), full({}, 0.5, f64), zeros({3}));
  check_f32(y, {0, 0, 0});  // min(max(1, 0.5), 0)
}

// ---- F8: integer to a negative integer power -------------------------------------------------

TEST_CASE("F8: pow(int tensor, negative int) throws (PyTorch: Integers to negative integer powers are not allowed)") {
  error_of([] {
    Tensor t = pow(arange(3), -1);
    t.eval();
  });
  // A non-negative exponent stays valid.
  CHECK(vals(pow(arange(3), 2)) == std::vector<double>{0, 1, 4});
}

// ---- F9: axes of 0-dim tensors; the cast rule of full ---------------------------------------

TEST_CASE("F9: 0-dim tensors accept only dims 0 and -1") {
  check_throws<ShapeError>([] { Tensor t = transpose(full({}, 1.0), 5, 7); });
  check_throws<ShapeError>([] { Tensor t = softmax(full({}, 1.0), 3); });
  CHECK(vals(transpose(full({}, 2.0), 0, -1)) == std::vector<double>{2});
  CHECK(vals(softmax(full({}, 2.0), -1)) == std::vector<double>{1});
}

TEST_CASE("F9: full({3}, NaN, i32) holds INT_MIN (semantics.md: NaN casts to the minimum)") {
  Tensor t = full({3}, std::numeric_limits<double>::quiet_NaN(), i32);
  CHECK(dtype_name(t.dtype()) == std::string("int32"));
  CHECK(vals(t) == std::vector<double>(3, -2147483648.0));
}

// ---- F5: cross_entropy's class targets --------------------------------------------------------

TEST_CASE("F5: a cross_entropy target outside [0, C) is an error naming the op, the target and C") {
  std::string msg = error_of([] {
    Tensor loss = cross_entropy(randn({2, 3}, 1), from_vector<std::int64_t>({0, 7}, {2}));
    loss.eval();
  });
  CAPTURE(msg);
  CHECK(msg.find("cross_entropy") != std::string::npos);
  CHECK(msg.find('7') != std::string::npos);
  CHECK(msg.find('3') != std::string::npos);
}

// ---- F6: sizes past int64 ---------------------------------------------------------------------

TEST_CASE("F6: shapes whose element count overflows int64 are ShapeErrors") {
  check_throws<ShapeError>([] { Tensor t = zeros({1LL << 40, 1LL << 40}); });
  check_throws<ShapeError>([] { Tensor t = randn({1LL << 31, 1LL << 31, 4}, 1); });
  check_throws<ShapeError>([] { Tensor t = broadcast_to(ones({1}), {1LL << 32, 1LL << 32}); });
  static float one = 1.0f;
  check_throws<ShapeError>([] { Tensor t = from_blob(&one, {1LL << 32, 1LL << 32}); });
}

TEST_CASE("F6: slice with step INT64_MAX takes one element (no overflow in the count)") {
  Tensor t = slice(ones({3, 3}), 1, 0, 3, INT64_MAX);
  CHECK(t.shape() == Shape{3, 1});
  check_f32(t, {1, 1, 1});
}

// ---- F7: null data and impossible memory ------------------------------------------------------

TEST_CASE("F7: from_blob of a null pointer is an error when it is made") {
  error_of([] { Tensor t = from_blob(static_cast<float*>(nullptr), {3}); });
}

TEST_CASE("F7: impossible allocations are kiln errors naming the op, the shape and the bytes") {
  std::string msg = error_of([] { zeros({1LL << 62}).eval(); });
  CAPTURE(msg);
  CHECK(msg.find("zeros") != std::string::npos);
  for (int k = 40; k <= 61; ++k) {
    CAPTURE(k);
    std::string m = error_of([k] { zeros({1LL << k}).eval(); });
    CAPTURE(m);
    CHECK(m.find(std::to_string(1LL << k)) != std::string::npos);  // the shape
  }
}

// ---- the fuzzer's own finds -------------------------------------------------------------------

// kiln_fuzz --seed 1 --one 137 (first run; shrunk from 9 ops to 1): CompileError "unable to find
// numeric literal operator 'operator""xinff'". int64 == 1e300 compares in float32 (a wrapped
// double does not widen an integer tensor beyond the default dtype), where 1e300 is +inf, and
// the code generator printed that constant as the hex literal `0xinff`.
TEST_CASE("fuzz: seed 1 graph 137: an integer tensor compared with a number that is inf in float32") {
  Tensor x = from_vector<std::int64_t>({1, 5, -3}, {3});
  Tensor e = x == 1e+300;
  CHECK(vals(e) == std::vector<double>{0, 0, 0});
  CHECK(vals(x < 1e+300) == std::vector<double>{1, 1, 1});
  CHECK(vals(x > -1e+300) == std::vector<double>{1, 1, 1});
  auto program = [&] { return std::vector<Tensor>{x == 1e+300, x * 1e+300, maximum(x, -1e300)}; };
  kiln::fuzz::check_against_reference(program);
}

// kiln_fuzz --seed 2 --one 104 (and 12 more graphs of seeds 2 and 3; shrunk to no op at all):
// ShapeError "assign: destination ... has elements that share memory (a broadcast view)" for an
// empty destination. Row-major strides of a shape with a 0 in it hold zeros ([2, 0] has strides
// {0, 1}), and assign's overlap check took the 0 stride of the size-2 dim for a broadcast; an
// empty tensor has no elements to share (PyTorch: torch.zeros(2, 0).copy_(x) is a no-op).
TEST_CASE("fuzz: seed 2 graph 104: assign into an empty destination") {
  std::vector<float> out(1, 7680.0f);
  Tensor dst = from_blob(out.data(), {2, 1, 0});
  dst.assign(from_vector<float>({}, {2, 1, 0}));
  CHECK(dst.shape() == Shape{2, 1, 0});
  CHECK(out[0] == 7680.0f);
  Tensor e = zeros({3, 0}).eval();
  e.assign(ones({3, 0}));
  e.assign(2.0f);
  CHECK(e.numel() == 0);
}

// kiln_fuzz --seed 4 --one 2828 (shrunk from 8 ops to 3: var(tan(int64 ones [33, 33]), {},
// false, 0.0) <= 0.0): the JIT's variance of a constant float32 tensor is not 0 but a few
// ulp-squared, so `var(x) <= 0` is false where the reference (double accumulation) and PyTorch
// (Welford: every x - mean is exactly 0) give exactly 0. The JIT's mean is a float32 blocked
// sum divided by n, which is not exactly the constant, and the deviations from it do not vanish.
TEST_CASE("fuzz: seed 4 graph 2828: the variance of a constant is exactly 0") {
  Tensor x = tan(ones({33, 33}, i64));
  CHECK(vals(var(x, {}, false, 0.0)) == std::vector<double>{0});
  CHECK(vals(var(x, {}, false, 0.0) <= 0.0) == std::vector<double>{1});
  CHECK(vals(var(full({1000}, 0.1, f32))) == std::vector<double>{0});
  CHECK(vals(var(full({7, 129}, 1.7, f32), 1)) == std::vector<double>(7, 0.0));
}

// kiln_fuzz --seed 5 --one 1857 (shrunk from 5 ops to 2; 400 shrink runs): prod(arange(345, f32))
// was 0 in the JIT and NaN in the reference. The exact product is 0 (the first factor); the
// reference multiplied in blocks in double, and a block without the 0 overflowed (171! >
// DBL_MAX), so it met 0 * inf. The reference now multiplies floats in long double, whose range
// holds 344!, so it gives the exact 0 whatever the blocking; the JIT's 0 stands.
TEST_CASE("fuzz: seed 5 graph 1857: prod where partial products overflow and a factor is 0") {
  auto program = [&]() { return std::vector<Tensor>{prod(arange(345, f32), {}, false)}; };
  kiln::fuzz::check_against_reference(program);
  CHECK(vals(prod(arange(345, f32), {}, false)) == std::vector<double>{0});
  CHECK(vals(prod(arange(1, 346, 1, f64), {}, false)) == std::vector<double>{INFINITY});
  kiln::fuzz::check_against_reference(program);
}

TEST_CASE("fuzz: seed 44 graph 1700: a scatter into a constant infinity or NaN spells it as the dialect does") {
  // The constant base was printed as hexadecimal text ("-0xinf"), which neither compiler reads.
  Tensor v3 = index_add(full({2}, -std::numeric_limits<double>::infinity(), f64), 0,
                        from_vector<std::int64_t>({1}, {1}), from_vector<double>({1.0}, {1}));
  std::vector<double> a = vals(v3);
  REQUIRE(a.size() == 2);
  CHECK(a[0] == -std::numeric_limits<double>::infinity());
  CHECK(a[1] == -std::numeric_limits<double>::infinity());
  Tensor h = scatter_add(full({3}, std::nan(""), f16), 0, from_vector<std::int64_t>({0, 2}, {2}),
                         from_vector<float>({1.0f, 2.0f}, {2}).to(f16));
  for (double x : vals(h)) CHECK(std::isnan(x));
  check_f32(index_add(full({2}, kInf, f32), 0, from_vector<std::int64_t>({0}, {1}), from_vector<float>({-1.0f}, {1})),
            {kInf, kInf});
}

TEST_CASE("fuzz: seed 57 graphs 7, 229, 258: attention with a NaN query, empty feature dims, zero heads") {
  // A NaN score made the fused kernel's running maximum skip it (a masked row: 0); it is NaN,
  // as softmax's. An empty feature dim gives scale 1 / sqrt(0) = inf, printed as text no
  // compiler read. Zero heads failed the builder's group check.
  auto nan_query = [&]() {
    Tensor q = asin(from_vector<std::int64_t>({3}, {1, 1, 1, 1}));
    Tensor k = from_vector<float>({1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, {1, 1, 5, 1});
    return std::vector<Tensor>{scaled_dot_product_attention(q, k, full({1, 1, 5, 5}, 1.0, f32))};
  };
  kiln::fuzz::check_against_reference(nan_query);
  for (double x : vals(nan_query()[0])) CHECK(std::isnan(x));
  auto empty_features = [&]() {
    Tensor q = from_vector<float>({}, {1, 1, 0}), k = from_vector<float>({}, {1, 1, 0});
    return std::vector<Tensor>{scaled_dot_product_attention(q, k, from_vector<float>({1.0f}, {1, 1, 1}))};
  };
  kiln::fuzz::check_against_reference(empty_features);
  auto zero_heads = [&]() {
    Tensor x = from_vector<BFloat16>({}, {0, 1, 1});
    return std::vector<Tensor>{scaled_dot_product_attention(x, x, x, Tensor(), 0.0, true)};
  };
  kiln::fuzz::check_against_reference(zero_heads);
  CHECK(zero_heads()[0].shape() == Shape{0, 1, 1});
}

TEST_CASE("fuzz judge: an integer cast of a value next to an integer is excused when either nudge direction moves it") {
  // Seed 41 graph 288 on the H200: an f32 product whose exact value lies just below 559782,
  // cast to int64: cuBLAS rounded up (559782), the reference down (559781). The nudged twin's
  // random sign moved the product away from the integer, so the cast did not move and the one
  // unit stood as a mismatch; the mirrored twin moves every rounding the other way.
  using namespace kiln::fuzz;
  Program p;
  Step out;
  out.is_input = true;
  out.info = {DType::Int64, Shape{1}};
  p.steps.push_back(out);
  p.outputs = {0};
  auto result = [](double v) {
    Result r;
    r.values = {{v}};
    r.infos = {Info{DType::Int64, Shape{1}}};
    return r;
  };
  const Result ref = result(559781), jit = result(559782), twin = result(559781);
  const Result away = result(559781), across = result(559782);
  CHECK(judge(p, ref, jit, &twin, &away).kind == Kind::Mismatch);
  CHECK(judge(p, ref, jit, &twin, &away, nullptr, {&across}).kind == Kind::Pass);
}

TEST_CASE("fuzz judge: results a GPU gave within their roundings pass, a few times as far off they do not") {
  // GPU gradient campaigns (kiln_fuzz --device cuda --grad --max-ops 8) on an H100: each value
  // below is the first element the judge called wrong, a rounding the nudged twin did not model
  // (docs/fuzzing.md, "Tolerance model"). The twins run on the host as in the campaign (with
  // CUDA's math bounds); the JIT's result is the reference's with the GPU's element put in.
  // The same element `caught` times as far from the reference is a mismatch: the nudges stand
  // for bounds with random signs, a few times one sample's rounding, and the judge allows twice
  // the largest of its twins' moves (the multiples are the smallest of 5, 10, 20, 30, 50 that
  // the judge catches: what the judge resolves in each of these graphs).
  using namespace kiln::fuzz;
  struct Case {
    std::uint64_t seed, graph;
    std::size_t output, element;
    double gpu;
    double caught;
    const char* why;
  };
  const std::vector<Case> cases = {
      // two products' nudges cancelling through a second product: another seed's nudge
      {602, 1772, 0, 23 * 1000 + 104, 63.2907295, 5, "float32 matmul chain"},
      // log_softmax's own rounding, amplified by cosh and exp2
      {601, 1255, 1, 129 + 88, 875022208, 5, "exp2(cosh(log_softmax))"},
      // the attention backward's roundings (D from O stored in float16, dS rounded to it; the
      // first campaign ran on an H100, the second on an H200)
      {601, 659, 5, ((0 * 2 + 1) * 3 + 1) * 8 + 1, 0.544921875, 10, "float16 query gradient"},
      {602, 2010, 6, (0 * 7 + 2) * 128 + 65, -0.0139694214, 30, "float16 query gradient, P near one-hot"},
      {602, 1285, 2, (1 * 129 + 0) * 16 + 2, -0.284912109, 5, "float16 query gradient, 129 keys"},
      {602, 1285, 2, ((0 * 3 + 2) * 129 + 34) * 16 + 8, -0.775390625, 5,
       "float16 query gradient, 129 keys (H200)"},
      // P rounded to float16 before P^T dO, two rows' terms cancelling
      {601, 659, 7, (0 * 3 + 2) * 64 + 26, -0.0152053833, 10, "float16 value gradient (H200)"},
      // dP - D cancelling over one key: an exact 0 in float64
      {602, 817, 5, 2, 1.16772399e-05, 50, "float32 key gradient, one key"},
  };
  Limits limits;
  limits.max_ops = 8;
  limits.grad = true;
  limits.table_version = 8;  // the campaigns' table: later rows change what a seed draws
  for (const Case& c : cases) {
    CAPTURE(c.seed);
    CAPTURE(c.graph);
    CAPTURE(c.why);
    const Program p = generate(c.seed, c.graph, limits);
    const std::uint64_t perturb = p.seed * 31 + p.index + 1;
    const Result ref = run_program(p, Backend::Eager, BuildCtx{false, Device::cpu()}, true);
    const Result twin = run_program(p, Backend::Eager, BuildCtx{true, Device::cpu()});
    const Result nudged = run_program(p, Backend::Eager, BuildCtx{true, Device::cpu(), perturb, true});
    set_backend(Backend::Auto);
    REQUIRE(ref.status == Result::Status::Ok);
    REQUIRE(c.output < ref.values.size());
    REQUIRE(c.element < ref.values[c.output].size());
    Result jit = ref;
    jit.values[c.output][c.element] = c.gpu;
    CHECK(judge_escalating(p, ref, jit, &twin, &nudged, perturb, true).kind == Kind::Pass);
    const double expected = ref.values[c.output][c.element];
    jit.values[c.output][c.element] = expected + c.caught * (c.gpu - expected);
    CHECK(judge_escalating(p, ref, jit, &twin, &nudged, perturb, true).kind == Kind::Mismatch);
  }
}

TEST_CASE("fuzz: seed 2612051 graph 345, a scan of an attention's output") {
  // The step plan asked for the attention's result slot (the scan's source) before it had
  // placed the attention's results: "an unbound slot". Results are placed before any operand.
  auto program = [&]() {
    Tensor q = from_vector<float>({1.0f}, {1, 1, 1}), k = from_vector<float>({1.0f}, {1, 1, 1});
    Tensor v = from_vector<float>({-1.0f}, {1, 1, 1});
    Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, false);
    return std::vector<Tensor>{logcumsumexp(out, 2), cumsum(scaled_dot_product_attention(
                                                         randn({2, 3, 4}, 5), randn({2, 5, 4}, 6), randn({2, 5, 4}, 7)), 1)};
  };
  kiln::fuzz::check_against_reference(program);
}

TEST_CASE("fuzz: seed 600 graph 852 (--grad), the gradient of a min over a concat of empty pieces") {
  // The code generators (C++ and CUDA) read the last non-empty piece of the concat: none (signal 11).
  auto program = [&]() {
    Tensor v0 = (from_vector<float>({}, {0, 1})).detach().requires_grad_();
    Tensor v1 = (from_vector<float>({}, {0, 1})).detach().requires_grad_();
    Tensor v2 = concat({v0, v1, v1}, 0);
    Tensor v3 = min(v2, {1}, false);
    return kiln::fuzz::with_gradients({v3}, {v0, v1});
  };
  kiln::fuzz::check_against_reference(program);
}

}  // namespace kiln_test_fuzz_fuzz_regressions
