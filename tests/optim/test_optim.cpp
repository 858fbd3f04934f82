// Optimizers (kiln::optim): SGD, Adam and AdamW over three steps against their update
// equations computed in double here (momentum, dampening, nesterov, weight decay, maximize,
// amsgrad, decoupled decay), with parameters of several shapes, one that never gets a gradient
// and one that gets its first only later; the gradient homes (zero_grad, refill, accumulation);
// the fused update's kernel count and no recompiles while a scheduler changes lr; state_dict
// round trips and load_state_dict's errors; every scheduler's lr sequence against PyTorch's
// values; clip_grad_norm_ and clip_grad_value_; GradScaler's scaling, skipped steps, backoff and
// growth; and the constructors' checks.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/optim/optim.hpp>

#include "../support/device.hpp"

namespace kiln_test_optim_optim {

using namespace kiln;
using kiln::testing::device;
using Vec = std::vector<double>;

namespace {

Tensor param(const Vec& v, const Shape& s, DType dtype = f32) {
  return from_vector<double>(v, s, device()).to(dtype).eval().requires_grad_();
}

void check_close(const Vec& got, const Vec& want, double tol = 2e-5) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

/// Backward of sum_i sum(p_i * G_i): each p_i gets the gradient G_i.
void backward_with(const std::vector<Tensor>& ps, const std::vector<Vec>& gs) {
  Tensor loss;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    Tensor term = sum(ps[i] * from_vector<double>(gs[i], ps[i].shape(), device()).to(ps[i].dtype()));
    loss = loss.defined() ? Tensor(loss + term) : term;
  }
  loss.backward();
}

/// Whether kernels are compiled (the counts of launches below are kernels then).
bool fused_kernels() {
  return get_backend() != Backend::Eager &&
         (!device().is_cpu() || backend::entry::cpu_uses_jit(backend::Mode::Auto));
}

// ---- the update equations, in double ---------------------------------------------------------

struct RefState {
  Vec buf, m, v, vmax;
  bool has_buf = false;
  int step = 0;
};

void ref_sgd(const optim::SGDOptions& o, Vec& p, Vec g, RefState& s) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (o.maximize) g[i] = -g[i];
    if (o.weight_decay != 0) g[i] += o.weight_decay * p[i];
  }
  if (o.momentum != 0) {
    if (!s.has_buf) {
      s.buf = g;
      s.has_buf = true;
    } else {
      for (std::size_t i = 0; i < p.size(); ++i) s.buf[i] = o.momentum * s.buf[i] + (1 - o.dampening) * g[i];
    }
    for (std::size_t i = 0; i < p.size(); ++i) g[i] = o.nesterov ? g[i] + o.momentum * s.buf[i] : s.buf[i];
  }
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= o.lr * g[i];
}

struct AdamRef {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, maximize, decoupled;
};

void ref_adam(const AdamRef& o, Vec& p, Vec g, RefState& s) {
  const std::size_t n = p.size();
  if (s.step == 0) s.m = s.v = s.vmax = Vec(n, 0.0);
  const int t = ++s.step;
  for (std::size_t i = 0; i < n; ++i) {
    if (o.maximize) g[i] = -g[i];
    if (o.decoupled)
      p[i] *= 1 - o.lr * o.weight_decay;
    else
      g[i] += o.weight_decay * p[i];
    s.m[i] = o.beta1 * s.m[i] + (1 - o.beta1) * g[i];
    s.v[i] = o.beta2 * s.v[i] + (1 - o.beta2) * g[i] * g[i];
    s.vmax[i] = std::max(s.vmax[i], s.v[i]);
    const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    const double denom = std::sqrt(o.amsgrad ? s.vmax[i] : s.v[i]) / std::sqrt(bc2) + o.eps;
    p[i] -= o.lr / bc1 * s.m[i] / denom;
  }
}

AdamRef adam_ref(const optim::AdamOptions& o) {
  return {o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, o.amsgrad, o.maximize, false};
}
AdamRef adamw_ref(const optim::AdamWOptions& o) {
  return {o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay, o.amsgrad, o.maximize, true};
}

/// When the fourth parameter gets a gradient: at every step, never, or from the second on.
enum class Fourth { Always, Never, Late };

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;
using Ref = std::function<void(Vec&, const Vec&, RefState&)>;

/// Three steps of the optimizer `make` builds over parameters of shapes [2, 3], [4], [] and
/// [3], against `ref`. The gradients are multiples of 1/4 (exact in float32) and shrink after
/// the first step (so that amsgrad's maximum matters).
void run_against_reference(const MakeOpt& make, const Ref& ref, Fourth fourth) {
  const std::vector<Shape> shapes{{2, 3}, {4}, {}, {3}};
  const std::vector<Vec> init{{0.5, -1.0, 1.5, 2.0, -0.25, 0.75}, {1.0, -2.0, 0.25, 0.0}, {0.75}, {1.0, 2.0, 3.0}};
  std::vector<Tensor> ps;
  for (std::size_t i = 0; i < shapes.size(); ++i) ps.push_back(param(init[i], shapes[i]));
  std::unique_ptr<optim::Optimizer> opt = make(ps);
  std::vector<Vec> want = init;
  std::vector<RefState> state(ps.size());
  const double scale[3] = {2.0, 0.5, -0.25};
  for (int t = 0; t < 3; ++t) {
    INFO("step " << t);
    std::vector<Tensor> with;
    std::vector<Vec> grads;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      if (i == 3 && (fourth == Fourth::Never || (fourth == Fourth::Late && t == 0))) continue;
      Vec g;
      for (std::size_t j = 0; j < init[i].size(); ++j)
        g.push_back((static_cast<double>(j % 3) - 1.0 + 0.25 * static_cast<double>(i + 1)) * scale[t]);
      with.push_back(ps[i]);
      grads.push_back(g);
    }
    opt->zero_grad();
    backward_with(with, grads);
    opt->step();
    for (std::size_t k = 0; k < with.size(); ++k) {
      const std::size_t i = k < 3 ? k : 3;
      ref(want[i], grads[k], state[i]);
    }
    for (std::size_t i = 0; i < ps.size(); ++i) {
      INFO("parameter " << i);
      check_close(ps[i].to_vector<double>(), want[i]);
    }
  }
  if (fourth == Fourth::Never) {
    CHECK(ps[3].to_vector<double>() == init[3]);
    CHECK(!ps[3].grad().defined());
    for (const std::string& k : opt->state_dict().keys()) CHECK(k.rfind("state.3.", 0) != 0);
  }
}

MakeOpt sgd(optim::SGDOptions o) {
  return [o](const std::vector<Tensor>& ps) { return std::make_unique<optim::SGD>(ps, o); };
}
Ref sgd_ref(optim::SGDOptions o) {
  return [o](Vec& p, const Vec& g, RefState& s) { ref_sgd(o, p, g, s); };
}

}  // namespace

TEST_CASE("SGD: plain, momentum, dampening, nesterov, weight decay, maximize against the equations") {
  const std::vector<std::pair<const char*, optim::SGDOptions>> configs{
      {"plain", {.lr = 0.1}},
      {"momentum", {.lr = 0.1, .momentum = 0.9}},
      {"dampening", {.lr = 0.1, .momentum = 0.9, .dampening = 0.25}},
      {"nesterov", {.lr = 0.1, .momentum = 0.9, .nesterov = true}},
      {"weight decay", {.lr = 0.1, .weight_decay = 0.05}},
      {"maximize", {.lr = 0.1, .momentum = 0.5, .maximize = true}},
  };
  for (const auto& [name, o] : configs) {
    INFO(name);
    run_against_reference(sgd(o), sgd_ref(o), Fourth::Always);
  }
  SUBCASE("a parameter without a gradient is skipped; one whose buffer starts later") {
    const optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05, .nesterov = true};
    run_against_reference(sgd(o), sgd_ref(o), Fourth::Never);
    run_against_reference(sgd(o), sgd_ref(o), Fourth::Late);
  }
}

TEST_CASE("Adam and AdamW: plain, weight decay, amsgrad, maximize, decoupled decay against the equations") {
  const std::vector<std::pair<const char*, optim::AdamOptions>> configs{
      {"plain", {.lr = 0.01}},
      {"weight decay", {.lr = 0.01, .weight_decay = 0.1}},
      {"amsgrad", {.lr = 0.01, .betas = {0.8, 0.9}, .amsgrad = true}},
      {"maximize", {.lr = 0.01, .eps = 1e-3, .maximize = true}},
  };
  for (const auto& [name, o] : configs) {
    INFO("Adam " << name);
    run_against_reference([o](const std::vector<Tensor>& ps) { return std::make_unique<optim::Adam>(ps, o); },
                          [o](Vec& p, const Vec& g, RefState& s) { ref_adam(adam_ref(o), p, g, s); }, Fourth::Always);
  }
  const optim::AdamWOptions w{.lr = 0.01, .weight_decay = 0.1};
  auto make_w = [w](const std::vector<Tensor>& ps) { return std::make_unique<optim::AdamW>(ps, w); };
  auto ref_w = [w](Vec& p, const Vec& g, RefState& s) { ref_adam(adamw_ref(w), p, g, s); };
  run_against_reference(make_w, ref_w, Fourth::Always);
  SUBCASE("skipped parameters; a parameter whose steps lag behind the others'") {
    const optim::AdamOptions a{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true};
    auto make_a = [a](const std::vector<Tensor>& ps) { return std::make_unique<optim::Adam>(ps, a); };
    auto ref_a = [a](Vec& p, const Vec& g, RefState& s) { ref_adam(adam_ref(a), p, g, s); };
    run_against_reference(make_a, ref_a, Fourth::Never);
    run_against_reference(make_a, ref_a, Fourth::Late);
    run_against_reference(make_w, ref_w, Fourth::Late);
  }
  // AdamW's defaults are torch's: weight_decay 1e-2.
  CHECK(optim::AdamWOptions{}.weight_decay == 1e-2);
  CHECK(optim::AdamOptions{}.weight_decay == 0);
}

TEST_CASE("gradient homes: backward fills them, accumulates in place, zero_grad empties them") {
  Tensor a = param({1, 2, 3, 4}, {2, 2});
  Tensor b = param({5, 6, 7}, {3});
  Tensor w = from_vector<double>({0.5, 1.5, 2.5, 3.5}, {2, 2}, device()).to(f32).eval();
  optim::SGD opt({a, b}, {.lr = 0.5});
  auto loss = [&] { return Tensor(sum(a * w) + sum(b * b)); };
  loss().backward();
  CHECK(a.grad().to_vector<double>() == Vec{0.5, 1.5, 2.5, 3.5});
  CHECK(b.grad().to_vector<double>() == Vec{10, 12, 14});
  // Both gradients live in one flat buffer, in parameter order.
  CHECK(b.grad().data_ptr<float>() == a.grad().data_ptr<float>() + 4);
  float* home = a.grad().data_ptr<float>();
  loss().backward();  // accumulates in place
  CHECK(a.grad().to_vector<double>() == Vec{1, 3, 5, 7});
  CHECK(b.grad().to_vector<double>() == Vec{20, 24, 28});
  CHECK(w.to_vector<double>() == Vec{0.5, 1.5, 2.5, 3.5});  // the gradient was w: copied, not shared
  opt.zero_grad();
  CHECK(!a.grad().defined());
  CHECK(!b.grad().defined());
  sum(a * 3.0f).backward();
  CHECK(a.grad().to_vector<double>() == Vec{3, 3, 3, 3});
  CHECK(a.grad().data_ptr<float>() == home);
  CHECK(!b.grad().defined());
  opt.step();  // b has no gradient: unchanged
  CHECK(a.to_vector<double>() == Vec{-0.5, 0.5, 1.5, 2.5});
  CHECK(b.to_vector<double>() == Vec{5, 6, 7});
  opt.zero_grad(false);  // defined gradients become zeros, undefined ones stay undefined
  CHECK(a.grad().to_vector<double>() == Vec{0, 0, 0, 0});
  CHECK(!b.grad().defined());
  sum(b).backward();
  CHECK(b.grad().to_vector<double>() == Vec{1, 1, 1});
  CHECK(a.grad().to_vector<double>() == Vec{0, 0, 0, 0});
  // The loss read after the step is the one its gradients are of (backward evaluated it).
  opt.zero_grad();
  Tensor l = loss();  // 0.5 (-0.5) + 1.5 (0.5) + 2.5 (1.5) + 3.5 (2.5) + 25 + 36 + 49 (after the step: 2.5)
  l.backward();
  opt.step();
  CHECK(l.item<double>() == 123);
  CHECK(b.to_vector<double>() == Vec{0, 0, 0});

  SUBCASE("a gradient computed before the optimizer was made moves into its home") {
    Tensor c = param({1, 2}, {2});
    Tensor l = sum(c * c);
    l.backward();
    optim::SGD later({c}, {.lr = 0.25});
    CHECK(c.grad().to_vector<double>() == Vec{2, 4});
    later.step();
    CHECK(c.to_vector<double>() == Vec{0.5, 1.0});
    CHECK(l.item<double>() == 5);
  }
}

TEST_CASE("the fused step: one kernel per bucket, no recompiles while a scheduler changes lr") {
  std::vector<Tensor> ps;
  const std::vector<Shape> shapes{{4, 3}, {5}, {2, 2, 2}};
  for (int i = 0; i < 10; ++i) {
    const Shape& s = shapes[static_cast<std::size_t>(i % 3)];
    Vec v;
    for (std::int64_t j = 0; j < s.numel(); ++j) v.push_back(0.1 * static_cast<double>(i + 1) - 0.05 * j);
    ps.push_back(param(v, s));
  }
  optim::AdamW opt(ps, {.lr = 1e-2, .weight_decay = 0.1});
  optim::LambdaLR sched(opt, [](std::int64_t e) { return 1.0 / static_cast<double>(1 + e); });
  std::vector<Vec> before;
  for (const Tensor& p : ps) before.push_back(p.to_vector<double>());
  Stats after_first{};
  for (int t = 0; t < 5; ++t) {
    opt.zero_grad();
    Tensor loss;
    for (const Tensor& p : ps) loss = loss.defined() ? Tensor(loss + sum(p * p)) : Tensor(sum(p * p));
    loss.backward();
    const Stats s0 = stats();
    opt.step();
    const Stats s1 = stats();
    if (t > 0) {
      CHECK(s1.graphs - s0.graphs == 1);  // the update of ten parameters: one graph...
      if (fused_kernels()) CHECK(s1.launches - s0.launches == 1);  // ...one kernel
    }
    sched.step();
    if (t == 0) after_first = stats();
  }
  CHECK(opt.param_groups()[0].lr == doctest::Approx(1e-2 / 6));
  // Steps 2..5, with a new lr each: backward and update reuse what step 1 compiled.
  CHECK(stats().compiles == after_first.compiles);
  CHECK(stats().disk_hits == after_first.disk_hits);
  for (std::size_t i = 0; i < ps.size(); ++i) CHECK(ps[i].to_vector<double>() != before[i]);

  SUBCASE("parameters of three dtypes: one kernel each") {
    Tensor x = param({1, 2, 3}, {3});
    Tensor y = param({4, 5}, {2}, f64);
    Tensor z = param({1, -1, 2, 0}, {4}, f16);
    optim::SGD sgd({x, y, z}, {.lr = 0.5, .momentum = 0.5});
    for (int t = 0; t < 2; ++t) {
      sgd.zero_grad();
      backward_with({x, y, z}, {{1, 1, 1}, {2, 2}, {1, 1, 1, 1}});
      const Stats s0 = stats();
      sgd.step();
      const Stats s1 = stats();
      if (t > 0) {
        CHECK(s1.graphs - s0.graphs == 1);
        if (fused_kernels()) CHECK(s1.launches - s0.launches == 3);  // (buckets of one size would share one)
      }
    }
    // Momentum 0.5: the second step moves by 1.5 lr g.
    CHECK(x.to_vector<double>() == Vec{-0.25, 0.75, 1.75});
    CHECK(y.to_vector<double>() == Vec{1.5, 2.5});
    CHECK(y.dtype() == f64);
    CHECK(z.to_vector<double>() == Vec{-0.25, -2.25, 0.75, -1.25});
  }
}

TEST_CASE("state_dict round trip and load_state_dict's checks") {
  auto make_params = [] {
    return std::vector<Tensor>{param({1, -2, 3, 0.5}, {2, 2}), param({0.25, 4, -1}, {3}), param({7, 8}, {2})};
  };
  auto grads_of = [](int t) {
    const double s = t == 0 ? 1.0 : -0.5;
    return std::vector<Vec>{{s, 2 * s, -s, 0.5}, {-s, s, 3 * s}};
  };
  std::vector<Tensor> pa = make_params();
  optim::Adam a(pa, {.lr = 0.01, .amsgrad = true});
  for (int t = 0; t < 2; ++t) {
    a.zero_grad();
    backward_with({pa[0], pa[1]}, grads_of(t));  // the third parameter never gets one
    a.step();
  }
  const nn::StateDict sd = a.state_dict();
  for (const char* key : {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "state.0.step",
                          "state.1.exp_avg", "param_groups.0.lr", "param_groups.0.betas", "param_groups.0.eps",
                          "param_groups.0.weight_decay", "param_groups.0.amsgrad", "param_groups.0.maximize",
                          "param_groups.0.params"}) {
    INFO(key);
    CHECK(sd.contains(key));
  }
  CHECK(!sd.contains("state.2.step"));
  CHECK(sd.at("state.0.step").item<std::int64_t>() == 2);
  CHECK(sd.at("state.0.exp_avg").shape() == Shape{2, 2});
  CHECK(sd.at("param_groups.0.lr").item<double>() == 0.01);
  CHECK(sd.at("param_groups.0.betas").to_vector<double>() == Vec{0.9, 0.999});
  CHECK(sd.at("param_groups.0.params").to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2});

  // A new optimizer over parameters of the same values, other hyper-parameters: loaded, its
  // next step is the first one's.
  std::vector<Tensor> pb;
  for (const Tensor& p : pa) pb.push_back(param(p.to_vector<double>(), p.shape()));
  optim::Adam b(pb, {.lr = 0.5});
  b.load_state_dict(sd);
  CHECK(b.param_groups()[0].lr == 0.01);
  CHECK(b.param_groups()[0].amsgrad);
  for (auto* o : {&a, &b}) {
    o->zero_grad();
    backward_with({(o == &a ? pa : pb)[0], (o == &a ? pa : pb)[1]}, {{0.25, -1, 2, 1}, {1, 1, -2}});
    o->step();
  }
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].to_vector<double>() == pb[i].to_vector<double>());

  SUBCASE("SGD's momentum buffers") {
    std::vector<Tensor> qa = make_params(), qb = make_params();
    optim::SGD sa(qa, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
    sa.zero_grad();
    backward_with({qa[0], qa[1]}, grads_of(0));
    sa.step();
    const nn::StateDict ssd = sa.state_dict();
    CHECK(ssd.contains("state.0.momentum_buffer"));
    CHECK(!ssd.contains("state.0.step"));
    CHECK(!ssd.contains("state.2.momentum_buffer"));
    for (std::size_t i = 0; i < qa.size(); ++i) qb[i].detach().assign(qa[i].detach());
    optim::SGD sb(qb, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1});
    sb.load_state_dict(ssd);
    for (auto* o : {&sa, &sb}) {
      o->zero_grad();
      backward_with({(o == &sa ? qa : qb)[0], (o == &sa ? qa : qb)[1]}, grads_of(1));
      o->step();
    }
    for (std::size_t i = 0; i < qa.size(); ++i) CHECK(qa[i].to_vector<double>() == qb[i].to_vector<double>());
  }

  SUBCASE("missing, unexpected and mis-shaped keys: a ValueError naming them, nothing changed") {
    std::vector<Tensor> pc = make_params();
    optim::Adam c(pc, {.lr = 0.5});
    auto without = [&](const std::string& drop) {
      nn::StateDict d;
      for (const auto& [k, v] : sd)
        if (k != drop) d.insert(k, v);
      return d;
    };
    auto fails_with = [&](const nn::StateDict& d, const std::string& needle) {
      INFO(needle);
      try {
        c.load_state_dict(d);
        FAIL_CHECK("no error");
      } catch (const ValueError& e) {
        CHECK(std::string(e.what()).find(needle) != std::string::npos);
      }
      CHECK(c.param_groups()[0].lr == 0.5);
      CHECK(!c.param_groups()[0].amsgrad);
      CHECK(c.state_dict().keys().size() == 7);  // the groups' entries only: nothing was loaded
    };
    fails_with(without("state.0.exp_avg_sq"), "missing keys: state.0.exp_avg_sq");
    fails_with(without("param_groups.0.betas"), "missing keys: param_groups.0.betas");
    nn::StateDict extra = without("");
    extra.insert("state.0.bogus", zeros({1}));
    extra.insert("param_groups.1.lr", zeros({}));
    extra.insert("state.9.step", zeros({}));
    fails_with(extra, "unexpected keys: state.0.bogus, param_groups.1.lr, state.9.step");
    nn::StateDict shaped = without("");
    shaped.set("state.1.exp_avg", zeros({5}));
    fails_with(shaped, "mis-shaped keys: state.1.exp_avg (expected [3], got [5])");
    nn::StateDict fewer = without("");
    fewer.set("param_groups.0.params", zeros({2}, i64));
    fails_with(fewer, "param_groups.0.params (expected [3], got [2])");
    std::vector<Tensor> ps = make_params();
    optim::SGD s(ps, {.lr = 0.1, .momentum = 0.9});
    fails_with(s.state_dict(), "missing keys: param_groups.0.betas");
  }
}

TEST_CASE("schedulers: PyTorch's lr sequences") {
  Tensor p = param({1, 2}, {2});
  auto lrs = [](optim::LRScheduler& s, int n) {
    std::vector<double> out{s.get_last_lr()[0]};
    for (int i = 1; i < n; ++i) {
      s.step();
      out.push_back(s.get_last_lr()[0]);
      CHECK(s.optimizer().param_groups()[0].lr == out.back());
    }
    CHECK(s.last_epoch() == n - 1);
    return out;
  };
  auto expect = [](const std::vector<double>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("epoch " << i);
      CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
    }
  };
  SUBCASE("StepLR") {
    optim::SGD opt({p}, {.lr = 0.1});
    optim::StepLR s(opt, 2, 0.1);
    expect(lrs(s, 6), {0.1, 0.1, 0.01, 0.01, 0.001, 0.001});
  }
  SUBCASE("MultiStepLR") {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::MultiStepLR s(opt, {2, 4, 4}, 0.5);
    expect(lrs(s, 6), {1, 1, 0.5, 0.5, 0.125, 0.125});
  }
  SUBCASE("ExponentialLR") {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::ExponentialLR s(opt, 0.5);
    expect(lrs(s, 4), {1, 0.5, 0.25, 0.125});
  }
  SUBCASE("CosineAnnealingLR, past T_max") {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::CosineAnnealingLR s(opt, 4, 0.1);
    std::vector<double> want;
    for (int e = 0; e < 7; ++e) want.push_back(0.1 + 0.9 * (1 + std::cos(std::numbers::pi * e / 4)) / 2);
    expect(lrs(s, 7), want);  // 1, 0.868, 0.55, 0.232, 0.1, then up again: 0.232, 0.55
  }
  SUBCASE("LinearLR (warm-up)") {
    optim::SGD opt({p}, {.lr = 1.0});
    optim::LinearLR s(opt, 0.25, 1.0, 4);
    expect(lrs(s, 6), {0.25, 0.4375, 0.625, 0.8125, 1.0, 1.0});
    optim::SGD opt2({param({1}, {1})}, {.lr = 0.3});
    optim::LinearLR defaults(opt2);  // 1/3 -> 1 over 5
    expect(lrs(defaults, 7), {0.1, 0.14, 0.18, 0.22, 0.26, 0.3, 0.3});
    // total_iters 0, as torch's: the factor stays start_factor.
    optim::SGD opt3({param({1}, {1})}, {.lr = 1.0});
    optim::LinearLR none(opt3, 0.5, 1.0, 0);
    expect(lrs(none, 4), {0.5, 0.5, 0.5, 0.5});
    CHECK_THROWS_AS(optim::LinearLR(opt3, 0.5, 1.0, -1), ValueError);
  }
  SUBCASE("LambdaLR, one function per group") {
    optim::SGD opt({p}, {.lr = 1.0});
    opt.add_param_group({param({1}, {1})}, {.lr = 2.0});
    optim::LambdaLR s(opt, std::vector<std::function<double(std::int64_t)>>{
                               [](std::int64_t e) { return std::pow(0.9, static_cast<double>(e)); },
                               [](std::int64_t e) { return 1.0 / static_cast<double>(e + 1); }});
    expect(lrs(s, 4), {1, 0.9, 0.81, 0.729});
    CHECK(s.get_last_lr()[1] == doctest::Approx(0.5));
    CHECK(opt.param_groups()[1].initial_lr == 2.0);
  }
  SUBCASE("SequentialLR: warm-up, then decay") {
    optim::SGD opt({p}, {.lr = 1.0});
    auto warm = std::make_shared<optim::LinearLR>(opt, 0.5, 1.0, 2);
    auto decay = std::make_shared<optim::ExponentialLR>(opt, 0.5);
    optim::SequentialLR s(opt, {warm, decay}, {2});
    expect(lrs(s, 5), {0.5, 0.75, 1.0, 0.5, 0.25});
    CHECK_THROWS_AS(optim::SequentialLR(opt, {warm, decay}, {}), ValueError);
  }
  SUBCASE("SequentialLR with a milestone at 0 starts with the second scheduler, as torch's bisect") {
    optim::SGD opt({p}, {.lr = 1.0});
    auto unused = std::make_shared<optim::ExponentialLR>(opt, 0.9);
    auto step = std::make_shared<optim::StepLR>(opt, 2, 0.5);
    optim::SequentialLR s(opt, {unused, step}, {0});
    expect(lrs(s, 5), {1, 1, 0.5, 0.5, 0.25});  // torch 2.x
  }
  SUBCASE("the optimizer follows the schedule") {
    Tensor q = param({0}, {1});
    optim::SGD opt({q}, {.lr = 1.0});
    optim::StepLR s(opt, 1, 0.5);
    for (int t = 0; t < 3; ++t) {
      opt.zero_grad();
      sum(q).backward();
      opt.step();
      s.step();
    }
    CHECK(q.to_vector<double>() == Vec{-1.75});  // -(1 + 0.5 + 0.25)
  }
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_") {
  Tensor a = param({0, 0}, {2});
  Tensor b = param({0, 0, 0}, {3});
  auto fill = [&] {
    for (Tensor* t : {&a, &b}) t->node()->grad_leaf->grad.reset();
    backward_with({a, b}, {{3, -4}, {0, 12, 0}});
  };
  auto run = [&](bool homed) {
    INFO((homed ? "gradients in an optimizer's flat buffer" : "gradients of their own"));
    fill();
    Tensor total = nn::utils::clip_grad_norm_({a, b}, 6.5);
    CHECK(total.dim() == 0);
    CHECK(total.item<double>() == doctest::Approx(13));
    const double c = 6.5 / (13 + 1e-6);
    check_close(a.grad().to_vector<double>(), {3 * c, -4 * c}, 1e-6);
    check_close(b.grad().to_vector<double>(), {0, 12 * c, 0}, 1e-6);
    fill();
    total = optim::clip_grad_norm_({a, b}, 6, std::numeric_limits<double>::infinity());
    CHECK(total.item<double>() == 12);
    check_close(a.grad().to_vector<double>(), {1.5, -2}, 1e-6);
    fill();
    total = optim::clip_grad_norm_({a, b}, 100, 1.0);  // below: unchanged
    CHECK(total.item<double>() == doctest::Approx(19));
    CHECK(a.grad().to_vector<double>() == Vec{3, -4});
    CHECK(b.grad().to_vector<double>() == Vec{0, 12, 0});
    fill();
    // Order 0 is torch's norm of the gradients' norms: the number of gradients holding a nonzero
    // (2 here, not the 3 nonzero elements), so the factor is 1.5 / 2.
    total = optim::clip_grad_norm_({a, b}, 1.5, 0.0);
    CHECK(total.item<double>() == 2);
    check_close(a.grad().to_vector<double>(), {3 * 0.75 / (1 + 5e-7), -4 * 0.75 / (1 + 5e-7)}, 1e-6);
    fill();
    optim::clip_grad_value_({a, b}, 3.5);
    CHECK(a.grad().to_vector<double>() == Vec{3, -3.5});
    CHECK(b.grad().to_vector<double>() == Vec{0, 3.5, 0});
  };
  run(false);
  optim::SGD opt({a, b}, {.lr = 0.1});
  run(true);
  fill();
  const Stats s0 = stats();
  optim::clip_grad_norm_({a, b}, 1.0);
  const Stats s1 = stats();
  CHECK(s1.graphs - s0.graphs == 2);  // the norm, then the scaling: both over the flat buffer
  if (fused_kernels()) CHECK(s1.launches - s0.launches <= 2);

  opt.zero_grad();
  backward_with({a, b}, {{std::numeric_limits<double>::infinity(), 1}, {0, 1, 0}});
  CHECK_THROWS_AS(optim::clip_grad_norm_({a, b}, 1.0, 2.0, true), ValueError);
  CHECK(b.grad().to_vector<double>() == Vec{0, 1, 0});  // untouched
  CHECK(std::isinf(optim::clip_grad_norm_({a, b}, 1.0).item<double>()));
  opt.zero_grad();
  CHECK(optim::clip_grad_norm_({a, b}, 1.0).item<double>() == 0);  // no gradients
  CHECK_THROWS_AS(optim::clip_grad_norm_({a, b}, 1.0, -1.0), ValueError);
}

TEST_CASE("GradScaler: scaling, unscaling, skipped steps, backoff and growth") {
  Tensor p = param({1, -2}, {2});
  optim::SGD opt({p}, {.lr = 0.5});
  GradScaler scaler({.init_scale = 1024, .growth_interval = 2});
  const double inf = std::numeric_limits<double>::infinity();
  auto iteration = [&](const Vec& g) {
    opt.zero_grad();
    Tensor loss = sum(p * from_vector<double>(g, {2}, device()).to(f32));
    Tensor scaled = scaler.scale(loss);
    if (std::isfinite(g[0])) CHECK(scaled.item<double>() == loss.item<double>() * scaler.get_scale());
    scaled.backward();
    scaler.step(opt);
    scaler.update();
  };
  iteration({0.5, 0.25});
  CHECK(p.grad().to_vector<double>() == Vec{0.5, 0.25});  // unscaled before the step
  CHECK(p.to_vector<double>() == Vec{0.75, -2.125});
  CHECK(scaler.get_scale() == 1024);
  iteration({0.5, 0.25});
  CHECK(p.to_vector<double>() == Vec{0.5, -2.25});
  CHECK(scaler.get_scale() == 2048);  // two good steps in a row: growth
  iteration({inf, 1});
  CHECK(p.to_vector<double>() == Vec{0.5, -2.25});  // skipped
  CHECK(scaler.get_scale() == 1024);                // backoff
  iteration({1, 1});
  CHECK(p.to_vector<double>() == Vec{0, -2.75});
  CHECK(scaler.get_scale() == 1024);  // one good step since the backoff

  SUBCASE("unscale_ before clipping, once per update") {
    opt.zero_grad();
    scaler.scale(sum(p * 4.0f)).backward();
    CHECK(p.grad().to_vector<double>() == Vec{4096, 4096});
    scaler.unscale_(opt);
    CHECK(p.grad().to_vector<double>() == Vec{4, 4});
    CHECK_THROWS_AS(scaler.unscale_(opt), Error);
    scaler.step(opt);  // does not unscale again
    CHECK(p.to_vector<double>() == Vec{-2, -4.75});
    CHECK_THROWS_AS(scaler.step(opt), Error);
    scaler.update();
    CHECK_THROWS_AS(scaler.update(), Error);  // nothing checked since
    const nn::StateDict sd = scaler.state_dict();
    CHECK(sd.at("scale").item<double>() == 2048);
    GradScaler other;
    other.load_state_dict(sd);
    CHECK(other.get_scale() == 2048);
  }
  SUBCASE("an optimizer without gradients: nothing checked, so step() and update() are Errors (torch's asserts)") {
    opt.zero_grad();
    CHECK_THROWS_WITH_AS(scaler.step(opt), doctest::Contains("no inf checks were recorded"), Error);
    CHECK(p.to_vector<double>() == Vec{0, -2.75});
    CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("no inf checks were recorded"), Error);
    CHECK(scaler.get_scale() == 1024);  // no growth counted
    Tensor empty = param({}, {0});
    optim::SGD other({empty}, {.lr = 0.5});
    sum(empty).backward();  // an empty gradient: its device is checked, as torch's
    scaler.step(other);
    scaler.update();
    CHECK(scaler.get_scale() == 2048);  // the second good step since the backoff
  }
  SUBCASE("disabled: a pass-through") {
    GradScaler off({.enabled = false});
    Tensor loss = sum(p);
    CHECK(off.scale(loss).node() == loss.node());
    CHECK(off.get_scale() == 1);
    opt.zero_grad();
    off.scale(loss).backward();
    off.step(opt);
    off.update();
    CHECK(p.to_vector<double>() == Vec{-0.5, -3.25});
  }
}

TEST_CASE("optimizers check their parameters and hyper-parameters") {
  Tensor p = param({1, 2}, {2});
  CHECK_THROWS_AS(optim::SGD({p}, {.lr = -1}), ValueError);
  CHECK_THROWS_AS(optim::SGD({p}, {.momentum = -0.5}), ValueError);
  CHECK_THROWS_AS(optim::SGD({p}, {.nesterov = true}), ValueError);  // nesterov needs momentum
  CHECK_THROWS_AS(optim::SGD({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), ValueError);
  CHECK_THROWS_AS(optim::Adam({p}, {.eps = -1e-8}), ValueError);
  CHECK_THROWS_AS(optim::Adam({p}, {.betas = {1.0, 0.999}}), ValueError);
  CHECK_THROWS_AS(optim::AdamW({p}, {.betas = {0.9, -0.1}}), ValueError);
  CHECK_THROWS_AS(optim::AdamW({p}, {.weight_decay = -0.1}), ValueError);
  CHECK_THROWS_AS(optim::SGD(std::vector<Tensor>{}), ValueError);
  CHECK_THROWS_AS(optim::SGD({from_vector<float>({1, 2}, {2}, device())}), ValueError);  // no grad
  CHECK_THROWS_AS(optim::SGD({from_vector<std::int64_t>({1, 2}, {2}, device())}), DTypeError);
  Tensor q = param({3}, {1});
  CHECK_THROWS_AS(optim::SGD({Tensor(q * 2.0f)}), ValueError);  // not a leaf
  CHECK_THROWS_AS(optim::SGD({q, q}), ValueError);               // twice
  optim::SGD opt({p}, {.lr = 0.1});
  CHECK_THROWS_AS(opt.add_param_group({p}), ValueError);  // already in group 0
  opt.add_param_group({q}, {.lr = 1.0});
  REQUIRE(opt.param_groups().size() == 2);
  sum(p + q).backward();
  opt.step();
  check_close(p.to_vector<double>(), {0.9, 1.9});
  CHECK(q.to_vector<double>() == Vec{1});  // its gradient is 2 (broadcast), its lr 1
  opt.param_groups()[1].params.push_back(param({1}, {1}));
  CHECK_THROWS_AS(opt.step(), ValueError);  // parameters are added through add_param_group
}

}  // namespace kiln_test_optim_optim
