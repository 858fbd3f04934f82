// The CPU JIT's thread teams: how many threads a kernel gets for its work (team_size,
// kernel_team), KILN_NUM_THREADS and KILN_THREAD_POLICY, the load estimate's arithmetic, and
// that a kernel's results do not depend on its team. Nothing here is timed.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>

#include "cpu_jit_test_util.hpp"

namespace kiln_test_backend_cpu_threads {

using namespace kiln_jit_test;
using backend::detail::ThreadPolicy;

namespace {

/// A graph of `roots` with its schedule.
struct Scheduled {
  ir::Captured captured;
  sched::Schedule schedule;
};

Scheduled scheduled(const std::vector<NodePtr>& roots) {
  Scheduled s{ir::capture(roots, cpu()), {}};
  s.schedule = sched::schedule(s.captured.graph);
  return s;
}

/// The team of every kernel of `roots` with `threads` at most.
std::vector<int> teams(const std::vector<NodePtr>& roots, int threads, ThreadPolicy policy = ThreadPolicy::Auto) {
  Scheduled s = scheduled(roots);
  std::vector<int> t;
  for (std::size_t k = 0; k < s.schedule.kernels.size(); ++k)
    t.push_back(backend::detail::kernel_team(s.captured.graph, s.schedule, k, threads, policy));
  return t;
}

NodePtr two_x_plus_y(std::int64_t n) {
  NodePtr x = input({n}, f32, 1), y = input({n}, f32, 2);
  return add(mul(cst(2.0, x), x), y);
}

NodePtr softmax_rows(std::int64_t rows, std::int64_t cols) {
  NodePtr x = input({rows, cols}, f32, 3);
  NodePtr e = un(Op::Exp, sub(x, ir::broadcast(red(Op::ReduceMax, x, {1}), x->shape)));
  return div(e, ir::broadcast(red(Op::ReduceSum, e, {1}), x->shape));
}

/// Runs every kernel of `roots`' plan with a team of `threads` and returns the outputs' bytes.
std::vector<std::string> run_with_team(const std::vector<NodePtr>& roots, int threads) {
  ir::Captured c = ir::capture(roots, cpu());
  backend::CpuPlanPtr plan = backend::cpu_plan(c.graph);
  Outputs out = make_outputs(c.graph, 0xCD);
  backend::detail::CpuArgv a;
  backend::detail::bind_cpu_args(*plan, args_for(c, out), a);
  for (auto fn : plan->kernels) fn(a.argv, threads);
  std::vector<std::string> bytes;
  for (std::size_t k = 0; k < c.graph.outputs.size(); ++k) {
    const ir::GraphNode& n = c.graph.nodes[static_cast<std::size_t>(c.graph.outputs[k])];
    bytes.emplace_back(static_cast<const char*>(out.pointers[k]),
                       static_cast<std::size_t>(n.shape.numel()) * itemsize(n.dtype));
  }
  return bytes;
}

}  // namespace

TEST_CASE("cpu threads: team_size gives one thread per kThreadWork, within the threads and the shared iterations") {
  using backend::detail::kThreadWork;
  using backend::detail::team_size;
  CHECK(team_size(0, 1 << 20, 8) == 1);
  CHECK(team_size(kThreadWork * 1.9, 1 << 20, 8) == 1);
  CHECK(team_size(kThreadWork * 2, 1 << 20, 8) == 2);
  CHECK(team_size(kThreadWork * 5.5, 1 << 20, 8) == 5);
  CHECK(team_size(kThreadWork * 1000, 1 << 20, 8) == 8);
  CHECK(team_size(kThreadWork * 1000, 3, 8) == 3);  // never more threads than iterations to share
  CHECK(team_size(kThreadWork * 1000, 0, 8) == 1);
  CHECK(team_size(kThreadWork * 1000, 1 << 20, 1) == 1);
  CHECK(team_size(kThreadWork * 1000, 1 << 20, 0) == 1);
}

TEST_CASE("cpu threads: kernel_team for small, mid-size and large kernels") {
  SUBCASE("a 64K-element pointwise kernel runs on one thread") {
    CHECK(teams({two_x_plus_y(65536)}, 2) == std::vector<int>{1});
    CHECK(teams({two_x_plus_y(65536)}, 16) == std::vector<int>{1});
  }
  SUBCASE("a kernel the scheduler leaves serial gets one thread under every policy but fixed") {
    CHECK(teams({two_x_plus_y(4096)}, 2) == std::vector<int>{1});
    CHECK(teams({two_x_plus_y(4096)}, 2, ThreadPolicy::Static) == std::vector<int>{1});
  }
  SUBCASE("a large pointwise kernel gets the configured count") {
    for (int threads : {1, 2, 3, 8})
      CHECK(teams({two_x_plus_y(std::int64_t{1} << 22)}, threads) == std::vector<int>{threads});
  }
  SUBCASE("softmax of 256 rows of 1024: enough work for 2 threads, not for 64") {
    std::vector<int> t = teams({softmax_rows(256, 1024)}, 2);
    REQUIRE(t.size() == 1);
    CHECK(t[0] == 2);
    std::vector<int> many = teams({softmax_rows(256, 1024)}, 64);
    CHECK(many[0] > 2);
    CHECK(many[0] < 64);
  }
  SUBCASE("rows bound the team of a row reduction") {
    // 4 rows of 65536: 4 tiles, no chunks (enough tiles? the scheduler splits below 8).
    Scheduled s = scheduled({red(Op::ReduceSum, input({4, 65536}, f32, 4), {1})});
    REQUIRE(s.schedule.kernels.size() == 1);
    const auto& kern = s.schedule.kernels[0];
    const std::int64_t items = backend::detail::parallel_items(kern);
    CHECK(items == kern.loops.tiles() * kern.loops.chunks);
    CHECK(backend::detail::kernel_team(s.captured.graph, s.schedule, 0, 1024, ThreadPolicy::Auto) <= items);
  }
  SUBCASE("the fixed policy gives every kernel the configured count (the old behaviour)") {
    CHECK(teams({two_x_plus_y(65536)}, 2, ThreadPolicy::Fixed) == std::vector<int>{2});
    CHECK(teams({two_x_plus_y(4096)}, 3, ThreadPolicy::Fixed) == std::vector<int>{3});
  }
  SUBCASE("more work per element, fewer elements for a team") {
    // 64K elements of 16 chained sines weigh as much as a few million of 2*x + y.
    NodePtr x = input({65536}, f32, 5);
    NodePtr v = x;
    for (int i = 0; i < 16; ++i) v = add(mul(un(Op::Sin, v), cst(1.01, v)), cst(0.5, v));
    Scheduled cheap = scheduled({two_x_plus_y(65536)}), costly = scheduled({v});
    CHECK(backend::detail::kernel_work(costly.captured.graph, costly.schedule, 0) >
          20 * backend::detail::kernel_work(cheap.captured.graph, cheap.schedule, 0));
    CHECK(teams({v}, 2) == std::vector<int>{2});
  }
}

TEST_CASE("cpu threads: KILN_NUM_THREADS and KILN_THREAD_POLICY") {
  const char* set = std::getenv("KILN_NUM_THREADS");
  const long n = set ? std::atol(set) : 0;
  if (n > 0)
    CHECK(backend::detail::cpu_threads() == n);
  else
    CHECK(backend::detail::cpu_threads() == backend::detail::available_cpus());
  // The plan of a large kernel launches with cpu_threads(), a small one's with 1.
  ir::Captured big = ir::capture({two_x_plus_y(std::int64_t{1} << 22)}, cpu());
  ir::Captured small = ir::capture({two_x_plus_y(65536)}, cpu());
  const bool fixed = backend::detail::thread_policy() == ThreadPolicy::Fixed;
  CHECK(backend::cpu_plan(big.graph)->threads == std::vector<int>{backend::detail::cpu_threads()});
  CHECK(backend::cpu_plan(small.graph)->threads == std::vector<int>{fixed ? backend::detail::cpu_threads() : 1});

  CHECK(backend::detail::parse_thread_policy("") == ThreadPolicy::Auto);
  CHECK(backend::detail::parse_thread_policy("auto") == ThreadPolicy::Auto);
  CHECK(backend::detail::parse_thread_policy("static") == ThreadPolicy::Static);
  CHECK(backend::detail::parse_thread_policy("fixed") == ThreadPolicy::Fixed);
  CHECK(backend::detail::parse_thread_policy("sometimes") == ThreadPolicy::Auto);  // warns
}

TEST_CASE("cpu threads: libgomp's spin count is shortened only when nobody chose one") {
  // A plan was built above, so kiln has decided; whether it could set the variable depends on
  // whether libgomp was loaded before (a program built with -fopenmp).
  ir::Captured c = ir::capture({two_x_plus_y(65536)}, cpu());
  backend::cpu_plan(c.graph);
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (backend::detail::openmp_spin_set()) {
    REQUIRE(spin != nullptr);
    CHECK(std::string(spin) == backend::detail::kSpinCount);
    CHECK(backend::detail::thread_policy() != ThreadPolicy::Fixed);
    CHECK(std::getenv("OMP_WAIT_POLICY") == nullptr);
  }
}

TEST_CASE("cpu threads: the load estimate's arithmetic") {
  using backend::detail::CpuLoad;
  const double online = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  const double share = std::min(1.0, backend::detail::available_cpus() / online);
  CpuLoad load;
  const std::int64_t t0 = 1'000'000'000;
  load.fold(3, 0, t0);  // this thread and 2 others
  CHECK(load.busy() == doctest::Approx(2 * share));
  load.fold(1, 0, t0 + 25'000'000);  // nobody else: smoothed towards 0
  CHECK(load.busy() == doctest::Approx(1.5 * share));
  load.fold(4, 1, t0 + 3'000'000'000LL);  // seconds later: not smoothed; one spinning worker is ours
  CHECK(load.busy() == doctest::Approx(2 * share));
  load.fold(0, 0, t0 + 3'025'000'000LL);  // never negative
  CHECK(load.busy() >= 0);

  // Teams of one and large kernels never look at the load.
  CHECK(backend::detail::launch_team(1, 0) == 1);
  CHECK(backend::detail::launch_team(4, backend::detail::kBusyWork) == 4);
  const int t = backend::detail::launch_team(2, 0);
  CHECK(t >= 1);
  CHECK(t <= 2);
}

TEST_CASE("cpu threads: results are identical for teams of 1 and 2") {
  const std::int64_t big = std::int64_t{1} << 18;
  std::vector<std::pair<const char*, std::vector<NodePtr>>> cases = {
      {"pointwise", {two_x_plus_y(big)}},
      {"softmax rows", {softmax_rows(256, 1024)}},
      {"sum of everything (split into chunks)",
       {red(Op::ReduceSum, mul(input({big}, f32, 6), input({big}, f32, 7)), {0})}},
      {"column sums", {red(Op::ReduceSum, input({512, 1024}, f32, 8), {0})}},
      {"row sums of few rows (split)", {red(Op::ReduceSum, input({3, 100000}, f64, 9), {1})}},
  };
  for (auto& [name, roots] : cases) {
    CAPTURE(name);
    std::vector<std::string> one = run_with_team(roots, 1), two = run_with_team(roots, 2),
                             three = run_with_team(roots, 3);
    REQUIRE(one.size() == two.size());
    for (std::size_t k = 0; k < one.size(); ++k) {
      CHECK(one[k] == two[k]);
      CHECK(one[k] == three[k]);
    }
  }
}

}  // namespace kiln_test_backend_cpu_threads
