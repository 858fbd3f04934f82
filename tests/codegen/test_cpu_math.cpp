// kiln's vectorisable math prelude (kiln/codegen/cpp/math.hpp): compile it the way generated
// kernels are compiled (-O3 -march=native -fno-math-errno, no -ffast-math), check that every map loop
// vectorised, then sweep the float domain against double libm and assert the documented
// max-ulp bounds (docs/performance-math.md) and libm's special values.
#include <doctest/doctest.h>

#include "kiln/codegen/cpp/math.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace kiln_test_codegen_cpu_math {

namespace {

namespace fs = std::filesystem;

using MapF32 = void (*)(const float*, float*, long);
using MapF64 = void (*)(const double*, double*, long);
using Map2F32 = void (*)(const float*, const float*, float*, long);

const char* const kFunctions[] = {"exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "erf",
                                  "sin", "cos",  "tan",   "sigmoid", "atan", "asin", "acos"};
constexpr int kNumFunctions = 15;

std::string compiler() {
  const char* cxx = std::getenv("KILN_CXX");
  return cxx && *cxx ? cxx : "c++";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool compiler_is_gcc() {
  // -fopt-info is GCC's; clang would reject it.
  FILE* p = ::popen((shell_quote(compiler()) + " --version 2>/dev/null").c_str(), "r");
  if (!p) return false;
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  return out.find("clang") == std::string::npos && !out.empty();
}

// One throwaway shared library: the prelude plus an extern "C" map loop per function, compiled
// the way the code generator compiles kernels (no -ffast-math).
class MathLib {
 public:
  MathLib(const std::string& tag, bool with_f32, const std::string& extra_flags) {
    std::string tmpl = (fs::temp_directory_path() / ("kiln_cpu_math_" + tag + "_XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) return;
    dir_ = tmpl;
    std::ostringstream src;
    src << kiln::codegen::kCpuMathSource;
    int line = 1;
    for (const char* c = kiln::codegen::kCpuMathSource; *c; ++c) line += *c == '\n';
    for (int i = 0; i < kNumFunctions; ++i) {
      for (int f32 = with_f32 ? 1 : 0; f32 >= 0; --f32) {
        const char* t = f32 ? "float" : "double";
        const char* s = f32 ? "f32" : "f64";
        src << "extern \"C\" void kiln_test_map_" << kFunctions[i] << "_" << s << "(const " << t << "* x, " << t
            << "* y, long n) {\n#pragma omp simd\n";
        loop_lines_.push_back({std::string(kFunctions[i]) + "_" + s, line + 2});
        src << "  for (long i = 0; i < n; ++i) y[i] = kiln_" << kFunctions[i] << "_" << s << "(x[i]);\n}\n";
        line += 4;
      }
    }
    // The two-operand functions (atan2(y, x), hypot(x, y)): map2 loops over two inputs.
    for (const char* fn : {"atan2", "hypot", "fmod"}) {
      for (int f32 = with_f32 ? 1 : 0; f32 >= 0; --f32) {
        const char* t = f32 ? "float" : "double";
        const char* s = f32 ? "f32" : "f64";
        src << "extern \"C\" void kiln_test_map_" << fn << "_" << s << "(const " << t << "* a, const " << t << "* b, "
            << t << "* y, long n) {\n#pragma omp simd\n";
        loop_lines_.push_back({std::string(fn) + "_" + s, line + 2});
        src << "  for (long i = 0; i < n; ++i) y[i] = kiln_" << fn << "_" << s << "(a[i], b[i]);\n}\n";
        line += 4;
      }
    }
    // Compositions as the code generator will emit them: results consumed by more arithmetic
    // (the case where `?:` selects stopped GCC from vectorising), nested calls, a chain.
    if (with_f32) {
      const std::pair<const char*, const char*> composites[] = {
          {"gelu",
           "float v = x[i]; y[i] = 0.5f * v * (1.0f + kiln_tanh_f32(0.7978845608f * (v + 0.044715f * v * v * v)));"},
          {"softmax_exp", "y[i] = kiln_exp_f32(x[i] - 3.0f) * 0.25f;"},
          {"exp_nonpos", "y[i] = kiln_exp_nonpos_f32(x[i]);"},
          {"log_sigmoid", "y[i] = kiln_log_f32(x[i]) * 0.5f + kiln_sigmoid_f32(x[i]) - kiln_erf_f32(x[i]);"},
          // written out, as the generator emits chains (GCC does not vectorise an outer loop
          // whose inner loop calls a vector variant)
          {"sin_chain",
           "float v = x[i]; v = kiln_sin_f32(v) * 1.01f + 0.5f; v = kiln_sin_f32(v) * 1.01f + 0.5f; "
           "v = kiln_sin_f32(v) * 1.01f + 0.5f; y[i] = kiln_sin_f32(v) * 1.01f + 0.5f;"},
      };
      for (const auto& [name, body] : composites) {
        src << "extern \"C\" void kiln_test_composite_" << name
            << "(const float* x, float* y, long n) {\n#pragma omp simd\n";
        loop_lines_.push_back({std::string("composite_") + name + "_f32", line + 2});
        src << "  for (long i = 0; i < n; ++i) { " << body << " }\n}\n";
        line += 4;
      }
    }
    std::ofstream(dir_ / "math.cpp") << src.str();
    gcc_ = compiler_is_gcc();
    std::string cmd = shell_quote(compiler()) + " -std=c++17 -O3 -march=native -fPIC -shared -fopenmp-simd -fno-math-errno " +
                      (gcc_ ? "-fopt-info-vec-optimized=" + shell_quote((dir_ / "vec.txt").string()) + " " : "") +
                      extra_flags + " " + shell_quote((dir_ / "math.cpp").string()) + " -o " +
                      shell_quote((dir_ / "math.so").string()) + " -lm > " + shell_quote((dir_ / "log.txt").string()) +
                      " 2>&1";
    compiled_ = std::system(cmd.c_str()) == 0;
    log_ = read_file(dir_ / "log.txt");
    if (!compiled_) return;
    handle_ = ::dlopen((dir_ / "math.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) log_ += ::dlerror();
  }
  ~MathLib() {
    if (handle_) ::dlclose(handle_);
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  MathLib(const MathLib&) = delete;
  MathLib& operator=(const MathLib&) = delete;

  bool ok() const { return handle_ != nullptr; }
  bool gcc() const { return gcc_; }
  const std::string& log() const { return log_; }
  MapF32 f32(const std::string& fn) const { return reinterpret_cast<MapF32>(sym(fn + "_f32")); }
  MapF64 f64(const std::string& fn) const { return reinterpret_cast<MapF64>(sym(fn + "_f64")); }
  Map2F32 f32_2(const std::string& fn) const { return reinterpret_cast<Map2F32>(sym(fn + "_f32")); }
  MapF32 composite(const std::string& name) const {
    return handle_ ? reinterpret_cast<MapF32>(::dlsym(handle_, ("kiln_test_composite_" + name).c_str())) : nullptr;
  }
  std::string vec_report() const { return read_file(dir_ / "vec.txt"); }
  const std::vector<std::pair<std::string, int>>& loop_lines() const { return loop_lines_; }

 private:
  void* sym(const std::string& name) const {
    return handle_ ? ::dlsym(handle_, ("kiln_test_map_" + name).c_str()) : nullptr;
  }
  fs::path dir_;
  void* handle_ = nullptr;
  bool compiled_ = false, gcc_ = false;
  std::string log_;
  std::vector<std::pair<std::string, int>> loop_lines_;
};

const MathLib& plain_lib() {
  static MathLib lib("plain", true, "");
  return lib;
}

// Whether GCC's -fopt-info-vec report has "math.cpp:LINE:COL: optimized: loop vectorized".
bool loop_vectorised(const std::string& report, int line) {
  const std::string needle = "math.cpp:" + std::to_string(line) + ":";
  std::istringstream in(report);
  for (std::string l; std::getline(in, l);)
    if (l.find(needle) != std::string::npos && l.find("loop vectorized") != std::string::npos) return true;
  return false;
}

float f32_from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The references: libm in double for the float functions, long double for the double ones.
// sigmoid in the form that neither overflows nor flushes the negative tail to 0.
double sigmoid_f64(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }
long double sigmoid_f80(long double x) {
  return x >= 0 ? 1.0L / (1.0L + std::exp(-x)) : std::exp(x) / (1.0L + std::exp(x));
}

using RefF64 = double (*)(double);
using RefF80 = long double (*)(long double);

RefF64 ref_f64(const std::string& fn) {
  if (fn == "exp") return [](double x) { return std::exp(x); };
  if (fn == "exp2") return [](double x) { return std::exp2(x); };
  if (fn == "expm1") return [](double x) { return std::expm1(x); };
  if (fn == "log") return [](double x) { return std::log(x); };
  if (fn == "log2") return [](double x) { return std::log2(x); };
  if (fn == "log1p") return [](double x) { return std::log1p(x); };
  if (fn == "tanh") return [](double x) { return std::tanh(x); };
  if (fn == "erf") return [](double x) { return std::erf(x); };
  if (fn == "sin") return [](double x) { return std::sin(x); };
  if (fn == "cos") return [](double x) { return std::cos(x); };
  if (fn == "tan") return [](double x) { return std::tan(x); };
  if (fn == "atan") return [](double x) { return std::atan(x); };
  if (fn == "asin") return [](double x) { return std::asin(x); };
  if (fn == "acos") return [](double x) { return std::acos(x); };
  return sigmoid_f64;
}

RefF80 ref_f80(const std::string& fn) {
  if (fn == "exp") return [](long double x) { return std::exp(x); };
  if (fn == "exp2") return [](long double x) { return std::exp2(x); };
  if (fn == "expm1") return [](long double x) { return std::expm1(x); };
  if (fn == "log") return [](long double x) { return std::log(x); };
  if (fn == "log2") return [](long double x) { return std::log2(x); };
  if (fn == "log1p") return [](long double x) { return std::log1p(x); };
  if (fn == "tanh") return [](long double x) { return std::tanh(x); };
  if (fn == "erf") return [](long double x) { return std::erf(x); };
  if (fn == "sin") return [](long double x) { return std::sin(x); };
  if (fn == "cos") return [](long double x) { return std::cos(x); };
  if (fn == "tan") return [](long double x) { return std::tan(x); };
  if (fn == "atan") return [](long double x) { return std::atan(x); };
  if (fn == "asin") return [](long double x) { return std::asin(x); };
  if (fn == "acos") return [](long double x) { return std::acos(x); };
  return sigmoid_f80;
}

// Error of a float result in units of the float ulp at the exact value (subnormal ulp below
// FLT_MIN); infinite when NaN-ness or an infinity disagrees.
double ulp_error_f32(float y, double ref) {
  constexpr double kBad = std::numeric_limits<double>::infinity();
  if (std::isnan(ref)) return std::isnan(y) ? 0.0 : kBad;
  if (std::isnan(y)) return kBad;
  float rf = static_cast<float>(ref);
  if (std::isinf(rf) || std::isinf(y)) return y == rf ? 0.0 : kBad;
  int e = ref == 0.0 ? -126 : std::ilogb(ref);
  if (e < -126) e = -126;
  return std::fabs(static_cast<double>(y) - ref) / std::ldexp(1.0, e - 23);
}

double ulp_error_f64(double y, long double ref) {
  constexpr double kBad = std::numeric_limits<double>::infinity();
  if (std::isnan(ref)) return std::isnan(y) ? 0.0 : kBad;
  if (std::isnan(y)) return kBad;
  double rd = static_cast<double>(ref);
  if (std::isinf(rd) || std::isinf(y)) return y == rd ? 0.0 : kBad;
  int e = ref == 0.0L ? -1022 : std::ilogb(ref);
  if (e < -1022) e = -1022;
  return static_cast<double>(std::fabs(static_cast<long double>(y) - ref) / std::ldexp(1.0L, e - 52));
}

struct Sweep {
  double max_ulp = 0;
  float worst_x = 0;
};

// Every `stride`-th float bit pattern with magnitude in [lo, hi], both signs, plus 2^19
// evenly spaced points of [-dense, dense] (the domain that matters most in practice).
std::vector<float> sweep_inputs(float lo, float hi, std::uint32_t stride, float dense) {
  std::vector<float> xs;
  std::uint32_t a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  for (std::uint64_t u = a; u <= b; u += stride) {
    xs.push_back(f32_from_bits(static_cast<std::uint32_t>(u)));
    xs.push_back(f32_from_bits(static_cast<std::uint32_t>(u) | 0x80000000u));
  }
  const int n = 1 << 19;
  for (int i = 0; i <= n; ++i) xs.push_back(-dense + 2.0f * dense * static_cast<float>(i) / n);
  return xs;
}

Sweep measure_f32(MapF32 f, const std::string& fn, const std::vector<float>& xs) {
  std::vector<float> ys(xs.size());
  f(xs.data(), ys.data(), static_cast<long>(xs.size()));
  Sweep s;
  const RefF64 ref = ref_f64(fn);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    double e = ulp_error_f32(ys[i], ref(xs[i]));
    if (e > s.max_ulp) {
      s.max_ulp = e;
      s.worst_x = xs[i];
    }
  }
  return s;
}

float call_f32(const std::string& fn, float x) {
  float y;
  plain_lib().f32(fn)(&x, &y, 1);
  return y;
}

// Exact equality that also distinguishes -0 from +0 and accepts any NaN for NaN.
bool same_f32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

struct Special {
  const char* fn;
  float x;
  float expected;
};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kMax = std::numeric_limits<float>::max();

const Special kSpecials[] = {
    {"exp", kInf, kInf},
    {"exp", -kInf, 0.0f},
    {"exp", 0.0f, 1.0f},
    {"exp", -0.0f, 1.0f},
    {"exp", 89.0f, kInf},
    {"exp", 88.8f, kInf},
    {"exp", kMax, kInf},
    {"exp", -104.0f, 0.0f},
    {"exp", -200.0f, 0.0f},
    {"exp", -kMax, 0.0f},
    {"exp2", kInf, kInf},
    {"exp2", -kInf, 0.0f},
    {"exp2", -0.0f, 1.0f},
    {"exp2", 128.0f, kInf},
    {"exp2", 127.0f, 0x1p127f},
    {"exp2", 10.0f, 1024.0f},
    {"exp2", -126.0f, 0x1p-126f},
    {"exp2", -149.0f, 0x1p-149f},
    {"exp2", -150.0f, 0.0f},
    {"exp2", -1000.0f, 0.0f},
    {"expm1", kInf, kInf},
    {"expm1", -kInf, -1.0f},
    {"expm1", 0.0f, 0.0f},
    {"expm1", -0.0f, -0.0f},
    {"expm1", 89.0f, kInf},
    {"expm1", -30.0f, -1.0f},
    {"expm1", -kMax, -1.0f},
    {"expm1", 1e-30f, 1e-30f},
    {"expm1", -0x1p-149f, -0x1p-149f},
    {"log", kInf, kInf},
    {"log", -kInf, kNaN},
    {"log", 0.0f, -kInf},
    {"log", -0.0f, -kInf},
    {"log", -1.0f, kNaN},
    {"log", -0x1p-149f, kNaN},
    {"log", 1.0f, 0.0f},
    {"log2", kInf, kInf},
    {"log2", 0.0f, -kInf},
    {"log2", -0.0f, -kInf},
    {"log2", -2.0f, kNaN},
    {"log2", 1.0f, 0.0f},
    {"log2", 1024.0f, 10.0f},
    {"log2", 0x1p127f, 127.0f},
    {"log2", 0x1p-126f, -126.0f},
    {"log2", 0x1p-149f, -149.0f},
    {"log2", 0x1p-140f, -140.0f},
    {"log1p", kInf, kInf},
    {"log1p", -kInf, kNaN},
    {"log1p", -1.0f, -kInf},
    {"log1p", -2.0f, kNaN},
    {"log1p", 0.0f, 0.0f},
    {"log1p", -0.0f, -0.0f},
    {"log1p", 1e-30f, 1e-30f},
    {"log1p", -0x1p-149f, -0x1p-149f},
    {"tanh", kInf, 1.0f},
    {"tanh", -kInf, -1.0f},
    {"tanh", 0.0f, 0.0f},
    {"tanh", -0.0f, -0.0f},
    {"tanh", 20.0f, 1.0f},
    {"tanh", -kMax, -1.0f},
    {"tanh", 1e-30f, 1e-30f},
    {"tanh", -0x1p-149f, -0x1p-149f},
    // 1 - 3.75e-8 rounds to the float below 1, not to 1 = tanh(FLT_MAX) (a near-tie that moved
    // cummin's index in the fuzzer), and up to 9.01 every result is the float below 1
    {"tanh", 8.897175f, 0x1.fffffep-1f},
    {"tanh", -9.0f, -0x1.fffffep-1f},
    {"erf", kInf, 1.0f},
    {"erf", -kInf, -1.0f},
    {"erf", 0.0f, 0.0f},
    {"erf", -0.0f, -0.0f},
    {"erf", 5.0f, 1.0f},
    {"erf", -kMax, -1.0f},
    {"sin", kInf, kNaN},
    {"sin", -kInf, kNaN},
    {"sin", 0.0f, 0.0f},
    {"sin", -0.0f, -0.0f},
    {"sin", 1e-30f, 1e-30f},
    {"sin", -0x1p-149f, -0x1p-149f},
    {"cos", kInf, kNaN},
    {"cos", -kInf, kNaN},
    {"cos", 0.0f, 1.0f},
    {"cos", -0.0f, 1.0f},
    {"cos", 1e-30f, 1.0f},
    {"atan", kInf, 0x1.921fb6p+0f},
    {"atan", -kInf, -0x1.921fb6p+0f},
    {"atan", 0.0f, 0.0f},
    {"atan", -0.0f, -0.0f},
    {"atan", 1.0f, 0x1.921fb6p-1f},
    {"atan", 1e-30f, 1e-30f},
    {"asin", 1.0f, 0x1.921fb6p+0f},
    {"asin", -1.0f, -0x1.921fb6p+0f},
    {"asin", -0.0f, -0.0f},
    {"asin", 1.5f, kNaN},
    {"asin", kInf, kNaN},
    {"acos", 1.0f, 0.0f},
    {"acos", -1.0f, 0x1.921fb6p+1f},
    {"acos", 0.0f, 0x1.921fb6p+0f},
    {"acos", -1.5f, kNaN},
    {"acos", -kInf, kNaN},
    {"tan", kInf, kNaN},
    {"tan", -kInf, kNaN},
    {"tan", 0.0f, 0.0f},
    {"tan", -0.0f, -0.0f},
    {"tan", -1e-30f, -1e-30f},
    {"sigmoid", kInf, 1.0f},
    {"sigmoid", -kInf, 0.0f},
    {"sigmoid", 0.0f, 0.5f},
    {"sigmoid", -0.0f, 0.5f},
    {"sigmoid", 100.0f, 1.0f},
    {"sigmoid", -200.0f, 0.0f},
};

}  // namespace

TEST_SUITE("codegen/cpu_math") {
  TEST_CASE("the math prelude compiles standalone and every map loop vectorises") {
    const MathLib& lib = plain_lib();
    INFO("compiler log:\n" << lib.log());
    REQUIRE(lib.ok());
    for (const char* fn : kFunctions) {
      CHECK(static_cast<bool>(lib.f32(fn)));
      CHECK(static_cast<bool>(lib.f64(fn)));
    }
    if (!lib.gcc()) {
      MESSAGE("compiler is not GCC: vectorisation report not checked");
      return;
    }
    // GCC reports "math.cpp:LINE:COL: optimized: loop vectorized using 32 byte vectors"; every
    // float loop must be there (double loops call libm unless KILN_CPU_MATH_LIBMVEC is set).
    const std::string report = lib.vec_report();
    for (const auto& [name, line] : lib.loop_lines()) {
      if (name.find("_f32") == std::string::npos) continue;
      INFO("loop of kiln_" << name << " at math.cpp:" << line << "\nreport:\n" << report);
      CHECK(loop_vectorised(report, line));
    }
  }

  TEST_CASE("float functions stay within their max-ulp bounds against double libm") {
    const MathLib& lib = plain_lib();
    REQUIRE(lib.ok());
    struct Bound {
      const char* fn;
      double max_ulp;
      float hi;     // sweep magnitude limit
      float dense;  // half-width of the evenly spaced sweep
    };
    // The documented bounds (docs/performance-math.md): the maxima of an exhaustive run over
    // all 2^32 floats, rounded up to 0.1 ulp. sin/cos/tan: every float (beyond 2^20 libm's
    // results, within 1 ulp: next case).
    const Bound bounds[] = {
        {"exp", 1.1, kMax, 90.0f},  {"exp2", 1.1, kMax, 130.0f}, {"expm1", 1.6, kMax, 20.0f},
        {"log", 1.0, kMax, 100.0f}, {"log2", 1.8, kMax, 100.0f}, {"log1p", 1.0, kMax, 10.0f},
        {"tanh", 2.6, kMax, 10.0f}, {"erf", 2.0, kMax, 5.0f},    {"sin", 1.7, kMax, 100.0f},
        {"cos", 1.9, kMax, 100.0f}, {"tan", 3.2, kMax, 10.0f},   {"sigmoid", 2.5, kMax, 100.0f},
        // Evaluated in double, rounded once: 0.5003 ulp over every 37th float (both signs).
        {"atan", 0.51, kMax, 10.0f}, {"asin", 0.51, 1.0f, 1.0f},  {"acos", 0.51, 1.0f, 1.0f},
    };
    for (const Bound& b : bounds) {
      const std::vector<float> xs = sweep_inputs(0.0f, b.hi, 8191, b.dense);
      Sweep s = measure_f32(lib.f32(b.fn), b.fn, xs);
      INFO("kiln_" << std::string(b.fn) << "_f32: max " << s.max_ulp << " ulp at x = " << s.worst_x << " (" << xs.size()
                   << " inputs)");
      CHECK(s.max_ulp <= b.max_ulp);
    }
  }

  TEST_CASE("atan2 and hypot stay within 0.51 ulp of double libm, special values and signs included") {
    const MathLib& lib = plain_lib();
    REQUIRE(lib.ok());
    // Random bit patterns of every magnitude (both signs), a dense square around 0, and the
    // grid of special operands against each other.
    std::vector<float> as, bs;
    std::uint32_t state = 12345;
    auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return state;
    };
    auto finite = [&] {
      std::uint32_t u = next() & 0x7fffffffu;
      if ((u & 0x7f800000u) == 0x7f800000u) u &= 0x7f7fffffu;
      return (next() & 1) ? -f32_from_bits(u) : f32_from_bits(u);
    };
    for (int i = 0; i < 400000; ++i) {
      as.push_back(finite());
      bs.push_back(finite());
    }
    for (int i = 0; i < 200000; ++i) {
      as.push_back(-4.0f + 8.0f * static_cast<float>(next() >> 8) / 16777216.0f);
      bs.push_back(-4.0f + 8.0f * static_cast<float>(next() >> 8) / 16777216.0f);
    }
    const float sp[] = {0.0f, -0.0f, 1.0f, -1.0f, kInf, -kInf, kNaN, 0x1p-149f, kMax};
    for (float a : sp)
      for (float b : sp) {
        as.push_back(a);
        bs.push_back(b);
      }
    for (const char* fn : {"atan2", "hypot"}) {
      Map2F32 f = lib.f32_2(fn);
      REQUIRE(static_cast<bool>(f));
      std::vector<float> ys(as.size());
      f(as.data(), bs.data(), ys.data(), static_cast<long>(as.size()));
      double worst = 0;
      std::size_t at = 0;
      for (std::size_t i = 0; i < as.size(); ++i) {
        const double a = as[i], b = bs[i];
        const double ref = std::string(fn) == "atan2" ? std::atan2(a, b) : std::hypot(a, b);
        double e = ulp_error_f32(ys[i], ref);
        if (!std::isnan(ref) && std::signbit(ys[i]) != std::signbit(ref)) e = std::numeric_limits<double>::infinity();
        if (e > worst) {
          worst = e;
          at = i;
        }
      }
      INFO("kiln_" << std::string(fn) << "_f32: max " << worst << " ulp at (" << as[at] << ", " << bs[at] << ")");
      CHECK(worst <= 0.51);
    }
    // fmod is exact: every bit, the sign of a zero included, NaN where libm gives NaN; also
    // over pairs of every exponent distance and quotients just below and above integers.
    for (int i = 0; i < 200000; ++i) {
      const float y = finite();
      as.push_back(y * static_cast<float>(next() % 1000) + (next() & 1 ? 0.0f : y * 0x1p-24f));
      bs.push_back(y);
    }
    Map2F32 f = lib.f32_2("fmod");
    REQUIRE(static_cast<bool>(f));
    std::vector<float> ys(as.size());
    f(as.data(), bs.data(), ys.data(), static_cast<long>(as.size()));
    std::size_t wrong = 0, first = 0;
    for (std::size_t i = 0; i < as.size(); ++i) {
      const float want = std::fmod(as[i], bs[i]);
      const bool same = std::isnan(want) ? std::isnan(ys[i]) : f32_bits(ys[i]) == f32_bits(want);
      if (!same && wrong++ == 0) first = i;
    }
    INFO("kiln_fmod_f32(" << as[first] << ", " << bs[first] << ") = " << ys[first] << ", libm "
                          << std::fmod(as[first], bs[first]));
    CHECK(wrong == 0);
  }

  TEST_CASE("float special values are libm's") {
    REQUIRE(plain_lib().ok());
    for (const char* fn : kFunctions) {
      INFO("kiln_" << std::string(fn) << "_f32(NaN)");
      CHECK(std::isnan(call_f32(fn, kNaN)));
      CHECK(std::isnan(call_f32(fn, -kNaN)));
    }
    for (const Special& s : kSpecials) {
      float y = call_f32(s.fn, s.x);
      INFO("kiln_" << std::string(s.fn) << "_f32(" << s.x << ") = " << y << ", expected " << s.expected);
      CHECK(same_f32(y, s.expected));
      // and libm agrees with the table
      CHECK(same_f32(static_cast<float>(ref_f64(s.fn)(s.x)), s.expected));
    }
    // Gradual underflow: results in the subnormal range keep their value (within 1 subnormal ulp).
    CHECK(std::fabs(call_f32("exp", -100.0f) - static_cast<float>(std::exp(-100.0))) <= 0x1p-149f);
    CHECK(call_f32("exp", -100.0f) > 0.0f);
    CHECK(call_f32("exp", -103.9f) > 0.0f);
    CHECK(std::fabs(call_f32("sigmoid", -100.0f) - static_cast<float>(std::exp(-100.0))) <= 0x1p-149f);
    CHECK(call_f32("exp2", -149.5f) == 0x1p-149f);
    // Overflow edge: the largest float whose exp is finite.
    CHECK(std::isfinite(call_f32("exp", 88.72283f)));
    CHECK(std::isinf(call_f32("exp", 88.72284f)));
  }

  TEST_CASE("exp without the overflow clamp (softmax's x - max) equals exp for every x <= 0 and NaN") {
    const MathLib& lib = plain_lib();
    REQUIRE(lib.ok());
    MapF32 nonpos = lib.composite("exp_nonpos");
    REQUIRE(static_cast<bool>(nonpos));
    std::vector<float> xs = {0.0f,    -0.0f,    -1e-30f, -0x1p-149f, -0.5f,   -1.0f,  -87.3f,    -87.4f,
                             -100.0f, -103.97f, -104.0f, -104.1f,    -200.0f, -1e30f, -INFINITY, kNaN};
    for (float x = -110.0f; x <= 0.0f; x += 0.0137f) xs.push_back(x);
    std::vector<float> got(xs.size()), want(xs.size());
    nonpos(xs.data(), got.data(), static_cast<long>(xs.size()));
    lib.f32("exp")(xs.data(), want.data(), static_cast<long>(xs.size()));
    for (std::size_t i = 0; i < xs.size(); ++i) {
      INFO("x = " << xs[i] << ": " << got[i] << " vs " << want[i]);
      CHECK(same_f32(got[i], want[i]));
    }
  }

  TEST_CASE("float sin/cos/tan: arguments beyond the fast range are reduced correctly") {
    const MathLib& lib = plain_lib();
    REQUIRE(lib.ok());
    // Beyond 2^20 the fast Cody-Waite reduction is inaccurate; those lanes are recomputed by
    // libm (Payne-Hanek), in the vectorised loop only when some lane of a vector needs it. Every
    // 997th float of [2^20, FLT_MAX] of both signs, interleaved with small arguments so that
    // vectors mix both kinds, and each huge value once more alone in a vector of small ones.
    std::vector<float> xs;
    for (std::uint32_t u = 0x49800000u; u < 0x7f800000u; u += 997) {
      xs.push_back(f32_from_bits(u));
      xs.push_back(0.5f);
      xs.push_back(f32_from_bits(u | 0x80000000u));
      xs.push_back(-2.0f);
    }
    for (float x : {1e8f, 1e30f, 3e38f, -1e20f, 0x1p20f, 0x1.000002p20f, -0x1.000002p20f, kMax, -kMax, 16777216.0f,
                    1.5e7f, 2e6f}) {
      for (int k = 0; k < 16; ++k) xs.push_back(k == 5 ? x : 0.25f * static_cast<float>(k));
    }
    std::vector<float> ys(xs.size());
    for (const char* fn : {"sin", "cos", "tan"}) {
      const RefF64 ref = ref_f64(fn);
      lib.f32(fn)(xs.data(), ys.data(), static_cast<long>(xs.size()));
      double worst = 0;
      float worst_x = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        double e = ulp_error_f32(ys[i], ref(xs[i]));
        if (e > worst) worst = e, worst_x = xs[i];
      }
      // glibc's sinf/cosf/tanf are correctly rounded but for rare cases (within 1 ulp), and the
      // small lanes of mixed vectors keep the fast path's bounds.
      INFO("kiln_" << std::string(fn) << "_f32: max " << worst << " ulp at x = " << worst_x);
      CHECK(worst <= (std::string(fn) == "tan" ? 3.2 : 1.9));
      // the huge lanes are libm's results exactly, and one element at a time (the scalar entry)
      // agrees with the vectorised loop
      bool same = true;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        if (std::fabs(xs[i]) <= 0x1p20f) continue;
        const float lm = std::string(fn) == "sin"   ? std::sin(xs[i])
                         : std::string(fn) == "cos" ? std::cos(xs[i])
                                                    : std::tan(xs[i]);
        if (!same_f32(ys[i], lm) || !same_f32(call_f32(fn, xs[i]), lm)) {
          INFO("x = " << xs[i] << ": " << ys[i] << ", libm " << lm);
          CHECK(same_f32(ys[i], lm));
          same = false;
          break;
        }
      }
      CHECK(same);
    }
    // the values a differential fuzzer flagged, against the double result
    CHECK(ulp_error_f32(call_f32("cos", 1e8f), std::cos(static_cast<double>(1e8f))) <= 1.0);    // -0.363385
    CHECK(ulp_error_f32(call_f32("cos", 1e30f), std::cos(static_cast<double>(1e30f))) <= 1.0);  // -0.611605
  }

  TEST_CASE("double functions: libm, and the sigmoid split") {
    const MathLib& lib = plain_lib();
    REQUIRE(lib.ok());
    std::vector<double> xs;
    for (std::uint64_t u = 0; u < 0x7ff0000000000000ull; u += 0x0001000000000001ull) {
      double x;
      std::memcpy(&x, &u, 8);
      xs.push_back(x);
      xs.push_back(-x);
    }
    for (double x : {0.0, -0.0, 1.0, -1.0, 710.0, -745.5, 1e300, -1e300}) xs.push_back(x);
    for (double x : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()})
      xs.push_back(x);
    std::vector<double> ys(xs.size());
    for (const char* fn : kFunctions) {
      lib.f64(fn)(xs.data(), ys.data(), static_cast<long>(xs.size()));
      const RefF64 ref = ref_f64(fn);
      const RefF80 ref_long = ref_f80(fn);
      double worst = 0;
      bool same_specials = true;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        worst = std::fmax(worst, ulp_error_f64(ys[i], ref_long(xs[i])));
        double r = ref(xs[i]);
        if (!std::isfinite(r) || r == 0.0)
          same_specials = same_specials &&
                          (std::isnan(r) ? std::isnan(ys[i]) : ys[i] == r && std::signbit(ys[i]) == std::signbit(r));
      }
      // glibc's tanh is within 2 ulp (measured 2.14 on a denser sweep), the rest within 1; the
      // sigmoid composition measures 2.27.
      INFO("kiln_" << std::string(fn) << "_f64: max " << worst << " ulp vs long double");
      CHECK(worst <= 2.5);
      CHECK(same_specials);
    }
  }

  TEST_CASE("double functions through libmvec (KILN_CPU_MATH_LIBMVEC) vectorise, within glibc's bound") {
    static MathLib lib("libmvec", false, "-DKILN_CPU_MATH_LIBMVEC -lmvec");
    if (!lib.ok()) {
      MESSAGE("libmvec not available here (glibc >= 2.35 needed); not tested:\n" << lib.log());
      return;
    }
    if (lib.gcc()) {
      const std::string report = lib.vec_report();
      for (const auto& [name, line] : lib.loop_lines()) {
        if (name == "fmod_f64") continue;  // libmvec has no fmod: libm's exact scalar one
        INFO("loop of kiln_" << name << " at math.cpp:" << line << "\nreport:\n" << report);
        CHECK(loop_vectorised(report, line));
      }
    }
    std::vector<double> xs;
    for (std::uint64_t u = 0; u < 0x7ff0000000000000ull; u += 0x0001000000000001ull) {
      double x;
      std::memcpy(&x, &u, 8);
      xs.push_back(x);
      xs.push_back(-x);
    }
    for (int i = -20000; i <= 20000; ++i) xs.push_back(i * 1e-3);
    for (double x : {0.0, -0.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()})
      xs.push_back(x);
    std::vector<double> ys(xs.size());
    for (const char* fn : kFunctions) {
      lib.f64(fn)(xs.data(), ys.data(), static_cast<long>(xs.size()));
      const RefF64 ref = ref_f64(fn);
      const RefF80 ref_long = ref_f80(fn);
      double worst = 0;
      double worst_x = 0;
      bool same_specials = true;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        double e = ulp_error_f64(ys[i], ref_long(xs[i]));
        if (e > worst) worst = e, worst_x = xs[i];
        double r = ref(xs[i]);
        if (!std::isfinite(r) || r == 0.0)
          same_specials = same_specials &&
                          (std::isnan(r) ? std::isnan(ys[i]) : ys[i] == r && std::signbit(ys[i]) == std::signbit(r));
      }
      // glibc documents <= 4 ulp for libmvec; sigmoid adds a division to exp's error.
      INFO("kiln_" << std::string(fn) << "_f64 (libmvec): max " << worst << " ulp vs long double at x = " << worst_x);
      CHECK(worst <= (std::string(fn) == "sigmoid" ? 5.0 : 4.0));
      CHECK(same_specials);
    }
  }

}  // TEST_SUITE

}  // namespace kiln_test_codegen_cpu_math
