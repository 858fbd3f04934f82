// Gradients: the tape API (requires_grad_, backward, grad, accumulation, zero_grad_, detach,
// the guards) and its errors; every primitive's rule and the composites through their
// decompositions checked by autograd::gradcheck (float64 central differences) on small random
// inputs, with broadcasting, keepdim, ties, slices and special values; autograd::grad,
// kiln::grad and value_and_grad; the fused (JIT) backward against the reference executor; and
// an MLP trained 50 steps by SGD on both executors to the same losses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <kiln/autodiff/backward.hpp>  // the backward walk itself (autodiff::backward_pass)
#include <kiln/kiln.hpp>

#include "../support/device.hpp"

namespace kiln_test_autodiff_autodiff {

using namespace kiln;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
using kiln::testing::device;  // KILN_DEVICE: the same tests on the CPU and on a GPU

namespace {

struct BackendScope {
  Backend saved = get_backend();
  explicit BackendScope(Backend b) { set_backend(b); }
  ~BackendScope() { set_backend(saved); }
};

/// gradcheck on the reference executor (no kernels to compile for the many perturbed calls).
void check(const char* what, const Fn& f, const std::vector<Tensor>& inputs, double atol = 1e-6, double rtol = 1e-4,
           double eps = 1e-6) {
  INFO(std::string(what));
  BackendScope eager(Backend::Eager);
  try {
    CHECK(autograd::gradcheck(f, inputs, eps, atol, rtol));
  } catch (const AutogradError& e) {
    FAIL_CHECK(what << ": " << e.what());
  }
}

Tensor vals(const std::vector<double>& v, const Shape& s) { return from_vector<double>(v, s, device()); }

/// The small MLP the training tests run: its data, its parameters, and one SGD step.
struct SmallMlp {
  Tensor X = randn({64, 16}, 41, f32, device());
  Tensor w1 = (randn({16, 32}, 42, f32, device()) * 0.25).eval().requires_grad_();
  Tensor b1 = zeros({32}, f32, device()).requires_grad_();
  Tensor w2 = (randn({32, 4}, 43, f32, device()) * 0.25).eval().requires_grad_();
  Tensor targets = argmax(slice(X, 1, 0, 4), {1});  // a class the inputs determine

  Tensor loss(const Tensor& x, const Tensor& t) const {
    return cross_entropy(matmul(gelu(layer_norm(matmul(x, w1) + b1)), w2), t);
  }
  /// Backward from `loss`, then p -= 0.5 p.grad() for every parameter; returns the loss's value.
  double step(const Tensor& loss) {
    const double value = loss.item<float>();
    loss.backward();
    NoGradGuard off;
    for (Tensor* p : {&w1, &b1, &w2}) {
      p->assign(*p - 0.5f * p->grad());
      p->zero_grad_();
    }
    return value;
  }
};

}  // namespace

TEST_CASE("autograd: the tape accumulates into leaves; guards, detach, errors") {
  Tensor x = vals({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = vals({0.5, -1, 2, 0, 1, 3}, {2, 3}).requires_grad_();
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
  CHECK_FALSE(w.grad().defined());
  Tensor loss = sum(x * w * w);
  CHECK(loss.requires_grad());
  CHECK_FALSE(loss.is_leaf());
  loss.backward();
  std::vector<double> g = w.grad().to_vector<double>();
  const std::vector<double> xs = x.to_vector<double>(), ws = w.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(2 * xs[i] * ws[i]));
  // A second forward and backward add to grad(), in place (a handle taken before sees it).
  Tensor held = w.grad();
  sum(x * w * w).backward();
  g = held.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(4 * xs[i] * ws[i]));
  w.zero_grad_();
  for (double v : w.grad().to_vector<double>()) CHECK(v == 0.0);

  // A second backward through a freed graph is an error; retain_graph keeps it.
  Tensor l2 = sum(exp(w) * x);
  l2.backward(Tensor(), true);
  l2.backward();
  CHECK_THROWS_AS(l2.backward(), AutogradError);
  // Errors: no grad, non-scalar without a gradient, integer leaves, a wrong gradient shape.
  CHECK_THROWS_AS(sum(x).backward(), AutogradError);
  CHECK_THROWS_AS((w * 2.0).backward(), AutogradError);
  CHECK_THROWS_AS(from_vector<std::int64_t>({1, 2}, {2}, device()).requires_grad_(), DTypeError);
  CHECK_THROWS_AS((w * 2.0).backward(ones({3, 2}, f64, device())), ShapeError);
  CHECK_THROWS_AS(Tensor(w * 2.0).requires_grad_(false), AutogradError);
  // A slice of a leaf that requires grad is its own node while recording: writing into it is an
  // error (it would not reach the leaf); under NoGradGuard it is a view and writes through.
  CHECK_THROWS_AS(slice(w, 1, 0, 1).assign(0.0), AutogradError);
  // Writing the leaf itself while recording is an error too, as PyTorch's in-place ops on a leaf
  // that requires grad (a graph built on it before would read the new value); nothing is written.
  const std::vector<double> kept = w.to_vector<double>();
  CHECK_THROWS_AS(w.assign(w - 0.1 * w.grad()), AutogradError);
  CHECK_THROWS_AS(w.sub_(w.grad(), 0.1), AutogradError);
  CHECK(w.to_vector<double>() == kept);
  {
    NoGradGuard off;
    Tensor before = clone(w).eval();  // its own storage
    slice(w, 1, 0, 1).assign(7.0);
    CHECK(w.to_vector<double>()[0] == 7.0);
    CHECK(w.to_vector<double>()[3] == 7.0);
    w.assign(before);
  }

  // A non-scalar output with a gradient: d(sum(v * y)).
  w.zero_grad_();
  (w * 3.0).backward(vals({1, 1, 1, 2, 2, 2}, {2, 3}));
  CHECK(w.grad().to_vector<double>() == std::vector<double>{3, 3, 3, 6, 6, 6});

  {
    NoGradGuard off;
    CHECK_FALSE((w * 2.0).requires_grad());
    CHECK_FALSE(is_grad_enabled());
    EnableGradGuard on;
    CHECK((w * 2.0).requires_grad());
  }
  CHECK(is_grad_enabled());
  Tensor d = (w * 2.0).detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.to_vector<double>() == (w * 2.0).detach().to_vector<double>());
}

TEST_CASE("autograd: a leaf that is evaluated, viewed and read still gets its gradient") {
  Tensor w = randn({3, 4}, 5, f64, device()).requires_grad_();
  w.eval();
  Tensor h = matmul(transpose(w, 0, 1), w);  // a view of an evaluated leaf records the transpose
  h.eval();                                  // evaluated before the backward: the tape is kept
  Tensor loss = sum(h);
  (void)loss.item<double>();
  loss.backward();
  // d sum(W^T W) / dW = W (1 1^T) + W (1 1^T) = 2 W J
  std::vector<double> wv = w.to_vector<double>(), g = w.grad().to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      double row = 0;
      for (int k = 0; k < 4; ++k) row += wv[static_cast<std::size_t>(i * 4 + k)];
      CHECK(g[static_cast<std::size_t>(i * 4 + j)] == doctest::Approx(2 * row));
    }
}

TEST_CASE("autograd: special values follow PyTorch (relu'(0), abs'(0), sqrt'(0), ties of max)") {
  Tensor x = vals({-1, 0, 2}, {3}).requires_grad_();
  sum(relu(x)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 1});
  x.zero_grad_();
  sum(abs(x)).backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{-1, 0, 1});
  Tensor z = vals({0, 4}, {2}).requires_grad_();
  sum(sqrt(z)).backward();
  CHECK(std::isinf(z.grad().to_vector<double>()[0]));
  CHECK(z.grad().to_vector<double>()[1] == doctest::Approx(0.25));
  Tensor t = vals({3, 1, 3, 2}, {4}).requires_grad_();
  max(t).backward();  // two elements hold the max: half each
  CHECK(t.grad().to_vector<double>() == std::vector<double>{0.5, 0, 0.5, 0});
  Tensor rows = vals({1, 5, 5, 5, 2, 0}, {2, 3}).requires_grad_();
  sum(amax(rows, {1})).backward();  // along a dim too: the two fives of row 0 share
  CHECK(rows.grad().to_vector<double>() == std::vector<double>{0, 0.5, 0.5, 1, 0, 0});
  // max and min along a dim give the whole gradient to the index they return, as torch's
  Tensor pairs = vals({2, 2, 1, 0, 3, 3}, {2, 3}).requires_grad_();
  (sum(std::get<0>(max(pairs, 1))) + sum(std::get<0>(min(pairs, 0, true)))).backward();
  CHECK(pairs.grad().to_vector<double>() == std::vector<double>{1, 1, 1, 1, 1, 0});
  // a NaN maximum (minimum) goes to the NaN elements, as torch.max()'s
  Tensor with_nan = vals({1, NAN, 3, NAN}, {4}).requires_grad_();
  (max(with_nan) + min(with_nan)).backward();
  CHECK(with_nan.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 1});
  // gelu's own rule: finite everywhere, Phi(0) = 0.5 at 0 and at tiny values
  Tensor gz = from_vector<float>({0.f, 1e-30f, -1e-30f, 20.f, -20.f}, {5}, device()).requires_grad_();
  sum(gelu(gz)).backward();
  std::vector<float> gg = gz.grad().to_vector<float>();
  CHECK(gg == std::vector<float>{0.5f, 0.5f, 0.5f, 1.f, 0.f});
  Tensor p = vals({2, 0, 3}, {3}).requires_grad_();
  prod(p).backward();  // one zero: only it gets the product of the others
  CHECK(p.grad().to_vector<double>() == std::vector<double>{0, 6, 0});
  // sigmoid'(0) = 1/4 (its own rule; through |x| it was 0), log(sigmoid(0))' = 1/2
  Tensor s0 = vals({0, -0.0, 2}, {3}).requires_grad_();
  sum(sigmoid(s0) + log(sigmoid(s0))).backward();
  std::vector<double> sg = s0.grad().to_vector<double>();
  CHECK(sg[0] == doctest::Approx(0.75));
  CHECK(sg[1] == doctest::Approx(0.75));
  CHECK(sg[2] == doctest::Approx(0.104993585 + 0.119202922));
  // asinh, atanh at 0 and acosh: PyTorch's rules (1 / sqrt(x^2 + 1), 1 / (1 - x^2), 1 / sqrt(x^2 - 1))
  Tensor h0 = vals({0, 0.5}, {2}).requires_grad_();
  sum(asinh(h0) + atanh(h0)).backward();
  CHECK(h0.grad().to_vector<double>()[0] == doctest::Approx(2.0));
  CHECK(h0.grad().to_vector<double>()[1] == doctest::Approx(1 / std::sqrt(1.25) + 1 / 0.75));
  Tensor a2 = vals({2}, {1}).requires_grad_();
  sum(acosh(a2)).backward();
  CHECK(a2.grad().to_vector<double>()[0] == doctest::Approx(1 / std::sqrt(3.0)));
  // clamp passes the gradient where lo <= x <= hi, the bounds included (torch.clamp's
  // subgradient 1; a maximum's tie gave half)
  Tensor cl = vals({-1, -0.5, 0, 0.25, 0.5, 1}, {6}).requires_grad_();
  sum(clamp(cl, -0.5, 0.5)).backward();
  CHECK(cl.grad().to_vector<double>() == std::vector<double>{0, 1, 1, 1, 1, 0});
  // with tensor bounds (torch's Tensor overload) x gets a tie, a bound only where x is beyond it
  Tensor cx = vals({1, 2, 3}, {3}).requires_grad_(), clo = vals({1, 1, 1}, {3}).requires_grad_(),
         chi = vals({3, 1.5, 3}, {3}).requires_grad_();
  std::vector<Tensor> cg = autograd::grad({sum(clamp(cx, clo, chi))}, {cx, clo, chi});
  CHECK(cg[0].to_vector<double>() == std::vector<double>{1, 0, 1});
  CHECK(cg[1].to_vector<double>() == std::vector<double>{0, 0, 0});
  CHECK(cg[2].to_vector<double>() == std::vector<double>{0, 1, 0});
  // an empty gather still comes from its input: the gradient is zeros, not an error
  Tensor e = vals({1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor picked = index_select(e, 0, from_vector<std::int64_t>({}, {0}, device()));
  CHECK(picked.requires_grad());
  sum(picked).backward();
  CHECK(e.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0});
  sum(std::get<0>(topk(e, 0, 1))).backward();  // k = 0: the same
  CHECK(e.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0});
  // concat keeps a part empty along the axis when gradients flow through it: its (empty)
  // gradient is returned, not an "unused input" error
  Tensor none = from_vector<double>({}, {2, 0}, device()).requires_grad_();
  std::vector<Tensor> cg2 = autograd::grad({sum(concat({none, e, none}, 1) * 2.0)}, {none, e});
  CHECK(cg2[0].shape() == Shape{2, 0});
  CHECK(cg2[1].to_vector<double>() == std::vector<double>{2, 2, 2, 2});
  // cumprod through zeros, as PyTorch: the first zero gets the products of the others, the
  // positions after it nothing (a rule of out / x would give NaN and inf here).
  Tensor c = vals({2, 0, 3, 0, 5, 0, 2, 3, 1, 1}, {2, 5}).requires_grad_();
  sum(cumprod(c, 1)).backward();
  CHECK(c.grad().to_vector<double>() == std::vector<double>{1, 8, 0, 0, 0, 21, 0, 0, 0, 0});
}

TEST_CASE("autograd: gradcheck of the pointwise rules") {
  Tensor a = randn({3, 4}, 11, f64, device()), b = randn({3, 4}, 12, f64, device());
  Tensor pos = abs(randn({3, 4}, 13, f64, device())) + 0.5, unit = tanh(randn({3, 4}, 14, f64, device())) * 0.9;
  Tensor row = randn({1, 4}, 15, f64, device());
  check("neg exp exp2 expm1", [](auto& v) { return -exp(v[0]) + exp2(v[0]) * expm1(v[0]); }, {a});
  check("log log2 log1p sqrt rsqrt", [](auto& v) { return log(v[0]) + log2(v[0]) * log1p(v[0]) + sqrt(v[0]) / rsqrt(v[0]); }, {pos});
  check("sin cos tan tanh erf atan", [](auto& v) { return sin(v[0]) * cos(v[0]) + tan(v[0]) - tanh(v[0]) + erf(v[0]) * atan(v[0]); }, {unit});
  check("asin acos", [](auto& v) { return asin(v[0]) + acos(v[0]) * v[0]; }, {unit});
  check("sigmoid silu gelu gelu-tanh", [](auto& v) { return sigmoid(v[0]) + silu(v[0]) + gelu(v[0]) + gelu(v[0], true); }, {a});
  check("abs square reciprocal", [](auto& v) { return abs(v[0]) * square(v[0]) + reciprocal(v[0] + 5.0); }, {a});
  check("add sub mul div, broadcast", [](auto& v) { return (v[0] + v[1]) * (v[0] - v[2]) / (v[1] * v[1] + 1.0); }, {a, b, row});
  check("pow", [](auto& v) { return pow(v[0], v[1]); }, {pos, b});
  check("pow scalar", [](auto& v) { return pow(v[0], 3.0) + pow(2.0, v[0]); }, {a});
  check("maximum minimum", [](auto& v) { return maximum(v[0], v[1]) * 2.0 + minimum(v[0], v[1]); }, {a, b});
  check("where", [](auto& v) { return where(v[0] > v[1], v[0] * v[1], exp(v[1])); }, {a, b});
  check("atan2 hypot", [](auto& v) { return atan2(v[0], v[1]) + hypot(v[0], v[1]); }, {a, b});
  check("fmod", [](auto& v) { return fmod(v[0] * 3.0, v[1]); }, {a, pos});
  // through float32: steps of 1e-2 (float32's rounding would swamp differences of 1e-6)
  check("casts", [](auto& v) { return v[0].to(f32).to(f64) * 2.0; }, {a}, 1e-4, 1e-4, 1e-2);
  check("floor round", [](auto& v) { return floor(v[0] * 3.0) + round(v[0]) + v[0]; }, {a + 0.01});
}

TEST_CASE("autograd: gradcheck of reductions, index maps, products and scans") {
  Tensor a = randn({3, 4}, 21, f64, device()), b = randn({4, 5}, 22, f64, device()), c = randn({2, 3, 4}, 23, f64, device());
  check("sum mean keepdim", [](auto& v) { return sum(v[0], {1}, true) * mean(v[0], {0}, true); }, {a});
  check("var", [](auto& v) { return var(v[0], {1}); }, {a});
  check("prod", [](auto& v) { return prod(v[0], {1}); }, {a});
  check("amax amin", [](auto& v) { return amax(v[0], {1}) + sum(amin(v[0], {0}, true)); }, {a});
  check("max over a dim", [](auto& v) { return max(v[0] * 2.0, {1}); }, {a});
  check("max(dim) values", [](auto& v) { return std::get<0>(max(v[0], 1)); }, {a});
  check("logsumexp softmax log_softmax", [](auto& v) { return logsumexp(v[0], {1}) + sum(softmax(v[0], 1) * log_softmax(v[0], 0), {1}); }, {a});
  check("transpose reshape permute", [](auto& v) { return reshape(transpose(v[0], 0, 2), {4, 6}) * 2.0 + reshape(permute(v[0], {1, 2, 0}), {4, 6}); }, {c});
  check("slice step, flip, concat, stack", [](auto& v) {
    return sum(concat({slice(v[0], 1, 1, 4, 2), flip(v[0], {0})}, 1)) + sum(stack({v[0], v[0] * 2.0}, 0), {0});
  }, {a});
  check("pad, tril, roll, repeat", [](auto& v) { return sum(pad(v[0], {1, 2}, 0.5)) + tril(v[0], 0) * roll(v[0], 1, 1) + sum(repeat(v[0], {2, 1}), {0}, true); }, {a});
  check("matmul", [](auto& v) { return matmul(v[0], v[1]); }, {a, b});
  check("matmul batched and broadcast", [](auto& v) { return matmul(v[0], v[1]); }, {c, b});
  check("matmul vector", [](auto& v) { return matmul(v[0], v[1]); }, {a, randn({4}, 24, f64, device())});
  check("cumsum cumprod logcumsumexp", [](auto& v) { return cumsum(v[0], 1) + cumprod(v[0], 0) + logcumsumexp(v[0], 1); }, {a});
  check("cummax", [](auto& v) { return std::get<0>(cummax(v[0], 1)); }, {a});
  check("topk and sort values", [](auto& v) { return std::get<0>(topk(v[0], 2, -1)) * 2.0 + sum(std::get<0>(sort(v[0], 0))); }, {a});
}

TEST_CASE("autograd: gradcheck of gathers, scatters and the model composites") {
  Tensor w = randn({6, 3}, 31, f64, device()), x = randn({4, 3}, 32, f64, device());
  Tensor ids = from_vector<std::int64_t>({1, 4, 1, 5}, {4}, device());  // repeats: the scatter-add sums them
  Tensor idx2 = from_vector<std::int64_t>({0, 2, 1, 2, 0, 0}, {2, 3}, device());
  check("embedding", [](auto& v) { return embedding(v[0], v[1]) * 2.0; }, {w, ids});
  check("index_select", [](auto& v) { return index_select(v[0], 0, v[1]); }, {w, ids});
  check("gather", [](auto& v) { return gather(v[0], 1, v[1]); }, {w, idx2});
  check("scatter_add", [](auto& v) { return scatter_add(v[0], 0, v[2], v[1]); }, {w, x, from_vector<std::int64_t>({0, 5, 0, 2, 1, 1, 3, 3, 3, 0, 5, 4}, {4, 3}, device())});
  check("index_add", [](auto& v) { return index_add(v[0], 0, v[2], v[1]) * 3.0; }, {w, x, ids});
  check("scatter (overwrite)", [](auto& v) { return scatter(v[0], 0, v[2], v[1]); }, {w, x, from_vector<std::int64_t>({0, 5, 2, 2, 1, 1, 3, 4, 0, 5, 0, 4}, {4, 3}, device())});  // unique per column, as PyTorch requires
  check("masked_fill", [](auto& v) { return masked_fill(v[0], v[0] > 0.0, 2.0) * v[0]; }, {x});
  Tensor lw = randn({3}, 33, f64, device()), lb = randn({3}, 34, f64, device());
  check("layer_norm", [](auto& v) { return layer_norm(v[0], v[1], v[2]); }, {x, lw, lb}, 1e-5, 1e-3);
  check("rms_norm", [](auto& v) { return rms_norm(v[0], v[1]); }, {x, lw}, 1e-5, 1e-3);
  Tensor x3 = randn({2, 3, 4}, 35, f64, device()), w4 = randn({4}, 36, f64, device());
  check("layer_norm and rms_norm over 3-D, with and without affine", [](auto& v) {
    return layer_norm(v[0]) * 2.0 + rms_norm(v[0]) + layer_norm(v[0], v[1]) * rms_norm(v[0], v[1]);
  }, {x3, w4}, 1e-5, 1e-3);
  Tensor targets = from_vector<std::int64_t>({2, 0, -100, 1}, {4}, device());
  check("cross_entropy (an ignored row)", [](auto& v) { return cross_entropy(v[0], v[1]); }, {x, targets});
  check("relu(x @ w) the quickstart", [](auto& v) { return relu(matmul(v[0], v[1])); }, {x, transpose(w, 0, 1)});
}

TEST_CASE("autograd::grad, kiln::grad and value_and_grad") {
  Tensor x = vals({1, 2, 3}, {3}).requires_grad_(), y = vals({4, 5, 6}, {3}).requires_grad_();
  Tensor out = sum(x * y);
  std::vector<Tensor> g = autograd::grad({out}, {x, y});
  CHECK(g[0].to_vector<double>() == std::vector<double>{4, 5, 6});
  CHECK(g[1].to_vector<double>() == std::vector<double>{1, 2, 3});
  CHECK_FALSE(x.grad().defined());  // autograd::grad leaves .grad alone
  Tensor unused = vals({1}, {1}).requires_grad_();
  CHECK_THROWS_AS(autograd::grad({sum(x * 2.0)}, {unused}), AutogradError);
  CHECK_FALSE(autograd::grad({sum(x * 2.0)}, {unused}, {}, false, true)[0].defined());
  // An interior node's gradient.
  Tensor h = x * x;
  CHECK(autograd::grad({sum(h * 3.0)}, {h})[0].to_vector<double>() == std::vector<double>{3, 3, 3});

  auto f = [](const Tensor& a, const Tensor& b) { return sum(a * a * b); };
  Tensor a = vals({1, 2}, {2}), b = vals({3, 4}, {2});
  auto [value, grads] = value_and_grad(f, {0, 1})(a, b);
  CHECK(value.item<double>() == 3 + 16);
  CHECK(grads[0].to_vector<double>() == std::vector<double>{6, 16});
  CHECK(grads[1].to_vector<double>() == std::vector<double>{1, 4});
  CHECK(kiln::grad(f)(a, b)[0].to_vector<double>() == std::vector<double>{6, 16});
  CHECK_FALSE(a.requires_grad());  // the arguments are not marked
  CHECK_THROWS_AS(kiln::grad([](const Tensor& t) { return t * 2.0; })(a), AutogradError);
}

TEST_CASE("autograd: one backward of a small model gives the same gradients fused (JIT) and on the reference") {
  auto grads = [](Backend backend) {
    BackendScope scope(backend);
    Tensor X = randn({8, 6}, 51, f32, device()), w1 = randn({6, 5}, 52, f32, device()).requires_grad_(), b1 = zeros({5}, f32, device()).requires_grad_(),
           w2 = randn({5, 3}, 53, f32, device()).requires_grad_();
    Tensor targets = from_vector<std::int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8}, device());
    Tensor h = matmul(X, w1) + b1;
    std::vector<std::vector<float>> out;
    for (int part = 0; part < 4; ++part) {
      for (Tensor* p : {&w1, &b1, &w2}) p->zero_grad_();
      Tensor y = part == 0 ? sum(h * h) : part == 1 ? sum(layer_norm(h)) * 0.0 + sum(layer_norm(h) * layer_norm(h) * 0.5)
                 : part == 2 ? sum(gelu(h)) : cross_entropy(matmul(gelu(layer_norm(h)), w2), targets);
      y.backward(Tensor(), true);
      out.push_back(w1.grad().to_vector<float>());
      out.push_back(b1.grad().defined() ? b1.grad().to_vector<float>() : std::vector<float>{});
    }
    return out;
  };
  std::vector<std::vector<float>> jit = grads(Backend::Jit), ref = grads(Backend::Eager);
  for (std::size_t k = 0; k < jit.size(); ++k) {
    CAPTURE(k);
    REQUIRE(jit[k].size() == ref[k].size());
    for (std::size_t i = 0; i < jit[k].size(); ++i) CHECK(jit[k][i] == doctest::Approx(ref[k][i]).epsilon(1e-4));
  }
}

TEST_CASE("autograd: the fused backward (JIT) equals the reference, and an MLP trains to the same losses") {
  auto run = [](Backend backend) {
    BackendScope scope(backend);
    SmallMlp mlp;
    std::vector<double> losses;
    for (int step = 0; step < 50; ++step) losses.push_back(mlp.step(mlp.loss(mlp.X, mlp.targets)));
    return losses;
  };
  std::vector<double> jit = run(Backend::Jit), ref = run(Backend::Eager);
  CHECK(jit.back() < 0.5 * jit.front());  // it learns
  for (std::size_t i = 0; i < jit.size(); ++i) CHECK(jit[i] == doctest::Approx(ref[i]).epsilon(1e-3));
}

TEST_CASE("autograd: kiln::compile of a forward that requires grad compiles its backward with it") {
  Tensor w = randn({4, 3}, 61, f64, device()).requires_grad_(), b = randn({3}, 63, f64, device()).requires_grad_();
  Tensor x = randn({5, 4}, 62, f64, device());
  // Two results: the loss needs the product (saved by the forward graph) and the gelu chain
  // (recomputed in the backward); the logits are differentiated too when used.
  auto forward = kiln::compile([&](const Tensor& in) {
    Tensor logits = gelu(matmul(in, w) + b);
    return std::make_tuple(logits, sum(logits * logits));
  });
  auto eager_grads = [&](double logit_weight) {
    Tensor logits = gelu(matmul(x, w) + b);
    (sum(logits * logits) + sum(logits * logit_weight)).backward();
    std::vector<double> g = w.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
    g.insert(g.end(), gb.begin(), gb.end());
    w.zero_grad_();
    b.zero_grad_();
    return g;
  };
  for (int call = 0; call < 3; ++call) {
    auto [logits, loss] = forward(x);
    REQUIRE(loss.requires_grad());
    REQUIRE(logits.requires_grad());
    const double weight = call;  // both results feed the backward
    (loss + sum(logits * weight)).backward();
    std::vector<double> compiled = w.grad().to_vector<double>(), gb = b.grad().to_vector<double>();
    compiled.insert(compiled.end(), gb.begin(), gb.end());
    w.zero_grad_();
    b.zero_grad_();
    std::vector<double> expected = eager_grads(weight);
    REQUIRE(compiled.size() == expected.size());
    for (std::size_t i = 0; i < compiled.size(); ++i) CHECK(compiled[i] == doctest::Approx(expected[i]).epsilon(1e-12));
    // The backward ran through the result: a second one is PyTorch's error.
    CHECK_THROWS_AS(loss.backward(), AutogradError);
  }
  CompileStats st = forward.stats();
  CHECK(st.traces == 1);
  CHECK(st.graph_breaks == 0);
  CHECK(st.cache_hits == 2);
  {
    NoGradGuard off;  // inference: the grad mode is guarded, so this traces a graph without a backward
    auto [logits, loss] = forward(x);
    CHECK_FALSE(loss.requires_grad());
    CHECK(forward.stats().traces == 2);
  }
  // An argument that requires grad is guarded and receives its gradient.
  Tensor xg = x.detach().requires_grad_();
  auto [logits, loss] = forward(xg);
  loss.backward();
  CHECK(forward.stats().traces == 3);
  Tensor xe = x.detach().requires_grad_();
  Tensor le = gelu(matmul(xe, w) + b);
  sum(le * le).backward();
  std::vector<double> got = xg.grad().to_vector<double>(), want = xe.grad().to_vector<double>();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
}

TEST_CASE("autograd: a compiled forward keeps a linear's output (product plus bias), not the product under it") {
  // The gelu's backward reads its input, linear(x, w, b): kept as it is, the backward reads it
  // rather than adding the bias to the kept product again (and views slices of it in place,
  // as attention's q, k and v). A product without a bias is kept itself.
  Tensor w = randn({3, 4}, 64, f64, device()).requires_grad_(), b = randn({3}, 65, f64, device()).requires_grad_();
  Tensor x = randn({2, 32, 4}, 66, f64, device());  // the bias a 16th of the output or less
  auto saved_ops = [&](const Tensor& y) {
    kiln::detail::PendingBackward p = kiln::detail::trace_backward({y}, {&x});
    std::vector<ir::Op> ops;
    for (const ir::NodePtr& n : p.saved) ops.push_back(n->op);
    return ops;
  };
  CHECK(saved_ops(gelu(linear(x, w, b))) == std::vector<ir::Op>{ir::Op::Add});
  CHECK(saved_ops(gelu(linear(x, w))) == std::vector<ir::Op>{ir::Op::MatMul});
}

TEST_CASE("autograd: a compiled forward saves a residual stream's adds where recomputing them reads three values") {
  // h1 = x + x W0, h2 = h1 + h1 W1, ...: the weight gradients read every h. Recomputed from what
  // the forward keeps anyway (the products), h_l would read l + 1 values; decided from the
  // inputs up, h2 (x, x W0, h1 W1) and h4 (h2, h2 W2, h3 W3) are saved, h1 and h3 are recomputed
  // from two values each (x W0 and h2 W2 kept for that: the other products only fed saved adds).
  // The last value, read by one forward value, is never a branch point. Nothing in this linear
  // chain's gradient flow reads a product itself.
  std::vector<Tensor> w;
  for (int l = 0; l < 5; ++l) w.push_back(randn({16, 16}, 90 + l, f64, device()).requires_grad_());
  Tensor x = randn({64, 16}, 89, f64, device()).eval();  // an argument: realized
  std::vector<Tensor> h{x};
  for (int l = 0; l < 5; ++l) h.push_back(h.back() + matmul(h.back(), w[static_cast<std::size_t>(l)]));
  Tensor y = sum(h.back() * 2.0);
  kiln::detail::PendingBackward p = kiln::detail::trace_backward({y}, {&x});
  std::vector<const ir::Node*> adds;
  int products = 0;
  for (const ir::NodePtr& n : p.saved) {
    if (n->op == ir::Op::Add) adds.push_back(n.get());
    products += n->op == ir::Op::MatMul;
  }
  CHECK(products == 2);
  REQUIRE(adds.size() == 2);
  std::sort(adds.begin(), adds.end());
  std::vector<const ir::Node*> want{h[2].node().get(), h[4].node().get()};
  std::sort(want.begin(), want.end());
  CHECK(adds == want);
}

TEST_CASE("autograd: gradients of disjoint slices of one value join as one concatenation; overlapping ones add") {
  // Columns 0..3, 4..6 and 8..9 of x read with weights 2, 3 and 5 (column 7 unread): the three
  // zero-padded gradients merge into one concatenation, cut where the parts end (a zero part
  // for column 7), as PyTorch's split backward gives. Slices that overlap are summed.
  auto gradient_of = [&](auto loss_of) {
    Tensor x = randn({3, 10}, 81, f64, device()).requires_grad_();
    Tensor loss = loss_of(x);
    std::vector<autodiff::Reached> reached = autodiff::backward_pass(
        {loss.node()}, {ir::constant(1.0, f64, loss.shape(), device())}, {x.node()}, true, "test");
    REQUIRE(reached.size() == 1);
    const ir::Op op = reached[0].grad->op;
    loss.backward();
    return std::make_pair(op, x.grad().to_vector<double>());
  };
  auto [joined, g] = gradient_of([](const Tensor& x) {
    return sum(slice(x, 1, 0, 4) * 2.0) + sum(slice(x, 1, 4, 7) * 3.0) + sum(slice(x, 1, 8, 10) * 5.0);
  });
  CHECK(joined == ir::Op::Concat);
  const double column[10] = {2, 2, 2, 2, 3, 3, 3, 0, 5, 5};
  REQUIRE(g.size() == 30);
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == column[i % 10]);
  auto [added, h] = gradient_of([](const Tensor& x) { return sum(slice(x, 1, 0, 6)) + sum(slice(x, 1, 4, 10)); });
  CHECK(added == ir::Op::Add);
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(h[i] == (i % 10 == 4 || i % 10 == 5 ? 2.0 : 1.0));
}

TEST_CASE("autograd: a compiled model trains as the uncompiled one (50 SGD steps of an MLP)") {
  auto run = [](bool compiled) {
    SmallMlp mlp;  // b1 is a lazy zeros when marked: the trace evaluates it, so updates reach the replays
    auto compiled_model = kiln::compile([&mlp](const Tensor& x, const Tensor& t) { return mlp.loss(x, t); });
    std::vector<double> losses;
    for (int step = 0; step < 50; ++step)
      losses.push_back(mlp.step(compiled ? compiled_model(mlp.X, mlp.targets) : mlp.loss(mlp.X, mlp.targets)));
    if (compiled) {
      CHECK(compiled_model.stats().traces == 1);  // parameters updated in place: one trace serves every step
      CHECK(compiled_model.stats().graph_breaks == 0);
    }
    return losses;
  };
  std::vector<double> eager = run(false), compiled = run(true);
  CHECK(compiled.back() < 0.5 * compiled.front());
  for (std::size_t i = 0; i < eager.size(); ++i) CHECK(compiled[i] == doctest::Approx(eager[i]).epsilon(1e-4));
}

TEST_CASE("autograd: backward() inside a compiled function is a graph break that still trains; fullgraph refuses it") {
  Tensor w = randn({4, 3}, 61, f64, device()).requires_grad_();
  Tensor x = randn({5, 4}, 62, f64, device());
  auto step = kiln::compile([&w](const Tensor& in) {
    Tensor loss = sum(relu(matmul(in, w)));
    loss.backward();
    return loss.detach();
  });
  for (int call = 0; call < 2; ++call) {
    Tensor loss = step(x);
    std::vector<double> compiled = w.grad().to_vector<double>();
    w.zero_grad_();
    sum(relu(matmul(x, w))).backward();
    CHECK(compiled == w.grad().to_vector<double>());
    w.zero_grad_();
  }
  CHECK(step.stats().graph_breaks >= 1);
  CompileOptions strict;
  strict.fullgraph = true;
  auto refused = kiln::compile([&w](const Tensor& in) {
    Tensor loss = sum(matmul(in, w));
    loss.backward();
    return loss.detach();
  }, strict);
  CHECK_THROWS_AS(refused(x), GraphBreakError);
}

TEST_CASE("autograd: a compiled step returns its loss beside autograd::grad's gradients, as the eager call does") {
  // The loss's graph is freed by the function's own autograd::grad: compiled, the step traces
  // forward and backward as one graph, derives no second backward for the loss (kiln::compile
  // raised "backward through the graph a second time" when it tried), and returns the loss as
  // eager code does: requiring grad, a backward through it an error.
  Tensor w = randn({4, 3}, 81, f64, device()).requires_grad_();
  auto fn = [&w](const Tensor& in) {
    Tensor loss = sum(relu(matmul(in, w)));
    std::vector<Tensor> g = autograd::grad({loss}, {w});
    return std::make_tuple(loss, g[0]);
  };
  auto step = kiln::compile(fn);
  for (std::uint64_t call = 0; call < 2; ++call) {
    Tensor x = randn({5, 4}, 82 + call, f64, device());
    auto [loss, dw] = step(x);
    auto [eager_loss, eager_dw] = fn(x);
    CHECK(std::abs(loss.item<double>() - eager_loss.item<double>()) <= 1e-12 * std::abs(eager_loss.item<double>()));
    const std::vector<double> got = dw.to_vector<double>(), want = eager_dw.to_vector<double>();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-12 * (1 + std::abs(want[i])));
    CHECK(loss.requires_grad() == eager_loss.requires_grad());
    CHECK_THROWS_AS(loss.backward(), AutogradError);
    CHECK_THROWS_AS(eager_loss.backward(), AutogradError);
  }
  CHECK(step.stats().traces == 1);
  CHECK(step.stats().graph_breaks == 0);
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("autograd: an MLP block's backward reads weights and activations transposed in place: five products") {
  // y = gelu(x W1^T + b1) W2^T + b2 (a linear layer twice) and its gradients with respect to
  // the four parameters, compiled as one graph: two forward products and three backward ones
  // (dh, dW2, dW1; x needs none), each reading a transposed weight, activation or gradient
  // through its strides (no copies), the weight gradients computed in the weights' own layout.
  Tensor x = randn({16, 8}, 71, f32, device()).eval(), gy = randn({16, 8}, 76, f32, device()).eval();
  Tensor W1 = randn({24, 8}, 72, f32, device()).eval().requires_grad_(),
         b1 = randn({24}, 73, f32, device()).eval().requires_grad_(),
         W2 = randn({8, 24}, 74, f32, device()).eval().requires_grad_(),
         b2 = randn({8}, 75, f32, device()).eval().requires_grad_();
  auto block = [&](const Tensor& in) {
    return matmul(gelu(matmul(in, transpose(W1, 0, 1)) + b1, true), transpose(W2, 0, 1)) + b2;
  };
  auto step = kiln::compile([&](const Tensor& in, const Tensor& g) {
    Tensor y = block(in);
    std::vector<Tensor> d = autograd::grad({y}, {W1, b1, W2, b2}, {g});
    return std::make_tuple(y.detach(), d[0], d[1], d[2], d[3]);
  });
  const std::string plan = kiln::explain(step, x, gy);
  std::size_t products = 0;
  for (std::size_t at = plan.find("call matmul"); at != std::string::npos; at = plan.find("call matmul", at + 1)) ++products;
  CHECK_MESSAGE(products == 5, plan);
  CHECK_MESSAGE(plan.find("permute") == std::string::npos, plan);
  auto [y, dW1, db1, dW2, db2] = step(x, gy);
  block(x).backward(gy);
  const std::vector<std::pair<Tensor, Tensor>> pairs{{dW1, W1.grad()}, {db1, b1.grad()}, {dW2, W2.grad()}, {db2, b2.grad()}};
  for (const auto& [got, want] : pairs) {
    REQUIRE(got.shape() == want.shape());
    std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-4));
  }
}

TEST_CASE("autograd: a bfloat16 linear-GELU-linear block over sequences trains as in float64 (the GPU's fused epilogues)") {
  // On a GPU (unless KILN_CUBLASLT_TRAINING_EPILOGUES=0) the first product's bias and GELU
  // join its cuBLASLt call, which keeps the GELU's input, and the backward's product for the
  // GELU's output gradient applies the GELU's derivative there (GELU_AUX_BIAS, DGELU);
  // otherwise kernels do.
  // Either way the values and all five gradients must agree with the same block in float64 on
  // the host, within bfloat16's rounding.
  const Device host = Device::cpu();
  // Values a bfloat16 holds exactly, so both sides start from the same numbers.
  auto leaf = [&](const Shape& shape, std::uint64_t seed, double scale) {
    return (randn(shape, seed, f64, host) * scale).to(bf16).to(f64).eval();
  };
  std::vector<Tensor> ref{leaf({2, 8, 16}, 81, 1.0), leaf({64, 16}, 82, 0.25), leaf({64}, 83, 0.25),
                          leaf({16, 64}, 84, 0.25), leaf({16}, 85, 0.25)};
  const Tensor gy = leaf({2, 8, 16}, 86, 1.0);
  std::vector<Tensor> low;
  for (Tensor& t : ref) {
    low.push_back(t.to(bf16).to(device()).eval().requires_grad_());
    t.requires_grad_();
  }
  auto block = [](const std::vector<Tensor>& p) {
    return nn::functional::linear(gelu(nn::functional::linear(p[0], p[1], p[2]), true), p[3], p[4]);
  };
  Tensor y_ref = block(ref), y = block(low);
  y_ref.backward(gy);
  y.backward(gy.to(bf16).to(device()));
  auto close = [](const Tensor& got, const Tensor& want, double tol) {
    std::vector<double> a = got.to(f64).to(Device::cpu()).to_vector<double>(), b = want.to_vector<double>();
    REQUIRE(a.size() == b.size());
    double scale = 0;
    for (double v : b) scale = std::max(scale, std::fabs(v));
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(a[i] - b[i]) <= tol * (scale + 1));
  };
  close(y, y_ref, 0.02);
  for (std::size_t k = 0; k < ref.size(); ++k) {
    CAPTURE(k);
    close(low[k].grad(), ref[k].grad(), 0.03);
  }
}

TEST_CASE("autograd: a weight read as cast(W^T) gets its gradient as a product in its own layout") {
  // Autocast reads a tied head's weight as cast(W^T) to bfloat16: its gradient is the product
  // g^T x cast back (the shape of W), not a [K, N] product transposed, whose transpose a later
  // sum (the embedding's own gradient) would read across rows.
  Tensor W = randn({6, 4}, 91, f32, device()).eval().requires_grad_();
  Tensor x = randn({5, 4}, 92, f32, device()).eval();
  Tensor loss = sum(matmul(x.to(DType::BFloat16), transpose(W, 0, 1).to(DType::BFloat16)).to(f32));
  std::vector<autodiff::Reached> reached = autodiff::backward_pass(
      {loss.node()}, {ir::constant(1.0, f32, loss.shape(), device())}, {W.node()}, true, "test");
  REQUIRE(reached.size() == 1);
  const ir::NodePtr& g = reached[0].grad;
  REQUIRE(g->op == ir::Op::Cast);
  CHECK(g->dtype == f32);
  CHECK(g->inputs[0]->op == ir::Op::MatMul);
  CHECK(g->inputs[0]->shape == W.shape());
  // The value: sum over rows of x (in bf16) for every row of W (all-ones g times x).
  loss.backward();
  std::vector<float> got = W.grad().to_vector<float>(), xs = x.to_vector<float>();
  for (std::int64_t j = 0; j < 6; ++j)
    for (std::int64_t k = 0; k < 4; ++k) {
      double want = 0;
      for (std::int64_t i = 0; i < 5; ++i) want += xs[static_cast<std::size_t>(i * 4 + k)];
      CHECK(got[static_cast<std::size_t>(j * 4 + k)] == doctest::Approx(want).epsilon(2e-2));
    }
}

TEST_CASE("autograd: a compiled forward with a graph break inside still trains (the backward runs through both parts)") {
  Tensor w = randn({4, 3}, 81, f64, device()).eval().requires_grad_();
  Tensor x = randn({5, 4}, 82, f64, device()).eval();
  auto forward = kiln::compile([&w](const Tensor& in) {
    Tensor h = matmul(in, w);
    const double scale = 1.0 / (1.0 + std::abs(sum(h).item<double>()));  // a data read: the graph breaks here
    return sum(gelu(h) * scale * h);
  });
  for (int call = 0; call < 2; ++call) {
    forward(x).backward();
    std::vector<double> compiled = w.grad().to_vector<double>();
    w.zero_grad_();
    Tensor h = matmul(x, w);
    const double scale = 1.0 / (1.0 + std::abs(sum(h).item<double>()));
    sum(gelu(h) * scale * h).backward();
    std::vector<double> eager = w.grad().to_vector<double>();
    w.zero_grad_();
    for (std::size_t i = 0; i < eager.size(); ++i) CHECK(compiled[i] == doctest::Approx(eager[i]).epsilon(1e-12));
  }
  CHECK(forward.stats().graph_breaks >= 1);
}

TEST_CASE("autograd: post-accumulate-grad hooks run after each backward, with the gradient in place, until removed") {
  Tensor w = full(Shape{3}, 2.0f).requires_grad_();
  Tensor v = full(Shape{2}, 1.0f).requires_grad_();
  std::vector<std::string> calls;
  std::vector<float> seen;
  const std::uint64_t id = w.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    calls.push_back("w");
    seen = leaf.grad().to_vector<float>();  // the gradient is already accumulated
  });
  v.register_post_accumulate_grad_hook([&](const Tensor&) { calls.push_back("v"); });
  sum(w * w).backward();
  CHECK(calls == std::vector<std::string>{"w"});  // v took no part
  CHECK(seen == std::vector<float>{4, 4, 4});
  (sum(w) + sum(v * 3.0f)).backward();
  CHECK(calls.size() == 3);
  CHECK(seen == std::vector<float>{5, 5, 5});
  w.remove_post_accumulate_grad_hook(id);
  sum(w).backward();
  CHECK(calls.size() == 3);
  CHECK_THROWS_AS((w * 2.0f).eval().register_post_accumulate_grad_hook([](const Tensor&) {}), AutogradError);
  CHECK_THROWS_AS(full(Shape{1}, 1.0f).register_post_accumulate_grad_hook([](const Tensor&) {}), AutogradError);
}

TEST_CASE("autograd: evaluation groups evaluate the gradients a group at a time, each group's hooks after its graph") {
  Tensor x = randn({4, 8}, 3).eval();
  const Tensor a0 = randn({8, 8}, 4).eval(), b0 = randn({8, 8}, 5).eval(), c0 = randn({8, 2}, 6).eval();
  auto grads = [&](bool grouped, std::vector<std::string>& order, std::vector<std::uint64_t>& graphs) {
    Tensor a = (a0 + 0.0f).eval().requires_grad_(), b = (b0 + 0.0f).eval().requires_grad_();
    Tensor c = (c0 + 0.0f).eval().requires_grad_();
    if (grouped) {  // the last layer first, as DistributedDataParallel's buckets
      c.node()->grad_leaf->evaluation_group = 0;
      b.node()->grad_leaf->evaluation_group = 1;
      a.node()->grad_leaf->evaluation_group = 2;
    }
    for (auto [t, name] : {std::pair{a, "a"}, std::pair{b, "b"}, std::pair{c, "c"}})
      t.register_post_accumulate_grad_hook([&, name = name](const Tensor&) {
        order.push_back(name);
        graphs.push_back(stats().graphs);
      });
    Tensor h = tanh(matmul(x, a));
    Tensor k = tanh(matmul(h, b));
    sum(matmul(k, c) * matmul(k, c)).backward();
    return std::vector<std::vector<float>>{a.grad().to_vector<float>(), b.grad().to_vector<float>(),
                                           c.grad().to_vector<float>()};
  };
  std::vector<std::string> one_order, grouped_order;
  std::vector<std::uint64_t> one_graphs, grouped_graphs;
  const auto one = grads(false, one_order, one_graphs);
  const auto grouped = grads(true, grouped_order, grouped_graphs);
  for (std::size_t i = 0; i < one.size(); ++i)
    for (std::size_t j = 0; j < one[i].size(); ++j) CHECK(grouped[i][j] == doctest::Approx(one[i][j]).epsilon(1e-6));
  CHECK(grouped_order == std::vector<std::string>{"c", "b", "a"});
  // One graph per group, each group's hooks before the next graph; ungrouped, all hooks after one.
  REQUIRE(grouped_graphs.size() == 3);
  CHECK(grouped_graphs[1] == grouped_graphs[0] + 1);
  CHECK(grouped_graphs[2] == grouped_graphs[1] + 1);
  REQUIRE(one_graphs.size() == 3);
  CHECK(one_graphs[0] == one_graphs[2]);
}

TEST_CASE("autograd: a backward writes the loss's gradient over logits nothing else holds; held logits keep their values") {
  // logits = x w, realized (as a compiled model returns them), and loss = cross_entropy(logits,
  // t). The backward computes the logits' gradient where it reads the logits last (for the
  // product giving w's gradient); with nothing else holding the logits it writes the gradient
  // into their memory, so the step holds one [64, 512] buffer where it held two. w's gradient
  // is the same to the bit as with retain_graph (which keeps every saved value intact), and
  // logits a caller still holds keep their values.
  Tensor x = randn({64, 32}, 91, f32, device());
  Tensor targets = (rand({64}, 92, f32, device()) * 511.0f).to(DType::Int64).eval();
  Tensor w0 = (randn({32, 512}, 93, f32, device()) * 0.1f).eval();
  struct Run {
    std::vector<float> grad;
    std::size_t peak = 0;  // host bytes above those in use before the backward
    float loss = 0;
  };
  auto run = [&](bool retain, bool hold) {
    Tensor w = clone(w0).requires_grad_();
    Tensor loss, held;
    std::vector<float> before;
    {
      Tensor logits = matmul(x, w).eval();
      if (hold) {
        held = logits;
        before = logits.to_vector<float>();
      }
      loss = cross_entropy(logits, targets);
    }
    const std::size_t base = runtime::host_allocator_stats().in_use_bytes;
    runtime::reset_host_memory_peak();
    loss.backward({}, retain);
    Run r;
    r.peak = runtime::host_allocator_stats().peak_in_use_bytes - base;
    r.loss = loss.item<float>();  // evaluated with the gradients: it reads the logits first
    if (hold) CHECK(held.to_vector<float>() == before);
    r.grad = w.grad().to_vector<float>();
    return r;
  };
  const Run donated = run(false, false), retained = run(true, false), held = run(false, true);
  CHECK(donated.grad == retained.grad);
  CHECK(held.grad == retained.grad);
  CHECK(donated.loss == retained.loss);
  if (!device().is_cuda()) {
    const std::size_t logits_bytes = 64 * 512 * sizeof(float);
    CHECK(donated.peak + logits_bytes <= retained.peak);
    CHECK(donated.peak + logits_bytes <= held.peak);
  }
}

TEST_CASE("autograd: a value the backward reads, written in place after it was recorded, is an AutogradError") {
  Tensor w = full({3}, 1.0, DType::Float32).eval().requires_grad_();
  Tensor x = arange(3.0).to(DType::Float32).eval();
  Tensor y = w * x;  // the gradient of w reads x
  y.eval();
  x.mul_(2.0);
  CHECK_THROWS_AS(sum(y).backward(), AutogradError);
  // The leaf itself, written under NoGradGuard while a graph that reads it is recorded (as torch).
  Tensor v = arange(3.0).to(DType::Float32).eval().requires_grad_();
  Tensor sq = v * v;
  sq.eval();
  {
    NoGradGuard g;
    v.mul_(2.0);
  }
  CHECK_THROWS_AS(sum(sq).backward(), AutogradError);
  // A write the backward does not read is fine (an add saves nothing), as in PyTorch.
  Tensor u = full({3}, 1.0, DType::Float32).eval().requires_grad_();
  Tensor z = arange(3.0).to(DType::Float32).eval();
  Tensor s = u + z;
  s.eval();
  z.mul_(2.0);
  sum(s).backward();
  CHECK(u.grad().to_vector<float>() == std::vector<float>{1, 1, 1});
  // A new graph after the write records the new version.
  Tensor y2 = w * x;
  sum(y2).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{0, 2, 4});
  // An evaluated tensor computed from one that requires grad: an in-place write into it is not
  // on the tape (exp's rule would read the written values as its saved output: the gradient of
  // exp(w) + 1 came out exp(w) + 1). Refused while recording, nothing written; allowed under
  // NoGradGuard, where the gradient does not see it.
  Tensor e = exp(w);
  e.eval();
  const std::vector<float> before = e.to_vector<float>();
  CHECK_THROWS_AS(e.add_(1.0f), AutogradError);
  CHECK_THROWS_AS(e.assign(e * 2.0f), AutogradError);
  CHECK(e.to_vector<float>() == before);
}

}  // namespace kiln_test_autodiff_autodiff
