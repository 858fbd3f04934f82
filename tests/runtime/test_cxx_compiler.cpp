#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln/runtime/cxx_compiler.hpp"
#include "kiln/runtime/dynlib.hpp"
#include "runtime_test_util.hpp"

namespace kiln_test_runtime_cxx_compiler {

using kiln::runtime::CxxCompiler;
using kiln::runtime::SharedLibrary;
using kiln_test::file_exists;
using kiln_test::read_file;
using kiln_test::TempDir;

TEST_CASE("runtime: CxxCompiler builds a shared library whose function is called through dlsym") {
  const CxxCompiler& cxx = kiln_test::test_compiler();
  CHECK_FALSE(cxx.identity().empty());
  CHECK(cxx.identity().find(cxx.version()) != std::string::npos);

  TempDir tmp;
  std::string out = tmp.path + "/answer.so";
  cxx.compile("extern \"C\" int f() { return 42; }\n", out);
  CHECK(file_exists(out));
  CHECK(file_exists(tmp.path + "/answer.cpp"));  // the source is written next to the output

  SharedLibrary lib(out);
  auto f = reinterpret_cast<int (*)()>(lib.symbol("f"));
  CHECK(f() == 42);
  CHECK(lib.find_symbol("no_such_symbol") == nullptr);
  try {
    lib.symbol("no_such_symbol");
    FAIL("expected kiln::Error");
  } catch (const kiln::Error& e) {
    std::string what = e.what();
    CHECK(what.find("no_such_symbol") != std::string::npos);
    CHECK(what.find(out) != std::string::npos);
  }

  // Move-only handle: the moved-to library still resolves, the moved-from one is empty.
  SharedLibrary moved(std::move(lib));
  CHECK(reinterpret_cast<int (*)()>(moved.symbol("f"))() == 42);
  CHECK(lib.handle() == nullptr);
  CHECK_THROWS_AS(SharedLibrary(tmp.path + "/missing.so"), kiln::Error);
}

TEST_CASE("runtime: CxxCompiler flags keep IEEE semantics") {
  std::vector<std::string> flags = kiln_test::test_compiler().flags();
  auto has = [&](const char* f) { return std::find(flags.begin(), flags.end(), f) != flags.end(); };
  CHECK(has("-O3"));
  CHECK(has("-march=native"));
  CHECK(has("-fPIC"));
  CHECK(has("-shared"));
  CHECK(has("-std=c++17"));
  CHECK(has("-fno-semantic-interposition"));
  CHECK(has(kiln_test::test_compiler().openmp() ? "-fopenmp" : "-fopenmp-simd"));
  for (const auto& f : flags) {
    CHECK(f != "-ffast-math");
    CHECK(f != "-Ofast");
    CHECK(f.find("finite-math") == std::string::npos);
    CHECK(f.find("no-signed-zeros") == std::string::npos);
  }

  // NaN, Inf and signed zero survive a kernel built with those flags.
  TempDir tmp;
  std::string out = tmp.path + "/ieee.so";
  kiln_test::test_compiler().compile(R"(
#include <cmath>
extern "C" int ieee(float nan, float inf, float zero) {
  int ok = 0;
  ok |= (nan != nan) << 0;
  ok |= std::isnan(nan) << 1;
  ok |= std::isinf(inf + 1.0f) << 2;
  ok |= std::signbit(-zero) << 3;
  ok |= std::isnan(inf - inf) << 4;
  ok |= (1.0f / -zero < 0.0f) << 5;
  return ok;
}
)",
                                     out);
  SharedLibrary lib(out);
  auto ieee = reinterpret_cast<int (*)(float, float, float)>(lib.symbol("ieee"));
  CHECK(ieee(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f) == 63);
}

TEST_CASE("runtime: a compiler error throws CompileError with the log and the source path") {
  TempDir tmp;
  std::string out = tmp.path + "/broken.so";
  const std::string source = "extern \"C\" int broken() { return undeclared_name_xyz; }\n";
  try {
    kiln_test::test_compiler().compile(source, out);
    FAIL("expected kiln::CompileError");
  } catch (const kiln::CompileError& e) {
    CHECK(e.source_path() == tmp.path + "/broken.cpp");
    CHECK(read_file(e.source_path()) == source);  // left in place for the user
    CHECK(e.log().find("undeclared_name_xyz") != std::string::npos);
    std::string what = e.what();
    CHECK(what.find(e.source_path()) != std::string::npos);
    CHECK(what.find("undeclared_name_xyz") != std::string::npos);
  }
  CHECK_FALSE(file_exists(out));
}

TEST_CASE("runtime: CxxCompiler::probe refuses what is not a working compiler") {
  std::string why;
  CHECK(CxxCompiler::probe("kiln-no-such-compiler-xyz", nullptr, &why) == nullptr);
  CHECK(why.find("kiln-no-such-compiler-xyz") != std::string::npos);
  CHECK(CxxCompiler::probe("false", nullptr, &why) == nullptr);  // exists, but `--version` fails
  CHECK(why.find("--version") != std::string::npos);
  CHECK(CxxCompiler::probe("   ", nullptr, &why) == nullptr);
}

TEST_CASE("runtime: CxxCompiler::probe keeps its result in the disk cache") {
  TempDir tmp;
  kiln::runtime::DiskCache cache(tmp.path);
  auto cmd = kiln::env::get("KILN_CXX", "c++");
  auto first = CxxCompiler::probe(cmd, &cache);
  REQUIRE(first);
  auto entries = kiln_test::list_dir(tmp.path);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].size() == 16 + 6);  // <hash>.probe
  auto second = CxxCompiler::probe(cmd, &cache);
  REQUIRE(second);
  CHECK(second->identity() == first->identity());
  CHECK(second->openmp() == first->openmp());
  CHECK(second->flags() == first->flags());
  CHECK(second->identity() == kiln_test::test_compiler().identity());
}

TEST_CASE("runtime: host_arch names the machine and is stable") {
  const std::string& arch = CxxCompiler::host_arch();
  CHECK(arch.find("cpu:") != std::string::npos);
  CHECK(arch == CxxCompiler::host_arch());
}

TEST_CASE("runtime: a compiler without working OpenMP is used without -fopenmp") {
  TempDir tmp;
  // A compiler wrapper that rejects -fopenmp, as a compiler without libgomp would.
  std::string wrapper = tmp.path + "/no-openmp-c++";
  kiln_test::write_file(wrapper,
                        "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = -fopenmp ] && { echo 'cannot find -lgomp' >&2; "
                        "exit 1; }; done\nexec " +
                            kiln_test::test_compiler().command()[0] + " \"$@\"\n");
  REQUIRE(::chmod(wrapper.c_str(), 0755) == 0);
  std::string why;
  auto cxx = CxxCompiler::probe(wrapper, nullptr, &why);
  REQUIRE_MESSAGE(cxx, why);
  CHECK_FALSE(cxx->openmp());
  auto flags = cxx->flags();
  CHECK(std::find(flags.begin(), flags.end(), "-fopenmp") == flags.end());
  CHECK(std::find(flags.begin(), flags.end(), "-fopenmp-simd") != flags.end());
  std::string out = tmp.path + "/simd.so";
  cxx->compile(
      "extern \"C\" int g(const int* x) { int s = 0;\n#pragma omp simd reduction(+:s)\n"
      "for (int i = 0; i < 8; ++i) s += x[i];\nreturn s; }\n",
      out);
  SharedLibrary lib(out);
  int x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(reinterpret_cast<int (*)(const int*)>(lib.symbol("g"))(x) == 36);
}

}  // namespace kiln_test_runtime_cxx_compiler
