#pragma once
// Tests that need a new process (a disk cache read by a fresh start, a tuning reloaded without
// timing) run this test executable again with a filter and an environment of their own.
#include <doctest/doctest.h>

#include <unistd.h>

#include <string>
#include <vector>

#include <kiln/runtime/process.hpp>

namespace kiln::testing {

/// Runs this test executable again as a child process, only the test cases matching
/// `test_case` (doctest's --test-case filter), with `env` ("NAME=value", or "NAME" to unset)
/// over the parent's environment. Returns the child's exit code and output.
inline runtime::ProcessResult run_test_child(const std::string& test_case, const std::vector<std::string>& env) {
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  exe[n] = '\0';
  return runtime::run_process({exe, "--test-case=" + test_case, "--no-skip", "--no-version"}, env);
}

/// The test cases matching `test_case` run again in a child process (with `child_flag`=1) over
/// the disk cache under `cache_dir`, logging cache events: the child must pass, print
/// `ok_marker`, find the autotune choices on disk (a logged disk hit) and time nothing (no
/// "tuned in" line). Returns the child's output for further checks.
inline std::string expect_untimed_autotune_child(const std::string& test_case, const std::string& cache_dir,
                                                 const std::string& child_flag, const std::string& ok_marker) {
  auto r = run_test_child(test_case, {"KILN_CACHE_DIR=" + cache_dir + "/cache", "KILN_CACHE=1", child_flag + "=1",
                                      "KILN_LOGS=cache", "KILN_LOGS_OUT"});
  INFO("child output:\n" << r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find(ok_marker) != std::string::npos);
  CHECK(r.output.find(": disk hit ") != std::string::npos);
  CHECK(r.output.find("tuned in") == std::string::npos);
  return r.output;
}

}  // namespace kiln::testing
