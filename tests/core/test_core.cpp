// core/: dtypes and their properties, Half/BFloat16 conversions (checked exhaustively against
// an independent model), shapes, strides, broadcasting, axes, errors, devices, environment
// settings, log channels, hashes and stats counters. Only core headers: no tensors involved.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/half.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/stats.hpp"

namespace kiln_test_core_core {

using namespace kiln;

namespace {

const DType kAll[] = {DType::Bool,     DType::Int32,   DType::Int64,  DType::Float16,
                      DType::BFloat16, DType::Float32, DType::Float64};

/// Independent decoding of an IEEE binary format with `exp_bits` exponent and `man_bits`
/// mantissa bits.
double decode(std::uint32_t bits, int exp_bits, int man_bits) {
  const std::uint32_t man = bits & ((1u << man_bits) - 1);
  const std::uint32_t ex = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const bool neg = (bits >> (man_bits + exp_bits)) & 1u;
  const int bias = (1 << (exp_bits - 1)) - 1;
  double v;
  if (ex == (1u << exp_bits) - 1)
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (ex == 0)
    v = std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  else
    v = std::ldexp(static_cast<double>(man | (1u << man_bits)), static_cast<int>(ex) - bias - man_bits);
  return neg ? -v : v;
}

/// Independent round-to-nearest-even of a float into the format, by binary search for the
/// two representable neighbours (slow, obviously correct). Beyond the largest finite value
/// the next "neighbour" is max + ulp(max), which rounds to Inf, as IEEE 754 specifies.
std::uint32_t encode_nearest(float f, int exp_bits, int man_bits) {
  const std::uint32_t sign = std::signbit(f) ? (1u << (exp_bits + man_bits)) : 0u;
  const double a = std::fabs(static_cast<double>(f));
  const std::uint32_t inf = ((1u << exp_bits) - 1) << man_bits;
  const double max = decode(inf - 1, exp_bits, man_bits);
  const double next_after_max = max + (max - decode(inf - 2, exp_bits, man_bits));
  std::uint32_t lo = 0, hi = inf;  // invariant: value(lo) <= a < value(hi), value(inf) = next_after_max
  auto value = [&](std::uint32_t b) { return b == inf ? next_after_max : decode(b, exp_bits, man_bits); };
  if (a >= next_after_max) return sign | inf;
  while (hi - lo > 1) {
    std::uint32_t mid = (lo + hi) / 2;
    if (value(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  const double dl = a - value(lo), dh = value(hi) - a;
  std::uint32_t pick = dl < dh ? lo : dh < dl ? hi : ((lo & 1u) ? hi : lo);  // tie: even mantissa
  return sign | pick;
}

}  // namespace

TEST_CASE("dtype properties") {
  CHECK(itemsize(DType::Bool) == 1);
  CHECK(itemsize(DType::Int32) == 4);
  CHECK(itemsize(DType::Int64) == 8);
  CHECK(itemsize(DType::Float16) == 2);
  CHECK(itemsize(DType::BFloat16) == 2);
  CHECK(itemsize(DType::Float32) == 4);
  CHECK(itemsize(DType::Float64) == 8);
  CHECK(std::string(dtype_name(DType::BFloat16)) == "bfloat16");
  CHECK(std::string(dtype_name(DType::Int64)) == "int64");
  std::set<std::string> names;
  for (DType t : kAll) names.insert(dtype_name(t));
  CHECK(names.size() == 7);
  CHECK(bool_ == DType::Bool);
  CHECK(i32 == DType::Int32);
  CHECK(i64 == DType::Int64);
  CHECK(f16 == DType::Float16);
  CHECK(bf16 == DType::BFloat16);
  CHECK(f32 == DType::Float32);
  CHECK(f64 == DType::Float64);
  CHECK(is_floating(DType::BFloat16));
  CHECK_FALSE(is_floating(DType::Int64));
  CHECK(is_integral(DType::Int32));
  CHECK_FALSE(is_integral(DType::Bool));
  CHECK(is_reduced_float(DType::Float16));
  CHECK_FALSE(is_reduced_float(DType::Float32));
  CHECK(compute_dtype(DType::BFloat16) == DType::Float32);
  CHECK(compute_dtype(DType::Int32) == DType::Int32);
  CHECK(kDefaultFloat == DType::Float32);
  static_assert(dtype_v<float> == DType::Float32);
  static_assert(dtype_v<Half> == DType::Float16);
  static_assert(dtype_v<std::int64_t> == DType::Int64);
  for (DType t : kAll) {
    std::size_t size = visit_dtype(t, [](auto tag) { return sizeof(tag); });
    CHECK(size == itemsize(t));
    DType back = visit_dtype(t, [](auto tag) { return dtype_v<decltype(tag)>; });
    CHECK(back == t);
  }
}

TEST_CASE("promote_types: symmetric, idempotent, category order") {
  for (DType a : kAll)
    for (DType b : kAll) {
      CAPTURE(dtype_name(a));
      CAPTURE(dtype_name(b));
      CHECK(promote_types(a, b) == promote_types(b, a));
      DType p = promote_types(a, b);
      CHECK(dtype_category(p) == std::max(dtype_category(a), dtype_category(b)));
      CHECK(promote_types(p, a) == p);
      CHECK(promote_types(p, b) == p);
    }
  CHECK(promote_types(DType::Float16, DType::BFloat16) == DType::Float32);
  CHECK(promote_types(DType::Int64, DType::Float16) == DType::Float16);
  static_assert(promote_types(DType::Int32, DType::Int64) == DType::Int64);
}

TEST_CASE("Half: every bit pattern decodes like IEEE binary16 and round-trips") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    Half h = Half::from_bits(static_cast<std::uint16_t>(b));
    float f = h;
    double expected = decode(b, 5, 10);
    if (std::isnan(expected)) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(static_cast<float>(Half(f))));
      continue;
    }
    if (static_cast<double>(f) != expected || std::signbit(f) != std::signbit(expected)) {
      FAIL_CHECK("half bits " << b << " decode to " << f << ", expected " << expected);
      break;
    }
    if (Half(f).bits != b) {
      FAIL_CHECK("half bits " << b << " do not round-trip (got " << Half(f).bits << ")");
      break;
    }
  }
}

TEST_CASE("BFloat16: every bit pattern decodes and round-trips") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    BFloat16 h = BFloat16::from_bits(static_cast<std::uint16_t>(b));
    float f = h;
    double expected = decode(b, 8, 7);
    if (std::isnan(expected)) {
      CHECK(std::isnan(f));
      CHECK(std::isnan(static_cast<float>(BFloat16(f))));
      continue;
    }
    if (static_cast<double>(f) != expected || BFloat16(f).bits != b) {
      FAIL_CHECK("bfloat16 bits " << b << " decode to " << f << ", expected " << expected);
      break;
    }
  }
}

TEST_CASE("float -> Half and BFloat16 round to nearest even, overflow to Inf, underflow to signed zero") {
  // Sweep floats across every binade both formats have (and beyond), including exact ties.
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(state >> 32);
  };
  int bad_half = 0, bad_bf = 0;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t r = next();
    float f;
    if (i % 4 == 0) {
      // A tie in binary16: a half-way point between neighbours (13 low bits = 0x1000).
      r = (r & 0xffffe000u) | 0x1000u;
    } else if (i % 4 == 1) {
      r = (r & 0xffff0000u) | 0x8000u;  // a bfloat16 tie
    }
    std::memcpy(&f, &r, 4);
    if (std::isnan(f)) continue;
    std::uint32_t eh = encode_nearest(f, 5, 10);
    std::uint32_t eb = encode_nearest(f, 8, 7);
    if (Half(f).bits != eh && bad_half++ < 5)
      FAIL_CHECK("Half(" << f << ") bits " << Half(f).bits << " expected " << eh);
    if (BFloat16(f).bits != eb && bad_bf++ < 5)
      FAIL_CHECK("BFloat16(" << f << ") bits " << BFloat16(f).bits << " expected " << eb);
  }
  CHECK(bad_half == 0);
  CHECK(bad_bf == 0);
  CHECK(std::isinf(static_cast<float>(Half(65520.0f))));
  CHECK(static_cast<float>(Half(65519.0f)) == 65504.0f);
  CHECK(std::signbit(static_cast<float>(Half(-1e-10f))));
  CHECK(static_cast<float>(Half(-1e-10f)) == 0.0f);
  CHECK(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling-looking NaN whose payload lives in the low bits must stay NaN (not become Inf).
  float snan;
  std::uint32_t snan_bits = 0x7f800001u;
  std::memcpy(&snan, &snan_bits, 4);
  CHECK(std::isnan(static_cast<float>(Half(snan))));
  CHECK(std::isnan(static_cast<float>(BFloat16(snan))));
  CHECK(static_cast<float>(Half(2.0)) == 2.0f);
  CHECK(static_cast<float>(BFloat16(3)) == 3.0f);
}

TEST_CASE("Shape, strides, contiguity") {
  Shape s{2, 3, 4};
  CHECK(s.numel() == 24);
  CHECK(s.rank() == 3);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{}.str() == "[]");
  CHECK(Shape{3, 0, 2}.numel() == 0);
  CHECK(contiguous_strides(s) == Strides{12, 4, 1});
  CHECK(contiguous_strides(Shape{}) == Strides{});
  CHECK(is_contiguous(s, {12, 4, 1}));
  CHECK_FALSE(is_contiguous(s, {1, 2, 6}));
  CHECK(is_contiguous(Shape{2, 1, 4}, {4, 999, 1}));  // size-1 dims ignored
  CHECK_FALSE(is_contiguous(Shape{2, 4}, {8, 1}));    // padded rows
  std::vector<std::int64_t> v = {5, 6};
  CHECK(Shape(v).str() == "[5, 6]");
}

TEST_CASE("broadcast_shapes: NumPy rules and a ShapeError naming the op") {
  CHECK(broadcast_shapes({2, 3}, {3}, "add") == Shape{2, 3});
  CHECK(broadcast_shapes({4, 1, 3}, {5, 1}, "add") == Shape{4, 5, 3});
  CHECK(broadcast_shapes({}, {2, 2}, "add") == Shape{2, 2});
  CHECK(broadcast_shapes({1}, {0}, "add") == Shape{0});
  CHECK(broadcast_shapes({0, 1}, {1, 5}, "mul") == Shape{0, 5});
  try {
    broadcast_shapes({2, 3}, {4}, "my_op");
    FAIL("no error");
  } catch (const ShapeError& e) {
    std::string m = e.what();
    CHECK(m.find("my_op") != std::string::npos);
    CHECK(m.find("[2, 3]") != std::string::npos);
    CHECK(m.find("[4]") != std::string::npos);
  }
  CHECK_THROWS_AS(broadcast_shapes({2}, {0}, "add"), ShapeError);
}

TEST_CASE("normalize_axis and Axes") {
  CHECK(normalize_axis(-1, 3, "op", Shape{1, 2, 3}) == 2);
  CHECK(normalize_axis(-3, 3, "op", Shape{1, 2, 3}) == 0);
  CHECK(normalize_axis(2, 3, "op", Shape{1, 2, 3}) == 2);
  CHECK(normalize_axis(0, 0, "op", Shape{}) == 0);  // PyTorch accepts 0 and -1 on 0-dim tensors
  CHECK(normalize_axis(-1, 0, "op", Shape{}) == 0);
  CHECK_THROWS_AS(normalize_axis(3, 3, "op", Shape{1, 2, 3}), ShapeError);
  CHECK_THROWS_AS(normalize_axis(-4, 3, "op", Shape{1, 2, 3}), ShapeError);
  CHECK_THROWS_AS(normalize_axis(1, 0, "op", Shape{}), ShapeError);
  CHECK(Axes(1).axes == std::vector<std::int64_t>{1});
  CHECK(Axes(std::int64_t{-2}).axes == std::vector<std::int64_t>{-2});
  CHECK(Axes({0, 2}).axes == std::vector<std::int64_t>{0, 2});
  CHECK(Axes().axes.empty());
}

TEST_CASE("errors: one hierarchy, CompileError carries the log and source path") {
  static_assert(std::is_base_of_v<std::runtime_error, Error>);
  static_assert(std::is_base_of_v<Error, ShapeError>);
  static_assert(std::is_base_of_v<Error, DTypeError>);
  static_assert(std::is_base_of_v<Error, CompileError>);
  static_assert(std::is_base_of_v<Error, DeviceError>);
  CompileError ce("failed", "error: x", "/tmp/k.cpp");
  CHECK(std::string(ce.what()) == "failed");
  CHECK(ce.log() == "error: x");
  CHECK(ce.source_path() == "/tmp/k.cpp");
  try {
    throw DTypeError("bad dtype");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "bad dtype");
  }
}

TEST_CASE("Device") {
  CHECK(Device::cpu().is_cpu());
  CHECK(Device::cuda().is_cuda());
  CHECK(Device::cuda(1).index == 1);
  CHECK(Device::cpu() == Device{});
  CHECK(Device::cuda(0) != Device::cuda(1));
  CHECK(Device::cpu() != Device::cuda(0));
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda(2).str() == "cuda:2");
}

TEST_CASE("environment settings are declared in one place and parsed") {
  std::set<std::string> names;
  for (const auto& s : env::kSettings) {
    names.insert(s.name);
    CHECK(std::string(s.name).rfind("KILN_", 0) == 0);
    CHECK(std::string(s.help).size() > 10);
  }
  for (const char* required : {"KILN_LOGS", "KILN_LOGS_OUT", "KILN_CACHE_DIR", "KILN_CACHE", "KILN_CXX", "KILN_DEVICE"})
    CHECK(names.count(required) == 1);
  ::setenv("KILN_TEST_CORE_VAR", "", 1);
  CHECK(env::get("KILN_TEST_CORE_VAR", "fallback") == "fallback");
  CHECK_FALSE(env::flag("KILN_TEST_CORE_VAR"));
  CHECK(env::flag("KILN_TEST_CORE_VAR", true));
  for (const char* off : {"0", "false", "off", "no", "OFF", "FALSE"}) {
    ::setenv("KILN_TEST_CORE_VAR", off, 1);
    CHECK_FALSE(env::flag("KILN_TEST_CORE_VAR", true));
  }
  ::setenv("KILN_TEST_CORE_VAR", "1", 1);
  CHECK(env::flag("KILN_TEST_CORE_VAR"));
  CHECK(env::get("KILN_TEST_CORE_VAR") == "1");
  ::unsetenv("KILN_TEST_CORE_VAR");
  CHECK(env::raw("KILN_TEST_CORE_VAR") == nullptr);
}

TEST_CASE("log channels parse TORCH_LOGS-style lists") {
  using detail::parse_log_channels;
  CHECK(parse_log_channels("") == 0);
  CHECK(parse_log_channels("cache") == unsigned(LogChannel::cache));
  CHECK(parse_log_channels("cache,recompiles") == (unsigned(LogChannel::cache) | unsigned(LogChannel::recompiles)));
  CHECK(parse_log_channels(" +guards, schedule") == (unsigned(LogChannel::guards) | unsigned(LogChannel::schedule)));
  CHECK(parse_log_channels("all") == ~0u);
  CHECK(parse_log_channels("nonsense") == 0);
}

TEST_CASE("hashes are deterministic and spread") {
  static_assert(detail::hash_string("abc") == detail::hash_string("abc"));
  static_assert(detail::hash_string("abc") != detail::hash_string("abd"));
  static_assert(detail::hash_combine(1, 2) != detail::hash_combine(2, 1));
  CHECK(detail::hash_double(0.0) != detail::hash_double(-0.0));
  const char data[] = "kiln";
  CHECK(detail::hash_bytes(data, 4) == detail::hash_bytes("kiln", 4));
  CHECK(detail::hash_bytes(data, 4) != detail::hash_bytes(data, 3));
  std::set<std::uint64_t> seen;
  for (std::uint64_t i = 0; i < 1000; ++i) seen.insert(detail::hash_mix(i));
  CHECK(seen.size() == 1000);
}

TEST_CASE("stats counters snapshot and reset") {
  reset_stats();
  detail::counters().launches += 3;
  detail::counters().compiles += 1;
  Stats s = stats();
  CHECK(s.launches == 3);
  CHECK(s.compiles == 1);
  CHECK(s.memory_hits == 0);
  CHECK(s.disk_hits == 0);
  CHECK(s.graphs == 0);
  reset_stats();
  CHECK(stats().launches == 0);
  CHECK(stats().compiles == 0);
}

TEST_CASE("linkage: every cold-code region of the headers is closed and includes nothing") {
  // Header-only mode compiles the code between KILN_COLD_CODE_BEGIN and KILN_COLD_CODE_END
  // without optimisation (core/linkage.hpp). A header first included from inside a region would
  // lose its optimisation too, and a region left open would reach whatever follows it.
  namespace fs = std::filesystem;
  const fs::path root = fs::path(KILN_SOURCE_DIR) / "include" / "kiln";
  REQUIRE(fs::is_directory(root));
  int regions = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".hpp") continue;
    const std::string path = entry.path().string();
    std::ifstream in(entry.path());
    std::string line;
    bool open = false;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line == "KILN_COLD_CODE_BEGIN") {
        CHECK_MESSAGE(!open, path << ":" << number << ": a cold region opened inside another");
        open = true;
        ++regions;
      } else if (line == "KILN_COLD_CODE_END") {
        CHECK_MESSAGE(open, path << ":" << number << ": a cold region closed that was not open");
        open = false;
      } else if (open && line.rfind("#include", 0) == 0) {
        FAIL_CHECK(path << ":" << number << ": #include inside a cold region");
      }
    }
    CHECK_MESSAGE(!open, path << ": a cold region is not closed");
  }
  // The code generators, the scheduler, the reference executor and the compiler's drivers.
  CHECK(regions >= 30);
}

}  // namespace kiln_test_core_core
