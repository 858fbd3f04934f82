// scaled_dot_product_attention: the fused kernels (forward and backward) against the
// written-out form in float64, for every mask kind, causal, grouped heads, head dims, odd
// lengths and dtypes; the plan holds no [L, S] buffer; errors name the op and the shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <kiln/autodiff/backward.hpp>  // the backward walk itself (autodiff::backward_pass)
#include <kiln/kiln.hpp>
#include <kiln/runtime/cudnn.hpp>
#include <kiln/sched/steps.hpp>

#include "../support/compile_util.hpp"
#include "../support/device.hpp"

namespace kiln_test_nn_attention {

using namespace kiln;

namespace {

/// The device under test (KILN_DEVICE).
const Device dev = kiln::testing::device();

std::vector<double> values(const Tensor& t) { return t.to(f64).to_vector<double>(); }

/// max |got - want| / max(1, max |want|).
double relative_error(const Tensor& got, const Tensor& want) {
  std::vector<double> g = values(got), w = values(want);
  REQUIRE(g.size() == w.size());
  double err = 0, top = 1;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) != std::isnan(w[i])) return INFINITY;
    if (!std::isnan(w[i])) err = std::max(err, std::abs(g[i] - w[i]));
    top = std::max(top, std::abs(w[i]));
  }
  return err / top;
}

enum class MaskKind { None, Causal, Bool, Additive, BatchBroadcast };

struct Case {
  std::int64_t B, Hq, Hkv, L, S, E, Ev;
  MaskKind mask = MaskKind::None;
  DType dtype = f64;
  const char* name = "";
  double dropout = 0.0;  ///< both forms draw the same key (manual_seed before each)
  /// Not 0: q's feature 0 is 1 and k's is shift · sqrt(E), so every score is about `shift` (a
  /// row's lse below -88.7 for shift -120: exp(-lse) overflows a float).
  double shift = 0.0;
};

double tolerance(DType dt) {
  return dt == f64 ? 1e-10 : dt == f32 ? 2e-5 : dt == f16 ? 4e-3 : 3e-2;
}

/// The fused attention of `c` (in c.dtype, inputs rounded from float64 values) against the
/// written-out form in float64 over the same rounded inputs: the output and the gradients of q,
/// k and v under a random cotangent.
void check_case(const Case& c, std::uint64_t seed) {
  const std::string what = std::string(c.name) + " in " + dtype_name(c.dtype);
  CAPTURE(what);
  const bool gqa = c.Hq != c.Hkv;
  auto make = [&](Shape s, std::uint64_t k) { return randn(s, seed * 16 + k, f64, dev).to(c.dtype).to(f64).eval(); };
  Tensor q = make({c.B, c.Hq, c.L, c.E}, 1), k = make({c.B, c.Hkv, c.S, c.E}, 2), v = make({c.B, c.Hkv, c.S, c.Ev}, 3);
  Tensor cot = make({c.B, c.Hq, c.L, c.Ev}, 4);
  if (c.shift != 0.0) {
    auto first_feature = [&](const Tensor& t, double value) {
      std::vector<double> x = values(t);
      for (std::size_t i = 0; i < x.size(); i += static_cast<std::size_t>(c.E)) x[i] = value;
      return from_vector<double>(x, t.shape(), dev).to(c.dtype).to(f64).eval();
    };
    q = first_feature(q * 0.1, 1.0);
    k = first_feature(k * 0.1, c.shift * std::sqrt(static_cast<double>(c.E)));
  }
  Tensor mask;
  bool causal = false;
  switch (c.mask) {
    case MaskKind::None:
      break;
    case MaskKind::Causal:
      causal = true;
      break;
    case MaskKind::Bool: {
      mask = (rand({c.L, c.S}, seed * 16 + 5, f64, dev) > 0.3).eval();  // some rows may lose every key
      break;
    }
    case MaskKind::Additive:
      mask = (randn({c.B, c.Hq, c.L, c.S}, seed * 16 + 6, f64, dev) * 2.0).to(c.dtype).eval();
      break;
    case MaskKind::BatchBroadcast:
      mask = (randn({c.B, 1, c.L, c.S}, seed * 16 + 7, f64, dev)).to(c.dtype).eval();
      break;
  }
  auto run = [&](bool fused, std::vector<Tensor>& grads) {
    Tensor qq = q.detach().requires_grad_(), kk = k.detach().requires_grad_(), vv = v.detach().requires_grad_();
    manual_seed(seed);
    Tensor out = fused ? scaled_dot_product_attention(qq.to(c.dtype), kk.to(c.dtype), vv.to(c.dtype), mask, c.dropout,
                                                      causal, std::nullopt, gqa)
                       : nn::functional::scaled_dot_product_attention_math(
                             qq, kk, vv, mask.defined() ? mask.to(mask.dtype() == DType::Bool ? DType::Bool : f64) : mask,
                             c.dropout, causal, std::nullopt, gqa);
    sum(out.to(f64) * cot).backward();
    grads = {qq.grad(), kk.grad(), vv.grad()};
    return out.to(f64).eval();
  };
  std::vector<Tensor> gf, gr;
  Tensor got = run(true, gf), want = run(false, gr);
  const double tol = tolerance(c.dtype);
  CHECK(relative_error(got, want) <= tol);
  const std::string names[] = {"dq", "dk", "dv"};
  if (c.shift != 0.0) {
    // With every key's feature 0 the same, dq's feature 0 is shift · sqrt(E) · scale times the
    // row's sum of dS, 0 but for the rounding of the saved output (delta): compare the others,
    // and require feature 0 finite.
    std::vector<double> dq = values(gf[0]);
    std::size_t non_finite = 0;
    for (double x : dq) non_finite += !std::isfinite(x);
    CHECK(non_finite == 0);
    gf[0] = gf[0].narrow(3, 1, c.E - 1);
    gr[0] = gr[0].narrow(3, 1, c.E - 1);
  }
  for (int i = 0; i < 3; ++i) {
    CAPTURE(names[i]);
    // The gradients sum over S (dq) or over L and the group (dk, dv): a few more roundings.
    CHECK(relative_error(gf[static_cast<std::size_t>(i)], gr[static_cast<std::size_t>(i)]) <= 4 * tol);
  }
}

}  // namespace

TEST_CASE("scaled_dot_product_attention: fused forward and backward match the written-out form in float64") {
  const std::vector<Case> cases = {
      {2, 2, 2, 7, 7, 16, 16, MaskKind::None, f64, "plain"},
      {1, 2, 2, 129, 129, 64, 64, MaskKind::Causal, f64, "causal, T past a tile"},
      {1, 4, 2, 33, 20, 32, 24, MaskKind::Additive, f64, "grouped heads, L != S, Ev != E, additive mask"},
      {2, 2, 1, 17, 70, 40, 40, MaskKind::Bool, f64, "one kv head, bool mask with empty rows"},
      {2, 2, 2, 9, 13, 96, 96, MaskKind::BatchBroadcast, f64, "mask broadcast over heads"},
      {1, 1, 1, 1, 1, 128, 128, MaskKind::Causal, f64, "T = 1"},
      {1, 2, 2, 40, 40, 256, 256, MaskKind::Causal, f64, "head dim 256"},
      {1, 2, 2, 1000, 1000, 32, 32, MaskKind::Causal, f32, "T = 1000"},
      {1, 2, 2, 65, 65, 64, 64, MaskKind::Causal, f32, "float32"},
      {1, 2, 2, 65, 65, 64, 64, MaskKind::Causal, bf16, "bfloat16"},
      {1, 4, 2, 65, 31, 128, 128, MaskKind::Additive, f16, "float16, grouped, masked"},
      // Dropout: the fused kernels drop the weights the written-out form drops with the same key.
      {2, 4, 2, 33, 70, 24, 16, MaskKind::Bool, f64, "dropout, grouped, bool mask", 0.3},
      {1, 2, 2, 129, 129, 64, 64, MaskKind::Causal, f32, "dropout, causal, T past a tile", 0.5},
      {1, 2, 2, 65, 40, 64, 64, MaskKind::Causal, bf16, "dropout, bfloat16", 0.2},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) check_case(cases[i], 100 + i);
}

TEST_CASE("scaled_dot_product_attention: half types without a mask, cuDNN's fused kernels where a GPU has cuDNN") {
  const std::vector<Case> cases = {
      {2, 3, 3, 129, 129, 64, 64, MaskKind::Causal, bf16, "causal bf16, T past a tile"},
      {1, 2, 2, 1000, 1000, 128, 128, MaskKind::Causal, f16, "T = 1000, head dim 128"},
      {1, 2, 2, 7, 70, 64, 64, MaskKind::None, bf16, "L = 7 != S, not causal"},
      {1, 1, 1, 1, 1, 64, 64, MaskKind::Causal, bf16, "T = 1"},
      {2, 2, 2, 256, 128, 64, 64, MaskKind::None, f16, "L = 256 != S = 128, whole tiles"},
      {1, 3, 3, 128, 128, 128, 128, MaskKind::Causal, bf16, "causal T = 128, head dim 128"},
      // cuDNN's backward NaN (pytorch issue 196678): partial tiles (192 = 128 + 64), every lse near -120.
      {1, 2, 2, 192, 192, 64, 64, MaskKind::None, bf16, "scores about -120, T = 192", 0.0, -120.0},
      {2, 1, 1, 320, 320, 64, 64, MaskKind::Causal, f16, "causal, scores about -120, T = 320", 0.0, -120.0},
  };
  const bool library = dev.is_cuda() && runtime::cudnn_available();
  if (!library) MESSAGE("no GPU with cuDNN: these cases run kiln's own kernels");
  // Empty feature dims (fuzz seed 71, graph 1098: cuDNN's launch failed on them): the
  // generated kernels' empty or zero results, forward and backward.
  {
    Tensor q = randn({1, 7, 1, 0}, 71, f32, dev).to(f16).requires_grad_();
    Tensor k = randn({1, 7, 33, 0}, 72, f32, dev).to(f16), v = randn({1, 7, 33, 8}, 73, f32, dev).to(f16);
    Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, true);
    CHECK(out.shape() == Shape{1, 7, 1, 8});
    // No features: every score is 0, so each row averages its keys (the first, causally).
    CHECK(relative_error(out, nn::functional::scaled_dot_product_attention_math(q.to(f64), k.to(f64), v.to(f64), {},
                                                                                0.0, true)) <= tolerance(f16));
    Tensor no_values = scaled_dot_product_attention(q, k, randn({1, 7, 33, 0}, 74, f32, dev).to(f16));
    CHECK(no_values.shape() == Shape{1, 7, 1, 0});
    CHECK(no_values.eval().numel() == 0);
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    kiln::testing::LogCapture logs("schedule");
    const auto calls = kiln::stats().library_calls;
    check_case(cases[i], 300 + i);
    if (library) {
      CAPTURE(cases[i].name);
      CHECK(logs.text().find("cuDNN's fused attention") != std::string::npos);
      CHECK(logs.text().find("(backward): cuDNN's fused attention") != std::string::npos);
      CHECK(kiln::stats().library_calls >= calls + 2);  // the forward and the backward
    }
  }
}

TEST_CASE("scaled_dot_product_attention: a row whose scores are all -inf gives 0 in any memory, a NaN score NaN") {
  // Fuzz seed 90, graph 1544 (GPU): infinite query features make every score of a row -inf.
  // torch gives 0 there on every backend (its math backend's safe softmax), and no gradient to
  // the row's query; the output must be 0 whatever the memory it is written to held before
  // (NaN here) and whatever the values (an infinite one, weighed by 0, must not make it NaN).
  // Lengths of partial tiles and of whole 128-row tiles (on a GPU with cuDNN: its backward with
  // and without the padding mask, reading the lse with +inf for -inf).
  for (auto [L, S] : {std::pair<std::int64_t, std::int64_t>{3, 4}, {128, 128}})
    for (DType dt : {f16, bf16, f32}) {
      CAPTURE(L);
      CAPTURE(dtype_name(dt));
      std::vector<float> qv = randn({1, 2, L, 64}, 21, f32).to_vector<float>();
      qv[static_cast<std::size_t>((0 * L + 1) * 64 + 3)] = -INFINITY;  // head 0, row 1: every key's feature 3 is positive
      qv[static_cast<std::size_t>((1 * L + 2) * 64 + 5)] = NAN;        // head 1, row 2: NaN scores
      Tensor q = from_vector<float>(qv, {1, 2, L, 64}).to(dev).to(dt);
      Tensor k = (rand({1, 2, S, 64}, 22, f32, dev) + 0.5f).to(dt), v = randn({1, 2, S, 64}, 23, f32, dev).to(dt);
      std::vector<float> vv = v.to(f32).to_vector<float>();
      vv[(0 * S + 2) * 64 + 7] = INFINITY;
      Tensor v_inf = from_vector<float>(vv, {1, 2, S, 64}).to(dev).to(dt);
      auto row = [L](const std::vector<double>& o, std::int64_t head, std::int64_t r, std::int64_t d) {
        return o[static_cast<std::size_t>((head * L + r) * 64 + d)];
      };
      for (int round = 0; round < 2; ++round) {
        {
          // Leave NaN in the memory pool for the attention's outputs to be given.
          std::vector<Tensor> junk;
          for (int i = 0; i < 8; ++i) junk.push_back(full({1, 2, L, 64}, NAN, dt, dev).eval());
          for (int i = 0; i < 8; ++i) junk.push_back(full({1, 2, L}, NAN, f32, dev).eval());
        }
        std::vector<double> o_inf = values(scaled_dot_product_attention(q, k, v_inf));
        Tensor qq = q.detach().requires_grad_(), vg = v.detach().requires_grad_();
        Tensor out = scaled_dot_product_attention(qq, k, vg);
        std::vector<double> o = values(out);
        for (int d = 0; d < 64; ++d) {
          CAPTURE(d);
          CHECK(row(o, 0, 1, d) == 0.0);
          CHECK(row(o_inf, 0, 1, d) == 0.0);
          CHECK(std::isnan(row(o, 1, 2, d)));
          CHECK(std::isfinite(row(o, 0, 0, d)));
          CHECK(std::isinf(row(o_inf, 0, 0, d)) == (d == 7));
        }
        Tensor g = ones({1, 2, L, 64}, dt, dev) * (arange(L, f32, dev).reshape({1, 1, L, 1}) != 2.0f).to(dt);
        (out * g).sum().backward();  // the NaN row gets a zero cotangent
        std::vector<double> dq = values(qq.grad());
        for (int d = 0; d < 64; ++d) {
          CAPTURE(d);
          CHECK(row(dq, 0, 1, d) == 0.0);
          CHECK(std::isfinite(row(dq, 0, 0, d)));
        }
        // Head 0's values: the -inf row weighs them by 0, the others finitely.
        std::vector<double> dv = values(vg.grad());
        std::size_t non_finite = 0;
        for (std::size_t i = 0; i < static_cast<std::size_t>(S * 64); ++i) non_finite += !std::isfinite(dv[i]);
        CHECK(non_finite == 0);
      }
    }
}

TEST_CASE("scaled_dot_product_attention: strided heads of one projection, as a GPT's attention reads them") {
  // q, k and v as views of one [B, L, 3 H E] projection, each [B, L, H, E] seen as [B, H, L, E]
  // (strides L·3HE, E, 3HE, 1): cuDNN's plan takes the strides as they are (on a GPU with cuDNN).
  const std::int64_t B = 2, L = 96, H = 4, E = 64;
  Tensor base = randn({B, L, 3 * H * E}, 61, f64, dev).to(bf16).to(f64).eval();
  Tensor cot = randn({B, H, L, E}, 62, f64, dev).to(bf16).to(f64).eval();
  auto heads = [&](const Tensor& qkv, int i) {
    return transpose(reshape(slice(qkv, 2, i * H * E, (i + 1) * H * E), {B, L, H, E}), 1, 2);
  };
  auto run = [&](bool fused, Tensor& grad) {
    Tensor leaf = base.detach().requires_grad_();
    Tensor qkv = fused ? leaf.to(bf16) : leaf;
    Tensor out = fused ? scaled_dot_product_attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), {}, 0.0, true)
                       : nn::functional::scaled_dot_product_attention_math(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2),
                                                                           {}, 0.0, true);
    sum(out.to(f64) * cot).backward();
    grad = leaf.grad();
    return out.to(f64).eval();
  };
  kiln::testing::LogCapture logs("schedule");
  Tensor gf, gr;
  Tensor got = run(true, gf), want = run(false, gr);
  CHECK(relative_error(got, want) <= tolerance(bf16));
  CHECK(relative_error(gf, gr) <= 4 * tolerance(bf16));
  if (dev.is_cuda() && runtime::cudnn_available())
    CHECK(logs.text().find("cuDNN's fused attention") != std::string::npos);
  // The step reads the projection in place: the heads' strides, no copy.
  Tensor qkv = base.to(bf16).eval();
  Tensor out = scaled_dot_product_attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), {}, 0.0, true);
  ir::Captured c = ir::capture({out.node()}, dev);
  sched::StepPlan plan = sched::plan_steps(c.graph, dev.is_cuda());
  REQUIRE(plan.attentions.size() == 1);
  CHECK(plan.attentions[0].q.strides == Strides{L * 3 * H * E, E, 3 * H * E, 1});
  CHECK(plan.attentions[0].k.strides == Strides{L * 3 * H * E, E, 3 * H * E, 1});
}

TEST_CASE("scaled_dot_product_attention: heads read in place from their product, gradients written into one buffer") {
  // A GPT's attention: q, k and v cut from one linear's [B, L, 3C] result. The forward reads
  // the heads where the product wrote them; the backward writes dq, dk and dv into their parts
  // of one [B, L, 3C] gradient (the slices' gradients merge into one concatenation), which the
  // weight's and the input's products then read whole.
  const std::int64_t B = 2, L = 40, H = 2, E = 16, C = H * E;
  Tensor x0 = randn({B, L, C}, 71, f64, dev).to(bf16).to(f64).eval();
  Tensor w0 = (randn({3 * C, C}, 72, f64, dev) * 0.25).to(bf16).to(f64).eval();
  Tensor cot = randn({B, L, C}, 73, f64, dev).to(bf16).to(f64).eval();
  auto block = [&](const Tensor& x, const Tensor& w, bool fused) {
    Tensor qkv = linear(x, w);
    auto head = [&](std::int64_t i) {
      return transpose(reshape(slice(qkv, 2, i * C, (i + 1) * C), {B, L, H, E}), 1, 2);
    };
    Tensor y = fused ? scaled_dot_product_attention(head(0), head(1), head(2), {}, 0.0, true)
                     : nn::functional::scaled_dot_product_attention_math(head(0), head(1), head(2), {}, 0.0, true);
    return reshape(transpose(y, 1, 2), {B, L, C});
  };
  auto run = [&](bool fused, Tensor& dx, Tensor& dw) {
    Tensor xx = x0.detach().requires_grad_(), ww = w0.detach().requires_grad_();
    Tensor out = fused ? block(xx.to(bf16), ww.to(bf16), true) : block(xx, ww, false);
    sum(out.to(f64) * cot).backward();
    dx = xx.grad();
    dw = ww.grad();
    return out.to(f64).eval();
  };
  Tensor dxf, dwf, dxr, dwr;
  Tensor got = run(true, dxf, dwf), want = run(false, dxr, dwr);
  CHECK(relative_error(got, want) <= 2 * tolerance(bf16));
  CHECK(relative_error(dxf, dxr) <= 4 * tolerance(bf16));
  CHECK(relative_error(dwf, dwr) <= 4 * tolerance(bf16));

  // The forward's plan: the product, then the attention reading its result at the heads'
  // offsets (C and 2C elements in), with no kernel between them.
  Tensor xb = x0.to(bf16).eval(), wb = w0.to(bf16).eval();
  sched::StepPlan fwd = sched::plan_steps(ir::capture({block(xb, wb, true).node()}, dev).graph, dev.is_cuda());
  REQUIRE(fwd.calls.size() == 1);
  REQUIRE(fwd.attentions.size() == 1);
  REQUIRE(fwd.order.size() >= 2);
  CHECK(fwd.order[0].kind == sched::Step::Call);
  CHECK(fwd.order[1].kind == sched::Step::Attention);
  const sched::AttentionCall& a = fwd.attentions[0];
  const std::int64_t row = 3 * C * 2;  // bytes of a [3C] bf16 row
  for (const sched::Slot* s : {&a.q, &a.k, &a.v}) {
    CHECK(s->kind == fwd.calls[0].out.kind);
    CHECK(s->index == fwd.calls[0].out.index);
    CHECK(s->strides == Strides{L * 3 * C, E, 3 * C, 1});
  }
  CHECK(a.q.byte_offset == 0);
  CHECK(a.k.byte_offset == row / 3);
  CHECK(a.v.byte_offset == 2 * row / 3);

  // The backward's plan: dq, dk and dv land in one buffer, at those offsets, which the input's
  // product reads as its operand.
  Tensor xr = xb.detach().requires_grad_(), wr = wb.detach().requires_grad_();
  Tensor loss = sum(block(xr, wr, true).to(f64) * cot);
  std::vector<autodiff::Reached> reached = autodiff::backward_pass(
      {loss.node()}, {ir::constant(1.0, f64, loss.shape(), dev)}, {xr.node(), wr.node()}, false, "test");
  std::vector<ir::NodePtr> grads;
  for (const autodiff::Reached& r : reached) grads.push_back(r.grad);
  sched::StepPlan bwd = sched::plan_steps(ir::capture(grads, dev).graph, dev.is_cuda());
  const sched::AttentionCall* back = nullptr;
  for (const sched::AttentionCall& c : bwd.attentions)
    if (c.kind == sched::AttentionCall::Backward) back = &c;
  REQUIRE(back != nullptr);
  CHECK(back->dq.kind == sched::Slot::Temp);
  for (const sched::Slot* s : {&back->dk, &back->dv}) {
    CHECK(s->kind == back->dq.kind);
    CHECK(s->index == back->dq.index);
  }
  CHECK(back->dq.byte_offset == 0);
  CHECK(back->dk.byte_offset == row / 3);
  CHECK(back->dv.byte_offset == 2 * row / 3);
  CHECK(back->dq.strides == Strides{L * 3 * C, E, 3 * C, 1});
  bool read_whole = false;
  for (const sched::LibraryCall& c : bwd.calls)
    for (const sched::Slot* s : {&c.a, &c.b})
      read_whole = read_whole || (s->kind == back->dq.kind && s->index == back->dq.index && s->byte_offset == 0);
  CHECK(read_whole);
}

TEST_CASE("scaled_dot_product_attention: 3-d and 5-d operands, default and explicit scale, rows without keys") {
  Tensor q = randn({3, 5, 8}, 1, f64, dev), k = randn({3, 6, 8}, 2, f64, dev), v = randn({3, 6, 4}, 3, f64, dev);
  CHECK(relative_error(scaled_dot_product_attention(q, k, v, {}, 0.0, false, 0.5),
                       nn::functional::scaled_dot_product_attention_math(q, k, v, {}, 0.0, false, 0.5)) < 1e-12);
  Tensor q5 = randn({2, 2, 3, 5, 8}, 4, f64, dev), k5 = randn({2, 2, 3, 6, 8}, 5, f64, dev),
         v5 = randn({2, 2, 3, 6, 8}, 6, f64, dev);
  Tensor out5 = scaled_dot_product_attention(q5, k5, v5, {}, 0.0, true);
  CHECK(out5.shape() == Shape{2, 2, 3, 5, 8});
  CHECK(relative_error(out5, nn::functional::scaled_dot_product_attention_math(q5, k5, v5, {}, 0.0, true)) < 1e-12);
  // A row whose keys are all masked gives 0 and passes no gradient (torch's fused kernels).
  Tensor none = zeros({5, 6}, DType::Bool, dev);
  Tensor qq = q.detach().requires_grad_();
  Tensor out = scaled_dot_product_attention(qq, k, v, none);
  for (double x : values(out)) CHECK(x == 0.0);
  sum(out).backward();
  for (double x : values(qq.grad())) CHECK(x == 0.0);
  // An empty key set: zeros as well.
  Tensor empty = scaled_dot_product_attention(q, randn({3, 0, 8}, 7, f64, dev), randn({3, 0, 4}, 8, f64, dev));
  CHECK(empty.shape() == Shape{3, 5, 4});
  for (double x : values(empty)) CHECK(x == 0.0);
}

TEST_CASE("scaled_dot_product_attention: one fused step forward, one backward, no [L, S] buffer") {
  const std::int64_t T = 512;
  Tensor q = randn({2, 2, T, 32}, 11, f32, dev).requires_grad_(),
         k = randn({2, 2, T, 32}, 12, f32, dev).requires_grad_(),
         v = randn({2, 2, T, 32}, 13, f32, dev).requires_grad_();
  kiln::testing::LogCapture logs("schedule");
  Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, true);
  sum(out * out).backward();
  (void)q.grad().eval();
  const std::string text = logs.text();
  CHECK(text.find("call attention forward float32 [2, 2, 512, 32]") != std::string::npos);
  CHECK(text.find("call attention backward float32") != std::string::npos);
  CHECK(text.find("-> dq") != std::string::npos);
  // The plans' temporaries: O(T) per row at most (the backward's delta, [B, H, T]).
  Tensor out2 = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), {}, 0.0, true);
  ir::Captured c = ir::capture({out2.node()}, dev);
  sched::StepPlan plan = sched::plan_steps(c.graph, dev.is_cuda());
  REQUIRE(plan.attentions.size() == 1);
  for (const auto& t : plan.temps) CHECK(t.shape.numel() < T * T);
  // Dropout stays in the fused step (its mask is drawn inside), with no [L, S] buffer either.
  Tensor dropped = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), {}, 0.5, true);
  ir::Captured cd = ir::capture({dropped.node()}, dev);
  sched::StepPlan dplan = sched::plan_steps(cd.graph, dev.is_cuda());
  REQUIRE(dplan.attentions.size() == 1);
  CHECK(dplan.attentions[0].dropout_p == 0.5);
  for (const auto& t : dplan.temps) CHECK(t.shape.numel() < T * T);
  // Written out when everything is dropped, and the log says why.
  kiln::testing::LogCapture why("schedule");
  (void)scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), {}, 1.0).eval();
  CHECK(why.text().find("written out: dropout_p is 1") != std::string::npos);
}

TEST_CASE("scaled_dot_product_attention: typed errors name the op, the shapes and the dtypes") {
  Tensor q = randn({2, 4, 8}, 0, f32, dev), k = randn({2, 5, 8}, 0, f32, dev), v = randn({2, 5, 3}, 0, f32, dev);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, randn({2, 5, 7}, 0, f32, dev), v),
                       doctest::Contains("scaled_dot_product_attention: query Tensor(float32[2, 4, 8]"), ShapeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, randn({2, 6, 3}, 0, f32, dev)), ShapeError);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k.to(f64), v), doctest::Contains("one dtype"), DTypeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q.to(DType::Int32), k.to(DType::Int32), v.to(DType::Int32)), DTypeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, zeros({4, 5}, DType::Bool, dev), 0.0, true), ValueError);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, zeros({3, 5}, DType::Bool, dev)),
                       doctest::Contains("does not broadcast to the scores"), ShapeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, zeros({4, 5}, DType::Int64, dev)), DTypeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, {}, 1.5), ValueError);
  Tensor q4 = randn({1, 6, 4, 8}, 0, f32, dev), k4 = randn({1, 4, 5, 8}, 0, f32, dev),
         v4 = randn({1, 4, 5, 8}, 0, f32, dev);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q4, k4, v4, {}, 0.0, false, std::nullopt, true),
                       doctest::Contains("enable_gqa"), ShapeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q4, k4, v4), ShapeError);  // heads differ without enable_gqa
}

TEST_CASE("scaled_dot_product_attention: torch's mask dtypes, key and value heads grouped apart, a cast mask") {
  Tensor q = randn({2, 4, 3, 8}, 31, f32, dev), k = randn({2, 4, 5, 8}, 32, f32, dev), v = randn({2, 4, 5, 6}, 33, f32, dev);
  // An additive mask is float32 or of the query's dtype (torch refuses the others).
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, zeros({3, 5}, f64, dev)),
                       doctest::Contains("attn_mask Tensor(float64[3, 5]"), DTypeError);
  CHECK_THROWS_AS(scaled_dot_product_attention(q, k, v, zeros({3, 5}, f16, dev)), DTypeError);
  Tensor m32 = randn({3, 5}, 34, f32, dev);
  Tensor q64 = q.to(f64), k64 = k.to(f64), v64 = v.to(f64);
  CHECK(relative_error(scaled_dot_product_attention(q64, k64, v64, m32),
                       scaled_dot_product_attention(q64, k64, v64, m32.to(f64))) < 1e-12);
  // enable_gqa: the key's heads and the value's each divide the query's, and may differ.
  Tensor kg = randn({2, 2, 5, 8}, 35, f64, dev).requires_grad_(), vg = randn({2, 1, 5, 6}, 36, f64, dev).requires_grad_();
  Tensor qg = q64.detach().requires_grad_();
  Tensor out = scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true, std::nullopt, true);
  Tensor kr = kg.detach().requires_grad_(), vr = vg.detach().requires_grad_(), qr = q64.detach().requires_grad_();
  Tensor k4 = reshape(broadcast_to(reshape(kr, {2, 2, 1, 5, 8}), {2, 2, 2, 5, 8}), {2, 4, 5, 8});
  Tensor want = scaled_dot_product_attention(qr, k4, broadcast_to(vr, {2, 4, 5, 6}), {}, 0.0, true);
  CHECK(out.shape() == Shape{2, 4, 3, 6});
  CHECK(relative_error(out, want) < 1e-12);
  Tensor cot = randn({2, 4, 3, 6}, 37, f64, dev);
  sum(out * cot).backward();
  sum(want * cot).backward();
  CHECK(relative_error(qg.grad(), qr.grad()) < 1e-12);
  CHECK(relative_error(kg.grad(), kr.grad()) < 1e-12);
  CHECK(relative_error(vg.grad(), vr.grad()) < 1e-12);
  CHECK_THROWS_AS(scaled_dot_product_attention(q64, kg, randn({2, 3, 5, 6}, 0, f64, dev), {}, 0.0, false,
                                               std::nullopt, true),
                  ShapeError);
  // Under autocast an additive mask is cast to the lower precision with q, k and v (torch's
  // lower-precision policy casts every floating argument).
  Tensor m = (randn({2, 1, 3, 5}, 38, f32, dev) * 3.0 + 0.1).eval();
  Tensor plain = scaled_dot_product_attention(q.to(bf16), k.to(bf16), v.to(bf16), m.to(bf16));
  AutocastGuard autocast(bf16);
  Tensor cast = scaled_dot_product_attention(q, k, v, m);
  CHECK(cast.dtype() == bf16);
  CHECK(values(cast) == values(plain));
}

TEST_CASE("scaled_dot_product_attention: under kiln::compile, autocast and nn::MultiheadAttention") {
  Tensor q = randn({1, 2, 20, 16}, 21, f32, dev), k = randn({1, 2, 20, 16}, 22, f32, dev),
         v = randn({1, 2, 20, 16}, 23, f32, dev);
  auto fn = [](const Tensor& a, const Tensor& b, const Tensor& c) {
    return scaled_dot_product_attention(a, b, c, {}, 0.0, true);
  };
  auto compiled = kiln::compile(fn);
  Tensor want = nn::functional::scaled_dot_product_attention_math(q.to(f64), k.to(f64), v.to(f64), {}, 0.0, true);
  CHECK(relative_error(compiled(q, k, v), want) < 1e-5);
  CHECK(relative_error(compiled(q, k, v), want) < 1e-5);  // the replay
  {
    AutocastGuard autocast(bf16);
    Tensor low = scaled_dot_product_attention(q, k, v, {}, 0.0, true);
    CHECK(low.dtype() == bf16);
    CHECK(relative_error(low, want) < 3e-2);
  }
  nn::MultiheadAttention mha(16, 2);
  mha.to(dev);
  Tensor x = randn({3, 10, 16}, 24, f32, dev);
  auto [y, w] = mha.forward(x, x, x, {}, false);
  CHECK(y.shape() == Shape{3, 10, 16});
}

TEST_CASE("scaled_dot_product_attention: a compiled forward keeps the log-sum-exp for its backward") {
  auto fn = [](const Tensor& a, const Tensor& b, const Tensor& c) {
    return scaled_dot_product_attention(a, b, c, {}, 0.0, true);
  };
  auto compiled = kiln::compile(fn);
  Tensor q = randn({1, 2, 40, 16}, 31, f32, dev).requires_grad_(), k = randn({1, 2, 40, 16}, 32, f32, dev),
         v = randn({1, 2, 40, 16}, 33, f32, dev).requires_grad_();
  kiln::testing::LogCapture logs("schedule");
  sum(compiled(q, k, v)).backward();
  (void)q.grad().eval();
  const std::string text = logs.text();
  // One forward step computing the output and the lse; the backward recomputes nothing forward.
  std::size_t forwards = 0;
  for (std::size_t at = text.find("call attention forward"); at != std::string::npos;
       at = text.find("call attention forward", at + 1))
    ++forwards;
  CHECK(forwards == 1);
  CHECK(text.find(" lse ") != std::string::npos);
  CHECK(text.find("call attention backward") != std::string::npos);
  Tensor qr = q.detach().requires_grad_(), vr = v.detach().requires_grad_();
  sum(nn::functional::scaled_dot_product_attention_math(qr, k, vr, {}, 0.0, true)).backward();
  CHECK(relative_error(q.grad(), qr.grad()) < 1e-5);
  CHECK(relative_error(v.grad(), vr.grad()) < 1e-5);
}

TEST_CASE("scaled_dot_product_attention: max-autotune times cuDNN's engine configurations, results unchanged") {
  if (!dev.is_cuda() || !runtime::cudnn_available()) {
    MESSAGE("no GPU with cuDNN: nothing to tune");
    return;
  }
  auto fn = [](const Tensor& a, const Tensor& b, const Tensor& c) {
    return scaled_dot_product_attention(a, b, c, {}, 0.0, true);
  };
  Tensor q = randn({2, 4, 320, 64}, 51, f32, dev).to(bf16).eval(),
         k = randn({2, 4, 320, 64}, 52, f32, dev).to(bf16).eval(),
         v = randn({2, 4, 320, 64}, 53, f32, dev).to(bf16).eval();
  // "-no-cudagraphs": the run is the step executor's, whose first run tunes.
  auto tuned = kiln::compile(fn, {.mode = "max-autotune-no-cudagraphs"});
  Tensor want = nn::functional::scaled_dot_product_attention_math(q.to(f64), k.to(f64), v.to(f64), {}, 0.0, true);
  for (int call = 0; call < 2; ++call) CHECK(relative_error(tuned(q, k, v), want) <= tolerance(bf16));
  auto& cache = runtime::detail::cudnn_attention_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  int found = 0;
  for (const auto& [p, plan] : cache.plans) {
    if (!plan || p.q_len != 320 || p.heads != 4 || p.dtype != bf16 || p.backward) continue;  // this test's
    ++found;
    // Every configuration cuDNN finalized was timed, and the choice is one of them.
    const auto ms = plan->tuned_ms();
    CHECK(ms.size() == (plan->graph->plan_count() >= 2 ? plan->graph->plan_count() : 0));
    CHECK(plan->chosen() < plan->graph->plan_count());
  }
  CHECK(found == 1);
}

TEST_CASE("scaled_dot_product_attention: max-autotune times cuDNN's backward too, gradients unchanged") {
  if (!dev.is_cuda() || !runtime::cudnn_available()) {
    MESSAGE("no GPU with cuDNN: nothing to tune");
    return;
  }
  // The backward plan reads a copy of the forward's lse from its scratch (written by a kernel
  // before each run): max-autotune writes it before the timed runs too, once the scratch has
  // its final size. Every configuration is timed and the gradients are the definition's.
  auto make = [](std::uint64_t seed) { return randn({2, 4, 320, 64}, seed, f32, dev).to(bf16).eval(); };
  Tensor q = make(61), k = make(62), v = make(63), cot = make(64).to(f32).eval();
  auto step = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& g) {
    Tensor x = a.detach().requires_grad_(), y = b.detach().requires_grad_(), z = c.detach().requires_grad_();
    return autograd::grad({sum(scaled_dot_product_attention(x, y, z, {}, 0.0, true).to(f32) * g)}, {x, y, z});
  };
  auto tuned = kiln::compile(step, {.mode = "max-autotune-no-cudagraphs"});
  std::vector<Tensor> want;
  {
    Tensor x = q.to(f64).requires_grad_(), y = k.to(f64).requires_grad_(), z = v.to(f64).requires_grad_();
    want = autograd::grad(
        {sum(nn::functional::scaled_dot_product_attention_math(x, y, z, {}, 0.0, true) * cot.to(f64))}, {x, y, z});
  }
  for (int call = 0; call < 2; ++call) {
    const std::vector<Tensor> got = tuned(q, k, v, cot);
    REQUIRE(got.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(relative_error(got[i], want[i]) <= 4 * tolerance(bf16));
  }
  auto& cache = runtime::detail::cudnn_attention_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  int found = 0;
  for (const auto& [p, plan] : cache.plans) {
    if (!plan || p.q_len != 320 || p.heads != 4 || p.dtype != bf16 || !p.backward) continue;  // this test's
    ++found;
    CHECK(plan->tuned_ms().size() == (plan->graph->plan_count() >= 2 ? plan->graph->plan_count() : 0));
  }
  CHECK(found == 1);
}

}  // namespace kiln_test_nn_attention
