#pragma once
// RAII handle of a dlopen'ed shared library.
#include <dlfcn.h>

#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/log.hpp"

namespace kiln::runtime {

/// A shared library loaded with RTLD_NOW | RTLD_LOCAL (every symbol resolved at load time,
/// none visible to other libraries, so kernels with equal entry names do not clash).
/// Unloaded when destroyed. Move-only.
class SharedLibrary {
 public:
  /// Loads `path`; throws Error with the loader's message when it cannot.
  explicit SharedLibrary(std::string path) : path_(std::move(path)) {
    handle_ = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* why = ::dlerror();
      throw Error("kiln: cannot load shared library '" + path_ + "': " + (why ? why : "unknown error"));
    }
  }
  SharedLibrary(SharedLibrary&& other) noexcept
      : path_(std::move(other.path_)), handle_(std::exchange(other.handle_, nullptr)) {}
  SharedLibrary& operator=(SharedLibrary&& other) noexcept {
    if (this != &other) {
      close();
      path_ = std::move(other.path_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary() { close(); }

  /// The address of `name`; throws Error naming the symbol and the library when it is absent.
  void* symbol(const char* name) const {
    void* p = find_symbol(name);
    if (!p) throw Error(std::string("kiln: symbol '") + name + "' not found in shared library '" + path_ + "'");
    return p;
  }

  /// The address of `name`, or nullptr when it is absent.
  void* find_symbol(const char* name) const {
    if (!handle_) return nullptr;
    ::dlerror();
    return ::dlsym(handle_, name);
  }

  /// The path it was loaded from (the file may since have been removed).
  const std::string& path() const { return path_; }

  /// The dlopen handle (nullptr after a move).
  void* handle() const { return handle_; }

 private:
  void close() {
    if (handle_) ::dlclose(handle_);
    handle_ = nullptr;
  }

  std::string path_;
  void* handle_ = nullptr;
};

/// "13.1.0" from a library's version number major·10000 + minor·100 + patch (cuBLASLt's
/// cublasLtGetVersion, cuDNN's cudnnGetVersion).
inline std::string library_version_text(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

/// What loading an optional run-time library found: its entry points (`Api`), or why it is
/// unusable.
template <class Api>
struct RuntimeLibrary {
  std::unique_ptr<SharedLibrary> library;
  std::string path;    ///< the name or path asked for
  std::string reason;  ///< why it is unusable (empty when it is usable)
  Api api;
  std::size_t version = 0;  ///< the library's version number (library_version_text)
  double load_ms = 0;       ///< time of dlopen and symbol resolution
  bool ok() const { return library != nullptr && reason.empty(); }
};

/// The `perf` log line of a process-wide load: "<name> <version> loaded from <path> in <ms>
/// ms", or "<name> unavailable: <why>".
template <class Api>
void log_library_load(const char* name, const RuntimeLibrary<Api>& s) {
  if (s.ok()) {
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f", s.load_ms);
    log(LogChannel::perf,
        std::string(name) + " " + library_version_text(s.version) + " loaded from " + s.path + " in " + ms + " ms");
  } else {
    log(LogChannel::perf, std::string(name) + " unavailable: " + s.reason);
  }
}

/// Loads `path` for a loader that never throws: the library, or nullptr with `reason` set to
/// "cannot load shared library '<path>': <the loader's message>".
inline std::unique_ptr<SharedLibrary> open_library(const std::string& path, std::string& reason) {
  try {
    return std::make_unique<SharedLibrary>(path);
  } catch (const Error& e) {
    reason = e.what();
    if (reason.rfind("kiln: ", 0) == 0) reason.erase(0, 6);
    return nullptr;
  }
}

/// Resolves a library's symbols into typed function pointers, collecting the names of the
/// required ones it lacks (for the loader's "it lacks ..." reason).
class SymbolResolver {
 public:
  explicit SymbolResolver(const SharedLibrary& library) : library_(&library) {}
  template <class F>
  void operator()(F& fn, const char* name, bool required = true) {
    fn = reinterpret_cast<std::remove_reference_t<F>>(library_->find_symbol(name));
    if (!fn && required) missing_ += std::string(missing_.empty() ? "" : ", ") + name;
  }
  /// "a, b" (empty when every required symbol was found).
  const std::string& missing() const { return missing_; }

 private:
  const SharedLibrary* library_;
  std::string missing_;
};

/// How kiln finds an optional library it loads at run time: the environment variable `setting`
/// names it when set, and then nothing else is tried (an explicit path that fails is an error,
/// not a reason to pick up some other copy); else each of `candidates` in turn, the first that
/// loads winning. `load(path)` returns a State with ok() and a `reason`; when none loads, the
/// returned State's reason is `not_found` followed by each candidate's reason.
template <class State, class Load>
State load_library_from_env(const char* setting, const std::vector<std::string>& candidates, Load&& load,
                            const std::string& not_found) {
  const std::string forced = env::get(setting);
  if (!forced.empty()) {
    State s = load(forced);
    if (!s.ok()) s.reason = std::string(setting) + "=" + forced + ": " + s.reason;
    return s;
  }
  std::string tried;
  for (const auto& name : candidates) {
    State s = load(name);
    if (s.ok()) return s;
    tried += "\n  " + s.reason;
  }
  State none;
  none.reason = not_found + "; tried:" + tried;
  return none;
}

}  // namespace kiln::runtime
