#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kiln/runtime/process.hpp"

namespace kiln_test_runtime_process {

using kiln::runtime::run_process;

TEST_CASE("run_process passes arguments verbatim, never through a shell") {
  // Spaces, ';', '$(...)', quotes and globs would all be rewritten by a shell.
  std::vector<std::string> args = {"printf", "%s|\n", "a b; echo hacked", "$(id) `id`", "'q' \"d\" *", "", "x"};
  auto r = run_process(args);
  CHECK(r.exit_code == 0);
  CHECK(r.output == "a b; echo hacked|\n$(id) `id`|\n'q' \"d\" *|\n|\nx|\n");
}

TEST_CASE("run_process captures stdout and stderr together, and the exit code") {
  auto r = run_process({"sh", "-c", "echo to-out; echo to-err >&2; exit 3"});
  CHECK(r.exit_code == 3);
  CHECK(r.output.find("to-out") != std::string::npos);
  CHECK(r.output.find("to-err") != std::string::npos);

  auto ls = run_process({"ls", "/kiln-no-such-path"});
  CHECK(ls.exit_code != 0);
  CHECK(ls.output.find("kiln-no-such-path") != std::string::npos);  // ls reports on stderr

  auto killed = run_process({"sh", "-c", "kill -9 $$"});
  CHECK(killed.exit_code == 128 + 9);
}

TEST_CASE("run_process gives the child /dev/null as stdin and the environment with overrides") {
  auto cat = run_process({"cat"});  // would hang if stdin were inherited from a terminal
  CHECK(cat.exit_code == 0);
  CHECK(cat.output.empty());

  ::setenv("KILN_TEST_REMOVE_ME", "1", 1);
  auto env = run_process({"env"}, {"KILN_TEST_VAR=a b;c", "KILN_TEST_REMOVE_ME"});
  ::unsetenv("KILN_TEST_REMOVE_ME");
  CHECK(env.exit_code == 0);
  CHECK(env.output.find("\nKILN_TEST_VAR=a b;c\n") != std::string::npos);
  CHECK(env.output.find("KILN_TEST_REMOVE_ME") == std::string::npos);
  CHECK(env.output.find("PATH=") != std::string::npos);  // the rest is inherited
}

TEST_CASE("run_process throws Error naming a program that cannot be started") {
  try {
    run_process({"kiln-no-such-program-xyz", "arg"});
    FAIL("expected kiln::Error");
  } catch (const kiln::Error& e) {
    CHECK(std::string(e.what()).find("kiln-no-such-program-xyz") != std::string::npos);
  }
  CHECK_THROWS_AS(run_process(std::vector<std::string>{}), kiln::Error);
}

}  // namespace kiln_test_runtime_process
