#pragma once
// The CPU's matrix products: a CBLAS loaded at run time (OpenBLAS or BLIS from the
// distribution, never linked: a binary without one still runs), else a built-in product that
// is correct everywhere and logged once as the slow path. float16 and bfloat16 go through
// float32 (converted once per operand, accumulated in float32, rounded once), as PyTorch's CPU
// product does.
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/duration.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/half.hpp"
#include "kiln/core/log.hpp"
#include "kiln/runtime/dynlib.hpp"
#include "kiln/runtime/gemm.hpp"
#include "kiln/runtime/process.hpp"

namespace kiln::runtime {

/// A CBLAS found at run time: its path and the two products kiln calls.
struct CblasLibrary {
  // CBLAS's enum values (cblas.h: CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112).
  static constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
  using Dgemm = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);
  std::unique_ptr<SharedLibrary> library;
  Sgemm sgemm = nullptr;
  Dgemm dgemm = nullptr;
  void (*set_threads)(int) = nullptr;  ///< openblas_set_num_threads / bli_thread_set_num_threads
  std::string path;
};

/// What loading found: the library, or why none is used (`reason`).
struct CblasState {
  std::optional<CblasLibrary> blas;
  std::string reason;
  double load_seconds = 0;
};

namespace detail {

/// Opens the first of `candidates` that loads and has cblas_sgemm and cblas_dgemm. Never throws.
inline CblasState load_cblas(const std::vector<std::string>& candidates) {
  CblasState st;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& path : candidates) {
    try {
      auto lib = std::make_unique<SharedLibrary>(path);
      CblasLibrary b;
      b.sgemm = reinterpret_cast<CblasLibrary::Sgemm>(lib->find_symbol("cblas_sgemm"));
      b.dgemm = reinterpret_cast<CblasLibrary::Dgemm>(lib->find_symbol("cblas_dgemm"));
      if (!b.sgemm || !b.dgemm) {
        st.reason += path + ": no cblas_sgemm/cblas_dgemm; ";
        continue;
      }
      b.set_threads = reinterpret_cast<void (*)(int)>(lib->find_symbol("openblas_set_num_threads"));
      if (!b.set_threads)
        b.set_threads = reinterpret_cast<void (*)(int)>(lib->find_symbol("bli_thread_set_num_threads"));
      b.path = path;
      b.library = std::move(lib);
      st.blas = std::move(b);
      st.reason.clear();
      break;
    } catch (const Error& e) {
      st.reason += std::string(e.what()) + "; ";
    }
  }
  st.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

/// The libraries KILN_BLAS asks for: "openblas", "blis", "builtin" (none: the built-in product),
/// a path, or unset (OpenBLAS, then BLIS, then the system's libblas.so.3 / libcblas.so.3).
inline std::vector<std::string> cblas_candidates() {
  const std::string choice = env::get("KILN_BLAS");
  const std::vector<std::string> openblas = {"libopenblas.so.0", "libopenblas.so"};
  const std::vector<std::string> blis = {"libblis.so.4", "libblis.so.3", "libblis.so"};
  if (choice == "builtin" || choice == "none") return {};
  if (choice == "openblas") return openblas;
  if (choice == "blis") return blis;
  if (!choice.empty()) return {choice};
  std::vector<std::string> all = openblas;
  all.insert(all.end(), blis.begin(), blis.end());
  all.push_back("libcblas.so.3");
  all.push_back("libblas.so.3");
  return all;
}

}  // namespace detail

/// The process's CBLAS, loaded on first use (KILN_BLAS is read then, once); a missing one is
/// logged once (a warning: products then use the slow built-in loop).
inline const CblasState& cblas_state() {
  static const CblasState st = [] {
    CblasState s = detail::load_cblas(detail::cblas_candidates());
    if (s.blas) {
      // The library's own pool would start a thread per CPU of the machine, whatever the
      // process's affinity (16 threads spinning on the 2 CPUs taskset gave it): as many as
      // kiln's kernels use instead.
      if (s.blas->set_threads) s.blas->set_threads(configured_cpu_threads());
      log(LogChannel::perf, "CPU products through " + s.blas->path + " (loaded in " +
                                std::to_string(static_cast<int>(s.load_seconds * 1e3)) + " ms)");
    } else {
      std::string why = env::get("KILN_BLAS") == "builtin" ? std::string("KILN_BLAS=builtin") : s.reason;
      const std::string text =
          "kiln: warning: no CBLAS found (" + why +
          "); CPU matrix products use kiln's built-in loop, which is correct but far slower. Install "
          "OpenBLAS (apt-get install libopenblas0-pthread) or set KILN_BLAS to a library's path.\n";
      std::fputs(text.c_str(), stderr);
    }
    return s;
  }();
  return st;
}

namespace detail {

/// The CBLAS view of one operand (see matrix_layout); InternalError when it has none (the step
/// planner only passes operands that do).
inline MatrixLayout blas_operand(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs,
                                 const GemmShape& s) {
  if (auto l = matrix_layout(rows, cols, rs, cs)) return *l;
  throw InternalError("kiln: matmul " + s.str() + ": an operand with strides (" + std::to_string(rs) + ", " +
                      std::to_string(cs) + ") is neither row- nor column-major");
}

/// The built-in product of float or double: B packed row-major once per batch, each row of D
/// accumulated in a vectorisable loop over N.
template <class T>
void builtin_gemm(const GemmShape& s, const T* A, const T* B, T* D) {
  std::vector<T> packed(static_cast<std::size_t>(s.k * s.n)), row(static_cast<std::size_t>(s.n));
  for (std::int64_t t = 0; t < s.batch; ++t) {
    const T* a = A + t * s.a_bs;
    const T* b = B + t * s.b_bs;
    T* d = D + t * s.d_bs;
    if (t == 0 || s.b_bs != 0)
      for (std::int64_t p = 0; p < s.k; ++p)
        for (std::int64_t j = 0; j < s.n; ++j)
          packed[static_cast<std::size_t>(p * s.n + j)] = b[p * s.b_rs + j * s.b_cs];
    for (std::int64_t i = 0; i < s.m; ++i) {
      std::fill(row.begin(), row.end(), T(0));
      for (std::int64_t p = 0; p < s.k; ++p) {
        const T x = a[i * s.a_rs + p * s.a_cs];
        const T* bp = packed.data() + p * s.n;
        for (std::int64_t j = 0; j < s.n; ++j) row[static_cast<std::size_t>(j)] += x * bp[j];
      }
      std::memcpy(d + i * s.d_rs, row.data(), sizeof(T) * static_cast<std::size_t>(s.n));
    }
  }
}

template <class T>
void blas_gemm(const CblasLibrary& blas, const GemmShape& s, const T* A, const T* B, T* D) {
  const MatrixLayout a = blas_operand(s.m, s.k, s.a_rs, s.a_cs, s), b = blas_operand(s.k, s.n, s.b_rs, s.b_cs, s);
  const std::int64_t ldc = s.m == 1 ? std::max<std::int64_t>(s.n, 1) : s.d_rs;
  constexpr std::int64_t kMax = 0x7fffffff;
  if (s.m > kMax || s.n > kMax || s.k > kMax || a.ld > kMax || b.ld > kMax || ldc > kMax)
    throw ShapeError("matmul " + s.str() + ": a dimension or a stride exceeds the CBLAS int range");
  for (std::int64_t t = 0; t < s.batch; ++t) {
    const int ta = a.transposed ? CblasLibrary::kTrans : CblasLibrary::kNoTrans;
    const int tb = b.transposed ? CblasLibrary::kTrans : CblasLibrary::kNoTrans;
    const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    if constexpr (std::is_same_v<T, float>)
      blas.sgemm(CblasLibrary::kRowMajor, ta, tb, m, n, k, 1.0f, A + t * s.a_bs, static_cast<int>(a.ld), B + t * s.b_bs,
                 static_cast<int>(b.ld), 0.0f, D + t * s.d_bs, static_cast<int>(ldc));
    else
      blas.dgemm(CblasLibrary::kRowMajor, ta, tb, m, n, k, 1.0, A + t * s.a_bs, static_cast<int>(a.ld), B + t * s.b_bs,
                 static_cast<int>(b.ld), 0.0, D + t * s.d_bs, static_cast<int>(ldc));
  }
}

template <class T>
void gemm_of(const GemmShape& s, const T* A, const T* B, T* D) {
  const CblasState& st = cblas_state();
  if (st.blas)
    blas_gemm(*st.blas, s, A, B, D);
  else
    builtin_gemm(s, A, B, D);
}

/// One element of an operand stored as S, read through the product's cast to T (rounded as
/// kiln's kernels round), then widened to the work type W of the BLAS product.
template <class T, class W, class S>
W read_through(S x) {
  if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
    return static_cast<W>(T(static_cast<float>(x)));
  else
    return static_cast<W>(T(x));
}

/// An operand as a contiguous [batch, rows, cols] buffer of W (row-major), each element read
/// through the product's cast (read_through); stored as the floating dtype `stored`.
template <class T, class W>
std::vector<W> pack_operand(DType stored, const void* x, std::int64_t batch, std::int64_t bs, std::int64_t rows,
                            std::int64_t cols, std::int64_t rs, std::int64_t cs) {
  std::vector<W> out(static_cast<std::size_t>(batch * rows * cols));
  visit_dtype(stored, [&](auto tag) {
    using S = decltype(tag);
    if constexpr (std::is_integral_v<S>) {
      throw InternalError(std::string("kiln: cpu_gemm: an operand stored as ") + dtype_name(stored));
    } else {
      const S* p = static_cast<const S*>(x);
      W* o = out.data();
      for (std::int64_t t = 0; t < batch; ++t)
        for (std::int64_t i = 0; i < rows; ++i)
          for (std::int64_t j = 0; j < cols; ++j) *o++ = read_through<T, W>(p[t * bs + i * rs + j * cs]);
    }
  });
  return out;
}

/// The product of T through the BLAS's W (float for halves, else T itself): operands that are
/// halves or are stored in another dtype (a cast folded into the call) are packed as W first;
/// the others are read in place. D is written as T.
template <class T, class W>
void packed_gemm(const GemmShape& s, const void* A, const void* B, T* D) {
  constexpr bool widen = !std::is_same_v<T, W>;
  const bool pack_a = widen || s.a_from.has_value(), pack_b = widen || s.b_from.has_value();
  GemmShape f = s;
  f.dtype = f.out_dtype = std::is_same_v<W, float> ? DType::Float32 : DType::Float64;
  f.a_from.reset();
  f.b_from.reset();
  // A packed operand is row-major and contiguous (rs, cs, out_bs: the operand's strides in,
  // the packed ones out); a batch stride of 0 stays one copy (a broadcast operand is packed once).
  auto pack = [&](std::optional<DType> from, const void* x, std::int64_t bs, std::int64_t rows, std::int64_t cols,
                  std::int64_t& rs, std::int64_t& cs, std::int64_t& out_bs) {
    std::vector<W> v = pack_operand<T, W>(from.value_or(s.dtype), x, bs == 0 ? 1 : s.batch, bs, rows, cols, rs, cs);
    rs = cols, cs = 1, out_bs = bs == 0 ? 0 : rows * cols;
    return v;
  };
  std::vector<W> a, b;
  if (pack_a) a = pack(s.a_from, A, s.a_bs, s.m, s.k, f.a_rs, f.a_cs, f.a_bs);
  if (pack_b) b = pack(s.b_from, B, s.b_bs, s.k, s.n, f.b_rs, f.b_cs, f.b_bs);
  const W* pa = pack_a ? a.data() : static_cast<const W*>(A);
  const W* pb = pack_b ? b.data() : static_cast<const W*>(B);
  if constexpr (!widen) {
    gemm_of<W>(f, pa, pb, D);
  } else {
    std::vector<W> d(static_cast<std::size_t>(s.batch * s.m * s.n));
    f.d_rs = s.n, f.d_bs = s.m * s.n;
    gemm_of<W>(f, pa, pb, d.data());
    const W* p = d.data();
    for (std::int64_t t = 0; t < s.batch; ++t)
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) D[t * s.d_bs + i * s.d_rs + j] = T(*p++);
  }
}

}  // namespace detail

/// The epilogue of a cuBLASLt product applied on the host after the product, element by element
/// over D (already rounded to its dtype): bias, relu, tanh-gelu, the GELU's input kept in `aux`
/// (GeluAux*), or D times the GELU's derivative at `aux` (DGelu), in double, rounded once (the
/// halves' constructors from double round through float, as kiln's kernels do). What a GPU's
/// step plan asks of its calls, so that such a plan can run (and be checked) on the host.
template <class T>
void apply_epilogue(const GemmShape& s, T* D, const void* bias, void* aux) {
  const double c = 0.7978845608028654;  // sqrt(2 / pi), the tanh form's constant
  auto tanh_of = [&](double x) { return std::tanh(c * (x + 0.044715 * x * x * x)); };
  std::vector<double> bias_values;  // widened once, read by every row
  if (epilogue_has_bias(s.epilogue))
    visit_dtype(s.bias_dtype, [&](auto tag) {
      using B = decltype(tag);
      if constexpr (std::is_floating_point_v<B> || std::is_same_v<B, Half> || std::is_same_v<B, BFloat16>)
        for (std::int64_t j = 0; j < s.n; ++j) bias_values.push_back(static_cast<double>(static_cast<const B*>(bias)[j]));
    });
  T* A = static_cast<T*>(aux);
  for (std::int64_t t = 0; t < s.batch; ++t)
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        T& out = D[t * s.d_bs + i * s.d_rs + j];
        double v = static_cast<double>(out);
        if (!bias_values.empty()) v += bias_values[static_cast<std::size_t>(j)];
        switch (s.epilogue) {
          case GemmEpilogue::Relu:
          case GemmEpilogue::ReluBias:
            v = v > 0 ? v : 0;
            break;
          case GemmEpilogue::GeluAux:
          case GemmEpilogue::GeluAuxBias:
            A[i * s.aux_rs + j] = static_cast<T>(v);
            [[fallthrough]];
          case GemmEpilogue::Gelu:
          case GemmEpilogue::GeluBias:
            v = 0.5 * v * (1.0 + tanh_of(v));
            break;
          case GemmEpilogue::DGelu: {
            const double x = static_cast<double>(A[i * s.aux_rs + j]);
            const double th = tanh_of(x);
            v *= 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x);
            break;
          }
          default:
            break;
        }
        out = static_cast<T>(v);
      }
}

/// D = epilogue(A @ B) on the host for each batch (see GemmShape). float32 and float64 through
/// the CBLAS (or the built-in loop), float16 and bfloat16 through float32; an operand stored in
/// another floating dtype (a_from, b_from) is read through the cast to the product's dtype while
/// it is packed. Host plans leave epilogues to the generated kernel after the call; a GPU's plan
/// run on the host (backend::CpuLaunchOptions::host_epilogues) has them applied here
/// (apply_epilogue), with `bias` and `aux` as cuBLASLt takes them. Requires m, n, k > 0.
inline void cpu_gemm(const GemmShape& s, const void* a, const void* b, void* d, const void* bias = nullptr,
                     void* aux = nullptr) {
  if (s.out_dtype != s.dtype)
    throw InternalError("kiln: cpu_gemm " + s.str() + ": dtype changes are not CPU library work");
  if ((epilogue_has_bias(s.epilogue) && !bias) || (epilogue_has_aux(s.epilogue) && (!aux || s.batch != 1)))
    throw InternalError("kiln: cpu_gemm " + s.str() + ": the epilogue's bias or auxiliary matrix is missing");
  if (s.epilogue != GemmEpilogue::None) {
    GemmShape plain = s;
    plain.epilogue = GemmEpilogue::None;
    cpu_gemm(plain, a, b, d);
    visit_dtype(s.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        apply_epilogue(s, static_cast<T*>(d), bias, aux);
    });
    return;
  }
  const bool cast = s.a_from || s.b_from;
  switch (s.dtype) {
    case DType::Float32:
      if (cast) return detail::packed_gemm<float, float>(s, a, b, static_cast<float*>(d));
      return detail::gemm_of(s, static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(d));
    case DType::Float64:
      if (cast) return detail::packed_gemm<double, double>(s, a, b, static_cast<double*>(d));
      return detail::gemm_of(s, static_cast<const double*>(a), static_cast<const double*>(b), static_cast<double*>(d));
    case DType::Float16:
      return detail::packed_gemm<Half, float>(s, a, b, static_cast<Half*>(d));
    case DType::BFloat16:
      return detail::packed_gemm<BFloat16, float>(s, a, b, static_cast<BFloat16*>(d));
    default:
      throw DTypeError(std::string("matmul: no CPU product for ") + dtype_name(s.dtype));
  }
}

/// Path of the CBLAS in use ("" for the built-in product).
inline std::string cblas_path() {
  const auto& st = cblas_state();
  return st.blas ? st.blas->path : std::string();
}

}  // namespace kiln::runtime
