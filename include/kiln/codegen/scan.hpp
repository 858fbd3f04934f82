#pragma once
// Source of a scan step (sched::ScanCall) in the C++ and CUDA dialects: the running sum,
// product, max, min, index of the max / min, or log-sum-exp along one axis. Floats accumulate in
// double and each prefix is rounded once to the output dtype; integer sums and products are
// exact in int64 (wrapping); max and min keep the first NaN and take the latest index among
// equal values, as torch.cummax.
//
// The CPU walks each row in order, rows shared among the team. The GPU gives each row a warp:
// 32 consecutive elements a step (four steps' loads issued together), an inclusive scan across
// the warp by shuffles, the carry of the steps before folded in, the last lane's result carried.
#include <string>

#include "kiln/codegen/c/axis_rows.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/cpp/dialect.hpp"
#include "kiln/codegen/cuda/prelude.hpp"
#include "kiln/sched/steps.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// A scan step's unit: the CPU's function `entry` (entry(void* const* args, int nth), args
/// {src, out}), or the GPU's kernel `entry` (one argument {src, out} by value) over `threads`.
struct ScanSource {
  std::string source;
  std::string entry;
  std::int64_t rows = 0, threads = 0;
};

namespace scan_detail {

using i64 = std::int64_t;
using ir::ScanKind;

inline bool floating_kind(const sched::ScanCall& c) {
  return (c.kind == ScanKind::Sum || c.kind == ScanKind::Prod || c.kind == ScanKind::LogSumExp) && is_floating(c.in);
}
inline bool select_kind(const sched::ScanCall& c) {
  return c.kind == ScanKind::Max || c.kind == ScanKind::Min || c.kind == ScanKind::ArgMax ||
         c.kind == ScanKind::ArgMin;
}

/// The state a prefix carries, as C declarations of fields named <p>a (double), <p>i (unsigned
/// long long), <p>v (the input's ctype), <p>k (its index) and <p>ok (nonempty).
struct State {
  std::string type;  ///< the accumulator's C type
  std::string identity;
};

inline std::string ctype_of(DType t) { return c_family::ctype(t); }

/// Statements combining state `a` (earlier) with `b` (later) into `a`, in place.
inline std::string combine(const sched::ScanCall& c, const std::string& a, const std::string& b) {
  if (floating_kind(c)) {
    if (c.kind == ScanKind::Sum) return a + "a = " + a + "a + " + b + "a;";
    if (c.kind == ScanKind::Prod) return a + "a = " + a + "a * " + b + "a;";
    // log(exp(a) + exp(b)), stable; -inf is the empty prefix; NaN stays.
    return "{ const double m = " + a + "a > " + b + "a ? " + a + "a : " + b + "a; " + a + "a = (" + a + "a != " + a +
           "a || " + b + "a != " + b + "a) ? (" + a + "a + " + b + "a) : (m == -KILN_SCAN_INF || m == KILN_SCAN_INF) ? m : m + log1p(exp(-fabs(" +
           a + "a - " + b + "a))); }";
  }
  if (!select_kind(c)) {
    if (c.kind == ScanKind::Sum) return a + "i = " + a + "i + " + b + "i;";
    return a + "i = " + a + "i * " + b + "i;";
  }
  const bool is_max = c.kind == ScanKind::Max || c.kind == ScanKind::ArgMax;
  const std::string ge = is_max ? " >= " : " <= ";
  return "if (" + b + "ok && (!" + a + "ok || (!(" + a + "v != " + a + "v) && ((" + b + "v != " + b + "v) || " + b +
         "v" + ge + a + "v)))) { " + a + "v = " + b + "v; " + a + "k = " + b + "k; " + a + "ok = true; }";
}

/// Declarations of a state `p` holding the empty prefix.
inline std::string declare(const sched::ScanCall& c, const std::string& p) {
  if (floating_kind(c))
    return "double " + p + "a = " +
           std::string(c.kind == ScanKind::Sum ? "0.0" : c.kind == ScanKind::Prod ? "1.0" : "-KILN_SCAN_INF") + ";";
  if (!select_kind(c)) return "unsigned long long " + p + "i = " + (c.kind == ScanKind::Sum ? "0ull" : "1ull") + ";";
  return ctype_of(c.in) + std::string(" ") + p + "v = 0; long long " + p + "k = 0; bool " + p + "ok = false;";
}

/// Statements setting state `p` to the one element `v` (a value of in's ctype) at position `i`.
inline std::string element(const sched::ScanCall& c, const std::string& p, const std::string& v, const std::string& i) {
  if (floating_kind(c)) return p + "a = (double)" + v + ";";
  if (!select_kind(c)) return p + "i = (unsigned long long)(long long)" + v + ";";
  return p + "v = " + v + "; " + p + "k = " + i + "; " + p + "ok = true;";
}

/// The output value of state `p`, as stored (stype(out)).
inline std::string result(const sched::ScanCall& c, const std::string& p, c_family::PreludeNeeds& needs) {
  if (floating_kind(c)) {
    if (c.out == DType::Float64) return p + "a";
    return c_family::to_storage("(float)" + p + "a", c.out, needs);
  }
  if (!select_kind(c)) return "(long long)" + p + "i";
  if (c.kind == ScanKind::ArgMax || c.kind == ScanKind::ArgMin) return p + "k";
  return c_family::to_storage(p + "v", c.out, needs);
}

/// Statements defining xo and oo, the offsets of row `row`'s first element in src and out.
inline std::string row_offsets(const sched::ScanCall& c, const std::string& row, const std::string& indent) {
  return c_family::axis_row_offsets(c.shape, c.axis, c.src.strides, c.result.strides, row, indent);
}

/// A warp shuffle of the input's value `v` from lane `from` (bool travels as an int).
inline std::string shfl_value(const sched::ScanCall& c, const std::string& v, const std::string& from) {
  if (c.in == DType::Bool) return "(__shfl_sync(0xffffffffu, (int)" + v + ", " + from + ") != 0)";
  return "__shfl_sync(0xffffffffu, " + v + ", " + from + ")";
}

/// The scan's row length and row count.
inline std::pair<i64, i64> extents(const sched::ScanCall& c) {
  const i64 len = c.shape[static_cast<std::size_t>(c.axis)];
  return {len, len == 0 ? 0 : c.shape.numel() / len};
}

inline std::string prelude_defines() {
  return "#define KILN_SCAN_INF __builtin_inf()\n";
}

}  // namespace scan_detail

/// The C++ unit of scan `c`, entry named `name`. Rows are taken four at a time, so that each
/// thread keeps four independent chains of additions in flight (a prefix is one dependent chain).
inline ScanSource generate_cpu_scan(const sched::ScanCall& c, const std::string& name) {
  using namespace scan_detail;
  c_family::PreludeNeeds needs;
  ScanSource out;
  out.entry = name;
  const auto [len, rows] = extents(c);
  out.rows = rows;
  constexpr int kGroup = 4;
  const i64 groups = rows / kGroup;
  const std::string st = c_family::stype(c.in), ot = c_family::stype(c.out);
  const std::string xs = std::to_string(c.src.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  const std::string os = std::to_string(c.result.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  // The scan of `count` rows from row `first` (a C expression), interleaved.
  auto rows_body = [&](const std::string& first, int count, const std::string& indent) {
    std::string b;
    for (int r = 0; r < count; ++r) {
      const std::string q = std::to_string(r);
      b += indent + "long long xo" + q + ", oo" + q + ";\n" + indent + "{\n" +
           row_offsets(c, first + " + " + q + "LL", indent + "  ") + indent + "  xo" + q + " = xo; oo" + q +
           " = oo;\n" + indent + "}\n";
      b += indent + declare(c, "s" + q) + "\n" + indent + declare(c, "e" + q) + "\n";
    }
    b += indent + "for (long long i = 0; i < " + std::to_string(len) + "LL; ++i) {\n";
    for (int r = 0; r < count; ++r) {
      const std::string q = std::to_string(r);
      b += indent + "  const " + std::string(ctype_of(c.in)) + " v" + q + " = " +
           c_family::from_storage("src[xo" + q + " + i * " + xs + "]", c.in, needs) + ";\n";
      b += indent + "  " + element(c, "e" + q, "v" + q, "i") + " " + combine(c, "s" + q, "e" + q) + "\n";
      b += indent + "  out[oo" + q + " + i * " + os + "] = " + result(c, "s" + q, needs) + ";\n";
    }
    return b + indent + "}\n";
  };
  std::string body = "extern \"C\" int " + name + "(void* const* args, int nth) {\n  (void)nth;\n";
  body += "  const " + st + "* __restrict src = (const " + st + "*)args[0];\n";
  body += "  " + ot + "* __restrict out = (" + ot + "*)args[1];\n";
  body += "  #pragma omp parallel for num_threads(nth) if(" + std::to_string(c.shape.numel()) + "LL >= 32768LL)\n";
  body += "  for (long long g = 0; g < " + std::to_string(groups) + "LL; ++g) {\n";
  body += rows_body("g * " + std::to_string(kGroup) + "LL", kGroup, "    ") + "  }\n";
  body += "  for (long long row = " + std::to_string(groups * kGroup) + "LL; row < " + std::to_string(rows) +
          "LL; ++row) {\n" + rows_body("row", 1, "    ") + "  }\n  return 0;\n}\n";
  std::string& src = out.source;
  src = std::string("// kiln generated scan\n") + detail::kHostCLibrary + prelude_defines();
  if (needs.half) src += detail::kHalfHelpers;
  if (needs.bf16) src += detail::kBf16Helpers;
  src += body;
  return out;
}

namespace scan_detail {

/// Whether the GPU scan may read and write `c`'s rows four floats at a time: a float kind from
/// f32 to f32, both rows contiguous, every row's start a multiple of four elements (the kernel
/// still checks the pointers' alignment and takes the scalar loop otherwise).
inline bool quad_lanes(const sched::ScanCall& c) {
  const auto [len, rows] = extents(c);
  if (!floating_kind(c) || c.in != DType::Float32 || c.out != DType::Float32 || len % 4 != 0) return false;
  const auto a = static_cast<std::size_t>(c.axis);
  if (c.src.strides[a] != 1 || c.result.strides[a] != 1) return false;
  for (std::size_t d = 0; d < c.shape.size(); ++d)
    if (d != a && c.shape[d] > 1 && (c.src.strides[d] % 4 != 0 || c.result.strides[d] % 4 != 0)) return false;
  return rows > 0;
}

/// The four-lane loop of a warp's row (quad_lanes), taken when both rows are 16-byte aligned and
/// returning: each lane scans its four elements in order, the warp scans the lanes' totals by
/// shuffles, and each lane's prefix is the carry, the lanes before it and its own elements.
/// Four 128-element steps' loads are issued together.
inline std::string quad_loop(const sched::ScanCall& c, i64 len, c_family::PreludeNeeds& needs) {
  constexpr int kSteps = 4;
  const std::string L = std::to_string(len) + "LL";
  std::string b = "  if (((unsigned long long)(src + xo) | (unsigned long long)(out + oo)) % 16ull == 0ull) {\n";
  b += "    for (long long base = 0; base < " + L + "; base += " + std::to_string(128 * kSteps) + "LL) {\n";
  for (int u = 0; u < kSteps; ++u) {
    const std::string us = std::to_string(u), i = "(base + " + std::to_string(128 * u) + "LL + 4 * lane)";
    b += "      const bool in" + us + " = " + i + " < " + L + ";\n";
    b += "      const float4 x" + us + " = in" + us + " ? *(const float4*)(src + xo + " + i +
         ") : make_float4(0.f, 0.f, 0.f, 0.f);\n";
  }
  const char* part[4] = {"x", "y", "z", "w"};
  for (int u = 0; u < kSteps; ++u) {
    const std::string us = std::to_string(u), i = "(base + " + std::to_string(128 * u) + "LL + 4 * lane)";
    b += "      {\n";
    // The lane's own inclusive prefixes p0..p3 (the empty element past the row's end).
    for (int j = 0; j < 4; ++j) b += "        " + declare(c, "p" + std::to_string(j)) + "\n";
    b += "        if (in" + us + ") {\n";
    for (int j = 0; j < 4; ++j)
      b += "          " + element(c, "p" + std::to_string(j), "x" + us + "." + part[j], i) + "\n";
    for (int j = 1; j < 4; ++j) {
      const std::string pj = "p" + std::to_string(j), prev = "p" + std::to_string(j - 1);
      b += "          { " + declare(c, "t") + " ta = " + prev + "a; " + combine(c, "t", pj) + " " + pj + "a = ta; }\n";
    }
    b += "        }\n";
    // Inclusive scan of the lanes' totals across the warp, then the exclusive one.
    b += "        " + declare(c, "s") + " sa = p3a;\n";
    b += "        for (int o = 1; o < 32; o <<= 1) {\n          " + declare(c, "y") +
         " ya = __shfl_up_sync(0xffffffffu, sa, o);\n          if (lane >= o) { " + combine(c, "y", "s") +
         " sa = ya; }\n        }\n";
    b += "        " + declare(c, "e") + "\n        { const double y = __shfl_up_sync(0xffffffffu, sa, 1); if (lane > 0) ea = y; }\n";
    b += "        " + declare(c, "r") + " ra = ca; " + combine(c, "r", "e") + "\n";
    b += "        float4 o;\n";
    for (int j = 0; j < 4; ++j) {
      const std::string pj = "p" + std::to_string(j);
      b += "        { " + declare(c, "q") + " qa = ra; " + combine(c, "q", pj) + " o." + part[j] + " = " +
           result(c, "q", needs) + "; }\n";
    }
    b += "        if (in" + us + ") *(float4*)(out + oo + " + i + ") = o;\n";
    // The new carry: the carry and every lane's total (lane 31's inclusive scan).
    b += "        { const double tot = __shfl_sync(0xffffffffu, sa, 31); " + declare(c, "n") + " na = tot; " +
         combine(c, "c", "n") + " }\n";
    b += "      }\n";
  }
  b += "    }\n    return;\n  }\n";
  return b;
}

}  // namespace scan_detail

/// The CUDA unit of scan `c`, kernel named `name`: a warp per row, 256 threads a block.
inline ScanSource generate_cuda_scan(const sched::ScanCall& c, const std::string& name) {
  using namespace scan_detail;
  c_family::PreludeNeeds needs;
  ScanSource out;
  out.entry = name;
  const auto [len, rows] = extents(c);
  out.rows = rows;
  out.threads = rows * 32;
  constexpr int kSteps = 4;  // 32-element steps whose loads are issued together (8 measured no faster on an H200)
  const std::string st = c_family::stype(c.in), ot = c_family::stype(c.out), ct = ctype_of(c.in);
  const std::string xs = std::to_string(c.src.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  const std::string os = std::to_string(c.result.strides[static_cast<std::size_t>(c.axis)]) + "LL";
  std::string body = "extern \"C\" __global__ void __launch_bounds__(256) " + name + "(kiln_scan_args a) {\n";
  body += "  const " + st + "* __restrict__ src = (const " + st + "*)a.p[0];\n";
  body += "  " + ot + "* __restrict__ out = (" + ot + "*)a.p[1];\n";
  body += "  const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;\n";
  body += "  const int lane = threadIdx.x & 31;\n";
  body += "  if (row >= " + std::to_string(rows) + "LL) return;  // whole warps\n";
  body += row_offsets(c, "row", "  ");
  body += "  " + declare(c, "c") + "  // the carry: every step before\n";
  if (quad_lanes(c)) body += quad_loop(c, len, needs);
  body += "  for (long long base = 0; base < " + std::to_string(len) + "LL; base += " + std::to_string(32 * kSteps) +
          "LL) {\n";
  for (int u = 0; u < kSteps; ++u) {
    const std::string i = "(base + " + std::to_string(32 * u) + "LL + lane)";
    body += "    const bool in" + std::to_string(u) + " = " + i + " < " + std::to_string(len) + "LL;\n";
    body += "    const " + ct + " x" + std::to_string(u) + " = in" + std::to_string(u) + " ? " +
            c_family::from_storage("src[xo + " + i + " * " + xs + "]", c.in, needs) + " : (" + ct + ")0;\n";
  }
  for (int u = 0; u < kSteps; ++u) {
    const std::string us = std::to_string(u), i = "(base + " + std::to_string(32 * u) + "LL + lane)";
    body += "    {\n      " + declare(c, "s") + "\n      if (in" + us + ") { " + element(c, "s", "x" + us, i) + " }\n";
    // Inclusive scan across the warp (Hillis-Steele, every lane shuffling).
    body += "      for (int o = 1; o < 32; o <<= 1) {\n        const int from = lane >= o ? lane - o : lane;\n";
    body += "        " + declare(c, "y") + "\n";
    if (floating_kind(c))
      body += "        ya = __shfl_sync(0xffffffffu, sa, from);\n";
    else if (!select_kind(c))
      body += "        yi = __shfl_sync(0xffffffffu, si, from);\n";
    else
      body += "        yv = " + shfl_value(c, "sv", "from") + "; yk = __shfl_sync(0xffffffffu, sk, from); yok = "
              "__shfl_sync(0xffffffffu, (int)sok, from) != 0;\n";
    body += "        if (lane >= o) { " + combine(c, "y", "s") + " " +
            (floating_kind(c) ? std::string("sa = ya;") : !select_kind(c) ? std::string("si = yi;") : "sv = yv; sk = yk; sok = yok;") +
            " }\n      }\n";
    // The carry before this step, then this lane's prefix.
    body += "      " + declare(c, "r") + "\n      " +
            (floating_kind(c) ? std::string("ra = ca;") : !select_kind(c) ? std::string("ri = ci;") : "rv = cv; rk = ck; rok = cok;") + "\n";
    body += "      " + combine(c, "r", "s") + "\n";
    body += "      if (in" + us + ") out[oo + " + i + " * " + os + "] = " + result(c, "r", needs) + ";\n";
    // The new carry: the last lane's prefix (lanes past the end hold the empty element).
    if (floating_kind(c))
      body += "      ca = __shfl_sync(0xffffffffu, ra, 31);\n";
    else if (!select_kind(c))
      body += "      ci = __shfl_sync(0xffffffffu, ri, 31);\n";
    else
      body += "      cv = " + shfl_value(c, "rv", "31") + "; ck = __shfl_sync(0xffffffffu, rk, 31); cok = "
              "__shfl_sync(0xffffffffu, (int)rok, 31) != 0;\n";
    body += "    }\n";
  }
  body += "  }\n}\n";
  std::string& src = out.source;
  src = "// kiln generated scan\nstruct kiln_scan_args { void* p[2]; };\n";
  src += cuda_detail::kCudaBase;
  src += "#define KILN_SCAN_INF KILN_INF_D\n";
  if (needs.half) src += cuda_detail::kCudaHalf;
  if (needs.bf16) src += cuda_detail::kCudaBf16;
  src += body;
  return out;
}

}  // namespace kiln::codegen

KILN_COLD_CODE_END
