// Mixed precision (kiln::AutocastGuard, torch.autocast): the guard's state (nesting, restore,
// disabled and float32 guards, bad dtypes, device filters, per thread); the result dtype of
// every op class under bf16 and f16 (products to the low dtype, the float32 list to float32,
// promote ops to the widest input, the rest unchanged), with and without NoGradGuard; values of
// autocast products and float32 ops against the explicitly cast computation; the typed-assign
// fast path with and without autocast; gradients of an autocast linear layer reaching float32
// leaves as float32; kiln::compile re-tracing when the autocast state changes.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kiln/kiln.hpp>

#include "../support/compile_util.hpp"
#include "../support/device.hpp"

namespace kiln_test_tensor_autocast {

using namespace kiln;
using kiln::testing::device;
using kiln::testing::LogCapture;

namespace {

std::string dt(DType t) { return dtype_name(t); }
template <class E>
std::string dt(const E& e) {
  return dtype_name(Tensor(e).dtype());
}

Tensor rnd(const Shape& s, std::uint64_t seed, DType dtype = f32) { return randn(s, seed, dtype, device()).eval(); }

/// Positive values in (0.5, 1.5) (for log, rsqrt, acos, ...), evaluated.
Tensor pos(const Shape& s, std::uint64_t seed, DType dtype) {
  return (rand(s, seed, f32, device()) * 0.5f + 0.25f).to(dtype).eval();
}

std::vector<float> values(const Tensor& t) { return t.to(f32).to_vector<float>(); }

/// The other device kind than the one under test (a filter that must not match it).
Device::Kind other_kind() { return device().is_cpu() ? Device::Kind::CUDA : Device::Kind::CPU; }

}  // namespace

TEST_CASE("autocast: the guard's state nests, restores, and is per thread") {
  CHECK_FALSE(is_autocast_enabled());
  CHECK(get_autocast_dtype() == bf16);
  CHECK(get_autocast_dtype(Device::Kind::CPU) == bf16);
  CHECK(get_autocast_dtype(Device::Kind::CUDA) == f16);
  {
    kiln::AutocastGuard amp(bf16);  // the spelling
    CHECK(is_autocast_enabled());
    CHECK(is_autocast_enabled(Device::Kind::CPU));
    CHECK(is_autocast_enabled(Device::Kind::CUDA));
    CHECK(get_autocast_dtype() == bf16);
    {
      AutocastGuard inner(f16);
      CHECK(get_autocast_dtype() == f16);
      CHECK(get_autocast_dtype(Device::Kind::CUDA) == f16);
      CHECK(get_autocast_dtype(Device::Kind::CPU) == f16);
      {
        AutocastGuard off(f16, false);  // torch.autocast(enabled=False) inside a region
        CHECK_FALSE(is_autocast_enabled());
      }
      {
        AutocastGuard full(f32);  // float32: autocast has nothing to do
        CHECK_FALSE(is_autocast_enabled());
      }
      CHECK(is_autocast_enabled());
    }
    CHECK(get_autocast_dtype() == bf16);
    CHECK(get_autocast_dtype(Device::Kind::CPU) == bf16);
    bool other_thread = true;
    std::thread([&] { other_thread = is_autocast_enabled(); }).join();
    CHECK_FALSE(other_thread);
  }
  CHECK_FALSE(is_autocast_enabled());
  CHECK(get_autocast_dtype(Device::Kind::CUDA) == f16);
  {
    AutocastGuard cuda_only(Device::cuda(), bf16);
    CHECK(is_autocast_enabled());
    CHECK(is_autocast_enabled(Device::Kind::CUDA));
    CHECK_FALSE(is_autocast_enabled(Device::Kind::CPU));
    CHECK(get_autocast_dtype(Device::Kind::CUDA) == bf16);
    CHECK(get_autocast_dtype(Device::Kind::CPU) == bf16);
  }
  CHECK_FALSE(is_autocast_enabled());
  CHECK_THROWS_AS(AutocastGuard{i32}, DTypeError);
  CHECK_THROWS_AS(AutocastGuard{f64}, DTypeError);
  CHECK_THROWS_AS(AutocastGuard(Device::Kind::CPU, bool_), DTypeError);
  CHECK_THROWS_WITH_AS(AutocastGuard{i64}, doctest::Contains("int64"), DTypeError);
  CHECK_FALSE(is_autocast_enabled());  // a refused guard changed nothing
}

TEST_CASE("autocast: result dtypes of every op class") {
  for (DType low : {bf16, f16}) {
    for (bool no_grad : {false, true}) {
      CAPTURE(dt(low));
      CAPTURE(no_grad);
      std::optional<NoGradGuard> ng;
      if (no_grad) ng.emplace();
      Tensor a = rnd({4, 3}, 1), b = rnd({3, 5}, 2), c = rnd({4, 5}, 3);
      Tensor a3 = rnd({2, 4, 3}, 4), b3 = rnd({2, 3, 5}, 5);
      Tensor w = rnd({5, 3}, 6), bias = rnd({5}, 7);
      Tensor d = rnd({4, 3}, 8, f64), e = rnd({3, 5}, 9, f64);
      Tensor h = pos({4, 6}, 10, low), h2 = pos({4, 6}, 11, low);
      Tensor hw = rnd({6}, 12), hb = rnd({6}, 13);
      Tensor targets = from_vector<std::int64_t>({0, 5, 2, 3}, {4}, device());
      Tensor idx = from_vector<std::int64_t>({0, 1, 0, 1, 0, 1}, {1, 6}, device());

      AutocastGuard amp(low);
      {  // products: f16/bf16/f32 floating inputs to the low dtype, f64 stays
        CHECK(dt(matmul(a, b)) == dt(low));
        CHECK(dt(a.matmul(b)) == dt(low));
        CHECK(dt(matmul(a * 2.0f, b)) == dt(low));  // a typed expression operand
        CHECK(dt(mm(a, b)) == dt(low));
        CHECK(dt(bmm(a3, b3)) == dt(low));
        CHECK(dt(matmul(a3, b)) == dt(low));
        CHECK(dt(addmm(c, a, b)) == dt(low));
        CHECK(dt(linear(a, w, bias)) == dt(low));
        CHECK(dt(linear(a, w)) == dt(low));
        CHECK(dt(einsum("ij,jk->ik", a, b)) == dt(low));
        CHECK(dt(einsum("bij,bjk->bik", a3, b3)) == dt(low));
        CHECK(dt(einsum("ij,ij->ij", a, a)) == dt(low));  // no contraction
        CHECK(dt(einsum("ij,jk->i", a, b)) == dt(low));   // letters summed out inside stay low
        CHECK(dt(einsum("ij->ji", a)) == dt(low));
        // Inputs of two dtypes meet in the low dtype (without autocast: a DTypeError).
        CHECK(dt(matmul(a, b.to(low))) == dt(low));
        CHECK(dt(linear(a.to(low), w, bias)) == dt(low));
        // float64 is never cast.
        CHECK(dt(matmul(d, e)) == "float64");
        CHECK(dt(mm(d, e)) == "float64");
      }
      {  // the float32 list: f16/bf16 inputs give float32
        CHECK(dt(exp(h)) == "float32");
        CHECK(dt(exp(h).dtype()) == "float32");  // the expression's own dtype
        CHECK(dt(log(h)) == "float32");
        CHECK(dt(log2(h)) == "float32");
        CHECK(dt(log1p(h)) == "float32");
        CHECK(dt(expm1(h)) == "float32");
        CHECK(dt(rsqrt(h)) == "float32");
        CHECK(dt(reciprocal(h)) == "float32");
        CHECK(dt(tan(h)) == "float32");
        CHECK(dt(sinh(h)) == "float32");
        CHECK(dt(cosh(h)) == "float32");
        CHECK(dt(acos(h * 0.5f)) == "float32");
        CHECK(dt(asin(h * 0.5f)) == "float32");
        CHECK(dt(pow(h, 2)) == "float32");
        CHECK(dt(pow(h, 0.5f)) == "float32");
        CHECK(dt(pow(h, h2)) == "float32");
        CHECK(dt(square(h)) == "float32");  // torch.square is pow(x, 2)
        CHECK(dt(h.square()) == "float32");
        CHECK(dt(pow(2.0f, h)) == "float32");  // __rpow__
        CHECK(dt(2.0f / h) == "float32");      // __rtruediv__
        CHECK(dt(exp(h * 2.0f) + 1.0f) == "float32");
        CHECK(dt(sum(h)) == "float32");
        CHECK(dt(sum(h, {1}, true)) == "float32");
        CHECK(dt(sum(h * h2)) == "float32");
        CHECK(dt(prod(h, {0})) == "float32");
        CHECK(dt(softmax(h, -1)) == "float32");
        CHECK(dt(log_softmax(h, 1)) == "float32");
        CHECK(dt(logsumexp(h, {1})) == "float32");
        CHECK(dt(layer_norm(h, hw, hb)) == "float32");
        CHECK(dt(layer_norm(h)) == "float32");
        CHECK(dt(layer_norm(h, hw.to(low), hb.to(low))) == "float32");
        CHECK(dt(cross_entropy(h, targets)) == "float32");
        CHECK(dt(cumsum(h, 1)) == "float32");
        CHECK(dt(cumprod(h, 0)) == "float32");
        // The list as torch 2.11's ATen/autocast_mode.h has it: erfinv, softplus, the vector norm.
        CHECK(dt(erfinv(h * 0.1f)) == "float32");
        CHECK(dt(softplus(h)) == "float32");
        CHECK(dt(linalg::vector_norm(h)) == "float32");
        CHECK(dt(norm(h, 2.0, {1})) == "float32");
        CHECK(dt(nn::functional::normalize(h)) == "float32");  // through the norm, as torch's
        // An explicit dtype is respected (torch's fp32_set_opt_dtype).
        CHECK(dt(cumsum(h, 1, low)) == dt(low));
        // f32 and f64 inputs keep their dtype; integers follow the usual rules.
        CHECK(dt(exp(a)) == "float32");
        CHECK(dt(exp(d)) == "float64");
        CHECK(dt(sum(d)) == "float64");
        CHECK(dt(sum(targets)) == "int64");
        CHECK(dt(pow(targets, 2)) == "int64");
      }
      {  // promote ops run in the widest input
        Tensor base = zeros({2, 6}, low, device());
        CHECK(dt(scatter_add(base, 0, idx, rnd({1, 6}, 14))) == "float32");
        CHECK(dt(scatter_add(zeros({2, 6}, f32, device()), 0, idx, pos({1, 6}, 15, low))) == "float32");
        CHECK(dt(scatter_add(base, 0, idx, pos({1, 6}, 15, low))) == dt(low));
        // Already promoting without autocast (as torch's cat, stack, atan2): unchanged.
        CHECK(dt(concat({h, rnd({1, 6}, 16)}, 0)) == "float32");
        CHECK(dt(stack({h, rnd({4, 6}, 17)}, 0)) == "float32");
        CHECK(dt(atan2(h, rnd({4, 6}, 18))) == "float32");
        CHECK(dt(atan2(h, h2)) == dt(low));
        // dot, tensordot and cross are promote ops (not products in the low dtype): float32
        // inputs stay float32, mixed ones meet in the widest.
        CHECK(dt(dot(rnd({6}, 19), rnd({6}, 20))) == "float32");
        CHECK(dt(dot(select(h, 0, 0), rnd({6}, 20))) == "float32");
        CHECK(dt(dot(select(h, 0, 0), select(h2, 0, 1))) == dt(low));
        CHECK(dt(tensordot(a, b, 1)) == "float32");
        CHECK(dt(tensordot(a.to(low), b.to(low), 1)) == dt(low));
        CHECK(dt(cross(narrow(h, 1, 0, 3), rnd({4, 3}, 21), 1)) == "float32");
        const Tensor row = from_vector<std::int64_t>({2}, {1}, device());
        CHECK(dt(index_put(h, {row}, rnd({6}, 22))) == "float32");  // a float32 value widens h
        CHECK(dt(index_put(h, {row}, rnd({6}, 22).to(low))) == dt(low));
      }
      {  // every other op runs in its input's dtype
        CHECK(dt(sin(h)) == dt(low));
        CHECK(dt(cos(h)) == dt(low));
        CHECK(dt(tanh(h)) == dt(low));
        CHECK(dt(sqrt(h)) == dt(low));
        CHECK(dt(exp2(h)) == dt(low));
        CHECK(dt(sigmoid(h)) == dt(low));
        CHECK(dt(relu(h)) == dt(low));
        CHECK(dt(gelu(h)) == dt(low));
        CHECK(dt(silu(h)) == dt(low));
        CHECK(dt(abs(h)) == dt(low));
        CHECK(dt(-h) == dt(low));
        CHECK(dt(h + h2) == dt(low));
        CHECK(dt(h * 2.0f) == dt(low));
        CHECK(dt(h / h2) == dt(low));
        CHECK(dt(h / 2.0f) == dt(low));
        CHECK(dt(where(h > 1.0f, h, h2)) == dt(low));
        CHECK(dt(mean(h)) == dt(low));  // not on torch's list
        CHECK(dt(var(h, {1})) == dt(low));
        CHECK(dt(max(h, Axes{1})) == dt(low));
        CHECK(dt(logcumsumexp(h, 1)) == dt(low));
        CHECK(dt(trace(narrow(h, 1, 0, 4))) == dt(low));  // torch's trace and xlogy are not listed
        CHECK(dt(xlogy(h, h2)) == dt(low));
        CHECK(dt(rms_norm(h)) == dt(low));  // torch's returns its input's dtype (on no list)
        CHECK(dt(rms_norm(h, hw)) == dt(low));
        CHECK(dt(transpose(h, 0, 1)) == dt(low));
        CHECK(dt(c + c.to(low)) == "float32");  // ordinary promotion, unchanged
      }
    }
  }
}

TEST_CASE("autocast: a disabled guard changes nothing; the device filter picks ops by their inputs") {
  Tensor a = rnd({4, 3}, 1), b = rnd({3, 5}, 2), h = pos({4, 6}, 10, bf16);
  {
    AutocastGuard off(bf16, false);
    CHECK(dt(matmul(a, b)) == "float32");
    CHECK(dt(exp(h)) == "bfloat16");
    CHECK(dt(sum(h)) == "bfloat16");
    CHECK_THROWS_AS(matmul(a, b.to(bf16)), DTypeError);  // as without a guard
    CHECK_THROWS_AS(scatter_add(zeros({2, 6}, bf16, device()), 0,
                                from_vector<std::int64_t>({0, 1, 0, 1, 0, 1}, {1, 6}, device()), rnd({1, 6}, 3)),
                    DTypeError);
  }
  {
    AutocastGuard elsewhere(other_kind(), f16);  // another kind of device: not these tensors
    CHECK(is_autocast_enabled());
    CHECK(dt(matmul(a, b)) == "float32");
    CHECK(dt(linear(a, rnd({5, 3}, 6))) == "float32");
    CHECK(dt(exp(h)) == "bfloat16");
    CHECK(dt(softmax(h, -1)) == "bfloat16");
    CHECK(dt(cumsum(h, 0)) == "bfloat16");
  }
  {
    AutocastGuard here(device(), f16);  // the device under test: these tensors
    CHECK(dt(matmul(a, b)) == "float16");
    CHECK(dt(exp(h)) == "float32");
    CHECK(dt(softmax(h, -1)) == "float32");
    {
      AutocastGuard elsewhere(other_kind(), bf16);  // leaves this device's state alone
      CHECK(dt(matmul(a, b)) == "float16");
      CHECK(dt(exp(h)) == "float32");
    }
    {
      AutocastGuard here_off(device().kind, f16, false);
      CHECK(dt(matmul(a, b)) == "float32");
    }
    CHECK(dt(matmul(a, b)) == "float16");
  }
  CHECK(dt(matmul(a, b)) == "float32");
  CHECK(dt(exp(h)) == "bfloat16");
}

TEST_CASE("autocast: values equal the explicitly cast computation") {
  Tensor a = rnd({8, 16}, 21), b = rnd({16, 12}, 22), w = rnd({12, 16}, 23), bias = rnd({12}, 24);
  Tensor h = pos({8, 12}, 25, bf16);
  for (DType low : {bf16, f16}) {
    CAPTURE(dt(low));
    Tensor p, l, e, s, sm, ln, ex, lowp;
    {
      AutocastGuard amp(low);
      p = matmul(a, b);
      l = linear(a, w, bias);
      e = einsum("ij,jk->ik", a, b);
      s = sum(h, {1});
      sm = softmax(h, -1);
      ex = exp(h) * 3.0f;
      ln = layer_norm(h, rnd({12}, 26));
    }
    CHECK(p.dtype() == low);
    CHECK(values(p) == values(matmul(a.to(low), b.to(low))));
    CHECK(values(l) == values(linear(a.to(low), w.to(low), bias.to(low))));
    CHECK(values(e) == values(matmul(a.to(low), b.to(low))));
    // Float32 ops compute from the float32 input and keep the float32 result (no rounding).
    CHECK(values(s) == values(sum(h.to(f32), {1})));
    CHECK(values(sm) == values(softmax(h.to(f32), -1)));
    CHECK(values(ex) == values(exp(h.to(f32)) * 3.0f));
    CHECK(values(ln) == values(layer_norm(h.to(f32), rnd({12}, 26))));
    // ... which differs from the rounded 16-bit result without autocast.
    CHECK(values(ex) != values(exp(h) * 3.0f));
    CHECK(values(p) != values(matmul(a, b)));
  }
}

TEST_CASE("autocast: the typed-assign fast path tells autocast expressions apart") {
  Tensor h = pos({64}, 31, bf16);
  const std::vector<float> wide = values(exp(h.to(f32)) * 1.5f + 0.25f);  // autocast: float32 all through
  const std::vector<float> narrow = values(Tensor(exp(h) * 1.5f + 0.25f));  // bfloat16 all through
  REQUIRE(wide != narrow);
  Tensor out = zeros({64}, f32, device()).eval();
  for (int round = 0; round < 2; ++round) {  // the second round runs from the cache
    out.assign(exp(h) * 1.5f + 0.25f);
    CHECK(out.to_vector<float>() == narrow);
    {
      AutocastGuard amp(bf16);
      out.assign(exp(h) * 1.5f + 0.25f);
      CHECK(out.to_vector<float>() == wide);
    }
    out.assign(exp(h) * 1.5f + 0.25f);
    CHECK(out.to_vector<float>() == narrow);
  }
  // The dtypes are decided where the op is written: an expression built under autocast keeps
  // them when it is assigned after the guard has gone.
  auto built = [&] {
    AutocastGuard amp(bf16);
    return exp(h) * 1.5f + 0.25f;
  }();
  CHECK(built.dtype() == f32);
  out.assign(built);
  CHECK(out.to_vector<float>() == wide);
  out.assign(exp(h) * 1.5f + 0.25f);
  CHECK(out.to_vector<float>() == narrow);
}

TEST_CASE("autocast: gradients of an autocast linear layer reach float32 leaves as float32") {
  Tensor x = rnd({6, 8}, 41);
  Tensor targets = from_vector<std::int64_t>({0, 3, 1, 2, 3, 0}, {6}, device());
  for (DType low : {bf16, f16}) {
    CAPTURE(dt(low));
    Tensor w = (rnd({4, 8}, 42) * 0.5f).eval().requires_grad_(), b = rnd({4}, 43).requires_grad_();
    Tensor g = rnd({4}, 44).requires_grad_();
    Tensor loss;
    {
      AutocastGuard amp(low);
      Tensor y = linear(x, w, b);         // low
      Tensor z = layer_norm(y, g);        // float32 (g stays float32)
      loss = cross_entropy(z, targets) + sum(y * y) * 0.01f;  // sum: float32
      CHECK(y.dtype() == low);
      CHECK(z.dtype() == f32);
    }
    CHECK(loss.dtype() == f32);
    loss.backward();
    REQUIRE(w.grad().defined());
    CHECK(w.grad().dtype() == f32);
    CHECK(b.grad().dtype() == f32);
    CHECK(g.grad().dtype() == f32);

    // The same computation with the casts written out.
    Tensor w2 = (rnd({4, 8}, 42) * 0.5f).eval().requires_grad_(), b2 = rnd({4}, 43).requires_grad_();
    Tensor g2 = rnd({4}, 44).requires_grad_();
    Tensor y2 = linear(x.to(low), w2.to(low), b2.to(low));
    Tensor z2 = layer_norm(y2.to(f32), g2);
    Tensor loss2 = cross_entropy(z2, targets) + sum((y2 * y2).to(f32)) * 0.01f;
    loss2.backward();
    CHECK(loss.item<float>() == loss2.item<float>());
    CHECK(values(w.grad()) == values(w2.grad()));
    CHECK(values(b.grad()) == values(b2.grad()));
    CHECK(values(g.grad()) == values(g2.grad()));
    // ... and not the float32 computation's gradient.
    Tensor w3 = (rnd({4, 8}, 42) * 0.5f).eval().requires_grad_();
    Tensor y3 = linear(x, w3, b2.detach());
    (cross_entropy(layer_norm(y3, g2.detach()), targets) + sum(y3 * y3) * 0.01f).backward();
    CHECK(values(w.grad()) != values(w3.grad()));
  }
}

TEST_CASE("autocast: kiln::compile re-traces when the autocast state changes") {
  LogCapture logs("recompiles");
  auto f = kiln::compile([](const Tensor& a, const Tensor& b) { return softmax(matmul(a, b), -1); });
  Tensor a = rnd({8, 16}, 51), b = rnd({16, 12}, 52);
  const std::vector<float> plain = values(softmax(matmul(a, b), -1));
  const std::vector<float> bf = values(softmax(matmul(a.to(bf16), b.to(bf16)).to(f32), -1));
  const std::vector<float> hf = values(softmax(matmul(a.to(f16), b.to(f16)).to(f32), -1));
  REQUIRE(plain != bf);

  Tensor r = f(a, b);
  CHECK(r.dtype() == f32);
  CHECK(values(r) == plain);
  {
    AutocastGuard amp(bf16);
    r = f(a, b);
    CHECK(r.dtype() == f32);  // softmax: float32 again
    CHECK(values(r) == bf);
  }
  CHECK(f.stats().recompiles == 1);
  CHECK(values(f(a, b)) == plain);  // the first entry again: a hit, not a trace
  CHECK(f.stats().recompiles == 1);
  {
    AutocastGuard amp(bf16);
    CHECK(values(f(a, b)) == bf);
  }
  CHECK(f.stats().recompiles == 1);
  {
    AutocastGuard amp(f16);  // another dtype: another entry
    CHECK(values(f(a, b)) == hf);
  }
  CHECK(f.stats().recompiles == 2);
  {
    AutocastGuard off(bf16, false);  // off: the first entry's state
    CHECK(values(f(a, b)) == plain);
  }
  {
    AutocastGuard elsewhere(other_kind(), bf16);  // on, but not for these tensors' device
    CHECK(values(f(a, b)) == plain);
  }
  CHECK(f.stats().recompiles == 3);  // the state differs (a guard cannot know the inputs' devices)
  CHECK(logs.text().find("recompiling: autocast changed (now ") != std::string::npos);

  // The product's own dtype comes back from a compiled call.
  auto g = kiln::compile([](const Tensor& a, const Tensor& b) { return matmul(a, b); });
  CHECK(g(a, b).dtype() == f32);
  {
    AutocastGuard amp(bf16);
    Tensor p = g(a, b);
    CHECK(p.dtype() == bf16);
    CHECK(values(p) == values(matmul(a.to(bf16), b.to(bf16))));
  }
  CHECK(g(a, b).dtype() == f32);
  CHECK(g.stats().recompiles == 1);
}

}  // namespace kiln_test_tensor_autocast
