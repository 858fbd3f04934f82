// IR-level tests of the reference executor (kiln/backend/reference.hpp) and of Philox
// (kiln/core/philox.hpp): graphs built with ir:: builders, captured, run, and checked against
// values computed here in double or exact integers.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/backend/reference.hpp"

namespace kiln_test_backend_reference {

using namespace kiln;
using ir::NodePtr;
using ir::Op;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const Device kCpu = Device::cpu();

// Host vectors of storage type T (bool kept as bytes: std::vector<bool> has no data()).
template <class T>
using Elem = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;
template <class T>
using Vec = std::vector<Elem<T>>;

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else if constexpr (std::is_integral_v<T>)
    return static_cast<T>(v);
  else
    return T(v);
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<float>(v);
  else
    return static_cast<double>(v);
}
// The value `v` rounded to the storage type, as a double.
template <class T>
double round_to(double v) {
  return to_double(from_double<T>(v));
}

/// A realized input leaf over a fresh 64-byte aligned buffer holding `data` at element `offset`.
template <class T>
NodePtr leaf_raw(const Vec<T>& data, Shape shape, Strides strides, std::int64_t offset = 0) {
  auto st = runtime::allocate_host(data.size() * sizeof(T));
  if (!data.empty()) std::memcpy(st->data, data.data(), data.size() * sizeof(T));
  return ir::input(ir::BufferView{st, offset, std::move(strides)}, std::move(shape), dtype_v<T>, kCpu);
}
/// A contiguous input leaf from doubles converted to T.
template <class T>
NodePtr leaf(const std::vector<double>& values, Shape shape) {
  Vec<T> data;
  for (double v : values) data.push_back(from_double<T>(v));
  Strides st = contiguous_strides(shape);
  return leaf_raw<T>(data, std::move(shape), std::move(st));
}
/// x through two negations: the same values, but an unrealized node, so index maps applied to
/// it stay graph nodes (on a realized leaf the builders make strided views instead).
NodePtr opaque(const NodePtr& x) { return ir::unary(Op::Neg, ir::unary(Op::Neg, x)); }

struct Run {
  std::vector<StoragePtr> outputs;
  std::uint64_t launches = 0;
  std::size_t primitives = 0;
};

/// Captures `roots`, runs the reference executor, returns the output buffers (written with
/// `strides[i]` when given, of `sizes[i]` elements).
Run run_graph(const std::vector<NodePtr>& roots, const std::vector<Strides>& strides = {},
              const std::vector<std::int64_t>& sizes = {}) {
  ir::Captured c = ir::capture(roots, kCpu);
  for (std::size_t i = 0; i < strides.size(); ++i) c.graph.output_strides[i] = strides[i];
  c.graph.rehash();
  c.graph.verify();
  backend::RunArgs args;
  for (auto& l : c.leaves)
    args.inputs.push_back(static_cast<const char*>(l->buffer->storage->data) + l->buffer->offset * itemsize(l->dtype));
  Run r;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    std::int64_t n = i < sizes.size() ? sizes[i] : roots[i]->shape.numel();
    r.outputs.push_back(runtime::allocate_host(static_cast<std::size_t>(n) * itemsize(roots[i]->dtype)));
    std::memset(r.outputs.back()->data, 0, static_cast<std::size_t>(n) * itemsize(roots[i]->dtype));
    args.outputs.push_back(r.outputs.back()->data);
  }
  for (auto& n : c.graph.nodes) r.primitives += n.op != Op::Input;
  std::uint64_t before = stats().launches;
  backend::run_reference(c.graph, args);
  r.launches = stats().launches - before;
  return r;
}

template <class T>
Vec<T> read(const StoragePtr& s, std::int64_t n) {
  Vec<T> v(static_cast<std::size_t>(n));
  if (n) std::memcpy(v.data(), s->data, static_cast<std::size_t>(n) * sizeof(T));
  return v;
}
template <class T>
Vec<T> run1(const NodePtr& root) {
  Run r = run_graph({root});
  CHECK(r.launches == r.primitives);
  return read<T>(r.outputs[0], root->shape.numel());
}
template <class T>
std::vector<double> run1d(const NodePtr& root) {
  std::vector<double> out;
  for (auto v : run1<T>(root)) out.push_back(to_double(static_cast<T>(v)));
  return out;
}

// torch.testing's default tolerances.
template <class T>
double rtol() {
  if constexpr (std::is_same_v<T, Half>)
    return 1e-3;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return 1.6e-2;
  else if constexpr (std::is_same_v<T, float>)
    return 1.3e-6;
  else
    return 1e-7;
}
template <class T>
double atol() {
  if constexpr (std::is_same_v<T, float>)
    return 1e-5;
  else if constexpr (std::is_same_v<T, double>)
    return 1e-7;
  else
    return 1e-5;
}
template <class T>
bool close(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= atol<T>() + rtol<T>() * std::fabs(want);
}

bool same_bits(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

}  // namespace

// ---- Philox ---------------------------------------------------------------------------------

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
  auto r = philox::philox4x32_10(0, 0, 0, 0, 0, 0);
  CHECK(r.r0 == 0x6627e8d5u);
  CHECK(r.r1 == 0xe169c58du);
  CHECK(r.r2 == 0xbc57ac4cu);
  CHECK(r.r3 == 0x9b00dbd8u);
  r = philox::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  CHECK(r.r0 == 0x408f276du);
  CHECK(r.r1 == 0x41c83b0eu);
  CHECK(r.r2 == 0xa20bc7c6u);
  CHECK(r.r3 == 0x6d5451fdu);
  r = philox::philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  CHECK(r.r0 == 0xd16cfe09u);
  CHECK(r.r1 == 0x94fdccebu);
  CHECK(r.r2 == 0x5001e420u);
  CHECK(r.r3 == 0x24126ea1u);

  // Key = seed (low, high), counter = index (low, high, 0, 0).
  const unsigned long long seed = 0x0123456789abcdefull, index = 0xfedcba9876543210ull;
  auto a = philox::philox_element(seed, index);
  auto b = philox::philox4x32_10(0x76543210u, 0xfedcba98u, 0, 0, 0x89abcdefu, 0x01234567u);
  CHECK(a.r0 == b.r0);
  CHECK(a.r3 == b.r3);
  CHECK(philox::uniform_f32(1, 0) != philox::uniform_f32(1 + (1ull << 32), 0));
  // float32 uniforms: four to a block, element 4m + w being word w of block m.
  const auto block = philox::philox_element(seed, 12345);
  const unsigned int words[4] = {block.r0, block.r1, block.r2, block.r3};
  for (unsigned w = 0; w < 4; ++w)
    CHECK(philox::uniform_f32(seed, 4 * 12345 + w) == static_cast<float>(words[w] >> 8) * 0x1p-24f);
}

TEST_CASE("philox source text carries the same definitions") {
  std::string src = philox::kPhiloxSource;
  CHECK(src.find("#define KILN_HOST_DEVICE __device__") != std::string::npos);
  CHECK(src.find("namespace kiln { namespace philox {") != std::string::npos);
  CHECK(src.find("KILN_HOST_DEVICE inline Result philox4x32_10(") != std::string::npos);
  CHECK(src.find("normal_f64") != std::string::npos);
  CHECK(src.find("std::") == std::string::npos);  // NVRTC has no standard library
}

TEST_CASE("random uniform: Philox counter = flat index (float32: four to a block), every floating dtype in [0, 1)") {
  const std::uint64_t seed = 0x5eed00000001ull;
  const std::int64_t n = 4099;
  auto raw = [&](std::int64_t i) {
    return philox::philox4x32_10(static_cast<unsigned>(i), 0, 0, 0, static_cast<unsigned>(seed),
                                 static_cast<unsigned>(seed >> 32));
  };
  auto f32 = run1<float>(ir::random({n}, seed, 0, DType::Float32, kCpu));
  auto f64 = run1<double>(ir::random({n}, seed, 0, DType::Float64, kCpu));
  auto h = run1<Half>(ir::random({n}, seed, 0, DType::Float16, kCpu));
  auto bf = run1<BFloat16>(ir::random({n}, seed, 0, DType::BFloat16, kCpu));
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    auto r = raw(i);
    const auto quad = raw(i / 4);
    const unsigned words[4] = {quad.r0, quad.r1, quad.r2, quad.r3};
    CHECK(f32[i] == static_cast<float>(std::ldexp(static_cast<double>(words[i % 4] >> 8), -24)));
    double want64 = std::ldexp(static_cast<double>((static_cast<std::uint64_t>(r.r0) << 21) ^ (r.r1 >> 11)), -53);
    CHECK(f64[i] == want64);
    CHECK(static_cast<float>(h[i]) == static_cast<float>(std::ldexp(static_cast<double>(r.r0 >> 21), -11)));
    CHECK(static_cast<float>(bf[i]) == static_cast<float>(std::ldexp(static_cast<double>(r.r0 >> 24), -8)));
    CHECK(f32[i] >= 0.0f);
    CHECK(f32[i] < 1.0f);
    CHECK(static_cast<float>(h[i]) < 1.0f);
    CHECK(static_cast<float>(bf[i]) < 1.0f);
    CHECK(f64[i] < 1.0);
    sum += f64[i];
  }
  CHECK(std::fabs(sum / n - 0.5) < 0.02);
  // Multi-dimensional: still the flat row-major index.
  auto m = run1<float>(ir::random({7, 9}, seed, 0, DType::Float32, kCpu));
  for (std::int64_t i = 0; i < 63; ++i) CHECK(m[i] == f32[i]);
}

TEST_CASE("random normal: Box-Muller on 1e5 samples") {
  const std::int64_t n = 100000;
  auto f64 = run1<double>(ir::random({n}, 42, 1, DType::Float64, kCpu));
  auto f32 = run1<float>(ir::random({n}, 42, 1, DType::Float32, kCpu));
  auto h = run1<Half>(ir::random({n}, 42, 1, DType::Float16, kCpu));
  double m = 0, m2 = 0, mf = 0, m2f = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    auto r = philox::philox4x32_10(static_cast<unsigned>(i), 0, 0, 0, 42, 0);
    double u1 = (r.r0 + 1.0) * std::ldexp(1.0, -32), u2 = r.r1 * std::ldexp(1.0, -32);
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925286766559 * u2);
    REQUIRE(std::fabs(f64[i] - z) <= 1e-12 * (1 + std::fabs(z)));
    REQUIRE(std::fabs(f32[i] - z) <= 2e-5 * (1 + std::fabs(z)));  // computed in float
    REQUIRE(static_cast<float>(h[i]) == static_cast<float>(Half(f32[i])));
    m += f64[i];
    m2 += f64[i] * f64[i];
    mf += f32[i];
    m2f += static_cast<double>(f32[i]) * f32[i];
  }
  m /= n;
  mf /= n;
  CHECK(std::fabs(m) < 0.02);
  CHECK(std::fabs(std::sqrt(m2 / n - m * m) - 1.0) < 0.02);
  CHECK(std::fabs(mf) < 0.02);
  CHECK(std::fabs(std::sqrt(m2f / n - mf * mf) - 1.0) < 0.02);
}

TEST_CASE("random of an integer dtype is a DTypeError") {
  CHECK_THROWS_AS(run_graph({ir::random({3}, 1, 0, DType::Int32, kCpu)}), DTypeError);
}

// ---- unary ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("unary math on floating dtypes against double", T, float, double, Half, BFloat16) {
  const std::vector<double> xs = {-2.5, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 2.5, 7.0, kInf, -kInf, kNaN};
  struct Case {
    Op op;
    double (*f)(double);
  };
  const Case cases[] = {
      {Op::Neg, [](double x) { return -x; }},
      {Op::Abs, [](double x) { return std::fabs(x); }},
      {Op::Exp, [](double x) { return std::exp(x); }},
      {Op::Exp2, [](double x) { return std::exp2(x); }},
      {Op::Log, [](double x) { return std::log(x); }},
      {Op::Log2, [](double x) { return std::log2(x); }},
      {Op::Log1p, [](double x) { return std::log1p(x); }},
      {Op::Expm1, [](double x) { return std::expm1(x); }},
      {Op::Sqrt, [](double x) { return std::sqrt(x); }},
      {Op::Rsqrt, [](double x) { return 1.0 / std::sqrt(x); }},
      {Op::Sin, [](double x) { return std::sin(x); }},
      {Op::Cos, [](double x) { return std::cos(x); }},
      {Op::Tan, [](double x) { return std::tan(x); }},
      {Op::Tanh, [](double x) { return std::tanh(x); }},
      {Op::Erf, [](double x) { return std::erf(x); }},
      {Op::Floor, [](double x) { return std::floor(x); }},
      {Op::Ceil, [](double x) { return std::ceil(x); }},
      {Op::Round, [](double x) { return std::nearbyint(x); }},
  };
  auto x = leaf<T>(xs, {static_cast<std::int64_t>(xs.size())});
  for (const Case& c : cases) {
    auto got = run1d<T>(ir::unary(c.op, x));
    for (std::size_t i = 0; i < xs.size(); ++i) {
      double want = round_to<T>(c.f(round_to<T>(xs[i])));
      INFO(ir::op_name(c.op), "(", xs[i], ") = ", got[i], ", want ", want);
      CHECK(close<T>(got[i], want));
      if (want == 0 || std::isinf(want)) CHECK(same_bits(got[i], want));  // signed zeros, Inf signs
    }
  }
}

TEST_CASE_TEMPLATE("unary special values", T, float, double, Half, BFloat16) {
  auto x = leaf<T>({0.0, -0.0, -1.0, 0.5, 1.5, 2.5, -0.5, -1.5, kNaN, kInf}, {10});
  auto rs = run1d<T>(ir::unary(Op::Rsqrt, x));
  CHECK(same_bits(rs[0], kInf));
  CHECK(same_bits(rs[1], -kInf));
  CHECK(std::isnan(rs[2]));
  CHECK(rs[9] == 0.0);
  auto sq = run1d<T>(ir::unary(Op::Sqrt, x));
  CHECK(same_bits(sq[1], -0.0));
  auto lg = run1d<T>(ir::unary(Op::Log, x));
  CHECK(same_bits(lg[0], -kInf));
  CHECK(std::isnan(lg[2]));
  auto rd = run1d<T>(ir::unary(Op::Round, x));  // halves to even
  CHECK(same_bits(rd[3], 0.0));
  CHECK(rd[4] == 2.0);
  CHECK(rd[5] == 2.0);
  CHECK(same_bits(rd[6], -0.0));
  CHECK(rd[7] == -2.0);
  auto ce = run1d<T>(ir::unary(Op::Ceil, x));
  CHECK(same_bits(ce[6], -0.0));
  auto ab = run1d<T>(ir::unary(Op::Abs, x));
  CHECK(same_bits(ab[1], 0.0));
  auto ng = run1d<T>(ir::unary(Op::Neg, x));
  CHECK(same_bits(ng[0], -0.0));
  auto isnan = run1<bool>(ir::unary(Op::IsNan, x));
  auto isinf = run1<bool>(ir::unary(Op::IsInf, x));
  auto isnot = run1<bool>(ir::unary(Op::Not, x));
  for (int i = 0; i < 10; ++i) {
    CHECK(isnan[i] == (i == 8));
    CHECK(isinf[i] == (i == 9));
    CHECK(isnot[i] == (i <= 1));  // NaN is not zero
  }
}

TEST_CASE_TEMPLATE("unary on integers wraps and rounding ops are identities", T, std::int32_t, std::int64_t) {
  const T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  Vec<T> data = {lo, -7, -1, 0, 5, hi};
  auto x = leaf_raw<T>(data, {6}, {1});
  auto neg = run1<T>(ir::unary(Op::Neg, x));
  auto abs = run1<T>(ir::unary(Op::Abs, x));
  CHECK(neg[0] == lo);
  CHECK(abs[0] == lo);
  CHECK(neg[5] == -hi);
  for (int i = 1; i < 6; ++i) {
    CHECK(neg[i] == -data[i]);
    CHECK(abs[i] == (data[i] < 0 ? -data[i] : data[i]));
  }
  for (Op op : {Op::Floor, Op::Ceil, Op::Round}) CHECK(run1<T>(ir::unary(op, x)) == data);
  auto nz = run1<bool>(ir::unary(Op::Not, x));
  auto nan = run1<bool>(ir::unary(Op::IsNan, x));
  auto inf = run1<bool>(ir::unary(Op::IsInf, x));
  for (int i = 0; i < 6; ++i) {
    CHECK(nz[i] == (data[i] == 0));
    CHECK(nan[i] == 0);
    CHECK(inf[i] == 0);
  }
  for (Op op : {Op::Exp, Op::Log, Op::Sqrt, Op::Sin, Op::Erf, Op::Rsqrt})
    CHECK_THROWS_AS(run_graph({ir::unary(op, x)}), DTypeError);
}

TEST_CASE("unary on bool: Not, IsNan, IsInf") {
  auto x = leaf_raw<bool>({0, 1, 1, 0}, {4}, {1});
  CHECK(run1<bool>(ir::unary(Op::Not, x)) == Vec<bool>{1, 0, 0, 1});
  CHECK(run1<bool>(ir::unary(Op::IsNan, x)) == Vec<bool>{0, 0, 0, 0});
  CHECK(run1<bool>(ir::unary(Op::Abs, x)) == Vec<bool>{0, 1, 1, 0});
}

// ---- cast -----------------------------------------------------------------------------------

TEST_CASE("cast: small integers survive every pair of dtypes") {
  const std::vector<double> vals = {0, 1, 3, 100, -2, 0, 1};
  for (int s = 0; s < kNumDTypes; ++s) {
    for (int d = 0; d < kNumDTypes; ++d) {
      DType sd = static_cast<DType>(s), dd = static_cast<DType>(d);
      visit_dtype(sd, [&](auto stag) {
        using S = decltype(stag);
        visit_dtype(dd, [&](auto dtag) {
          using D = decltype(dtag);
          auto got = run1d<D>(ir::cast(leaf<S>(vals, {7}), dd));
          for (std::size_t i = 0; i < vals.size(); ++i) {
            double src = round_to<S>(vals[i]);
            double want = std::is_same_v<D, bool> ? (src != 0) : src;
            INFO(dtype_name(sd), " -> ", dtype_name(dd), " of ", vals[i]);
            CHECK(got[i] == want);
          }
        });
      });
    }
  }
}

TEST_CASE("cast: float to int truncates; NaN and out of range give the minimum") {
  auto x = leaf<float>({2.7, -2.7, kNaN, 3e9, -3e9, kInf, -kInf, 2147483520.0, -0.9}, {9});
  auto i32 = run1<std::int32_t>(ir::cast(x, DType::Int32));
  const std::int32_t m32 = std::numeric_limits<std::int32_t>::min();
  CHECK(i32 == Vec<std::int32_t>{2, -2, m32, m32, m32, m32, m32, 2147483520, 0});
  auto i64 = run1<std::int64_t>(ir::cast(x, DType::Int64));
  const std::int64_t m64 = std::numeric_limits<std::int64_t>::min();
  CHECK(i64 == Vec<std::int64_t>{2, -2, m64, 3000000000ll, -3000000000ll, m64, m64, 2147483520ll, 0});

  auto d = leaf<double>({-2147483648.9, 2147483647.9, 2147483648.0, 1e19, -9223372036854775808.0, 9.2e18}, {6});
  auto d32 = run1<std::int32_t>(ir::cast(d, DType::Int32));
  CHECK(d32 == Vec<std::int32_t>{m32, 2147483647, m32, m32, m32, m32});
  auto d64 = run1<std::int64_t>(ir::cast(d, DType::Int64));
  CHECK(d64 == Vec<std::int64_t>{-2147483648ll, 2147483647ll, 2147483648ll, m64, m64, 9200000000000000000ll});

  auto h = leaf<Half>({-3.75, 1000.5, kNaN}, {3});
  CHECK(run1<std::int32_t>(ir::cast(h, DType::Int32)) == Vec<std::int32_t>{-3, 1000, m32});
}

TEST_CASE("cast: to and from bool, integer narrowing, float rounding") {
  auto x = leaf<float>({kNaN, -0.0, 0.0, 0.1, -kInf}, {5});
  CHECK(run1<bool>(ir::cast(x, DType::Bool)) == Vec<bool>{1, 0, 0, 1, 1});
  auto hb = leaf<BFloat16>({kNaN, -0.0, 2.0}, {3});
  CHECK(run1<bool>(ir::cast(hb, DType::Bool)) == Vec<bool>{1, 0, 1});
  auto b = leaf_raw<bool>({0, 1}, {2}, {1});
  CHECK(run1d<float>(ir::cast(b, DType::Float32)) == std::vector<double>{0, 1});
  CHECK(run1<std::int64_t>(ir::cast(b, DType::Int64)) == Vec<std::int64_t>{0, 1});

  auto w = leaf_raw<std::int64_t>({(1ll << 32) + 5, -1, 1ll << 31, (1ll << 24) + 1}, {4}, {1});
  CHECK(run1<std::int32_t>(ir::cast(w, DType::Int32)) ==
        Vec<std::int32_t>{5, -1, std::numeric_limits<std::int32_t>::min(), (1 << 24) + 1});
  auto wf = run1<float>(ir::cast(w, DType::Float32));
  CHECK(wf[3] == 16777216.0f);  // 2^24 + 1 rounds to even

  // f32 -> f16 / bf16: round to nearest even, overflow to Inf.
  auto f = leaf<float>({1 + std::ldexp(1, -11), 1 + 3 * std::ldexp(1, -11), 65519.0, 65520.0, 1 + std::ldexp(1, -8),
                        1 + 3 * std::ldexp(1, -8), 0.1},
                       {7});
  auto h = run1d<Half>(ir::cast(f, DType::Float16));
  CHECK(h[0] == 1.0);
  CHECK(h[1] == 1 + std::ldexp(1, -9));
  CHECK(h[2] == 65504.0);
  CHECK(h[3] == kInf);
  auto bf = run1d<BFloat16>(ir::cast(f, DType::BFloat16));
  CHECK(bf[4] == 1.0);
  CHECK(bf[5] == 1 + std::ldexp(1, -6));
  auto dd = leaf<double>({0.1}, {1});
  CHECK(run1<float>(ir::cast(dd, DType::Float32))[0] == 0.1f);
}

// ---- binary ---------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("binary arithmetic on floating dtypes against double", T, float, double, Half, BFloat16) {
  const std::vector<double> as = {1.5, -2.0, 0.0, -0.0, 3.0, kInf, kNaN, 2.0, -8.0, 0.25, 1.0, -kInf};
  const std::vector<double> bs = {2.0, 0.0, 0.0, 0.0, -0.0, kInf, 1.0, kNaN, 1.0 / 3, -3.0, -0.0, 2.0};
  auto a = leaf<T>(as, {12}), b = leaf<T>(bs, {12});
  struct Case {
    Op op;
    double (*f)(double, double);
  };
  const Case cases[] = {
      {Op::Add, [](double x, double y) { return x + y; }},
      {Op::Sub, [](double x, double y) { return x - y; }},
      {Op::Mul, [](double x, double y) { return x * y; }},
      {Op::Div, [](double x, double y) { return x / y; }},
      {Op::Pow, [](double x, double y) { return std::pow(x, y); }},
      {Op::Maximum, [](double x, double y) { return std::isnan(x) || std::isnan(y) ? kNaN : std::max(x, y); }},
      {Op::Minimum, [](double x, double y) { return std::isnan(x) || std::isnan(y) ? kNaN : std::min(x, y); }},
  };
  for (const Case& c : cases) {
    auto got = run1d<T>(ir::binary(c.op, a, b));
    for (std::size_t i = 0; i < as.size(); ++i) {
      double want = round_to<T>(c.f(round_to<T>(as[i]), round_to<T>(bs[i])));
      INFO(ir::op_name(c.op), "(", as[i], ", ", bs[i], ") = ", got[i], ", want ", want);
      CHECK(close<T>(got[i], want));
      if (c.op != Op::Maximum && c.op != Op::Minimum && (want == 0 || std::isinf(want))) CHECK(same_bits(got[i], want));
    }
  }
  // f16/bf16 round once: 1 + 2^-11 is a tie in f16 and 1 + 2^-8 in bf16 (computed exactly in f32).
  auto one = leaf<T>({1.0}, {1});
  auto eps = leaf<T>({std::is_same_v<T, BFloat16> ? std::ldexp(1, -8) : std::ldexp(1, -11)}, {1});
  double sum = run1d<T>(ir::binary(Op::Add, one, eps))[0];
  CHECK(sum == round_to<T>(1.0 + round_to<T>(std::is_same_v<T, BFloat16> ? std::ldexp(1, -8) : std::ldexp(1, -11))));
}

TEST_CASE_TEMPLATE("comparisons follow IEEE", T, float, double, Half, BFloat16, std::int32_t, std::int64_t) {
  const bool fl = is_floating(dtype_v<T>);
  std::vector<double> as = {1, 2, 3, -0.0, kNaN, kNaN, -kInf};
  std::vector<double> bs = {2, 2, 1, 0.0, 1, kNaN, -kInf};
  if (!fl) as = {1, 2, 3, -5, 7, 0, -1}, bs = {2, 2, 1, -5, 8, 0, 1};
  auto a = leaf<T>(as, {7}), b = leaf<T>(bs, {7});
  struct Case {
    Op op;
    bool (*f)(double, double);
  };
  const Case cases[] = {
      {Op::Eq, [](double x, double y) { return x == y; }}, {Op::Ne, [](double x, double y) { return x != y; }},
      {Op::Lt, [](double x, double y) { return x < y; }},  {Op::Le, [](double x, double y) { return x <= y; }},
      {Op::Gt, [](double x, double y) { return x > y; }},  {Op::Ge, [](double x, double y) { return x >= y; }}};
  for (const Case& c : cases) {
    auto got = run1<bool>(ir::binary(c.op, a, b));
    for (std::size_t i = 0; i < as.size(); ++i) {
      INFO(ir::op_name(c.op), "(", as[i], ", ", bs[i], ")");
      CHECK(static_cast<bool>(got[i]) == c.f(as[i], bs[i]));
    }
  }
}

TEST_CASE_TEMPLATE("integer arithmetic wraps, divides toward zero, x/0 = 0", T, std::int32_t, std::int64_t) {
  using U = std::make_unsigned_t<T>;
  const T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  Vec<T> as = {hi, lo, 7, -7, 7, 5, lo, 123456789, -3};
  Vec<T> bs = {1, 1, -2, 2, 0, 0, -1, 1000003, 5};
  auto a = leaf_raw<T>(as, {9}, {1}), b = leaf_raw<T>(bs, {9}, {1});
  auto add = run1<T>(ir::binary(Op::Add, a, b));
  auto sub = run1<T>(ir::binary(Op::Sub, a, b));
  auto mul = run1<T>(ir::binary(Op::Mul, a, b));
  auto div = run1<T>(ir::binary(Op::Div, a, b));
  auto mx = run1<T>(ir::binary(Op::Maximum, a, b));
  auto mn = run1<T>(ir::binary(Op::Minimum, a, b));
  for (int i = 0; i < 9; ++i) {
    CHECK(add[i] == static_cast<T>(static_cast<U>(as[i]) + static_cast<U>(bs[i])));
    CHECK(sub[i] == static_cast<T>(static_cast<U>(as[i]) - static_cast<U>(bs[i])));
    CHECK(mul[i] == static_cast<T>(static_cast<U>(as[i]) * static_cast<U>(bs[i])));
    CHECK(mx[i] == std::max(as[i], bs[i]));
    CHECK(mn[i] == std::min(as[i], bs[i]));
  }
  CHECK(add[0] == lo);
  CHECK(div == Vec<T>{hi, lo, -3, -3, 0, 0, lo, 123, 0});

  Vec<T> bases = {3, 2, 1, -1, -1, 0, 0, 3, -2, 5};
  Vec<T> exps = {4, -1, -3, -3, -2, 0, 5, 40, 3, 0};
  auto p = run1<T>(ir::binary(Op::Pow, leaf_raw<T>(bases, {10}, {1}), leaf_raw<T>(exps, {10}, {1})));
  U p340 = 1;
  for (int i = 0; i < 40; ++i) p340 = static_cast<U>(p340 * 3u);
  CHECK(p == Vec<T>{81, 0, 1, -1, 1, 1, 0, static_cast<T>(p340), -8, 1});
}

TEST_CASE("bool binary ops") {
  auto a = leaf_raw<bool>({0, 0, 1, 1}, {4}, {1}), b = leaf_raw<bool>({0, 1, 0, 1}, {4}, {1});
  CHECK(run1<bool>(ir::binary(Op::And, a, b)) == Vec<bool>{0, 0, 0, 1});
  CHECK(run1<bool>(ir::binary(Op::Or, a, b)) == Vec<bool>{0, 1, 1, 1});
  CHECK(run1<bool>(ir::binary(Op::Eq, a, b)) == Vec<bool>{1, 0, 0, 1});
  CHECK(run1<bool>(ir::binary(Op::Lt, a, b)) == Vec<bool>{0, 1, 0, 0});
  CHECK(run1<bool>(ir::binary(Op::Add, a, b)) == Vec<bool>{0, 1, 1, 1});  // as 0/1 integers, then != 0
  CHECK(run1<bool>(ir::binary(Op::Mul, a, b)) == Vec<bool>{0, 0, 0, 1});
  CHECK(run1<bool>(ir::binary(Op::Maximum, a, b)) == Vec<bool>{0, 1, 1, 1});
}

TEST_CASE("where with broadcast and transposed operands") {
  // cond [3, 1] broadcast along columns (stride 0), a transposed, b contiguous.
  auto cond = leaf_raw<bool>({1, 0, 1}, {3, 4}, {1, 0});
  Vec<float> at(12);
  for (int i = 0; i < 12; ++i) at[i] = static_cast<float>(i);
  auto a = leaf_raw<float>(at, {3, 4}, {1, 3});  // a[i][j] = j*3 + i
  auto b = leaf<float>(std::vector<double>(12, -1.0), {3, 4});
  auto got = run1<float>(ir::where(cond, a, b));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(got[i * 4 + j] == (i != 1 ? static_cast<float>(j * 3 + i) : -1.0f));
}

TEST_CASE("pointwise over broadcast, transposed and offset inputs, strided outputs") {
  // x: 3x4 view at offset 2 of a 4x5 buffer with row stride 5; y: a row broadcast down.
  Vec<double> buf(22);
  for (int i = 0; i < 22; ++i) buf[i] = i * 1.5;
  auto x = leaf_raw<double>(buf, {3, 4}, {5, 1}, 2);
  auto y = leaf_raw<double>({10, 20, 30, 40}, {3, 4}, {0, 1});
  auto z = ir::binary(Op::Mul, ir::binary(Op::Add, x, y), ir::permute(ir::permute(opaque(x), {1, 0}), {1, 0}));
  auto want = [&](int i, int j) {
    double xv = buf[2 + i * 5 + j];
    return (xv + 10.0 * (j + 1)) * xv;
  };
  // Column-major output, and a padded one (row stride 6).
  Run r = run_graph({z, z}, {{1, 3}, {6, 1}}, {12, 18});
  auto cm = read<double>(r.outputs[0], 12);
  auto pad = read<double>(r.outputs[1], 18);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      CHECK(cm[i + j * 3] == want(i, j));
      CHECK(pad[i * 6 + j] == want(i, j));
    }
  for (int j = 4; j < 6; ++j) CHECK(pad[j] == 0.0);  // padding untouched
}

// ---- reductions -----------------------------------------------------------------------------

namespace {

// Brute-force reduction of `x` (row-major values of `shape`) over `axes` in double, with the
// flat index within the reduced axes for argmax/argmin.
std::vector<double> reduce_ref(Op op, const std::vector<double>& x, const Shape& shape,
                               const std::vector<std::int64_t>& axes) {
  Shape out = shape;
  std::vector<bool> red(shape.size(), false);
  for (auto a : axes) red[a] = true, out[a] = 1;
  std::int64_t on = out.numel();
  std::vector<double> acc(on), best(on);
  std::vector<std::int64_t> idx(on, -1);
  for (std::int64_t o = 0; o < on; ++o)
    acc[o] = op == Op::ReduceSum ? 0 : op == Op::ReduceProd ? 1 : op == Op::ReduceMax ? -kInf : kInf;
  Strides ost = contiguous_strides(out);
  for (std::int64_t i = 0; i < shape.numel(); ++i) {
    std::int64_t rem = i, o = 0, k = 0, kmul = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      std::int64_t c = rem % shape[d];
      rem /= shape[d];
      if (red[d])
        k += c * kmul, kmul *= shape[d];
      else
        o += c * ost[d];
    }
    double v = x[i];
    switch (op) {
      case Op::ReduceSum:
        acc[o] += v;
        break;
      case Op::ReduceProd:
        acc[o] *= v;
        break;
      case Op::ReduceMax:
        acc[o] = std::isnan(acc[o]) || std::isnan(v) ? kNaN : std::max(acc[o], v);
        break;
      case Op::ReduceMin:
        acc[o] = std::isnan(acc[o]) || std::isnan(v) ? kNaN : std::min(acc[o], v);
        break;
      default: {
        // Elements of one output arrive in increasing k, so "strictly better" keeps the first.
        bool mx = op == Op::ArgMax;
        bool take = idx[o] < 0 || (!std::isnan(best[o]) && (std::isnan(v) || (mx ? v > best[o] : v < best[o])));
        if (take) best[o] = v, idx[o] = k;
      }
    }
  }
  if (op == Op::ArgMax || op == Op::ArgMin)
    for (std::int64_t o = 0; o < on; ++o) acc[o] = static_cast<double>(std::max<std::int64_t>(idx[o], 0));
  return acc;
}

template <class T>
void check_reduction(Op op, const NodePtr& x, const std::vector<double>& values,
                     const std::vector<std::int64_t>& axes) {
  auto r = ir::reduce(op, x, axes);
  std::vector<double> got = op == Op::ArgMax || op == Op::ArgMin ? run1d<std::int64_t>(r) : run1d<T>(r);
  auto want = reduce_ref(op, values, x->shape, axes);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(ir::op_name(op), " of ", x->shape.str(), " over ", axes.size(), " axes, output ", i, ": ", got[i], " vs ",
         want[i]);
    if (op == Op::ArgMax || op == Op::ArgMin)
      CHECK(got[i] == want[i]);
    else
      CHECK(close<T>(got[i], round_to<T>(want[i])));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("reductions over every axis subset of a 3-d tensor", T, float, double, Half, BFloat16, std::int32_t,
                   std::int64_t) {
  const Shape shape{3, 4, 5};
  std::vector<double> v(60);
  for (int i = 0; i < 60; ++i) v[i] = static_cast<double>((i * 37) % 11) - 4.0;  // ties galore
  for (int i = 0; i < 60; i += 7) v[i] = 1.0 + 0.25 * ((i / 7) % 3) * (is_floating(dtype_v<T>) ? 1 : 0);
  auto x = leaf<T>(v, shape);
  for (int mask = 0; mask < 8; ++mask) {
    std::vector<std::int64_t> axes;
    for (int d = 0; d < 3; ++d)
      if (mask & (1 << d)) axes.push_back(d);
    for (Op op : {Op::ReduceSum, Op::ReduceMax, Op::ReduceMin, Op::ArgMax, Op::ArgMin})
      check_reduction<T>(op, x, v, axes);
  }
  // Prod over a short axis (values stay exactly representable).
  check_reduction<T>(Op::ReduceProd, x, v, {0});
}

TEST_CASE_TEMPLATE("reductions of transposed and wide inputs (tiled and pairwise paths)", T, float, double,
                   std::int64_t) {
  // [37, 40] dense: axis 0 reduces across rows (outputs side by side); [3, 2100] axis 0 in
  // tiles of 1024 outputs plus a remainder; [300, 3] axis 0 is a strided run longer than one
  // pairwise block; then transposed views.
  for (Shape shape : {Shape{37, 40}, Shape{3, 2100}, Shape{300, 3}, Shape{2, 150, 3}}) {
    std::vector<double> v(static_cast<std::size_t>(shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7919) % 101) - 50.0;
    auto x = leaf<T>(v, shape);
    for (std::int64_t a = 0; a < shape.rank(); ++a)
      for (Op op : {Op::ReduceSum, Op::ReduceMax, Op::ArgMin}) check_reduction<T>(op, x, v, {a});
    check_reduction<T>(Op::ReduceSum, x, v, {0, shape.rank() - 1});
  }
  // A transposed leaf: element (i, j) lives at j * 37 + i.
  std::vector<double> buf(37 * 40);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<double>((i * 31) % 97);
  Vec<T> tb;
  for (double b : buf) tb.push_back(from_double<T>(b));
  auto xt = leaf_raw<T>(tb, {37, 40}, {1, 37});
  std::vector<double> logical(37 * 40);
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 40; ++j) logical[i * 40 + j] = buf[j * 37 + i];
  for (std::int64_t a : {0, 1})
    for (Op op : {Op::ReduceSum, Op::ReduceMin, Op::ArgMax}) check_reduction<T>(op, xt, logical, {a});
}

TEST_CASE("reductions: NaN propagates, argmax takes the first NaN, ties take the first") {
  auto x = leaf<float>({1, kNaN, 3, kNaN, 3}, {5});
  CHECK(std::isnan(run1<float>(ir::reduce(Op::ReduceMax, x, {0}))[0]));
  CHECK(std::isnan(run1<float>(ir::reduce(Op::ReduceMin, x, {0}))[0]));
  CHECK(std::isnan(run1<float>(ir::reduce(Op::ReduceSum, x, {0}))[0]));
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, x, {0}))[0] == 1);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMin, x, {0}))[0] == 1);
  auto t = leaf<double>({3, 1, 3, 1}, {4});
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, t, {0}))[0] == 0);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMin, t, {0}))[0] == 1);
  // NaN late in a long run (past the first pairwise block and in a tail partial).
  std::vector<double> longv(1000, 0.5);
  longv[997] = kNaN;
  longv[999] = kNaN;
  longv[10] = 9.0;
  auto l = leaf<float>(longv, {1000});
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, l, {0}))[0] == 997);
  CHECK(std::isnan(run1<float>(ir::reduce(Op::ReduceMax, l, {0}))[0]));
  // The extreme equal to the accumulators' start value, ties across the eight partials of a
  // block and across pairwise halves.
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, leaf<float>({-kInf, -kInf, -kInf}, {3}), {0}))[0] == 0);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMin, leaf<double>({kInf, kInf}, {2}), {0}))[0] == 0);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, leaf<float>({-kInf, -kInf, kNaN, kNaN}, {4}), {0}))[0] == 2);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMin, leaf<float>({kInf, 7, kInf, 7}, {4}), {0}))[0] == 1);
  const auto lo = std::numeric_limits<std::int32_t>::min();
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, leaf_raw<std::int32_t>({lo, lo, lo}, {3}, {1}), {0}))[0] == 0);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMin, leaf_raw<std::int32_t>({3, lo, 2, lo}, {4}, {1}), {0}))[0] == 1);
  std::vector<double> ties(1000, 1.0);
  ties[13] = ties[130] = ties[700] = 4.0;  // partials 5, 2 and 4; the last in the second half
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, leaf<double>(ties, {1000}), {0}))[0] == 13);
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMin, leaf<double>(ties, {1000}), {0}))[0] == 0);
  ties[13] = 1.0;
  CHECK(run1<std::int64_t>(ir::reduce(Op::ArgMax, leaf<double>(ties, {1000}), {0}))[0] == 130);
  // Signed zero: a sum of -0.0s is -0.0 only if the start value does not force +0; PyTorch's
  // sum starts at +0 too, so -0 + -0 + 0 = +0 either way.
  CHECK(!std::signbit(run1<float>(ir::reduce(Op::ReduceSum, leaf<float>({-0.0, 0.0}, {2}), {0}))[0]));
}

TEST_CASE("reductions over empty axes give the identities") {
  auto x = leaf<float>({}, {0, 3});
  CHECK(run1<float>(ir::reduce(Op::ReduceSum, x, {0})) == Vec<float>{0, 0, 0});
  CHECK(run1<float>(ir::reduce(Op::ReduceProd, x, {0})) == Vec<float>{1, 1, 1});
  CHECK(run1<float>(ir::reduce(Op::ReduceMax, x, {0}))[2] == -std::numeric_limits<float>::infinity());
  CHECK(run1<float>(ir::reduce(Op::ReduceMin, x, {0}))[0] == std::numeric_limits<float>::infinity());
  auto xi = leaf<std::int32_t>({}, {0, 2});
  CHECK(run1<std::int32_t>(ir::reduce(Op::ReduceMax, xi, {0}))[1] == std::numeric_limits<std::int32_t>::min());
  CHECK(run1<std::int32_t>(ir::reduce(Op::ReduceMin, xi, {0}))[1] == std::numeric_limits<std::int32_t>::max());
  CHECK(run1<float>(ir::reduce(Op::ReduceSum, x, {1})).empty());  // [0, 1]: nothing to write
  auto s = leaf_raw<std::int64_t>({std::numeric_limits<std::int64_t>::max(), 1}, {2}, {1});
  CHECK(run1<std::int64_t>(ir::reduce(Op::ReduceSum, s, {0}))[0] == std::numeric_limits<std::int64_t>::min());
}

TEST_CASE("sum accuracy: 4M f32 elements within 1e-7, 4M f64 pairwise") {
  const std::int64_t n = 1 << 22;
  const std::uint64_t seed = 2024;
  auto s = run1<float>(ir::reduce(Op::ReduceSum, ir::random({n}, seed, 0, DType::Float32, kCpu), {0}))[0];
  long double exact = 0;
  for (std::int64_t i = 0; i < n; ++i)
    exact += static_cast<long double>(philox::uniform_f32(seed, static_cast<unsigned long long>(i)));
  CHECK(std::fabs(static_cast<long double>(s) - exact) / exact <= 1e-7L);
  // 0.1 four million times: a plain double loop is off by ~1e-10 relative; pairwise by ~1e-15.
  auto d = run1<double>(ir::reduce(Op::ReduceSum, ir::constant(0.1, DType::Float64, {n}, kCpu), {0}))[0];
  long double exact_d = static_cast<long double>(0.1) * n;
  CHECK(std::fabs(static_cast<long double>(d) - exact_d) / exact_d <= 1e-14L);
  // Across rows of a dense buffer (the tiled path): 2^18 rows of 16.
  auto rows_in = leaf<double>(std::vector<double>(static_cast<std::size_t>(n), 0.1), {n / 16, 16});
  auto rows = run1<double>(ir::reduce(Op::ReduceSum, rows_in, {0}));
  REQUIRE(rows.size() == 16);
  for (double r : rows) CHECK(std::fabs(static_cast<long double>(r) - exact_d / 16) / (exact_d / 16) <= 1e-14L);
}

// ---- index maps -----------------------------------------------------------------------------

TEST_CASE("index maps: permute, broadcast, slice, reshape, concat") {
  std::vector<double> v(12);
  for (int i = 0; i < 12; ++i) v[i] = i;
  auto x = opaque(leaf<float>(v, {3, 4}));  // x[i][j] = 4i + j
  CHECK(x->op == Op::Neg);

  auto p = run1d<float>(ir::permute(x, {1, 0}));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(p[i * 3 + j] == 4 * j + i);

  auto col = opaque(leaf<float>({5, 6, 7}, {3, 1}));
  auto bc = run1d<float>(ir::broadcast(col, {3, 4}));
  for (int i = 0; i < 12; ++i) CHECK(bc[i] == 5 + i / 4);

  auto sl = ir::slice(x, 1, 1, 2, 2);  // columns 1, 3
  CHECK(sl->op == Op::Slice);
  auto s = run1d<float>(sl);
  CHECK(s == std::vector<double>{1, 3, 5, 7, 9, 11});
  auto rows = run1d<float>(ir::slice(x, 0, 1, 2, 1));
  CHECK(rows == std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11});

  // Reshape of a dense value is a view; of a transposed one, a copy in row-major order.
  auto r1 = run1d<float>(ir::reshape(x, {2, 6}));
  CHECK(r1 == v);
  auto r2 = run1d<float>(ir::reshape(ir::permute(x, {1, 0}), {2, 6}));
  CHECK(r2 == p);
  auto r3 = run1d<float>(ir::reshape(ir::slice(x, 1, 1, 2, 2), {6}));
  CHECK(r3 == s);

  auto a = opaque(leaf<float>({100, 101, 102, 103}, {1, 4}));
  auto e = opaque(leaf<float>({}, {0, 4}));
  auto cat0 = run1d<float>(ir::concat({a, e, x}, 0));
  REQUIRE(cat0.size() == 16);
  for (int i = 0; i < 4; ++i) CHECK(cat0[i] == 100 + i);
  for (int i = 0; i < 12; ++i) CHECK(cat0[4 + i] == i);
  auto cat1 =
      run1d<float>(ir::concat({x, ir::permute(opaque(leaf<float>({-1, -2, -3, -4, -5, -6}, {2, 3})), {1, 0})}, 1));
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) CHECK(cat1[i * 6 + j] == 4 * i + j);
    CHECK(cat1[i * 6 + 4] == -1 - i);
    CHECK(cat1[i * 6 + 5] == -4 - i);
  }
  // A chain of views then arithmetic.
  auto chain = ir::binary(Op::Add, ir::permute(ir::slice(ir::broadcast(col, {3, 4}), 1, 0, 2, 2), {1, 0}),
                          ir::constant(0.5, DType::Float32, {2, 3}, kCpu));
  CHECK(run1d<float>(chain) == std::vector<double>{5.5, 6.5, 7.5, 5.5, 6.5, 7.5});
}

// ---- leaves ---------------------------------------------------------------------------------

TEST_CASE("constants and iota of every dtype") {
  CHECK(run1d<float>(ir::constant(0.1, DType::Float32, {2, 2}, kCpu)) ==
        std::vector<double>(4, static_cast<float>(0.1)));
  CHECK(run1d<Half>(ir::constant(-2.5, DType::Float16, {3}, kCpu)) == std::vector<double>(3, -2.5));
  CHECK(run1d<BFloat16>(ir::constant(kInf, DType::BFloat16, {1}, kCpu))[0] == kInf);
  CHECK(std::isnan(run1d<double>(ir::constant(kNaN, DType::Float64, {}, kCpu))[0]));
  const std::int64_t big = (1ll << 60) + 1;
  CHECK(run1<std::int64_t>(ir::constant_int(big, DType::Int64, {2}, kCpu)) == Vec<std::int64_t>{big, big});
  CHECK(run1<std::int32_t>(ir::constant_int(-7, DType::Int32, {2}, kCpu)) == Vec<std::int32_t>{-7, -7});
  CHECK(run1<bool>(ir::constant(3.0, DType::Bool, {2}, kCpu)) == Vec<bool>{1, 1});

  CHECK(run1d<Half>(ir::iota({2, 3}, 1, DType::Float16, kCpu)) == std::vector<double>{0, 1, 2, 0, 1, 2});
  CHECK(run1<std::int64_t>(ir::iota({3, 2}, 0, DType::Int64, kCpu)) == Vec<std::int64_t>{0, 0, 1, 1, 2, 2});
  CHECK(run1<bool>(ir::iota({3}, 0, DType::Bool, kCpu)) == Vec<bool>{0, 1, 1});
  // Iota and constants through arithmetic (zero-stride values in binary ops).
  auto flat = ir::binary(
      Op::Add,
      ir::binary(Op::Mul, ir::iota({3, 4}, 0, DType::Int32, kCpu), ir::constant_int(4, DType::Int32, {3, 4}, kCpu)),
      ir::iota({3, 4}, 1, DType::Int32, kCpu));
  auto f = run1<std::int32_t>(flat);
  for (int i = 0; i < 12; ++i) CHECK(f[i] == i);
}

// ---- whole graphs ---------------------------------------------------------------------------

TEST_CASE("size-0 shapes run without work") {
  auto x = leaf<float>({}, {0, 5});
  auto e = ir::unary(Op::Exp, x);
  auto s = ir::reduce(Op::ReduceSum, e, {1});
  auto b = ir::broadcast(opaque(leaf<float>({}, {1, 0})), {3, 0});
  auto rnd = ir::random({0}, 1, 1, DType::Float32, kCpu);
  auto am = ir::reduce(Op::ArgMax, x, {0});
  Run r = run_graph({e, s, b, rnd, am});
  CHECK(r.launches == r.primitives);
  CHECK(r.primitives == 7);
  CHECK(read<std::int64_t>(r.outputs[4], 5) == Vec<std::int64_t>(5, 0));
}

TEST_CASE("one launch per primitive; shared nodes and several outputs") {
  auto x = leaf<double>({1, 2, 3, 4}, {2, 2});
  auto y = ir::unary(Op::Exp, x);
  auto z = ir::binary(Op::Add, y, y);
  auto m = ir::reduce(Op::ReduceMax, z, {1});
  Run r = run_graph({z, m, x});
  CHECK(r.primitives == 3);
  CHECK(r.launches == 3);
  auto zv = read<double>(r.outputs[0], 4);
  auto mv = read<double>(r.outputs[1], 2);
  auto xv = read<double>(r.outputs[2], 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(zv[i] == 2 * std::exp(i + 1.0));
    CHECK(xv[i] == i + 1.0);
  }
  CHECK(mv == Vec<double>{2 * std::exp(2.0), 2 * std::exp(4.0)});
}

TEST_CASE("outputs computed in place with any strides: random, concat, reductions") {
  auto rnd = ir::random({3, 4}, 9, 0, DType::Float32, kCpu);
  auto cat = ir::concat({opaque(leaf<float>({1, 2, 3, 4}, {2, 2})), opaque(leaf<float>({5, 6}, {2, 1}))}, 1);
  auto sum = ir::reduce(Op::ReduceSum, leaf<float>({1, 2, 3, 4, 5, 6}, {2, 3}), {1});
  auto empty = ir::reduce(Op::ReduceMax, leaf<float>({}, {3, 0}), {1});
  Run r = run_graph({rnd, cat, sum, empty}, {{1, 3}, {1, 2}, {2, 1}, {1, 1}}, {12, 6, 4, 3});
  auto flat = run1<float>(ir::random({3, 4}, 9, 0, DType::Float32, kCpu));
  auto cm = read<float>(r.outputs[0], 12);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(cm[i + 3 * j] == flat[i * 4 + j]);  // counter = logical index
  CHECK(read<float>(r.outputs[1], 6) == Vec<float>{1, 3, 2, 4, 5, 6});
  auto sv = read<float>(r.outputs[2], 4);
  CHECK(sv[0] == 6.0f);
  CHECK(sv[2] == 15.0f);
  CHECK(read<float>(r.outputs[3], 3) == Vec<float>(3, -std::numeric_limits<float>::infinity()));
}

TEST_CASE("an output overlapping a leaf it reads is computed before it is written") {
  Vec<float> data(16);
  for (int i = 0; i < 16; ++i) data[i] = static_cast<float>(i);
  auto x = leaf_raw<float>(data, {4, 4}, {1, 4});  // the transpose of the buffer
  auto y = ir::binary(Op::Add, x, ir::constant(0.5, DType::Float32, {4, 4}, kCpu));
  ir::Captured c = ir::capture({y}, kCpu);
  backend::RunArgs args;
  void* buf = x->buffer->storage->data;
  args.inputs.push_back(buf);
  args.outputs.push_back(buf);
  backend::run_reference(c.graph, args);
  const float* out = static_cast<const float*>(buf);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) CHECK(out[i * 4 + j] == static_cast<float>(j * 4 + i) + 0.5f);
}

TEST_CASE("an output overlapping an input it reads is written correctly (in-place transpose)") {
  Vec<float> data(16);
  for (int i = 0; i < 16; ++i) data[i] = static_cast<float>(i);
  auto x = leaf_raw<float>(data, {4, 4}, {1, 4});  // the transpose of the buffer
  ir::Captured c = ir::capture({x}, kCpu);
  backend::RunArgs args;
  void* buf = x->buffer->storage->data;
  args.inputs.push_back(buf);
  args.outputs.push_back(buf);
  backend::run_reference(c.graph, args);
  const float* out = static_cast<const float*>(buf);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) CHECK(out[i * 4 + j] == static_cast<float>(j * 4 + i));
}

TEST_CASE("graphs on a CUDA device are refused") {
  auto x = leaf<float>({1}, {1});
  ir::Captured c = ir::capture({ir::unary(Op::Exp, x)}, Device::cuda());
  backend::RunArgs args;
  float out = 0;
  args.inputs.push_back(x->buffer->storage->data);
  args.outputs.push_back(&out);
  CHECK_THROWS_AS(backend::run_reference(c.graph, args), DeviceError);
}

}  // namespace kiln_test_backend_reference
