// Eigen interop (kiln/eigen.hpp): tensors viewing Eigen matrices, arrays, maps, blocks and
// Eigen::Tensors without copies, in both storage orders; Eigen maps over tensors; copies into
// plain Eigen types with dtype conversion; the errors for layouts a map cannot express.
// Host memory only, so every tensor here lives on the CPU whatever KILN_DEVICE says.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/eigen.hpp"

namespace kiln_test_tensor_eigen {

using namespace kiln;

namespace {

using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Element (i, j) of a 2-D tensor, read through its row-major host copy.
double at(const std::vector<float>& v, const Tensor& t, std::int64_t i, std::int64_t j) {
  return v[static_cast<std::size_t>(i * t.shape()[1] + j)];
}

/// A matrix whose entries all differ, so that any mix-up of rows/columns shows.
template <class M>
M numbered(Eigen::Index rows, Eigen::Index cols) {
  M m(rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) m(i, j) = static_cast<typename M::Scalar>(10 * i + j);
  return m;
}

template <class M>
void check_same_matrix(const Tensor& t, const M& m) {
  REQUIRE(t.dim() == 2);
  REQUIRE(t.shape()[0] == m.rows());
  REQUIRE(t.shape()[1] == m.cols());
  std::vector<float> v = t.to_vector<float>();
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) CHECK(at(v, t, i, j) == static_cast<double>(m(i, j)));
}

// Views of temporaries would dangle: from_eigen rejects temporaries of owning Eigen types and
// to_eigen rejects a map over a temporary tensor, at compile time. Views of views are fine.
template <class M>
concept ViewableTemporary = requires {
  from_eigen(std::declval<M>());
};
template <class M>
concept ConvertibleTemporary = requires {
  to_eigen<M>(std::declval<Tensor>());
};
static_assert(!ViewableTemporary<Eigen::MatrixXf>);
static_assert(ViewableTemporary<Eigen::MatrixXf&>);
static_assert(ViewableTemporary<Eigen::Map<Eigen::MatrixXf>>);
static_assert(!ViewableTemporary<decltype(Eigen::MatrixXf::Ones(2, 2))>);  // not direct access
static_assert(!ConvertibleTemporary<Eigen::Map<const Eigen::MatrixXf>>);
static_assert(ConvertibleTemporary<Eigen::MatrixXf>);
#if KILN_HAS_EIGEN_TENSOR
static_assert(!ViewableTemporary<Eigen::Tensor<float, 2>>);
static_assert(!ConvertibleTemporary<Eigen::TensorMap<Eigen::Tensor<const float, 2>>>);
#endif

}  // namespace

TEST_CASE("from_eigen views matrices of both storage orders without copying") {
  SUBCASE("row-major") {
    RowMatrixXf m = numbered<RowMatrixXf>(3, 5);
    Tensor t = from_eigen(m);
    CHECK(t.dtype() == f32);
    CHECK(t.device() == Device::cpu());
    CHECK(t.strides() == Strides{5, 1});
    CHECK(t.data_ptr<float>() == m.data());
    check_same_matrix(t, m);
  }
  SUBCASE("column-major: column-major strides, same memory") {
    Eigen::MatrixXf m = numbered<Eigen::MatrixXf>(3, 5);
    Tensor t = from_eigen(m);
    CHECK(t.shape() == Shape{3, 5});
    CHECK(t.strides() == Strides{1, 3});
    CHECK(t.data_ptr<float>() == m.data());
    check_same_matrix(t, m);
    // Computation over the view matches Eigen's.
    std::vector<float> rows = sum(t, 1).to_vector<float>();
    for (int i = 0; i < 3; ++i) CHECK(rows[i] == doctest::Approx(m.row(i).sum()));
  }
  SUBCASE("other dtypes") {
    Eigen::MatrixXd d = numbered<Eigen::MatrixXd>(2, 3);
    CHECK(from_eigen(d).dtype() == f64);
    Eigen::Matrix<std::int32_t, 2, 2> i32m;
    i32m << 1, 2, 3, 4;
    Tensor ti = from_eigen(i32m);
    CHECK(ti.dtype() == i32);
    CHECK(ti.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3, 4});
    Eigen::Matrix<Eigen::half, 1, 3> h;
    h << Eigen::half(0.5f), Eigen::half(-2.0f), Eigen::half(65504.0f);
    Tensor th = from_eigen(h);
    CHECK(th.dtype() == f16);
    CHECK(th.to_vector<float>() == std::vector<float>{0.5f, -2.0f, 65504.0f});
    Eigen::Matrix<Eigen::bfloat16, 2, 1> b;
    b << Eigen::bfloat16(1.5f), Eigen::bfloat16(-3.0f);
    Tensor tb = from_eigen(b);
    CHECK(tb.dtype() == bf16);
    CHECK(tb.to_vector<float>() == std::vector<float>{1.5f, -3.0f});
  }
}

TEST_CASE("from_eigen: vectors, arrays, blocks and strided maps") {
  SUBCASE("compile-time vectors become 1-D") {
    Eigen::VectorXd v(4);
    v << 1, 2, 3, 4;
    Tensor t = from_eigen(v);
    CHECK(t.shape() == Shape{4});
    CHECK(t.to_vector<double>() == std::vector<double>{1, 2, 3, 4});
    Eigen::RowVectorXf r(3);
    r << 5, 6, 7;
    CHECK(from_eigen(r).shape() == Shape{3});
  }
  SUBCASE("arrays") {
    Eigen::ArrayXXf a = Eigen::ArrayXXf::Constant(2, 3, 1.5f);
    CHECK(sum(from_eigen(a)).item<float>() == 9.0f);
  }
  SUBCASE("a block of a column-major matrix is a strided view of the parent") {
    Eigen::MatrixXf m = numbered<Eigen::MatrixXf>(6, 5);
    auto blk = m.block(1, 2, 3, 2);
    Tensor t = from_eigen(blk);
    CHECK(t.shape() == Shape{3, 2});
    CHECK(t.strides() == Strides{1, 6});
    CHECK(t.data_ptr<float>() == &m(1, 2));
    check_same_matrix(t, Eigen::MatrixXf(blk));
  }
  SUBCASE("Map with inner and outer strides") {
    std::vector<float> buf(40);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
    // 3 x 4, row-major, rows 10 apart, every second element within a row.
    Eigen::Map<RowMatrixXf, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>> mp(
        buf.data(), 3, 4, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(10, 2));
    Tensor t = from_eigen(mp);
    CHECK(t.strides() == Strides{10, 2});
    check_same_matrix(t, RowMatrixXf(mp));
    // A temporary Map is fine: it is a view of memory that outlives it.
    Tensor u = from_eigen(Eigen::Map<Eigen::VectorXf>(buf.data(), 5));
    CHECK(u.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4});
  }
}

TEST_CASE("assigning to a view of an Eigen object writes into it") {
  Eigen::MatrixXf m = Eigen::MatrixXf::Zero(4, 3);
  Tensor t = from_eigen(m);
  Tensor x = arange(3, f32);
  t.assign(x * 2.0f + 1.0f);  // broadcast over rows
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(m(i, j) == 2.0f * j + 1.0f);
  // Into one column only, through a block view.
  auto col = m.col(1);
  from_eigen(col).assign(full({4}, -1.0));
  CHECK(m.col(1).isConstant(-1.0f));
  CHECK(m(0, 0) == 1.0f);
  CHECK(m(0, 2) == 5.0f);
}

TEST_CASE("to_eigen copies into plain Eigen types, converting the dtype") {
  Tensor t = from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3});  // f64
  SUBCASE("column-major MatrixXf") {
    auto m = to_eigen<Eigen::MatrixXf>(t);
    REQUIRE(m.rows() == 2);
    REQUIRE(m.cols() == 3);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) CHECK(m(i, j) == static_cast<float>(3 * i + j));
  }
  SUBCASE("row-major, int, fixed size") {
    auto r = to_eigen<Eigen::Matrix<std::int64_t, 2, 3, Eigen::RowMajor>>(t);
    CHECK(r(1, 2) == 5);
    CHECK(r(0, 1) == 1);
  }
  SUBCASE("of a lazy, non-contiguous tensor") {
    auto m = to_eigen<Eigen::MatrixXd>(transpose(t, 0, 1) * 2.0);
    REQUIRE(m.rows() == 3);
    CHECK(m(2, 1) == 10.0);
    CHECK(m(1, 0) == 2.0);
  }
  SUBCASE("vectors from 1-D tensors") {
    auto v = to_eigen<Eigen::VectorXf>(arange(4, f32));
    CHECK(v.size() == 4);
    CHECK(v(3) == 3.0f);
    auto b = to_eigen<Eigen::Matrix<bool, Eigen::Dynamic, 1>>(arange(4, i32) > 1);
    CHECK(b(1) == false);
    CHECK(b(2) == true);
  }
  SUBCASE("16-bit floats") {
    auto h = to_eigen<Eigen::Matrix<Eigen::half, Eigen::Dynamic, Eigen::Dynamic>>(t);
    CHECK(static_cast<float>(h(1, 2)) == 5.0f);
  }
  SUBCASE("wrong rank or fixed size throws ShapeError") {
    CHECK_THROWS_AS(to_eigen<Eigen::MatrixXf>(arange(4, f32)), ShapeError);
    CHECK_THROWS_AS(to_eigen<Eigen::Matrix3f>(t), ShapeError);
    CHECK_THROWS_AS(to_eigen<Eigen::VectorXf>(zeros({2, 2})), ShapeError);
  }
}

TEST_CASE("to_eigen maps over a tensor's storage without copying") {
  Tensor t = randn({4, 6}, 3);
  t.eval();
  std::vector<float> v = t.to_vector<float>();
  SUBCASE("row-major map of a contiguous tensor") {
    auto m = to_eigen<Eigen::Map<const RowMatrixXf>>(t);
    CHECK(m.data() == t.data_ptr<float>());
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) CHECK(m(i, j) == at(v, t, i, j));
  }
  SUBCASE("column-major map of the transposed view: the same memory") {
    Tensor tt = transpose(t, 0, 1);
    auto m = to_eigen<Eigen::Map<const Eigen::MatrixXf>>(tt);
    CHECK(m.data() == t.data_ptr<float>());
    REQUIRE(m.rows() == 6);
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 4; ++j) CHECK(m(i, j) == at(v, t, j, i));
  }
  SUBCASE("a strided slice through a dynamic-stride map") {
    Tensor s = slice(slice(t, 1, 1, 6, 2), 0, 1, 4);  // rows 1..3, columns 1, 3, 5
    using M = Eigen::Map<const RowMatrixXf, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;
    auto m = to_eigen<M>(s);
    REQUIRE(m.rows() == 3);
    REQUIRE(m.cols() == 3);
    CHECK(m.innerStride() == 2);
    CHECK(m.outerStride() == 6);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) CHECK(m(i, j) == at(v, t, i + 1, 2 * j + 1));
    // Only a map with dynamic strides can take it.
    CHECK_THROWS_AS(to_eigen<Eigen::Map<const RowMatrixXf>>(s), ShapeError);
    CHECK_THROWS_AS((to_eigen<Eigen::Map<const RowMatrixXf, Eigen::Unaligned, Eigen::OuterStride<>>>(s)), ShapeError);
  }
  SUBCASE("writes through a mutable map land in the tensor") {
    Tensor w = zeros({2, 3});
    w.eval();
    auto m = to_eigen<Eigen::Map<RowMatrixXf>>(w);
    m(1, 2) = 7.0f;
    CHECK(w.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 0, 7});
  }
  SUBCASE("a vector map of a 1-D tensor") {
    Tensor a = arange(5, f64);
    a.eval();
    auto m = to_eigen<Eigen::Map<const Eigen::VectorXd>>(a);
    CHECK(m.sum() == 10.0);
  }
  SUBCASE("layout and dtype mismatches throw") {
    CHECK_THROWS_AS(to_eigen<Eigen::Map<const Eigen::MatrixXf>>(t), ShapeError);  // row-major data
    CHECK_THROWS_AS(to_eigen<Eigen::Map<const Eigen::MatrixXd>>(t), DTypeError);
    Tensor three_d = broadcast_to(t, {3, 4, 6});
    CHECK_THROWS_AS(to_eigen<Eigen::Map<const RowMatrixXf>>(three_d), ShapeError);
    Tensor row = slice(t, 0, 0, 1);  // [1, 6]
    using Dyn = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
    Tensor bcast = broadcast_to(row, {4, 6});  // row stride 0
    CHECK_THROWS_AS((to_eigen<Eigen::Map<const RowMatrixXf, Eigen::Unaligned, Dyn>>(bcast)), ShapeError);
  }
}

#if KILN_HAS_EIGEN_TENSOR
TEST_CASE("Eigen::Tensor and TensorMap in both layouts") {
  SUBCASE("from_eigen of a column-major Eigen::Tensor indexes alike") {
    Eigen::Tensor<float, 3> e(2, 3, 4);  // ColMajor, Eigen's default
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) e(i, j, k) = static_cast<float>(100 * i + 10 * j + k);
    Tensor t = from_eigen(e);
    CHECK(t.shape() == Shape{2, 3, 4});
    CHECK(t.strides() == Strides{1, 2, 6});
    CHECK(t.data_ptr<float>() == e.data());
    std::vector<float> v = t.to_vector<float>();  // row-major
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) CHECK(v[(i * 3 + j) * 4 + k] == e(i, j, k));
    // And back, as a copy in either layout.
    Eigen::Tensor<float, 3> back = to_eigen<Eigen::Tensor<float, 3>>(t * 1.0f);
    Eigen::Tensor<float, 3, Eigen::RowMajor> back_rm = to_eigen<Eigen::Tensor<float, 3, Eigen::RowMajor>>(t);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int k = 0; k < 4; ++k) {
          CHECK(back(i, j, k) == e(i, j, k));
          CHECK(back_rm(i, j, k) == e(i, j, k));
        }
  }
  SUBCASE("row-major Eigen::Tensor and TensorMap views") {
    Eigen::Tensor<double, 2, Eigen::RowMajor> e(2, 3);
    e.setValues({{1, 2, 3}, {4, 5, 6}});
    Tensor t = from_eigen(e);
    CHECK(t.strides() == Strides{3, 1});
    CHECK(t.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
    Eigen::TensorMap<Eigen::Tensor<double, 2, Eigen::RowMajor>> map(e.data(), 2, 3);
    CHECK(from_eigen(map).to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  }
  SUBCASE("TensorMap over a tensor's storage, and its layout check") {
    Tensor t = arange(6, f32);
    Tensor m23 = reshape(t, {2, 3});
    m23.eval();
    auto rm = to_eigen<Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor>>>(m23);
    CHECK(rm.data() == m23.data_ptr<float>());
    CHECK(rm(1, 0) == 3.0f);
    Tensor tr = transpose(m23, 0, 1);  // [3, 2], column-major over the same memory
    auto cm = to_eigen<Eigen::TensorMap<Eigen::Tensor<const float, 2>>>(tr);
    CHECK(cm(0, 1) == 3.0f);
    CHECK(cm(2, 0) == 2.0f);
    CHECK_THROWS_AS((to_eigen<Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor>>>(tr)), ShapeError);
    CHECK_THROWS_AS((to_eigen<Eigen::TensorMap<Eigen::Tensor<const float, 3>>>(tr)), ShapeError);
  }
}
#endif

TEST_CASE("round trip: a kiln computation over Eigen data matches Eigen") {
  Eigen::MatrixXf x = Eigen::MatrixXf::Random(8, 16);
  Tensor y = softmax(from_eigen(x), -1);
  Eigen::MatrixXf got = to_eigen<Eigen::MatrixXf>(y);
  for (int i = 0; i < 8; ++i) {
    Eigen::ArrayXf e = (x.row(i).array() - x.row(i).maxCoeff()).exp();
    Eigen::ArrayXf want = e / e.sum();
    for (int j = 0; j < 16; ++j) CHECK(got(i, j) == doctest::Approx(want(j)).epsilon(1e-5));
  }
}

}  // namespace kiln_test_tensor_eigen
