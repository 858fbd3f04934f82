// kiln::nn: each layer's forward against a float64 loop reference and its backward by
// gradcheck; the module registry (names, order, children, modes, to(), state_dict, errors);
// model.compile(); compiled and eager training of an MLP and of a 2-layer GPT.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <kiln/kiln.hpp>

#include "gpt.hpp"

namespace kiln_test_nn_nn {

using namespace kiln;

namespace {

std::vector<double> values(const Tensor& t) { return t.to(f64).to_vector<double>(); }

void check_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-9) {
  std::vector<double> g = values(got);
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(want[i]).epsilon(tol).scale(1.0));
}

Tensor f64_randn(const Shape& s, std::uint64_t seed) { return randn(s, seed, f64).eval(); }

/// Reference attention of one head: q [L, D], k [S, D], v [S, D] (row-major), additive mask
/// [L, S] or empty; returns the output [L, D] and the weights [L, S].
std::pair<std::vector<double>, std::vector<double>> attention_ref(const std::vector<double>& q,
                                                                   const std::vector<double>& k,
                                                                   const std::vector<double>& v, std::int64_t L,
                                                                   std::int64_t S, std::int64_t D,
                                                                   const std::vector<double>& mask) {
  std::vector<double> out(static_cast<std::size_t>(L * D), 0.0), w(static_cast<std::size_t>(L * S));
  for (std::int64_t i = 0; i < L; ++i) {
    double top = -INFINITY;
    for (std::int64_t j = 0; j < S; ++j) {
      double s = 0;
      for (std::int64_t d = 0; d < D; ++d) s += q[i * D + d] * k[j * D + d];
      s = s / std::sqrt(static_cast<double>(D)) + (mask.empty() ? 0.0 : mask[i * S + j]);
      w[i * S + j] = s;
      top = std::max(top, s);
    }
    double total = 0;
    for (std::int64_t j = 0; j < S; ++j) total += w[i * S + j] = std::exp(w[i * S + j] - top);
    for (std::int64_t j = 0; j < S; ++j) {
      w[i * S + j] /= total;
      for (std::int64_t d = 0; d < D; ++d) out[i * D + d] += w[i * S + j] * v[j * D + d];
    }
  }
  return {out, w};
}

struct Block : nn::Module {
  nn::LayerNorm ln{4};
  nn::Linear fc{4, 8}, proj{8, 4};
  Block() {
    register_module("ln", ln);
    register_module("fc", fc);
    register_module("proj", proj);
  }
  Tensor forward(const Tensor& x) override { return x + proj(relu(fc(ln(x)))); }
};

}  // namespace

TEST_CASE("Linear: PyTorch's shapes and init bounds; forward against float64 loops; backward by gradcheck") {
  manual_seed(3);
  nn::Linear lin(3, 5);
  CHECK(lin.weight.shape() == Shape{5, 3});
  CHECK(lin.bias.shape() == Shape{5});
  const double bound = 1.0 / std::sqrt(3.0);
  for (double w : values(lin.weight)) CHECK(std::abs(w) <= bound);
  CHECK(lin.weight.requires_grad());
  CHECK(lin.weight.is_leaf());
  lin.to(f64);
  Tensor x = f64_randn({2, 3}, 1);
  std::vector<double> xv = values(x), wv = values(lin.weight), bv = values(lin.bias), want;
  for (int i = 0; i < 2; ++i)
    for (int o = 0; o < 5; ++o) {
      double s = bv[o];
      for (int k = 0; k < 3; ++k) s += xv[i * 3 + k] * wv[o * 3 + k];
      want.push_back(s);
    }
  check_close(lin(x), want);
  CHECK(autograd::gradcheck([](std::vector<Tensor> a) { return nn::functional::linear(a[0], a[1], a[2]); },
                            {f64_randn({2, 3, 4}, 4), f64_randn({5, 4}, 5), f64_randn({5}, 6)}));
  nn::Linear no_bias(3, 2, false);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.parameters().size() == 1);
  CHECK_THROWS_AS(lin(f64_randn({2, 4}, 1)), ShapeError);
}

TEST_CASE("LayerNorm and RMSNorm: ones/zeros init, float64 forward, gradcheck through weight and bias") {
  nn::LayerNorm ln(4);
  CHECK(values(ln.weight) == std::vector<double>(4, 1.0));
  CHECK(values(ln.bias) == std::vector<double>(4, 0.0));
  ln.to(f64);
  Tensor x = f64_randn({3, 4}, 7);
  std::vector<double> xv = values(x), want;
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < 4; ++c) m += xv[r * 4 + c] / 4;
    for (int c = 0; c < 4; ++c) v += (xv[r * 4 + c] - m) * (xv[r * 4 + c] - m) / 4;
    for (int c = 0; c < 4; ++c) want.push_back((xv[r * 4 + c] - m) / std::sqrt(v + 1e-5));
  }
  check_close(ln(x), want);
  CHECK(autograd::gradcheck([](std::vector<Tensor> a) { return layer_norm(a[0], a[1], a[2]); },
                            {f64_randn({3, 4}, 8), f64_randn({4}, 9), f64_randn({4}, 10)}));
  nn::RMSNorm rms(4, 1e-6);
  rms.to(f64);
  want.clear();
  for (int r = 0; r < 3; ++r) {
    double ms = 0;
    for (int c = 0; c < 4; ++c) ms += xv[r * 4 + c] * xv[r * 4 + c] / 4;
    for (int c = 0; c < 4; ++c) want.push_back(xv[r * 4 + c] / std::sqrt(ms + 1e-6));
  }
  check_close(rms(x), want);
  CHECK(autograd::gradcheck([](std::vector<Tensor> a) { return rms_norm(a[0], a[1], 1e-6); },
                            {f64_randn({3, 4}, 11), f64_randn({4}, 12)}));
  CHECK_THROWS_AS(ln(f64_randn({3, 5}, 1)), ShapeError);
}

TEST_CASE("Embedding: rows of the table, scatter-added gradients, padding_idx zero and frozen") {
  manual_seed(5);
  nn::Embedding emb(6, 3, 2);
  std::vector<double> w = values(emb.weight);
  for (int c = 0; c < 3; ++c) CHECK(w[2 * 3 + c] == 0.0);
  Tensor idx = from_vector<std::int64_t>({1, 2, 1, 5}, {2, 2});
  Tensor out = emb(idx);
  CHECK(out.shape() == Shape{2, 2, 3});
  std::vector<double> o = values(out);
  const std::int64_t rows[4] = {1, 2, 1, 5};
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 3; ++c) CHECK(o[i * 3 + c] == w[rows[i] * 3 + c]);
  Tensor g = randn({2, 2, 3}, 9).eval();
  out.backward(g);
  std::vector<double> gv = values(g), want(18, 0.0);
  for (int i = 0; i < 4; ++i)
    if (rows[i] != 2)
      for (int c = 0; c < 3; ++c) want[rows[i] * 3 + c] += gv[i * 3 + c];
  check_close(emb.weight.grad(), want, 1e-6);
  CHECK_THROWS_AS(nn::Embedding(4, 2, 4), IndexError);
}

TEST_CASE("Embedding: a padding row holding values (loaded) is what its lookups return, as torch; no gradient") {
  nn::Embedding emb(4, 2, 1);
  nn::StateDict sd;
  sd.insert("weight", from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
  emb.load_state_dict(sd);
  Tensor out = emb(from_vector<std::int64_t>({1, 3, 1}, {3}));
  CHECK(values(out) == std::vector<double>{3, 4, 7, 8, 3, 4});  // torch: weight[1], not zeros
  out.backward(ones({3, 2}));
  CHECK(values(emb.weight.grad()) == std::vector<double>{0, 0, 0, 0, 0, 0, 1, 1});
}

TEST_CASE("nn::functional::embedding takes torch.nn.functional's order (input, weight) and padding_idx") {
  Tensor w = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}).requires_grad_();
  Tensor ids = from_vector<std::int64_t>({3, 0, 3, 1}, {2, 2});
  Tensor out = nn::functional::embedding(ids, w);
  CHECK(out.shape() == Shape{2, 2, 2});
  CHECK(values(out) == std::vector<double>{7, 8, 1, 2, 7, 8, 3, 4});
  // padding_idx -1 is row 3: read as the table holds it, no gradient.
  Tensor padded = nn::functional::embedding(ids, w, -1);
  CHECK(values(padded) == values(out));
  padded.backward(ones({2, 2, 2}, f64));
  CHECK(values(w.grad()) == std::vector<double>{1, 1, 1, 1, 0, 0, 0, 0});
  CHECK_THROWS_AS(nn::functional::embedding(ids, w, 4), IndexError);
  CHECK_THROWS_AS(nn::functional::embedding(ids, w, -5), IndexError);
}

TEST_CASE("LayerNorm and RMSNorm over several trailing dims (torch's normalized_shape list)") {
  nn::LayerNorm ln(Shape{2, 3});
  nn::RMSNorm rms(Shape{2, 3}, 1e-6);
  CHECK(ln.weight.shape() == Shape{2, 3});
  CHECK(ln.bias.shape() == Shape{2, 3});
  CHECK(rms.weight.shape() == Shape{2, 3});
  CHECK(ln.named_parameters().keys() == std::vector<std::string>{"weight", "bias"});
  ln.to(f64);
  rms.to(f64);
  Tensor w = f64_randn({2, 3}, 21), b = f64_randn({2, 3}, 22);
  {
    NoGradGuard off;
    ln.weight.assign(w);
    ln.bias.assign(b);
    rms.weight.assign(w);
  }
  Tensor x = f64_randn({4, 2, 3}, 23);
  const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> want_ln, want_rms;
  for (int r = 0; r < 4; ++r) {  // each [2, 3] block normalised as one
    double m = 0, v = 0, ms = 0;
    for (int c = 0; c < 6; ++c) m += xv[r * 6 + c] / 6;
    for (int c = 0; c < 6; ++c) v += (xv[r * 6 + c] - m) * (xv[r * 6 + c] - m) / 6;
    for (int c = 0; c < 6; ++c) ms += xv[r * 6 + c] * xv[r * 6 + c] / 6;
    for (int c = 0; c < 6; ++c) want_ln.push_back((xv[r * 6 + c] - m) / std::sqrt(v + 1e-5) * wv[c] + bv[c]);
    for (int c = 0; c < 6; ++c) want_rms.push_back(xv[r * 6 + c] / std::sqrt(ms + 1e-6) * wv[c]);
  }
  check_close(ln(x), want_ln);
  check_close(rms(x), want_rms);
  CHECK(ln(x).shape() == Shape{4, 2, 3});
  // The gradient of the weight is the sum over the batch of dy * x_hat, per [2, 3] position.
  sum(ln(x)).backward();
  std::vector<double> gw = values(ln.weight.grad()), want_gw(6, 0.0);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) want_gw[c] += (want_ln[r * 6 + c] - bv[c]) / wv[c];
  check_close(ln.weight.grad(), want_gw, 1e-9);
  CHECK(values(ln.bias.grad()) == std::vector<double>(6, 4.0));
  CHECK_THROWS_AS(ln(f64_randn({4, 3, 2}, 1)), ShapeError);  // ends in [3, 2], not [2, 3]
  CHECK_THROWS_AS(rms(f64_randn({3}, 1)), ShapeError);
  CHECK_THROWS_AS(nn::LayerNorm(Shape{}), ValueError);
}

TEST_CASE("RMSNorm of float16 and bfloat16: the default eps is float32's epsilon, as torch's kernels") {
  for (DType dt : {f16, bf16}) {
    CAPTURE(dt);
    nn::RMSNorm rms(4, std::nullopt, false, dt);
    // Rows of about 1e-3: a mean square near 1e-6, so eps 2^-10 (torch.finfo(float16).eps) would
    // shrink them about 30 times; 2^-23 (float32's, what torch adds) barely moves them.
    Tensor x = (full({2, 4}, 1e-3, f32) * (rand({2, 4}, 5) + 1.0)).to(dt).eval();
    const std::vector<double> xv = values(x);
    std::vector<double> want;
    for (int r = 0; r < 2; ++r) {
      double ms = 0;
      for (int c = 0; c < 4; ++c) ms += xv[r * 4 + c] * xv[r * 4 + c] / 4;
      for (int c = 0; c < 4; ++c) want.push_back(xv[r * 4 + c] / std::sqrt(ms + std::ldexp(1.0, -23)));
    }
    check_close(rms(x), want, dt == f16 ? 2e-3 : 1e-2);
  }
}

TEST_CASE("Dropout: identity in eval, 0 or x/(1-p) in training, seeded masks, gradient through the mask") {
  nn::Dropout drop(0.3);
  Tensor x = (rand({10000}, 1) + 1.0).eval().requires_grad_();
  drop.eval();
  CHECK(values(drop(x)) == values(x));
  drop.train();
  manual_seed(11);
  Tensor y = drop(x);
  manual_seed(11);
  std::vector<double> again = values(drop(x));
  std::vector<double> yv = values(y), xv = values(x);
  CHECK(yv == again);
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < yv.size(); ++i) {
    if (yv[i] == 0.0)
      ++zeros;
    else
      CHECK(yv[i] == doctest::Approx(xv[i] / 0.7).epsilon(1e-6));
  }
  CHECK(std::abs(static_cast<double>(zeros) / 10000.0 - 0.3) < 0.03);  // 6 binomial std
  y.backward(ones({10000}));
  std::vector<double> g = values(x.grad());
  for (std::size_t i = 0; i < yv.size(); ++i) CHECK(g[i] == doctest::Approx(yv[i] == 0.0 ? 0.0 : 1.0 / 0.7));
  manual_seed(12);
  CHECK(values(drop(x)) != yv);  // another key, another mask
  CHECK_THROWS_AS(nn::Dropout(1.5), ValueError);
  CHECK(values(nn::functional::dropout(x, 1.0)) == std::vector<double>(10000, 0.0));
}

TEST_CASE("activation modules equal their functions") {
  Tensor x = randn({5, 7}, 2).eval();
  CHECK(values(nn::ReLU()(x)) == values(relu(x)));
  CHECK(values(nn::SiLU()(x)) == values(silu(x)));
  CHECK(values(nn::Tanh()(x)) == values(tanh(x)));
  CHECK(values(nn::GELU()(x)) == values(gelu(x)));
  CHECK(values(nn::GELU("tanh")(x)) == values(gelu(x, true)));
  CHECK(values(nn::functional::relu(x)) == values(relu(x)));  // torch.nn.functional's names
  CHECK_THROWS_AS(nn::GELU("fast"), ValueError);
  // torch.nn.functional.gelu's approximate as a word (a string must not become the bool true).
  CHECK(values(nn::functional::gelu(x, "none")) == values(gelu(x)));
  CHECK(values(nn::functional::gelu(x, std::string("tanh"))) == values(gelu(x, true)));
  CHECK_THROWS_AS(nn::functional::gelu(x, "fast"), ValueError);
}

TEST_CASE("scaled_dot_product_attention and MultiheadAttention against float64 loops") {
  const std::int64_t L = 3, S = 4, D = 2;
  Tensor q = f64_randn({L, D}, 1), k = f64_randn({S, D}, 2), v = f64_randn({S, D}, 3);
  auto [plain, pw] = attention_ref(values(q), values(k), values(v), L, S, D, {});
  check_close(nn::functional::scaled_dot_product_attention(q, k, v), plain);
  std::vector<double> causal(static_cast<std::size_t>(L * S));
  for (std::int64_t i = 0; i < L; ++i)
    for (std::int64_t j = 0; j < S; ++j) causal[i * S + j] = j <= i ? 0.0 : -INFINITY;
  auto [masked, mw] = attention_ref(values(q), values(k), values(v), L, S, D, causal);
  check_close(nn::functional::scaled_dot_product_attention(q, k, v, {}, 0.0, true), masked);
  Tensor keep = from_vector<bool>({true, true, false, false, true, true, true, false, true, true, true, true}, {L, S});
  std::vector<double> bool_mask;
  for (bool b : std::vector<bool>{true, true, false, false, true, true, true, false, true, true, true, true})
    bool_mask.push_back(b ? 0.0 : -INFINITY);
  check_close(nn::functional::scaled_dot_product_attention(q, k, v, keep),
              attention_ref(values(q), values(k), values(v), L, S, D, bool_mask).first);
  CHECK(autograd::gradcheck(
      [](std::vector<Tensor> a) { return nn::functional::scaled_dot_product_attention(a[0], a[1], a[2], {}, 0.0, true); },
      {f64_randn({2, 3, 2}, 4), f64_randn({2, 3, 2}, 5), f64_randn({2, 3, 2}, 6)}));

  // MultiheadAttention: E 4, 2 heads, [L, N, E] input; the reference projects with the module's
  // own weights and runs each head through attention_ref.
  manual_seed(21);
  nn::MultiheadAttention mha(4, 2);
  mha.to(f64);
  CHECK(mha.named_parameters().keys() ==
        std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  CHECK(values(mha.in_proj_bias) == std::vector<double>(12, 0.0));
  Tensor x = f64_randn({3, 2, 4}, 7);  // L 3, N 2
  auto [out, weights] = mha(x, x, x);
  CHECK(out.shape() == Shape{3, 2, 4});
  CHECK(weights.shape() == Shape{2, 3, 3});
  std::vector<double> xv = values(x), W = values(mha.in_proj_weight), Wo = values(mha.out_proj.weight),
                      bo = values(mha.out_proj.bias), ov = values(out), wv = values(weights);
  for (std::int64_t n = 0; n < 2; ++n) {
    std::vector<double> proj[3];
    for (int part = 0; part < 3; ++part)
      for (std::int64_t l = 0; l < 3; ++l)
        for (int e = 0; e < 4; ++e) {
          double s = 0;
          for (int c = 0; c < 4; ++c) s += xv[(l * 2 + n) * 4 + c] * W[(part * 4 + e) * 4 + c];
          proj[part].push_back(s);
        }
    std::vector<double> concat(12, 0.0), avg(9, 0.0);
    for (int h = 0; h < 2; ++h) {
      std::vector<double> qh, kh, vh;
      for (int l = 0; l < 3; ++l)
        for (int d = 0; d < 2; ++d) {
          qh.push_back(proj[0][l * 4 + h * 2 + d]);
          kh.push_back(proj[1][l * 4 + h * 2 + d]);
          vh.push_back(proj[2][l * 4 + h * 2 + d]);
        }
      auto [o, w] = attention_ref(qh, kh, vh, 3, 3, 2, {});
      for (int l = 0; l < 3; ++l)
        for (int d = 0; d < 2; ++d) concat[l * 4 + h * 2 + d] = o[l * 2 + d];
      for (int i = 0; i < 9; ++i) avg[i] += w[i] / 2;
    }
    for (int l = 0; l < 3; ++l)
      for (int e = 0; e < 4; ++e) {
        double s = bo[e];
        for (int c = 0; c < 4; ++c) s += concat[l * 4 + c] * Wo[e * 4 + c];
        CHECK(ov[(l * 2 + n) * 4 + e] == doctest::Approx(s).epsilon(1e-9));
      }
    for (int i = 0; i < 9; ++i) CHECK(wv[n * 9 + i] == doctest::Approx(avg[i]).epsilon(1e-9));
  }
  // Mismatched batch sizes or key/value lengths: a ShapeError naming the module, not a reshape's.
  for (auto [k, v] : {std::pair{f64_randn({3, 5, 4}, 8), f64_randn({3, 5, 4}, 9)},
                      std::pair{f64_randn({4, 2, 4}, 8), f64_randn({3, 2, 4}, 9)}}) {
    try {
      (void)mha(x, k, v);
      FAIL("mismatched key/value accepted");
    } catch (const ShapeError& e) {
      CHECK(std::string(e.what()).find("MultiheadAttention") != std::string::npos);
      CHECK(std::string(e.what()).find("batch size") != std::string::npos);
    }
  }
  // Without the weights it runs fused: the same outputs, with a bool mask (true = masked out)
  // and causal too.
  check_close(mha(x, x, x, {}, false).first, values(out));
  Tensor masked_out = from_vector<bool>({false, true, false, false, false, true, true, false, false}, {3, 3});
  check_close(mha(x, x, x, masked_out, false).first, values(mha(x, x, x, masked_out, true).first));
  check_close(mha(x, x, x, {}, false, true).first, values(mha(x, x, x, {}, true, true).first));
  // Training with dropout: the fused path drops the weights the written-out path drops under
  // the same seed.
  nn::MultiheadAttention dropping(4, 2, 0.5);
  dropping.load_state_dict(mha.state_dict());
  dropping.to(f64);
  manual_seed(5);
  const std::vector<double> written = values(dropping(x, x, x, {}, true).first);
  manual_seed(5);
  check_close(dropping(x, x, x, {}, false).first, written);
  CHECK(written != values(out));  // something was dropped
  nn::MultiheadAttention first(4, 2, 0.0, true, true);
  first.load_state_dict(mha.state_dict());
  first.to(f64);
  check_close(transpose(first.forward(transpose(x, 0, 1), transpose(x, 0, 1), transpose(x, 0, 1)).first, 0, 1),
              values(out));
}

TEST_CASE("CausalSelfAttention: a position never sees the ones after it") {
  manual_seed(4);
  nn::CausalSelfAttention attn(8, 2);
  attn.to(f64);
  Tensor x = f64_randn({2, 5, 8}, 1);
  std::vector<double> base = values(attn(x));
  std::vector<double> moved_v = values(x);
  for (int b = 0; b < 2; ++b)
    for (int c = 0; c < 8; ++c) moved_v[(b * 5 + 4) * 8 + c] += 1.0;  // change the last position only
  std::vector<double> moved = values(attn(from_vector(moved_v, {2, 5, 8})));
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 5; ++t)
      for (int c = 0; c < 8; ++c) {
        const std::size_t i = static_cast<std::size_t>((b * 5 + t) * 8 + c);
        if (t < 4) CHECK(moved[i] == doctest::Approx(base[i]).epsilon(1e-12));
      }
  CHECK(moved[4 * 8] != base[4 * 8]);
}

TEST_CASE("Module registry: dotted names in PyTorch's order, children, tied weights, modes, errors") {
  manual_seed(1);
  auto model = nn::Sequential(nn::Linear(4, 4), nn::ReLU(), Block());
  CHECK(model.named_parameters().keys() ==
        std::vector<std::string>{"0.weight", "0.bias", "2.ln.weight", "2.ln.bias", "2.fc.weight", "2.fc.bias",
                                 "2.proj.weight", "2.proj.bias"});
  CHECK(model.children().size() == 3);
  CHECK(model.modules().size() == 7);  // the Sequential, its 3 children, Block's 3
  CHECK(model.parameters().size() == 8);
  model.eval();
  for (nn::Module* m : model.modules()) CHECK_FALSE(m->is_training());
  model.train();
  for (nn::Module* m : model.modules()) CHECK(m->is_training());

  // A moved module's registry still points at its own members.
  Block b;
  Block moved = std::move(b);
  CHECK(moved.named_parameters().at("fc.weight").node() == moved.fc.weight.node());

  struct Tied : nn::Module {
    nn::Embedding emb{5, 3};
    Tensor head;
    Tensor scale = ones({3});
    Tied() {
      register_module("emb", emb);
      head = emb.weight;
      register_parameter("head", head);  // the same tensor twice: listed once
      register_buffer("scale", scale);
      register_buffer("scratch", zeros({2}), false);
    }
  } tied;
  CHECK(tied.parameters().size() == 1);
  CHECK(tied.buffers().size() == 2);
  CHECK(tied.state_dict().keys() == std::vector<std::string>{"head", "scale", "emb.weight"});
  CHECK_THROWS_AS(tied.register_buffer("scale", zeros({1})), ValueError);
  CHECK_THROWS_AS(tied.register_parameter("a.b", zeros({1})), ValueError);
  CHECK_THROWS_AS(model.forward(zeros({1, 3})), ShapeError);
  CHECK_THROWS_AS(nn::Module().forward(zeros({1})), ValueError);
}

TEST_CASE("Module: a submodule registered under two names is listed once by named_modules and children (torch)") {
  struct Shared : nn::Module {
    std::shared_ptr<nn::Linear> fc = std::make_shared<nn::Linear>(2, 2);
    Shared() {
      register_module("a", fc);
      register_module("b", fc);
    }
  } net;
  std::vector<std::string> names;
  for (auto& [k, m] : net.named_modules()) names.push_back(k);
  CHECK(names == std::vector<std::string>{"", "a"});
  CHECK(net.modules().size() == 2);
  CHECK(net.children().size() == 1);
  CHECK(net.named_children().front().first == "a");
  CHECK(net.named_parameters().keys() == std::vector<std::string>{"a.weight", "a.bias"});
  CHECK(net.state_dict().keys() == std::vector<std::string>{"a.weight", "a.bias", "b.weight", "b.bias"});
}

TEST_CASE("Module: to(dtype) in place, zero_grad, state_dict round trip, strict load errors change nothing") {
  manual_seed(2);
  Block a;
  Tensor handle = a.fc.weight;  // another handle of the same parameter (an optimizer's list)
  a.to(f64);
  CHECK(handle.dtype() == f64);
  CHECK(a.fc.weight.dtype() == f64);
  CHECK(handle.requires_grad());
  Tensor x = f64_randn({2, 4}, 3);
  sum(a(x)).backward();
  CHECK(a.fc.weight.grad().defined());
  a.zero_grad(false);
  CHECK(values(a.fc.weight.grad()) == std::vector<double>(32, 0.0));
  a.zero_grad();
  CHECK_FALSE(a.fc.weight.grad().defined());

  manual_seed(99);
  Block b;
  b.to(f64);
  CHECK(values(b(x)) != values(a(x)));
  b.load_state_dict(a.state_dict());
  CHECK(values(b(x)) == values(a(x)));

  nn::StateDict partial = a.state_dict();
  nn::StateDict missing;
  for (auto& [k, v] : partial)
    if (k != "proj.bias") missing.insert(k, v);
  Block c;
  const std::vector<double> before = values(c.fc.weight);
  CHECK_THROWS_WITH_AS(c.load_state_dict(missing), doctest::Contains("missing keys: proj.bias"), ValueError);
  CHECK(values(c.fc.weight) == before);  // nothing was written
  c.load_state_dict(missing, false);     // non-strict: the rest loads
  CHECK(values(c.fc.weight) == values(a.fc.weight));
  nn::StateDict extra = a.state_dict();
  extra.insert("bogus", zeros({1}));
  CHECK_THROWS_WITH_AS(c.load_state_dict(extra), doctest::Contains("unexpected keys: bogus"), ValueError);
  nn::StateDict wrong = a.state_dict();
  wrong.set("fc.bias", zeros({9}));
  CHECK_THROWS_WITH_AS(c.load_state_dict(wrong, false), doctest::Contains("fc.bias"), ValueError);
}

TEST_CASE("model.compile(): traced once, replayed with updated parameters, one trace per train/eval mode") {
  manual_seed(6);
  auto model = nn::Sequential(nn::Linear(4, 8), nn::GELU("tanh"), nn::Dropout(0.25), nn::Linear(8, 2));
  Tensor x = randn({16, 4}, 1).eval();
  model.eval();
  const std::vector<double> eager = values(model(x));
  model.compile();
  CHECK(model.is_compiled());
  CHECK(values(model(x)) == eager);
  CHECK(values(model(x)) == eager);
  CHECK(model.compile_stats().traces == 1);
  {
    NoGradGuard off;
    dynamic_cast<nn::Linear&>(model[3]).bias.assign(dynamic_cast<nn::Linear&>(model[3]).bias + 1.0);
  }
  std::vector<double> shifted = values(model(x));
  for (std::size_t i = 0; i < eager.size(); ++i) CHECK(shifted[i] == doctest::Approx(eager[i] + 1.0).epsilon(1e-6));
  CHECK(model.compile_stats().traces == 1);
  model.train();  // dropout on: a trace of its own, new masks on each call
  std::vector<double> t1 = values(model(x)), t2 = values(model(x));
  CHECK(t1 != t2);
  CHECK(model.compile_stats().traces == 2);
  CHECK(model.explain(x).find("graph breaks: 0") != std::string::npos);

  // kiln::compile(model): a handle of its own; the model stays eager behind it.
  model.eval();
  auto step = kiln::compile(model);
  CHECK(values(step(x)) == values(model(x)));
  CHECK(values(step(x)) == values(model(x)));
  CHECK(step.stats().traces == 1);
  model.to(f64);  // the parameters moved: the handle traces again, in f64
  Tensor x64 = x.to(f64);
  CHECK(step(x64).dtype() == f64);
  CHECK(step.stats().traces == 1);  // the old entries are gone, one new trace
  CHECK(values(step(x64)) == values(model.forward(x64)));
}

namespace {

/// Losses of `steps` AdamW steps of `make()`'s model on fixed data, compiled or eager.
template <class Make, class Loss>
std::vector<float> train(Make make, Loss loss_of, bool compiled, int steps) {
  manual_seed(42);
  auto model = make();
  if (compiled) model.compile();
  optim::AdamW opt(model.parameters(), {.lr = 3e-3});
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = loss_of(model, s);
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(loss.item<float>());
  }
  if (compiled) {  // traced once, replayed on every later step
    CHECK(model.compile_stats().traces == 1);
    CHECK(model.compile_stats().cache_hits >= static_cast<std::uint64_t>(steps - 1));
  }
  return losses;
}

void check_same_and_falling(const std::vector<float>& eager, const std::vector<float>& compiled) {
  REQUIRE(eager.size() == compiled.size());
  for (std::size_t i = 0; i < eager.size(); ++i) CHECK(compiled[i] == doctest::Approx(eager[i]).epsilon(2e-4));
  CHECK(eager.back() < 0.7f * eager.front());
}

}  // namespace

TEST_CASE("training: compiled and eager give the same losses over 50 AdamW steps (MLP, 2-layer GPT), falling") {
  Tensor x = randn({64, 8}, 1).eval();
  Tensor y = (argmax(x, 1) % 3).eval();
  auto make_mlp = [] { return nn::Sequential(nn::Linear(8, 32), nn::GELU("tanh"), nn::Linear(32, 3)); };
  auto mlp_loss = [&](nn::Sequential& m, int) { return cross_entropy(m(x), y); };
  check_same_and_falling(train(make_mlp, mlp_loss, false, 50), train(make_mlp, mlp_loss, true, 50));

  const gpt::Config c = gpt::small_config(11, 8, 2, 2, 16);
  const auto [tx, ty] = gpt::counting_batch(4, 8, 11, 3);  // learnable in a few dozen steps
  auto make_gpt = [&] { return gpt::Gpt(c); };
  auto gpt_loss = [&](gpt::Gpt& m, int) { return gpt::Gpt::loss(m(tx), ty); };
  check_same_and_falling(train(make_gpt, gpt_loss, false, 50), train(make_gpt, gpt_loss, true, 50));
}

}  // namespace kiln_test_nn_nn
