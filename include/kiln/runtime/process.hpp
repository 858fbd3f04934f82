#pragma once
// Starting a program from an argument list (never through a shell), with its stdout and stderr
// captured together. Used to run the host compiler.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

extern char** environ;

namespace kiln::runtime {

/// CPUs this process may run on: its affinity mask (taskset, cpusets), else the hardware's count.
inline int available_cpus() {
  static const int n = [] {
    cpu_set_t set;
    if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    unsigned h = std::thread::hardware_concurrency();
    return h ? static_cast<int>(h) : 1;
  }();
  return n;
}

/// The CPU threads kiln works with: KILN_NUM_THREADS, else available_cpus().
inline int configured_cpu_threads() {
  const long v = std::atol(env::get("KILN_NUM_THREADS", "0").c_str());
  return v > 0 ? static_cast<int>(v) : available_cpus();
}

/// What a finished program said and how it ended.
struct ProcessResult {
  int exit_code;       ///< exit status; 128 + signal number when it was killed by a signal
  std::string output;  ///< stdout and stderr, interleaved as written
};

namespace detail {

// Closes the fd on scope exit; the spawn path has several early returns.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

inline std::string quote_argv(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += '\'';
    s += a;
    s += '\'';
  }
  return s;
}

}  // namespace detail

/// Runs `argv[0]` (looked up on PATH when it has no '/') with the arguments `argv[1..]` exactly
/// as given, with the environment `env_overrides` applied on top of this process's
/// ("NAME=value" sets, a bare "NAME" removes). stdin is /dev/null; stdout and stderr are
/// captured together. Blocks until the program ends. Throws Error when it cannot be started.
inline ProcessResult run_process(const std::vector<std::string>& argv, const std::vector<std::string>& env_overrides) {
  if (argv.empty()) throw Error("kiln::runtime::run_process: empty argument list");

  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  std::vector<std::string> env_storage;
  std::vector<char*> envp;
  char** env_used = environ;
  if (!env_overrides.empty()) {
    auto name_of = [](std::string_view e) { return e.substr(0, e.find('=')); };
    for (char** e = environ; e && *e; ++e) {
      std::string_view entry(*e);
      bool overridden = false;
      for (const auto& o : env_overrides)
        if (name_of(o) == name_of(entry)) overridden = true;
      if (!overridden) envp.push_back(*e);
    }
    for (const auto& o : env_overrides)
      if (o.find('=') != std::string::npos) env_storage.push_back(o);
    for (auto& s : env_storage) envp.push_back(s.data());
    envp.push_back(nullptr);
    env_used = envp.data();
  }

  // O_CLOEXEC on both ends: a program spawned concurrently by another thread must not inherit
  // our write end, or our read would not see EOF until that other program exits.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("kiln::runtime::run_process: pipe failed: ") + std::strerror(errno));
  detail::FdGuard read_end{fds[0]}, write_end{fds[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, 1);  // dup2 clears FD_CLOEXEC on 1 and 2
  posix_spawn_file_actions_adddup2(&actions, write_end.fd, 2);

  // The child starts with no blocked signals and SIGPIPE at its default, whatever the caller set.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty_mask, default_signals;
  sigemptyset(&empty_mask);
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &empty_mask);
  posix_spawnattr_setsigdefault(&attr, &default_signals);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), env_used);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    throw Error("kiln::runtime::run_process: cannot start " + detail::quote_argv(argv) + ": " + std::strerror(rc));
  write_end.reset();

  ProcessResult result{-1, {}};
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(read_end.fd, buf, sizeof buf);
    if (n > 0) {
      result.output.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      break;
    }
  }
  int status = 0;
  pid_t w;
  do {
    w = ::waitpid(pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  if (w < 0) {
    // Happens when the caller set SIGCHLD to SIG_IGN: the child was reaped for us.
    result.exit_code = -1;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

/// Runs `argv` with this process's environment; see the overload above.
inline ProcessResult run_process(const std::vector<std::string>& argv) { return run_process(argv, {}); }

}  // namespace kiln::runtime

KILN_COLD_CODE_END
