// What a new user reaches for first: expressions that read like tensors, printing, the
// creation helpers (*_like, empty, clone, split, chunk), counters that say whether a cache was
// hit, and a warning for a misspelt KILN_LOGS channel.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "../support/reference.hpp"
#include "kiln/core/generated.hpp"

namespace kiln_test_tensor_usability {

using namespace kiln;
namespace kt = kiln::testing;

TEST_CASE("a typed expression has the read side of the Tensor API") {
  Tensor x = kt::make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float32);
  auto e = x * 2.0f + 1.0f;  // a typed expression, not a Tensor
  static_assert(!std::is_same_v<decltype(e), Tensor>);
  CHECK(e.shape() == Shape{2, 3});
  CHECK(e.dim() == 2);
  CHECK(e.numel() == 6);
  CHECK(e.size(-1) == 3);
  CHECK(e.dtype() == DType::Float32);
  CHECK(e.device() == kt::device());
  CHECK(e.to_vector<float>() == std::vector<float>{3, 5, 7, 9, 11, 13});
  CHECK(exp(x - x).to_vector<double>() == std::vector<double>(6, 1.0));
  CHECK(relu(x - 3.0f).shape() == Shape{2, 3});
  Tensor i = kt::make_int_tensor({7}, {1}), j = kt::make_int_tensor({2}, {1});
  CHECK((i / j).item<float>() == 3.5f);
  Tensor ev = e.eval();
  CHECK(ev.is_evaluated());
  KILN_CHECK_CLOSE(ev, std::vector<double>{3, 5, 7, 9, 11, 13});
  CHECK(e.to(DType::Int32).dtype() == DType::Int32);
  CHECK(e.to(DType::Int64).to_vector<std::int64_t>() == std::vector<std::int64_t>{3, 5, 7, 9, 11, 13});
  CHECK(e.to(Device::cpu()).to_vector<float>()[5] == 13.0f);
  CHECK(e.to(Device::cpu()).device() == Device::cpu());
  CHECK_THROWS_AS((void)e.item<float>(), ShapeError);
}

TEST_CASE("printing: values, dtype, shape and device, the middle of large tensors elided") {
  const std::string dev = "device=" + kt::device().str() + ")";
  auto on = [&](std::string text) {  // the expected text with the device under test
    const std::string cpu = "device=cpu)";
    for (std::size_t at = 0; (at = text.find(cpu, at)) != std::string::npos; at += dev.size())
      text.replace(at, cpu.size(), dev);
    return text;
  };
  Tensor x = kt::make_tensor({1, 2.5, -3, 4}, {2, 2}, DType::Float32);
  CHECK(x.str() ==
        on("tensor([[ 1.0000,  2.5000],\n        [-3.0000,  4.0000]], dtype=float32, shape=[2, 2], device=cpu)"));
  std::ostringstream os;
  os << x;
  CHECK(os.str() == x.str());
  std::ostringstream es;
  es << x * 2.0f;  // an expression prints its value
  CHECK(es.str() == on("tensor([[ 2.,  5.],\n        [-6.,  8.]], dtype=float32, shape=[2, 2], device=cpu)"));
  CHECK(kt::make_int_tensor({3, -12}, {2}).str() == on("tensor([  3, -12], dtype=int64, shape=[2], device=cpu)"));
  CHECK((x > 2.0f).str() ==
        on("tensor([[False,  True],\n        [False,  True]], dtype=bool, shape=[2, 2], device=cpu)"));
  CHECK(full({}, 0.5, DType::Float32, kt::device()).str() == on("tensor(0.5000, dtype=float32, shape=[], device=cpu)"));
  CHECK(zeros({0, 3}, DType::Float32, kt::device()).str() == on("tensor([], dtype=float32, shape=[0, 3], device=cpu)"));
  CHECK(kt::make_tensor({NAN, INFINITY, 1.5}, {3}, DType::Float64).str() ==
        on("tensor([   nan,    inf, 1.5000], dtype=float64, shape=[3], device=cpu)"));
  CHECK(kt::make_tensor({1e-6, 1}, {2}, DType::Float32).str().find("1.0000e-06") != std::string::npos);
  // More than 1000 elements: three at each end of every dimension.
  std::string big = arange(2000, DType::Int64, kt::device()).str();
  CHECK(big == on("tensor([   0,    1,    2, ..., 1997, 1998, 1999], dtype=int64, shape=[2000], device=cpu)"));
  std::string big2 = reshape(arange(40 * 50, DType::Int64, kt::device()), {40, 50}).str();
  CHECK(big2.find("[   0,    1,    2, ...,   47,   48,   49],") != std::string::npos);
  CHECK(big2.find("\n        ...,\n") != std::string::npos);
  CHECK(big2.find("[1950, 1951, 1952, ..., 1997, 1998, 1999]]") != std::string::npos);
}

TEST_CASE("creation helpers: full_like, zeros_like, ones_like, empty, empty_like, clone, split, chunk") {
  Tensor x = kt::make_tensor({1, -0.0, 3, 4, 5, 6}, {2, 3}, DType::Float16);
  Tensor z = zeros_like(x), o = ones_like(x, DType::Int32), f = full_like(x * 2.0f, 7.5);
  CHECK(z.shape() == x.shape());
  CHECK(z.dtype() == DType::Float16);
  KILN_CHECK_CLOSE(z, std::vector<double>(6, 0.0));
  CHECK(o.dtype() == DType::Int32);
  CHECK(o.to_vector<int>() == std::vector<int>(6, 1));
  KILN_CHECK_CLOSE(f, std::vector<double>(6, 7.5));
  Tensor e = empty({3, 2}, DType::Int64);
  CHECK(e.is_evaluated());
  CHECK(e.shape() == Shape{3, 2});
  e.assign(reshape(arange(6), {3, 2}));
  CHECK(e.to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(empty_like(x).dtype() == DType::Float16);
  CHECK_THROWS_AS(empty({-1}), ShapeError);

  // A clone keeps its values when the original is written; -0.0 stays -0.0.
  Tensor src = kt::make_tensor({-0.0, 2, NAN}, {3}, DType::Float32);
  src.eval();
  Tensor c = clone(src);
  src.assign(5.0f);
  std::vector<float> cv = c.to_vector<float>();
  CHECK(std::signbit(cv[0]));
  CHECK(cv[1] == 2.0f);
  CHECK(std::isnan(cv[2]));
  CHECK(src.to_vector<float>() == std::vector<float>(3, 5.0f));
  CHECK(clone(kt::make_tensor({1, 0}, {2}, DType::Bool)).to_vector<bool>() == std::vector<bool>{true, false});

  // clone and contiguous() are differentiable, also of an evaluated leaf (copied now); contiguous()
  // of a transposed view is a row-major copy, of a row-major tensor the tensor itself.
  {
    Tensor w = kt::make_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float32).eval().requires_grad_();
    Tensor wc = clone(w);
    CHECK(wc.is_evaluated());
    CHECK(wc.requires_grad());
    Tensor wt = transpose(w, 0, 1);
    Tensor tc = wt.contiguous();
    CHECK(tc.shape() == Shape{3, 2});
    CHECK(tc.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
    std::vector<Tensor> g = autograd::grad({sum(wc * 2.0f) + sum(tc * kt::make_tensor({1, 2, 3, 4, 5, 6}, {3, 2}, DType::Float32))}, {w});
    CHECK(g[0].to_vector<float>() == std::vector<float>{3, 5, 7, 4, 6, 8});
    Tensor plain = kt::make_tensor({1, 2}, {2}, DType::Float32).eval();
    CHECK(plain.contiguous().node() == plain.node());
  }

  Tensor r = reshape(arange(10), {2, 5});
  std::vector<Tensor> parts = split(r, 2, 1);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].to_vector<std::int64_t>() == std::vector<std::int64_t>{0, 1, 5, 6});
  CHECK(parts[2].shape() == Shape{2, 1});
  CHECK(parts[2].to_vector<std::int64_t>() == std::vector<std::int64_t>{4, 9});
  std::vector<Tensor> sized = split(r, std::vector<std::int64_t>{1, 4}, -1);
  REQUIRE(sized.size() == 2);
  CHECK(sized[1].to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2, 3, 4, 6, 7, 8, 9});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, split(r, std::vector<std::int64_t>{1, 3}, 1), "split", "add up to 4",
                               "int64[2, 5]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, split(r, 0, 1), "split", "positive");
  std::vector<Tensor> ch = chunk(arange(5), 3);  // ceil(5 / 3) = 2 per piece
  REQUIRE(ch.size() == 3);
  CHECK(ch[2].to_vector<std::int64_t>() == std::vector<std::int64_t>{4});
  CHECK(chunk(arange(6), 4).size() == 3);  // ceil(6 / 4) = 2: three pieces, as torch.chunk
  CHECK(chunk(zeros({0}), 3).size() == 3);
  KILN_CHECK_THROWS_MENTIONING(ShapeError, chunk(r, 0), "chunk", "positive");
}

// A user's own names beside `using namespace kiln;`: kiln's internal tags (the expression
// types' function enum) live in kiln::detail, so these are not ambiguous (this file would not
// compile otherwise).
struct Fn {
  int arity = 2;
};
enum class Tier { Low, High };

TEST_CASE("a user's Fn and Tier next to using namespace kiln") {
  Fn f;
  CHECK(f.arity == 2);
  CHECK(Tier::High != Tier::Low);
  CHECK((exp(kt::make_tensor({0}, {1}, DType::Float32)) * 2.0f).item<float>() == 2.0f);
}

TEST_CASE("arange(start, end, step) as torch.arange: count, values, dtype, errors") {
  const Device dev = kt::device();
  Tensor a = arange(10, 0, -3, DType::Int64, dev);
  CHECK(a.dtype() == DType::Int64);
  CHECK(a.to_vector<std::int64_t>() == std::vector<std::int64_t>{10, 7, 4, 1});
  CHECK(arange(2, 5).to_vector<std::int64_t>() == std::vector<std::int64_t>{2, 3, 4});
  Tensor f = arange(0, 1, 0.1);  // a float bound or step: the default float dtype
  CHECK(f.dtype() == DType::Float32);
  REQUIRE(f.numel() == 10);
  std::vector<float> fv = f.to_vector<float>();
  for (int i = 0; i < 10; ++i)
    CHECK(fv[static_cast<std::size_t>(i)] == static_cast<float>(i * 0.1));  // start + i * step in double, then cast
  CHECK(arange(1, 2.5, 0.5, DType::Float64, dev).to_vector<double>() == std::vector<double>{1, 1.5, 2});
  CHECK(arange(0.5, 3, 1, DType::Int32, dev).to_vector<int>() == std::vector<int>{0, 1, 2});  // 0.5, 1.5, 2.5 truncated
  CHECK(arange(3, 3).numel() == 0);
  KILN_CHECK_THROWS_MENTIONING(ValueError, arange(0, 5, 0), "arange", "step", "nonzero");
  KILN_CHECK_THROWS_MENTIONING(ValueError, arange(0, 5, -1), "arange", "sign", "end 5");
  KILN_CHECK_THROWS_MENTIONING(ValueError, arange(0.0, INFINITY, 1), "arange", "finite");
}

TEST_CASE("stats: re-evaluating a compiled structure counts a plan hit, not a kernel lookup") {
  Tensor a = kt::make_tensor({1, 2, 3}, {3}, DType::Float32, Device::cpu()),
         b = kt::make_tensor({4, 5, 6}, {3}, DType::Float32, Device::cpu());
  Tensor first = a * b + 0.25f;
  first.eval();  // the plan of this structure now exists
  reset_stats();
  Tensor again = a * b + 0.25f;
  again.eval();
  Stats s = stats();
  CHECK(s.graphs == 1);
  CHECK(s.compiles == 0);
  if (get_backend() != Backend::Eager && backend::entry::cpu_uses_jit(backend::Mode::Auto)) {
    CHECK(s.plan_hits == 1);
    CHECK(s.memory_hits == 0);  // the whole plan was reused: no kernel was looked up
  }
  reset_stats();
  CHECK(stats().plan_hits == 0);
}

TEST_CASE("KILN_LOGS: a misspelt channel is a warning that lists the valid ones") {
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture);
  std::fflush(stderr);
  int saved = ::dup(2);
  ::dup2(::fileno(capture), 2);
  unsigned mask = detail::parse_log_channels("schedule, scheduel,cache");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::rewind(capture);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), capture));
  std::fclose(capture);
  CHECK(mask == (unsigned(LogChannel::schedule) | unsigned(LogChannel::cache)));
  CHECK(text.find("unknown channel 'scheduel'") != std::string::npos);
  CHECK(text.find("graph_breaks") != std::string::npos);
  CHECK(text.find("graph,") != std::string::npos);  // the graph channel is listed
  CHECK(detail::parse_log_channels("all") == ~0u);
}

TEST_CASE("numbers are kernel arguments: a learning-rate schedule compiles once") {
  if (get_backend() == Backend::Eager || !backend::entry::cpu_uses_jit(backend::Mode::Auto)) return;
  // A CPU feature (CUDA graphs keep numbers literal): tensors on the CPU whatever the device under test.
  Tensor w = kt::make_tensor({1, 2, 3, 4}, {4}, DType::Float32, Device::cpu());
  Tensor g = kt::make_tensor({0.5, -1, 2, 8}, {4}, DType::Float32, Device::cpu());
  auto reference = [&](float lr) {
    std::vector<float> out(4), wv = w.to_vector<float>(), gv = g.to_vector<float>();
    for (int i = 0; i < 4; ++i) out[i] = wv[i] - lr * gv[i];
    return out;
  };
  // A structure no other test uses, so that its first compile is counted here.
  auto step = [&](float lr) { return (w - lr * g) * 0.375f + 2.625f; };
  auto expect = [&](float lr) {
    std::vector<float> r = reference(lr);
    for (auto& v : r) v = v * 0.375f + 2.625f;
    return r;
  };
  reset_stats();
  for (int i = 0; i < 10; ++i) {
    const float lr = 0.013f * static_cast<float>(i + 2);
    CHECK(Tensor(step(lr)).to_vector<float>() == expect(lr));
  }
  CHECK(stats().compiles <= 1);  // 0 when the disk cache already had it
  CHECK(stats().compiles + stats().disk_hits + stats().memory_hits <= 1);
  // The typed assign path: one guard entry for every value.
  Tensor out = zeros({4});
  out.eval();
  out.assign(step(0.5f));
  reset_stats();
  for (int i = 0; i < 10; ++i) {
    const float lr = 0.021f * static_cast<float>(i + 3);
    out.assign(step(lr));
    CHECK(out.to_vector<float>() == expect(lr));
  }
  CHECK(stats().compiles == 0);
  // Numbers keep their dtype's rounding: 1.7 in float16 is 1.7001953125.
  Tensor h = kt::make_tensor({1, 2}, {2}, DType::Float16, Device::cpu());
  KILN_CHECK_CLOSE(h * 1.7f, std::vector<double>{1.7001953125, 3.400390625}, kt::Tolerance{0, 0});
  CHECK((kt::make_int_tensor({1, 2}, {2}, DType::Int32, Device::cpu()) * 7).to_vector<int>() ==
        std::vector<int>{7, 14});
  // A fill with a new number each time reuses the fill kernel.
  out.assign(3.5f);
  reset_stats();
  for (int i = 0; i < 5; ++i) {
    out.assign(0.25f * static_cast<float>(i) + 10.0f);
    CHECK(out.to_vector<float>() == std::vector<float>(4, 0.25f * static_cast<float>(i) + 10.0f));
  }
  CHECK(stats().compiles == 0);
  // Values that change the code stay literals and still compute right: pow's exponent, 0, 1, -1.
  KILN_CHECK_CLOSE(pow(w, 2.0f), std::vector<double>{1, 4, 9, 16});
  KILN_CHECK_CLOSE(pow(w, 0.5f), std::vector<double>{1, std::sqrt(2.0), std::sqrt(3.0), 2});
  KILN_CHECK_CLOSE(w * -1.0f + 0.0f, std::vector<double>{-1, -2, -3, -4});
}

TEST_CASE("lazy evaluation at a second leading size compiles the symbolic-size kernels once") {
  if (get_backend() == Backend::Eager || !backend::entry::cpu_uses_jit(backend::Mode::Auto)) return;
  kiln::reset();  // no structure met before
  std::vector<std::uint64_t> compiles;
  for (std::int64_t rows : {5, 9, 12, 17, 3, 40}) {
    std::vector<float> host(static_cast<std::size_t>(rows * 7));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 37) % 11) * 0.25f - 1.0f;
    Tensor x = from_vector(host, {rows, 7});
    reset_stats();
    Tensor y = log_softmax(x * 1.5f, -1) + 0.125f;
    std::vector<float> got = y.to_vector<float>();
    compiles.push_back(stats().compiles + stats().disk_hits);
    // Against a float64 evaluation of the same rows.
    for (std::int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, s = 0;
      for (int c = 0; c < 7; ++c) m = std::max(m, 1.5 * host[static_cast<std::size_t>(r * 7 + c)]);
      for (int c = 0; c < 7; ++c) s += std::exp(1.5 * host[static_cast<std::size_t>(r * 7 + c)] - m);
      for (int c = 0; c < 7; ++c) {
        double want = 1.5 * host[static_cast<std::size_t>(r * 7 + c)] - m - std::log(s) + 0.125;
        CHECK(std::fabs(got[static_cast<std::size_t>(r * 7 + c)] - want) < 1e-5);
      }
    }
  }
  // The first size compiles for itself, the second the symbolic kernels; the rest reuse them.
  CHECK(compiles[0] == 1);
  CHECK(compiles[1] == 1);
  for (std::size_t i = 2; i < compiles.size(); ++i) CHECK_MESSAGE(compiles[i] == 0, "size #" << i);
}

TEST_CASE("KILN_LOGS=output_code: the kernels without the prelude, the whole source kept in the cache directory") {
  if (get_backend() == Backend::Eager || !backend::entry::cpu_uses_jit(backend::Mode::Auto)) return;
  kiln::reset();  // the module below must be built (or loaded from disk) in this process
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture);
  set_log_output(capture);
  set_logs("output_code");
  Tensor x = kt::make_tensor({0.5, 1.5, -2}, {3}, DType::Float32, Device::cpu());  // a CPU module's log
  float total = sum(tanh(x) * 0.625f + erf(x)).item<float>();
  set_logs("");
  set_log_output(nullptr);
  std::rewind(capture);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, capture)) > 0;) text.append(buf, n);
  std::fclose(capture);
  CHECK(std::isfinite(total));
  REQUIRE(text.find("[kiln:output_code] cpu module") != std::string::npos);
  CHECK(text.find("prelude of") != std::string::npos);
  CHECK(text.find("_body(void* const* args") != std::string::npos);            // the kernel is shown
  CHECK(text.find("kiln_tanh_f32(") != std::string::npos);                     // called by the kernel
  CHECK(text.find("static inline float kiln_tanh_f32") == std::string::npos);  // not the prelude's definition
  // The named source outlives the process (under the cache directory) and holds everything.
  const std::size_t at = text.find("(source: ") + 9;
  const std::string path = text.substr(at, text.find(';', at) - at);
  CHECK(path.find("/sources/kiln_") != std::string::npos);
  std::FILE* kept = std::fopen(path.c_str(), "r");
  REQUIRE_MESSAGE(kept, path);
  std::string source;
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, kept)) > 0;) source.append(buf, n);
  std::fclose(kept);
  CHECK(source.find("kiln_tanh_f32") != std::string::npos);
  CHECK(source.find(kiln::detail::kKernelsBeginMarker) != std::string::npos);
}

TEST_CASE("assigning into an empty view with zero strides is a no-op, not a shared-memory error") {
  // Found by the fuzzer on the H200 run: a [2, 0] destination over one element with strides
  // {0, 1} was refused as a broadcast view although it has no element to share.
  bool backing[1] = {true};
  Tensor dst = from_blob(backing, {2, 0}, Device::cpu(), {0, 1});
  Tensor v = slice(full({2, 1}, NAN, DType::Float32), 1, 2, -2, 1);  // float32[2, 0]
  CHECK_NOTHROW(dst.assign(v));
  CHECK(backing[0]);
  CHECK_THROWS_AS(from_blob(backing, {2, 1}, Device::cpu(), {0, 1}).assign(ones({2, 1})),
                  ShapeError);  // 2 elements, 1 address
}

TEST_CASE("libtorch's method forms: each equals its free function; the in-place ones write through assign") {
  Tensor x = kt::make_tensor({0.5, -1.5, 2.0, 3.0, -0.25, 1.0}, {2, 3}, DType::Float32);
  auto same = [](const Tensor& a, const Tensor& b) {
    CHECK(a.shape() == b.shape());
    CHECK(a.dtype() == b.dtype());
    CHECK(a.to(DType::Float64).to_vector<double>() == b.to(DType::Float64).to_vector<double>());
  };
  same(x.reshape({3, 2}), reshape(x, {3, 2}));
  same(x.view({6}), reshape(x, {6}));
  same(x.flatten(), reshape(x, {6}));
  same(reshape(x, {1, 2, 3, 1}).flatten(1, 2), reshape(x, {1, 6, 1}));
  same(reshape(x, {1, 2, 3}).squeeze(), x);
  same(x.unsqueeze(0).squeeze(0), x);
  same(x.permute({1, 0}), transpose(x, 0, 1));
  same(x.t(), transpose(x, 0, 1));
  same(x.transpose(0, 1), transpose(x, 0, 1));
  same(x.expand({4, 2, 3}), broadcast_to(x, {4, 2, 3}));
  same(x.flip({1}), flip(x, {1}));
  same(x.repeat({2, 1}), repeat(x, {2, 1}));
  CHECK(x.chunk(3, 1).size() == 3);
  CHECK(x.split(2, 1).size() == 2);
  same(x.sum(), sum(x));
  same(x.sum({1}, true), sum(x, {1}, true));
  same(x.mean({0}), mean(x, {0}));
  same(x.prod({1}), prod(x, {1}));
  same(x.amax({1}), amax(x, {1}));
  same(x.amin(), amin(x));
  same(x.logsumexp({1}), logsumexp(x, {1}));
  same(x.var({1}, false, 0.0), var(x, {1}, false, 0.0));
  same(x.max(), max(x));
  same(x.min(1).indices(), min(x, 1).indices());
  same(x.argmax({1}), argmax(x, {1}));
  same(x.softmax(1), softmax(x, 1));
  same(x.log_softmax(0), log_softmax(x, 0));
  same(x.cumsum(1), cumsum(x, 1));
  same(std::get<1>(x.topk(2, 1)), std::get<1>(topk(x, 2, 1)));
  same(std::get<0>(x.sort(1, true)), std::get<0>(sort(x, 1, true)));
  same((x * 2.0f).exp(), exp(x * 2.0f));  // on an expression, too
  same(x.abs().neg(), neg(abs(x)));
  same(x.relu().sqrt().square(), square(sqrt(relu(x))));
  same(x.sigmoid().log().tanh(), tanh(log(sigmoid(x))));
  same(x.pow(2.0), pow(x, 2.0));
  same(x.clamp(-1.0, 1.0), clamp(x, -1.0, 1.0));
  Tensor idx = kt::make_int_tensor({2, 0}, {2});
  same(x.index_select(1, idx), index_select(x, 1, idx));
  same(x.masked_fill(x > 1.0f, 0.0), masked_fill(x, x > 1.0f, 0.0));
  CHECK_THROWS_AS(reshape(x, {1, 2, 3}).t(), ShapeError);

  // In place: the storage is written, the tensor returned.
  Tensor y = clone(x).eval();
  y.mul_(2.0).add_(x, 0.5).sub_(1.0);  // 2x + x/2 - 1
  std::vector<float> yv = y.to_vector<float>(), xv = x.to_vector<float>();
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(yv[i] == doctest::Approx(2.5 * xv[i] - 1.0));
  y.div_(x).copy_(x);
  CHECK(y.to_vector<float>() == xv);
  y.zero_();
  CHECK(y.to_vector<float>() == std::vector<float>(6, 0.0f));
  y.fill_(3.5);
  CHECK(y.to_vector<float>() == std::vector<float>(6, 3.5f));
  // A hand-written update of a parameter, as libtorch code does it.
  Tensor w = kt::make_tensor({1, 2}, {2}, DType::Float32).eval().requires_grad_();
  (w * w).sum().backward();
  {
    NoGradGuard no_grad;
    w.sub_(w.grad(), 0.25);  // w - 0.25 * 2w
  }
  CHECK(w.to_vector<float>() == std::vector<float>{0.5f, 1.0f});
  w.grad().zero_();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{0.0f, 0.0f});

  // The other in-place forms (values checked against torch 2.11's), and clone() as a method: a
  // copy that in-place writes leave alone.
  Tensor v = from_vector<double>({-2, -0.5, 0.5, 3}, {4}, kt::device()).to(DType::Float32).eval();
  const Tensor keep = v.clone().eval();
  auto values = [](const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); };
  auto close = [&](const Tensor& t, std::vector<double> want) {
    const std::vector<double> got = values(t);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
  };
  const Tensor odd = from_vector<bool>({true, false, false, true}, {4}, kt::device());
  close(v.clone().masked_fill_(odd, 9), {9, -0.5, 0.5, 9});
  close(v.clone().clamp_(-1, 1), {-1, -0.5, 0.5, 1});
  close(v.clone().clamp_min_(0).clamp_max_(2), {0, 0, 0.5, 2});
  close(v.clone().neg_().abs_().sqrt_().log_().exp_(), {1.41421356, 0.70710678, 0.70710678, 1.73205081});
  close(v.clone().pow_(2).sigmoid_().tanh_(), {0.75393634, 0.50959052, 0.50959052, 0.76154233});
  close(v.clone().relu_(), {0, 0, 0.5, 3});
  close(v.clone().lerp_(ones({4}, DType::Float32, kt::device()), 0.25), {-1.25, -0.125, 0.625, 2.5});
  close(v.clone().mul_(0.9).addcmul_(v, v, 0.1), {-1.4, -0.425, 0.475, 3.6});
  close(v.clone().addcdiv_(v, full({4}, 2.0, DType::Float32, kt::device()), -1.0), {-1, -0.25, 0.25, 1.5});
  const Tensor at = from_vector<std::int64_t>({3, 0}, {2}, kt::device());
  const Tensor two = from_vector<float>({1, 2}, {2}, kt::device());
  Tensor z = zeros({4}, DType::Float32, kt::device());
  close(z.clone().scatter_(0, at, two), {2, 0, 0, 1});
  close(z.clone().scatter_add_(0, from_vector<std::int64_t>({1, 1}, {2}, kt::device()), two), {0, 3, 0, 0});
  close(z.clone().index_add_(0, at, two, 2.0), {4, 0, 0, 2});
  close(z.clone().index_copy_(0, at, two), {2, 0, 0, 1});
  close(z.clone().index_fill_(0, at, 5), {5, 0, 0, 5});
  close(z.clone().masked_scatter_(odd, two), {1, 0, 0, 2});
  close(z.clone().index_put_({at}, two, true), {2, 0, 0, 1});
  close(v.index_fill(0, at, 1).masked_scatter(odd, two).index_put({at}, full({}, 4.0, DType::Float32, kt::device())),
        {4, -0.5, 0.5, 4});
  CHECK(values(v) == values(keep));  // every write above went to a clone
  Tensor ints = zeros({4}, DType::Int64, kt::device());
  CHECK_THROWS_AS(ints.sqrt_(), DTypeError);  // a float result into an int64 tensor, as torch's
}

}  // namespace kiln_test_tensor_usability
