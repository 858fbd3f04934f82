#pragma once
// The host C++ compiler that builds CPU kernels into shared libraries: found once (KILN_CXX,
// else `c++`), probed once (does it build and load a shared library? with OpenMP?), then run
// from an argument list for every kernel.
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/duration.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/version.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/runtime/dynlib.hpp"
#include "kiln/runtime/process.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::runtime {

namespace detail {

inline std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  std::string cur;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n') {
      if (!cur.empty()) words.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) words.push_back(std::move(cur));
  return words;
}

inline bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

inline bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// `program` as posix_spawnp would find it, or "" when it would not.
inline std::string find_on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : std::string();
  std::string path = env::get("PATH", "/usr/local/bin:/usr/bin:/bin");
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  return {};
}

inline std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

inline std::string join_words(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) {
    if (!s.empty()) s += ' ';
    s += w;
  }
  return s;
}

inline std::string replace_extension(const std::string& path, const std::string& ext) {
  std::size_t slash = path.rfind('/');
  std::size_t dot = path.rfind('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) return path.substr(0, dot) + ext;
  return path + ext;
}

}  // namespace detail

/// A working host C++ compiler and the flags kiln builds kernels with.
class CxxCompiler {
 public:
  /// The compiler named by KILN_CXX (words split on blanks, no shell; e.g. "ccache g++"),
  /// else `c++`, resolved on PATH and probed once per process (the probe's result is kept in
  /// the disk cache, keyed by the compiler file's identity). nullptr, after one warning on
  /// stderr, when it is missing or cannot build and load a shared library.
  static CxxCompiler* find() {
    static CxxCompiler* found = [] {
      std::string command = env::get("KILN_CXX", "c++");
      std::string why;
      std::unique_ptr<CxxCompiler> c = probe(command, &DiskCache::instance(), &why);
      if (!c) {
        detail::warn("no working C++ compiler (" + why + "); CPU kernels run on the reference executor");
        return static_cast<CxxCompiler*>(nullptr);
      }
      log(LogChannel::cache, "host compiler: " + c->identity() + (c->openmp() ? "" : " (no OpenMP)"));
      return c.release();  // leaked: kernels may be built during static destruction
    }();
    return found;
  }

  /// Probes `command` (program and leading arguments, split on blanks); `probe_cache` may be
  /// nullptr. nullptr when it does not work, with the reason in `*why_not`.
  static std::unique_ptr<CxxCompiler> probe(const std::string& command, const DiskCache* probe_cache,
                                            std::string* why_not = nullptr) {
    auto fail = [&](std::string why) {
      if (why_not) *why_not = std::move(why);
      return std::unique_ptr<CxxCompiler>();
    };
    std::vector<std::string> words = detail::split_words(command);
    if (words.empty()) return fail("empty compiler command");
    std::string resolved = detail::find_on_path(words[0]);
    if (resolved.empty()) return fail("'" + words[0] + "' not found on PATH");
    char real[PATH_MAX];
    std::string real_path = ::realpath(resolved.c_str(), real) ? std::string(real) : resolved;
    struct stat st {};
    ::stat(real_path.c_str(), &st);

    std::unique_ptr<CxxCompiler> c(new CxxCompiler());
    c->command_ = words;
    c->command_[0] = resolved;

    std::string extra(words.size() > 1 ? detail::join_words({words.begin() + 1, words.end()}) : std::string());
    std::string probe_key = std::string("kiln-cxx-probe 1\nkiln ") + KILN_VERSION_STRING + "\ncompiler: " + resolved +
                            " -> " + real_path + " " + extra + "\nfile: " + std::to_string(st.st_size) + " " +
                            std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + " " +
                            std::to_string(st.st_ino) + " " + std::to_string(st.st_dev) + "\narch: " + host_arch() +
                            "\nflags: " + detail::join_words(base_flags()) + "\n";
    std::string version;
    bool openmp = false;
    bool known = false;
    if (probe_cache) {
      if (auto hit = probe_cache->load(probe_key, ".probe")) {
        std::size_t nl = hit->find('\n');
        if (nl != std::string::npos && (hit->compare(0, nl, "openmp=1") == 0 || hit->compare(0, nl, "openmp=0") == 0)) {
          openmp = hit->compare(0, nl, "openmp=1") == 0;
          version = hit->substr(nl + 1);
          known = true;
        }
      }
    }
    if (!known) {
      ProcessResult r{};
      try {
        std::vector<std::string> argv = c->command_;
        argv.push_back("--version");
        r = run_process(argv);
      } catch (const Error& e) {
        return fail(e.what());
      }
      if (r.exit_code != 0)
        return fail("'" + resolved + " --version' exited with " + std::to_string(r.exit_code) + ": " +
                    detail::first_line(r.output));
      version = detail::first_line(r.output);
      std::string log_omp, log_plain;
      c->openmp_ = true;
      openmp = c->try_build(kOpenmpProbe, &log_omp);
      if (!openmp) {
        c->openmp_ = false;
        if (!c->try_build(kPlainProbe, &log_plain))
          return fail("'" + resolved + "' cannot build a loadable shared library: " + log_plain);
        log(LogChannel::perf, "host compiler " + resolved + ": -fopenmp does not work (" + detail::first_line(log_omp) +
                                  "); CPU kernels run on one thread");
      }
      if (probe_cache)
        probe_cache->store(probe_key, ".probe", std::string(openmp ? "openmp=1\n" : "openmp=0\n") + version);
    }
    c->openmp_ = openmp;
    c->version_ = version;
    c->identity_ = real_path + (extra.empty() ? "" : " " + extra) + " | " + version;
    return c;
  }

  /// Resolved path and first line of `--version`, e.g. "/usr/bin/x86_64-linux-gnu-g++-12 |
  /// c++ (Debian 12.2.0-14) 12.2.0". Part of every kernel cache key.
  const std::string& identity() const { return identity_; }
  /// The first line of `--version`.
  const std::string& version() const { return version_; }
  /// The program (as found on PATH) and its leading arguments from KILN_CXX.
  const std::vector<std::string>& command() const { return command_; }
  /// Whether kernels are built with -fopenmp (libgomp or equivalent works).
  bool openmp() const { return openmp_; }

  /// Flags for every kernel. No -ffast-math: NaN, Inf and signed zeros behave as in the
  /// reference executor. -fno-math-errno is safe (errno is never read) and lets libm calls
  /// vectorise. -ffp-contract=off makes results the same with every compiler: generated code
  /// writes std::fma where it wants one. Without OpenMP, -fopenmp-simd keeps `omp simd`.
  std::vector<std::string> flags() const {
    std::vector<std::string> f = base_flags();
    f.push_back(openmp_ ? "-fopenmp" : "-fopenmp-simd");
    return f;
  }

  /// Writes `source` next to `out_path` (same name, extension .cpp) and builds `out_path`.
  /// Returns the compiler's output (usually empty). Throws CompileError holding the
  /// compiler's log and the source path when it fails; the source file is left in place.
  std::string compile(const std::string& source, const std::string& out_path) const {
    std::string source_path = detail::replace_extension(out_path, ".cpp");
    {
      std::ofstream out(source_path, std::ios::binary | std::ios::trunc);
      out << source;
      out.close();
      if (!out) throw CompileError("kiln: cannot write generated source to " + source_path, {}, source_path);
    }
    std::vector<std::string> argv = command_;
    for (auto& f : flags()) argv.push_back(std::move(f));
    argv.insert(argv.end(), {"-o", out_path, source_path});
    ProcessResult r{};
    try {
      r = run_process(argv);
    } catch (const Error& e) {
      throw CompileError(std::string(e.what()) + " (generated source: " + source_path + ")", e.what(), source_path);
    }
    if (r.exit_code != 0 || !detail::is_regular_file(out_path))
      throw CompileError("kiln: C++ compilation of generated source " + source_path + " failed (exit code " +
                             std::to_string(r.exit_code) + ")\ncommand: " + detail::join_words(argv) +
                             "\ncompiler log:\n" + r.output,
                         r.output, source_path);
    return r.output;
  }

  /// The machine kernels are built for (-march=native): architecture, CPU model and a hash of
  /// its feature list, so a cache directory shared between machines never mixes their code.
  static const std::string& host_arch() {
    static const std::string arch = [] {
      utsname u{};
      std::string s = ::uname(&u) == 0 ? std::string(u.machine) : std::string("unknown");
      std::ifstream in("/proc/cpuinfo");
      std::string line, model, features;
      while (std::getline(in, line)) {
        if (line.empty()) break;  // the first processor describes them all
        std::string key = line.substr(0, line.find(':'));
        while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
        std::string value = line.find(':') == std::string::npos ? "" : line.substr(line.find(':') + 1);
        if (key == "model name" || key == "Processor" || key == "cpu model") model = detail::first_line(value);
        if (key == "vendor_id" || key == "cpu family" || key == "model" || key == "flags" || key == "Features" ||
            key == "CPU implementer" || key == "CPU architecture" || key == "CPU variant" || key == "CPU part" ||
            key == "isa" || key == "cpu")
          features += key + "=" + value + ";";
      }
      while (!model.empty() && model.front() == ' ') model.erase(0, 1);
      return s + (model.empty() ? "" : " " + model) + " cpu:" + detail::hex64(kiln::detail::hash_string(features));
    }();
    return arch;
  }

 private:
  static constexpr const char* kOpenmpProbe =
      "#include <omp.h>\nextern \"C\" int kiln_probe(void) { return omp_get_max_threads() >= 1 ? 42 : 0; }\n";
  static constexpr const char* kPlainProbe = "extern \"C\" int kiln_probe(void) { return 42; }\n";

  CxxCompiler() = default;

  static std::vector<std::string> base_flags() {
    return {"-O3",
            "-march=native",
            "-fPIC",
            "-shared",
            "-std=c++17",
            "-fno-math-errno",
            "-ffp-contract=off",
            "-fno-semantic-interposition",
            "-pipe",
            "-w"};
  }

  // Builds, loads and calls a probe with the current flags.
  bool try_build(const char* source, std::string* log_out) const {
    std::string out = scratch_dir() + "/probe-" + detail::unique_suffix() + ".so";
    std::string src = detail::replace_extension(out, ".cpp");
    bool ok = false;
    try {
      compile(source, out);
      SharedLibrary lib(out);
      auto fn = reinterpret_cast<int (*)()>(lib.symbol("kiln_probe"));
      ok = fn() == 42;
      if (!ok) *log_out = "probe returned a wrong value";
    } catch (const CompileError& e) {
      *log_out = e.log().empty() ? e.what() : e.log();
    } catch (const Error& e) {
      *log_out = e.what();
    }
    ::unlink(out.c_str());
    ::unlink(src.c_str());
    return ok;
  }

  std::vector<std::string> command_;
  std::string version_;
  std::string identity_;
  bool openmp_ = false;
};

}  // namespace kiln::runtime

KILN_COLD_CODE_END
