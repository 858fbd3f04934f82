// The host's product libraries: the CBLAS found at run time and the built-in product used
// without one, each against a float64 loop, with transposed operands, batches (a broadcast
// one too) and half types; what KILN_BLAS selects; a library that cannot load says why.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kiln/runtime/cblas.hpp"

namespace kiln_test_runtime_cblas {

using namespace kiln;
using kiln::runtime::GemmShape;

namespace {

/// A batch of products with a transposed B (column-major) and A's batch broadcast.
struct Case {
  GemmShape s;
  std::vector<double> a, b;
  Case(std::int64_t m, std::int64_t k, std::int64_t n, std::int64_t batch) {
    s.m = m, s.n = n, s.k = k, s.batch = batch;
    s.a_rs = k, s.a_cs = 1, s.a_bs = 0;      // one A for every batch
    s.b_rs = 1, s.b_cs = k, s.b_bs = n * k;  // each B stored as [n, k] (B^T row-major)
    s.d_rs = n, s.d_bs = m * n;
    for (std::int64_t i = 0; i < m * k; ++i) a.push_back(std::sin(0.37 * static_cast<double>(i)));
    for (std::int64_t i = 0; i < batch * n * k; ++i) b.push_back(std::cos(0.11 * static_cast<double>(i)));
  }
  double expected(std::int64_t t, std::int64_t i, std::int64_t j) const {
    double acc = 0;
    for (std::int64_t p = 0; p < s.k; ++p)
      acc += a[static_cast<std::size_t>(i * s.k + p)] * b[static_cast<std::size_t>(t * s.n * s.k + j * s.k + p)];
    return acc;
  }
  template <class T, class F>
  void check(F&& gemm, double tol) const {
    std::vector<T> A(a.begin(), a.end()), B(b.begin(), b.end()), D(static_cast<std::size_t>(s.batch * s.m * s.n));
    if constexpr (!std::is_arithmetic_v<T>) {
      for (std::size_t i = 0; i < a.size(); ++i) A[i] = T(static_cast<float>(a[i]));
      for (std::size_t i = 0; i < b.size(); ++i) B[i] = T(static_cast<float>(b[i]));
    }
    gemm(A.data(), B.data(), D.data());
    double worst = 0;
    for (std::int64_t t = 0; t < s.batch; ++t)
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) {
          const T v = D[static_cast<std::size_t>((t * s.m + i) * s.n + j)];
          double got;
          if constexpr (std::is_arithmetic_v<T>)
            got = static_cast<double>(v);
          else
            got = static_cast<double>(static_cast<float>(v));
          worst = std::max(worst, std::abs(got - expected(t, i, j)));
        }
    CHECK_MESSAGE(worst <= tol * std::sqrt(static_cast<double>(s.k)), "worst error " << worst);
  }
};

}  // namespace

TEST_CASE("the built-in product and the CBLAS agree with a float64 loop") {
  const std::vector<std::array<std::int64_t, 4>> sizes = {{1, 1, 1, 1}, {7, 17, 5, 3}, {64, 127, 33, 2}};
  for (auto [m, k, n, batch] : sizes) {
    Case c(m, k, n, batch);
    c.check<float>([&](const float* A, const float* B, float* D) { runtime::detail::builtin_gemm(c.s, A, B, D); },
                   1e-5);
    c.check<double>([&](const double* A, const double* B, double* D) { runtime::detail::builtin_gemm(c.s, A, B, D); },
                    1e-12);
    const auto& st = runtime::cblas_state();
    if (!st.blas) {
      MESSAGE("no CBLAS here: " << st.reason);
      continue;
    }
    c.check<float>(
        [&](const float* A, const float* B, float* D) { runtime::detail::blas_gemm(*st.blas, c.s, A, B, D); }, 1e-5);
    GemmShape h = c.s;
    h.dtype = h.out_dtype = DType::BFloat16;
    c.check<BFloat16>([&](const BFloat16* A, const BFloat16* B, BFloat16* D) { runtime::cpu_gemm(h, A, B, D); }, 2e-2);
    h.dtype = h.out_dtype = DType::Float16;
    c.check<Half>([&](const Half* A, const Half* B, Half* D) { runtime::cpu_gemm(h, A, B, D); }, 2e-3);
  }
}

TEST_CASE("KILN_BLAS chooses the library; one that cannot load says why") {
  ::setenv("KILN_BLAS", "builtin", 1);
  CHECK(runtime::detail::cblas_candidates().empty());
  ::setenv("KILN_BLAS", "openblas", 1);
  CHECK(runtime::detail::cblas_candidates().front() == "libopenblas.so.0");
  ::unsetenv("KILN_BLAS");
  CHECK(runtime::detail::cblas_candidates().size() > 3);
  runtime::CblasState st = runtime::detail::load_cblas({"/nonexistent/libnoblas.so"});
  CHECK(!st.blas);
  CHECK(st.reason.find("/nonexistent/libnoblas.so") != std::string::npos);
  GemmShape bad;
  bad.epilogue = runtime::GemmEpilogue::Relu;
  CHECK_THROWS_AS(runtime::cpu_gemm(bad, nullptr, nullptr, nullptr), InternalError);
}

}  // namespace kiln_test_runtime_cblas
