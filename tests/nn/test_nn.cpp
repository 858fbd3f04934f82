// kiln::nn: each layer's forward against a float64 loop reference and its backward by
// gradcheck; the module registry (names, order, children, modes, to(), state_dict, errors);
// model.compile(); compiled and eager training of an MLP and of a 2-layer GPT.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
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

  // key_padding_mask [N, S]: a masked key changes nothing of its batch's output (cross-attention,
  // L 3, S 4, N 2; key 1 of batch 0 and keys 2 and 3 of batch 1 masked), fused or written out,
  // bool or float (-inf added), alone or with an attn_mask; per-head weights without averaging.
  // (No query is left without a key: a fully masked row is NaN, as torch's.)
  Tensor kv = f64_randn({4, 2, 4}, 10);
  Tensor padding = from_vector<bool>({false, true, false, false, false, false, true, true}, {2, 4});
  std::vector<double> moved_kv = values(kv);
  for (int c = 0; c < 4; ++c) {
    moved_kv[(1 * 2 + 0) * 4 + c] += 3.0;  // key 1, batch 0
    moved_kv[(2 * 2 + 1) * 4 + c] -= 2.0;  // key 2, batch 1
    moved_kv[(3 * 2 + 1) * 4 + c] += 1.5;  // key 3, batch 1
  }
  Tensor kv_moved = from_vector(moved_kv, {4, 2, 4});
  auto [padded, padded_weights] = mha(x, kv, kv, {}, true, false, padding);
  check_close(mha(x, kv_moved, kv_moved, {}, true, false, padding).first, values(padded));
  check_close(mha(x, kv, kv, {}, false, false, padding).first, values(padded));
  Tensor padding_float = where(padding, -INFINITY, 0.0).to(f64);
  check_close(mha(x, kv, kv, {}, false, false, padding_float).first, values(padded));
  CHECK(values(padded_weights)[1] == 0.0);  // batch 0, query 0, key 1
  CHECK(values(mha(x, kv, kv).first) != values(padded));
  auto [per_head_out, per_head] = mha(x, kv, kv, {}, true, false, padding, false);
  CHECK(per_head.shape() == Shape{2, 2, 3, 4});
  check_close(mean(per_head, {1}), values(padded_weights));
  check_close(per_head_out, values(padded));
  // With an attn_mask too: the two masks add (bool with bool: either masks).
  Tensor future =
      from_vector<bool>({false, true, true, true, false, false, true, true, false, false, false, true}, {3, 4});
  auto [both, both_weights] = mha(x, kv, kv, future, true, false, padding);
  check_close(mha(x, kv, kv, where(future, -INFINITY, 0.0).to(f64), false, false, padding).first, values(both));
  check_close(mha(x, kv_moved, kv_moved, future, true, false, padding).first, values(both));
  // A 3-D attn_mask [N * H, L, S] is the same mask given per batch and head.
  Tensor per_batch = reshape(
      broadcast_to(reshape(logical_or(unsqueeze(future, 0), unsqueeze(padding, 1)), {2, 1, 3, 4}), {2, 2, 3, 4}),
      {4, 3, 4});
  check_close(mha(x, kv, kv, per_batch).first, values(both));
  check_close(mha(x, kv, kv, per_batch).second, values(both_weights));
  // Masks that do not fit, or of an integer dtype: typed errors naming the module and the mask.
  auto refuses = [&](const Tensor& attn_mask, const Tensor& key_padding_mask, const char* what, bool dtype) {
    try {
      (void)mha(x, kv, kv, attn_mask, true, false, key_padding_mask);
      FAIL("a bad mask accepted");
    } catch (const Error& e) {
      CHECK((dtype ? dynamic_cast<const DTypeError*>(&e) != nullptr : dynamic_cast<const ShapeError*>(&e) != nullptr));
      CHECK(std::string(e.what()).find("MultiheadAttention") != std::string::npos);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  refuses({}, from_vector<bool>({false, false, false, false}, {1, 4}), "key_padding_mask", false);
  refuses({}, padding.to(i64), "key_padding_mask", true);
  refuses(from_vector<bool>({false, false, false, false}, {1, 4}), {}, "attn_mask", false);
  refuses(zeros({3, 3, 4}, f64), {}, "attn_mask", false);
}

TEST_CASE("scaled_dot_product_attention written out computes half types in float32, rounding once") {
  // Operands of different ranks take the written-out path; its scores must not be rounded to
  // bfloat16 before the softmax (that cost ~5% here; torch's math backend computes in float32).
  const Tensor q = f64_randn({2, 1, 3, 4, 3}, 31) * 2.0, k = f64_randn({1, 3, 5, 3}, 32) * 2.0,
               v = f64_randn({1, 3, 5, 5}, 33);
  const Tensor qb = q.to(bf16).eval(), kb = k.to(bf16).eval(), vb = v.to(bf16).eval();
  const Tensor got = nn::functional::scaled_dot_product_attention(qb, kb, vb, {}, 0.0, true);
  CHECK(got.dtype() == bf16);
  const std::vector<double> want =
      values(nn::functional::scaled_dot_product_attention(qb.to(f64), kb.to(f64), vb.to(f64), {}, 0.0, true));
  const std::vector<double> g = values(got);
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": " << g[i] << " vs " << want[i]);
    CHECK(std::abs(g[i] - want[i]) <= std::abs(want[i]) / 256.0 + 1e-6);  // bfloat16's rounding
  }
  // No keys at all with a float mask: an empty softmax, zeros out (no reduction over nothing).
  const Tensor none = zeros({3, 0, 2}, f64);
  CHECK(values(nn::functional::scaled_dot_product_attention(f64_randn({3, 4, 2}, 34), none, zeros({3, 0, 1}, f64),
                                                            zeros({1, 4, 0}, f64))) == std::vector<double>(12, 0.0));
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

TEST_CASE("nn::functional::layer_norm and rms_norm with torch's normalized_shape: torch's values and gradients") {
  namespace F = nn::functional;
  // torch.nn.functional.layer_norm(x, [2, 3], w, b, 1e-5) and rms_norm(x, [2, 3], w, 1e-6) in
  // float64, and the gradients of sum(y * c), from torch 2.x.
  Tensor x = from_vector<double>({0.5, -1.0, 2.0, 1.5, 0.25, -0.75, 3.0, 1.0, -2.0, 0.0, 0.5, 1.0}, {2, 2, 3});
  Tensor w = from_vector<double>({1.0, 0.5, -1.0, 2.0, 1.5, 0.25}, {2, 3});
  Tensor b = from_vector<double>({0.1, -0.2, 0.3, 0.0, 0.5, -0.5}, {2, 3});
  const Tensor c = (arange(12, f64).reshape({2, 2, 3}) / 4.0 - 1.0).eval();
  x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  Tensor y = F::layer_norm(x, {2, 3}, w, b, 1e-5);
  CHECK(y.shape() == Shape{2, 2, 3});
  check_close(y, {0.1766961740545701, -0.851917479463846, -1.157227307036832, 1.9941005254188227, 0.26991147783628966,
                  -0.7684366091909953, 1.7287985737998093, -0.05958632984484405, 2.0411295099239335,
                  -0.7863165528688733, 0.41575179790690653, -0.42979316492242203},
              1e-12);
  sum(y * c).backward();
  check_close(x.grad(), {-0.7257938839143915, -0.02876203975477379, 0.5329267103175285, -0.3468238654205321,
                         0.21486196119884007, 0.35359111757332895, -0.5380443027651489, -0.3687517487127459,
                         -0.9151708375185303, 1.190238064942593, 0.9583564717200318, -0.3266276476661991},
              1e-12);
  check_close(w.grad(), {0.7377031128453344, 1.1884967244285027, -2.4697431634423497, -0.7407104112203986,
                         -0.08424820209309353, 0.2230112363520505},
              1e-12);
  check_close(b.grad(), {-0.5, 0.0, 0.5, 1.0, 1.5, 2.0}, 1e-12);
  x.zero_grad_();
  w.zero_grad_();
  Tensor r = F::rms_norm(x, {2, 3}, w, 1e-6);
  check_close(r, {0.42966876577676005, -0.42966876577676005, -1.7186750631070402, 2.57801259466056, 0.32225157433257,
                  -0.161125787166285, 1.8817497743812932, 0.3136249623968822, 1.2544998495875288, 0.0,
                  0.4704374435953233, 0.1568124811984411},
              1e-12);
  sum(r * c).backward();
  check_close(x.grad(), {-0.8634689589427811, -0.31398871955404817, 0.41314305621971636, -0.4420630479445428,
                         -0.0020657136946304637, 0.0599057368059864, -0.35732653743848075, 0.011568221852540667,
                         -0.17994892490352243, 1.568124811984411, 1.2994870808134094, 0.050771342152150956},
              1e-12);
  check_close(w.grad(), {0.5112061214138865, 1.1149405922604634, -2.1138373811410487, -0.32225157433257,
                         0.4704374435953233, 0.9365615812228028},
              1e-12);
  // One trailing dim, no weight, the default eps (float64's epsilon): rms_norm(x, [3]).
  check_close(F::rms_norm(x.detach(), {3}),
              {0.3779644730092272, -0.7559289460184544, 1.5118578920369088, 1.5322617553657474, 0.25537695922762454,
               -0.7661308776828737, 1.3887301496588271, 0.4629100498862757, -0.9258200997725514, 0.0,
               0.7745966692414832, 1.5491933384829664},
              1e-12);
  // kiln's layer_norm(x, weight, bias, eps) over the last dim is the same function here.
  Tensor w3 = from_vector<double>({1.0, 2.0, 3.0}, {3}), b3 = from_vector<double>({0.0, 1.0, 0.0}, {3});
  CHECK(values(F::layer_norm(x.detach(), w3, b3, 1e-5)) == values(F::layer_norm(x.detach(), {3}, w3, b3, 1e-5)));
  CHECK(values(F::rms_norm(x.detach(), w3, 1e-6)) == values(kiln::rms_norm(x.detach(), w3, 1e-6)));
  // torch's checks: the input must end in normalized_shape, the parameters be of its shape, and
  // it must have a dim.
  CHECK_THROWS_AS(F::layer_norm(x, {3, 2}), ShapeError);
  CHECK_THROWS_AS(F::layer_norm(x, {2, 3}, reshape(w.detach(), {6})), ShapeError);
  CHECK_THROWS_AS(F::layer_norm(x, {2, 3}, {}, b3), ShapeError);
  CHECK_THROWS_AS(F::rms_norm(x, {2, 3}, w3), ShapeError);
  CHECK_THROWS_AS(F::rms_norm(x, {4}), ShapeError);
  CHECK_THROWS_AS(F::layer_norm(x, Shape{}), ValueError);
  CHECK_THROWS_AS(F::layer_norm(x.to(i64), {3}), DTypeError);
}

TEST_CASE("nn::functional has torch.nn.functional's losses, one_hot, pad, sigmoid, tanh and activations") {
  namespace F = nn::functional;
  Tensor a = from_vector<double>({0.5, -1.0, 2.0}, {3}), t = from_vector<double>({1.0, 0.0, 1.0}, {3});
  CHECK(values(F::mse_loss(a, t)) == values(kiln::mse_loss(a, t)));
  CHECK(values(F::l1_loss(a, t, "sum")) == std::vector<double>{2.5});
  CHECK(values(F::smooth_l1_loss(a, t)) == values(kiln::smooth_l1_loss(a, t)));
  CHECK(values(F::huber_loss(a, t, "none", 0.5)) == values(kiln::huber_loss(a, t, "none", 0.5)));
  CHECK(values(F::binary_cross_entropy_with_logits(a, t)) == values(kiln::binary_cross_entropy_with_logits(a, t)));
  CHECK(values(F::binary_cross_entropy(F::sigmoid(a), t)) == values(kiln::binary_cross_entropy(sigmoid(a), t)));
  Tensor logits = from_vector<double>({0.5, -1.0, 2.0, 0.0, 1.0, 3.0}, {2, 3});
  Tensor y = from_vector<std::int64_t>({2, 0}, {2});
  CHECK(values(F::nll_loss(F::log_softmax(logits, 1), y)) == values(F::cross_entropy(logits, y)));
  CHECK(F::one_hot(y, 3).to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 0, 1, 1, 0, 0});
  CHECK(values(F::pad(a, {1, 2}, "constant", 9.0)) == std::vector<double>{9.0, 0.5, -1.0, 2.0, 9.0, 9.0});
  CHECK(values(F::tanh(a)) == values(kiln::tanh(a)));
  check_close(F::leaky_relu(a, 0.2), {0.5, -0.2, 2.0}, 1e-15);
  check_close(F::hardtanh(a), {0.5, -1.0, 1.0}, 1e-15);
}

TEST_CASE("activation modules: torch's class names, constructor arguments and values") {
  // torch.nn's modules on [-2, -0.5, 0, 0.75, 4] in float64, from torch 2.x.
  const Tensor v = from_vector<double>({-2.0, -0.5, 0.0, 0.75, 4.0}, {5});
  auto run = [&](nn::Module& m, const char* name, const std::vector<double>& want) {
    CAPTURE(std::string(name));
    CHECK(m.name() == name);
    check_close(m(v), want, 1e-12);
  };
  nn::LeakyReLU leaky(0.2);
  run(leaky, "LeakyReLU", {-0.4, -0.1, 0.0, 0.75, 4.0});
  CHECK(nn::LeakyReLU().negative_slope == 0.01);
  nn::ELU elu_m(0.5);
  run(elu_m, "ELU", {-0.43233235838169365, -0.1967346701436833, 0.0, 0.75, 4.0});
  nn::Mish mish_m;
  run(mish_m, "Mish", {-0.2525014826957089, -0.22074377465173, 0.0, 0.6100183352182934, 3.9974128069762385});
  nn::Hardtanh ht(-0.5, 0.5);
  run(ht, "Hardtanh", {-0.5, -0.5, 0.0, 0.5, 0.5});
  nn::Sigmoid sig;
  run(sig, "Sigmoid", {0.11920292202211755, 0.3775406687981454, 0.5, 0.679178699175393, 0.9820137900379085});
  nn::SELU selu_m;
  run(selu_m, "SELU", {-1.5201664685956948, -0.6917581878028713, 0.0, 0.7880257405166103, 4.202803949421922});
  nn::CELU celu_m(2.0);
  run(celu_m, "CELU", {-1.2642411176571153, -0.44239843385719024, 0.0, 0.75, 4.0});
  nn::ReLU6 relu6_m;
  run(relu6_m, "ReLU6", {0.0, 0.0, 0.0, 0.75, 4.0});
  nn::Hardsigmoid hsig;
  run(hsig, "Hardsigmoid", {0.16666666666666666, 0.4166666666666667, 0.5, 0.625, 1.0});
  nn::Hardswish hswish;
  run(hswish, "Hardswish", {-0.3333333333333333, -0.20833333333333334, 0.0, 0.46875, 4.0});
  nn::LogSigmoid lsig;
  run(lsig, "LogSigmoid",
      {-2.1269280110429727, -0.9740769841801067, -0.6931471805599453, -0.38687100611489994, -0.018149927917809738});
  nn::Softsign ssign;
  run(ssign, "Softsign", {-0.6666666666666666, -0.3333333333333333, 0.0, 0.42857142857142855, 0.8});
  nn::Tanhshrink tshrink;
  run(tshrink, "Tanhshrink", {-1.035972419924183, -0.03788284273999026, 0.0, 0.1148510476127127, 3.000670700260933});
  nn::Tanh tanh_m;
  run(tanh_m, "Tanh", {-0.9640275800758169, -0.46211715726000974, 0.0, 0.6351489523872873, 0.999329299739067});
  nn::Identity id;
  run(id, "Identity", {-2.0, -0.5, 0.0, 0.75, 4.0});
  // Softplus(beta = 2, threshold = 1): linear where 2x > 1.
  nn::Softplus sp(2.0, 1.0);
  CHECK(sp.name() == "Softplus");
  check_close(sp(from_vector<double>({0.25, 0.75}, {2})), {0.48703849209005334, 0.75}, 1e-12);
  // torch asserts max_val > min_val.
  CHECK_THROWS_AS(nn::Hardtanh(1.0, 1.0), ValueError);
  CHECK_THROWS_AS(nn::Hardtanh(2.0, -1.0), ValueError);
}

TEST_CASE("Flatten, Softmax and LogSoftmax modules, and a Sequential of them named as torch's") {
  nn::Flatten flat;
  CHECK(flat.name() == "Flatten");
  CHECK(flat(zeros({2, 3, 4}, f32)).shape() == Shape{2, 12});
  CHECK(nn::Flatten(0, 1)(zeros({2, 3, 4}, f32)).shape() == Shape{6, 4});
  CHECK_THROWS(flat(zeros({5}, f32)));  // start_dim 1 of a 1-d input: out of range, as torch
  CHECK_THROWS(flat(zeros({}, f32)));
  // torch.nn.Softmax(dim=1), and without a dim torch's legacy choice (dim 1 of a 2-d input, 0 of
  // a 1-d or 3-d one).
  Tensor x = from_vector<double>({0.5, -1.0, 2.0, 3.0}, {2, 2});
  check_close(nn::Softmax(1)(x), {0.8175744761936437, 0.18242552380635632, 0.26894142136999516, 0.7310585786300049},
              1e-12);
  CHECK(values(nn::Softmax()(x)) == values(nn::Softmax(1)(x)));
  check_close(nn::LogSoftmax()(from_vector<double>({0.5, 1.0}, {2})), {-0.9740769841801067, -0.4740769841801067}, 1e-12);
  check_close(nn::LogSoftmax(0)(x), {-1.7014132779827524, -4.0181499279178094, -0.20141327798275246, -0.01814992791780978},
              1e-12);
  Tensor x3 = from_vector<double>({0.0, 1.0, 0.0, 1.0, 2.0, 0.0, 2.0, 0.0}, {2, 2, 2});
  check_close(nn::Softmax()(x3),
              {0.11920292202211755, 0.7310585786300049, 0.11920292202211755, 0.7310585786300049, 0.8807970779778823,
               0.2689414213699951, 0.8807970779778823, 0.2689414213699951},
              1e-12);
  CHECK(nn::Softmax(1).name() == "Softmax");
  CHECK(nn::LogSoftmax(1).name() == "LogSoftmax");
  // torch's named_modules of the same Sequential.
  nn::Sequential model(nn::Flatten(), nn::Linear(6, 4), nn::LeakyReLU(0.2), nn::Hardtanh(-0.5, 0.5), nn::Mish(),
                       nn::ELU(), nn::Softplus(), nn::Sigmoid(), nn::Tanh(), nn::Identity(), nn::LogSoftmax(1));
  std::vector<std::pair<std::string, std::string>> names;
  for (auto& [n, m] : model.named_modules()) names.emplace_back(n, m->name());
  CHECK(names == std::vector<std::pair<std::string, std::string>>{
                     {"", "Sequential"}, {"0", "Flatten"}, {"1", "Linear"}, {"2", "LeakyReLU"}, {"3", "Hardtanh"},
                     {"4", "Mish"}, {"5", "ELU"}, {"6", "Softplus"}, {"7", "Sigmoid"}, {"8", "Tanh"},
                     {"9", "Identity"}, {"10", "LogSoftmax"}});
  Tensor out = model(zeros({3, 2, 3}, f32));
  CHECK(out.shape() == Shape{3, 4});
  CHECK(model.parameters().size() == 2);
}

}  // namespace kiln_test_nn_nn
