// kiln::compile modes on the CPU: "reduce-overhead" (one graph entry, one parallel region) and
// "max-autotune" / "max-autotune-no-cudagraphs" (timed launch configurations, stored on disk).
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/backend/cpu_jit.hpp>
#include <kiln/runtime/autotune.hpp>
#include <kiln/runtime/process.hpp>

#include "../support/child_process.hpp"
#include "../support/compile_util.hpp"
#include "../support/mode_workloads.hpp"
#include "../support/reference.hpp"

namespace kiln_test_compile_modes {

using namespace kiln;

namespace {

using Workload = testing::ModeWorkload;

/// The workloads of WORKLOADS.md at test sizes: each large enough for an OpenMP team
/// (>= 32768 elements), several with more than one kernel, split reductions and finals.
const std::vector<Workload>& workloads() {
  static const std::vector<Workload> w = testing::mode_workloads(Device::cpu(), {1 << 16, 64, 1024, 512, 4096});
  return w;
}

const Workload& workload(const std::string& id) {
  for (auto& w : workloads())
    if (id == w.id) return w;
  throw Error("no workload " + id);
}

auto compiled(const Workload& w, const char* mode) { return testing::compiled_workload(w, mode); }

struct Args {
  std::vector<Tensor> in;
  explicit Args(const Workload& w) : in(w.inputs()) {
    while (in.size() < 4) in.push_back(zeros({1}));
  }
};

/// Kernels in `w`'s CPU schedule.
std::size_t kernel_count(const Workload& w, const Args& a) {
  Tensor r = w.compute(a.in);
  ir::Captured c = ir::capture({r.node()}, Device::cpu());
  return sched::schedule(c.graph).kernels.size();
}

bool have_jit() { return backend::cpu_jit_available(); }

}  // namespace

TEST_CASE("modes: the graph entry runs every kernel in one parallel region") {
  if (!have_jit()) return;
  Tensor x = randn({64, 1024}, 1);
  x.eval();
  Tensor r = layer_norm(softmax(x, -1) * 2.0f);
  ir::Captured c = ir::capture({r.node()}, Device::cpu());
  sched::Schedule s = sched::schedule(c.graph);
  REQUIRE(s.kernels.size() >= 1);
  codegen::CppOptions opt;
  opt.graph_entry = true;
  codegen::CppSource src = codegen::generate_cpp(c.graph, s, "kiln_modes_test", opt);
  CHECK(src.graph_entry == "kiln_modes_test_graph");
  const std::string& t = src.source;
  const std::size_t at = t.find("void kiln_modes_test_graph(");
  REQUIRE(at != std::string::npos);
  const std::string entry = t.substr(at);
  // One region for the whole graph, every body called inside it, barriers between kernels.
  CHECK(entry.find("#pragma omp parallel num_threads(nth)") != std::string::npos);
  CHECK(entry.find("#pragma omp parallel", entry.find("#pragma omp parallel") + 1) == std::string::npos);
  std::size_t bodies = 0, barriers = 0;
  for (std::size_t p = entry.find("_body("); p != std::string::npos; p = entry.find("_body(", p + 1)) ++bodies;
  for (std::size_t p = entry.find("omp barrier"); p != std::string::npos; p = entry.find("omp barrier", p + 1))
    ++barriers;
  CHECK(bodies == s.kernels.size());
  CHECK(barriers == s.kernels.size() - 1);
  // The kernel bodies share work with orphaned constructs only: no region of their own.
  const std::string first_body = t.substr(t.find("static void kiln_modes_test_0_body("));
  CHECK(first_body.substr(0, first_body.find("\n}\n")).find("omp parallel") == std::string::npos);
}

TEST_CASE("modes: reduce-overhead equals default bit for bit on every workload, one launch per call") {
  if (!have_jit()) return;
  for (const Workload& w : workloads()) {
    CAPTURE(w.id);
    Args a(w);
    auto def = compiled(w, "default");
    auto ro = compiled(w, "reduce-overhead");
    Tensor expect = def(a.in[0], a.in[1], a.in[2], a.in[3]);
    Tensor got = ro(a.in[0], a.in[1], a.in[2], a.in[3]);  // traces and compiles
    REQUIRE(got.shape() == expect.shape());
    CHECK(got.dtype() == expect.dtype());
    auto ve = expect.to_vector<double>(), vg = got.to_vector<double>();
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ve.size(); ++i) differ += std::memcmp(&ve[i], &vg[i], sizeof(double)) != 0;
    CHECK(differ == 0);

    const std::size_t kernels = kernel_count(w, a);
    Stats before = stats();
    Tensor again = ro(a.in[0], a.in[1], a.in[2], a.in[3]);
    again.eval();
    CHECK(stats().launches - before.launches == 1);
    CHECK(again.to_vector<double>() == vg);
    before = stats();
    def(a.in[0], a.in[1], a.in[2], a.in[3]).eval();
    CHECK(stats().launches - before.launches == kernels);
  }
}

TEST_CASE("modes: one kernel alone, a pointwise loop dealt round-robin (an autotune candidate)") {
  if (!have_jit()) return;
  Tensor x = randn({1 << 16}, 1);
  x.eval();
  Tensor r = x * 2.0f + 1.0f;
  ir::Captured c = ir::capture({r.node()}, Device::cpu());
  sched::Schedule s = sched::schedule(c.graph);
  REQUIRE(s.kernels.size() == 1);
  REQUIRE(s.kernels[0].loops.parallel);
  codegen::CppOptions opt;
  opt.only_kernel = 0;
  opt.pointwise_pieces = 16;
  codegen::CppSource src = codegen::generate_cpp(c.graph, s, "kiln_modes_rr", opt);
  CHECK(src.entries == std::vector<std::string>{"kiln_modes_rr_0"});
  CHECK(src.graph_entry.empty());
  CHECK(src.source.find("schedule(simd:static, 4096)") != std::string::npos);
  auto cands = backend::detail::chunk_candidates(s.kernels[0]);
  CHECK(cands == std::vector<std::int64_t>{1, backend::detail::kPointwisePieces});
}

TEST_CASE("modes: autotune candidates always hold the default, which wins unless clearly beaten") {
  for (int n : {1, 2, 3, 8, 16, 64}) {
    auto t = backend::detail::thread_candidates(n);
    CAPTURE(n);
    CHECK(t.front() == n);  // the default team first
    CHECK(std::find(t.begin(), t.end(), 1) != t.end());
    if (n <= 8) CHECK(t.size() == static_cast<std::size_t>(n));
  }
  using namespace std::chrono_literals;
  auto sleep_for = [](std::chrono::microseconds d) { return [d] { std::this_thread::sleep_for(d); }; };
  runtime::AutotuneBudget b;
  b.seconds = 0.02;
  CHECK(runtime::pick_fastest({sleep_for(200us), sleep_for(2000us)}, b) == 0);
  CHECK(runtime::pick_fastest({sleep_for(3000us), sleep_for(200us), sleep_for(2000us)}, b) == 1);
}

namespace {

using testing::PrivateDiskCache;

constexpr const char* kAutotuneChild = "KILN_TEST_AUTOTUNE_CHILD";
const char* const kTuned[] = {"P1", "R1", "R3", "N1", "N6", "S1"};

}  // namespace

TEST_CASE("modes: max-autotune tunes once, matches default, and reloads its choice without timing") {
  if (!have_jit()) return;
  PrivateDiskCache cache("kiln_modes");
  for (const char* mode : {"max-autotune-no-cudagraphs", "max-autotune"}) {
    for (const char* id : kTuned) {
      const std::string which = std::string(mode) + " " + id;
      CAPTURE(which);
      const Workload& w = workload(id);
      Args a(w);
      auto def = compiled(w, "default");
      auto tuned = compiled(w, mode);
      runtime::AutotuneStats s0 = runtime::autotune_stats();
      Tensor expect = def(a.in[0], a.in[1], a.in[2], a.in[3]);
      Tensor got = tuned(a.in[0], a.in[1], a.in[2], a.in[3]);
      runtime::AutotuneStats s1 = runtime::autotune_stats();
      // The first call timed candidates (S1's one kernel is single-threaded: nothing to choose).
      if (std::string(id) != "S1") CHECK(s1.timed_runs > s0.timed_runs);
      // Another chunking sums in another order: equal up to rounding.
      auto ve = expect.to_vector<double>(), vg = got.to_vector<double>();
      REQUIRE(ve.size() == vg.size());
      for (std::size_t i = 0; i < ve.size(); ++i) CHECK(vg[i] == doctest::Approx(ve[i]).epsilon(1e-5));
      // Later calls reuse the choice.
      Tensor again = tuned(a.in[0], a.in[1], a.in[2], a.in[3]);
      again.eval();
      CHECK(runtime::autotune_stats().timed_runs == s1.timed_runs);
      CHECK(again.to_vector<double>() == vg);
    }
  }
  // A fresh start of this process's caches: the choices come from the disk cache, untimed.
  kiln::reset();
  runtime::AutotuneStats s0 = runtime::autotune_stats();
  for (const char* id : kTuned) {
    const Workload& w = workload(id);
    Args a(w);
    compiled(w, "max-autotune")(a.in[0], a.in[1], a.in[2], a.in[3]).eval();
  }
  runtime::AutotuneStats s1 = runtime::autotune_stats();
  CHECK(s1.timed_runs == s0.timed_runs);
  CHECK(s1.tunings == s0.tunings);
  CHECK(s1.disk_hits - s0.disk_hits == std::size(kTuned));

  // A new process: same answer, with a logged tuning-cache hit and no timing.
  const std::string out = testing::expect_untimed_autotune_child("modes: autotune child*", cache.dir, kAutotuneChild,
                                                                 "KILN_AUTOTUNE_CHILD_OK");
  CHECK(out.find("autotune ") != std::string::npos);
}

TEST_CASE("modes: autotune child (run by the test above)") {
  if (!std::getenv(kAutotuneChild) || !have_jit()) return;
  for (const char* id : kTuned) {
    const Workload& w = workload(id);
    Args a(w);
    compiled(w, "max-autotune")(a.in[0], a.in[1], a.in[2], a.in[3]).eval();
  }
  runtime::AutotuneStats s = runtime::autotune_stats();
  CHECK(s.timed_runs == 0);
  CHECK(s.tunings == 0);
  CHECK(s.disk_hits == std::size(kTuned));
  if (s.timed_runs == 0 && s.tunings == 0 && s.disk_hits == std::size(kTuned)) std::printf("KILN_AUTOTUNE_CHILD_OK\n");
}

TEST_CASE("modes: an unknown mode is an Error that lists the valid ones, raised by kiln::compile itself") {
  CompileOptions opt;
  opt.mode = "fastest";
  auto twice = [](const Tensor& x) { return x * 2.0f; };
  KILN_CHECK_THROWS_MENTIONING(Error, kiln::compile(twice, opt), "unknown mode", "\"fastest\"",
                               "default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs");
  opt.mode = "max-autotune-no-cudagraphs";
  auto f = kiln::compile(twice, opt);
  CHECK(f(testing::make_tensor({1, 2}, {2}, DType::Float32)).to_vector<float>() == std::vector<float>{2, 4});
}

}  // namespace kiln_test_compile_modes
