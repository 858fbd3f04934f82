// A fresh process's first evaluation of one fused kernel, for bench_cpu's disk-cache figure:
// run it once with an empty KILN_CACHE_DIR (it compiles and stores the kernel), then again
// with the same directory (it loads the kernel from disk). It prints one line,
//   first_eval_ms=<ms> compiles=<n> disk_hits=<n> memory_hits=<n>
// where first_eval_ms times the first eval() alone (inputs are made and evaluated before).
//
//   KILN_CACHE_DIR=$(mktemp -d) bench_cpu_process          # cold: compiles
//   hyperfine -N -w 3 'env KILN_CACHE_DIR=... bench_cpu_process'   # whole process, disk hit
#include <kiln/kiln.hpp>

#include <chrono>
#include <cstdio>

int main() {
  using namespace kiln;
  set_backend(Backend::Jit);
  Tensor x = randn({4096}, 1), y = randn({4096}, 2);
  x.eval();
  y.eval();
  const Stats before = stats();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor z = 2.0f * x + y;
  z.eval();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const Stats after = stats();
  std::printf("first_eval_ms=%.4f compiles=%llu disk_hits=%llu memory_hits=%llu\n", ms,
              static_cast<unsigned long long>(after.compiles - before.compiles),
              static_cast<unsigned long long>(after.disk_hits - before.disk_hits),
              static_cast<unsigned long long>(after.memory_hits - before.memory_hits));
  return 0;
}
