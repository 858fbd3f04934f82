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

}  // namespace kiln::testing
