// Creation (from_vector, from_blob, zeros, ones, full, arange, rand, randn), data access
// (item, to_vector), casting rules of to(DType), assign (broadcast + cast, in place, aliasing),
// Tensor handle semantics, eval of several tensors in one graph, launch counting in eager
// mode, laziness, and the bound on lazy graph depth/size.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "../support/reference.hpp"
#include "kiln/core/philox.hpp"

namespace kiln_test_tensor_creation {

using namespace kiln;
namespace kt = kiln::testing;

namespace {
std::vector<double> iota_values(std::int64_t n, double start = 0) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

/// `v` rounded to `bits` significant bits, to nearest even (an independent model of
/// narrowing float conversions of normal numbers).
double round_significand(double v, int bits) {
  int e = 0;
  double m = std::frexp(v, &e);  // v = m 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}

/// Restores the backend selected before the test when it goes out of scope.
struct BackendGuard {
  Backend saved = get_backend();
  ~BackendGuard() { set_backend(saved); }
};
}  // namespace

TEST_CASE("from_vector: every dtype round-trips exactly; metadata") {
  const Device dev = kt::device();
  for (DType dt : kt::kAllDTypes) {
    CAPTURE(dt);
    auto v = kt::values_for(dt, 12, -100, 100, 3);
    Tensor t = kt::make_tensor(v, {3, 4}, dt, dev);
    CHECK(t.dtype() == dt);
    CHECK(t.shape() == Shape{3, 4});
    CHECK(t.dim() == 2);
    CHECK(t.numel() == 12);
    CHECK(t.size(0) == 3);
    CHECK(t.size(-1) == 4);
    CHECK(t.device() == dev);
    CHECK(t.is_evaluated());
    CHECK(kt::values(t) == v);
  }
  Tensor s = from_vector<double>({2.5}, {}, dev);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item<double>() == 2.5);
  Tensor e = from_vector<float>({}, {0, 5}, dev);
  CHECK(e.numel() == 0);
  CHECK(e.to_vector<float>().empty());
  Tensor h = from_vector<Half>({Half(1.5f), Half(-2.0f)}, {2}, dev);
  CHECK(h.dtype() == DType::Float16);
  CHECK(static_cast<float>(h.to_vector<Half>()[0]) == 1.5f);
  Tensor b = from_vector<bool>({true, false, true}, {3}, dev);
  CHECK(b.dtype() == DType::Bool);
  CHECK(b.to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(Tensor().defined() == false);
  CHECK(s.defined());
}

TEST_CASE("to_vector<T> converts as to(dtype_v<T>) does") {
  Tensor f = kt::make_tensor({1.7, -2.5, 0.0, 3.99}, {4}, DType::Float32);
  CHECK(f.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -2, 0, 3});
  CHECK(f.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, -2, 0, 3});
  CHECK(f.to_vector<bool>() == std::vector<bool>{true, true, false, true});
  CHECK(f.to_vector<double>() == std::vector<double>{1.7f, -2.5, 0.0, 3.99f});
  Tensor i = kt::make_tensor({7, -3}, {2}, DType::Int64);
  CHECK(i.to_vector<float>() == std::vector<float>{7, -3});
  CHECK(i.to_vector<double>() == std::vector<double>{7, -3});
}

TEST_CASE("zeros, ones, full, arange") {
  const Device dev = kt::device();
  Tensor z = zeros({2, 3}, f32, dev);
  CHECK(z.dtype() == DType::Float32);
  CHECK(z.device() == dev);
  KILN_CHECK_CLOSE(z, kt::Ref{std::vector<double>(6, 0.0), {2, 3}});
  CHECK(zeros({4}).dtype() == DType::Float32);  // default dtype
  for (DType dt : kt::kAllDTypes) {
    CAPTURE(dt);
    Tensor o = ones({3}, dt, dev);
    CHECK(o.dtype() == dt);
    KILN_CHECK_CLOSE(o, std::vector<double>{1, 1, 1});
    Tensor fl = full({2, 2}, 7, dt, dev);
    CHECK(fl.dtype() == dt);
    KILN_CHECK_CLOSE(fl, std::vector<double>(4, dt == DType::Bool ? 1 : 7));
    Tensor a = arange(5, dt == DType::Bool ? DType::Int32 : dt, dev);
    KILN_CHECK_CLOSE(a, kt::Ref{{0, 1, 2, 3, 4}, {5}});
  }
  KILN_CHECK_CLOSE(full({3}, 2.5, f16, dev), std::vector<double>{2.5, 2.5, 2.5});
  KILN_CHECK_CLOSE(full({2}, 0.1, f64, dev), std::vector<double>{0.1, 0.1});
  KILN_CHECK_CLOSE(full({2}, 0.1, f32, dev), std::vector<double>{0.1f, 0.1f});
  KILN_CHECK_CLOSE(full({3}, NAN, f32, dev), std::vector<double>{NAN, NAN, NAN});
  KILN_CHECK_CLOSE(full({1}, -INFINITY, bf16, dev), std::vector<double>{-INFINITY});
  // Without a dtype, full's comes from the value, as torch.full's.
  CHECK(full({2}, 3).dtype() == DType::Int64);
  CHECK(full({2}, true).dtype() == DType::Bool);
  CHECK(full({2}, 3.0).dtype() == DType::Float32);
  CHECK(full({2}, 2.5f).dtype() == DType::Float32);
  KILN_CHECK_EXACT(full({2}, -7), {-7, -7});
  Tensor a = arange(6);
  CHECK(a.dtype() == DType::Int64);
  KILN_CHECK_EXACT(a, {0, 1, 2, 3, 4, 5});
  CHECK(arange(0).numel() == 0);
  Tensor s = ones({}, f32, dev);
  CHECK(s.dim() == 0);
  CHECK(s.item<float>() == 1.0f);
  // Creation is lazy: nothing runs until the values are needed.
  reset_stats();
  Tensor lazy = full({1000}, 3.0, f32, dev) + ones({1000}, f32, dev);
  CHECK_FALSE(lazy.is_evaluated());
  CHECK(stats().graphs == 0);
  CHECK(sum(lazy).item<float>() == 4000.0f);
}

TEST_CASE("rand: [0, 1), counter-based Philox, seeds") {
  const Device dev = kt::device();
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    auto v = kt::values(rand({1 << 16}, 42, dt, dev));
    CHECK(rand({4}, 42, dt, dev).dtype() == dt);
    double lo = 1, hi = 0, mean = 0;
    for (double x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      mean += x;
    }
    mean /= static_cast<double>(v.size());
    CHECK(lo >= 0.0);
    CHECK(hi < 1.0);
    CHECK(std::fabs(mean - 0.5) < 0.01);                   // std of the mean: 0.29 / 256
    CHECK(kt::values(rand({1 << 16}, 42, dt, dev)) == v);  // same seed, same numbers
    auto w = kt::values(rand({1 << 16}, 43, dt, dev));
    std::size_t same = 0;
    for (std::size_t i = 0; i < v.size(); ++i) same += v[i] == w[i];
    CHECK(same < v.size() / 50);  // different seeds differ (ties only by chance)
  }
  // Element i is kiln::philox's number i (float32: word i % 4 of block i / 4), whatever the shape.
  auto flat = rand({20}, 7, f32, dev).to_vector<float>();
  for (std::size_t i = 0; i < flat.size(); ++i) CHECK(flat[i] == philox::uniform_f32(7, i));
  CHECK(rand({4, 5}, 7, f32, dev).to_vector<float>() == flat);
  auto prefix = rand({5}, 7, f32, dev).to_vector<float>();
  CHECK(std::equal(prefix.begin(), prefix.end(), flat.begin()));
  auto h = rand({8}, 9, f16, dev).to_vector<Half>();
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(static_cast<float>(h[i]) == philox::uniform_f16(9, i));
  auto d = rand({8}, 9, f64, dev).to_vector<double>();
  for (std::size_t i = 0; i < d.size(); ++i) CHECK(d[i] == philox::uniform_f64(9, i));
  // rand inside an expression is still the same numbers.
  KILN_CHECK_CLOSE(rand({20}, 7, f32, dev) * 2.0f, [&] {
    std::vector<double> e;
    for (float x : flat) e.push_back(2.0 * x);
    return e;
  }());
  CHECK_THROWS_AS(rand({3}, 1, i32, dev), DTypeError);
  // On the CPU the seed is a kernel argument (as numbers are): new seeds reuse the kernel and
  // still give each seed's own numbers.
  if (dev.is_cpu()) {
    Tensor(rand({64}, 1000, f32, dev) * 3.0f + 1.0f).eval();
    const auto before = stats().compiles;
    for (std::uint64_t seed = 1001; seed < 1005; ++seed) {
      auto got = Tensor(rand({64}, seed, f32, dev) * 3.0f + 1.0f).to_vector<float>();
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == 3.0f * philox::uniform_f32(seed, i) + 1.0f);
    }
    CHECK(stats().compiles == before);
  }
}

TEST_CASE("rand/randn without a seed draw from the global generator (manual_seed, rand_like)") {
  const Device dev = kt::device();
  manual_seed(123);
  CHECK(initial_seed() == 123);
  auto a = kt::values(rand({256}, f32, dev));
  auto b = kt::values(rand({256}, f32, dev));
  CHECK(a != b);  // each draw is a new stream
  for (double x : a) {
    CHECK(x >= 0);
    CHECK(x < 1);
  }
  manual_seed(123);  // the same sequence again
  CHECK(kt::values(rand({256}, f32, dev)) == a);
  CHECK(kt::values(rand({256}, f32, dev)) == b);
  manual_seed(124);
  CHECK(kt::values(rand({256}, f32, dev)) != a);
  // An explicit seed neither uses nor advances the generator.
  manual_seed(123);
  CHECK(kt::values(rand({256}, 5, f32, dev)) == kt::values(rand({256}, 5, f32, dev)));
  CHECK(kt::values(rand({256}, f32, dev)) == a);

  Tensor like = rand_like(ones({3, 4}, f64, dev));
  CHECK(like.shape() == Shape{3, 4});
  CHECK(like.dtype() == f64);
  CHECK(like.device() == dev);
  Tensor nl = randn_like(like);
  CHECK(nl.shape() == Shape{3, 4});
  CHECK(nl.dtype() == f64);
  const std::int64_t n = 1 << 16;
  auto z = kt::values(randn({n}, f32, dev));
  double m = 0, sq = 0;
  for (double x : z) m += x;
  m /= n;
  for (double x : z) sq += (x - m) * (x - m);
  CHECK(std::fabs(m) < 0.02);  // 5 sigma of the mean is 0.0195
  CHECK(std::fabs(std::sqrt(sq / (n - 1)) - 1.0) < 0.02);

  CHECK_THROWS_AS(rand({3}, i32, dev), DTypeError);
  CHECK_THROWS_AS(randn({3}, i64, dev), DTypeError);
  // Traced once, a draw would replay the same numbers on every call: refused, saying why.
  auto f = kiln::compile([](const Tensor& x) { return x * rand(x.shape(), x.dtype(), x.device()); });
  KILN_CHECK_THROWS_MENTIONING(ValueError, f(ones({4}, f32, dev)), "rand without a seed", "kiln::compile");
  manual_seed(detail::kDefaultSeed);
  CHECK(initial_seed() == 67280421310721ull);  // PyTorch's default
}

TEST_CASE("randn: standard normal statistics and determinism") {
  const Device dev = kt::device();
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    CAPTURE(dt);
    const std::int64_t n = 1 << 18;
    auto v = kt::values(randn({n}, 5, dt, dev));
    double m = 0, sq = 0;
    for (double x : v) m += x;
    m /= n;
    for (double x : v) sq += (x - m) * (x - m);
    double sd = std::sqrt(sq / (n - 1));
    CHECK(std::fabs(m) < 0.01);  // 5 sigma of the mean is 0.0098
    CHECK(std::fabs(sd - 1.0) < 0.01);
    CHECK(kt::values(randn({n}, 5, dt, dev)) == v);
  }
  // The numbers are kiln::philox's (to float tolerance: device math libraries may differ by an ulp).
  auto x = randn({64}, 11, f32, dev).to_vector<float>();
  std::vector<double> expected;
  for (std::size_t i = 0; i < x.size(); ++i) expected.push_back(philox::normal_f32(11, i));
  KILN_CHECK_CLOSE(std::vector<double>(x.begin(), x.end()), expected, kt::tolerance(DType::Float32));
  CHECK_THROWS_AS(randn({3}, 1, DType::Bool, dev), DTypeError);
}

TEST_CASE("item") {
  Tensor x = kt::make_tensor({1.5, 2.5, 3.5}, {3}, DType::Float32);
  CHECK(sum(x).item<float>() == 7.5f);
  CHECK(sum(x).item<double>() == 7.5);
  CHECK(sum(x).item<std::int32_t>() == 7);
  CHECK(max(x).item<bool>() == true);
  CHECK(kt::make_tensor({4}, {1, 1}, DType::Int32).item<std::int64_t>() == 4);
  CHECK(kt::make_tensor({0.333}, {}, DType::Float16).item<float>() == round_significand(0.333, 11));
  CHECK_THROWS_AS(x.item<float>(), ShapeError);
  CHECK_THROWS_AS(kt::make_tensor({}, {0}, DType::Float32).item<float>(), ShapeError);
}

TEST_CASE("to(DType): PyTorch's casting rules") {
  const double nan = NAN, inf = INFINITY;
  SUBCASE("float -> int truncates toward zero") {
    for (DType src : kt::kFloatDTypes)
      for (DType dst : kt::kIntDTypes) {
        CAPTURE(src);
        CAPTURE(dst);
        Tensor t = kt::make_tensor({-1.75, -0.5, 0.5, 2.875, -2.0, 100.0}, {6}, src).to(dst);
        CHECK(t.dtype() == dst);
        KILN_CHECK_EXACT(t, {-1, 0, 0, 2, -2, 100});
      }
  }
  SUBCASE("-> bool: nonzero (NaN included) is true") {
    for (DType src : kt::kFloatDTypes) {
      CAPTURE(src);
      Tensor t = kt::make_tensor({0.0, -0.0, 0.5, nan, -2.0, inf}, {6}, src).to(DType::Bool);
      CHECK(t.dtype() == DType::Bool);
      KILN_CHECK_EXACT(t, {0, 0, 1, 1, 1, 1});
    }
    KILN_CHECK_EXACT(kt::make_tensor({0, 3, -1}, {3}, DType::Int32).to(DType::Bool), {0, 1, 1});
    KILN_CHECK_EXACT(kt::make_tensor({0, 3, -1}, {3}, DType::Int64).to(DType::Bool), {0, 1, 1});
  }
  SUBCASE("bool -> numbers: 0 and 1") {
    Tensor b = kt::make_tensor({1, 0, 1}, {3}, DType::Bool);
    for (DType dst : kt::kAllDTypes) {
      CAPTURE(dst);
      KILN_CHECK_CLOSE(b.to(dst), std::vector<double>{1, 0, 1});
    }
  }
  SUBCASE("narrowing float conversions round to nearest even") {
    const double e11 = std::ldexp(1.0, -11), e8 = std::ldexp(1.0, -8);
    Tensor f =
        kt::make_tensor({1 + e11, 1 + 3 * e11, 65504, 65520, 1e-8, -1e-8, nan, -inf, 6.0e-8}, {9}, DType::Float32);
    auto h = kt::values(f.to(DType::Float16));
    KILN_CHECK_CLOSE(h, std::vector<double>{1, 1 + 4 * e11, 65504, inf, 0, -0.0, nan, -inf, std::ldexp(1.0, -24)},
                     kt::Tolerance{});
    CHECK(std::signbit(h[5]));  // -1e-8 underflows to -0.0
    Tensor g = kt::make_tensor({1 + e8, 1 + 3 * e8, 3.0e38, nan, 0.1}, {5}, DType::Float32);
    KILN_CHECK_CLOSE(kt::values(g.to(DType::BFloat16)),
                     std::vector<double>{1, 1 + 4 * e8, round_significand(3.0e38f, 8), nan, round_significand(0.1f, 8)},
                     kt::Tolerance{});
    Tensor d = kt::make_tensor({0.1, 1e300, -1e-300}, {3}, DType::Float64);
    auto fd = kt::values(d.to(DType::Float32));
    KILN_CHECK_CLOSE(fd, std::vector<double>{0.1f, inf, -0.0}, kt::Tolerance{});
    CHECK(std::signbit(fd[2]));
  }
  SUBCASE("integer conversions") {
    const std::int64_t two24p1 = (std::int64_t(1) << 24) + 1;
    KILN_CHECK_CLOSE(kt::make_int_tensor({two24p1, -7}, {2}).to(DType::Float32), std::vector<double>{16777216.0, -7},
                     kt::Tolerance{});
    KILN_CHECK_EXACT(kt::make_int_tensor({(std::int64_t(1) << 32) + 5, -1}, {2}).to(DType::Int32), {5, -1});  // wraps
    KILN_CHECK_EXACT(kt::make_int_tensor({-5, 2147483647}, {2}, DType::Int32).to(DType::Int64), {-5, 2147483647});
    KILN_CHECK_CLOSE(kt::make_int_tensor({2049, 3}, {2}, DType::Int32).to(DType::Float16), std::vector<double>{2048, 3},
                     kt::Tolerance{});
  }
  SUBCASE("to() of the same dtype and device") {
    Tensor x = kt::make_tensor({1, 2}, {2}, DType::Float32);
    KILN_CHECK_CLOSE(x.to(DType::Float32), std::vector<double>{1, 2});
    Tensor same = x.to(kt::device());
    CHECK(same.data_ptr<float>() == x.data_ptr<float>());
    CHECK(x.to(DType::Float64).dtype() == DType::Float64);
  }
}

TEST_CASE("from_blob: memory of another device is a DeviceError naming from_blob, when it is made") {
  std::vector<float> host = {1, 2, 3, 4};
  // Host memory as a GPU's: no CUDA here, or CUDA that does not know the pointer.
  try {
    (void)from_blob(host.data(), {4}, Device::cuda(0));
    FAIL("from_blob took host memory as cuda:0's");
  } catch (const DeviceError& e) {
    CHECK_MESSAGE(std::string(e.what()).find("from_blob") != std::string::npos, e.what());
  }
  if (kt::device().is_cuda()) {
    Tensor g = from_vector<float>({5, 6, 7}, {3}, kt::device());
    float* p = g.data_ptr<float>();
    // A GPU's memory as the CPU's.
    try {
      (void)from_blob(p, {3}, Device::cpu());
      FAIL("from_blob took device memory as the CPU's");
    } catch (const DeviceError& e) {
      CHECK_MESSAGE(std::string(e.what()).find("device memory of " + kt::device().str()) != std::string::npos,
                    e.what());
    }
    // Its own GPU: a view of it.
    Tensor v = from_blob(p, {3}, kt::device());
    KILN_CHECK_CLOSE(v * 2.0f, std::vector<double>{10, 12, 14});
  }
}

TEST_CASE("from_blob: a view of user memory (host memory: CPU only)") {
  const Device cpu = Device::cpu();
  SUBCASE("reads the user's memory without copying, at evaluation time") {
    std::vector<float> buf = {1, 2, 3, 4, 5, 6};
    Tensor t = from_blob(buf.data(), {2, 3}, cpu);
    CHECK(t.is_evaluated());
    CHECK(t.data_ptr<float>() == buf.data());
    KILN_CHECK_CLOSE(t * 2.0f, kt::Ref{{2, 4, 6, 8, 10, 12}, {2, 3}});
    buf[0] = 100;  // the view sees later writes
    KILN_CHECK_CLOSE(t + 0.0f, kt::Ref{{100, 2, 3, 4, 5, 6}, {2, 3}});
  }
  SUBCASE("results assigned into user memory") {
    std::vector<float> out(6, -1.0f);
    Tensor dst = from_blob(out.data(), {2, 3}, cpu);
    Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, cpu);
    dst.assign(x * 3.0f + 1.0f);
    CHECK(out == std::vector<float>{4, 7, 10, 13, 16, 19});
    dst.assign(sum(x, 1, true));  // broadcast along rows
    CHECK(out == std::vector<float>{6, 6, 6, 15, 15, 15});
    dst.assign(0.5);
    CHECK(out == std::vector<float>(6, 0.5f));
    std::vector<std::int32_t> iout(3, 0);
    from_blob(iout.data(), {3}, cpu).assign(from_vector<float>({1.9f, -1.9f, 7.5f}, {3}, cpu));  // cast by truncation
    CHECK(iout == std::vector<std::int32_t>{1, -1, 7});
    std::vector<double> dout(2, 0.0);
    from_blob(dout.data(), {2}, cpu).assign(from_vector<float>({0.1f, 2.0f}, {2}, cpu));
    CHECK(dout == std::vector<double>{static_cast<double>(0.1f), 2.0});
  }
  SUBCASE("strided views: column-major and padded rows") {
    // Column-major 2x3: element (i, j) at i + 2 j.
    std::vector<float> cm = {0, 3, 1, 4, 2, 5};
    Tensor t = from_blob(cm.data(), {2, 3}, cpu, {1, 2});
    CHECK(t.strides() == Strides{1, 2});
    KILN_CHECK_CLOSE(t, kt::Ref{{0, 1, 2, 3, 4, 5}, {2, 3}});
    KILN_CHECK_CLOSE(sum(t, 1), std::vector<double>{3, 12});
    t.assign(from_vector<float>({10, 11, 12, 13, 14, 15}, {2, 3}, cpu));
    CHECK(cm == std::vector<float>{10, 13, 11, 14, 12, 15});
    // Rows of 3 inside rows of 4: the padding is never touched.
    std::vector<double> padded = {1, 2, 3, -99, 4, 5, 6, -99};
    Tensor p = from_blob(padded.data(), {2, 3}, cpu, {4, 1});
    KILN_CHECK_CLOSE(p * 1.0, kt::Ref{{1, 2, 3, 4, 5, 6}, {2, 3}});
    p.assign(p * 10.0);
    CHECK(padded == std::vector<double>{10, 20, 30, -99, 40, 50, 60, -99});
    p.assign(transpose(from_vector<double>({7, 8, 9, 10, 11, 12}, {3, 2}, cpu), 0, 1));
    CHECK(padded == std::vector<double>{7, 9, 11, -99, 8, 10, 12, -99});
  }
  SUBCASE("other dtypes, const memory, empty") {
    std::vector<Half> hv = {Half(1.5f), Half(-2.0f)};
    Tensor h = from_blob(hv.data(), {2}, cpu);
    CHECK(h.dtype() == DType::Float16);
    KILN_CHECK_CLOSE(h * 2.0, std::vector<double>{3, -4});
    const std::vector<std::int64_t> cv = {5, 6, 7};
    Tensor c = from_blob(cv.data(), {3}, cpu);
    CHECK(c.dtype() == DType::Int64);
    KILN_CHECK_EXACT(c + 1, {6, 7, 8});
    Tensor e = from_blob(static_cast<float*>(nullptr), {0, 4}, cpu);
    CHECK(e.numel() == 0);
    CHECK(sum(e).item<float>() == 0.0f);
  }
}

TEST_CASE("assign: broadcast and cast into the destination's storage") {
  Tensor d = zeros({2, 3}, i32, kt::device());
  d.eval();
  const void* p = d.data_ptr<std::int32_t>();
  d.assign(kt::make_tensor({1.7, -2.5, 3.2}, {3}, DType::Float32));
  CHECK(d.dtype() == DType::Int32);
  CHECK(d.shape() == Shape{2, 3});
  CHECK(d.data_ptr<std::int32_t>() == p);
  KILN_CHECK_EXACT(d, {1, -2, 3, 1, -2, 3});
  d.assign(7);
  KILN_CHECK_EXACT(d, {7, 7, 7, 7, 7, 7});
  d.assign(2.9);
  KILN_CHECK_EXACT(d, {2, 2, 2, 2, 2, 2});
  d.assign(kt::make_tensor({5}, {}, DType::Int64));  // 0-dim broadcasts
  KILN_CHECK_EXACT(d, {5, 5, 5, 5, 5, 5});
  d.assign(kt::make_tensor({-1, 1}, {2, 1}, DType::Float64));
  KILN_CHECK_EXACT(d, {-1, -1, -1, 1, 1, 1});
  CHECK(d.data_ptr<std::int32_t>() == p);

  Tensor h = ones({3}, f16, kt::device());
  h.assign(kt::make_tensor({0.1, 1000.2, -2.0}, {3}, DType::Float64));
  KILN_CHECK_CLOSE(kt::values(h), std::vector<double>{round_significand(0.1, 11), 1000.0, -2.0}, kt::Tolerance{});
  Tensor b = zeros({3}, bool_, kt::device());
  b.assign(kt::make_tensor({0.0, 0.25, -3.0}, {3}, DType::Float32));
  KILN_CHECK_EXACT(b, {0, 1, 1});
  // A lazy destination is evaluated first, then written.
  Tensor lazy = ones({2, 2}, f32, kt::device()) * 3.0f;
  lazy.assign(kt::make_tensor({1, 2}, {2}, DType::Float32));
  KILN_CHECK_CLOSE(lazy, kt::Ref{{1, 2, 1, 2}, {2, 2}});
  // Shapes that do not broadcast to the destination: ShapeError, destination unchanged.
  CHECK_THROWS_AS(d.assign(kt::make_tensor({1, 2, 3}, {3, 1}, DType::Int32)), ShapeError);
  CHECK_THROWS_AS(d.assign(kt::make_tensor({1, 2, 3, 4, 5, 6}, {1, 2, 3}, DType::Int32)), ShapeError);
  KILN_CHECK_EXACT(d, {-1, -1, -1, 1, 1, 1});
  // A broadcast view has elements sharing memory: it cannot be a destination.
  Tensor row = kt::make_tensor({1, 2, 3}, {3}, DType::Float32);
  Tensor bview = broadcast_to(row, {2, 3});
  CHECK_THROWS_AS(bview.assign(kt::make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float32)), ShapeError);
  KILN_CHECK_CLOSE(row, std::vector<double>{1, 2, 3});
}

TEST_CASE("assign in place and with aliasing reads before it writes") {
  auto square = [] {
    Tensor x = kt::make_tensor({0, 1, 2, 3, 4, 5, 6, 7, 8}, {3, 3}, DType::Float32);
    x.eval();
    return x;
  };
  SUBCASE("x.assign(x * 2)") {
    Tensor x = square();
    const float* p = x.data_ptr<float>();
    x.assign(x * 2.0f);
    CHECK(x.data_ptr<float>() == p);
    KILN_CHECK_CLOSE(x, kt::Ref{{0, 2, 4, 6, 8, 10, 12, 14, 16}, {3, 3}});
  }
  SUBCASE("x.assign(transpose(x)) on a square matrix") {
    Tensor x = square();
    const float* p = x.data_ptr<float>();
    x.assign(transpose(x, 0, 1));
    CHECK(x.data_ptr<float>() == p);
    KILN_CHECK_CLOSE(x, kt::Ref{{0, 3, 6, 1, 4, 7, 2, 5, 8}, {3, 3}});
  }
  SUBCASE("x.assign(x + transpose(x))") {
    Tensor x = square();
    x.assign(x + transpose(x, 0, 1));
    KILN_CHECK_CLOSE(x, kt::Ref{{0, 4, 8, 4, 8, 12, 8, 12, 16}, {3, 3}});
  }
  SUBCASE("a reduction of x assigned to x") {
    Tensor x = square();
    x.assign(sum(x, 0, true));
    KILN_CHECK_CLOSE(x, kt::Ref{{9, 12, 15, 9, 12, 15, 9, 12, 15}, {3, 3}});
    Tensor y = square();
    y.assign(y - mean(y, 1, true));
    KILN_CHECK_CLOSE(y, kt::Ref{{-1, 0, 1, -1, 0, 1, -1, 0, 1}, {3, 3}});
  }
  SUBCASE("overlapping shifted views") {
    Tensor v = kt::make_tensor({0, 1, 2, 3, 4, 5}, {6}, DType::Float32);
    v.eval();
    slice(v, 0, 0, 5).assign(slice(v, 0, 1, 6));  // shift left
    KILN_CHECK_CLOSE(v, std::vector<double>{1, 2, 3, 4, 5, 5});
    Tensor w = kt::make_tensor({0, 1, 2, 3, 4, 5}, {6}, DType::Float32);
    w.eval();
    slice(w, 0, 1, 6).assign(slice(w, 0, 0, 5));  // shift right
    KILN_CHECK_CLOSE(w, std::vector<double>{0, 0, 1, 2, 3, 4});
    Tensor x = square();
    x.assign(slice(x, 0, 0, 1));  // every row becomes the first row
    KILN_CHECK_CLOSE(x, kt::Ref{{0, 1, 2, 0, 1, 2, 0, 1, 2}, {3, 3}});
  }
  SUBCASE("other handles and views of the storage see the new values") {
    Tensor x = square();
    Tensor alias = x;                // a copy of the handle
    Tensor col = slice(x, 1, 2, 3);  // a view
    x.assign(x * -1.0f);
    KILN_CHECK_CLOSE(alias, kt::Ref{{0, -1, -2, -3, -4, -5, -6, -7, -8}, {3, 3}});
    KILN_CHECK_CLOSE(col, kt::Ref{{-2, -5, -8}, {3, 1}});
    // Plain `=` rebinds the handle; the old storage is untouched.
    x = x + 100.0f;
    KILN_CHECK_CLOSE(alias, kt::Ref{{0, -1, -2, -3, -4, -5, -6, -7, -8}, {3, 3}});
    KILN_CHECK_CLOSE(x, kt::Ref{{100, 99, 98, 97, 96, 95, 94, 93, 92}, {3, 3}});
  }
}

TEST_CASE("laziness: building runs nothing; data access evaluates") {
  Tensor x = kt::make_tensor({1, 2, 3, 4}, {2, 2}, DType::Float32);
  Tensor y = kt::make_tensor({1, 1}, {2}, DType::Float32);
  reset_stats();
  Tensor z = softmax(exp(x) * 2.0f + y, -1);
  Tensor s = sum(z, 1);  // rows of a softmax sum to 1
  CHECK(stats().graphs == 0);
  CHECK(stats().launches == 0);
  CHECK_FALSE(z.is_evaluated());
  CHECK(z.shape() == Shape{2, 2});  // metadata needs no evaluation
  CHECK(s.dtype() == DType::Float32);
  CHECK(stats().graphs == 0);
  auto v = s.to_vector<float>();
  CHECK(stats().graphs >= 1);
  CHECK(s.is_evaluated());
  KILN_CHECK_CLOSE(std::vector<double>(v.begin(), v.end()), std::vector<double>{1, 1}, kt::tolerance(DType::Float32));
}

TEST_CASE("eval(a, b) evaluates both in one graph") {
  Tensor x = kt::make_tensor(kt::uniform_values(12, -1, 1, DType::Float32, 4), {3, 4}, DType::Float32);
  kt::Ref rx = kt::ref_of(x);
  Tensor a = x * 2.0f + 1.0f;
  Tensor b = sum(x * 2.0f + 1.0f, 1);
  Tensor c = softmax(x, 0);
  reset_stats();
  eval(a, b, c);
  CHECK(stats().graphs == 1);
  CHECK(a.is_evaluated());
  CHECK(b.is_evaluated());
  CHECK(c.is_evaluated());
  kt::Ref ra = kt::map(rx, [](double v) { return 2 * v + 1; });
  KILN_CHECK_CLOSE(a, ra);
  KILN_CHECK_CLOSE(b, kt::reduce(ra, {1}, false, kt::ref_sum));
  // Already evaluated: nothing more runs.
  eval(a, b);
  CHECK(stats().graphs == 1);
  // The vector form.
  std::vector<Tensor> ts = {x - 1.0f, max(x, 0), argmin(x, 1)};
  eval(ts);
  CHECK(stats().graphs == 2);
  for (auto& t : ts) CHECK(t.is_evaluated());
  KILN_CHECK_EXACT(ts[2], [&] {
    auto r = kt::reduce(rx, {1}, false, [](const std::vector<double>& g) { return kt::ref_argext(g, false); });
    return std::vector<std::int64_t>(r.v.begin(), r.v.end());
  }());
  // One output depending on another, in one graph.
  Tensor d = exp(x);
  Tensor e = sum(d, 1);
  eval(d, e);
  CHECK(stats().graphs == 3);
  KILN_CHECK_CLOSE(e, kt::reduce(kt::map(rx, [](double v) { return std::exp(v); }), {1}, false, kt::ref_sum));
}

TEST_CASE("eager backend: one launch per primitive executed") {
  BackendGuard guard;
  set_backend(Backend::Eager);
  CHECK(get_backend() == Backend::Eager);
  Tensor x = kt::make_tensor({1, 2, 3, 4}, {4}, DType::Float32);
  Tensor y = kt::make_tensor({4, 3, 2, 1}, {4}, DType::Float32);
  reset_stats();
  Tensor z = (x + y) * x;
  z.eval();
  CHECK(stats().launches == 2);
  CHECK(stats().graphs == 1);
  KILN_CHECK_CLOSE(z, std::vector<double>{5, 10, 15, 20});
  // A repeated subexpression is computed once.
  reset_stats();
  Tensor w = (x + y) * (x + y);
  w.eval();
  CHECK(stats().launches == 2);
  KILN_CHECK_CLOSE(w, std::vector<double>{25, 25, 25, 25});
  // In general: one launch per non-leaf node of the captured graph.
  Tensor big = softmax(exp(x) * 2.0f + y, -1) - sum(x, 0, true);
  ir::Captured cap = ir::capture({big.node()}, big.device());
  std::uint64_t primitives = 0;
  for (auto& n : cap.graph.nodes) primitives += n.op != ir::Op::Input;
  CHECK(primitives > 8);
  reset_stats();
  big.eval();
  CHECK(stats().launches == primitives);
  CHECK(stats().graphs == 1);
}

TEST_CASE("lazy graphs are bounded: chains of 1000 ops evaluate as they grow") {
  const Device dev = kt::device();
  Tensor x0 = arange(64, f32, dev);
  x0.eval();
  reset_stats();
  Tensor x = x0;
  for (int i = 0; i < 1000; ++i) x = x + 1.0f;
  CHECK(stats().graphs >= 9);  // depth limit 100: evaluated on the way
  CHECK(x.node()->depth <= 101);
  KILN_CHECK_CLOSE(x, kt::Ref{iota_values(64, 1000), {64}}, kt::Tolerance{});
  // Node-count bound: x = (x + x) * 0.5 doubles the unshared node count every step.
  Tensor y = x0;
  reset_stats();
  for (int i = 0; i < 1000; ++i) y = (y + y) * 0.5f;
  CHECK(stats().graphs >= 10);
  KILN_CHECK_CLOSE(y, kt::Ref{iota_values(64), {64}}, kt::Tolerance{});
  // A long chain of transcendental ops through a second operand.
  Tensor z = x0 * 0.01f;
  Tensor w = ones({64}, f32, dev) * 0.5f;
  std::vector<double> rz(64);
  for (int k = 0; k < 64; ++k) rz[k] = static_cast<float>(static_cast<float>(k) * 0.01f);
  for (int i = 0; i < 300; ++i) {
    z = sin(z) * w + 0.25f;
    for (auto& v : rz) v = std::sin(v) * 0.5 + 0.25;
  }
  KILN_CHECK_CLOSE(z, rz);
}

TEST_CASE("typed expressions are safe to hold in auto after their operands' handles are gone") {
  auto make = [] {
    Tensor a = kt::make_tensor({1, 2, 3}, {3}, DType::Float32);
    Tensor b = kt::make_tensor({10, 20, 30}, {3}, DType::Float32);
    return exp(a * 0.0f) * b + a;  // an expression holding a and b
  };
  auto e = make();
  Tensor t = e;
  KILN_CHECK_CLOSE(t, std::vector<double>{11, 22, 33});
  Tensor t2 = e;  // converting twice gives equal values
  KILN_CHECK_CLOSE(t2, std::vector<double>{11, 22, 33});
  // The expression's C++ type carries its structure.
  using E1 = decltype(e);
  static_assert(E1::kStructKey != decltype(std::declval<Tensor>() + std::declval<Tensor>())::kStructKey);
  static_assert(decltype(std::declval<Tensor>() * 2.0f)::kStructKey ==
                decltype(std::declval<Tensor>() * 3.0f)::kStructKey);
}

TEST_CASE("Tensor::describe, str and undefined tensors") {
  Tensor x = kt::make_tensor({1, 2}, {2}, DType::Float16);
  CHECK(x.describe().find("float16[2]") != std::string::npos);
  Tensor l = x + 1.0;
  CHECK(l.describe().find("lazy") != std::string::npos);
  CHECK(l.str() == "tensor([2., 3.], dtype=float16, shape=[2], device=" + kt::device().str() + ")");  // str() evaluates
  CHECK(l.describe().find("lazy") == std::string::npos);
  Tensor u;
  CHECK(u.str() == "Tensor(undefined)");
  CHECK(u.describe() == "Tensor(undefined)");
  CHECK_THROWS_AS(u.shape(), Error);
  CHECK_THROWS_AS(u.eval(), Error);
  CHECK_THROWS_AS(sum(u), Error);
}

}  // namespace kiln_test_tensor_creation
