// The C++/OpenMP generator: what the generated source looks like (entries, baked constants,
// lean prelude, parallel only when worth it, vectorisable loops) and its bit-exact f16/bf16
// conversions. Running the kernels is tested in tests/backend/test_cpu_jit.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <tuple>
#include <regex>
#include <set>
#include <string>
#include <unistd.h>

#include "kiln/codegen/cpp.hpp"
#include "kiln/codegen/scan.hpp"
#include "kiln/codegen/sort.hpp"
#include "kiln/core/half.hpp"
#include "kiln/ir/builder.hpp"
#include "kiln/runtime/cpu_module.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/runtime/process.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln_test_codegen_cpp {

using namespace kiln;
using ir::NodePtr;
using ir::Op;

namespace {

NodePtr leaf(const Shape& shape, DType dt = f32) {
  auto st = runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(1, shape.numel())) * itemsize(dt));
  return ir::input(ir::BufferView{st, 0, contiguous_strides(shape)}, shape, dt, Device::cpu());
}
NodePtr cst(double v, const NodePtr& like) { return ir::constant(v, like->dtype, like->shape, Device::cpu()); }
NodePtr bin(Op op, const NodePtr& a, const NodePtr& b) { return ir::binary(op, a, b); }
NodePtr red(Op op, const NodePtr& a, std::vector<std::int64_t> axes) { return ir::reduce(op, a, std::move(axes)); }
NodePtr softmax(const NodePtr& x) {
  NodePtr e = ir::unary(Op::Exp, bin(Op::Sub, x, ir::broadcast(red(Op::ReduceMax, x, {1}), x->shape)));
  return bin(Op::Div, e, ir::broadcast(red(Op::ReduceSum, e, {1}), x->shape));
}

codegen::CppSource generate(const std::vector<NodePtr>& roots, const std::string& prefix = "kt") {
  ir::Captured c = ir::capture(roots, Device::cpu());
  return codegen::generate_cpp(c.graph, sched::schedule(c.graph), prefix);
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("codegen: one extern \"C\" entry per kernel, one translation unit per graph") {
  NodePtr x = leaf({64, 32}), v = leaf({7});
  codegen::CppSource src = generate({softmax(x), bin(Op::Add, v, v), red(Op::ReduceSum, x, {0})}, "kiln_test");
  CHECK(src.entries.size() == 3);
  for (std::size_t k = 0; k < src.entries.size(); ++k) {
    CHECK(src.entries[k] == "kiln_test_" + std::to_string(k));
    CHECK(has(src.source, "extern \"C\" void " + src.entries[k] + "(void* const* args, int nth)"));
  }
  CHECK(count(src.source, "extern \"C\" void") == 3);
}

TEST_CASE("codegen: sizes and strides are constants; the prelude is lean") {
  NodePtr x = leaf({48, 40});
  std::string s = generate({bin(Op::Mul, x, cst(0.1, x))}).source;
  CHECK(has(s, "1920LL"));  // the two dims of a dense tensor are walked as one
  // The constant is an exact literal of the float the reference uses.
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(0.1f));
  CHECK(has(s, std::string(buf).substr(0, 6)));
  for (const char* heavy : {"#include <cmath>", "#include <algorithm>", "#include <vector>", "#include <math.h>"})
    CHECK(!has(s, heavy));
  CHECK(!has(s, "kiln_f2h"));            // 16-bit helpers only when a 16-bit dtype appears
  CHECK(!has(s, "kiln_exp_f32(float"));  // the math prelude only when a transcendental op appears
  std::string h = generate({bin(Op::Add, leaf({8}, f16), leaf({8}, f16))}).source;
  CHECK(has(h, "kiln_f2h"));
  CHECK(has(h, "kiln_rh("));  // f16 arithmetic is rounded once per op
  CHECK(has(generate({ir::unary(Op::Exp, x)}).source, "kiln_exp_f32(float"));
  // Random numbers (Philox, Box-Muller's sqrt, log and cos) need no <math.h> either.
  std::string r = generate({ir::random(Shape{48, 40}, 7, /*normal*/ 1, f32, Device::cpu())}).source;
  CHECK(has(r, "normal_f32("));
  for (const char* heavy : {"#include <cmath>", "#include <math.h>"}) CHECK(!has(r, heavy));
}

TEST_CASE("codegen: scan and sort units declare the C functions they call instead of including headers") {
  // <math.h>, <stdlib.h> and <string.h> cost a small unit about a third of its compile time.
  sched::ScanCall scan;
  scan.shape = Shape{4, 9};
  scan.axis = 1;
  scan.kind = ir::ScanKind::LogSumExp;
  scan.src = sched::Slot{sched::Slot::Leaf, 0, {9, 1}};
  scan.result = sched::Slot{sched::Slot::Output, 0, {9, 1}};
  sched::SortCall sort;
  sort.shape = Shape{4, 9};
  sort.axis = 1;
  sort.k = 3;
  sort.src = sched::Slot{sched::Slot::Leaf, 0, {9, 1}};
  sort.result = sched::Slot{sched::Slot::Output, 0, {3, 1}};
  for (const std::string& s : {codegen::generate_cpu_scan(scan, "kiln_scan_t").source,
                               codegen::generate_cpu_sort(sort, "kiln_sort_t").source}) {
    CHECK(!has(s, "#include"));
    CHECK(has(s, "extern \"C\" {"));
  }
  CHECK(has(codegen::generate_cpu_scan(scan, "kiln_scan_t").source, "log1p("));
}

TEST_CASE("codegen: OpenMP teams only for work worth sharing") {
  CHECK(!has(generate({bin(Op::Add, leaf({100, 100}), leaf({100, 100}))}).source, "omp parallel"));
  std::string big = generate({bin(Op::Add, leaf({300, 300}), leaf({300, 300}))}).source;
  CHECK(has(big, "#pragma omp parallel num_threads(nth)"));  // the kernel's entry opens the team
  CHECK(has(big, "#pragma omp for"));                        // its body shares the loop (orphaned)
  CHECK(!has(generate({softmax(leaf({16, 256}))}).source, "omp parallel"));
  CHECK(has(generate({softmax(leaf({256, 256}))}).source, "#pragma omp for schedule(static) nowait"));
}

TEST_CASE("codegen: reductions split across lanes, accumulate floats in double, keep NaN") {
  std::string s = generate({red(Op::ReduceSum, leaf({64, 512}), {1}), red(Op::ReduceMax, leaf({64, 512}), {1})}).source;
  CHECK(has(s, "#pragma omp simd reduction(+:"));
  CHECK(has(s, "double a"));
  CHECK(has(s, "reduction(max:"));
  CHECK(has(s, "reduction(|:"));  // the NaN flag of max
}

TEST_CASE("codegen: softmax keeps exp(x - max) of its second pass in a row cache") {
  std::string s = generate({softmax(leaf({64, 512}))}).source;
  // One exp per element (x - max(x) <= 0: the variant without the overflow clamp).
  CHECK(count(s, "kiln_exp_nonpos_f32(v") == 1);
  CHECK(count(s, "kiln_exp_f32(v") == 0);
  CHECK(has(s, "stash0["));
}

TEST_CASE("codegen: a large output's rows are streamed from the last pass 64 bytes at a time") {
  // 16 MiB of f32 (and of bf16): the last pass computes each chunk into a small buffer and
  // stores it around the cache; no whole-row buffer, no second loop over the row.
  for (auto [shape, dt, chunk] : {std::tuple{Shape{4096, 1024}, f32, 16}, std::tuple{Shape{8192, 1024}, bf16, 32}}) {
    NodePtr x = leaf(shape, dt);
    NodePtr y = dt == f32 ? softmax(x) : ir::cast(softmax(ir::cast(x, f32)), bf16);
    std::string s = generate({y}).source;
    INFO(s);
    CHECK(has(s, "kc += " + std::to_string(chunk) + "LL"));
    CHECK(count(s, "kiln_stream_chunk(&out0[") == 1);
    CHECK(count(s, "kiln_stream_row(&") == 0);
    CHECK(has(s, "kiln_stream_fence();"));
    // The stores are the compiler's builtins, not <immintrin.h> (60 000 lines with
    // -march=native: four fifths of such a unit's compile time).
    CHECK(!has(s, "#include <immintrin.h>"));
  }
  // Below the threshold rows are stored in place.
  std::string small = generate({softmax(leaf({64, 512}))}).source;
  CHECK(count(small, "kiln_stream_chunk(") == 0);
}

TEST_CASE("codegen: the inner loops of fused kernels vectorise (GCC without -ffast-math)") {
  const runtime::CxxCompiler* cxx = runtime::CxxCompiler::find();
  if (!cxx || cxx->version().find("clang") != std::string::npos) {
    MESSAGE("no GCC: vectorisation report skipped");
    return;
  }
  NodePtr x = leaf({128, 512}), y = leaf({128, 512}), w = leaf({512});
  NodePtr p4 = bin(Op::Add, bin(Op::Mul, x, ir::broadcast(ir::reshape(w, {1, 512}), x->shape)), y);
  NodePtr ms = red(Op::ReduceSum, bin(Op::Mul, x, x), {1});
  NodePtr rms = bin(Op::Mul, x, ir::broadcast(ir::unary(Op::Rsqrt, bin(Op::Add, ms, cst(1e-6, ms))), x->shape));
  for (auto roots : {std::vector<NodePtr>{p4}, std::vector<NodePtr>{softmax(x)}, std::vector<NodePtr>{rms},
                     std::vector<NodePtr>{red(Op::ReduceSum, x, {0})},
                     std::vector<NodePtr>{ir::cast(softmax(ir::cast(leaf({128, 512}, bf16), f32)), bf16)},
                     // A 16 MiB output: its rows are streamed, the last pass 64 bytes at a time.
                     std::vector<NodePtr>{softmax(leaf({4096, 1024}))}}) {
    std::string src = generate(roots).source;
    std::string path = "/tmp/kiln-vec-" + std::to_string(::getpid()) + ".cpp";
    { std::ofstream(path) << src; }
    std::vector<std::string> argv = cxx->command();
    for (auto& f : cxx->flags()) argv.push_back(f);
    argv.insert(argv.end(), {"-fopt-info-vec-optimized", "-c", path, "-o", "/dev/null"});
    runtime::ProcessResult r = runtime::run_process(argv);
    ::unlink(path.c_str());
    REQUIRE(r.exit_code == 0);
    // Every `omp simd` loop is reported vectorised (GCC names a line inside the loop).
    std::set<int> vectorised;
    std::regex re(":([0-9]+):[0-9]+: optimized: loop vectorized");
    for (std::sregex_iterator it(r.output.begin(), r.output.end(), re), end; it != end; ++it)
      vectorised.insert(std::stoi((*it)[1]));
    std::vector<std::string> lines;
    for (std::size_t pos = 0; pos <= src.size();) {
      std::size_t nl = src.find('\n', pos);
      if (nl == std::string::npos) nl = src.size();
      lines.push_back(src.substr(pos, nl - pos));
      pos = nl + 1;
    }
    int simd_loops = 0;
    for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
      if (lines[i].find("#pragma omp") == std::string::npos || lines[i].find("simd") == std::string::npos) continue;
      if (lines[i].find("declare simd") != std::string::npos) continue;  // a function's vector variants, not a loop
      ++simd_loops;
      // The loop runs from the `for` line to the brace closing it at the same indentation.
      const std::size_t indent = lines[i + 1].find_first_not_of(' ');
      std::size_t last = i + 1;
      while (last + 1 < lines.size() && lines[last] != std::string(indent, ' ') + "}") ++last;
      bool ok = vectorised.lower_bound(static_cast<int>(i + 2)) != vectorised.end() &&
                *vectorised.lower_bound(static_cast<int>(i + 2)) <= static_cast<int>(last + 1);
      INFO(src);
      INFO(r.output);
      CHECK_MESSAGE(ok, "loop at line " << i + 2 << " not vectorised");
    }
    CHECK(simd_loops > 0);
  }
}

TEST_CASE("codegen: generated f16/bf16 conversions are bit-exact with kiln::Half / kiln::BFloat16") {
  if (!runtime::CxxCompiler::find()) {
    MESSAGE("no compiler: conversion check skipped");
    return;
  }
  std::string src = std::string(codegen::detail::kHalfHelpers) + codegen::detail::kBf16Helpers + R"(
extern "C" void conv(const float* f, unsigned short* h, unsigned short* b, long n) {
  #pragma omp simd
  for (long i = 0; i < n; ++i) { h[i] = kiln_f2h(f[i]); b[i] = kiln_f2b(f[i]); }
}
extern "C" void back(const unsigned short* h, float* fh, float* fb, long n) {
  #pragma omp simd
  for (long i = 0; i < n; ++i) { fh[i] = kiln_h2f(h[i]); fb[i] = kiln_b2f(h[i]); }
}
)";
  auto lib = runtime::CpuModuleCache::instance().get(src);
  auto conv = reinterpret_cast<void (*)(const float*, unsigned short*, unsigned short*, long)>(lib->symbol("conv"));
  auto back = reinterpret_cast<void (*)(const unsigned short*, float*, float*, long)>(lib->symbol("back"));
  // Every 16-bit pattern back to float.
  std::vector<unsigned short> all(65536);
  for (int i = 0; i < 65536; ++i) all[static_cast<std::size_t>(i)] = static_cast<unsigned short>(i);
  std::vector<float> fh(65536), fb(65536);
  back(all.data(), fh.data(), fb.data(), 65536);
  int bad = 0;
  for (int i = 0; i < 65536; ++i) {
    float eh = static_cast<float>(Half::from_bits(static_cast<std::uint16_t>(i)));
    float eb = static_cast<float>(BFloat16::from_bits(static_cast<std::uint16_t>(i)));
    bad += std::memcmp(&eh, &fh[static_cast<std::size_t>(i)], 4) != 0;
    bad += std::memcmp(&eb, &fb[static_cast<std::size_t>(i)], 4) != 0;
  }
  CHECK(bad == 0);
  // Floats: every 4099th bit pattern (all exponents, NaNs, infinities, subnormals, ties).
  std::vector<float> fs;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) {
    std::uint32_t b = static_cast<std::uint32_t>(u);
    float f;
    std::memcpy(&f, &b, 4);
    fs.push_back(f);
  }
  for (float f :
       {65504.0f, 65519.99f, 65520.0f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1.0f + 1.0f / 2048, -0.0f})
    fs.push_back(f);
  std::vector<unsigned short> h(fs.size()), b(fs.size());
  conv(fs.data(), h.data(), b.data(), static_cast<long>(fs.size()));
  for (std::size_t i = 0; i < fs.size(); ++i) {
    bad += h[i] != Half(fs[i]).bits;
    bad += b[i] != BFloat16(fs[i]).bits;
  }
  CHECK(bad == 0);
}

}  // namespace kiln_test_codegen_cpp
