#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/stats.hpp"
#include "kiln/runtime/cpu_module.hpp"
#include "kiln/runtime/process.hpp"
#include "runtime_test_util.hpp"
#include "../support/child_process.hpp"

namespace kiln_test_runtime_cpu_module {

using kiln::runtime::CpuModuleCache;
using kiln::runtime::CxxCompiler;
using kiln::runtime::DiskCache;
using kiln::runtime::SharedLibrary;
using kiln_test::file_exists;
using kiln_test::read_file;
using kiln_test::ScopedEnv;
using kiln_test::TempDir;
using kiln_test::write_file;

namespace {

constexpr const char* kChildEnv = "KILN_RUNTIME_TEST_CHILD_VALUE";

// Each test uses its own value, so a module can never come from another test's cache entry.
std::string module_source(int value) {
  return "extern \"C\" int kiln_test_value() { return " + std::to_string(value) + "; }\n";
}

int call(const std::shared_ptr<SharedLibrary>& lib) {
  return reinterpret_cast<int (*)()>(lib->symbol("kiln_test_value"))();
}

struct Delta {
  kiln::Stats start = kiln::stats();
  std::uint64_t compiles() const { return kiln::stats().compiles - start.compiles; }
  std::uint64_t memory_hits() const { return kiln::stats().memory_hits - start.memory_hits; }
  std::uint64_t disk_hits() const { return kiln::stats().disk_hits - start.disk_hits; }
};

}  // namespace

TEST_CASE("runtime: a second get of a module is a memory hit, with no compile") {
  TempDir tmp;
  DiskCache disk(tmp.path);
  CpuModuleCache cache(&disk, &kiln_test::test_compiler());
  const std::string src = module_source(1001);

  Delta d;
  auto first = cache.get(src);
  CHECK(call(first) == 1001);
  CHECK(d.compiles() == 1);
  CHECK(d.memory_hits() == 0);
  CHECK(d.disk_hits() == 0);
  CHECK(file_exists(disk.path_for(cache.key_text(src), ".so")));

  auto second = cache.get(src);
  CHECK(second.get() == first.get());
  CHECK(d.compiles() == 1);
  CHECK(d.memory_hits() == 1);

  // After clear() the module comes back from disk; handles given out stay usable.
  cache.clear();
  CHECK(cache.size() == 0);
  auto third = cache.get(src);
  CHECK(d.compiles() == 1);
  CHECK(d.disk_hits() == 1);
  CHECK(call(third) == 1001);
  CHECK(call(first) == 1001);

  // The key spells out everything that decides the bytes.
  std::string key = cache.key_text(src);
  CHECK(key.find(KILN_VERSION_STRING) != std::string::npos);
  CHECK(key.find(kiln_test::test_compiler().identity()) != std::string::npos);
  CHECK(key.find("-march=native") != std::string::npos);
  CHECK(key.find(CxxCompiler::host_arch()) != std::string::npos);
  CHECK(key.find(src) != std::string::npos);
}

// Runs only when started by the test below, in a new process (doctest skips it otherwise).
TEST_CASE("runtime_cpu_module_disk_hit_child" * doctest::skip()) {
  const char* value = std::getenv(kChildEnv);
  if (!value) return;
  kiln::reset_stats();
  auto start = std::chrono::steady_clock::now();
  auto lib = CpuModuleCache::instance().get(module_source(std::atoi(value)));
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  auto st = kiln::stats();
  CHECK(st.compiles == 0);
  CHECK(st.disk_hits == 1);
  CHECK(call(lib) == std::atoi(value));
  if (st.compiles == 0 && st.disk_hits == 1 && call(lib) == std::atoi(value))
    std::printf("KILN_CHILD_OK disk hit in %.3f ms\n", ms);
}

TEST_CASE("runtime: a new process loads the module from disk with zero compiles") {
  TempDir tmp;
  DiskCache disk(tmp.path);
  // The child finds the compiler through KILN_CXX/c++ and the disk cache: probe it the same way.
  auto compiler = CxxCompiler::probe(kiln::env::get("KILN_CXX", "c++"), &disk);
  REQUIRE(compiler);
  CpuModuleCache cache(&disk, compiler.get());
  const int value = 2002;
  Delta d;
  CHECK(call(cache.get(module_source(value))) == value);
  CHECK(d.compiles() == 1);

  auto r = kiln::testing::run_test_child(
      "runtime_cpu_module_disk_hit_child",
      {"KILN_CACHE_DIR=" + tmp.path, "KILN_CACHE=1", std::string(kChildEnv) + "=" + std::to_string(value),
       "KILN_LOGS=cache,output_code", "KILN_LOGS_OUT"});
  INFO("child output:\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("KILN_CHILD_OK") != std::string::npos);
  CHECK(r.output.find("[kiln:cache] cpu module") != std::string::npos);
  CHECK(r.output.find("disk hit") != std::string::npos);
  CHECK(r.output.find("[kiln:output_code]") != std::string::npos);
  CHECK(r.output.find(module_source(value)) != std::string::npos);
  auto ok = r.output.find("KILN_CHILD_OK");
  if (ok != std::string::npos) MESSAGE(r.output.substr(ok, r.output.find('\n', ok) - ok));
}

TEST_CASE("runtime: truncated and corrupted disk entries are rebuilt, never loaded") {
  TempDir tmp;
  DiskCache disk(tmp.path);
  const auto& cxx = kiln_test::test_compiler();
  const std::string src = module_source(3003);
  const std::string path = disk.path_for(CpuModuleCache(&disk, &cxx).key_text(src), ".so");

  Delta d;
  CHECK(call(CpuModuleCache(&disk, &cxx).get(src)) == 3003);
  CHECK(d.compiles() == 1);
  const std::string good = read_file(path);
  REQUIRE(good.size() > 1000);

  write_file(path, good.substr(0, good.size() / 2));  // as after a crash mid-write
  CHECK(call(CpuModuleCache(&disk, &cxx).get(src)) == 3003);
  CHECK(d.compiles() == 2);
  CHECK(d.disk_hits() == 0);
  CHECK(disk.load(CpuModuleCache(&disk, &cxx).key_text(src), ".so").has_value());  // a valid entry again

  std::string bad = read_file(path);
  bad[bad.size() - 200] ^= 0x5a;  // one flipped byte inside the shared object
  write_file(path, bad);
  CHECK(call(CpuModuleCache(&disk, &cxx).get(src)) == 3003);
  CHECK(d.compiles() == 3);
  CHECK(d.disk_hits() == 0);

  CHECK(call(CpuModuleCache(&disk, &cxx).get(src)) == 3003);  // and the rebuilt entry is used
  CHECK(d.compiles() == 3);
  CHECK(d.disk_hits() == 1);
}

TEST_CASE("runtime: 8 threads racing for one new module compile it exactly once") {
  TempDir tmp;
  DiskCache disk(tmp.path);
  CpuModuleCache cache(&disk, &kiln_test::test_compiler());
  const std::string src = module_source(4004);
  Delta d;
  std::atomic<bool> go{false};
  std::vector<std::shared_ptr<SharedLibrary>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      got[t] = cache.get(src);
    });
  go = true;
  for (auto& th : threads) th.join();
  CHECK(d.compiles() == 1);
  CHECK(d.memory_hits() == 7);
  CHECK(d.disk_hits() == 0);
  for (auto& lib : got) {
    REQUIRE(lib);
    CHECK(lib.get() == got[0].get());
  }
  CHECK(call(got[0]) == 4004);
}

TEST_CASE("runtime: with KILN_CACHE=0 nothing is read from or written to disk") {
  TempDir tmp;
  ScopedEnv off("KILN_CACHE", "0");
  ScopedEnv dir("KILN_CACHE_DIR", tmp.path + "/cache");
  DiskCache disk = DiskCache::from_env();
  CHECK_FALSE(disk.enabled());
  const std::string src = module_source(5005);
  Delta d;
  CHECK(call(CpuModuleCache(&disk, &kiln_test::test_compiler()).get(src)) == 5005);
  CHECK(call(CpuModuleCache(&disk, &kiln_test::test_compiler()).get(src)) == 5005);
  CHECK(d.compiles() == 2);
  CHECK(d.disk_hits() == 0);
  CHECK_FALSE(file_exists(tmp.path + "/cache"));
}

TEST_CASE("runtime: CpuModuleCache reports compile errors and a missing compiler as CompileError") {
  TempDir tmp;
  DiskCache disk(tmp.path);
  CpuModuleCache cache(&disk, &kiln_test::test_compiler());
  const std::string src = "extern \"C\" int kiln_test_value() { return not_declared_abc; }\n";
  try {
    cache.get(src);
    FAIL("expected kiln::CompileError");
  } catch (const kiln::CompileError& e) {
    CHECK(e.log().find("not_declared_abc") != std::string::npos);
    CHECK(read_file(e.source_path()) == src);
    CHECK(std::string(e.what()).find(e.source_path()) != std::string::npos);
    ::unlink(e.source_path().c_str());
  }
  CHECK(cache.size() == 0);  // a failure is not cached: the next get tries again
  CHECK(kiln_test::list_dir(tmp.path).empty());

  CpuModuleCache none(&disk, nullptr);
  CHECK_THROWS_AS(none.get(module_source(6006)), kiln::CompileError);
}

}  // namespace kiln_test_runtime_cpu_module
