// Matrix products (matmul, mm, bmm, addmm, linear, einsum, Tensor::matmul) against a float64
// product computed here, on the device under test (KILN_DEVICE) and by the reference
// executor: every rule of torch.matmul, odd and skinny shapes, empty dims, strided operands,
// every floating dtype, epilogues, attention's building blocks; how many library calls and
// kernels a product costs; errors naming the op, both shapes and dtypes.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <kiln/runtime/cuda_graph.hpp>

#include "../support/reference.hpp"

namespace kiln_test_tensor_matmul {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

struct BackendGuard {
  Backend saved = get_backend();
  explicit BackendGuard(Backend b) { set_backend(b); }
  ~BackendGuard() { set_backend(saved); }
};

/// torch.matmul in double, written independently of kiln: 1-D operands promoted and the added
/// dims removed, batch dims broadcast.
kt::Ref ref_matmul(const kt::Ref& a_in, const kt::Ref& b_in) {
  kt::Ref a = a_in, b = b_in;
  const bool av = a.shape.size() == 1, bv = b.shape.size() == 1;
  if (av) a.shape = Shape{1, a.shape[0]};
  if (bv) b.shape = Shape{b.shape[0], 1};
  const std::size_t ra = a.shape.size(), rb = b.shape.size();
  const std::int64_t M = a.shape[ra - 2], K = a.shape[ra - 1], N = b.shape[rb - 1];
  Shape ab(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Shape batch = kt::broadcast_shape(ab, bb);
  kt::Ref out;
  out.shape = batch;
  out.shape.push_back(M);
  out.shape.push_back(N);
  out.v.assign(static_cast<std::size_t>(out.shape.numel()), 0.0);
  for (std::int64_t t = 0; t < batch.numel(); ++t) {
    auto idx = kt::unravel(t, batch);
    const std::int64_t ta = ab.empty() ? 0 : kt::broadcast_flat(idx, ab),
                       tb = bb.empty() ? 0 : kt::broadcast_flat(idx, bb);
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (std::int64_t p = 0; p < K; ++p)
          acc +=
              a.v[static_cast<std::size_t>((ta * M + i) * K + p)] * b.v[static_cast<std::size_t>((tb * K + p) * N + j)];
        out.v[static_cast<std::size_t>((t * M + i) * N + j)] = acc;
      }
  }
  Shape s = out.shape;
  if (bv) s.erase(s.end() - 1);
  if (av) s.erase(s.end() - (bv ? 1 : 2));
  out.shape = s;
  return out;
}

/// torch.testing's tolerance of `dt`, scaled by sqrt(K) (a dot product's rounding grows so).
kt::Tolerance product_tolerance(DType dt, std::int64_t K) {
  kt::Tolerance t = kt::tolerance(dt);
  const double s = std::sqrt(static_cast<double>(std::max<std::int64_t>(K, 1)));
  return {t.rtol * s, std::max(t.atol, t.rtol) * s};
}

kt::Ref values_of(const Tensor& t) { return kt::ref_of(t); }

Tensor make(const Shape& s, DType dt = DType::Float32, std::uint64_t seed = 1) {
  return kt::make_tensor(kt::uniform_values(static_cast<std::size_t>(s.numel()), -1.0, 1.0, dt, seed), s, dt);
}

void check_product(const Shape& as, const Shape& bs, DType dt = DType::Float32) {
  CAPTURE(as);
  CAPTURE(bs);
  CAPTURE(dt);
  Tensor a = make(as, dt, 1), b = make(bs, dt, 2);
  kt::Ref expected = ref_matmul(values_of(a), values_of(b));
  Tensor y = matmul(a, b);
  CHECK(y.dtype() == dt);
  KILN_CHECK_CLOSE(y, expected, product_tolerance(dt, as.back()));
}

}  // namespace

TEST_CASE("matmul follows torch.matmul's rules: dot, matrix, vector promotion, broadcast batches") {
  const std::vector<std::pair<Shape, Shape>> cases = {{{3}, {3}},
                                                      {{2, 3}, {3}},
                                                      {{3}, {3, 4}},
                                                      {{2, 3}, {3, 4}},
                                                      {{5, 2, 3}, {3, 4}},
                                                      {{2, 3}, {5, 3, 4}},
                                                      {{5, 1, 2, 3}, {4, 3, 2}},
                                                      {{3}, {5, 3, 4}},
                                                      {{5, 2, 3}, {3}},
                                                      {{2, 5, 2, 3}, {2, 5, 3, 1}}};
  for (auto& [as, bs] : cases) check_product(as, bs);
  CHECK(matmul(make({3}), make({3})).shape() == Shape{});
  CHECK(matmul(make({5, 1, 2, 3}), make({4, 3, 2})).shape() == Shape{5, 4, 2, 2});
  CHECK(make({2, 3}).matmul(make({3, 4})).shape() == Shape{2, 4});
}

TEST_CASE("matmul of odd, large and skinny shapes, in every floating dtype") {
  for (std::int64_t n : {1, 7, 17, 64, 127}) check_product({n, n}, {n, n});
  check_product({4095, 3}, {3, 5});
  check_product({8, 4096}, {4096, 4096});  // skinny: M = 8
  check_product({4096, 8}, {8, 4096});     // skinny: K = 8
  for (DType dt : kt::kFloatDTypes) {
    check_product({7, 127}, {127, 17}, dt);
    check_product({3, 17, 64}, {3, 64, 7}, dt);
  }
}

TEST_CASE("matmul with an empty dim: K = 0 gives zeros, M = 0 an empty result") {
  Tensor z = matmul(make({3, 0}), make({0, 4}));
  CHECK(z.shape() == Shape{3, 4});
  KILN_CHECK_CLOSE(z, std::vector<double>(12, 0.0));
  CHECK(matmul(make({0, 5}), make({5, 4})).shape() == Shape{0, 4});
  CHECK(matmul(make({2, 0, 5}), make({5, 4})).numel() == 0);
  KILN_CHECK_CLOSE(relu(matmul(make({2, 0}), make({0, 3})) + 1.0f), std::vector<double>(6, 1.0));
}

TEST_CASE("matmul reads transposed, sliced, broadcast and computed operands") {
  Tensor a = make({6, 5}, DType::Float32, 3), b = make({4, 6}, DType::Float32, 4);
  kt::Ref ra = values_of(a), rb = values_of(b);
  auto ref_t = [](const kt::Ref& r) {
    kt::Ref t{std::vector<double>(r.v.size()), Shape{r.shape[1], r.shape[0]}};
    for (std::int64_t i = 0; i < r.shape[0]; ++i)
      for (std::int64_t j = 0; j < r.shape[1]; ++j)
        t.v[static_cast<std::size_t>(j * r.shape[0] + i)] = r.v[static_cast<std::size_t>(i * r.shape[1] + j)];
    return t;
  };
  // Both operands transposed views (column-major for the library).
  KILN_CHECK_CLOSE(matmul(transpose(a, 0, 1), transpose(b, 0, 1)), ref_matmul(ref_t(ra), ref_t(rb)));
  // Every other row: a row stride of twice the row length.
  Tensor rows = slice(a, 0, 0, 6, 2);
  KILN_CHECK_CLOSE(matmul(rows, make({5, 3}, DType::Float32, 5)),
                   ref_matmul(values_of(rows), values_of(make({5, 3}, DType::Float32, 5))));
  // Every other column: no unit stride, so the operand is copied first.
  Tensor cols = slice(a, 1, 0, 5, 2);
  KILN_CHECK_CLOSE(matmul(cols, make({3, 2}, DType::Float32, 6)),
                   ref_matmul(values_of(cols), values_of(make({3, 2}, DType::Float32, 6))));
  // Computed operands (generated kernels before the call) and a broadcast batch.
  Tensor x = make({2, 3, 4}, DType::Float32, 7), w = make({4, 5}, DType::Float32, 8);
  kt::Ref rx = values_of(x), rw = values_of(w);
  for (auto& v : rx.v) v = v * 2.0 + 1.0;
  KILN_CHECK_CLOSE(matmul(x * 2.0f + 1.0f, exp(w)), ref_matmul(rx, [&] {
                     kt::Ref e = rw;
                     for (auto& v : e.v) v = std::exp(v);
                     return e;
                   }()));
  KILN_CHECK_CLOSE(
      matmul(make({3, 4}, DType::Float32, 9), broadcast_to(make({1, 4, 2}, DType::Float32, 10), {3, 4, 2})),
      ref_matmul(values_of(make({3, 4}, DType::Float32, 9)),
                 values_of(broadcast_to(make({1, 4, 2}, DType::Float32, 10), {3, 4, 2}))));
}

TEST_CASE("mm, bmm, addmm, linear as PyTorch's") {
  Tensor a = make({4, 3}, DType::Float32, 11), b = make({3, 5}, DType::Float32, 12);
  kt::Ref p = ref_matmul(values_of(a), values_of(b));
  KILN_CHECK_CLOSE(mm(a, b), p);
  Tensor q = make({2, 4, 3}, DType::Float32, 13), k = make({2, 5, 3}, DType::Float32, 14);
  Tensor s = bmm(q, transpose(k, -2, -1));
  KILN_CHECK_CLOSE(s, ref_matmul(values_of(q), values_of(transpose(k, -2, -1))));
  // addmm: beta * c + alpha * a @ b; beta 0 ignores c (NaN in c does not propagate).
  Tensor c = make({5}, DType::Float32, 15);
  kt::Ref expected = p;
  kt::Ref rc = values_of(c);
  for (std::size_t i = 0; i < expected.v.size(); ++i) expected.v[i] = 0.5 * rc.v[i % 5] + 2.0 * p.v[i];
  KILN_CHECK_CLOSE(addmm(c, a, b, 0.5, 2.0), expected);
  Tensor nan_c = full({4, 5}, std::nan(""), DType::Float32, kt::device());
  KILN_CHECK_CLOSE(addmm(nan_c, a, b, 0.0, 1.0), p);
  // ... and still gets a (zero) gradient, as torch's beta * grad, rather than being unused.
  Tensor leaf_c = nan_c.contiguous().eval().requires_grad_();
  const std::vector<double> zero_grad =
      autograd::grad({sum(addmm(leaf_c, a, b, 0.0, 1.0))}, {leaf_c})[0].to_vector<double>();
  CHECK(zero_grad == std::vector<double>(20, 0.0));
  // linear: x @ w^T + bias, with a batch of inputs and a 1-D weight.
  Tensor x = make({2, 3, 4}, DType::Float32, 16), w = make({6, 4}, DType::Float32, 17),
         bias = make({6}, DType::Float32, 18);
  kt::Ref lin = ref_matmul(values_of(x), values_of(transpose(w, 0, 1)));
  kt::Ref rbias = values_of(bias);
  for (std::size_t i = 0; i < lin.v.size(); ++i) lin.v[i] += rbias.v[i % 6];
  KILN_CHECK_CLOSE(linear(x, w, bias), lin);
  CHECK(linear(x, make({4}, DType::Float32, 19)).shape() == Shape{2, 3});
}

TEST_CASE("a product and its pointwise epilogue cost one library call and at most one kernel") {
  Tensor x = make({64, 32}, DType::Float32, 20), w = make({32, 48}, DType::Float32, 21),
         b = make({48}, DType::Float32, 22);
  kt::Ref expected = ref_matmul(values_of(x), values_of(w));
  kt::Ref rb = values_of(b);
  for (std::size_t i = 0; i < expected.v.size(); ++i) expected.v[i] = std::max(0.0, expected.v[i] + rb.v[i % 48]);
  Tensor y = relu(matmul(x, w) + b);
  y.eval();
  reset_stats();
  Tensor y2 = relu(matmul(x, w) + b);
  y2.eval();
  KILN_CHECK_CLOSE(y2, expected, product_tolerance(DType::Float32, 32));
  Stats st = stats();
  if (get_backend() != Backend::Eager) {
    CHECK(st.library_calls == 1);
    // cuBLASLt applies bias and relu itself; on the host the epilogue is one generated kernel.
    CHECK(st.launches == (kt::on_cpu() ? 1u : 0u));
  }
  // gelu (tanh form) and a residual add after a linear.
  Tensor W = make({48, 32}, DType::Float32, 23);
  kt::Ref lin = ref_matmul(values_of(x), values_of(transpose(W, 0, 1)));
  kt::Ref rx2 = values_of(make({64, 48}, DType::Float32, 24));
  for (std::size_t i = 0; i < lin.v.size(); ++i) lin.v[i] = kt::ref_gelu_tanh(lin.v[i] + rb.v[i % 48]) + rx2.v[i];
  KILN_CHECK_CLOSE(gelu(linear(x, W, b), true) + make({64, 48}, DType::Float32, 24), lin,
                   product_tolerance(DType::Float32, 32));
}

TEST_CASE("attention's blocks: softmax(q k^T * scale + causal mask) v is two calls and one kernel") {
  const std::int64_t B = 2, T = 9, D = 8;
  Tensor q = make({B, T, D}, DType::Float32, 30), k = make({B, T, D}, DType::Float32, 31),
         v = make({B, T, D}, DType::Float32, 32);
  std::vector<double> mask_values(static_cast<std::size_t>(T * T));
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < T; ++j) mask_values[static_cast<std::size_t>(i * T + j)] = j <= i ? 0.0 : -INFINITY;
  Tensor mask = kt::make_tensor(mask_values, {T, T}, DType::Float32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto attend = [&] { return bmm(softmax(bmm(q, transpose(k, -2, -1)) * scale + mask, -1), v); };
  Tensor out = attend();
  out.eval();
  // The reference, in double.
  kt::Ref s = ref_matmul(values_of(q), values_of(transpose(k, -2, -1)));
  for (std::int64_t t = 0; t < B * T; ++t) {
    const std::int64_t i = t % T;
    double mx = -INFINITY, sum = 0;
    for (std::int64_t j = 0; j < T; ++j) {
      double& x = s.v[static_cast<std::size_t>(t * T + j)];
      x = x * scale + mask_values[static_cast<std::size_t>(i * T + j)];
      mx = std::max(mx, x);
    }
    for (std::int64_t j = 0; j < T; ++j) sum += std::exp(s.v[static_cast<std::size_t>(t * T + j)] - mx);
    for (std::int64_t j = 0; j < T; ++j) {
      double& x = s.v[static_cast<std::size_t>(t * T + j)];
      x = std::exp(x - mx) / sum;
    }
  }
  KILN_CHECK_CLOSE(out, ref_matmul(s, values_of(v)), product_tolerance(DType::Float32, T));
  reset_stats();
  attend().eval();
  if (get_backend() != Backend::Eager) {
    CHECK(stats().library_calls == 2);
    CHECK(stats().launches == 1);  // the softmax between the products: one row kernel
  }
}

TEST_CASE("the reference executor computes every product as the JIT does") {
  Tensor a = make({3, 5, 7}, DType::Float32, 40), b = make({7, 4}, DType::Float32, 41),
         c = make({4}, DType::Float32, 42);
  kt::Ref expected = ref_matmul(values_of(a), values_of(b));
  kt::Ref rc = values_of(c);
  for (std::size_t i = 0; i < expected.v.size(); ++i) expected.v[i] = std::tanh(expected.v[i] + rc.v[i % 4]);
  for (Backend be : {Backend::Eager, Backend::Jit}) {
    if (be == Backend::Eager && !kt::on_cpu()) continue;  // the reference executor reads host memory
    BackendGuard guard(be);
    KILN_CHECK_CLOSE(tanh(matmul(a, b) + c), expected, product_tolerance(DType::Float32, 7));
    KILN_CHECK_CLOSE(einsum("bik,kj->bij", a, b), ref_matmul(values_of(a), values_of(b)),
                     product_tolerance(DType::Float32, 7));
  }
}

TEST_CASE("kiln::compile traces a product and replays it, in every mode") {
  for (const char* mode : {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}) {
    CAPTURE(mode);
    CompileOptions opt;
    opt.mode = mode;
    auto f =
        kiln::compile([](const Tensor& x, const Tensor& w, const Tensor& b) { return relu(matmul(x, w) + b); }, opt);
    for (std::uint64_t seed : {50, 51}) {
      Tensor x = make({16, 8}, DType::Float32, seed), w = make({8, 12}, DType::Float32, seed + 10),
             b = make({12}, DType::Float32, seed + 20);
      kt::Ref expected = ref_matmul(values_of(x), values_of(w));
      kt::Ref rb = values_of(b);
      for (std::size_t i = 0; i < expected.v.size(); ++i) expected.v[i] = std::max(0.0, expected.v[i] + rb.v[i % 12]);
      KILN_CHECK_CLOSE(f(x, w, b), expected, product_tolerance(DType::Float32, 8));
      // Later calls with the same inputs: on the GPU, reduce-overhead and max-autotune replay
      // one CUDA graph holding the cuBLASLt call (and its epilogue), counted as a call.
      const std::uint64_t replays = runtime::cuda_graph_counters().replays.load();
      reset_stats();
      for (int r = 0; r < 3; ++r) KILN_CHECK_CLOSE(f(x, w, b), expected, product_tolerance(DType::Float32, 8));
      if (get_backend() != Backend::Eager) CHECK(stats().library_calls == 3);
      const bool graphs = !kt::on_cpu() && runtime::cuda_graphs_available() &&
                          (std::string(mode) == "reduce-overhead" || std::string(mode) == "max-autotune");
      if (graphs) CHECK(runtime::cuda_graph_counters().replays.load() - replays >= 2);
    }
  }
}

TEST_CASE("a cast operand is read through the cast by the call (a prologue on the host)") {
  Tensor x = make({33, 20}, DType::Float32, 70), w = make({20, 9}, DType::BFloat16, 71),
         d = make({20, 9}, DType::Float64, 72);
  for (auto [to, other] : {std::pair{DType::BFloat16, w}, std::pair{DType::Float64, d}}) {
    CAPTURE(to);
    Tensor folded = matmul(x.to(to), other);
    Tensor xc = x.to(to);
    xc.eval();
    Tensor plain = matmul(xc, other);
    plain.eval();
    reset_stats();
    folded.eval();
    if (get_backend() != Backend::Eager) {
      CHECK(stats().library_calls == 1);
      // cuBLASLt reads one dtype: on the GPU the cast is one kernel before the call.
      CHECK(stats().launches == (kt::on_cpu() ? 0u : 1u));
    }
    // The same rounding as the cast written out first: the same bits.
    CHECK(folded.to(DType::Float64).to_vector<double>() == plain.to(DType::Float64).to_vector<double>());
    KILN_CHECK_CLOSE(folded, ref_matmul(values_of(xc), values_of(other)), product_tolerance(to, 20));
  }
  // Transposed and batched leaves through the cast, an f64 operand rounded to f32.
  Tensor a = make({3, 7, 5}, DType::Float64, 73), b = make({3, 6, 7}, DType::Float32, 74);
  Tensor t = matmul(transpose(a, 1, 2).to(DType::Float32), transpose(b, 1, 2));
  KILN_CHECK_CLOSE(t, ref_matmul(values_of(transpose(a, 1, 2).to(DType::Float32)), values_of(transpose(b, 1, 2))),
                   product_tolerance(DType::Float32, 7));
}

TEST_CASE("einsum over one and two operands") {
  Tensor a = make({2, 3, 4}, DType::Float32, 60), b = make({2, 4, 5}, DType::Float32, 61);
  KILN_CHECK_CLOSE(einsum("bik,bkj->bij", a, b), ref_matmul(values_of(a), values_of(b)),
                   product_tolerance(DType::Float32, 4));
  Tensor m = make({3, 4}, DType::Float32, 62), u = make({4}, DType::Float32, 63), w = make({4}, DType::Float32, 64);
  KILN_CHECK_CLOSE(einsum("ij->ji", m), values_of(transpose(m, 0, 1)));
  KILN_CHECK_CLOSE(einsum("ij,j->i", m, u), ref_matmul(values_of(m), values_of(u)),
                   product_tolerance(DType::Float32, 4));
  KILN_CHECK_CLOSE(einsum("i,i->", u, w), ref_matmul(values_of(u), values_of(w)), product_tolerance(DType::Float32, 4));
  KILN_CHECK_CLOSE(einsum("ij,jk", m, make({4, 2}, DType::Float32, 65)),
                   ref_matmul(values_of(m), values_of(make({4, 2}, DType::Float32, 65))),
                   product_tolerance(DType::Float32, 4));
  // No contracted index: an outer product; one operand: a sum.
  kt::Ref outer{{}, Shape{4, 4}};
  kt::Ref ru = values_of(u), rw = values_of(w);
  for (double x : ru.v)
    for (double y : rw.v) outer.v.push_back(x * y);
  KILN_CHECK_CLOSE(einsum("i,j->ij", u, w), outer);
  KILN_CHECK_CLOSE(einsum("ij->i", m), values_of(sum(m, 1)));
  // Attention scores over heads: contracted d, batch b and h.
  Tensor q = make({2, 3, 5, 4}, DType::Float32, 66), k = make({2, 3, 6, 4}, DType::Float32, 67);
  KILN_CHECK_CLOSE(einsum("bhqd,bhkd->bhqk", q, k), ref_matmul(values_of(q), values_of(transpose(k, -2, -1))),
                   product_tolerance(DType::Float32, 4));
  // A letter repeated within an operand takes its diagonal (the trace without an output).
  Tensor sq = make({4, 4}, DType::Float32, 68);
  KILN_CHECK_CLOSE(einsum("ii->i", sq), values_of(diagonal(sq)));
  KILN_CHECK_CLOSE(einsum("ii", sq), values_of(trace(sq)));
  KILN_CHECK_CLOSE(einsum("ii,i->i", sq, u), values_of(diagonal(sq) * u));
  KILN_CHECK_CLOSE(einsum("jii->ji", reshape(concat({sq, sq * 2.0}, 0), {2, 4, 4})),
                   values_of(stack({diagonal(sq), diagonal(sq) * 2.0}, 0)));
  KILN_CHECK_THROWS_MENTIONING(ShapeError, einsum("ii->i", m), "einsum", "'i'", "repeated", "3 != 4");
  KILN_CHECK_THROWS_MENTIONING(ValueError, einsum("...ij->ij", m), "ellipsis");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, einsum("ij,jk->ik", m, m), "einsum", "'j'", "4", "3");
}

TEST_CASE("bad products are typed errors naming the op, both shapes and dtypes") {
  Tensor a = make({2, 3}), b = make({4, 5});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, matmul(a, b), "matmul", "float32[2, 3]", "float32[4, 5]", "3 != 4");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, matmul(full({}, 1.0, DType::Float32, kt::device()), a), "matmul",
                               "at least 1 dimension");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, matmul(make({2, 2, 3}), make({3, 3, 4})), "matmul", "batch", "[2]", "[3]");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, matmul(a, make({3, 4}, DType::Float64)), "matmul", "float32[2, 3]",
                               "float64[3, 4]");
  KILN_CHECK_THROWS_MENTIONING(
      DTypeError, matmul(kt::make_int_tensor({1, 2}, {1, 2}), kt::make_int_tensor({1, 2}, {2, 1})), "matmul", "int64");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, mm(make({2, 2, 3}), make({3, 4})), "mm", "2-D");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, bmm(make({2, 2, 3}), make({3, 3, 4})), "bmm", "batch");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, linear(make({2, 3}), make({4, 5})), "linear", "3 != 5");
  // A 1-D weight has no output features: its bias is 0-dim (torch refuses [1]).
  KILN_CHECK_THROWS_MENTIONING(ShapeError, linear(make({2, 3}), make({3}), make({1})), "linear", "float32[3]",
                               "0-dim bias", "float32[1]");
  CHECK(linear(make({2, 2, 3}), make({3}), full({}, 0.5f, DType::Float32, kt::device())).shape() == Shape{2, 2});
  KILN_CHECK_THROWS_MENTIONING(ValueError, set_float32_matmul_precision("fast"), "highest");
  set_float32_matmul_precision("high");
  CHECK(get_float32_matmul_precision() == "high");
  set_float32_matmul_precision("highest");
}

TEST_CASE("assigning a product into one of its operands reads the operand before it is overwritten") {
  Tensor a = make({4, 4}, DType::Float32, 70), w = make({4, 4}, DType::Float32, 71);
  kt::Ref expected = ref_matmul(values_of(a), values_of(w));
  a.assign(matmul(a, w));
  KILN_CHECK_CLOSE(a, expected, product_tolerance(DType::Float32, 4));
}

TEST_CASE("a product assigned into a transposed view or a slice of a larger buffer") {
  Tensor a = make({5, 3}, DType::Float32, 72), b = make({3, 4}, DType::Float32, 73);
  kt::Ref p = ref_matmul(values_of(a), values_of(b));
  Tensor big = zeros({4, 5}, DType::Float32, kt::device());
  Tensor view = transpose(big, 0, 1);  // [5, 4], column-major
  view.assign(matmul(a, b));
  KILN_CHECK_CLOSE(view, p, product_tolerance(DType::Float32, 3));
  Tensor wide = zeros({5, 9}, DType::Float32, kt::device());
  Tensor cols = slice(wide, 1, 2, 6);  // [5, 4] with row stride 9
  cols.assign(matmul(a, b));
  KILN_CHECK_CLOSE(cols, p, product_tolerance(DType::Float32, 3));
  std::vector<double> rest = values_of(wide).v;
  double outside = 0;
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 9; ++j)
      if (j < 2 || j >= 6) outside += std::abs(rest[static_cast<std::size_t>(i * 9 + j)]);
  CHECK(outside == 0.0);
}

TEST_CASE("random products with random epilogues agree with the reference executor") {
  // Seeded shapes, layouts (transposed, sliced, computed, broadcast-batch operands), dtypes and
  // what follows the product (bias, relu, tanh-gelu, a row softmax, a second product); the
  // device's result against the reference executor's on host copies.
  kt::SplitMix rng(2026);
  auto pick = [&](std::int64_t n) { return static_cast<std::int64_t>(rng.next() % static_cast<std::uint64_t>(n)); };
  const DType dtypes[] = {DType::Float32, DType::Float64, DType::BFloat16};
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    const DType dt = dtypes[pick(3)];
    const std::int64_t M = 1 + pick(9), K = 1 + pick(9), N = 1 + pick(9), B = pick(3);
    Shape as = B ? Shape{B, M, K} : Shape{M, K};
    Tensor a = make(pick(2) ? as : Shape(B ? Shape{B, K, M} : Shape{K, M}), dt, 100 + trial);
    if (a.shape() != as) a = transpose(a, -2, -1);
    Tensor b = make({K, N}, dt, 200 + trial);
    if (pick(2)) b = transpose(make({N, K}, dt, 300 + trial), 0, 1);
    if (pick(3) == 0) a = a * 0.5f + 0.25f;  // computed operand
    Tensor bias = make({N}, dt, 400 + trial);
    auto build = [&](const Tensor& a_, const Tensor& b_, const Tensor& bias_) {
      Tensor p = matmul(a_, b_);
      switch (trial % 6) {
        case 0:
          return p;
        case 1:
          return Tensor(p + bias_);
        case 2:
          return Tensor(relu(p + bias_));
        case 3:
          return Tensor(gelu(p + bias_, true));
        case 4:
          return softmax(p, -1);
        default:
          return matmul(tanh(p), transpose(b_, 0, 1));
      }
    };
    Tensor got = build(a, b, bias);
    Tensor expected;
    {
      BackendGuard eager(Backend::Eager);
      expected = build(a.to(Device::cpu()), b.to(Device::cpu()), bias.to(Device::cpu()));
      expected.eval();
    }
    KILN_CHECK_CLOSE(got, values_of(expected), product_tolerance(dt, 2 * K));
  }
}

}  // namespace kiln_test_tensor_matmul
