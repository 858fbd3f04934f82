// Loss functions against PyTorch 2.15's values (torch.nn.functional, float64, written out below):
// every reduction, their gradients, label smoothing and ignored targets, pos_weight, the clamped
// logs of binary_cross_entropy, and typed errors naming the op.
#include <doctest/doctest.h>

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

}  // namespace kiln_test_tensor_losses
