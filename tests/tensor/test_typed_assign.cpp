// assign(expr) on evaluated tensors takes the typed fast path: same results as the general
// path, one graph per guard, and every change of guard (layout, numbers, aliasing) noticed.
#include <doctest/doctest.h>

#include <vector>

#include <kiln/kiln.hpp>

namespace kiln_test_tensor_typed_assign {

using namespace kiln;

namespace {
std::vector<float> iota_values(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i) - 3.0f;
  return v;
}
}  // namespace

TEST_CASE("typed assign: results equal the general path, and repeated calls reuse one graph") {
  Tensor x = from_vector(iota_values(64, 0.5f), {8, 8});
  Tensor y = from_vector(iota_values(64, -0.25f), {8, 8});
  Tensor z = zeros({8, 8}).eval();
  z.assign(2.0f * x + y);
  auto expect = Tensor(2.0f * x + y).to_vector<float>();
  CHECK(z.to_vector<float>() == expect);

  reset_stats();
  for (int i = 0; i < 5; ++i) z.assign(2.0f * x + y);
  CHECK(stats().compiles == 0);
  CHECK(stats().graphs == 5);
  CHECK(z.to_vector<float>() == expect);
}

TEST_CASE("typed assign: a new number, layout or aliasing pattern is a different guard") {
  Tensor x = from_vector(iota_values(16, 1.0f), {4, 4});
  Tensor y = from_vector(iota_values(16, 2.0f), {4, 4});
  Tensor z = zeros({4, 4}).eval();
  z.assign(x * 3.0f + y);
  z.assign(x * 5.0f + y);  // the number changed
  auto xs = x.to_vector<float>(), ys = y.to_vector<float>();
  auto v = z.to_vector<float>();
  for (int i = 0; i < 16; ++i) CHECK(v[i] == xs[i] * 5.0f + ys[i]);

  z.assign(x * 5.0f + x);  // both leaves are one tensor now
  v = z.to_vector<float>();
  for (int i = 0; i < 16; ++i) CHECK(v[i] == xs[i] * 6.0f);

  Tensor xt = transpose(x, 0, 1);  // a strided view: new layout
  z.assign(xt * 5.0f + y);
  v = z.to_vector<float>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) CHECK(v[r * 4 + c] == xs[c * 4 + r] * 5.0f + ys[r * 4 + c]);

  Tensor row = from_vector(iota_values(4, 1.0f), {4});  // broadcast into the destination
  z.assign(row * 2.0f);
  v = z.to_vector<float>();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) CHECK(v[r * 4 + c] == (static_cast<float>(c) - 3.0f) * 2.0f);
}

TEST_CASE("typed assign: destination read by the expression, casts, and user memory") {
  std::vector<double> user(6, 1.0);
  Tensor out = from_blob(user.data(), {2, 3});
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  out.assign(a * 2.0f + 0.5f);  // f32 expression cast into f64 user memory
  CHECK(user == std::vector<double>{2.5, 4.5, 6.5, 8.5, 10.5, 12.5});
  out.assign(out * 2.0);  // reads what it writes: same index, still right
  CHECK(user == std::vector<double>{5, 9, 13, 17, 21, 25});
  Tensor sq = from_vector<float>({1, 2, 3, 4}, {2, 2});
  sq.assign(transpose(sq, 0, 1) + 0.0f);  // reads other elements than it writes
  CHECK(sq.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
}

TEST_CASE("typed assign: errors are raised before anything runs") {
  Tensor x = from_vector(iota_values(16, 1.0f), {16});
  Tensor z = zeros({3}).eval();
  auto before = stats().launches;
  CHECK_THROWS_AS(z.assign(x + 1.0f), ShapeError);
  CHECK(stats().launches == before);
}

}  // namespace kiln_test_tensor_typed_assign
