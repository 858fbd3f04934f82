// Loss functions against PyTorch 2.11's values (torch.nn.functional, float64, written out below):
// every reduction, their gradients, label smoothing and ignored targets, pos_weight, the clamped
// logs of binary_cross_entropy, and typed errors naming the op. The margin, embedding and
// likelihood losses, pairwise_distance, pdist and the shrink activations against values worked
// out from torch's formulas (the arithmetic beside them), their gradients at the kinks as
// torch's backward takes them, and gradcheck.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_losses {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using V = std::vector<double>;
const kt::Tolerance kTol{1e-9, 1e-12};

Tensor f64_tensor(const V& v, const Shape& s) { return kt::make_tensor(v, s, DType::Float64); }
void check(const Tensor& t, const Shape& shape, const V& want) {
  CHECK(t.shape() == shape);
  CHECK(t.dtype() == DType::Float64);
  KILN_CHECK_CLOSE(t, want, kTol);
}
Tensor grad_of(const Tensor& loss, const Tensor& wrt) { return autograd::grad({loss}, {wrt})[0]; }

}  // namespace

TEST_CASE("mse_loss, l1_loss, smooth_l1_loss, huber_loss: PyTorch's values, reductions and gradients") {
  Tensor x = f64_tensor({0.5, -1.2, 2.0, 1.5, 0.3, -0.7}, {2, 3}).requires_grad_();
  Tensor y = f64_tensor({0.0, -1.0, 3.5, 1.0, 1.0, -0.7}, {2, 3});
  check(mse_loss(x, y), {}, {0.546666666667});
  check(mse_loss(x, y, "sum"), {}, {3.28});
  check(mse_loss(x, y, "none"), {2, 3}, {0.25, 0.04, 2.25, 0.25, 0.49, 0});
  check(l1_loss(x, y), {}, {0.566666666667});
  check(l1_loss(x, y, "sum"), {}, {3.4});
  check(l1_loss(x, y, "none"), {2, 3}, {0.5, 0.2, 1.5, 0.5, 0.7, 0});
  check(smooth_l1_loss(x, y, "none"), {2, 3}, {0.125, 0.02, 1, 0.125, 0.245, 0});
  check(smooth_l1_loss(x, y, "none", 0.5), {2, 3}, {0.25, 0.04, 1.25, 0.25, 0.45, 0});
  check(smooth_l1_loss(x, y, "none", 0.0), {2, 3}, {0.5, 0.2, 1.5, 0.5, 0.7, 0});  // beta 0: l1
  check(huber_loss(x, y, "none"), {2, 3}, {0.125, 0.02, 1, 0.125, 0.245, 0});
  check(huber_loss(x, y, "none", 2.0), {2, 3}, {0.125, 0.02, 1.125, 0.125, 0.245, 0});
  check(grad_of(mse_loss(x, y), x), {2, 3}, {0.166666666667, -0.0666666666667, -0.5, 0.166666666667, -0.233333333333, 0});
  check(grad_of(smooth_l1_loss(x, y), x), {2, 3},
        {0.0833333333333, -0.0333333333333, -0.166666666667, 0.0833333333333, -0.116666666667, 0});
  // a target that broadcasts, and float32 operands promoted with float64 ones
  check(mse_loss(x, f64_tensor({0, 0, 0}, {3}), "sum"), {}, {0.25 + 1.44 + 4 + 2.25 + 0.09 + 0.49});
  CHECK(mse_loss(x.to(f32), y.to(f32)).dtype() == f32);
}

TEST_CASE("binary_cross_entropy and binary_cross_entropy_with_logits: clamped logs, stable tails, pos_weight") {
  Tensor p = f64_tensor({0.1, 0.9, 0.5, 1.0, 0.0, 0.3}, {6});
  Tensor t = f64_tensor({0, 1, 1, 0, 1, 0.5}, {6});
  // log(0) clamped at -100: 100, not inf
  check(binary_cross_entropy(p, t, "none"), {6}, {0.105360515658, 0.105360515658, 0.69314718056, 100, 100, 0.780323874132});
  Tensor z = f64_tensor({0.0, -1.2, 2.0, 40.0, -40.0, 0.3}, {2, 3}).requires_grad_();
  Tensor tz = f64_tensor({0.0, 1.0, 0.5, 0.0, 1.0, 1.0}, {2, 3});
  Tensor pw = f64_tensor({1.0, 2.0, 0.5}, {3});
  check(binary_cross_entropy_with_logits(z, tz, "none"), {2, 3},
        {0.69314718056, 1.46328246734, 1.12692801104, 40, 40, 0.554355244469});
  check(binary_cross_entropy_with_logits(z, tz, "none", pw), {2, 3},
        {0.69314718056, 2.92656493468, 1.09519600828, 40, 80, 0.277177622234});
  // d/dx = sigmoid(x) - t (scaled by pos_weight), also at x = 0
  check(grad_of(binary_cross_entropy_with_logits(z, tz, "sum"), z), {2, 3},
        {0.5, -0.768524783499, 0.380797077978, 1, -1, -0.425557483188});
  check(grad_of(binary_cross_entropy_with_logits(z, tz, "sum", pw), z), {2, 3},
        {0.5, -1.537049567, 0.410597808483, 1, -2, -0.212778741594});
}

TEST_CASE("nll_loss and cross_entropy with reduction, ignore_index and label_smoothing") {
  Tensor l = f64_tensor({0.2, -1.0, 0.5, 2.0, 1.0, 1.0, 1.0, 1.0, -3.0, 0.0, 4.0, 0.5}, {3, 4}).requires_grad_();
  Tensor tg = kt::make_tensor({1, -100, 3}, {3}, DType::Int64);
  check(nll_loss(log_softmax(l, 1), tg), {}, {3.45582292086});
  check(nll_loss(log_softmax(l, 1), tg, -100, "sum"), {}, {6.91164584172});
  check(nll_loss(log_softmax(l, 1), tg, -100, "none"), {3}, {3.36340353781, 0, 3.54824230391});
  check(cross_entropy(l, tg), {}, {3.45582292086});
  check(cross_entropy(l, tg, {.reduction = "sum"}), {}, {6.91164584172});
  check(cross_entropy(l, tg, {.reduction = "mean", .label_smoothing = 0.1}), {}, {3.39082292086});
  check(cross_entropy(l, tg, {.reduction = "sum", .label_smoothing = 0.1}), {}, {6.78164584172});
  check(cross_entropy(l, tg, {.reduction = "none", .label_smoothing = 0.1}), {3}, {3.22090353781, 0, 3.56074230391});
  check(grad_of(nll_loss(log_softmax(l, 1), tg), l), {3, 4},
        {0.057466637419, -0.482691381431, 0.0775718466619, 0.34765289735, 0, 0, 0, 0, 0.000434467469677,
         0.00872651240412, 0.476451433506, -0.48561241338});
  check(grad_of(cross_entropy(l, tg, {.label_smoothing = 0.1}), l), {3, 4},
        {0.044966637419, -0.445191381431, 0.0650718466619, 0.33515289735, 0, 0, 0, 0, -0.0120655325303,
         -0.00377348759588, 0.463951433506, -0.44811241338});
  Tensor w = f64_tensor({1, 2, 3}, {3});
  check(grad_of(sum(cross_entropy(l, tg, {.reduction = "none", .label_smoothing = 0.1}) * w), l), {3, 4},
        {0.0899332748381, -0.890382762863, 0.130143693324, 0.670305794701, 0, 0, 0, 0, -0.0723931951819,
         -0.0226409255753, 2.78370860104, -2.68867448028});
  // another ignore_index; every target ignored: the mean is 0 / 0
  check(cross_entropy(l, kt::make_tensor({1, 2, 3}, {3}, DType::Int64), {.ignore_index = 2, .reduction = "none"}), {3},
        {3.36340353781, 0, 3.54824230391});
  CHECK(std::isnan(cross_entropy(l, kt::make_tensor({-100, -100, -100}, {3}, DType::Int64)).item<double>()));
}

TEST_CASE("loss functions: typed errors naming the op, before anything runs") {
  Tensor x = f64_tensor({1, 2, 3}, {3}), i = kt::make_tensor({1, 2, 3}, {3}, DType::Int64);
  KILN_CHECK_THROWS_MENTIONING(ValueError, mse_loss(x, x, "avg"), "mse_loss", "avg", "reduction");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, l1_loss(i, i), "l1_loss", "int64");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, huber_loss(x, f64_tensor({1, 2}, {2})), "huber_loss", "float64[3]",
                               "float64[2]");
  Tensor l = f64_tensor({0, 1, 2, 3, 4, 5}, {2, 3});
  KILN_CHECK_THROWS_MENTIONING(ValueError, cross_entropy(l, kt::make_tensor({0, 1}, {2}, DType::Int64), {.label_smoothing = 1.5}),
                               "cross_entropy", "label_smoothing");
  KILN_CHECK_THROWS_MENTIONING(ValueError, cross_entropy(l, kt::make_tensor({0, 1}, {2}, DType::Int64), {.reduction = "max"}),
                               "cross_entropy", "max");
  // a target out of range: at the call for targets in host memory, when read back on a GPU
  KILN_CHECK_THROWS_MENTIONING(IndexError, nll_loss(l, kt::make_tensor({0, 3}, {2}, DType::Int64)).item<double>(),
                               "nll_loss", "3");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, nll_loss(x, i), "nll_loss", "[3]");
}

TEST_CASE("margin_ranking_loss, hinge_embedding_loss, soft_margin_loss: values, reductions, kinks") {
  Tensor x1 = f64_tensor({1, 2, 3}, {3}).requires_grad_(), x2 = f64_tensor({2, 2, 1}, {3}).requires_grad_();
  Tensor t = f64_tensor({1, -1, 1}, {3});
  // max(0, -t (x1 - x2) + 0.5) = max(0, [1, 0, -2] + 0.5)
  check(margin_ranking_loss(x1, x2, t, 0.5, "none"), {3}, {1.5, 0.5, 0});
  check(margin_ranking_loss(x1, x2, t, 0.5), {}, {2.0 / 3});
  check(margin_ranking_loss(x1, x2, t, 0.5, "sum"), {}, {2});
  // margin 0: the middle element sits on the hinge; torch's clamp_min passes the gradient there
  check(grad_of(margin_ranking_loss(x1, x2, t, 0.0, "sum"), x1), {3}, {-1, 1, 0});
  check(grad_of(margin_ranking_loss(x1, x2, t, 0.0, "sum"), x2), {3}, {1, -1, 0});
  CHECK(margin_ranking_loss(kt::make_tensor({1, 2}, {2}, DType::Int64), kt::make_tensor({2, 2}, {2}, DType::Int64),
                            kt::make_tensor({1, 1}, {2}, DType::Int64))
            .dtype() == f32);

  Tensor h = f64_tensor({0.3, 1.0, 2.0, -0.5, 0.3}, {5}).requires_grad_();
  Tensor ht = f64_tensor({1, -1, -1, 1, 0}, {5});
  // t = 1: x; t = -1: max(0, 1 - x); any other t: both (0.3 + 0.7)
  check(hinge_embedding_loss(h, ht, 1.0, "none"), {5}, {0.3, 0, 0, -0.5, 1.0});
  check(hinge_embedding_loss(h, ht), {}, {0.8 / 5});
  check(hinge_embedding_loss(h, ht, 1.0, "sum"), {}, {0.8});
  check(hinge_embedding_loss(h, ht, 2.5, "none"), {5}, {0.3, 1.5, 0.5, -0.5, 2.5});
  // x = margin with t = -1 (element 1): torch's subgradient -1; the t = 0 element: 1 - 1 = 0
  check(grad_of(hinge_embedding_loss(h, ht, 1.0, "sum"), h), {5}, {1, -1, 0, 1, 0});

  Tensor s = f64_tensor({0.5, -1, 2}, {3}).requires_grad_();
  Tensor st = f64_tensor({1, 1, -1}, {3});
  // log1p(exp(-t x)): log1p(exp(-0.5)), log1p(e), log1p(e^2)
  check(soft_margin_loss(s, st, "none"), {3}, {0.47407698418, 1.31326168752, 2.12692801104});
  check(soft_margin_loss(s, st), {}, {1.30475556091});
  check(soft_margin_loss(s, st, "sum"), {}, {3.91426668274});
  // d/dx = -t e / (1 + e) / 3 with e = exp(-t x)
  check(grad_of(soft_margin_loss(s, st), s), {3}, {-0.125846889599, -0.243686192877, 0.293599025993});
  // the loss has input's dtype and shape, as torch's in-place kernel
  CHECK(soft_margin_loss(s.to(f32), st, "none").dtype() == f32);
}

TEST_CASE("poisson_nll_loss and gaussian_nll_loss: values, Stirling term, var shapes, the clamp's gradient") {
  Tensor x = f64_tensor({0.5, -1.0, 2.0}, {3}).requires_grad_();
  Tensor t = f64_tensor({1, 0, 3}, {3});
  // exp(x) - t x: e^0.5 - 0.5, e^-1, e^2 - 6
  check(poisson_nll_loss(x, t, true, false, 1e-8, "none"), {3}, {1.1487212707, 0.367879441171, 1.38905609893});
  check(poisson_nll_loss(x, t), {}, {0.968552270267});
  // full: + 3 ln 3 - 3 + ln(6 pi) / 2 where t > 1 only
  check(poisson_nll_loss(x, t, true, true, 1e-8, "none"), {3}, {1.1487212707, 0.367879441171, 3.15313764247});
  // x - t log(x + eps) for rates [0.5, 1, 2]
  check(poisson_nll_loss(f64_tensor({0.5, 1, 2}, {3}), t, false, false, 1e-8, "sum"), {}, {2.11370560388});
  check(grad_of(poisson_nll_loss(x, t), x), {3}, {0.216240423567, 0.12262648039, 1.46301869964});

  Tensor in = f64_tensor({1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor tg = f64_tensor({1.5, 2, 2, 4}, {2, 2});
  Tensor var = f64_tensor({0.5, 1, 2, 1e-8}, {2, 2}).requires_grad_();
  // 0.5 (log v + d^2 / v), v = max(var, 1e-6): the last is 0.5 log(1e-6)
  check(gaussian_nll_loss(in, tg, var, false, 1e-6, "none"), {2, 2},
        {-0.09657359028, 0.0, 0.59657359028, -6.90775527898});
  check(gaussian_nll_loss(in, tg, var), {}, {-1.60193881975});
  check(gaussian_nll_loss(in, tg, var, true, 1e-6, "none"), {2, 2},
        {0.822364942925, 0.918938533205, 1.51551212348, -5.98881674578});
  // d/dv = 0.5 (1 / v - d^2 / v^2) at the clamped v, passed to var unchanged where var < eps
  check(grad_of(gaussian_nll_loss(in, tg, var, false, 1e-6, "sum"), var), {2, 2}, {0.5, 0.5, 0.125, 5e5});
  // homoscedastic: one variance per row, [2] or [2, 1]
  check(gaussian_nll_loss(in, tg, f64_tensor({0.5, 2}, {2}), false, 1e-6, "sum"), {}, {0.5});
  check(gaussian_nll_loss(in, tg, f64_tensor({0.5, 2}, {2, 1}), false, 1e-6, "sum"), {}, {0.5});
  KILN_CHECK_THROWS_MENTIONING(ValueError, gaussian_nll_loss(in, tg, f64_tensor({1, 1, 1}, {3})), "gaussian_nll_loss",
                               "var", "float64[3]");
  KILN_CHECK_THROWS_MENTIONING(ValueError, gaussian_nll_loss(in, tg, f64_tensor({1, -1, 1, 1}, {2, 2})),
                               "gaussian_nll_loss", "negative");
  KILN_CHECK_THROWS_MENTIONING(ValueError, poisson_nll_loss(x, t, true, false, 1e-8, "avg"), "poisson_nll_loss", "avg");
}

TEST_CASE("cosine_embedding_loss, pairwise_distance, triplet_margin_loss: values, swap, shapes") {
  Tensor a = f64_tensor({3, 4, 1, 2}, {2, 2}), b = f64_tensor({4, 3, 2, 1}, {2, 2});
  Tensor t = f64_tensor({1, -1}, {2});
  // cos = 24 / 25 and 4 / 5 (1e-12 beside the squared norms): 1 - 0.96, max(0, 0.8 - 0.5)
  check(cosine_embedding_loss(a, b, t, 0.5, "none"), {2}, {0.04, 0.3});
  check(cosine_embedding_loss(a, b, t, 0.5), {}, {0.17});
  check(cosine_embedding_loss(a, b, t, 0.5, "sum"), {}, {0.34});
  check(cosine_embedding_loss(f64_tensor({3, 4}, {2}), f64_tensor({4, 3}, {2}), f64_tensor({1}, {}), 0.0, "none"), {},
        {0.04});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, cosine_embedding_loss(a, b, f64_tensor({1, 1}, {1, 2})),
                               "cosine_embedding_loss", "float64[1, 2]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, cosine_embedding_loss(f64_tensor({3, 4}, {2}), b, t),
                               "cosine_embedding_loss", "float64[2]", "float64[2, 2]");

  Tensor p1 = f64_tensor({0, 0, 1, 1}, {2, 2}), p2 = f64_tensor({3, 4, 1, 1}, {2, 2});
  // ||x1 - x2 + 1e-6||: sqrt((3 - 1e-6)^2 + (4 - 1e-6)^2), sqrt(2) 1e-6
  check(pairwise_distance(p1, p2), {2}, {4.9999986, 1.41421356237e-6});
  check(pairwise_distance(p1, p2, 1.0, 1e-6, true), {2, 1}, {6.999998, 2e-6});
  check(pairwise_distance(p1, f64_tensor({3, 4}, {2}), 2.0, 0.0), {2}, {5, 3.60555127546});  // broadcast
  check(nn::functional::pairwise_distance(f64_tensor({1}, {}), f64_tensor({4}, {}), 2.0, 0.0), {}, {3});
  CHECK(pairwise_distance(kt::make_tensor({1, 2}, {2}, DType::Int64), kt::make_tensor({0, 0}, {2}, DType::Int64))
            .dtype() == f32);

  Tensor an = f64_tensor({0, 0}, {1, 2}), po = f64_tensor({3, 4}, {1, 2}), ne = f64_tensor({3, 5}, {1, 2});
  // eps 0: 1 + 5 - sqrt(34); with swap d(p, n) = 1 is the nearer negative: 1 + 5 - 1
  check(triplet_margin_loss(an, po, ne, 1.0, 2.0, 0.0, false, "none"), {1}, {0.169048105155});
  check(triplet_margin_loss(an, po, ne, 1.0, 2.0, 0.0, true), {}, {5});
  check(triplet_margin_loss(an, po, f64_tensor({30, 40}, {1, 2}), 1.0, 2.0, 0.0, false, "sum"), {}, {0});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, triplet_margin_loss(an, po, f64_tensor({3, 5}, {2})), "triplet_margin_loss",
                               "negative float64[2]");
  KILN_CHECK_THROWS_MENTIONING(ValueError, nn::TripletMarginLoss(0.0), "TripletMarginLoss", "margin");
}

TEST_CASE("multilabel_soft_margin_loss and multi_margin_loss: values, weights, the hinge's gradient") {
  Tensor x = f64_tensor({0, 1, -2, 1, -1, 0.5}, {2, 3}).requires_grad_();
  Tensor t = f64_tensor({1, 0, 1, 0, 0, 1}, {2, 3});
  // row 0: (log 2 + softplus(1) + softplus(2)) / 3; row 1: (softplus(1) + softplus(-1) + softplus(-0.5)) / 3
  check(multilabel_soft_margin_loss(x, t, {}, "none"), {2}, {1.37777895971, 0.700200119739});
  check(multilabel_soft_margin_loss(x, t), {}, {1.03898953972});
  check(multilabel_soft_margin_loss(x, t, {}, "sum"), {}, {2.07797907944});
  check(multilabel_soft_margin_loss(x.narrow(0, 0, 1), t.narrow(0, 0, 1), f64_tensor({1, 2, 0.5}, {3}), "none"), {1},
        {1.46104485371});  // (log 2 + 2 softplus(1) + 0.5 softplus(2)) / 3

  Tensor m = f64_tensor({0.1, 0.2, 0.4, 0.8, 0, 1, 0.5, 0.2}, {2, 4}).requires_grad_();
  Tensor y = kt::make_tensor({3, 1}, {2}, DType::Int64);
  // row 0: (0.3 + 0.4 + 0.6) / 4; row 1: (max(0, 1 - 1 + 0) + 0.5 + 0.2) / 4, its first term on the hinge
  check(multi_margin_loss(m, y, 1, 1.0, {}, "none"), {2}, {0.325, 0.175});
  check(multi_margin_loss(m, y), {}, {0.25});
  // p 2: (0.09 + 0.16 + 0.36) / 4 + (0.25 + 0.04) / 4
  check(multi_margin_loss(m, y, 2, 1.0, {}, "sum"), {}, {0.1525 + 0.0725});
  check(multi_margin_loss(m, y, 1, 1.0, f64_tensor({1, 3, 1, 2}, {4}), "none"), {2}, {0.65, 0.525});
  // a one-row input [C] with a 0-dim target gives a 0-dim loss
  check(multi_margin_loss(f64_tensor({0.1, 0.2, 0.4, 0.8}, {4}), kt::make_tensor({3}, {}, DType::Int64), 1, 1.0, {},
                          "none"),
        {}, {0.325});
  // d/dx_i = 1/4 where the hinge is > 0, d/dx_y = -(their count)/4; none at the hinge (row 1, class 0)
  check(grad_of(multi_margin_loss(m, y, 1, 1.0, {}, "sum"), m), {2, 4}, {0.25, 0.25, 0.25, -0.75, 0, -0.5, 0.25, 0.25});
  KILN_CHECK_THROWS_MENTIONING(ValueError, multi_margin_loss(m, y, 3), "multi_margin_loss", "p == 1");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, multi_margin_loss(m, kt::make_tensor({3}, {1}, DType::Int64)),
                               "multi_margin_loss", "float64[2, 4]");
  // Targets in host memory are checked by the loss (its name in the message); on a GPU the gather
  // that reads them reports the index when the result is evaluated.
  KILN_CHECK_THROWS_MENTIONING(IndexError,
                               multi_margin_loss(m, kt::make_tensor({3, 4}, {2}, DType::Int64)).item<double>(),
                               kt::on_cpu() ? "multi_margin_loss" : "gather", "4");
  KILN_CHECK_THROWS_MENTIONING(ValueError, nn::MultiMarginLoss(3), "MultiMarginLoss", "p == 1");
}

TEST_CASE("softshrink, hardshrink and pdist: values, no gradient inside the shrink band, torch's pdist backward") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = f64_tensor({-1, -0.5, -0.2, 0, 0.3, 0.5, 0.7}, {7}).requires_grad_();
  check(softshrink(x), {7}, {-0.5, 0, 0, 0, 0, 0, 0.2});
  check(hardshrink(x), {7}, {-1, 0, 0, 0, 0, 0, 0.7});
  check(softshrink(x, 0.25), {7}, {-0.75, -0.25, 0, 0, 0.05, 0.25, 0.45});
  // torch's shrink backward: 0 for -lambd <= x <= lambd, the bounds included
  check(grad_of(sum(softshrink(x)), x), {7}, {1, 0, 0, 0, 0, 0, 1});
  check(grad_of(sum(hardshrink(x)), x), {7}, {1, 0, 0, 0, 0, 0, 1});
  // NaN passes through, with its gradient
  Tensor n = f64_tensor({nan}, {1}).requires_grad_();
  CHECK(std::isnan(softshrink(n).to_vector<double>()[0]));
  CHECK(std::isnan(hardshrink(n).to_vector<double>()[0]));
  check(grad_of(sum(softshrink(n)), n), {1}, {1});
  CHECK(softshrink(x.to(DType::Float16)).dtype() == DType::Float16);
  KILN_CHECK_THROWS_MENTIONING(ValueError, softshrink(x, -0.1), "softshrink", "lambda");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, hardshrink(kt::make_tensor({1, 2}, {2}, DType::Int64)), "hardshrink",
                               "int64");

  Tensor r = f64_tensor({0, 0, 3, 4, 0, 0}, {3, 2}).requires_grad_();
  // pairs (0, 1), (0, 2), (1, 2): 5, 0, 5
  check(nn::functional::pdist(r), {3}, {5, 0, 5});
  check(nn::functional::pdist(r, 1.0), {3}, {7, 0, 7});
  // d/dx_i = (x_i - x_j) / d per pair; the pair at distance 0 gives none
  check(grad_of(sum(nn::functional::pdist(r)), r), {3, 2}, {-0.6, -0.8, 1.2, 1.6, -0.6, -0.8});
  // p = inf: both coordinates tie for the largest |difference|, each gets the whole gradient
  Tensor q = f64_tensor({0, 0, 1, -1}, {2, 2}).requires_grad_();
  check(nn::functional::pdist(q, INFINITY), {1}, {1});
  check(grad_of(sum(nn::functional::pdist(q, INFINITY)), q), {2, 2}, {-1, 1, 1, -1});
  CHECK(nn::functional::pdist(f64_tensor({1, 2}, {1, 2})).shape() == Shape{0});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, nn::functional::pdist(f64_tensor({1, 2}, {2})), "pdist", "float64[2]");
  KILN_CHECK_THROWS_MENTIONING(ValueError, nn::functional::pdist(r, -1.0), "pdist", "non-negative");
}

TEST_CASE("the margin, embedding and likelihood losses: gradcheck in float64, modules, typed errors") {
  using A = std::vector<Tensor>;
  Tensor u = f64_tensor({0.3, -0.7, 1.1, 0.4, -0.2, 0.9}, {2, 3});
  Tensor v = f64_tensor({-0.5, 0.8, 0.2, 1.3, 0.6, -1.0}, {2, 3});
  Tensor w = f64_tensor({0.9, 0.1, -0.6, 0.5, 1.2, 0.7}, {2, 3});
  Tensor pos = f64_tensor({0.6, 1.5, 0.8, 0.3, 2.0, 1.1}, {2, 3});
  Tensor sign = f64_tensor({1, -1, 1, -1, 1, 1}, {2, 3}), rows = f64_tensor({1, -1}, {2});
  CHECK(autograd::gradcheck([&](A a) { return margin_ranking_loss(a[0], a[1], sign, 0.1); }, {u, v}));
  CHECK(autograd::gradcheck([&](A a) { return soft_margin_loss(a[0], sign, "sum"); }, {u}));
  CHECK(autograd::gradcheck([&](A a) { return hinge_embedding_loss(a[0], sign, 0.5); }, {u}));
  CHECK(autograd::gradcheck([&](A a) { return poisson_nll_loss(a[0], pos, true, true); }, {u}));
  CHECK(autograd::gradcheck([&](A a) { return poisson_nll_loss(a[0], a[1], false, false, 1e-8, "none"); }, {pos, w}));
  CHECK(autograd::gradcheck([&](A a) { return gaussian_nll_loss(a[0], a[1], a[2], true); }, {u, v, pos}));
  CHECK(autograd::gradcheck([&](A a) { return cosine_embedding_loss(a[0], a[1], rows, -0.2, "none"); }, {u, v}));
  CHECK(
      autograd::gradcheck([&](A a) { return triplet_margin_loss(a[0], a[1], a[2], 1.0, 2.0, 1e-6, true); }, {u, v, w}));
  CHECK(autograd::gradcheck([&](A a) { return triplet_margin_loss(a[0], a[1], a[2], 2.0, 3.0); }, {u, v, w}));
  CHECK(autograd::gradcheck([&](A a) { return multilabel_soft_margin_loss(a[0], a[1], a[2]); }, {u, pos, w}));
  CHECK(autograd::gradcheck(
      [&](A a) {
        return multi_margin_loss(a[0], kt::make_tensor({2, 0}, {2}, DType::Int64), 2, 1.0,
                                 pos.narrow(0, 0, 1).reshape({3}));
      },
      {u}));
  CHECK(autograd::gradcheck([&](A a) { return pairwise_distance(a[0], a[1], 1.5); }, {u, v}));
  CHECK(autograd::gradcheck([&](A a) { return nn::functional::pdist(a[0]); },
                            {f64_tensor({0.3, -0.7, 1.1, 0.4, 2.0, 0.1}, {3, 2})}));
  CHECK(autograd::gradcheck([&](A a) { return softshrink(a[0], 0.25); }, {u}));
  CHECK(autograd::gradcheck([&](A a) { return hardshrink(a[0], 0.25); }, {u}));

  // the modules call the functions with their options
  check(nn::MarginRankingLoss(0.1, "sum")(u, v, sign), {},
        {margin_ranking_loss(u, v, sign, 0.1, "sum").item<double>()});
  check(nn::CosineEmbeddingLoss(-0.2)(u, v, rows), {}, {cosine_embedding_loss(u, v, rows, -0.2).item<double>()});
  check(nn::GaussianNLLLoss(true)(u, v, pos), {}, {gaussian_nll_loss(u, v, pos, true).item<double>()});
  check(nn::PoissonNLLLoss(false)(pos, w), {}, {poisson_nll_loss(pos, w, false).item<double>()});
  check(nn::HingeEmbeddingLoss(0.5)(u, sign), {}, {hinge_embedding_loss(u, sign, 0.5).item<double>()});
  check(nn::SoftMarginLoss("sum")(u, sign), {}, {soft_margin_loss(u, sign, "sum").item<double>()});
  check(nn::MultiLabelSoftMarginLoss(w)(u, pos), {}, {multilabel_soft_margin_loss(u, pos, w).item<double>()});
  check(nn::Softshrink(0.25)(u), {2, 3}, softshrink(u, 0.25).to_vector<double>());

  KILN_CHECK_THROWS_MENTIONING(ShapeError, margin_ranking_loss(u, v, rows), "margin_ranking_loss", "float64[2]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError,
                               margin_ranking_loss(u, v, kt::make_tensor({1, 0, 1, 0, 1, 1}, {2, 3}, DType::Bool)),
                               "margin_ranking_loss", "bool");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, soft_margin_loss(f64_tensor({1, 2, 3}, {3}), sign), "soft_margin_loss",
                               "float64[2, 3]", "float64[3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, soft_margin_loss(kt::make_tensor({1, 2}, {2}, DType::Int64), rows),
                               "soft_margin_loss", "int64");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, hinge_embedding_loss(u, rows), "hinge_embedding_loss", "[2, 3]", "[2]");
  KILN_CHECK_THROWS_MENTIONING(ValueError, hinge_embedding_loss(u, sign, 1.0, "max"), "hinge_embedding_loss", "max");
}

}  // namespace kiln_test_tensor_losses
