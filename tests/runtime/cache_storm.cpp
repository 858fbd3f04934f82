// A cache storm: many processes, several threads each, evaluate a few small kiln expressions
// against one shared KILN_CACHE_DIR while this driver SIGKILLs some of them (with their
// compilers) and damages the cache in every way it knows: truncated entries, flipped payload
// and header bytes, zero-length files, FIFOs, symlinks and directories at entry paths, giant
// sparse files, unreadable files, orphan temporaries, stale scratch directories (including
// live processes' directories made to look stale) and old filler entries that force LRU
// eviction. Every process that is not killed on purpose must give the right results, no
// process may hang (each is bounded by a timeout) and none may crash. Prints a summary; the
// exit status is 0 only when everything held.
//
//   kiln_cache_storm --short                 # what ctest runs (runtime/cache_storm)
//   kiln_cache_storm --processes 16 --threads 4 --rounds 8
//   kiln_cache_storm --seconds 300           # rounds until 300 s have passed
//   scripts/cache-storm [options]            # builds it, then runs it
//
// The expressions compile to three kernels (about a second of g++ each), so the processes
// mostly share them through the cache: a process that finds an entry damaged compiles it
// again and publishes it for the others.
#include <kiln/kiln.hpp>
#include <kiln/runtime/disk_cache.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

// ---- the work each process does ---------------------------------------------------------------

constexpr int kElements = 4096;

// Small integers: every sum below is exact in f32 whatever order a kernel adds in.
float input_value(int i) { return static_cast<float>(i % 13 - 6); }

// Evaluates the three expressions `iterations` times on each of `threads` threads and checks
// them against values computed here; writes "ok compiles=... disk_hits=..." or "fail ..." to
// `result_path`. Exit status 0 (right), 3 (a wrong value) or 4 (an exception).
int child_main(const std::string& result_path, int threads, int iterations) {
  float expect_affine = 0, expect_abs = 0;
  std::vector<float> expect_relu(kElements);
  for (int i = 0; i < kElements; ++i) {
    const float v = input_value(i);
    expect_affine += 2 * v + 1;
    expect_abs += std::fabs(v - 1);
    expect_relu[static_cast<std::size_t>(i)] = std::max(v, 0.0f) * v;
  }
  std::mutex mu;
  std::string failure;
  int status = 0;
  auto fail = [&](int code, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (status == 0) {
      status = code;
      failure = what;
    }
  };
  auto work = [&] {
    try {
      std::vector<float> x(kElements);
      for (int i = 0; i < kElements; ++i) x[static_cast<std::size_t>(i)] = input_value(i);
      for (int it = 0; it < iterations; ++it) {
        kiln::Tensor t = kiln::from_blob(x.data(), {kElements});
        const float affine = kiln::sum(t * 2.0f + 1.0f).item<float>();
        kiln::Tensor r = kiln::relu(t) * t;
        const std::vector<float> relu = r.to_vector<float>();
        const float abs = kiln::sum(kiln::abs(t - 1.0f)).item<float>();
        if (affine != expect_affine)
          fail(3, "sum(x * 2 + 1) = " + std::to_string(affine) + ", expected " + std::to_string(expect_affine));
        if (relu != expect_relu) fail(3, "relu(x) * x differs from the expected values");
        if (abs != expect_abs)
          fail(3, "sum(abs(x - 1)) = " + std::to_string(abs) + ", expected " + std::to_string(expect_abs));
      }
    } catch (const std::exception& e) {
      fail(4, std::string("exception: ") + e.what());
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(work);
  for (auto& t : pool) t.join();

  const kiln::Stats s = kiln::stats();
  std::ofstream out(result_path, std::ios::trunc);
  if (status == 0)
    out << "ok compiles=" << s.compiles << " disk_hits=" << s.disk_hits << " memory_hits=" << s.memory_hits << "\n";
  else
    out << "fail " << failure << "\n";
  out.close();
  if (status != 0) std::fprintf(stderr, "cache storm child: %s\n", failure.c_str());
  return status;
}

// ---- the driver -------------------------------------------------------------------------------

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void sleep_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  ::nanosleep(&ts, nullptr);
}

void set_age(const std::string& path, long seconds_ago) {
  timespec ts[2];
  ::clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= seconds_ago;
  ts[1] = ts[0];
  ::utimensat(AT_FDCWD, path.c_str(), ts, AT_SYMLINK_NOFOLLOW);
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    ::chmod(path.c_str(), 0700);
    for (const auto& n : names_in(path)) remove_tree(path + "/" + n);
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

enum Kind {
  truncated,
  flipped_payload,
  flipped_header,
  zero_length,
  fifo,
  symlink_at_entry,
  directory_at_entry,
  giant_sparse,
  orphan_tmp,
  stale_scratch,
  unreadable,
  lru_filler,
  kKinds
};
const char* const kKindNames[kKinds] = {"truncated",   "flipped payload", "flipped header", "zero-length",
                                        "fifo",        "symlink",         "directory",      "giant sparse",
                                        "orphan .tmp", "stale scratch",   "unreadable",     "lru filler"};

struct Options {
  int processes = 16;
  int threads = 4;
  int rounds = 6;
  double seconds = 0;  // > 0: rounds until this much time has passed
  int iterations = 3;
  int injections = 6;  // per round
  double kill_fraction = 0.3;
  double child_timeout = 120;
  unsigned long long seed = 0;
  bool keep = false;
  std::string parent;  // where the storm's own directory goes (default $TMPDIR or /tmp)
};

struct Child {
  pid_t pid = -1;
  double started = 0;
  double kill_at = -1;  // seconds after start; < 0: not to be killed
  bool kill_sent = false;
  bool timed_out = false;
  std::string result, log;
};

struct Tally {
  int runs = 0, correct = 0, killed = 0, wrong = 0, errors = 0, crashed = 0, hung = 0;
  int kills_sent = 0;
  int injected[kKinds] = {};
  unsigned long long compiles = 0, disk_hits = 0;
  std::vector<std::string> failures;
};

class Storm {
 public:
  Storm(Options o, std::string self) : opt_(std::move(o)), self_(std::move(self)), rng_(opt_.seed) {}

  int run() {
    std::string parent = opt_.parent.empty() ? kiln::env::get("TMPDIR", "/tmp") : opt_.parent;
    std::string tmpl = parent + "/kiln-storm-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::fprintf(stderr, "cache storm: cannot create a directory under %s\n", parent.c_str());
      return 2;
    }
    root_ = tmpl;
    cache_ = root_ + "/cache";
    tmp_ = root_ + "/tmp";
    ::mkdir(cache_.c_str(), 0700);
    ::mkdir(tmp_.c_str(), 0700);
    ::mkdir((root_ + "/logs").c_str(), 0700);
    const double t0 = now_s();

    // Warm-up: one process compiles the kernels and the compiler probe into the cache.
    if (!run_alone("warm-up", nullptr)) return finish(t0, false);
    std::uint64_t working_set = 0;
    for (const auto& n : names_in(cache_)) {
      if (!kiln::runtime::detail::is_entry_name(n)) continue;
      entries_.insert(n);
      struct stat st {};
      if (::stat((cache_ + "/" + n).c_str(), &st) == 0) working_set += static_cast<std::uint64_t>(st.st_size);
    }
    // A bound of four working sets: the real entries always fit, the fillers never do.
    max_bytes_ = std::max<std::uint64_t>(4 * working_set, 256 << 10);

    std::vector<int> kinds;
    for (int r = 0; opt_.seconds > 0 ? (now_s() - t0 < opt_.seconds || r == 0) : r < opt_.rounds; ++r) {
      round(r, kinds);
      ++rounds_done_;
    }

    // Afterwards: one process on its own must be right, a second must find every kernel on
    // disk (the cache still works), and what was stale must be gone.
    cleanup_dirs();
    Child after;
    bool ok = run_alone("first after the storm", &after);
    unsigned long long after_compiles = compiles_of(after);
    Child again;
    ok = run_alone("second after the storm", &again) && ok;
    if (ok && compiles_of(again) != 0)
      fail_check("a process after the storm compiled " + std::to_string(compiles_of(again)) +
                 " kernels instead of loading them from the cache");
    for (const auto& p : stale_planted_)
      if (exists(p)) fail_check("stale leftover not reaped: " + p);
    for (const auto& p : fresh_planted_)
      if (!exists(p) && now_s() - t0 < 3000)
        fail_check("fresh temporary file reaped (it may belong to a store in progress): " + p);
    cache_bytes_ = 0;
    for (const auto& n : names_in(cache_)) {
      struct stat st {};
      if (kiln::runtime::detail::is_entry_name(n) && ::lstat((cache_ + "/" + n).c_str(), &st) == 0 &&
          S_ISREG(st.st_mode))
        cache_bytes_ += static_cast<std::uint64_t>(st.st_size);
    }
    // A storm long enough for every kind must have used every kind.
    if (rounds_done_ * opt_.injections >= kKinds)
      for (int k = 0; k < kKinds; ++k)
        if (tally_.injected[k] == 0) fail_check(std::string("never injected: ") + kKindNames[k]);
    if (after_compiles > 0 && cache_bytes_ > max_bytes_)
      fail_check("cache holds " + std::to_string(cache_bytes_) + " bytes after a store, over its bound of " +
                 std::to_string(max_bytes_));
    return finish(t0, ok);
  }

 private:
  std::vector<std::string> child_env() const {
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) {
      std::string s = *e;
      std::string name = s.substr(0, s.find('='));
      if (name == "KILN_CACHE_DIR" || name == "KILN_CACHE" || name == "TMPDIR" || name == "KILN_CACHE_MAX_BYTES" ||
          name == "KILN_NUM_THREADS" || name == "KILN_LOGS" || name == "KILN_LOGS_OUT" || name == "KILN_BACKEND" ||
          name == "KILN_DEVICE")
        continue;
      env.push_back(s);
    }
    env.push_back("KILN_CACHE_DIR=" + cache_);
    env.push_back("KILN_CACHE=1");
    env.push_back("TMPDIR=" + tmp_);
    env.push_back("KILN_CACHE_MAX_BYTES=" + std::to_string(max_bytes_ ? max_bytes_ : (std::uint64_t{2} << 30)));
    env.push_back("KILN_NUM_THREADS=1");  // the processes themselves are the parallelism
    env.push_back("KILN_LOGS=cache");     // into each process's log, read when it fails
    return env;
  }

  Child spawn(double kill_after) {
    Child c;
    const int n = tally_.runs++;
    c.result = root_ + "/logs/" + std::to_string(n) + ".result";
    c.log = root_ + "/logs/" + std::to_string(n) + ".log";
    std::vector<std::string> args = {self_,
                                     "--child",
                                     c.result,
                                     "--threads",
                                     std::to_string(opt_.threads),
                                     "--iterations",
                                     std::to_string(opt_.iterations)};
    std::vector<std::string> env = child_env();
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      // Its own process group, so a kill takes its compilers with it, as a ^C would.
      ::setpgid(0, 0);
      int fd = ::open(c.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
      ::execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    if (pid > 0) ::setpgid(pid, pid);
    c.pid = pid;
    c.started = now_s();
    c.kill_at = kill_after;
    return c;
  }

  // Waits for `c` (killing it at the timeout) and files its outcome. False on a failure.
  bool settle(Child& c, int status) {
    if (c.timed_out) {
      ++tally_.hung;
      return record_failure(c, "did not finish within " + std::to_string(static_cast<int>(opt_.child_timeout)) + " s");
    }
    durations_.push_back(now_s() - c.started);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      if (read_text(c.result).rfind("ok ", 0) != 0) {
        ++tally_.errors;
        return record_failure(c, "exited 0 without a result");
      }
      ++tally_.correct;
      tally_.compiles += compiles_of(c);
      tally_.disk_hits += field_of(c, "disk_hits=");
      return true;
    }
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && c.kill_sent) {
      ++tally_.killed;
      return true;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
      ++tally_.wrong;
      return record_failure(c, "wrong result");
    }
    if (WIFEXITED(status)) {
      ++tally_.errors;
      return record_failure(c, "exit status " + std::to_string(WEXITSTATUS(status)));
    }
    ++tally_.crashed;
    return record_failure(c, std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                 ::strsignal(WTERMSIG(status)) + ")");
  }

  bool record_failure(const Child& c, const std::string& what) {
    std::string log = read_text(c.log);
    if (log.size() > 3000) log = "..." + log.substr(log.size() - 3000);
    tally_.failures.push_back("process " + std::to_string(c.pid) + ": " + what + "\n" + read_text(c.result) + log);
    return false;
  }

  void fail_check(const std::string& what) { checks_failed_.push_back(what); }

  static unsigned long long field_of(const Child& c, const char* field) {
    std::string r = read_text(c.result);
    std::size_t at = r.find(field);
    return at == std::string::npos ? 0 : std::strtoull(r.c_str() + at + std::strlen(field), nullptr, 10);
  }
  static unsigned long long compiles_of(const Child& c) { return field_of(c, "compiles="); }

  // One process, no kills, no damage meanwhile. `*out` (when given) receives it.
  bool run_alone(const char* what, Child* out) {
    Child c = spawn(-1);
    int status = 0;
    bool done = false;
    while (!done) {
      pid_t w = ::waitpid(c.pid, &status, WNOHANG);
      if (w == c.pid) break;
      if (now_s() - c.started > opt_.child_timeout) {
        c.timed_out = true;
        ::kill(-c.pid, SIGKILL);
        ::waitpid(c.pid, &status, 0);
        done = true;
      }
      sleep_ms(10);
    }
    bool ok = settle(c, status);
    if (!ok) fail_check(std::string("the process run alone (") + what + ") failed");
    if (out) *out = c;
    return ok;
  }

  void round(int r, std::vector<int>& kinds) {
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double spread = 0.4 + 0.1 * opt_.processes;  // children start over this many seconds
    struct Event {
      double at;
      int what;  // >= 0: start child `what`; -1: an injection
    };
    std::vector<Event> events;
    for (int i = 0; i < opt_.processes; ++i) events.push_back({unit(rng_) * spread, i});
    for (int i = 0; i < opt_.injections; ++i) events.push_back({(i == 0 ? 0.0 : unit(rng_) * (spread + 1.0)), -1});
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.at < b.at; });

    const double start = now_s();
    std::size_t next = 0;
    std::vector<Child> running;
    while (next < events.size() || !running.empty()) {
      const double t = now_s() - start;
      while (next < events.size() && events[next].at <= t) {
        if (events[next].what >= 0) {
          // Kills land anywhere from start-up (a process that loads everything from the cache
          // lives a few tens of milliseconds) to the middle of a compile (about a second).
          double kill_after = -1;
          if (unit(rng_) < opt_.kill_fraction)
            kill_after = unit(rng_) < 0.6 ? 0.001 + unit(rng_) * 0.04 : 0.04 + unit(rng_) * 1.2;
          if (kill_after >= 0) ++kills_planned_;
          running.push_back(spawn(kill_after));
        } else {
          if (kinds.empty()) {
            for (int k = 0; k < kKinds; ++k) kinds.push_back(k);
            std::shuffle(kinds.begin(), kinds.end(), rng_);
          }
          int kind = kinds.back();
          kinds.pop_back();
          // One that found nothing to damage (every entry already replaced by something that
          // is not a file, say) is the next one tried.
          if (inject(static_cast<Kind>(kind)))
            ++tally_.injected[kind];
          else
            kinds.push_back(kind);
        }
        ++next;
      }
      for (auto it = running.begin(); it != running.end();) {
        Child& c = *it;
        const double age = now_s() - c.started;
        if (c.kill_at >= 0 && !c.kill_sent && age >= c.kill_at) {
          c.kill_sent = true;
          ++tally_.kills_sent;
          ::kill(-c.pid, SIGKILL);
        }
        if (!c.timed_out && age > opt_.child_timeout) {
          c.timed_out = true;
          ::kill(-c.pid, SIGKILL);
        }
        // Seen ended but not yet reaped, so its process group id cannot have been reused:
        // whatever it left running (a compiler) goes with it, then it is reaped.
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            info.si_pid == c.pid) {
          ::kill(-c.pid, SIGKILL);
          int status = 0;
          ::waitpid(c.pid, &status, 0);
          settle(c, status);
          it = running.erase(it);
        } else {
          ++it;
        }
      }
      sleep_ms(5);
    }
    std::printf("  round %d: %d processes done (%d correct, %d killed so far)\n", r + 1, opt_.processes, tally_.correct,
                tally_.killed);
    std::fflush(stdout);
    // A directory at an entry's path keeps that key a miss (a store cannot rename over it):
    // correct, but each later process would compile that kernel again.
    cleanup_dirs();
  }

  void cleanup_dirs() {
    for (const auto& d : injected_dirs_) ::rmdir(d.c_str());
    injected_dirs_.clear();
  }

  std::string pick(const std::vector<std::string>& from) {
    return from[std::uniform_int_distribution<std::size_t>(0, from.size() - 1)(rng_)];
  }

  // Entry paths that hold a regular file now.
  std::vector<std::string> regular_entries() const {
    std::vector<std::string> paths;
    for (const auto& n : entries_) {
      struct stat st {};
      std::string p = cache_ + "/" + n;
      if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) paths.push_back(p);
    }
    return paths;
  }

  // Whatever is at `path` goes (an injected directory is empty).
  static void clear_path(const std::string& path) {
    if (::unlink(path.c_str()) != 0 && errno == EISDIR) ::rmdir(path.c_str());
  }

  static void flip_byte(const std::string& path, std::uint64_t offset) {
    int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return;
    unsigned char b = 0;
    if (::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1) {
      b ^= 0x5a;
      if (::pwrite(fd, &b, 1, static_cast<off_t>(offset)) != 1) std::perror("pwrite");
    }
    ::close(fd);
  }

  bool inject(Kind kind) {
    std::vector<std::string> regular = regular_entries();
    std::vector<std::string> any;
    for (const auto& n : entries_) any.push_back(cache_ + "/" + n);
    const bool content = kind == truncated || kind == flipped_payload || kind == flipped_header ||
                         kind == zero_length || kind == unreadable;
    if (content && regular.empty()) return false;
    if (any.empty()) return false;
    const std::string path = content ? pick(regular) : pick(any);
    struct stat st {};
    ::lstat(path.c_str(), &st);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    switch (kind) {
      case truncated:
        return ::truncate(path.c_str(), static_cast<off_t>(size / 2)) == 0;
      case flipped_payload: {
        std::string head(24, '\0');
        int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) return false;
        bool got = ::pread(fd, head.data(), 24, 0) == 24;
        ::close(fd);
        std::uint64_t key_len = got ? kiln::runtime::detail::get_u64(head.data() + 8) : 0;
        if (!got || 32 + key_len >= size) return false;
        flip_byte(path, 32 + key_len + std::uniform_int_distribution<std::uint64_t>(0, size - 33 - key_len)(rng_));
        return true;
      }
      case flipped_header:
        flip_byte(path, std::uniform_int_distribution<std::uint64_t>(0, 31)(rng_));
        return true;
      case zero_length:
        return ::truncate(path.c_str(), 0) == 0;
      case fifo:
        clear_path(path);
        return ::mkfifo(path.c_str(), 0600) == 0;
      case symlink_at_entry: {
        clear_path(path);
        const std::string targets[] = {"/dev/zero", pick(any), cache_ + "/nowhere"};
        return ::symlink(targets[std::uniform_int_distribution<int>(0, 2)(rng_)].c_str(), path.c_str()) == 0;
      }
      case directory_at_entry:
        clear_path(path);
        if (::mkdir(path.c_str(), 0700) != 0) return false;
        injected_dirs_.push_back(path);
        return true;
      case giant_sparse: {
        const off_t giant = off_t{64} << 30;
        if (S_ISREG(st.st_mode) && (rng_() & 1)) return ::truncate(path.c_str(), giant) == 0;  // header kept
        clear_path(path);
        int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) return false;
        bool ok = ::ftruncate(fd, giant) == 0;
        ::close(fd);
        return ok;
      }
      case unreadable:
        return ::chmod(path.c_str(), 0) == 0;
      case orphan_tmp: {
        // As a SIGKILLed store leaves them: two an hour and more old (to be reaped), one fresh.
        for (int i = 0; i < 3; ++i) {
          char name[64];
          std::snprintf(name, sizeof name, "/.tmp.%d.%d.%08llx.so", 900000 + planted_++, i,
                        static_cast<unsigned long long>(rng_() & 0xffffffffu));
          std::string p = cache_ + name;
          write_text(p, "half a store");
          if (i < 2) {
            set_age(p, 7200 + 60 * i);
            stale_planted_.push_back(p);
          } else {
            fresh_planted_.push_back(p);
          }
        }
        return true;
      }
      case stale_scratch: {
        // A dead process's scratch directory, and every other one (live processes' too) made to
        // look two hours old: only the dead ones may go.
        std::string d = tmp_ + "/kiln-XXXXXX";
        if (!::mkdtemp(d.data())) return false;
        write_text(d + "/kiln_0123456789abcdef-1.0.abcdef01.cpp", "// a killed compile's source\n");
        write_text(d + "/kiln_0123456789abcdef-1.0.abcdef01.so", "half a library");
        write_text(d + "/.lock", "");
        // Only directories that have their lock: one caught between mkdtemp and creating its
        // lock (microseconds) is protected by being new, which aging it here would undo.
        for (const auto& n : names_in(tmp_))
          if (kiln::runtime::detail::is_scratch_name(n) && exists(tmp_ + "/" + n + "/.lock"))
            set_age(tmp_ + "/" + n, 7200);
        stale_planted_.push_back(d);
        return true;
      }
      case lru_filler: {
        // Old entries nobody asks for, twice the bound in all (sparse: no disk is written):
        // the next store must evict them, oldest first, and keep the real entries.
        for (int i = 0; i < 8; ++i) {
          std::string p = cache_ + "/" + kiln::runtime::detail::hex64(rng_()) + ".so";
          int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
          if (fd < 0) continue;
          if (::ftruncate(fd, static_cast<off_t>(max_bytes_ / 4)) != 0) std::perror("ftruncate");
          ::close(fd);
          set_age(p, 86400 + 60 * i);
          fillers_.push_back(p);
        }
        return true;
      }
      case kKinds:
        break;
    }
    return false;
  }

  int finish(double t0, bool ran) {
    const double elapsed = now_s() - t0;
    int fillers_left = 0;
    for (const auto& p : fillers_) fillers_left += exists(p) ? 1 : 0;
    int scratch_left = 0, tmp_left = 0;
    for (const auto& n : names_in(tmp_)) scratch_left += kiln::runtime::detail::is_scratch_name(n) ? 1 : 0;
    for (const auto& n : names_in(cache_)) tmp_left += kiln::runtime::detail::is_temp_name(n) ? 1 : 0;
    int total_injected = 0;
    for (int k = 0; k < kKinds; ++k) total_injected += tally_.injected[k];

    const bool pass = ran && tally_.failures.empty() && checks_failed_.empty();
    std::printf("cache storm: %d processes x %d threads, %d rounds, seed %llu, %.1f s\n", opt_.processes, opt_.threads,
                rounds_done_, opt_.seed, elapsed);
    std::printf("  runs: %d (correct %d, killed %d; wrong %d, errors %d, crashed %d, hung %d)\n", tally_.runs,
                tally_.correct, tally_.killed, tally_.wrong, tally_.errors, tally_.crashed, tally_.hung);
    std::printf(
        "  kills: %d planned, %d SIGKILLs sent to live processes (whole process groups, compilers "
        "included), %d landed\n",
        kills_planned_, tally_.kills_sent, tally_.killed);
    std::printf("  corruptions: %d:", total_injected);
    for (int k = 0; k < kKinds; ++k) std::printf("%s %s %d", k ? "," : "", kKindNames[k], tally_.injected[k]);
    std::printf("\n");
    std::sort(durations_.begin(), durations_.end());
    if (!durations_.empty())
      std::printf("  process lifetimes: median %.2f s, longest %.2f s\n", durations_[durations_.size() / 2],
                  durations_.back());
    std::printf("  kernels: %llu compiles, %llu disk hits in correct runs\n", tally_.compiles, tally_.disk_hits);
    std::printf("  cleanup: %zu stale leftovers planted, %zu fresh .tmp kept; filler entries evicted %zu of %zu\n",
                stale_planted_.size(), fresh_planted_.size(), fillers_.size() - static_cast<std::size_t>(fillers_left),
                fillers_.size());
    std::printf(
        "  at the end: %llu bytes of entries (bound %llu), %d scratch dirs and %d .tmp files left "
        "(younger than an hour: kept)\n",
        static_cast<unsigned long long>(cache_bytes_), static_cast<unsigned long long>(max_bytes_), scratch_left,
        tmp_left);
    for (const auto& f : tally_.failures) std::printf("FAILURE %s\n", f.c_str());
    for (const auto& f : checks_failed_) std::printf("CHECK FAILED %s\n", f.c_str());
    std::printf("cache storm: %s\n", pass ? "PASS" : "FAIL");
    if (opt_.keep || !pass)
      std::printf("  directory kept: %s\n", root_.c_str());
    else
      remove_tree(root_);
    return pass ? 0 : 1;
  }

  Options opt_;
  std::string self_, root_, cache_, tmp_;
  std::mt19937_64 rng_;
  std::uint64_t max_bytes_ = 0, cache_bytes_ = 0;
  std::set<std::string> entries_;
  std::vector<std::string> injected_dirs_, stale_planted_, fresh_planted_, fillers_, checks_failed_;
  std::vector<double> durations_;
  int planted_ = 0, rounds_done_ = 0, kills_planned_ = 0;
  Tally tally_;
};

int usage() {
  std::fprintf(
      stderr,
      "usage: kiln_cache_storm [--short] [--processes N] [--threads N] [--rounds N] [--seconds S]\n"
      "                        [--iterations N] [--injections N] [--kill-fraction F]\n"
      "                        [--child-timeout S] [--seed N] [--dir PARENT] [--keep]\n"
      "  --short: 6 processes x 2 threads, 4 rounds of 4 corruptions (every kind at least once): what ctest runs\n"
      "  default: 16 processes x 4 threads, 6 rounds of 6 corruptions\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 1 && args[0] == "--child") {
    if (args.size() != 6) return usage();
    return child_main(args[1], std::atoi(args[3].c_str()), std::atoi(args[5].c_str()));
  }
  Options o;
  o.seed = static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count());
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const char* { return i + 1 < args.size() ? args[++i].c_str() : nullptr; };
    const char* v = nullptr;
    if (a == "--short") {
      o.processes = 6;
      o.threads = 2;
      o.rounds = 4;
      o.injections = 4;
      o.child_timeout = 100;
    } else if (a == "--keep") {
      o.keep = true;
    } else if ((a == "--processes" || a == "--threads" || a == "--rounds" || a == "--iterations" ||
                a == "--injections" || a == "--seconds" || a == "--kill-fraction" || a == "--child-timeout" ||
                a == "--seed" || a == "--dir") &&
               (v = value()) != nullptr) {
      if (a == "--processes")
        o.processes = std::max(1, std::atoi(v));
      else if (a == "--threads")
        o.threads = std::max(1, std::atoi(v));
      else if (a == "--rounds")
        o.rounds = std::max(1, std::atoi(v));
      else if (a == "--iterations")
        o.iterations = std::max(1, std::atoi(v));
      else if (a == "--injections")
        o.injections = std::max(0, std::atoi(v));
      else if (a == "--seconds")
        o.seconds = std::atof(v);
      else if (a == "--kill-fraction")
        o.kill_fraction = std::atof(v);
      else if (a == "--child-timeout")
        o.child_timeout = std::atof(v);
      else if (a == "--seed")
        o.seed = std::strtoull(v, nullptr, 10);
      else
        o.parent = v;
    } else {
      return usage();
    }
  }
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    std::fprintf(stderr, "cache storm: cannot find its own executable\n");
    return 2;
  }
  exe[n] = '\0';
  ::signal(SIGPIPE, SIG_IGN);
  return Storm(o, exe).run();
}
